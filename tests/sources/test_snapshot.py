"""HostReader end to end: the captured tree, the simulator, one fault at a time, held fds, GID caching."""

from __future__ import annotations

import dataclasses
import errno
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from rnic_exporter.config.file import reader_settings
from rnic_exporter.model.host import (
    ROCE_V1,
    ROCE_V2,
    CounterValue,
    Device,
    GidEntry,
    LinkRate,
    Netdev,
    NumberedState,
    PcieLink,
    Port,
    ReadError,
    Snapshot,
)
from rnic_exporter.sim import SimHost
from rnic_exporter.sim.gid_table import address_gid
from rnic_exporter.sim.host import ETH_RATE_NAMES, IB_LANE_GBPS
from rnic_exporter.sim.sysfs_root import SimSysfsRoot
from rnic_exporter.sources.reader import GID_SWEEP_SLOTS, HostReader
from rnic_exporter.sources.sysfs import ErrorLog, SysfsRoot
from tests.support.netdev import read_netdev
from tests.support.sim import GidTableCounter, refresh_overlay, whole_gid_reads

Content = tuple[tuple[Device, ...], dict[str, Netdev], dict[str, PcieLink]]


def content(snap: Snapshot) -> Content:
    """What a snapshot says about the host (not when it was taken, nor what failed)."""
    return snap.devices, dict(snap.netdevs), dict(snap.pcie)


def poll(reader: HostReader, host: SimHost, *, full_gid_tables: bool | frozenset[str] = False) -> Snapshot:
    """One poll of a reader kept across host changes. `SimHost.errno_overlay` is a copy, not a view,
    so the kernel's EINVAL answers for empty GID slots are taken again first."""
    refresh_overlay(reader.root, host.errno_overlay)
    return reader.read(full_gid_tables=full_gid_tables)


def raw(host: SimHost, rel: str) -> str:
    return (host.root / rel).read_text().removesuffix("\n")


# -- (a) the captured procfs tree --------------------------------------------------------------

BASE_SET = (
    "VL15_dropped",
    "excessive_buffer_overrun_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "port_rcv_constraint_errors",
    "port_rcv_data",
    "port_rcv_errors",
    "port_rcv_packets",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_data",
    "port_xmit_discards",
    "port_xmit_packets",
    "port_xmit_wait",
    "symbol_error",
)
EXTENDED_ONLY = ("multicast_rcv_packets", "multicast_xmit_packets", "unicast_rcv_packets", "unicast_xmit_packets")


def pma(extended: bool, **nonzero: int) -> dict[str, CounterValue]:
    """The port's PMA counters as the capture holds them: every file, zero unless given (data already x4)."""
    names = BASE_SET + (EXTENDED_ONLY if extended else ())
    return {name: CounterValue(nonzero.get(name, 0)) for name in names}


LINK_UP = NumberedState(5, "LinkUp")


def ib_port(
    device: str,
    number: int,
    rate: LinkRate,
    counters: dict[str, CounterValue],
    phys_state: NumberedState = LINK_UP,
    hw_counters: Mapping[str, int] | None = None,
) -> Port:
    return Port(
        device=device,
        number=number,
        link_layer="InfiniBand",
        state=NumberedState(4, "ACTIVE"),
        phys_state=phys_state,
        rate=rate,
        lid=None,
        counters=counters,
        hw_counters=hw_counters or {},
        gids=(),
        gid_table_size=0,
        netdevs=(),
        nccl_gid_index=None,
    )


def fixture_device(
    name: str,
    ports: tuple[Port, ...],
    *,
    fw_ver: str,
    board_id: str,
    hca_type: str | None = None,
    node_guid: str | None = None,
) -> Device:
    return Device(
        name=name,
        node_guid=node_guid,
        sys_image_guid=None,
        fw_ver=fw_ver,
        hca_type=hca_type,
        board_id=board_id,
        hw_rev=None,
        node_type=None,
        node_desc=None,
        pci_address=None,
        ports=ports,
        hw_counters={},
        netdevs=(),
    )


FIXTURE_DEVICES = (
    fixture_device(
        "hfi1_0",
        (
            ib_port(
                "hfi1_0",
                1,
                LinkRate(100.0, 4, "EDR"),
                pma(
                    False,
                    port_rcv_data=345091702026 * 4,
                    port_rcv_packets=638036947,
                    port_xmit_data=273558326543 * 4,
                    port_xmit_packets=568318856,
                ),
            ),
        ),
        fw_ver="1.27.0",
        board_id="HPE 100Gb 1-port OP101 QSFP28 x16 PCIe Gen3 with Intel Omni-Path Adapter",
    ),
    fixture_device(
        "mlx4_0",
        (
            ib_port(
                "mlx4_0",
                1,
                LinkRate(40.0, 4, "QDR"),
                pma(
                    False,
                    port_rcv_data=2221223609 * 4,
                    port_rcv_packets=87169372,
                    port_xmit_data=26509113295 * 4,
                    port_xmit_packets=85734114,
                    port_xmit_wait=3599,
                ),
            ),
            ib_port(
                "mlx4_0",
                2,
                LinkRate(40.0, 4, "QDR"),
                pma(  # link_layer "InfiniBand\n\n" in the capture
                    False,
                    port_rcv_data=2460436784 * 4,
                    port_rcv_packets=89332064,
                    port_xmit_data=26540356890 * 4,
                    port_xmit_packets=88622850,
                    port_xmit_wait=3846,
                ),
            ),
        ),
        fw_ver="2.31.5050",
        board_id="SM_1141000001000",
        hca_type="MT4099",
    ),
    fixture_device(
        "mlx5_0",
        (
            ib_port(
                "mlx5_0",
                1,
                LinkRate(25.0, 1, "EDR"),
                pma(
                    True,
                    port_rcv_data=18126345378 * 4,
                    port_rcv_packets=541889824,
                    port_xmit_data=2880761508848 * 4,
                    port_xmit_packets=10907922116,
                    unicast_rcv_packets=541889824,
                    unicast_xmit_packets=10907922116,
                ),
                phys_state=NumberedState(4, "ACTIVE"),  # the capture's phys_state is "4: ACTIVE"
                hw_counters={
                    "duplicate_request": 41,
                    "implied_nak_seq_err": 0,
                    "local_ack_timeout_err": 131,
                    "out_of_buffer": 0,
                    "out_of_sequence": 1,
                    "packet_seq_err": 1,
                    "req_cqe_error": 3481,
                    "req_cqe_flush_error": 80,
                    "req_remote_access_errors": 0,
                    "req_remote_invalid_request": 0,
                    "resp_cqe_error": 8109,
                    "resp_cqe_flush_error": 4708,
                    "resp_local_length_error": 0,
                    "resp_remote_access_errors": 0,
                    "rnr_nak_retry_err": 0,
                    "roce_adp_retrans": 99,
                    "roce_adp_retrans_to": 4,
                    "roce_slow_restart": 0,
                    "roce_slow_restart_cnps": 131,
                    "roce_slow_restart_trans": 0,
                    "rx_atomic_requests": 0,
                    "rx_dct_connect": 0,
                    "rx_read_requests": 175528982,
                    "rx_write_requests": 742114,
                },
            ),
        ),
        fw_ver="14.28.2006",
        board_id="SM_2001000001034",
        hca_type="MT4118",
        node_guid="0a7f:bc12:45ef:d23b",
    ),
)
# The core attributes the capture lacks (sysfs.c guarantees them, so their absence is a fault).
# The capture leaves out files every kernel has: absent from the first read on, so unsupported.
FIXTURE_UNSUPPORTED = sorted(
    [
        ReadError("hfi1_0", None, "node_guid", "absent: ENOENT"),
        ReadError("hfi1_0", None, "sys_image_guid", "absent: ENOENT"),
        ReadError("hfi1_0", None, "node_type", "absent: ENOENT"),
        ReadError("mlx4_0", None, "node_guid", "absent: ENOENT"),
        ReadError("mlx4_0", None, "sys_image_guid", "absent: ENOENT"),
        ReadError("mlx4_0", None, "node_type", "absent: ENOENT"),
        ReadError("mlx5_0", None, "sys_image_guid", "absent: ENOENT"),
        ReadError("mlx5_0", None, "node_type", "absent: ENOENT"),
    ],
    key=repr,
)


