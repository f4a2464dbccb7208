"""Link health: two counter samples of a port judged into a verdict per signal (pure).

The counters that rise before a job dies (symbol errors, link retraining, RoCE retransmissions)
are only meaningful as rates, so every judgement here takes two samples of one port and the
seconds between them. No I/O: the daemon feeds it successive polls, `check` two reads a few
seconds apart (`commands/check.py`), tests tables of real numbers.

Levels, mildest first: `unsupported` (the driver never had the counter: no alarm, ever), `ok`,
`congested` (ECN/CNP, xmit wait and discards: the fabric is busy, not broken), `degrading` (a
warning: the link or path is failing and will cost the job), `critical` (a QP already gave up).
A counter that went down (a reset, `perfquery -R`, a 32-bit hw counter wrapping) has no rate in
that window: it is never read as a burst of errors.

Thresholds, the signals and where each limit comes from: `catalog/link_health.py` (the
dashboards and alert rules are built from the same declarations).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from rnic_exporter.catalog.link_health import SIGNALS, LinkHealthThresholds, Signal
from rnic_exporter.model.host import Device, Port

Level = Literal["unsupported", "ok", "congested", "degrading", "critical"]
LEVEL_ORDER: Mapping[str, int] = MappingProxyType(
    {"unsupported": 0, "ok": 1, "congested": 2, "degrading": 3, "critical": 4}
)
# Packets per direction: PMA (mlx5: RoCE traffic only, which is what retransmits), else rxe's hw counters.
_PACKETS = (("port_rcv_packets", True), ("rcvd_pkts", False)), (("port_xmit_packets", True), ("sent_pkts", False))


@dataclass(frozen=True, slots=True)
class CounterSample:
    """One read of a port's counters: PMA `counters/` and `hw_counters/` (port, then device-wide)."""

    taken_at: float  # seconds, one clock for both samples
    pma: Mapping[str, int]
    hw: Mapping[str, int]
    saturated: frozenset[str] = frozenset()  # PMA counters stuck at their maximum

    @classmethod
    def of(cls, device: Device, port: Port, taken_at: float) -> CounterSample:
        hw = {**device.hw_counters, **port.hw_counters}
        pma = {name: c.value for name, c in port.counters.items()}
        return cls(taken_at, pma, hw, frozenset(n for n, c in port.counters.items() if c.saturated))

    def value(self, name: str, pma: bool) -> int | None:
        return (self.pma if pma else self.hw).get(name)


@dataclass(frozen=True, slots=True)
class PortFacts:
    """What else is known of the port, to say in one place what a degrading port also suffers."""

    device: str
    port: int
    netdev: str | None = None
    link_layer: str | None = None
    rate_gbps: float | None = None  # `rate`: lanes x per-lane Gb/s; None while down or unknown
    lanes: int | None = None
    up: bool | None = None
    below_rated: tuple[str, ...] = ()  # links below rated: "port 200 Gb/s x4 < 400 Gb/s x4 (config)"
    aer_errors: int = 0  # PCIe AER errors (all severities) the NIC's function reported since boot
    consumers: tuple[str, ...] = ()  # workloads using the device ("Slurm job 42"); () unknown or none

    @classmethod
    def of(
        cls,
        device: Device,
        port: Port,
        below_rated: tuple[str, ...] = (),
        aer_errors: int = 0,
        consumers: tuple[str, ...] = (),
    ) -> PortFacts:
        rate = port.rate if port.is_up else None
        return cls(
            device.name,
            port.number,
            port.netdev,
            port.link_layer,
            None if rate is None else rate.gbps,
            None if rate is None else rate.lanes,
            port.up,
            below_rated,
            aer_errors,
            consumers,
        )


@dataclass(frozen=True, slots=True)
class Verdict:
    signal: str
    level: Level
    counter: str = ""  # the file read ("" when unsupported)
    increase: int | None = None  # None: no rate this window (reset, appeared, saturated)
    per_second: float | None = None
    ratio: float | None = None  # BER for symbol_error; per packet for transport and drops
    limit: str = ""  # the threshold judged against, for messages
    note: str = ""  # why there is no rate ("reset", "saturated", "appeared")

    def describe(self, window_s: float) -> str:
        """`symbol_error +40 in 3 s (13.3/s, BER 3.3e-11), above BER 1e-12 or 120/h`, for messages."""
        if self.increase is None:
            return f"{self.signal}: no rate ({self.note})"
        what = "BER" if self.signal == "symbol_error" else "of packets"
        text = f"{self.signal} +{self.increase} in {window_s:.3g} s ({self.per_second or 0:.3g}/s"
        text += f", {what} {self.ratio:.2g})" if self.ratio is not None else ")"
        if self.limit and self.level in ("degrading", "critical"):
            text += f", above {self.limit}"
        return text


