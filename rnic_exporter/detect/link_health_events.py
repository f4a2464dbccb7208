"""`rnic.port.degrading` / `rnic.port.recovered`: a port crossing into and out of "degrading",
judged over successive counter snapshots (pure: the caller owns time and reads).

Counters are judged over a window of at least `window_s` (60 s by default): each snapshot that
closes such a window since the last judged one is compared with it, so the daemon may hand every
counter pass in, however frequent. A port enters "degrading" on the first window that judges it so
(critical when a queue pair exhausted its retries), and leaves only after `clear_after_s` (15 min)
without such a window: one alert per failing cable, not one per burst (the flap detector's habit).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rnic_exporter.catalog.events import PORT_DEGRADING, PORT_RECOVERED, Event
from rnic_exporter.catalog.link_health import LinkHealthThresholds
from rnic_exporter.detect.conditions import HostConditions
from rnic_exporter.detect.link_health import PortHealth
from rnic_exporter.detect.port_health import judge_host, where
from rnic_exporter.model.host import Snapshot

DEFAULT_WINDOW_S = 60.0
DEFAULT_CLEAR_AFTER_S = 900.0


@dataclass(slots=True)
class _PortState:
    degrading: bool = False
    last_bad: float = 0.0
    critical: bool = False


class LinkHealthTracker:
    """Fed counter snapshots with their time; answers the events of ports crossing the line."""

    def __init__(
        self,
        thresholds: LinkHealthThresholds | None = None,
        window_s: float = DEFAULT_WINDOW_S,
        clear_after_s: float = DEFAULT_CLEAR_AFTER_S,
    ) -> None:
        self.thresholds = thresholds or LinkHealthThresholds()
        self.window_s = window_s
        self.clear_after_s = clear_after_s
        self._ref: tuple[Snapshot, float] | None = None
        self._ports: dict[tuple[str, int], _PortState] = {}
        self.last: tuple[PortHealth, ...] = ()  # the last window's judgement (for a gauge or `show`)

    @property
    def reference_at(self) -> float | None:
        """When the snapshot the next window is judged against was taken (None: none yet)."""
        return None if self._ref is None else self._ref[1]

    def degrading(self) -> frozenset[tuple[str, int]]:
        return frozenset(k for k, s in self._ports.items() if s.degrading)

    def observe(
        self,
        snap: Snapshot,
        at: float,
        *,
        conditions: HostConditions | None = None,
        consumers: Mapping[str, tuple[str, ...]] | None = None,
    ) -> list[Event]:
        """`at`: when the snapshot's counters were read (monotonic or wall, one clock throughout).
        `conditions`, `consumers`: what the events say the port also suffers and who uses it."""
        if self._ref is None or at < self._ref[1]:  # first, or the clock went back: start over
            self._ref = (snap, at)
            return []
        ref, ref_at = self._ref
        if at - ref_at < self.window_s:
            return []
        self._ref = (snap, at)
        healths = judge_host(
            ref, snap, self.thresholds, prev_at=ref_at, cur_at=at, conditions=conditions, consumers=consumers
        )
        self.last = healths
        events: list[Event] = []
        seen = set()
        for health in healths:
            key = (health.facts.device, health.facts.port)
            seen.add(key)
            state = self._ports.setdefault(key, _PortState())
            if health.degrading:
                critical = health.level == "critical"
                state.last_bad = at
                if not state.degrading or (critical and not state.critical):
                    events.append(_degrading(health, snap, critical))
                state.degrading, state.critical = True, state.critical or critical
            elif state.degrading and at - state.last_bad >= self.clear_after_s:
                state.degrading = state.critical = False
                events.append(_recovered(health, snap, at - state.last_bad))
        for key in set(self._ports) - seen:  # the port or its device went: other events say so
            del self._ports[key]
        return events


def _pci(snap: Snapshot, device: str) -> str | None:
    dev = snap.device(device)
    return None if dev is None else dev.pci_address


def _degrading(health: PortHealth, snap: Snapshot, critical: bool) -> Event:
    facts = health.facts
    signals = [v.signal for v in health.verdicts if v.level in ("degrading", "critical")]
    attributes = {"signals": ",".join(signals), "window_seconds": f"{health.window_s:.0f}"}
    if facts.below_rated:
        attributes["below_rated"] = "; ".join(facts.below_rated)
    if facts.aer_errors:
        attributes["pcie_aer_errors"] = str(facts.aer_errors)
    return Event(
        PORT_DEGRADING,
        f"{where(facts)} is degrading: {health.summary()}",
        facts.device,
        facts.port,
        facts.netdev,
        _pci(snap, facts.device),
        before="ok",
        after="critical" if critical else "degrading",
        attributes=attributes,
        severity_override="critical" if critical else None,
        time=snap.taken_at,
    )


def _recovered(health: PortHealth, snap: Snapshot, quiet_s: float) -> Event:
    facts = health.facts
    return Event(
        PORT_RECOVERED,
        f"{where(facts)}: error counters within their limits for {quiet_s:.0f} s",
        facts.device,
        facts.port,
        facts.netdev,
        _pci(snap, facts.device),
        before="degrading",
        after="ok",
        time=snap.taken_at,
    )