@pytest.mark.parametrize("device", [d.name for d in FIXTURE_DEVICES])
def test_captured_tree_device(fixture_sys: Path, device: str) -> None:
    snap = HostReader(SysfsRoot(fixture_sys)).read()
    (want,) = [d for d in FIXTURE_DEVICES if d.name == device]
    assert snap.device(device) == want


def test_captured_tree_whole_snapshot(fixture_sys: Path) -> None:
    snap = HostReader(SysfsRoot(fixture_sys)).read()
    assert content(snap) == (FIXTURE_DEVICES, {}, {})
    assert snap.errors == ()
    assert sorted(snap.unsupported, key=repr) == FIXTURE_UNSUPPORTED
    port = snap.port("mlx5_0", 1)
    assert port is not None and "lifespan" not in port.hw_counters
    assert port.counters["port_xmit_data"] == CounterValue(2880761508848 * 4)


def test_captured_tree_counter_widths(fixture_copy: Path) -> None:
    """Saturation is 2^width-1: base-set data/packets (no unicast files) are 32-bit, the extended set's 64."""
    rows = [  # device, port, counter, raw value written, value read, saturated
        ("mlx4_0", 1, "port_xmit_data", 2**32 - 1, (2**32 - 1) * 4, True),
        ("mlx4_0", 1, "port_rcv_packets", 2**32 - 1, 2**32 - 1, True),
        ("mlx4_0", 2, "symbol_error", 2**16 - 1, 2**16 - 1, True),
        ("mlx4_0", 2, "link_downed", 2**8 - 1, 2**8 - 1, True),
        ("mlx4_0", 2, "local_link_integrity_errors", 2**4 - 1, 2**4 - 1, True),
        ("mlx4_0", 2, "port_xmit_wait", 2**32 - 1, 2**32 - 1, True),
        ("hfi1_0", 1, "port_xmit_data", 2**32 - 2, (2**32 - 2) * 4, False),
        ("mlx5_0", 1, "port_xmit_data", 2**32 - 1, (2**32 - 1) * 4, False),
        ("mlx5_0", 1, "unicast_xmit_packets", 2**32 - 1, 2**32 - 1, False),
        ("mlx5_0", 1, "port_rcv_packets", 2**64 - 1, 2**64 - 1, True),
    ]
    for device, port, name, written, _, _ in rows:
        (fixture_copy / f"class/infiniband/{device}/ports/{port}/counters/{name}").write_text(f"{written}\n")
    snap = HostReader(SysfsRoot(fixture_copy)).read()
    for device, port, name, _, value, saturated in rows:
        got = snap.port(device, port)
        assert got is not None and got.counters[name] == CounterValue(value, saturated), (device, port, name)


def test_captured_netdev_with_a_plain_file_for_device(fixture_sys: Path) -> None:
    log = ErrorLog(SysfsRoot(fixture_sys))
    assert not (fixture_sys / "class/net/eth0/device").is_symlink()  # the capture's quirk
    netdev = read_netdev(log, "eth0", "mlx5_0", 1)
    assert netdev == Netdev(
        name="eth0",
        ifindex=2,
        address="01:01:01:01:01:01",
        mtu=1500,
        speed_mbps=1000,
        operstate="up",
        carrier=True,
        carrier_changes=2,
        carrier_up_count=1,
        carrier_down_count=1,
        pci_address=None,
    )
    assert [(e.device, e.port, e.attribute, e.reason.split(":")[0]) for e in log.errors] == [
        ("mlx5_0", 1, "net/eth0/device", "EINVAL")
    ]


# -- (b) the simulator: what it wrote comes back ---------------------------------------------


