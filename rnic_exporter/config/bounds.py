"""The accepted range of every number the operator sets, and the one validator for flags and file alike.

A flag (`--poll.interval`) and its config-file key (`poll_interval_seconds`) go through the same
`check_number`, so NaN, infinities and values below a floor are refused the same way wherever they
come from: NaN passes every `<`/`>` range test, which is how it once stopped polling for good.
A time (`Bound.duration`) is also taken as a Prometheus duration (`500ms`, `5s`, `1h30m`, parsed
by `parse_duration` as Prometheus' model parses them), or plain seconds (`0.5`) as before.
Light on purpose (click only): the command line imports it before any command runs.
"""

from __future__ import annotations

import math
import re
import reprlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click


@dataclass(frozen=True, slots=True)
class Bound:
    """The numbers a setting accepts: finite, within low..high (low excluded when `open_low`)."""

    low: float
    high: float
    integer: bool = False
    open_low: bool = False
    unit: str = ""
    duration: bool = False  # seconds: a Prometheus duration string is accepted too

    def describe(self) -> str:
        kind = "a number"
        if self.integer:
            kind = "an integer"
        elif self.duration:
            kind = "a duration (500ms, 5s, 1m) or seconds"
        low = f"> {self.low:g}" if self.open_low else f">= {self.low:g}"
        return f"{kind} {low} and <= {self.high:g}{self.unit}"


# The floor of the poll interval is the same from `--poll.interval` and from the file: below it a
# poll would start before the last one finished on a busy host.
POLL_INTERVAL = Bound(0.05, 3600.0, unit=" s", duration=True)
WINDOW = Bound(1.0, 7 * 86400.0, unit=" s", duration=True)
CLEAR_AFTER = Bound(1.0, 30 * 86400.0, unit=" s", duration=True)
FORGET_AFTER = Bound(1.0, 366 * 86400.0, unit=" s", duration=True)
COUNTER_WAIT = Bound(0.0, 3600.0, unit=" s", duration=True)
OTLP_INTERVAL = Bound(0.05, 86400.0, unit=" s", duration=True)
OTLP_TIMEOUT = Bound(0.05, 3600.0, unit=" s", duration=True)
DEMO_STEP = Bound(1.0, 86400.0, unit=" s", duration=True)
# The demo's story plays on mlx5_0 to mlx5_4 and one more RoCE RNIC whose PMA does not answer.
DEMO_DEVICES = Bound(6, 24, integer=True)
FOLLOW_DELAY = Bound(0.0, 5.0, unit=" s", duration=True)
TRANSITIONS = Bound(1, 100_000, integer=True)
DEVICES = Bound(1, 4096, integer=True)
GID_INDEX = Bound(-1, 65535, integer=True)  # -1: NCCL's auto-selection
ROCE_VERSION = Bound(1, 2, integer=True)
# [link_health] in the config file (detect/link_health.py: LinkHealthThresholds). A ratio above 1
# would never fire; a check window above a minute holds a job prologue too long.
_RATIO = Bound(0.0, 1.0, open_low=True)
LINK_HEALTH = {
    "symbol_error_ber": _RATIO,
    "errors_per_hour": Bound(0.0, 1e12, open_low=True),
    "min_errors": Bound(1, 1_000_000, integer=True),
    "retransmission_ratio": _RATIO,
    "retransmissions_per_second": Bound(0.0, 1e12, open_low=True),
    "min_retransmissions": Bound(1, 1_000_000, integer=True),
    "drop_ratio": _RATIO,
    "min_drops": Bound(1, 1_000_000, integer=True),
    "check_window_seconds": Bound(0.5, 60.0, unit=" s", duration=True),
    # Below a second the window is shorter than a counter pass is reused (agent.COUNTER_PASS_REUSE_S).
    "window_seconds": Bound(1.0, 3600.0, unit=" s", duration=True),
    "clear_after_seconds": Bound(1.0, 86400.0, unit=" s", duration=True),
}
GBPS = Bound(0.0, 100_000.0, open_low=True, unit=" Gb/s")
GTS = Bound(0.0, 1000.0, open_low=True, unit=" GT/s")
WIDTH = Bound(1, 32, integer=True, unit=" lanes")

