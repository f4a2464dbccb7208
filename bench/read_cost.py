"""Modelled firmware commands per scrape: rnic-exporter today, rnic-exporter with RDMA netlink, and
node_exporter's infiniband collector, on the same simulated mlx5 trees.

    .venv/bin/python bench/read_cost.py

Nothing is timed: the figures are counts from the kernel's rules (rnic_exporter/sources/read_cost.py,
rnic-linux-facts.md §7) applied to what each reads per scrape:
- rnic-exporter before (every file every scrape): the reader's own counter plan
  (`HostReader.counter_plans()`), every PMA and hw_counters file of every port, per scrape (port
  state, rate and the rest are read by the state pass, not per scrape);
- rnic-exporter with netlink: the same plan with each port's hw_counters files replaced by one
  `RDMA_NLDEV_CMD_STAT_GET` (`read_cost.with_netlink`);
- rnic-exporter after (as built): the reader itself, its RDMA netlink answered from the tree (as a
  kernel that answers STAT_GET for every port would), scraped every 15 s for a minute on a stepped
  clock; what its counter passes read (`HostReader.read_costs()`: PMA files, hw_counters files,
  STAT_GETs), per scrape, amortised over the PMA timer;
- node_exporter (prometheus/procfs `sysfs/class_infiniband.go`, `parseInfiniBandPort`): per port
  `state`, `phys_state`, `rate`, then every file of `counters/` (not for irdma*/nvs_* devices) and
  every file of `hw_counters/` (only for mlx5_* and irdma* devices; `lifespan` is read too but asks
  no driver).
Each is modelled twice for hw_counters: mlx5 with optional counters (5.16+: every file read is a
refresh) and without (one refresh per port per quick pass).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rnic_exporter.sim.host import SimHost
from rnic_exporter.sources.counter_netlink import HwNetlink
from rnic_exporter.sources.nldev import PortCounters, Unavailable
from rnic_exporter.sources.read_cost import (
    CommandCount,
    PortReads,
    firmware_commands,
    refresh_commands,
    with_netlink,
)
from rnic_exporter.sources.reader import HostReader, run_here
from rnic_exporter.sources.sysfs import SysfsRoot

PORT_ATTRIBUTES = ("state", "phys_state", "rate")
# The PMA counters rates are drawn from (dashboards' throughput and congestion panels, per scrape);
# the rest (error counters, feeding 5-minute rates, and unicast/multicast) could be read on a timer.
PMA_PER_SCRAPE = frozenset(
    {"port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets", "port_xmit_wait"}
)
SCRAPE_S, PMA_TIMER_S = 15.0, 60.0
HOSTS = (("8-port mlx5 RoCE", 8, 0), ("16-RNIC all InfiniBand", 0, 16), ("16-RNIC mixed", 8, 8))


def _files(path: Path) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(path) if e.is_file())
    except FileNotFoundError:
        return []


def ours(root: Path, optional_counters: bool, pma_split: str = "all") -> list[PortReads]:
    """The reader's counter plan: what one scrape reads, per port. pma_split "per_scrape" or
    "timer": only the PMA files of PMA_PER_SCRAPE, or only the others."""
    reader = HostReader(SysfsRoot(root))
    try:
        reader.read()
        plans = reader.counter_plans()
    finally:
        reader.close()
    out = []
    for device, plan in plans:
        if plan is None:
            continue
        by_port: dict[int | None, dict[str, list[str]]] = {}
        for group in plan.groups:
            by_port.setdefault(group.port, {}).setdefault(group.kind, []).extend(group.names)
        for port, kinds in by_port.items():
            hw = kinds.get("hw", [])
            pma = kinds.get("counters", [])
            if pma_split == "per_scrape":
                pma = [n for n in pma if n in PMA_PER_SCRAPE]
            elif pma_split == "timer":
                pma = [n for n in pma if n not in PMA_PER_SCRAPE]
            out.append(
                PortReads(
                    device,
                    port,
                    pma_files=len(pma),
                    hw_files=len(hw),
                    refresh=refresh_commands(hw),
                    optional_counters=optional_counters,
                )
            )
    return out


class TreeNetlink(HwNetlink):
    """RDMA netlink as a kernel that answers STAT_GET for every port would: the tree's values."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.names = sorted(os.listdir(root / "class" / "infiniband"))

    def index_of(self, device: str) -> int | Unavailable:
        return self.names.index(device)

    def port_counters(self, index: int, port: int) -> PortCounters | Unavailable:
        device = self.names[index]
        hw = self.root / "class" / "infiniband" / device / "ports" / str(port) / "hw_counters"
        values = {n: int((hw / n).read_text()) for n in _files(hw) if n != "lifespan"}
        return PortCounters(index, device, port, values)

    def close(self) -> None:
        return None


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def as_built(root: Path, optional_counters: bool) -> list[PortReads]:
    """What the reader's counter passes read per 15 s scrape, amortised over one PMA timer period."""
    clock = Clock()
    reader = HostReader(SysfsRoot(root), clock=clock, netlink=TreeNetlink(root))
    try:
        reader.state_pass()
        costs = {name: reads for name, _path, reads in reader.read_costs()}
        scrapes = int(PMA_TIMER_S / SCRAPE_S)
        for _ in range(scrapes):
            run_here(reader.counter_jobs())
            clock.now += SCRAPE_S
        after = {name: (path, reads) for name, path, reads in reader.read_costs()}
        plans = dict(reader.counter_plans())
    finally:
        reader.close()
    out = []
    for device, (path, reads) in after.items():
        plan = plans[device]
        assert plan is not None and path is not None, device
        hw = [n for g in plan.groups if g.kind == "hw" for n in g.names]

        def per_scrape(kind: str, device: str = device, reads: dict[str, int] = reads) -> int:
            return round((reads.get(kind, 0) - costs[device].get(kind, 0)) / scrapes)

        out.append(
            PortReads(
                device,
                1,
                pma_files=per_scrape("pma_file"),
                hw_files=per_scrape("hw_counters_file"),
                netlink_stats=per_scrape("netlink_stat"),
                refresh=refresh_commands(hw),
                optional_counters=optional_counters,
            )
        )
    return out