def expected_from_sim(host: SimHost) -> Content:
    """The snapshot of a healthy simulated host, from the simulator's model and the files it wrote."""
    devices, netdevs, pcie = [], {}, {}
    for dev in sorted(host.devices.values(), key=lambda d: d.name):
        ib, net = f"class/infiniband/{dev.name}", f"class/net/{dev.netdev}"
        port_dir = f"{ib}/ports/1"
        table = dev.gid_table
        gids = tuple(
            GidEntry(i, slot.gid, slot.type, slot.netdev)
            for i in range(table.size)
            if (slot := table.visible(i)) is not None
        )
        if dev.roce:
            lanes, speed = ETH_RATE_NAMES[dev.gbps]
            rate = LinkRate(float(dev.gbps), lanes, speed)
            # NCCL's net effect on such a table: the lowest-index IPv4 RoCE v2 GID (facts §3)
            nccl = table.index_of(dev.addresses[0], ROCE_V2) if dev.addresses else 0
        else:
            rate = LinkRate(IB_LANE_GBPS[dev.ib_speed] * dev.lanes, dev.lanes, dev.ib_speed)
            nccl = 0
        port = Port(
            device=dev.name,
            number=1,
            link_layer=dev.link_layer,
            state=NumberedState(4, "ACTIVE"),
            phys_state=NumberedState(5, "LinkUp"),
            rate=rate,
            lid=int(raw(host, f"{port_dir}/lid"), 16),
            counters={
                name: CounterValue(value * 4 if name.endswith("_data") else value)
                for name, value in dev.counters.items()
            },
            hw_counters=dict(dev.hw_counters),
            gids=gids,
            gid_table_size=table.size,
            netdevs=(dev.netdev,),
            nccl_gid_index=nccl,
        )
        devices.append(
            Device(
                name=dev.name,
                node_guid=dev.node_guid,
                sys_image_guid=dev.node_guid,
                fw_ver=dev.fw_ver,
                hca_type=dev.hca_type,
                board_id=dev.board_id,
                hw_rev=raw(host, f"{ib}/hw_rev"),
                node_type=NumberedState(1, "CA"),
                node_desc=raw(host, f"{ib}/node_desc"),
                pci_address=dev.pci_address,
                ports=(port,),
                hw_counters={},
                netdevs=(dev.netdev,),
            )
        )
        netdevs[dev.netdev] = Netdev(
            name=dev.netdev,
            ifindex=int(raw(host, f"{net}/ifindex")),
            address=raw(host, f"{net}/address"),
            mtu=int(raw(host, f"{net}/mtu")),
            speed_mbps=dev.gbps * 1000,
            operstate="up",
            carrier=True,
            carrier_changes=dev.carrier_up + dev.carrier_down,
            carrier_up_count=dev.carrier_up,
            carrier_down_count=dev.carrier_down,
            pci_address=dev.pci_address,
        )
        pcie[dev.pci_address] = PcieLink(
            pci_address=dev.pci_address,
            current_speed_gts=dev.pcie_current[0],
            max_speed_gts=dev.pcie_max[0],
            current_width=dev.pcie_current[1],
            max_width=dev.pcie_max[1],
            upstream_max_speed_gts=dev.pcie_max[0],
            upstream_max_width=dev.pcie_max[1],
            aer_errors=()
            if dev.aer is None
            else tuple(
                (severity, sum(n for (s, _), n in dev.aer.items() if s == severity))
                for severity in ("correctable", "nonfatal", "fatal")
            ),
        )
    return tuple(devices), netdevs, pcie


def test_simulator_values_come_back(sim_host: SimHost, read_sim: Callable[[SimHost], Snapshot]) -> None:
    sim_host.set_pcie("mlx5_1", 16.0, 8)  # current differs from max, so the two cannot be swapped unseen
    snap = read_sim(sim_host)
    assert snap.errors == ()
    assert content(snap) == expected_from_sim(sim_host)
    for name in ("mlx5_0", "mlx5_1"):
        port = snap.port(name, 1)
        assert port is not None and port.nccl_gid_index == 3 and port.gid_table_size == 16
        assert port.gid(3) == GidEntry(
            3, address_gid(sim_host.device(name).addresses[0]), ROCE_V2, sim_host.device(name).netdev
        )
    assert snap.pcie["0000:19:00.0"].current_width == 8


def test_empty_gid_slots_read_as_empty_through_einval_and_as_empty_files(
    sim_host: SimHost, read_sim: Callable[[SimHost], Snapshot]
) -> None:
    """The kernel's EINVAL for types/ndevs of an empty slot (overlay) and the simulator's on-disk
    stand-in (an empty file, what an out-of-process reader of the tree sees) mean the same: no error."""
    sim_host.gid_shift("mlx5_0")  # also leaves a pending-delete slot (3) that reads as the zero GID
    with_einval = read_sim(sim_host)
    on_disk = HostReader(SysfsRoot(sim_host.root)).read()
    assert with_einval.errors == () and on_disk.errors == ()
    assert content(on_disk) == content(with_einval) == expected_from_sim(sim_host)


def test_no_infiniband_class_is_an_empty_snapshot(tmp_path: Path) -> None:
    for layout in ("nothing", "empty class dir"):
        root = tmp_path / layout
        root.mkdir()
        if layout == "empty class dir":
            (root / "class/infiniband").mkdir(parents=True)
        snap = HostReader(SysfsRoot(root)).read()
        assert (content(snap), snap.errors) == (((), {}, {}), ()), layout


# -- (c) one fault costs one attribute ---------------------------------------------------------

VICTIM, VICTIM_NETDEV, VICTIM_BDF = "mlx5_1", "ens2f0np0", "0000:19:00.0"
VPORT = f"class/infiniband/{VICTIM}/ports/1"
VFUNC = "devices/pci0000:18/0000:18:00.0/0000:19:00.0"


def edit_device(snap: Snapshot, **changes: Any) -> Snapshot:
    devices = tuple(dataclasses.replace(d, **changes) if d.name == VICTIM else d for d in snap.devices)
    return dataclasses.replace(snap, devices=devices)


def edit_port(snap: Snapshot, edit: Callable[[Port], Port]) -> Snapshot:
    dev = snap.device(VICTIM)
    assert dev is not None
    return edit_device(snap, ports=tuple(edit(p) for p in dev.ports))


def set_port(**changes: Any) -> Callable[[Snapshot], Snapshot]:
    return lambda snap: edit_port(snap, lambda p: dataclasses.replace(p, **changes))


def drop_key(field: str, key: str) -> Callable[[Snapshot], Snapshot]:
    def edit(port: Port) -> Port:
        values = dict(getattr(port, field))
        del values[key]
        changes: dict[str, Any] = {field: values}
        return dataclasses.replace(port, **changes)

    return lambda snap: edit_port(snap, edit)


def edit_gid(index: int, **changes: Any) -> Callable[[Port], Port]:
    def edit(port: Port) -> Port:
        gids = tuple(dataclasses.replace(g, **changes) if g.index == index else g for g in port.gids)
        return dataclasses.replace(port, gids=gids)

    return edit


def drop_gid(index: int) -> Callable[[Snapshot], Snapshot]:
    return lambda snap: edit_port(
        snap, lambda p: dataclasses.replace(p, gids=tuple(g for g in p.gids if g.index != index))
    )


def set_netdev(**changes: Any) -> Callable[[Snapshot], Snapshot]:
    def edit(snap: Snapshot) -> Snapshot:
        netdevs = dict(snap.netdevs)
        netdevs[VICTIM_NETDEV] = dataclasses.replace(netdevs[VICTIM_NETDEV], **changes)
        return dataclasses.replace(snap, netdevs=netdevs)

    return edit


def set_pcie(**changes: Any) -> Callable[[Snapshot], Snapshot]:
    def edit(snap: Snapshot) -> Snapshot:
        pcie = dict(snap.pcie)
        pcie[VICTIM_BDF] = dataclasses.replace(pcie[VICTIM_BDF], **changes)
        return dataclasses.replace(snap, pcie=pcie)

    return edit


def set_device(**changes: Any) -> Callable[[Snapshot], Snapshot]:
    return lambda snap: edit_device(snap, **changes)


