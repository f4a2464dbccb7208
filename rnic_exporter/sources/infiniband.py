"""`/sys/class/infiniband/<dev>/` and `ports/<n>/`: device attributes, port state, rate, counters."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from rnic_exporter.model.host import LinkRate, NumberedState
from rnic_exporter.sources.plan import Attribute, GroupSpec, Values, under
from rnic_exporter.sources.sysfs import NOT_EXPOSED, EmptyValueError, MalformedValueError

CLASS_DIR = "class/infiniband"

# Per-lane Gb/s of each speed name the kernel prints (ib_speed_enum_to_int, in Gb/s).
LANE_GBPS: Mapping[str, float] = MappingProxyType(
    {
        "SDR": 2.5,
        "DDR": 5.0,
        "QDR": 10.0,
        "FDR10": 10.0,
        "FDR": 14.0,
        "EDR": 25.0,
        "HDR": 50.0,
        "NDR": 100.0,
        "XDR": 200.0,
    }
)
VALID_LANES = frozenset({1, 2, 4, 8, 12})

_RATE = re.compile(r"^(\d+)(\.5)? Gb/sec \((\d+)X(?: (\w+))?\)$", re.ASCII)
_STATE = re.compile(r"^(\d+): (.+)$", re.ASCII)
_GUID = re.compile(r"^[0-9a-f]{4}(?::[0-9a-f]{4}){3}$")
_COUNTER = re.compile(r"^[0-9]+$")
# The kernel prints counters as u64 (hw_counters too); anything wider is not a counter value.
COUNTER_MAX = (1 << 64) - 1
# Kernel enums (port state 0-5, phys_state 0-7, node_type 1-4) fit a byte; rates are u32 Mb/s.
_STATE_MAX = 255
_RATE_MAX_GBPS = (1 << 32) // 1000
_LID_MAX = (1 << 32) - 1  # 16-bit on InfiniBand, 32-bit on OPA


def parse_rate(text: str) -> LinkRate:
    """`400 Gb/sec (4X NDR)` -> LinkRate(400.0, 4, 'NDR').

    Old kernels print no name for SDR (`10 Gb/sec (4X)`); `.5` appears for 2.5 Gb/s lanes x1.
    """
    m = _RATE.match(text.strip())
    if m is None:
        raise MalformedValueError(f"rate {text!r} is not '<Gb/s> Gb/sec (<lanes>X <speed>)'")
    if len(m[1]) > 10 or len(m[3]) > 3 or int(m[1]) > _RATE_MAX_GBPS:
        raise MalformedValueError(f"rate {text[:40]!r} is beyond what the kernel can print (u32 Mb/s)")
    lanes = int(m[3])
    if lanes not in VALID_LANES:
        raise MalformedValueError(f"rate {text!r} has {lanes} lanes; the kernel prints 1, 2, 4, 8 or 12")
    speed = m[4] or "SDR"
    return LinkRate(gbps=int(m[1]) + (0.5 if m[2] else 0.0), lanes=lanes, speed=speed)


def parse_numbered_state(text: str) -> NumberedState:
    """`4: ACTIVE` -> NumberedState(4, 'ACTIVE'); `7: Phy Test` keeps its space."""
    m = _STATE.match(text.strip())
    if m is None:
        raise MalformedValueError(f"{text!r} is not '<number>: <name>'")
    if len(m[1]) > 3 or int(m[1]) > _STATE_MAX:
        raise MalformedValueError(f"state number {m[1][:20]!r} is beyond a kernel enum (0-{_STATE_MAX})")
    return NumberedState(int(m[1]), m[2].strip())


def parse_guid(text: str) -> str:
    """`0c42:a103:0065:c7a8` (four lowercase hex groups); returned as printed."""
    value = text.strip()
    if not _GUID.match(value):
        raise MalformedValueError(f"GUID {text!r} is not four ':'-separated 4-digit hex groups")
    return value


def parse_lid(text: str) -> int:
    """`0x1a` -> 26."""
    value = text.strip()
    if not value.startswith("0x"):
        raise MalformedValueError(f"LID {text!r} is not '0x<hex>'")
    digits = value[2:]
    if not digits or len(digits) > 8 or not all(c in "0123456789abcdefABCDEF" for c in digits):
        raise MalformedValueError(f"LID {text[:40]!r} is not '0x<hex>' of at most 32 bits")
    lid = int(digits, 16)
    if lid > _LID_MAX:  # pragma: no cover - 8 hex digits cannot exceed it; kept as the stated bound
        raise MalformedValueError(f"LID {text[:40]!r} is beyond 32 bits")
    return lid


def parse_link_layer(text: str) -> str:
    """`InfiniBand` / `Ethernet` / `Unknown`; tolerates trailing blank lines seen in captures."""
    value = text.strip()
    if not value or any(c.isspace() or c == "\0" for c in value):
        raise MalformedValueError(f"link_layer {text[:40]!r} is not a single word")
    return value


def parse_string(text: str) -> str:
    """Free text such as `fw_ver` or `board_id`: stripped. Empty is the driver saying it has no value
    (rxe, EFA and hns print `fw_ver` as an empty line), not a fault; a NUL is malformed (the kernel
    prints C strings: a NUL is not part of any value)."""
    value = text.strip()
    if not value:
        raise EmptyValueError("empty value")
    if "\0" in value:
        raise MalformedValueError(f"{text[:40]!r} holds a NUL byte")
    return value


def parse_counter(text: str) -> int:
    """A decimal u64 counter. Kernels before ~4.20 print `N/A (no PMA)` when the MAD fails.

    More than 20 digits is checked before `int()`: a 5,000-digit value would otherwise cost a
    quadratic conversion (and Python refuses 4,301 digits with a ValueError of its own).
    """
    if len(text) < 20 and text.isdigit() and text.isascii():  # what the kernel prints: the one check a poll pays
        return int(text)
    value = text.strip()
    if value.startswith("N/A"):
        raise MalformedValueError(f"{value[:40]!r}: the port's PMA did not answer")
    if not _COUNTER.match(value):
        raise MalformedValueError(f"counter {text[:40]!r} is not a decimal number")
    if len(value) > 20 or int(value) > COUNTER_MAX:
        raise MalformedValueError(f"counter {value[:24]!r}... is beyond 64 bits")
    return int(value)


# PMA counter widths (IBA PortCounters); data/packets are 32 or 64 bits depending on the set.
_PMA_WIDTH: Mapping[str, int] = MappingProxyType(
    {
        "symbol_error": 16,
        "link_error_recovery": 8,
        "link_downed": 8,
        "port_rcv_errors": 16,
        "port_rcv_remote_physical_errors": 16,
        "port_rcv_switch_relay_errors": 16,
        "port_xmit_discards": 16,
        "port_xmit_constraint_errors": 8,
        "port_rcv_constraint_errors": 8,
        "local_link_integrity_errors": 4,
        "excessive_buffer_overrun_errors": 4,
        "VL15_dropped": 16,
        "port_xmit_wait": 32,
    }
)
_DATA_COUNTERS = frozenset({"port_xmit_data", "port_rcv_data"})
_SET_DEPENDENT = frozenset({"port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets"})
# Only the extended set (mlx5 and friends) has these; their presence means 64-bit data counters.
_EXTENDED_ONLY = frozenset(
    {"unicast_xmit_packets", "unicast_rcv_packets", "multicast_xmit_packets", "multicast_rcv_packets"}
)


# Read once per device registration (sysfs.c guarantees the first three and node_type).
NODE_GUID = Attribute("node_guid", parse_guid)
SYS_IMAGE_GUID = Attribute("sys_image_guid", parse_guid)
FW_VER = Attribute("fw_ver", parse_string)
HCA_TYPE = Attribute("hca_type", parse_string, NOT_EXPOSED)
BOARD_ID = Attribute("board_id", parse_string, NOT_EXPOSED)
HW_REV = Attribute("hw_rev", parse_string, NOT_EXPOSED)
NODE_TYPE = Attribute("node_type", parse_numbered_state)
DEVICE_STATIC = (NODE_GUID, SYS_IMAGE_GUID, FW_VER, HCA_TYPE, BOARD_ID, HW_REV, NODE_TYPE)
NODE_DESC = Attribute("node_desc", parse_string, NOT_EXPOSED)
DEVICE_POLLED = (NODE_DESC,)  # writable: re-read every poll
STATE = Attribute("state", parse_numbered_state)
PHYS_STATE = Attribute("phys_state", parse_numbered_state)
RATE = Attribute("rate", parse_rate)
LID = Attribute("lid", parse_lid, NOT_EXPOSED)
PORT_POLLED = (STATE, PHYS_STATE, RATE, LID)


@dataclass(frozen=True, slots=True)
class DeviceStatic:
    """A device's `DEVICE_STATIC` files, each field named after its file; None: unreadable."""

    node_guid: str | None
    sys_image_guid: str | None
    fw_ver: str | None
    hca_type: str | None
    board_id: str | None
    hw_rev: str | None
    node_type: NumberedState | None

    @classmethod
    def of(cls, values: Values) -> DeviceStatic:
        v = values  # each field is its file's attribute, in field order
        return cls(v[NODE_GUID], v[SYS_IMAGE_GUID], v[FW_VER], v[HCA_TYPE], v[BOARD_ID], v[HW_REV], v[NODE_TYPE])


