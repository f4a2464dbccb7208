"""Typed, immutable snapshots of the RNICs on one host.

The reading layer (`rnic_exporter.sources`) fills these; detection and the sinks only read them.
A value that could not be read is ``None`` and a `ReadError` in `Snapshot.errors` says why, so
"unreadable" never looks like 0.

The contract between the reading layer and its consumers: **an object is reused exactly while
every byte behind it is unchanged.** A `Device`, `Port`, `Netdev`, `PcieLink`, a port's `gids`
tuple or counter mapping is the very same object from one pass to the next while nothing it was
built from changed, and a new object whenever something did (even when the new one compares
equal). A consumer may therefore keep what it derived from an object keyed by its identity
(`is`), and `Snapshot` itself is the previous pass's object when no device changed (the reading
layer keeps it in `sources/plan.py`: a group's object is built again only when the bytes of one
of its files changed, and in `sources/device_reader.py` for the ports and devices holding them).
Counters are the exception by design: they are read per consumer into `CounterGroup`s of plain
ints, whose `version` changes whenever their values do.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
_LINK_LOCAL_PREFIX = "fe80:0000:0000:0000:"
_IPV4_MAPPED_PREFIX = "0000:0000:0000:0000:0000:ffff:"

ROCE_V1 = "IB/RoCE v1"
ROCE_V2 = "RoCE v2"


def _empty_map() -> Mapping[str, int]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class NumberedState:
    """A kernel `"<number>: <name>"` value such as port `state` `4: ACTIVE`."""

    number: int
    name: str

    def __str__(self) -> str:
        return f"{self.number}: {self.name}"


@dataclass(frozen=True, slots=True)
class LinkRate:
    """Port `rate`, e.g. `400 Gb/sec (4X NDR)`: total Gb/s, lane count and speed generation."""

    gbps: float
    lanes: int
    speed: str

    @property
    def per_lane_gbps(self) -> float:
        lanes = finite_float(self.lanes) if self.lanes > 0 else None  # parse_rate gives 1-12 lanes
        return math.nan if lanes is None else self.gbps / lanes

    @property
    def bits_per_second(self) -> float:
        return self.gbps * 1e9

    @property
    def bytes_per_second(self) -> float:
        return self.gbps * 1e9 / 8


@dataclass(frozen=True, slots=True)
class ReadError:
    """One attribute that could not be read or parsed; everything else was still read."""

    device: str
    port: int | None
    attribute: str  # path relative to the object it belongs to, e.g. "ports/1/rate"
    reason: str  # "EINVAL", "ENOENT", "malformed: ..." - short, stable, fit for a label

    @property
    def kind(self) -> str:
        """The reason's class, low-cardinality for labels: the errno name or `malformed`."""
        return self.reason.split(":", 1)[0]

    def where(self) -> str:
        port = f" port {self.port}" if self.port is not None else ""
        return f"{self.device}{port} {self.attribute}"


@dataclass(frozen=True, slots=True)
class CounterValue:
    """A PMA or hw counter. `value` is in base units (bytes for the data counters)."""

    value: int
    saturated: bool = False  # PMA counters stick at 2^n-1 instead of wrapping


@dataclass(frozen=True, slots=True)
class GidEntry:
    """One populated slot of a port's GID table (`gids/<i>` + `gid_attrs/{types,ndevs}/<i>`)."""

    index: int
    gid: str  # as the kernel prints it: eight 4-digit lowercase hex groups
    type: str | None  # "IB/RoCE v1" | "RoCE v2"; None when unreadable
    netdev: str | None  # None for InfiniBand GIDs (the kernel answers EINVAL)

    @property
    def ipv4(self) -> str | None:
        """The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`), else None."""
        return _gid_addresses(self.gid)[0]

    @property
    def address(self) -> str:
        """The GID as an IP address string (IPv4 for mapped GIDs, compressed IPv6 otherwise); a
        GID that is no IPv6 address (parse_gid never gives one) stays as it is."""
        return _gid_addresses(self.gid)[1]

    @property
    def is_link_local(self) -> bool:
        return self.gid.startswith(_LINK_LOCAL_PREFIX)

    @property
    def roce_version(self) -> int | None:
        """1 for `IB/RoCE v1` (or `RoCE v1`), 2 for `RoCE v2`, as NCCL reads the type file."""
        if self.type is None:
            return None
        if self.type.startswith(("IB/RoCE v1", "RoCE v1")):
            return 1
        if self.type.startswith("RoCE v2"):
            return 2
        return None

    @property
    def version_label(self) -> str:
        """`v1` / `v2` as `show_gids` prints it (the type from its first `v`)."""
        if self.type is None:
            return "?"
        pos = self.type.lower().find("v")
        return self.type[pos:] if pos >= 0 else self.type