@dataclasses.dataclass(frozen=True)
class Fault:
    rel: str  # the file, as the reader opens it (relative to the mount)
    expect: Callable[[Snapshot], Snapshot]  # the healthy snapshot with the lost value taken out
    error: tuple[str, int | None, str, str] | None  # (device, port, attribute, reason or "malformed:")
    errno: int | None = None  # the read fails with this errno (SysfsRoot errno_overlay)
    content: bytes | None = None  # the file holds this instead
    delete: bool = False
    directory: bool = False  # a directory stands where the file should be
    static: bool = False  # read once per device registration: a later poll does not see the fault
    # A new reader's first read sees the fault from the start: the driver's "not provided" answers
    # are then unsupported with this reason (sources.availability); a reader that read it before
    # reports `error` (the attribute failed).
    unsupported: str | None = None
    # A reader that read the value before keeps it while it is unreadable (unknown is not empty: a
    # GID slot that breaks for a moment must not move the table's hash and NCCL's pick twice).
    kept_by_a_reader_that_read_it: bool = False


def rate_fault(**kwargs: Any) -> Fault:
    return Fault(f"{VPORT}/rate", set_port(rate=None), **kwargs)


FAULTS = [
    pytest.param(
        rate_fault(delete=True, error=(VICTIM, 1, "rate", "ENOENT"), unsupported="absent: ENOENT"),
        id="rate-ENOENT-deleted",
    ),
    pytest.param(
        rate_fault(errno=errno.EINVAL, error=(VICTIM, 1, "rate", "EINVAL"), unsupported="not_supported: EINVAL"),
        id="rate-EINVAL",
    ),
    pytest.param(rate_fault(errno=errno.ENODEV, error=(VICTIM, 1, "rate", "ENODEV")), id="rate-ENODEV"),
    pytest.param(rate_fault(errno=errno.EIO, error=(VICTIM, 1, "rate", "EIO")), id="rate-EIO"),
    pytest.param(rate_fault(errno=errno.EACCES, error=(VICTIM, 1, "rate", "EACCES")), id="rate-EACCES"),
    pytest.param(rate_fault(directory=True, error=(VICTIM, 1, "rate", "EISDIR")), id="rate-EISDIR-directory"),
    pytest.param(rate_fault(content=b"", error=(VICTIM, 1, "rate", "malformed:")), id="rate-empty-file"),
    pytest.param(rate_fault(content=b"fast\n", error=(VICTIM, 1, "rate", "malformed:")), id="rate-garbage"),
    pytest.param(
        Fault(f"{VPORT}/state", set_port(state=None), (VICTIM, 1, "state", "EIO"), errno=errno.EIO), id="state-EIO"
    ),
    pytest.param(
        Fault(
            f"{VPORT}/counters/symbol_error",
            drop_key("counters", "symbol_error"),
            (VICTIM, 1, "counters/symbol_error", "no_pma: N/A (no PMA)"),
            content=b"N/A (no PMA)\n",
            unsupported="no_pma: N/A (no PMA)",
        ),
        id="counter-N/A-no-PMA",
    ),
    pytest.param(
        Fault(
            f"{VPORT}/counters/port_xmit_data",
            drop_key("counters", "port_xmit_data"),
            (VICTIM, 1, "counters/port_xmit_data", "EIO"),
            errno=errno.EIO,
        ),
        id="counter-EIO",
    ),
    pytest.param(
        Fault(
            f"{VPORT}/hw_counters/out_of_buffer",
            drop_key("hw_counters", "out_of_buffer"),
            (VICTIM, 1, "hw_counters/out_of_buffer", "ENODEV"),
            errno=errno.ENODEV,
        ),
        id="hw-counter-ENODEV",
    ),
    pytest.param(
        Fault(
            f"class/infiniband/{VICTIM}/fw_ver",
            set_device(fw_ver=None),
            (VICTIM, None, "fw_ver", "EACCES"),
            errno=errno.EACCES,
            static=True,
        ),
        id="fw-ver-EACCES",
    ),
    pytest.param(
        Fault(
            f"class/infiniband/{VICTIM}/node_guid",
            set_device(node_guid=None),
            (VICTIM, None, "node_guid", "malformed:"),
            content=b"not-a-guid\n",
            static=True,
        ),
        id="node-guid-garbage",
    ),
    pytest.param(
        Fault(f"class/infiniband/{VICTIM}/hca_type", set_device(hca_type=None), None, delete=True, static=True),
        id="optional-hca-type-absent-is-no-error",
    ),
    pytest.param(
        Fault(
            f"class/net/{VICTIM_NETDEV}/speed",
            set_netdev(speed_mbps=None),
            (VICTIM, 1, f"net/{VICTIM_NETDEV}/speed", "EIO"),
            errno=errno.EIO,
        ),
        id="netdev-speed-EIO",
    ),
    pytest.param(
        Fault(f"class/net/{VICTIM_NETDEV}/speed", set_netdev(speed_mbps=None), None, errno=errno.EINVAL),
        id="netdev-speed-EINVAL-is-admin-down-no-error",
    ),
    pytest.param(
        Fault(
            f"{VFUNC}/current_link_width",
            set_pcie(current_width=None),
            (VICTIM, None, "device/current_link_width", "EIO"),
            errno=errno.EIO,
        ),
        id="pcie-width-EIO",
    ),
    pytest.param(
        Fault(
            "devices/pci0000:18/0000:18:00.0/max_link_speed",
            set_pcie(upstream_max_speed_gts=None),
            (VICTIM, None, "device/../max_link_speed", "EIO"),
            errno=errno.EIO,
        ),
        id="upstream-speed-EIO",
    ),
    # GID slots. The GID itself is the entry's key: without it there is no entry. Type and netdev
    # are attributes of it (GidEntry: "None when unreadable"); NCCL's own pick fails with
    # ncclSystemError when it cannot read a type it compares, so there is no index it "would pick".
    pytest.param(
        Fault(
            f"{VPORT}/gids/2",
            drop_gid(2),
            (VICTIM, 1, "gids/2", "EIO"),
            errno=errno.EIO,
            kept_by_a_reader_that_read_it=True,
        ),
        id="gid-EIO",
    ),
    pytest.param(
        Fault(
            f"{VPORT}/gid_attrs/types/3",
            lambda s: edit_port(s, lambda p: dataclasses.replace(edit_gid(3, type=None)(p), nccl_gid_index=None)),
            (VICTIM, 1, "gid_attrs/types/3", "EIO"),
            errno=errno.EIO,
            kept_by_a_reader_that_read_it=True,
        ),
        id="gid-type-EIO",
    ),
    pytest.param(
        Fault(
            f"{VPORT}/gid_attrs/ndevs/3",
            lambda s: edit_port(s, edit_gid(3, netdev=None)),
            (VICTIM, 1, "gid_attrs/ndevs/3", "EIO"),
            errno=errno.EIO,
            kept_by_a_reader_that_read_it=True,
        ),
        id="gid-ndev-EIO",
    ),
]


