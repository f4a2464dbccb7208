"""Typed records of a pluggable module (transceiver or cable) and its diagnostics.

Filled by the SFF-8636 and CMIS decoders (`rnic_exporter.sources.optics`); no I/O here. Values
are in base units: degrees Celsius, volts, watts (optical power; dBm is 10*log10(W/1 mW), only for
people reading a datasheet) and amperes (laser bias). A monitor the module does not implement is
``None``, never 0.

Each value carries the module's *own* alarm and warning thresholds (SFF-8636 page 03h, CMIS page
02h) and is judged against them: a vendor knows its laser's safe window better than any fixed
number we could pick, and a module without thresholds is judged `UNKNOWN`, not normal.

A lane the host keeps dark on purpose (CMIS: its data path is not activated, e.g. the unused port
of a twin-port module; or its transmitter is disabled) still reports its values but is judged
`NOT_IN_USE`: 0 W there is the lane doing what it was told, and an alarm on it would drain a
healthy node.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Literal

MemoryMap = Literal["sff8636", "cmis"]


class Level(enum.Enum):
    """Where a value stands against its module's thresholds, worst first when sorted by `rank`."""

    ALARM_HIGH = "alarm_high"
    ALARM_LOW = "alarm_low"
    WARNING_HIGH = "warning_high"
    WARNING_LOW = "warning_low"
    NORMAL = "normal"
    UNKNOWN = "unknown"  # the module publishes no (usable) thresholds for this value
    NOT_IN_USE = "not_in_use"  # the host keeps this lane (or its transmitter) off: not judged

    @property
    def rank(self) -> int:
        """0 for an alarm, 1 for a warning, 2 for normal, 3 for unknown or not in use."""
        return _RANK[self]


_RANK = {
    Level.ALARM_HIGH: 0,
    Level.ALARM_LOW: 0,
    Level.WARNING_HIGH: 1,
    Level.WARNING_LOW: 1,
    Level.NORMAL: 2,
    Level.UNKNOWN: 3,
    Level.NOT_IN_USE: 3,
}
_UNJUDGED = frozenset({Level.UNKNOWN, Level.NOT_IN_USE})


@dataclass(frozen=True, slots=True)
class Thresholds:
    """The module's four limits for one value, in the value's base unit."""

    high_alarm: float
    low_alarm: float
    high_warning: float
    low_warning: float

    @property
    def usable(self) -> bool:
        """False for an all-zero or inverted set: modules without thresholds leave the page at 0."""
        return (
            all(math.isfinite(v) for v in (self.high_alarm, self.low_alarm, self.high_warning, self.low_warning))
            and self.low_alarm <= self.low_warning <= self.high_warning <= self.high_alarm
            and self.high_alarm > self.low_alarm
        )

    def judge(self, value: float) -> Level:
        """Alarms beat warnings; a value on a limit is inside it (SFF-8636 and CMIS flag *beyond*)."""
        if not self.usable or not math.isfinite(value):
            return Level.UNKNOWN
        if value > self.high_alarm:
            return Level.ALARM_HIGH
        if value < self.low_alarm:
            return Level.ALARM_LOW
        if value > self.high_warning:
            return Level.WARNING_HIGH
        if value < self.low_warning:
            return Level.WARNING_LOW
        return Level.NORMAL


@dataclass(frozen=True, slots=True)
class Monitor:
    """One measured value and the module's thresholds for it (None when the module has none).

    `in_use` False: the host keeps what this value measures off (a deactivated data path, a
    disabled transmitter); the value is still reported, never judged.
    """

    value: float
    thresholds: Thresholds | None
    in_use: bool = True

    @property
    def level(self) -> Level:
        if not self.in_use:
            return Level.NOT_IN_USE
        return Level.UNKNOWN if self.thresholds is None else self.thresholds.judge(self.value)


@dataclass(frozen=True, slots=True)
class Lane:
    """One media lane (1-based), as the module numbers them.

    `data_path_active`: CMIS page 11h says the host lanes feeding it are activated (True) or
    deactivated or changing state (False); None where the module does not say (SFF-8636, CMIS flat
    memory, a reserved state code). `tx_disabled`: CMIS page 10h, None where not read.
    """

    number: int
    rx_power_watts: Monitor | None
    tx_power_watts: Monitor | None
    tx_bias_amperes: Monitor | None
    data_path_active: bool | None = None
    tx_disabled: bool | None = None


@dataclass(frozen=True, slots=True)
class ModuleIdentity:
    """Who made the module and what it is (SFF-8636 upper page 00h, CMIS upper page 00h)."""

    identifier: int  # byte 0, SFF-8024 identifier (0x11 QSFP28, 0x18 QSFP-DD, ...)
    type: str  # SFF-8024 name of `identifier`
    memory_map: MemoryMap
    vendor: str
    part_number: str
    serial_number: str
    revision: str
    oui: str  # "00:02:c9"
    date_code: str


@dataclass(frozen=True, slots=True)
class ModuleReading:
    """A decoded module: identity, module-level monitors and per-lane monitors."""

    identity: ModuleIdentity
    temperature_celsius: Monitor | None
    supply_voltage_volts: Monitor | None
    lanes: tuple[Lane, ...]
    rx_power_kind: Literal["average", "oma"]  # SFF-8636 can report OMA instead of average power
    thresholds_published: bool  # False: flat memory (copper) or a module that left its limits at 0

    def monitors(self) -> list[tuple[str, int | None, Monitor]]:
        """(value name, lane or None, monitor) for every value present: what a judge walks over."""
        out: list[tuple[str, int | None, Monitor]] = []
        if self.temperature_celsius is not None:
            out.append(("temperature", None, self.temperature_celsius))
        if self.supply_voltage_volts is not None:
            out.append(("supply_voltage", None, self.supply_voltage_volts))
        for lane in self.lanes:
            for name, mon in (
                ("rx_power", lane.rx_power_watts),
                ("tx_power", lane.tx_power_watts),
                ("tx_bias", lane.tx_bias_amperes),
            ):
                if mon is not None:
                    out.append((name, lane.number, mon))
        return out

    @property
    def worst(self) -> Level:
        """The worst level over all values; UNKNOWN only when no value could be judged."""
        levels = [mon.level for _, _, mon in self.monitors()]
        judged = [lv for lv in levels if lv not in _UNJUDGED]
        return min(judged, key=lambda lv: lv.rank) if judged else Level.UNKNOWN


@dataclass(frozen=True, slots=True)
class UnsupportedModule:
    """A module whose memory map we do not decode (SFP, legacy QSFP, ...): not an error."""

    identifier: int
    type: str


def watts_to_dbm(watts: float) -> float:
    """For documentation and tests only: metrics stay in watts. 0 W is -inf dBm."""
    return 10.0 * math.log10(watts * 1000.0) if watts > 0 else -math.inf


__all__ = [
    "Lane",
    "Level",
    "MemoryMap",
    "ModuleIdentity",
    "ModuleReading",
    "Monitor",
    "Thresholds",
    "UnsupportedModule",
    "watts_to_dbm",
]
