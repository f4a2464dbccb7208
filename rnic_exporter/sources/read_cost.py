"""What a read plan costs a real NIC in firmware commands: the kernel's rules, as a pure model.

Nothing here reads anything: it counts. The rules are the kernel's (rnic-linux-facts.md §7, read in
mainline `drivers/infiniband/core/sysfs.c`, `nldev.c` and mlx5's `mad.c`/`counters.c`), for mlx5,
the driver whose counters are firmware commands; other drivers count as unmodelled (rxe's counters
are atomics in memory; irdma, bnxt_re and efa have rules of their own nobody here has read):

- a `counters/*` (PMA) file read runs one MAD through `process_mad`: **1 command, never cached**;
- a `hw_counters/*` file read refreshes the port's whole set unless the last refresh is younger
  than `lifespan` (10 ms); a refresh is QUERY_Q_COUNTER, plus QUERY_CONG_STATISTICS where the
  congestion counters exist (`cc_query_allowed`), plus a PPCNT read where `rx_icrc_encapsulated`
  exists: **1 to 3 commands**. mlx5 with optional counters (5.16+) answers any index but 0 with a
  partial count, so the cache is never re-stamped: **every file read is a refresh**. Without them,
  one quick pass over a port's files is one refresh;
- one `RDMA_NLDEV_CMD_STAT_GET` (device, port, no resource) asks the driver once for index 0:
  **one refresh** for the whole port (plus one QUERY_Q_COUNTER per counter bound with `rdma
  statistic`, none by default);
- a port attribute (`state`, `phys_state`, `rate`) is one `ib_query_port`: counted as 1 command
  (a lower bound: mlx5 RoCE's query_port asks the vport context and PTYS).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

ReadKind = Literal["pma_file", "hw_counters_file", "netlink_stat", "port_attribute"]
READ_KINDS: tuple[ReadKind, ...] = ("pma_file", "hw_counters_file", "netlink_stat", "port_attribute")

# hw_counters names whose presence means the refresh also runs QUERY_CONG_STATISTICS (mlx5 counters.c).
CONGESTION_COUNTERS = frozenset({"rp_cnp_ignored", "rp_cnp_handled", "np_ecn_marked_roce_packets", "np_cnp_sent"})
PPCNT_COUNTERS = frozenset({"rx_icrc_encapsulated"})
MODELLED_DRIVERS = frozenset({"mlx5"})


def refresh_commands(hw_names: Iterable[str]) -> int:
    """Firmware commands of one mlx5 hw-stats refresh of a port with these counters (1 to 3)."""
    names = frozenset(hw_names)
    return 1 + bool(names & CONGESTION_COUNTERS) + bool(names & PPCNT_COUNTERS)


def driver_of(device: str) -> str:
    """The driver by the kernel's default device name (mlx5_0, mlx5_bond_0 -> mlx5); a renamed device
    is unmodelled (the reader knows the real driver; this model only needs the common case)."""
    return "mlx5" if device.startswith("mlx5_") else device.rstrip("0123456789_") or device


@dataclass(frozen=True, slots=True)
class PortReads:
    """What one scrape reads of one port (port None: a device-wide `hw_counters/`)."""

    device: str
    port: int | None
    pma_files: int = 0
    hw_files: int = 0  # hw_counters/ files whose read asks the driver (`lifespan` does not)
    netlink_stats: int = 0  # STAT_GET requests
    port_attributes: int = 0
    refresh: int = 1  # commands of one hw-stats refresh here: `refresh_commands(names)`
    optional_counters: bool = True  # mlx5 5.16+ with optional counters: every hw file read refreshes

    @property
    def driver(self) -> str:
        return driver_of(self.device)


@dataclass(frozen=True, slots=True)
class CommandCount:
    """Modelled firmware commands of one scrape: in all, by read kind, and the reads behind them."""

    commands: int
    by_kind: Mapping[ReadKind, int]
    reads: Mapping[ReadKind, int]
    unmodelled_reads: int  # reads of drivers without rules here (counted as 0 commands)

    def per_port(self, ports: int) -> float:
        return self.commands / ports if ports else 0.0


def commands_of(port: PortReads) -> dict[ReadKind, int]:
    """The firmware commands of one port's reads, by kind (all 0 for an unmodelled driver)."""
    if port.driver not in MODELLED_DRIVERS:
        return dict.fromkeys(READ_KINDS, 0)
    if port.hw_files == 0:
        hw = 0
    elif port.optional_counters:
        hw = port.hw_files * port.refresh
    else:
        hw = port.refresh  # one quick pass: one refresh, the other files from the cache
    return {
        "pma_file": port.pma_files,
        "hw_counters_file": hw,
        "netlink_stat": port.netlink_stats * port.refresh,
        "port_attribute": port.port_attributes,
    }


def firmware_commands(plan: Iterable[PortReads]) -> CommandCount:
    """The modelled firmware commands of one scrape that reads `plan`."""
    by_kind: Counter[ReadKind] = Counter()
    reads: Counter[ReadKind] = Counter()
    unmodelled = 0
    for port in plan:
        counts = {
            "pma_file": port.pma_files,
            "hw_counters_file": port.hw_files,
            "netlink_stat": port.netlink_stats,
            "port_attribute": port.port_attributes,
        }
        for kind in READ_KINDS:
            reads[kind] += counts[kind]
        if port.driver not in MODELLED_DRIVERS:
            unmodelled += sum(counts.values())
            continue
        for kind, n in commands_of(port).items():
            by_kind[kind] += n
    return CommandCount(
        commands=sum(by_kind.values()),
        by_kind=MappingProxyType({k: by_kind[k] for k in READ_KINDS}),
        reads=MappingProxyType({k: reads[k] for k in READ_KINDS}),
        unmodelled_reads=unmodelled,
    )


def with_netlink(plan: Iterable[PortReads]) -> list[PortReads]:
    """The same plan with each port's hw_counters files replaced by one STAT_GET (a device-wide
    hw_counters/ has no netlink request and stays as it is); PMA files and attributes unchanged."""
    out = []
    for port in plan:
        if port.port is None or port.hw_files == 0:
            out.append(port)
            continue
        out.append(
            PortReads(
                port.device,
                port.port,
                pma_files=port.pma_files,
                hw_files=0,
                netlink_stats=1,
                port_attributes=port.port_attributes,
                refresh=port.refresh,
                optional_counters=port.optional_counters,
            )
        )
    return out


__all__ = [
    "CONGESTION_COUNTERS",
    "READ_KINDS",
    "CommandCount",
    "PortReads",
    "ReadKind",
    "commands_of",
    "driver_of",
    "firmware_commands",
    "refresh_commands",
    "with_netlink",
]
