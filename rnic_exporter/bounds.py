"""The accepted range of every number the operator sets, and the one validator for flags and file alike.

A flag (`--poll.interval`) and its config-file key (`poll_interval_seconds`) go through the same
`check_number`, so NaN, infinities and values below a floor are refused the same way wherever they
come from: NaN passes every `<`/`>` range test, which is how it once stopped polling for good.
Light on purpose (click only): the command line imports it before any command runs.
"""

from __future__ import annotations

import math
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

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a number"
        low = f"> {self.low:g}" if self.open_low else f">= {self.low:g}"
        return f"{kind} {low} and <= {self.high:g}{self.unit}"


# The floor of the poll interval is the same from `--poll.interval` and from the file: below it a
# poll would start before the last one finished on a busy host.
POLL_INTERVAL = Bound(0.05, 3600.0, unit=" s")
WINDOW = Bound(1.0, 7 * 86400.0, unit=" s")
CLEAR_AFTER = Bound(1.0, 30 * 86400.0, unit=" s")
FORGET_AFTER = Bound(1.0, 366 * 86400.0, unit=" s")
TRANSITIONS = Bound(1, 100_000, integer=True)
DEVICES = Bound(1, 4096, integer=True)
GID_INDEX = Bound(-1, 65535, integer=True)  # -1: NCCL's auto-selection
ROCE_VERSION = Bound(1, 2, integer=True)
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


def check_number(path: str, value: Any, bound: Bound) -> Any:
    """`value` if it is a finite number within `bound` (an int when `bound.integer`), else ValueError."""
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


class NumberParam(click.ParamType[Any]):
    """A flag's number, checked by `check_number`: `--poll.interval nan` is refused like the file's."""

    def __init__(self, bound: Bound) -> None:
        self.bound = bound
        self.name = "integer" if bound.integer else "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int | float) and not isinstance(value, bool):
            number: Any = value
        else:
            try:
                number = int(str(value), 10) if self.bound.integer else float(str(value))
            except (ValueError, OverflowError):
                self.fail(f"{show(value)} is not {'an integer' if self.bound.integer else 'a number'}", param, ctx)
        try:
            return check_number("value", number, self.bound)
        except ValueError as exc:
            self.fail(str(exc).removeprefix("value: "), param, ctx)
