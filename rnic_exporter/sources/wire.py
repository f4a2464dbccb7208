"""One reader for the wire below the RoCE netdevs, each source on its own interval.

What the daemon calls (a thread or timer of its own, never the scrape path):

    reader = WireReader(EthtoolNetlink(), WireSettings(module_interval=60.0))
    wire = reader.poll(["ens1f0np0", "ens2f0np0"])        # reads only what is due
    for spec, labels, value in wire_samples(netdevs, wire, reader.requests):   # sinks/wire_samples.py
        builder.add(spec, labels, value)

A source a netdev answered `Unsupported` for is not asked again while the netdev stays listed
(IPoIB, veth: one request per operation, once). Module identity and threshold pages are re-read
every `static_refresh` (a swapped module with the same identifier is seen within that), the
lower page (and CMIS lane page) at every module read: 1-2 requests per read instead of 3-5.

Expected cost per netdev with the defaults (rnic-linux-facts §7; a module request is one MCIA
register access on mlx5, FEC, pause and GSTATS one or more PPCNT each):
  module      1 request/min (SFF-8636) or 3/min (CMIS), plus 2-4 requests every 10 min
  FEC         1/min     pause   1/min     link state   1/min (no firmware access; a port-down
                                          event asks at once)
  GSTATS      1/min (mlx5: every stats group's update, ~8 PPCNT for the per-priority group alone)
"""

from __future__ import annotations

import errno
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from rnic_exporter.model.wire import (
    DriverPauseStats,
    Gone,
    LinkState,
    NetdevWire,
    Outcome,
    ReadFailure,
    Unsupported,
)
from rnic_exporter.sources import pyroute2_parts
from rnic_exporter.sources.ethtool_netlink import EthtoolNetlink
from rnic_exporter.sources.optics.memory import ModuleMemory
from rnic_exporter.sources.pause_stats import parse as parse_pause

log = logging.getLogger("rnic_exporter.wire")

Gstats = Callable[[str], Mapping[str, int]]


@dataclass(frozen=True, slots=True)
class WireSettings:
    """Intervals in seconds; 0 turns a source off. Module reads below a minute are refused."""

    # Every source once a minute. A request costs the exporter 0.16-0.18 ms of CPU warm and about
    # 0.5 ms in the daemon's cold wake-ups (docs/performance.md), so a 16-netdev host at the first
    # defaults (link state every 10 s, FEC and pause every 30 s) spent more on the wire than on
    # everything else; the alerts read 5-minute rates, and a port-down event asks the link state
    # at once (WireWatch.annotate).
    module_interval: float = 60.0
    static_refresh: float = 600.0
    fec_interval: float = 60.0
    pause_interval: float = 60.0
    link_state_interval: float = 60.0  # while the link is down (or not yet read): why it is down
    # While the link is up its state holds nothing new until it drops, and a drop is announced
    # (rtnetlink, the agent's port events ask at once: `expedite`). What the slow read still catches
    # is the device's link-down count after a flap too short to drop the carrier.
    link_state_up_interval: float = 600.0
    gstats_interval: float = 60.0
    # The floor under module_interval: a real module page is a firmware register access. Only the
    # simulator's demo (commands/demo.py, a story told in seconds) lowers it.
    min_module_interval: float = 60.0

    def __post_init__(self) -> None:
        if 0 < self.module_interval < self.min_module_interval:
            every = "minute" if self.min_module_interval == 60.0 else f"{self.min_module_interval:g}s"
            raise ValueError(f"module_interval {self.module_interval}s: optics are read every {every} or slower")
        intervals = (
            self.fec_interval,
            self.pause_interval,
            self.link_state_interval,
            self.link_state_up_interval,
            self.gstats_interval,
        )
        if any(v < 0 for v in intervals):
            raise ValueError("intervals are >= 0")


@dataclass
class _State:
    wire: NetdevWire = field(default_factory=NetdevWire)
    due: dict[str, float] = field(default_factory=dict)
    static: ModuleMemory | None = None
    static_read_at: float = -1e18


def read_gstats(ifname: str) -> Mapping[str, int]:
    """`ethtool -S` over the ioctl (no netlink message for driver strings); raises OSError."""
    ioctl = pyroute2_parts.module("ethtool.ioctl")
    eth = ioctl.IoctlEthtool(ifname)
    try:
        return {str(name): int(value) for name, value in eth.get_statistics()}
    finally:
        eth.close()