def node_exporter(root: Path, optional_counters: bool) -> list[PortReads]:
    """procfs's parseInfiniBandPort over the same tree."""
    out = []
    ib = root / "class" / "infiniband"
    for device in sorted(os.listdir(ib)):
        for port in sorted(os.listdir(ib / device / "ports"), key=int):
            base = ib / device / "ports" / port
            pma = [] if device.startswith(("irdma", "nvs_")) else _files(base / "counters")
            hw = _files(base / "hw_counters") if device.startswith(("irdma", "mlx5_")) else []
            hw = [n for n in hw if n != "lifespan"]
            out.append(
                PortReads(
                    device,
                    int(port),
                    pma_files=len(pma),
                    hw_files=len(hw),
                    port_attributes=len(PORT_ATTRIBUTES),
                    refresh=refresh_commands(hw),
                    optional_counters=optional_counters,
                )
            )
    return out


def _ports(plan: Iterable[PortReads]) -> int:
    return len({(p.device, p.port) for p in plan if p.port is not None})


def line(what: str, count: CommandCount, ports: int) -> str:
    kinds = ", ".join(f"{k} {n}" for k, n in count.by_kind.items() if n)
    reads = sum(count.reads.values())
    return f"  {what:<28} {count.commands:>5} commands ({count.per_port(ports):5.1f}/port; {kinds}); {reads} reads"


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="read-cost-") as tmp:
        for title, roce, infiniband in HOSTS:
            root = Path(tmp) / title.replace(" ", "_")
            SimHost.build(root, roce=roce, infiniband=infiniband, gid_table_size=16)
            for optional in (True, False):
                mode = "mlx5 with optional counters (5.16+)" if optional else "lifespan cache holds"
                today = ours(root, optional)
                ne = node_exporter(root, optional)
                ports = _ports(today)
                us, nl, node = firmware_commands(today), firmware_commands(with_netlink(today)), firmware_commands(ne)
                print(f"{title}, {ports} ports, {mode}:")
                print(line("rnic-exporter before", us, ports))
                print(line("rnic-exporter with netlink", nl, ports))
                print(line("node_exporter infiniband", node, ports))
                ratio_us = us.commands / node.commands if node.commands else 0
                ratio_nl = nl.commands / node.commands if node.commands else 0
                print(f"  vs node_exporter: before {ratio_us:.2f}x, with netlink {ratio_nl:.2f}x")
                fast = firmware_commands(with_netlink(ours(root, optional, "per_scrape"))).commands
                slow = firmware_commands(ours(root, optional, "timer")).by_kind["pma_file"] * SCRAPE_S / PMA_TIMER_S
                split = fast + slow
                print(
                    f"  with netlink and PMA errors on a {PMA_TIMER_S:.0f} s timer ({SCRAPE_S:.0f} s scrapes): "
                    f"{fast} per scrape + {slow:.0f} amortised = {split:.0f} commands, "
                    f"{split / node.commands:.2f}x node_exporter"
                )
                built = firmware_commands(as_built(root, optional))
                print(line("rnic-exporter as built", built, ports))
                print(f"  as built vs node_exporter: {built.commands / node.commands:.2f}x (before {ratio_us:.2f}x)")


if __name__ == "__main__":
    main()