@dataclass(frozen=True, slots=True)
class PortPolled:
    """A port's `PORT_POLLED` files, each field named after its file; None: unreadable."""

    state: NumberedState | None
    phys_state: NumberedState | None
    rate: LinkRate | None
    lid: int | None

    @classmethod
    def of(cls, values: Values) -> PortPolled:
        return cls(state=values[STATE], phys_state=values[PHYS_STATE], rate=values[RATE], lid=values[LID])


def port_group(port_dir: str) -> GroupSpec[PortPolled]:
    return GroupSpec(under(port_dir, PORT_POLLED), PortPolled.of, watched=PORT_WATCHED)


def _node_desc(values: Values) -> str | None:
    return values[NODE_DESC]


def device_group(base: str) -> GroupSpec[str | None]:
    """The device's polled files: `node_desc`."""
    return GroupSpec(under(base, DEVICE_POLLED), _node_desc)


# What detection judges (up, flapping, below rated): read on every state pass; the rest of
# PORT_POLLED only when one of these moved, on an announcement, or in rotation.
PORT_WATCHED = (STATE, PHYS_STATE, RATE)
# A change of these reads the port's whole GID table (a flap is when addresses, and GIDs, move).
PORT_STATES = frozenset({"state", "phys_state"})
# counters/ and hw_counters/ files are read per consumer (a scrape, an OTLP export), never by the
# state pass: sources/counters.py.


def pma_counter_width(name: str, extended: bool) -> int:
    if name in _SET_DEPENDENT:
        return 64 if extended else 32
    if name in _EXTENDED_ONLY:
        return 64
    return _PMA_WIDTH.get(name, 64)


def counter_scale(name: str) -> int:
    """`port_{xmit,rcv}_data` count 4-octet words: x4 gives bytes."""
    return 4 if name in _DATA_COUNTERS else 1


def counter_ceiling(name: str, names: Collection[str]) -> int:
    """The value a PMA counter sticks at (2^width-1: they saturate, not wrap); the extended set
    (64-bit data) is recognised by its unicast/multicast files among `names`."""
    return (1 << pma_counter_width(name, any(n in _EXTENDED_ONLY for n in names))) - 1