class WireReader:
    def __init__(
        self,
        ethtool: EthtoolNetlink,
        settings: WireSettings | None = None,
        gstats: Gstats = read_gstats,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ethtool = ethtool
        self.settings = settings or WireSettings()
        self._gstats = gstats
        self._clock = clock
        self._state: dict[str, _State] = {}
        self.gstats_requests = 0
        self.gstats_errors = 0
        # requests per netdev and operation since the netdev was first polled (forgotten with it):
        # what `rnic_exporter_reads_total` charges to the netdev's RDMA device
        self.requests_by_netdev: dict[str, dict[str, int]] = {}

    @property
    def requests(self) -> Mapping[str, int]:
        """Requests sent per operation since start: the read-cost counter."""
        out = dict(self.ethtool.requests)
        if self.gstats_requests:
            out["gstats"] = self.gstats_requests
        return out

    def next_due(self) -> float:
        """Seconds until the earliest read falls due (0 when one is due now); infinity when nothing
        is scheduled (no netdev, or every source unsupported or off): the caller's own rescan decides."""
        dues = [t for state in self._state.values() for t in state.due.values()]
        return max(0.0, min(dues) - self._clock()) if dues else math.inf

    def expedite(self, netdev: str, source: str) -> None:
        """Read `source` of `netdev` at the next poll (an announcement says it changed); a source it
        lacks or that is off stays unread, a netdev not polled yet is read in full anyway."""
        state = self._state.get(netdev)
        if state is not None and source in state.due:
            state.due[source] = self._clock()

    def poll(self, netdevs: Iterable[str]) -> dict[str, NetdevWire]:
        now = self._clock()
        wanted = list(dict.fromkeys(netdevs))
        for gone in set(self._state) - set(wanted):
            del self._state[gone]  # a netdev that comes back starts afresh (unsupported asked again)
            self.requests_by_netdev.pop(gone, None)
        for netdev in wanted:
            state = self._state.setdefault(netdev, _State())
            before = self.requests
            state.wire = self._read_due(netdev, state, now)
            after = self.requests
            if after != before:  # one thread polls: the difference is this netdev's
                mine = self.requests_by_netdev.setdefault(netdev, {})
                for operation, count in after.items():
                    if count != before.get(operation, 0):
                        mine[operation] = mine.get(operation, 0) + count - before.get(operation, 0)
        return {netdev: self._state[netdev].wire for netdev in wanted}

    def _read_due(self, netdev: str, state: _State, now: float) -> NetdevWire:
        s = self.settings
        wire = state.wire
        if self._due(state, "link_state", s.link_state_interval, now, wire.link_state):
            wire = replace(wire, link_state=self.ethtool.link_state(netdev))
            if isinstance(wire.link_state, LinkState) and wire.link_state.link_up:
                state.due["link_state"] = now + max(s.link_state_interval, s.link_state_up_interval)
        if self._due(state, "fec", s.fec_interval, now, wire.fec):
            wire = replace(wire, fec=self.ethtool.fec(netdev))
        if self._due(state, "pause", s.pause_interval, now, wire.pause):
            wire = replace(wire, pause=self.ethtool.pause(netdev))
        if self._due(state, "gstats", s.gstats_interval, now, wire.driver_pause):
            wire = replace(wire, driver_pause=self._driver_pause(netdev))
        if self._due(state, "module", s.module_interval, now, wire.module):
            fresh = now - state.static_read_at < s.static_refresh
            read = self.ethtool.module(netdev, static=state.static if fresh else None)
            if read.memory is not None:
                if not fresh or state.static is None:
                    state.static_read_at = now
                state.static = read.memory
            wire = replace(wire, module=read.result)
        return wire

    def _due(self, state: _State, source: str, interval: float, now: float, last: object) -> bool:
        if interval <= 0 or isinstance(last, Unsupported):
            state.due.pop(source, None)  # never due again: no wake-up for it
            return False
        if now < state.due.get(source, now):
            return False
        state.due[source] = now + interval
        return True

    def _driver_pause(self, netdev: str) -> Outcome[DriverPauseStats]:
        self.gstats_requests += 1
        try:
            parsed = parse_pause(self._gstats(netdev))
        except Exception as exc:  # pyroute2's NotSupportedError, NoSuchDevice, OSError, a racing string set
            if type(exc).__name__ == "NotSupportedError":
                return Unsupported("gstats", "EOPNOTSUPP")
            if type(exc).__name__ == "NoSuchDevice" or getattr(exc, "errno", None) == errno.ENODEV:
                return Gone("gstats")  # not in this namespace (moved, or removed since the snapshot)
            self.gstats_errors += 1
            log.debug("ethtool -S failed", extra={"fields": {"netdev": netdev, "err": repr(exc)}})
            return ReadFailure("gstats", type(exc).__name__)
        # A driver without any of the curated strings (IPoIB, veth) will not grow them: ask once.
        return parsed if parsed is not None else Unsupported("gstats", "not_exposed")


__all__ = ["WireReader", "WireSettings", "read_gstats"]
