"""What the device readers of one host share with the host reader: the tree, the clock, the
settings, the safety interval and the periods of what nothing announces.

A small object handed to each `DeviceReader` instead of the `HostReader` itself: a device reader
sees only these, and the host reader owns them (`HostReader.settings`, `.safety_s` forward here).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from rnic_exporter.model.host import Snapshot
from rnic_exporter.model.nccl import NcclSettings
from rnic_exporter.sources.counter_filter import CounterFilter
from rnic_exporter.sources.counter_netlink import HwNetlink
from rnic_exporter.sources.counters import SLOW_PMA_S
from rnic_exporter.sources.sysfs import SysfsRoot

# While events are trusted: each device's whole state is re-read every safety sweep (SAFETY_S
# unless set).
SAFETY_S = 60.0
# What nothing announces, polled at the period of its failure class's budget (sources/watch_tiers.py):
# a PCIe link's speed, width and AER counts (<= 30 s), an InfiniBand GID table (<= 60 s).
PCIE_S = 30.0
IB_GIDS_S = 60.0


@dataclass(frozen=True, slots=True)
class ReaderSettings:
    device_include: re.Pattern[str] | None = None  # --collector.infiniband.device-include
    device_exclude: re.Pattern[str] | None = None  # --collector.infiniband.device-exclude
    nccl: NcclSettings = field(default_factory=NcclSettings)
    counters: CounterFilter = field(default_factory=CounterFilter)  # --collector.hw_counters.*
    rdma_netlink: bool = True  # --collector.rdma-netlink: hw counters by STAT_GET where it answers
    pma_slow_s: float = SLOW_PMA_S  # --collector.pma.slow-interval: PMA counters no rate needs per scrape

    @property
    def filter_text(self) -> str:
        parts = [
            f"{flag} {pattern.pattern!r}"
            for flag, pattern in (
                ("--collector.infiniband.device-include", self.device_include),
                ("--collector.infiniband.device-exclude", self.device_exclude),
            )
            if pattern is not None
        ]
        return " and ".join(parts) or "no device filter"

    def excludes_all(self, snap: Snapshot, sysfs: object) -> str | None:
        """Why nothing is read though RDMA devices are there: the filter leaves out every one (the
        config of another fleet: `^mlx5_` on a Broadcom node). None when that is not the case."""
        if snap.devices or snap.listed_unread or not snap.filtered_out:
            return None
        names = snap.filtered_out
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        return (
            f"the device filter ({self.filter_text}) matches none of the {len(names)} RDMA device(s) under "
            f"{sysfs}/class/infiniband ({shown}): nothing on this host is monitored or checked"
        )

    def wants(self, device: str) -> bool:
        if self.device_include is not None and not self.device_include.search(device):
            return False
        return not (self.device_exclude is not None and self.device_exclude.search(device))


@dataclass(slots=True)
class ReadContext:
    """Shared by every device reader of one `HostReader`; read by them, set by it."""

    root: SysfsRoot
    clock: Callable[[], float]  # counter back-off's and the safety sweep's time
    settings: ReaderSettings
    safety_s: float = SAFETY_S  # --poll.safety-interval: what events announce is re-read this often
    netlink: HwNetlink | None = None  # RDMA netlink for hw counters (None: sysfs only)
    pcie_s: float = PCIE_S  # --poll.pcie-interval
    ib_gids_s: float = IB_GIDS_S  # --poll.gid-interval
