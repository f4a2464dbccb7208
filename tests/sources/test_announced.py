"""What each poll reads, by what announces a change of it (sources/reader.py, issue 25).

Trusting events, a poll reads only what nothing announces on Linux, each at the period of its
budget (an InfiniBand port's state and rate every pass, the PCIe link's current speed, width and
AER counts every 30 s, an InfiniBand GID table every 60 s); what rtnetlink announces (a RoCE
port's netdev, and its state, rate and GIDs derived from it) waits for the announcement or the
safety sweep. Not trusting them (netlink off or failing), every poll reads everything, and the
exposition says so per device.
"""

from __future__ import annotations

from pathlib import Path

from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.catalog.metrics import MetricSpec
from rnic_exporter.sim import SimHost
from rnic_exporter.sinks.samples import ExporterStats, freshness_part
from rnic_exporter.sources.reader import IB_GIDS_S, PCIE_S, HostReader
from tests.support.sim import GidTableCounter, refresh_overlay, whole_gid_reads

NEW_PREFIX_GID = "fec0:0000:0000:0000:0c42:a103:0002:c7a9"


def trusting_reader(sim_host: SimHost) -> tuple[HostReader, list[float]]:
    now = [0.0]
    root = GidTableCounter(sim_host.root, hold_fds=True, errno_overlay=sim_host.errno_overlay)
    reader = HostReader(root, clock=lambda: now[0])
    reader.state_pass(full_gid_tables=True)
    reader.state_pass(trust_events=True)
    return reader, now


def test_an_infiniband_gid_change_is_seen_within_the_gid_period(sim_host: SimHost) -> None:
    """Its budget is 60 s (NCCL addresses InfiniBand peers by LID): not read by a 5 s pass."""
    reader, now = trusting_reader(sim_host)
    sim_host.corrupt("mlx5_2", "ports/1/gids/0", NEW_PREFIX_GID)  # the SM moved the subnet prefix
    now[0] += 5.0
    port = reader.state_pass(trust_events=True).snapshot.port("mlx5_2", 1)
    assert port is not None and port.gids[0].gid != NEW_PREFIX_GID
    now[0] = IB_GIDS_S
    port = reader.state_pass(trust_events=True).snapshot.port("mlx5_2", 1)
    assert port is not None and port.gids[0].gid == NEW_PREFIX_GID


def test_an_infiniband_gid_in_an_empty_slot_is_seen_within_the_gid_period(sim_host: SimHost) -> None:
    """Every empty slot is swept once a period: the sweep finds the slot filled and reads the table
    whole (whether the new entry is kept is the table reader's business: here its type file still
    answers as an empty slot's)."""
    reader, now = trusting_reader(sim_host)
    table = reader._devices["mlx5_2"].gids[1]
    sim_host.corrupt("mlx5_2", f"ports/1/gids/{table.size - 1}", NEW_PREFIX_GID)
    whole = whole_gid_reads(reader)
    now[0] += 5.0
    reader.state_pass(trust_events=True)
    assert whole_gid_reads(reader) == whole
    now[0] = IB_GIDS_S
    reader.state_pass(trust_events=True)
    assert whole_gid_reads(reader) == whole + 1


def test_a_pcie_downtrain_is_seen_within_the_pcie_period(sim_host: SimHost) -> None:
    reader, now = trusting_reader(sim_host)
    sim_host.set_pcie("mlx5_0", 16.0, 8)
    now[0] += 5.0
    snap = reader.state_pass(trust_events=True).snapshot
    device = snap.device("mlx5_0")
    assert device is not None and device.pci_address is not None
    assert snap.pcie[device.pci_address].current_width == 16  # not read by a 5 s pass
    now[0] = PCIE_S
    assert reader.state_pass(trust_events=True).snapshot.pcie[device.pci_address].current_width == 8


def test_an_infiniband_port_down_is_seen_by_the_next_poll(sim_host: SimHost) -> None:
    reader, now = trusting_reader(sim_host)
    sim_host.set_port_up("mlx5_2", False)
    now[0] += 5.0
    port = reader.state_pass(trust_events=True).snapshot.port("mlx5_2", 1)
    assert port is not None and port.state is not None and port.state.name == "DOWN"


