"""Typed records of the wire below a RoCE netdev: link state with its reason, FEC and pause.

Filled by `rnic_exporter.sources.ethtool_netlink` (ethtool netlink) and the `ethtool -S` pause
parser; no I/O. A read is one of: its record, `Unsupported` (the driver or device never had the
operation: veth, tun, IPoIB, a driver without the op; not a fault, no alarm), `Gone` (the netdev is
not in this network namespace: not a fault either) or `ReadFailure` (the operation exists and
failed: counted and logged).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeAlias, TypeVar

from rnic_exporter.model.optics import ModuleReading, UnsupportedModule


@dataclass(frozen=True, slots=True)
class Unsupported:
    operation: str  # "fec", "pause", "module_eeprom", ...
    reason: str  # errno name, "EOPNOTSUPP"


@dataclass(frozen=True, slots=True)
class ReadFailure:
    operation: str
    reason: str  # errno name or "malformed: ..."


@dataclass(frozen=True, slots=True)
class Gone:
    """The kernel knows no netdev of that name here (ENODEV, and the name resolves to no interface):
    removed between the snapshot and the read, or moved into another network namespace (a
    container's). Not a fault and no series; asked again at the operation's interval, as it may come
    back (`Unsupported` is never asked again)."""

    operation: str


T = TypeVar("T")
Outcome: TypeAlias = T | Unsupported | Gone | ReadFailure


@dataclass(frozen=True, slots=True)
class LinkState:
    """ETHTOOL_MSG_LINKSTATE_GET: carrier, why it is down (when the driver says), down events."""

    link_up: bool | None
    ext_state: str | None  # "cable_issue", "bad_signal_integrity", ... (ethtool_link_ext_state)
    ext_substate: str | None  # "unsupported_cable", "serdes_alos", ... within ext_state
    down_count: int | None  # link-down events since the device was created (6.x kernels)


@dataclass(frozen=True, slots=True)
class FecBin:
    """A bin of the RS-FEC codeword histogram (FEC_GET, kernel 6.18+): codewords corrected with
    `low` to `high` errors (ethtool prints it `fec_bit_err_<low>_to_<high>`); low == high for one."""

    low: int
    high: int
    codewords: int

    @property
    def label(self) -> str:
        return str(self.low) if self.low == self.high else f"{self.low}-{self.high}"


@dataclass(frozen=True, slots=True)
class FecStats:
    """ETHTOOL_MSG_FEC_GET with statistics: blocks, as totals and per lane (lane 0 first)."""

    active_mode: str | None  # "rs", "baser", "llrs", "none"
    corrected_blocks: int | None
    uncorrectable_blocks: int | None
    corrected_bits: int | None
    corrected_blocks_per_lane: tuple[int, ...] = ()
    uncorrectable_blocks_per_lane: tuple[int, ...] = ()
    histogram: tuple[FecBin, ...] = ()  # empty before 6.18 and where the driver keeps none


@dataclass(frozen=True, slots=True)
class PauseStats:
    """ETHTOOL_MSG_PAUSE_GET with statistics: 802.3x settings and frame counts."""

    autoneg: bool | None
    rx_enabled: bool | None  # honour received pause: the peer may throttle us
    tx_enabled: bool | None  # send pause when our receive side is behind
    tx_frames: int | None
    rx_frames: int | None


def _empty() -> Mapping[int, int]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class PriorityPause:
    """Pause/PFC counters of one direction from the driver's `ethtool -S` strings.

    `frames`, `duration_us` and `transitions` are per priority (0-7); the port-wide values are
    the global (802.3x) pause frames. Received pause: the peer throttles us; sent pause: our
    receive side is behind.
    """

    frames: Mapping[int, int] = field(default_factory=_empty)
    duration_microseconds: Mapping[int, int] = field(default_factory=_empty)
    transitions: Mapping[int, int] = field(default_factory=_empty)
    global_frames: int | None = None


@dataclass(frozen=True, slots=True)
class DriverPauseStats:
    """The curated `ethtool -S` set: pause, PFC, pause storms, per-priority discards, module events."""

    received: PriorityPause
    sent: PriorityPause
    buffer_discards: Mapping[int, int] = field(default_factory=_empty)  # rx_prioN_buf_discard
    congestion_discards: Mapping[int, int] = field(default_factory=_empty)  # rx_prioN_cong_discard
    counters: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))  # port-wide, by name


@dataclass(frozen=True, slots=True)
class NetdevWire:
    """The latest reading of every source of one netdev (None: not read yet or turned off)."""

    module: Outcome[ModuleReading | UnsupportedModule] | None = None
    fec: Outcome[FecStats] | None = None
    pause: Outcome[PauseStats] | None = None
    link_state: Outcome[LinkState] | None = None
    driver_pause: Outcome[DriverPauseStats] | None = None


@dataclass(frozen=True, slots=True)
class Temperature:
    """One hwmon temperature channel (mlx5, Linux 6.6+; sources/hwmon.py)."""

    label: str
    celsius: float
    highest_celsius: float | None
    critical_celsius: float | None


@dataclass(frozen=True, slots=True)
class DeviceTemperatures:
    asic: tuple[Temperature, ...]
    module: Temperature | None
    errors: tuple[str, ...] = ()  # files that could not be read or parsed, e.g. "hwmon3/temp2_input: EIO"


__all__ = [
    "DeviceTemperatures",
    "DriverPauseStats",
    "FecBin",
    "FecStats",
    "Gone",
    "LinkState",
    "NetdevWire",
    "Outcome",
    "PauseStats",
    "PriorityPause",
    "ReadFailure",
    "Temperature",
    "Unsupported",
]
