"""Read errors are retried until they heal, unknown is not empty, identity is never guessed from a
partial read, and a failed listing is a failed pass, not an empty host (issue 14, items 7 to 9)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from rnic_exporter.sim import SimHost
from rnic_exporter.sim.sysfs_root import SimSysfsRoot
from rnic_exporter.sources.reader import HostReader, Job, run_here

PORT = "class/infiniband/mlx5_0/ports/1"


def reader_of(host: SimHost, overlay: dict[str, int]) -> HostReader:
    return HostReader(SimSysfsRoot(host.root, hold_fds=True, errno_overlay=overlay))


def test_a_gid_listing_that_failed_once_is_read_again(sim_host: SimHost) -> None:
    overlay = dict(sim_host.errno_overlay)
    overlay[f"{PORT}/gids"] = errno.EIO
    reader = reader_of(sim_host, overlay)
    port = reader.read().port("mlx5_0", 1)
    assert port is not None and port.gids == () and port.nccl_gid_index is None
    del overlay[f"{PORT}/gids"]
    port = reader.read().port("mlx5_0", 1)  # no announcement, no forced read: it heals by itself
    assert port is not None and len(port.gids) == 4 and port.nccl_gid_index == 3


def test_an_unreadable_slot_keeps_the_table_hash_and_nccl_pick(sim_host: SimHost) -> None:
    overlay = dict(sim_host.errno_overlay)
    reader = reader_of(sim_host, overlay)
    before = reader.read(full_gid_tables=True).port("mlx5_0", 1)
    assert before is not None and before.nccl_gid_index == 3
    for rel in (f"{PORT}/gids/3", f"{PORT}/gids"):  # one slot, then the whole listing
        overlay[rel] = errno.EIO
        snap = reader.read(full_gid_tables=True)
        port = snap.port("mlx5_0", 1)
        assert port is not None and (port.gid_hash, port.nccl_gid_index) == (before.gid_hash, 3), rel
        assert [(e.attribute, e.reason) for e in snap.errors] == [(rel.removeprefix(f"{PORT}/"), "EIO")]
        del overlay[rel]
        healed = reader.read(full_gid_tables=True)
        assert healed.errors == () and healed.port("mlx5_0", 1) == before, rel


def test_ports_listed_empty_at_registration_are_found_later(sim_host: SimHost) -> None:
    ports = sim_host.root / "class/infiniband/mlx5_0/ports"
    hidden = sim_host.root / "ports-later"
    os.rename(ports, hidden)
    ports.mkdir()  # the kernel adds a device's ports after the device
    reader = reader_of(sim_host, dict(sim_host.errno_overlay))
    try:
        dev = reader.read().device("mlx5_0")
        assert dev is not None and dev.ports == ()
    finally:
        ports.rmdir()
        os.rename(hidden, ports)
    dev = reader.read().device("mlx5_0")
    assert dev is not None and [p.number for p in dev.ports] == [1]


def test_an_unresolvable_device_link_is_never_published_under_a_guessed_identity(sim_host: SimHost) -> None:
    link = sim_host.root / "class/infiniband/mlx5_1/device"
    target = os.readlink(link)
    link.unlink()
    link.write_text("not a link\n")  # readlink answers EINVAL
    reader = reader_of(sim_host, dict(sim_host.errno_overlay))
    try:
        for _ in range(2):
            snap = reader.read()
            assert snap.device("mlx5_1") is None and snap.device("mlx5_0") is not None
            assert snap.listed_unread == ("mlx5_1",)  # registered: not judged disappeared
            assert ("mlx5_1", "device") in {(e.device, e.attribute) for e in (*snap.errors, *snap.unsupported)}
    finally:
        link.unlink()
        link.symlink_to(target)
    dev = reader.read().device("mlx5_1")
    assert dev is not None and dev.pci_address == "0000:19:00.0"


def test_a_failed_device_listing_is_a_failed_pass_not_an_empty_host(sim_host: SimHost) -> None:
    overlay = dict(sim_host.errno_overlay)
    reader = reader_of(sim_host, overlay)
    healthy = reader.read()
    for code in (errno.EMFILE, errno.EIO):
        overlay["class/infiniband"] = code
        snap = reader.read()
        assert [d.name for d in snap.devices] == [d.name for d in healthy.devices], code
        assert [(e.device, e.attribute, e.reason) for e in snap.errors] == [
            ("-", "class/infiniband", errno.errorcode[code])
        ]
        del overlay["class/infiniband"]
    shutil.rmtree(sim_host.root / "class/infiniband")  # gone for real (module unloaded): no devices
    assert reader.read().devices == ()


def test_a_descriptor_limit_below_the_plan_costs_held_gid_descriptors_not_reads(tmp_path: Path) -> None:
    """A hard limit of 700 open files where 4 RNICs with 255-slot tables would hold about 1,400: the
    reader says so once, stops holding GID table descriptors, and every attribute still reads."""
    SimHost.build(tmp_path / "sys", roce=4, gid_table_size=255)
    code = (
        "import logging, resource, sys\n"
        "logging.basicConfig(level=logging.WARNING, format='%(message)s')\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (700, 700))\n"
        "from rnic_exporter.sources.reader import HostReader\n"
        "from rnic_exporter.sources.sysfs import SysfsRoot\n"
        f"reader = HostReader(SysfsRoot({str(tmp_path / 'sys')!r}, hold_fds=True))\n"
        "snaps = [reader.read(full_gid_tables=True) for _ in range(3)]\n"
        "print(len(snaps[-1].devices), sum(len(p.gids) for p in snaps[-1].ports), len(snaps[-1].errors),"
        " reader.root.held_fds)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    devices, gids, errors, held = (int(v) for v in run.stdout.split())
    assert (devices, gids, errors) == (4, 16, 0) and held < 700
    assert run.stderr.count("open-file limit") == 1, run.stderr


def test_a_device_removed_while_being_read_is_not_published_as_a_ghost(sim_host: SimHost) -> None:
    """The soak's remove step landing between the listing and the reads: every file then answers
    ENOENT and the missing `device` link looks like "no PCI parent"; that husk must not be
    published (it paged as a new device without a PCI address, then as vanished)."""
    reader = reader_of(sim_host, dict(sim_host.errno_overlay))
    assert reader.read().device("mlx5_1") is not None

    def removed_mid_pass(jobs: Sequence[Job]) -> None:
        sim_host.remove_device("mlx5_1")  # after the listing saw it registered
        run_here(jobs)
        sim_host.restore_device("mlx5_1")  # re-registered before the next listing

    racing = reader.state_pass(runner=removed_mid_pass).snapshot
    after = reader.read()
    for snap in (racing, after):
        dev = snap.device("mlx5_1")
        assert dev is not None and dev.pci_address == "0000:19:00.0", dev


def test_a_known_device_removed_while_being_read_keeps_its_last_tables(sim_host: SimHost) -> None:
    """The soak's remove step landing inside a pass over a device already learned: its state files,
    then its GID listing, answer ENOENT. An empty table there is not "the addresses left" (that paged
    rnic.address.lost once per removal, before rnic.device.disappeared): the pass keeps what was last
    published and the next listing retires the device."""
    reader = reader_of(sim_host, dict(sim_host.errno_overlay))
    before = reader.read(full_gid_tables=True).port("mlx5_1", 1)
    assert before is not None and len(before.gids) == 4

    def removed_mid_pass(jobs: Sequence[Job]) -> None:
        sim_host.remove_device("mlx5_1")
        run_here(jobs)

    for full in (False, True):  # whether the pass was asked for whole GID tables or not
        racing = reader.state_pass(runner=removed_mid_pass, full_gid_tables=full).snapshot
        port = racing.port("mlx5_1", 1)
        assert port is not None and (port.gids, port.state) == (before.gids, before.state), full
        assert reader.read().device("mlx5_1") is None  # the next listing: gone, so it is judged disappeared
        sim_host.restore_device("mlx5_1")
        back = reader.read(full_gid_tables=True).port("mlx5_1", 1)
        assert back is not None and len(back.gids) == 4
        before = back


def test_a_device_removed_between_its_state_files_and_its_gid_table(
    sim_host: SimHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same race one step later: the port state was read (it went down), then the device left
    before its GID table was listed."""
    from rnic_exporter.sources.device_reader import DeviceReader
    from rnic_exporter.sources.discovery import PortShape

    reader = reader_of(sim_host, dict(sim_host.errno_overlay))
    before = reader.read(full_gid_tables=True).port("mlx5_1", 1)
    assert before is not None and len(before.gids) == 4
    original = DeviceReader._read_gid_table

    def vanishing(self: DeviceReader, port: PortShape) -> bool:
        if self.name == "mlx5_1" and "mlx5_1" not in sim_host.removed:
            sim_host.remove_device("mlx5_1")
        return original(self, port)

    monkeypatch.setattr(DeviceReader, "_read_gid_table", vanishing)
    sim_host.set_port_up("mlx5_1", False)  # announced (carrier): the pass reads the whole table
    racing = reader.state_pass(trust_events=True, full_gid_tables={"mlx5_1"}).snapshot
    port = racing.port("mlx5_1", 1)
    assert port is not None and port.gids == before.gids, "a vanishing device's table is not 'empty'"
    assert reader.read().device("mlx5_1") is None