_SHOW = reprlib.Repr()
_SHOW.maxstring = _SHOW.maxother = 40
_SHOW.maxlist = _SHOW.maxdict = _SHOW.maxtuple = 4
_SHOW.maxlevel = 2


def show(value: Any) -> str:
    """A value in a message: bounded (an aliased YAML tree can repr to gigabytes) and on one line."""
    return _SHOW.repr(value).replace("\n", "\\n")


# Prometheus' model.ParseDuration: integer amounts of y, w, d, h, m, s, ms, each at most once and in
# that order ("1h30m", not "30m1h" or "1.5h"); "0" needs no unit.
_DURATION = re.compile(
    r"(?:(?P<y>\d+)y)?(?:(?P<w>\d+)w)?(?:(?P<d>\d+)d)?(?:(?P<h>\d+)h)?"
    r"(?:(?P<m>\d+)m)?(?:(?P<s>\d+)s)?(?:(?P<ms>\d+)ms)?",
    re.ASCII,
)
_DAY_MS = 86_400_000
_UNIT_MS = {"y": 365 * _DAY_MS, "w": 7 * _DAY_MS, "d": _DAY_MS, "h": 3_600_000, "m": 60_000, "s": 1000, "ms": 1}
_MAX_MS = (1 << 63) // 1_000_000  # Prometheus keeps durations in int64 nanoseconds


def parse_duration(text: str) -> float:
    """Seconds in `text`: a Prometheus duration (`500ms`, `5s`, `1h30m`, `0`) or plain seconds (`0.5`, `5`).
    ValueError with a reason otherwise."""
    text = text.strip()
    m = _DURATION.fullmatch(text)
    if m is None or not any(m.groups()):
        try:
            return float(text)  # plain seconds, as before (nan and inf are left to the range check)
        except ValueError:
            raise ValueError(f"{show(text)} is not a duration (500ms, 5s, 1m30s) nor a number of seconds") from None
    total_ms = sum(int(amount) * _UNIT_MS[unit] for unit, amount in m.groupdict().items() if amount is not None)
    if total_ms > _MAX_MS:
        raise ValueError(f"{show(text)} is out of range")
    return total_ms / 1000


def check_number(path: str, value: Any, bound: Bound) -> Any:
    """`value` if it is a finite number within `bound` (an int when `bound.integer`), else ValueError.
    A duration bound also takes a duration string (`parse_duration`)."""
    if bound.duration and isinstance(value, str):
        try:
            value = parse_duration(value)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or (bound.integer and not isinstance(value, int)):
        raise ValueError(f"{path}: expected {bound.describe()}, got {show(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{path}: expected {bound.describe()}, got {value} (not a finite number)")
    if value < bound.low or value > bound.high or (bound.open_low and value == bound.low):
        raise ValueError(f"{path}: expected {bound.describe()}, got {show(value)}")
    return value if bound.integer else float(value)


def within(bound: Bound) -> Callable[[str, Any], Any]:
    def validate(path: str, value: Any) -> Any:
        return check_number(path, value, bound)

    return validate


class OneLineError(click.BadParameter):
    """A bad flag value as the one line the README promises (click's usage block is several), exit 2."""

    def show(self, file: Any = None) -> None:
        click.echo(f"rnic-exporter: error: {self.format_message()}", err=True)


class NumberParam(click.ParamType[Any]):
    """A flag's number, checked by `check_number`: `--poll.interval nan` is refused like the file's."""

    def __init__(self, bound: Bound) -> None:
        self.bound = bound
        self.name = "integer" if bound.integer else "duration" if bound.duration else "float"

    def fail(self, message: str, param: click.Parameter | None = None, ctx: click.Context | None = None) -> Any:
        raise OneLineError(message, ctx=ctx, param=param)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int | float) and not isinstance(value, bool):
            number: Any = value
        elif self.bound.duration:
            number = str(value)  # check_number parses it, and names the flag when it cannot
        else:
            try:
                number = int(str(value), 10) if self.bound.integer else float(str(value))
            except (ValueError, OverflowError):
                self.fail(f"{show(value)} is not {'an integer' if self.bound.integer else 'a number'}", param, ctx)
        try:
            return check_number("value", number, self.bound)
        except ValueError as exc:
            self.fail(str(exc).removeprefix("value: "), param, ctx)