@pytest.fixture(scope="module")
def two_nics(tmp_path_factory: pytest.TempPathFactory) -> SimHost:
    """Two RoCE NICs, shared by the fault rows: each row undoes its fault (and checks it did)."""
    host = SimHost.build(tmp_path_factory.mktemp("two-nics") / "sys", roce=2, gid_table_size=16)
    assert host.device(VICTIM).function_dir == VFUNC and host.device(VICTIM).netdev == VICTIM_NETDEV
    return host


@pytest.fixture(scope="module")
def healthy(two_nics: SimHost) -> Snapshot:
    snap = HostReader(SimSysfsRoot(two_nics.root, errno_overlay=two_nics.errno_overlay)).read()
    assert snap.errors == () and len(snap.devices) == 2
    return snap


@contextmanager
def injected(host: SimHost, fault: Fault, overlay: dict[str, int]) -> Iterator[None]:
    path = host.root / fault.rel
    saved = path.read_bytes()
    try:
        if fault.errno is not None:
            overlay[fault.rel] = fault.errno
        elif fault.delete:
            path.unlink()
        elif fault.directory:
            path.unlink()
            path.mkdir()
        else:
            assert fault.content is not None
            path.write_bytes(fault.content)
        yield
    finally:
        overlay.pop(fault.rel, None)
        if path.is_dir():
            path.rmdir()
        path.write_bytes(saved)


def error_rows(snap: Snapshot) -> list[tuple[str, int | None, str, str]]:
    return [
        (e.device, e.port, e.attribute, "malformed:" if e.reason.startswith("malformed:") else e.reason)
        for e in snap.errors
    ]


@pytest.mark.parametrize("fault", FAULTS)
def test_one_fault_costs_one_attribute(two_nics: SimHost, healthy: Snapshot, fault: Fault) -> None:
    overlay = dict(two_nics.errno_overlay)
    assert fault.rel not in overlay
    earlier = HostReader(SimSysfsRoot(two_nics.root, errno_overlay=overlay))
    assert content(earlier.read()) == content(healthy)
    with injected(two_nics, fault, overlay):
        first = HostReader(SimSysfsRoot(two_nics.root, errno_overlay=overlay)).read()
        refresh_overlay(earlier.root, overlay)
        later = earlier.read()
    after = HostReader(SimSysfsRoot(two_nics.root, errno_overlay=two_nics.errno_overlay)).read()
    assert content(after) == content(healthy) and after.errors == (), "the fault was not undone"

    want = fault.expect(healthy)
    assert content(want) != content(healthy)  # every row loses a value
    errors = [fault.error] if fault.error is not None else []
    assert first.device("mlx5_0") == healthy.device("mlx5_0")
    first_errors = [] if fault.unsupported else errors
    assert (content(first), error_rows(first)) == (content(want), first_errors), "first poll of a new reader"
    if fault.unsupported is not None:
        assert fault.error is not None
        assert [(e.device, e.port, e.attribute, e.reason) for e in first.unsupported] == [
            (*fault.error[:3], fault.unsupported)
        ]
    else:
        assert first.unsupported == ()
    if not fault.static:
        want_later = healthy if fault.kept_by_a_reader_that_read_it else want
        assert (content(later), error_rows(later)) == (content(want_later), errors), (
            "poll of a reader that polled before"
        )


class RemovingRoot(SimSysfsRoot):
    """Takes `victim` off the simulated bus just before attribute read number `at` (never when -1)."""

    def __init__(self, host: SimHost, victim: str, at: int) -> None:
        super().__init__(host.root, errno_overlay=host.errno_overlay)
        self.host, self.victim, self.at = host, victim, at
        self.trail: list[str] = []

    def read_bytes(self, rel: str) -> bytes:
        if len(self.trail) == self.at:
            self.host.remove_device(self.victim)
        self.trail.append(rel)
        return super().read_bytes(rel)


def assert_partial_port(got: Port, want: Port) -> None:
    for f in dataclasses.fields(Port):
        have, full = getattr(got, f.name), getattr(want, f.name)
        if f.name in ("counters", "hw_counters"):
            assert have.items() <= full.items(), f.name
        elif f.name == "gids":
            for entry in have:
                expected = want.gid(entry.index)
                assert expected is not None and (entry.gid, entry.type) in (
                    (expected.gid, expected.type),
                    (expected.gid, None),
                )
                assert entry.netdev in (expected.netdev, None)
        elif f.name == "netdevs":
            assert set(have) <= set(full)
        elif f.name == "gid_table_size":
            assert have in (0, full)
        elif f.name != "nccl_gid_index":  # derived from whatever part of the table was read
            assert have is None or have == full, f.name


def assert_partial(got: object, want: object) -> None:
    """Every value `got` has is the healthy one; what it lacks is None, empty or missing."""
    assert dataclasses.is_dataclass(got) and type(got) is type(want)
    for f in dataclasses.fields(got):
        have, full = getattr(got, f.name), getattr(want, f.name)
        if f.name == "ports":
            numbers = {p.number: p for p in full}
            for port in have:
                assert_partial_port(port, numbers[port.number])
        elif isinstance(full, Mapping):
            assert have.items() <= full.items(), f.name
        elif isinstance(full, tuple):
            assert set(have) <= set(full), f.name
        else:
            assert have is None or have == full, f.name