@functools.lru_cache(maxsize=1024)
def _gid_addresses(gid: str) -> tuple[str | None, str]:
    """(IPv4 of a mapped GID or None, the GID as an address string). Cached: detection asks for
    every populated GID of every port each time it runs, and a host has a few dozen of them."""
    try:
        ip = ipaddress.IPv6Address(gid)
    except ValueError:
        return None, gid
    if gid.startswith(_IPV4_MAPPED_PREFIX) and ip.ipv4_mapped is not None:
        ipv4 = str(ip.ipv4_mapped)
        return ipv4, ipv4
    return None, str(ip)


def finite_float(value: float) -> float | None:
    """`value` as a float, or None when it is beyond float range (an int of more than 308 digits)
    or not finite: such a value cannot be represented, and "unavailable" is never shown as inf."""
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


@functools.lru_cache(maxsize=1024)  # asked every poll by detection and rendering; tables rarely change
def gid_table_hash(entries: tuple[GidEntry, ...]) -> int:
    """A stable hash of the populated slots, below 2^53 so a float64 sample holds it exactly."""
    text = "\n".join(f"{e.index} {e.gid} {e.type} {e.netdev}" for e in entries)
    # surrogatepass: a name from a listing may hold PEP 383 surrogates; the hash must not raise on it
    return int.from_bytes(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:8], "big") >> 11


@dataclass(frozen=True, slots=True)
class Port:
    device: str
    number: int
    link_layer: str | None  # "InfiniBand" | "Ethernet" | "Unknown"
    state: NumberedState | None
    phys_state: NumberedState | None
    rate: LinkRate | None
    lid: int | None
    counters: Mapping[str, CounterValue] = field(default_factory=dict)  # counters/*
    hw_counters: Mapping[str, int] = field(default_factory=_empty_map)  # hw_counters/* but lifespan
    gids: tuple[GidEntry, ...] = ()
    gid_table_size: int = 0
    netdevs: tuple[str, ...] = ()  # best first: ndevs of the default GID, then device/net
    nccl_gid_index: int | None = None  # what NCCL's auto-selection would pick now

    @property
    def is_up(self) -> bool:
        """ACTIVE and LinkUp: the only state in which `rate` means anything."""
        return (
            self.state is not None
            and self.state.number == 4
            and self.phys_state is not None
            and self.phys_state.number == 5
        )

    @property
    def up(self) -> bool | None:
        """`is_up` where the files tell: None while it depends on a state that is unknown (a
        missing or unreadable `state`/`phys_state` is not "down")."""
        if (self.state is not None and self.state.number != 4) or (
            self.phys_state is not None and self.phys_state.number != 5
        ):
            return False
        return None if self.state is None or self.phys_state is None else True

    @property
    def netdev(self) -> str | None:
        return self.netdevs[0] if self.netdevs else None

    @property
    def gid_hash(self) -> int:
        return gid_table_hash(self.gids)

    def gid(self, index: int) -> GidEntry | None:
        for entry in self.gids:
            if entry.index == index:
                return entry
        return None


@dataclass(frozen=True, slots=True)
class Device:
    name: str
    node_guid: str | None
    sys_image_guid: str | None
    fw_ver: str | None
    hca_type: str | None
    board_id: str | None
    hw_rev: str | None
    node_type: NumberedState | None
    node_desc: str | None
    pci_address: str | None  # basename of realpath(device), None for software devices
    ports: tuple[Port, ...] = ()
    hw_counters: Mapping[str, int] = field(default_factory=_empty_map)  # device-wide hw_counters/*
    netdevs: tuple[str, ...] = ()  # device/net/*


@dataclass(frozen=True, slots=True)
class Netdev:
    """`/sys/class/net/<name>/`. `speed_mbps` is -1 without carrier; None when admin down."""

    name: str
    ifindex: int | None
    address: str | None
    mtu: int | None
    speed_mbps: int | None
    operstate: str | None
    carrier: bool | None
    carrier_changes: int | None
    carrier_up_count: int | None
    carrier_down_count: int | None
    pci_address: str | None

    @property
    def speed_bytes_per_second(self) -> float | None:
        if self.speed_mbps is None or self.speed_mbps < 0:
            return None
        mbps = finite_float(self.speed_mbps)  # parse_int bounds it to 32 bits; a constructor may not
        return None if mbps is None else finite_float(mbps * 1e6 / 8)


@dataclass(frozen=True, slots=True)
class PcieLink:
    """Link attributes of one PCI function (`current_link_*`, `max_link_*`)."""

    pci_address: str
    current_speed_gts: float | None
    max_speed_gts: float | None
    current_width: int | None
    max_width: int | None
    # The upstream port's capability: a x16 card in a x8 slot is not "downtrained".
    upstream_max_speed_gts: float | None = None
    upstream_max_width: int | None = None
    # AER errors the function reported since boot, by severity (correctable, nonfatal, fatal);
    # only those whose file exists and reads (AER off: none).
    aer_errors: tuple[tuple[str, int], ...] = ()

    def aer(self, severity: str) -> int | None:
        return dict(self.aer_errors).get(severity)

    @property
    def expected_speed_gts(self) -> float | None:
        values = [v for v in (self.max_speed_gts, self.upstream_max_speed_gts) if v]
        return min(values) if values else None

    @property
    def expected_width(self) -> int | None:
        values = [v for v in (self.max_width, self.upstream_max_width) if v]
        return min(values) if values else None