@dataclass(frozen=True, slots=True)
class PortHealth:
    facts: PortFacts
    window_s: float
    verdicts: tuple[Verdict, ...]

    @property
    def level(self) -> Level:
        worst: Level = "unsupported"
        for verdict in self.verdicts:
            if LEVEL_ORDER[verdict.level] > LEVEL_ORDER[worst]:
                worst = verdict.level
        return worst

    @property
    def degrading(self) -> bool:
        """Degrading or worse: what the events, alerts and `check` call a failing link."""
        return LEVEL_ORDER[self.level] >= LEVEL_ORDER["degrading"]

    def at(self, level: Level) -> tuple[Verdict, ...]:
        return tuple(v for v in self.verdicts if v.level == level)

    def verdict(self, signal: str) -> Verdict | None:
        for verdict in self.verdicts:
            if verdict.signal == signal:
                return verdict
        return None

    @property
    def context(self) -> tuple[str, ...]:
        """What else is wrong with the port or its NIC, and who it hits (issue item 4)."""
        out = [f"also below rated: {b}" for b in self.facts.below_rated]
        if self.facts.aer_errors:
            out.append(f"its NIC reported {self.facts.aer_errors} PCIe AER error(s) since boot")
        if self.facts.consumers:
            out.append("used by " + ", ".join(self.facts.consumers))
        return tuple(out)

    def summary(self) -> str:
        """The failing signals and the context, one line."""
        failing = [v.describe(self.window_s) for v in self.verdicts if v.level in ("critical", "degrading")]
        return "; ".join([*failing, *self.context])


@dataclass(frozen=True, slots=True)
class _Limits:
    """The thresholds as messages print them: formatted once per port judged, not per signal."""

    ber: str
    errors: str
    retransmission_ratio: str
    retransmission_rate: str
    drops: str

    @classmethod
    def of(cls, t: LinkHealthThresholds) -> _Limits:
        return cls(
            f"BER {t.symbol_error_ber:g} or {t.errors_per_hour:g}/h",
            f"{t.errors_per_hour:g}/h",
            f"{t.retransmission_ratio:g} of packets",
            f"{t.retransmissions_per_second:g}/s",
            f"{t.drop_ratio:g} of received packets",
        )


def _packets(prev: CounterSample, cur: CounterSample, directions: int) -> int | None:
    """Packets in the window: received (directions=1) or both ways (2); None when not counted."""
    total = 0
    for direction in _PACKETS[:directions]:
        for name, pma in direction:
            before, after = prev.value(name, pma), cur.value(name, pma)
            if before is not None and after is not None and after >= before and name not in cur.saturated:
                total += after - before
                break
        else:
            return None
    return total


def _judge_one(
    signal: Signal,
    prev: CounterSample,
    cur: CounterSample,
    window: float,
    facts: PortFacts,
    t: LinkHealthThresholds,
    limits: _Limits,
) -> Verdict:
    # One Verdict per signal, straight from its dicts: the daemon judges every port each window
    # (on a host whose error counters all move, this is most of link health's minute).
    after_values, before_values = (cur.pma, prev.pma) if signal.pma else (cur.hw, prev.hw)
    counter = ""
    after = None
    for name in signal.counters:
        after = after_values.get(name)
        if after is not None:
            counter = name
            break
    if after is None:
        return Verdict(signal.name, "unsupported")
    before = before_values.get(counter)
    if before is None:
        return Verdict(signal.name, "ok", counter, note="appeared")
    if after < before:
        return Verdict(signal.name, "ok", counter, note="reset")  # a reset or a wrap: never a burst
    if signal.pma and counter in cur.saturated:
        return Verdict(signal.name, "ok", counter, note="saturated")
    increase = after - before
    per_second = increase / window
    per_hour = per_second * 3600.0
    kind = signal.kind
    level: Level = "ok"
    ratio: float | None = None
    if kind == "ber":
        bits = None if facts.rate_gbps is None else facts.rate_gbps * 1e9 * window
        ratio = None if not bits else increase / bits
        over = increase >= t.min_errors and (
            (ratio is not None and ratio > t.symbol_error_ber) or per_hour > t.errors_per_hour
        )
        level, limit = ("degrading" if over else "ok"), limits.ber
    elif kind == "event":
        level, limit = ("degrading" if increase > 0 else "ok"), "0"
    elif kind == "errors":
        over = increase >= t.min_errors and per_hour > t.errors_per_hour
        level, limit = ("degrading" if over else "ok"), limits.errors
    elif kind == "congestion":
        level, limit = ("congested" if increase > 0 else "ok"), ""
    elif kind == "fatal":
        level, limit = ("critical" if increase > 0 else "ok"), "0"
    elif kind == "transport":
        packets = _packets(prev, cur, 2)
        ratio = increase / packets if packets else None
        if ratio is not None:
            over, limit = ratio > t.retransmission_ratio, limits.retransmission_ratio
        else:
            over, limit = per_second > t.retransmissions_per_second, limits.retransmission_rate
        level = "degrading" if over and increase >= t.min_retransmissions else "ok"
    else:  # drops: of what was received
        packets = _packets(prev, cur, 1)
        ratio = increase / packets if packets else None
        over = ratio > t.drop_ratio if ratio is not None else per_second > t.retransmissions_per_second
        level, limit = ("degrading" if over and increase >= t.min_drops else "ok"), limits.drops
    return Verdict(signal.name, level, counter, increase, per_second, ratio, limit)


def judge_port(
    prev: CounterSample, cur: CounterSample, facts: PortFacts, thresholds: LinkHealthThresholds | None = None
) -> PortHealth | None:
    """Every signal of the port over the window between the samples; None without a window (the
    same sample twice, or a clock that went back): no rate can be judged then."""
    window = cur.taken_at - prev.taken_at
    if not window > 0:
        return None
    t = thresholds or LinkHealthThresholds()
    limits = _Limits.of(t)
    return PortHealth(facts, window, tuple([_judge_one(s, prev, cur, window, facts, t, limits) for s in SIGNALS]))
