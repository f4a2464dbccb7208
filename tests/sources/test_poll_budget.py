"""Each attribute nothing announces is read at the slowest rate that meets its failure class's
budget (docs/detection.md#detection-latency-budget), counted by path on a simulated host over a
minute of 5 s passes on a fake clock: an InfiniBand port's state and rate every pass, a PCIe
link's speed, width and AER counts every 30 s, an InfiniBand GID table every 60 s; and a host
that is all RoCE has nothing due between its 30 s reads (`HostReader.next_due`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable

import pytest

from rnic_exporter.sim import SimHost
from rnic_exporter.sim.sysfs_root import SimFdCache, SimSysfsRoot
from rnic_exporter.sources.reader import IB_GIDS_S, PCIE_S, HostReader
from rnic_exporter.sources.sysfs import FdCache, Raw, ReadBatch

PCIE_FILES = ("current_link_speed", "current_link_width", "aer_dev_correctable", "aer_dev_fatal", "aer_dev_nonfatal")
PORT_FILES = ("state", "phys_state", "rate")


def attribute_class(rel: str) -> str:
    parts = rel.split("/")
    if parts[-1] in PCIE_FILES:
        return "pcie"
    if "gids" in parts or "gid_attrs" in parts:
        return "gids"
    if parts[-1] in PORT_FILES and "ports" in parts:
        return "port"
    return "other"


class CountingCache(SimFdCache):
    """Every read of a held descriptor goes through `read_batch` (`read_many` too)."""

    __slots__ = ()

    def read_batch(self, batch: ReadBatch, skip: Collection[int] = ()) -> list[Raw]:
        root = self.root
        assert isinstance(root, CountingRoot)
        root.count(rel for i, rel in enumerate(batch.rels) if i not in skip)
        return super().read_batch(batch, skip)


class CountingRoot(SimSysfsRoot):
    """Counts the reads of each attribute class."""

    def __init__(self, sim: SimHost) -> None:
        super().__init__(sim.root, hold_fds=True, errno_overlay=sim.errno_overlay)
        self.by_class: Counter[str] = Counter()

    def count(self, rels: Iterable[str]) -> None:
        self.by_class.update(attribute_class(rel) for rel in rels)

    def cache(self) -> FdCache:
        cache = CountingCache(self)
        self._register(cache)
        return cache


def a_minute(sim_host: SimHost, interval: float = 5.0) -> tuple[dict[float, Counter[str]], HostReader, list[float]]:
    """A reader's first pass at t = 0 (everything, trusting nothing), then a minute of passes
    every `interval` trusting events: what each of them read, by attribute class."""
    now = [0.0]
    root = CountingRoot(sim_host)
    reader = HostReader(root, clock=lambda: now[0])
    reader.safety_s = 3600.0  # the safety sweep (everything, staggered) is counted elsewhere
    reader.state_pass(full_gid_tables=True)
    passes: dict[float, Counter[str]] = {}
    for _ in range(int(60 / interval)):
        now[0] += interval
        root.by_class.clear()
        reader.state_pass(trust_events=True)
        passes[now[0]] = root.by_class.copy()
    return passes, reader, now


def at(passes: dict[float, Counter[str]], kind: str) -> dict[float, int]:
    return {t: n[kind] for t, n in passes.items() if n[kind]}


def test_reads_per_minute_by_attribute_class(sim_host: SimHost) -> None:
    passes, reader, _ = a_minute(sim_host)
    table = reader._devices["mlx5_2"].gids[1]
    # The InfiniBand port's state, phys_state and rate every pass; the PCIe links (each RNIC's
    # speed, width and AER counts) at 30 and 60 s; the GID table, its populated slots' 3 files
    # and every empty slot, at 60 s.
    assert at(passes, "port") == {5.0 * k: 3 for k in range(1, 13)}
    pcie = at(passes, "pcie")
    assert sorted(pcie) == [PCIE_S, 2 * PCIE_S] and pcie[PCIE_S] == pcie[2 * PCIE_S] >= 3 * 2
    assert at(passes, "gids") == {IB_GIDS_S: 3 * len(table.watched) + len(table.empty)}
    assert at(passes, "other") == {}  # a RoCE port's netdev, state, rate and GIDs are rtnetlink's


@pytest.mark.parametrize("sim_host", [{"roce": 3, "infiniband": 0}], indirect=True)
def test_an_all_roce_host_has_nothing_due_between_its_pcie_reads(sim_host: SimHost) -> None:
    passes, reader, now = a_minute(sim_host, interval=PCIE_S)
    assert sorted(at(passes, "pcie")) == [PCIE_S, 2 * PCIE_S]
    assert at(passes, "port") == at(passes, "gids") == at(passes, "other") == {}
    due = reader.next_due()
    assert due is not None and due == now[0] + PCIE_S  # the daemon sleeps until then


def test_a_host_with_infiniband_ports_is_read_every_pass(sim_host: SimHost) -> None:
    _, reader, _ = a_minute(sim_host)
    assert reader.next_due() is None  # at the poll interval
    assert IB_GIDS_S == 2 * PCIE_S == 60.0


@pytest.mark.parametrize("sim_host", [{"roce": 16, "infiniband": 0}], indirect=True)
@pytest.mark.parametrize("late", [0.0, 0.005, 0.3])
def test_an_all_roce_host_wakes_twice_a_minute_safety_sweeps_included(sim_host: SimHost, late: float) -> None:
    """Woken only at `next_due` (as daemon/schedule.py does), 16 RoCE RNICs, whose safety sweeps
    are staggered, cost two wake-ups a minute: each sweep rides along with a PCIe read. A real
    wake-up comes a little `late`: each device is still swept once a minute, not at every PCIe
    read (with the wake-up 5 ms late, every device was swept twice a minute)."""
    now = [0.0]
    reader = HostReader(CountingRoot(sim_host), clock=lambda: now[0])
    reader.state_pass(full_gid_tables=True)
    reader.state_pass(trust_events=True)
    wakes = 0
    sweeps: Counter[str] = Counter()
    while now[0] < 600.0:
        due = reader.next_due()
        assert due is not None and due > now[0]
        now[0] = due + late
        wakes += 1
        before = {r.name: r._sweep_due for r in reader._order}
        reader.state_pass(trust_events=True)
        sweeps.update(r.name for r in reader._order if r._sweep_due != before[r.name])
    assert wakes <= 2 * 10 + 1
    # Every device swept about once a minute (early, with a PCIe read, or with the read at its due time).
    assert len(sweeps) == 16 and min(sweeps.values()) >= 9 and max(sweeps.values()) <= 11, sweeps


def test_between_its_due_reads_a_pass_still_sees_the_port_state_and_the_pcie_link_when_due(sim_host: SimHost) -> None:
    """The fast pass of a settled device reads only its port tier until another read is due
    (`DeviceReader._quick_pass`): a port going down is seen by the very next pass, and a
    downtrained PCIe link at its tier's due time, not later."""
    now = [0.0]
    reader = HostReader(CountingRoot(sim_host), clock=lambda: now[0])
    reader.safety_s = 3600.0
    reader.state_pass(full_gid_tables=True)
    reader.state_pass(trust_events=True)

    def port_state() -> str | None:
        device = reader.state_pass(trust_events=True).snapshot.device("mlx5_2")
        assert device is not None
        return None if device.ports[0].state is None else device.ports[0].state.name

    now[0] = 5.0
    assert port_state() == "ACTIVE"
    sim_host.set_port_up("mlx5_2", False)
    now[0] = 10.0
    assert port_state() == "DOWN"
    sim_host.set_port_up("mlx5_2", True)
    now[0] = 15.0
    assert port_state() == "ACTIVE"

    def pcie_width() -> int | None:
        snap = reader.state_pass(trust_events=True).snapshot
        device = snap.device("mlx5_0")
        assert device is not None and device.pci_address is not None
        return snap.pcie[device.pci_address].current_width

    sim_host.set_pcie("mlx5_0", 8.0, 4)
    for t in (20.0, 25.0):  # the PCIe tier was read at 0 s: not due yet, not read
        now[0] = t
        assert pcie_width() != 4
    now[0] = PCIE_S
    assert pcie_width() == 4