def test_a_roce_netdev_change_waits_for_its_announcement_or_the_safety_sweep(sim_host: SimHost) -> None:
    reader, now = trusting_reader(sim_host)
    sim_host.set_speed("mlx5_0", 100)  # on a real host: carrier lost, renegotiated, carrier back
    first = reader.state_pass(trust_events=True).snapshot
    assert first.netdevs["ens1f0np0"].speed_mbps == 400_000  # nothing announced it yet
    announced = reader.state_pass(trust_events=True, full_gid_tables={"mlx5_0"}).snapshot
    assert announced.netdevs["ens1f0np0"].speed_mbps == 100_000
    sim_host.set_speed("mlx5_1", 100)  # never announced (an event lost)
    assert reader.state_pass(trust_events=True).snapshot.netdevs["ens2f0np0"].speed_mbps == 400_000
    now[0] += 2 * reader.safety_s  # past every device's (staggered) sweep
    assert reader.state_pass(trust_events=True).snapshot.netdevs["ens2f0np0"].speed_mbps == 100_000


def test_the_fallback_is_in_the_exposition_per_device(sim_host: SimHost, tmp_path: Path) -> None:
    reader, _ = trusting_reader(sim_host)
    reader.state_pass(trust_events={"mlx5_0", "mlx5_2"})  # mlx5_1: a netdev netlink does not know
    added: dict[tuple[str, tuple[str, ...]], float] = {}

    class Collect:
        def add(self, spec: MetricSpec, labels: tuple[str, ...], value: float) -> None:
            added[(spec.name, labels)] = value

    freshness_part(Collect(), ExporterStats(devices=reader.freshness()))
    name = catalog.POLL_FALLBACK.name
    assert {labels[0]: v for (n, labels), v in added.items() if n == name} == {"mlx5_0": 0, "mlx5_1": 1, "mlx5_2": 0}


def test_a_device_removed_is_seen_by_the_next_poll_a_re_registration_by_its_announcement(sim_host: SimHost) -> None:
    """The device listing is read every poll; a registration's identity (a stat per device) is
    checked on an announcement, after a pass that changed something, and on the safety sweep."""
    reader, now = trusting_reader(sim_host)
    reader.state_pass(trust_events=True)
    sim_host.remove_device("mlx5_1")
    assert reader.state_pass(trust_events=True).snapshot.device("mlx5_1") is None
    sim_host.restore_device("mlx5_1")
    reader.state_pass(trust_events=True)  # names changed: every identity checked
    while reader.state_pass(trust_events=True).changed:  # the restored device settles
        pass
    registration = reader._devices["mlx5_0"]
    sim_host.remove_device("mlx5_0")  # unregistered and registered again between two polls
    sim_host.restore_device("mlx5_0")
    reader.state_pass(trust_events=True)
    reader.state_pass(trust_events=True)
    assert reader._devices["mlx5_0"] is registration  # the same names, nothing announced: not checked yet
    reader.state_pass(trust_events=True, full_gid_tables={"mlx5_0"})  # udev's or rtnetlink's announcement
    assert reader._devices["mlx5_0"] is not registration
    registration = reader._devices["mlx5_0"]
    reader.state_pass(trust_events=True)
    sim_host.remove_device("mlx5_0")
    sim_host.restore_device("mlx5_0")
    now[0] += reader.safety_s  # or the safety sweep
    reader.state_pass(trust_events=True)
    assert reader._devices["mlx5_0"] is not registration


def test_the_safety_sweep_re_reads_every_state_file_and_no_empty_gid_slot(sim_host: SimHost) -> None:
    """The sweep re-reads each device's whole state plan, which holds the files of every populated
    GID slot, so a slot that changed without an announcement is seen (here the IPv4 GID moved off
    its slot, as a re-add does while a job holds the old one). It reads no empty slot: on RoCE a GID
    is only ever added on an address or netdev event, which rtnetlink announces, and a slot freed
    later reads the same as before (a pending-delete entry reads as empty; docs/gid-index-moves.md)."""
    reader, now = trusting_reader(sim_host)
    old, new = sim_host.gid_shift("mlx5_1")  # nothing announces it
    refresh_overlay(reader.root, sim_host.errno_overlay)  # a copy: the kernel's EINVALs of empty slots now
    port = reader.state_pass(trust_events=True).snapshot.port("mlx5_1", 1)
    assert port is not None and port.nccl_gid_index == old != new
    now[0] += 2 * reader.safety_s  # past every device's (staggered) sweep
    port = reader.state_pass(trust_events=True).snapshot.port("mlx5_1", 1)
    assert port is not None and port.nccl_gid_index == new
    now[0] += 2 * reader.safety_s
    reads = reader.root.reads
    reader.state_pass(trust_events=True)  # a sweep that finds nothing new
    plans = [r.plan for r in reader._order]
    ib_empty = len(reader._devices["mlx5_2"].gids[1].empty)  # the InfiniBand GID table's, due every 60 s
    assert reader.root.reads - reads == sum(len(plan.rels) for plan in plans if plan is not None) + ib_empty