PCIE_GENERATIONS: Mapping[float, int] = MappingProxyType({2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6})


def pcie_generation(gts: float | None) -> int | None:
    return None if gts is None else PCIE_GENERATIONS.get(gts)


@dataclass(frozen=True, slots=True)
class Snapshot:
    devices: tuple[Device, ...]
    netdevs: Mapping[str, Netdev]
    pcie: Mapping[str, PcieLink]
    errors: tuple[ReadError, ...]
    taken_at: float  # wall clock, seconds since the epoch
    read_seconds: float = 0.0
    # What the drivers do not provide (sources.availability): no value, and no fault either.
    unsupported: tuple[ReadError, ...] = ()
    # Devices the listing shows that were never read whole (a first read still hung, an unreadable
    # `device` link): registered, so not "disappeared", but nothing about them is known yet.
    listed_unread: tuple[str, ...] = ()
    # Devices the listing shows that --collector.infiniband.device-include/-exclude leave out: a
    # filter that leaves out every device is a misconfiguration, not a host without RDMA.
    filtered_out: tuple[str, ...] = ()

    @property
    def ports(self) -> tuple[Port, ...]:
        return tuple(port for device in self.devices for port in device.ports)

    def device(self, name: str) -> Device | None:
        for device in self.devices:
            if device.name == name:
                return device
        return None

    def port(self, device: str, number: int) -> Port | None:
        dev = self.device(device)
        if dev is None:
            return None
        for port in dev.ports:
            if port.number == number:
                return port
        return None


@dataclass(slots=True)
class CounterGroup:
    """One object's counter files: a port's `counters/` or `hw_counters/`, or the device's `hw_counters/`.

    `values` holds base units (`port_{xmit,rcv}_data` x4: bytes), None while unreadable; it is
    replaced, never mutated, so a reader on another thread sees one whole pass or the previous one.
    `version` changes whenever a value, a saturation flag or an error of the group does.
    """

    kind: str  # "counters" (PMA) or "hw"
    port: int | None  # None: device-wide
    names: tuple[str, ...]
    start: int  # slice of the plan's slots
    ceilings: tuple[int | None, ...]  # PMA saturation value per file (2^width-1); None for hw counters
    scales: tuple[int, ...]
    values: list[int | None] = field(default_factory=list)
    saturated: list[bool] = field(default_factory=list)
    # What the latest version changed (indices into `names`), and whether a value appeared or went:
    # a consumer one version behind re-renders only these.
    changed: tuple[int, ...] = ()
    reshaped: bool = False
    version: int = 0  # written last: who reads it first sees values at least that new
    _mapping: tuple[int, Mapping[str, CounterValue] | Mapping[str, int]] | None = None

    @property
    def end(self) -> int:
        return self.start + len(self.names)

    def as_mapping(self) -> Mapping[str, CounterValue] | Mapping[str, int]:
        """The values as the model carries them (one-shot reads, `show`): built once per version."""
        cached = self._mapping
        if cached is not None and cached[0] == self.version:
            return cached[1]
        mapping: Mapping[str, CounterValue] | Mapping[str, int]
        if self.kind == "counters":
            mapping = {
                n: CounterValue(v, s)
                for n, v, s in zip(self.names, self.values, self.saturated, strict=True)
                if v is not None
            }
        else:
            mapping = {n: v for n, v in zip(self.names, self.values, strict=True) if v is not None}
        self._mapping = (self.version, mapping)
        return mapping


@dataclass(frozen=True, slots=True)
class DeviceFreshness:
    """How fresh one device's data is."""

    name: str
    stuck: bool  # a read of it has been blocking longer than the read deadline
    state_at: float | None  # wall clock of its last finished state read
    counters_at: float | None  # ... and counter read
    backed_off: tuple[tuple[int | None, str, float], ...] = ()  # (port, attribute, back-off seconds)
    fallback: bool | None = None  # every attribute polled fast: announcements not trusted for it (None: no pass yet)
    read_path: tuple[str, str] | None = None  # how its hw counters are read: (path, reason code)
    reads: tuple[tuple[str, int], ...] = ()  # (kind, reads so far): what its reads cost the NIC


@dataclass(frozen=True, slots=True)
class AdvertisedLink:
    speed_mbps: int
    lanes: int | None


# Why a RoCE netdev may lose its addresses on a port flap (sources/address_risks.py finds them).
NETWORKMANAGER = "networkmanager"
IPV6_KEEP_ADDR_OFF = "ipv6_keep_addr_on_down_off"