@pytest.mark.parametrize("sim_host", [{"gid_table_size": 8}], indirect=True)  # each trial rewrites the NIC
def test_device_removed_mid_read(sim_host: SimHost) -> None:
    healthy = HostReader(RemovingRoot(sim_host, VICTIM, -1)).read()
    assert healthy.errors == ()
    recorder = RemovingRoot(sim_host, VICTIM, -1)
    HostReader(recorder).read()
    dev = sim_host.device(VICTIM)
    mine = (
        f"class/infiniband/{VICTIM}/",
        dev.function_dir + "/",
        os.path.dirname(dev.function_dir) + "/",
        f"class/net/{dev.netdev}/",
    )
    reads = [i for i, rel in enumerate(recorder.trail) if rel.startswith(mine)]
    first, last = reads[0], reads[-1]
    assert last - first > 50 and last < len(recorder.trail) - 50  # mlx5_2 is read after the victim
    points = sorted({first, last, last + 1, *range(first, last, max(1, (last - first) // 5))})
    others = ("mlx5_0", "mlx5_2")
    cut_short = 0
    for at in points:
        snap = HostReader(RemovingRoot(sim_host, VICTIM, at)).read()
        assert sim_host.removed == {VICTIM}, at
        for name in others:
            assert snap.device(name) == healthy.device(name), (at, name)
            netdev = sim_host.device(name).netdev
            assert snap.netdevs[netdev] == healthy.netdevs[netdev], (at, netdev)
            bdf = sim_host.device(name).pci_address
            assert snap.pcie[bdf] == healthy.pcie[bdf], (at, bdf)
        assert {e.device for e in snap.errors} <= {VICTIM}, (at, snap.errors)
        cut_short += bool(snap.errors)
        victim = snap.device(VICTIM)
        if victim is not None:
            assert_partial(victim, healthy.device(VICTIM))
        if VICTIM_NETDEV in snap.netdevs:
            assert_partial(snap.netdevs[VICTIM_NETDEV], healthy.netdevs[VICTIM_NETDEV])
        if VICTIM_BDF in snap.pcie:
            assert_partial(snap.pcie[VICTIM_BDF], healthy.pcie[VICTIM_BDF])
        sim_host.restore_device(VICTIM)
    assert cut_short >= len(points) // 2  # the removal did land in the middle of reading the victim
    again = HostReader(SimSysfsRoot(sim_host.root, errno_overlay=sim_host.errno_overlay)).read()
    assert content(again) == content(healthy) and again.errors == ()


# -- (d) held file descriptors ---------------------------------------------------------------


def held_reader(host: SimHost) -> HostReader:
    return HostReader(GidTableCounter(host.root, hold_fds=True, errno_overlay=host.errno_overlay))


def test_held_fds_see_rewritten_values(sim_host: SimHost, read_sim: Callable[[SimHost], Snapshot]) -> None:
    reader = held_reader(sim_host)
    before = poll(reader, sim_host)
    held = reader.root.held_fds
    assert held > 100
    sim_host.set_speed("mlx5_0", 200)
    sim_host.set_port_up("mlx5_1", False)
    sim_host.set_pcie("mlx5_2", 16.0, 8)
    sim_host.add_traffic(2.0)
    after = poll(reader, sim_host)
    assert after.errors == ()
    assert content(after) == content(read_sim(sim_host))  # nothing stale anywhere
    assert reader.root.held_fds == held  # and all of it through the descriptors opened by the first poll
    for name, field in (("mlx5_0", "rate"), ("mlx5_1", "state"), ("mlx5_2", "counters")):
        was, now = before.port(name, 1), after.port(name, 1)
        assert was is not None and now is not None and getattr(was, field) != getattr(now, field)
    port = after.port("mlx5_0", 1)
    assert port is not None and port.rate == LinkRate(200.0, 4, "HDR")
    assert after.netdevs["ens2f0np0"].speed_mbps == -1 and after.netdevs["ens2f0np0"].carrier is False
    assert after.pcie["0000:21:00.0"].current_width == 8


def change_firmware(host: SimHost, name: str) -> None:
    """While the NIC is off the bus: new firmware, counters reset."""
    dev = host.device(name)
    dev.fw_ver = "28.40.1000"
    for counter in dev.counters:
        dev.counters[counter] = 7


def test_held_fds_reopen_after_remove_and_restore(sim_host: SimHost, read_sim: Callable[[SimHost], Snapshot]) -> None:
    """`gone` polls while the NIC is off the bus; `quick` does not see it go (re-registered between polls)."""
    gone, quick = held_reader(sim_host), held_reader(sim_host)
    poll(gone, sim_host)
    poll(quick, sim_host)
    held = gone.root.held_fds
    assert quick.root.held_fds == held
    sim_host.remove_device(VICTIM)
    missing = poll(gone, sim_host)
    assert [d.name for d in missing.devices] == ["mlx5_0", "mlx5_2"] and missing.errors == ()
    assert gone.root.held_fds < held
    change_firmware(sim_host, VICTIM)
    sim_host.restore_device(VICTIM)
    fresh = content(read_sim(sim_host))
    for label, reader in (("polled while gone", gone), ("re-registered between polls", quick)):
        back = poll(reader, sim_host)
        assert back.errors == () and content(back) == fresh, label
        victim, port = back.device(VICTIM), back.port(VICTIM, 1)
        assert victim is not None and victim.fw_ver == "28.40.1000", label
        assert port is not None and port.counters["port_xmit_data"] == CounterValue(7 * 4), label
        assert reader.root.held_fds == held, label


# -- (e) GID table caching -------------------------------------------------------------------


def test_gid_shift_is_seen_on_the_next_poll(sim_host: SimHost, read_sim: Callable[[SimHost], Snapshot]) -> None:
    readers = {"open per read": HostReader(SimSysfsRoot(sim_host.root)), "held fds": held_reader(sim_host)}
    for reader in readers.values():
        port = poll(reader, sim_host).port("mlx5_0", 1)
        assert port is not None and port.nccl_gid_index == 3
    assert sim_host.gid_shift("mlx5_0") == (3, 4)
    dev = sim_host.device("mlx5_0")
    gid = address_gid(dev.addresses[0])
    fresh = content(read_sim(sim_host))
    for label, reader in readers.items():
        snap = poll(reader, sim_host)
        port = snap.port("mlx5_0", 1)
        assert port is not None, label
        assert port.gid(2) == GidEntry(2, gid, ROCE_V1, dev.netdev), label
        assert port.gid(3) is None, label
        assert port.gid(4) == GidEntry(4, gid, ROCE_V2, dev.netdev), label
        assert port.nccl_gid_index == 4, label
        other = snap.port("mlx5_1", 1)
        assert other is not None and other.nccl_gid_index == 3, label
        assert snap.errors == () and content(snap) == fresh, label


SWEEP_SIZE = 128


@pytest.fixture(scope="module")
def one_big_table(tmp_path_factory: pytest.TempPathFactory) -> SimHost:
    """One RoCE NIC with a 128-slot table; each test adds an address and removes it again."""
    return SimHost.build(tmp_path_factory.mktemp("big-table") / "sys", roce=1, gid_table_size=SWEEP_SIZE)


@contextmanager
def new_address(host: SimHost, address: str) -> Iterator[tuple[int, int]]:
    v1, v2 = host.add_address("mlx5_0", address)
    try:
        yield v1, v2
    finally:
        host.remove_address("mlx5_0", address)
        assert host.device("mlx5_0").gid_table.visible(v1) is None


def polls_until_seen(reader: HostReader, host: SimHost, index: int, budget: int) -> tuple[int, Port]:
    """Poll (never forcing a full GID read) until slot `index` of mlx5_0 is populated: (polls taken, port)."""
    for polls in range(1, budget + 1):
        port = poll(reader, host).port("mlx5_0", 1)
        assert port is not None
        if port.gid(index) is not None:
            return polls, port
    pytest.fail(f"a GID added in empty slot {index} was not seen in {budget} polls")


@pytest.mark.parametrize("polls_before", range(math.ceil(SWEEP_SIZE / GID_SWEEP_SLOTS)))
def test_address_in_an_empty_slot_is_found_by_the_sweep(one_big_table: SimHost, polls_before: int) -> None:
    """Wherever the sweep stands when the address arrives, it is seen within ceil(size/slots)+1 polls."""
    host = one_big_table
    reader = HostReader(GidTableCounter(host.root))
    for _ in range(1 + polls_before):  # the first poll reads whole tables, the others sweep
        port = poll(reader, host).port("mlx5_0", 1)
        assert port is not None and [g.index for g in port.gids] == [0, 1, 2, 3]
    assert whole_gid_reads(reader) == 1
    with new_address(host, "10.0.77.1") as (v1, v2):
        gid = address_gid("10.0.77.1")
        polls, port = polls_until_seen(reader, host, v2, math.ceil(SWEEP_SIZE / GID_SWEEP_SLOTS) + 1)
        assert port.gid(v1) == GidEntry(v1, gid, ROCE_V1, "ens1f0np0")
        assert port.gid(v2) == GidEntry(v2, gid, ROCE_V2, "ens1f0np0")
        assert port.nccl_gid_index == 3 and port.gid_table_size == SWEEP_SIZE
        assert whole_gid_reads(reader) == 2, f"seen on poll {polls}, but not through the sweep"


def test_forced_full_read_finds_a_new_address_at_once(one_big_table: SimHost) -> None:
    host = one_big_table
    reader = HostReader(SimSysfsRoot(host.root))
    poll(reader, host)
    poll(reader, host)  # the sweep has now moved past the lowest empty slots
    with new_address(host, "10.0.78.1") as (v1, v2):
        port = poll(reader, host, full_gid_tables=True).port("mlx5_0", 1)
        assert port is not None
        assert port.gid(v1) == GidEntry(v1, address_gid("10.0.78.1"), ROCE_V1, "ens1f0np0")
        assert port.gid(v2) == GidEntry(v2, address_gid("10.0.78.1"), ROCE_V2, "ens1f0np0")


def test_fixture_copy_is_a_separate_tree(fixture_sys: Path, fixture_copy: Path) -> None:
    """Tests that break files work on the copy; the captured tree itself stays as it was."""
    rel = "class/infiniband/mlx5_0/ports/1/rate"
    (fixture_copy / rel).write_text("garbage\n")
    assert (fixture_sys / rel).read_text() == "25 Gb/sec (1X EDR)\n"
    shutil.rmtree(fixture_copy / "class/infiniband/hfi1_0")
    assert (fixture_sys / "class/infiniband/hfi1_0").is_dir()


def test_new_settings_recompute_the_nccl_pick(tmp_path: Path) -> None:
    """A config reload that changes NCCL settings must not keep the pick cached under the old ones."""
    host = SimHost.build(tmp_path / "sys", roce=1, gid_table_size=8)
    reader = HostReader(SimSysfsRoot(host.root, errno_overlay=host.errno_overlay))
    assert reader.read().ports[0].nccl_gid_index == 3
    reader.settings = reader_settings(nccl_env={"NCCL_IB_ROCE_VERSION_NUM": "1"})
    assert reader.read().ports[0].nccl_gid_index == 2


# -- (f) what a poll reuses, and what it must not -----------------------------------------------


def test_unchanged_bytes_keep_their_objects_and_changed_ones_are_seen(
    sim_host: SimHost, read_sim: Callable[[SimHost], Snapshot]
) -> None:
    """Objects are reused only while every byte behind them is the same; the sinks rely on that."""
    reader = held_reader(sim_host)
    poll(reader, sim_host)
    first = poll(reader, sim_host)
    again = poll(reader, sim_host)
    assert all(a is b for a, b in zip(first.devices, again.devices, strict=True))
    assert all(again.netdevs[n] is first.netdevs[n] for n in first.netdevs)
    assert all(again.pcie[a] is first.pcie[a] for a in first.pcie)

    sim_host.add_traffic(1.0)  # data and packet counters move on every up port
    busy = poll(reader, sim_host)
    assert content(busy) == content(read_sim(sim_host))
    for name in ("mlx5_0", "mlx5_1", "mlx5_2"):
        was, now = first.port(name, 1), busy.port(name, 1)
        assert was is not None and now is not None
        assert now.counters is not was.counters and now.counters != was.counters, name
        assert now.hw_counters is was.hw_counters and now.gids is was.gids, name  # their bytes did not change
    assert busy.netdevs["ens1f0np0"] is first.netdevs["ens1f0np0"]

    (sim_host.root / "class/infiniband/mlx5_1/node_desc").write_text("renamed-node mlx5_1\n")
    renamed = poll(reader, sim_host)
    dev = renamed.device("mlx5_1")
    assert dev is not None and dev.node_desc == "renamed-node mlx5_1"
    assert renamed.device("mlx5_0") is busy.device("mlx5_0")


def test_a_fault_is_reported_on_every_poll_while_it_lasts(two_nics: SimHost, healthy: Snapshot) -> None:
    """A reader that keeps polling reports the fault each time, not only when it appears, and
    forgets it once the attribute reads again (gauges like rnic_attribute_unavailable must not flap)."""
    for rel, error in (
        (f"{VPORT}/rate", (VICTIM, 1, "rate", "EIO")),
        (f"{VPORT}/gids/2", (VICTIM, 1, "gids/2", "EIO")),
        (f"{VPORT}/gid_attrs/ndevs/3", (VICTIM, 1, "gid_attrs/ndevs/3", "EIO")),
        (f"class/net/{VICTIM_NETDEV}/mtu", (VICTIM, 1, f"net/{VICTIM_NETDEV}/mtu", "EIO")),
    ):
        overlay = dict(two_nics.errno_overlay)
        reader = HostReader(SimSysfsRoot(two_nics.root, hold_fds=True, errno_overlay=overlay))
        assert content(reader.read()) == content(healthy)
        overlay[rel] = errno.EIO
        faulty = [reader.read() for _ in range(3)]
        assert [error_rows(s) for s in faulty] == [[error]] * 3, rel
        assert content(faulty[2]) == content(faulty[0]), rel
        if "/gids/" in rel or "/gid_attrs/" in rel:  # unknown is not empty: the entry read before is kept
            assert content(faulty[0]) == content(healthy), rel
        else:
            assert content(faulty[0]) != content(healthy), rel
        del overlay[rel]
        mended = reader.read()
        assert (content(mended), mended.errors) == (content(healthy), ()), rel


def test_netdev_that_vanishes_and_returns_under_a_steady_rdma_device(sim_host: SimHost) -> None:
    """IPoIB or a renamed netdev: the RDMA device keeps its registration, the netdev does not."""
    reader = held_reader(sim_host)
    before = poll(reader, sim_host)
    link = sim_host.root / "class/net/ens1f0np0"
    target = os.readlink(link)
    link.unlink()
    gone = poll(reader, sim_host)
    assert "ens1f0np0" not in gone.netdevs and "ens2f0np0" in gone.netdevs
    port = gone.port("mlx5_0", 1)
    assert port is not None and port.netdevs == ("ens1f0np0",)  # the GID table still names it
    link.symlink_to(target)
    back = poll(reader, sim_host)
    assert back.netdevs["ens1f0np0"] == before.netdevs["ens1f0np0"]
    assert content(back) == content(before) and back.errors == ()


@pytest.mark.parametrize("sim_host", [{"gid_table_size": 32}], indirect=True)
def test_a_steady_poll_reads_each_reported_value_once_plus_a_sweep_slice(sim_host: SimHost) -> None:
    reader = held_reader(sim_host)
    poll(reader, sim_host)
    reads = reader.root.reads
    snap = poll(reader, sim_host)
    per_poll = reader.root.reads - reads
    values = sum(1 + len(d.hw_counters) for d in snap.devices)  # node_desc
    values += sum(4 + len(p.counters) + len(p.hw_counters) + 3 * len(p.gids) for p in snap.ports)
    values += 9 * len(snap.netdevs) + sum(6 + len(link.aer_errors) for link in snap.pcie.values())
    sweep = sum(min(GID_SWEEP_SLOTS, p.gid_table_size - len(p.gids)) for p in snap.ports)
    assert per_poll == values + sweep
    assert whole_gid_reads(reader) == len(snap.ports)  # only the first poll read whole tables


def test_recreated_netdev_is_read_through_new_descriptors(sim_host: SimHost) -> None:
    """A netdev deleted and created again under the same name (driver reload, `ip link add`) is a
    new kernfs node: descriptors held on the old one must go, even when a GID re-read comes too."""
    netdir = sim_host.root / "class/net/ens1f0np0"
    for full in (True, False):
        reader = held_reader(sim_host)
        poll(reader, sim_host)
        # New files behind the same names, as a re-created kernfs node has; the old ones stay
        # readable through the descriptors held on them, as on a plain file system.
        for name, value in (("mtu", "4200"), ("ifindex", "77")):
            (netdir / f"{name}.new").write_text(f"{value}\n")
            os.replace(netdir / f"{name}.new", netdir / name)
        snap = poll(reader, sim_host, full_gid_tables=full)
        netdev = snap.netdevs["ens1f0np0"]
        assert (netdev.mtu, netdev.ifindex) == (4200, 77), f"full GID read: {full}"


def test_held_reads_of_long_and_malformed_values(sim_host: SimHost) -> None:
    """A value longer than the first read asks for is read whole; a malformed one costs itself only."""
    reader = held_reader(sim_host)
    poll(reader, sim_host)
    long_desc = "gpu-node-01 " + "x" * 300
    (sim_host.root / "class/infiniband/mlx5_0/node_desc").write_text(long_desc + "\n")
    sim_host.corrupt("mlx5_1", "ports/1/counters/symbol_error", "N/A (no PMA)\n")
    snap = poll(reader, sim_host)
    dev, port = snap.device("mlx5_0"), snap.port("mlx5_1", 1)
    assert dev is not None and dev.node_desc == long_desc
    assert port is not None and "symbol_error" not in port.counters and "link_downed" in port.counters
    # It was readable on the first poll: its PMA stopped answering, a failure (not "unsupported").
    assert error_rows(snap) == [("mlx5_1", 1, "counters/symbol_error", "no_pma: N/A (no PMA)")]


def test_held_descriptor_that_fails_is_dropped_and_reopened(sim_host: SimHost) -> None:
    """A read that fails through a held descriptor closes it; the next poll opens the path again,
    so the attribute comes back as soon as it reads again (and nothing leaks meanwhile)."""
    rel = "class/infiniband/mlx5_1/ports/1/counters/symbol_error"
    path = sim_host.root / rel
    saved = path.read_bytes()
    path.unlink()
    path.mkdir()  # open() succeeds on a directory, the read fails with EISDIR
    try:
        reader = held_reader(sim_host)
        for _ in range(2):
            snap = poll(reader, sim_host)
            assert error_rows(snap) == [("mlx5_1", 1, "counters/symbol_error", "EISDIR")]
            assert not reader.root.holds(rel)
        held = reader.root.held_fds
    finally:
        path.rmdir()
        path.write_bytes(saved)
    back = poll(reader, sim_host)
    port = back.port("mlx5_1", 1)
    assert back.errors == () and port is not None and "symbol_error" in port.counters
    assert reader.root.held_fds == held + 1


def test_held_descriptors_fit_under_a_service_file_limit(tmp_path: Path) -> None:
    """systemd starts services with a soft limit of 1024 open files; a 4-RNIC host already holds
    more than that, so the reader lifts the soft limit (to the hard one) instead of failing reads."""
    SimHost.build(tmp_path / "sys", roce=4, gid_table_size=255)
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        "from rnic_exporter.sources.reader import HostReader\n"
        "from rnic_exporter.sources.sysfs import SysfsRoot\n"
        f"reader = HostReader(SysfsRoot({str(tmp_path / 'sys')!r}, hold_fds=True))\n"
        "snaps = [reader.read() for _ in range(2)]\n"
        "print(len(snaps[1].errors), reader.root.held_fds)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    errors, held = int(out[0]), int(out[1])
    assert errors == 0 and held > 1024


def test_a_named_device_gets_whole_gid_tables_read_and_no_other(sim_host: SimHost) -> None:
    """Netlink names the netdev, so only its RDMA device's tables are read whole; a new GID in a so
    far empty slot of that device is seen at once, without waiting for the sweep."""
    reader = held_reader(sim_host)
    poll(reader, sim_host)
    first = whole_gid_reads(reader)
    sim_host.add_address("mlx5_0", "10.0.9.9")  # lands in empty slots 4 and 5
    port = poll(reader, sim_host, full_gid_tables=frozenset({"mlx5_0"})).port("mlx5_0", 1)
    assert whole_gid_reads(reader) == first + 1
    assert port is not None and {g.ipv4 for g in port.gids} >= {"10.0.0.1", "10.0.9.9"}
    poll(reader, sim_host, full_gid_tables=frozenset({"absent_9"}))
    assert whole_gid_reads(reader) == first + 1
