"""One moment judged: for every port and device, what is true now and what it is measured against.

Pure: the snapshot, the addresses netlink reports, the persisted state and the settings in; frozen
views out. Events are differences between two of these (`diff.py`); `check` explains one
(`problems.py`); the gauges are drawn from one (`metrics.py`).
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from rnic_exporter.detect.expected import bound_expected
from rnic_exporter.detect.settings import DetectionSettings, RatedExpectation
from rnic_exporter.detect.state import State, device_key, port_key, same_device
from rnic_exporter.model.host import ROCE_V2, AdvertisedLink, Device, GidEntry, PcieLink, Port, ReadError, Snapshot
from rnic_exporter.model.nccl import PICK_PROBLEMS, NcclPick, NcclSettings, judge_pick, uses_roce

PORT, NETDEV, PCIE = "port", "netdev", "pcie"
SOURCE_CONFIG, SOURCE_ETHTOOL, SOURCE_BASELINE, SOURCE_DEVICE = "config", "ethtool", "baseline", "device"
_TOLERANCE = 0.999  # float noise between "400 Gb/sec" parsed and 400e9/8 computed


class AddressLike(Protocol):
    """What detection needs of a netlink address (sources.netlink.IpAddress has it)."""

    @property
    def address(self) -> str: ...

    @property
    def family(self) -> str: ...

    @property
    def flags(self) -> int: ...  # IFA_F_*


# IPv6 privacy (temporary) and deprecated addresses come and go by design: never expected.
IFA_F_TEMPORARY, IFA_F_DEPRECATED = 0x01, 0x20
_TRANSIENT = IFA_F_TEMPORARY | IFA_F_DEPRECATED


@dataclass(frozen=True, slots=True)
class Rated:
    source: str
    rate_bytes_per_second: float | None
    lanes: int | None


@dataclass(frozen=True, slots=True)
class LinkJudgement:
    link: str  # port | netdev | pcie
    below: bool
    active: str  # human text, e.g. "200 Gb/s x4"
    rated: str  # human text with the source, e.g. "400 Gb/s x4 (config)"
    source: str


@dataclass(frozen=True, slots=True)
class PortView:
    device: str
    port: int
    pci_address: str | None
    netdev: str | None
    link_layer: str | None
    up: bool | None
    gid_hash: int | None
    v2_ipv4_index: Mapping[str, int]  # IPv4 address -> index of its RoCE v2 GID
    moved: Mapping[str, tuple[int, int]]  # address -> (remembered index, index now)
    nccl_index: int | None
    configured_index: int | None
    configured_index_valid: bool | None  # None: no index configured, or not a RoCE port
    configured_index_content: str  # what sits at the configured index, for messages
    addresses: Mapping[str, str] | None  # address -> family; None when unknown
    addresses_from: str  # "netlink", or "gid_table" when netlink is unavailable or does not know the netdev
    expected: Mapping[str, bool]  # expected address -> present now (what the state learns from)
    rated: tuple[Rated, ...]
    links: tuple[LinkJudgement, ...]
    flapping: bool
    risks: frozenset[str]
    # The GID NCCL would use, judged; None where NCCL's RoCE path does not apply (InfiniBand, iWARP,
    # a port that is not ACTIVE) or the GID table could not be read (then `gid_table_unreadable`).
    nccl_pick: NcclPick | None = None
    gid_table_unreadable: str | None = None  # what of the table could not be read, on a RoCE port
    state_text: str = ""  # `state / phys_state` as the kernel prints them, for messages
    configured_index_wanted: str = "RoCE v2 IPv4 GID"  # what the configured index must hold (NcclSettings.wanted_gid)

    @property
    def nccl_usable(self) -> bool | None:
        return None if self.nccl_pick is None else self.nccl_pick.usable

    @property
    def configured_index_fault(self) -> str:
        """What is wrong with the GID at the configured index, for messages ('' when nothing)."""
        pick = self.nccl_pick
        if pick is None or not pick.configured or pick.problem is None:
            return ""
        return PICK_PROBLEMS[pick.problem]

    @property
    def judged_pick(self) -> NcclPick | None:
        """The pick for problems and events: a configured index already judged invalid (not the
        GID NCCL's settings want: `configured_index_valid`) is reported once, by that judgement."""
        pick = self.nccl_pick
        return None if pick is not None and pick.configured and self.configured_index_valid is False else pick

    @property
    def key(self) -> tuple[str, int]:
        return (self.device, self.port)

    @property
    def where(self) -> str:
        """How messages name the port: `mlx5_0 port 1 (ens1f0np0)`."""
        return f"{self.device} port {self.port}" + (f" ({self.netdev})" if self.netdev else "")

    def link(self, name: str) -> LinkJudgement | None:
        for judgement in self.links:
            if judgement.link == name:
                return judgement
        return None


@dataclass(frozen=True, slots=True)
class DeviceView:
    key: str
    name: str
    pci_address: str | None
    present: bool
    known: bool  # in the persisted inventory before this poll


@dataclass(frozen=True, slots=True)
class HostConditions:
    time: float
    ports: Mapping[tuple[str, int], PortView]
    devices: Mapping[str, DeviceView]
    expected_devices: int | None = None

    @property
    def present_devices(self) -> int:
        return sum(1 for d in self.devices.values() if d.present)


def _gbps(rate_bytes_per_second: float) -> str:
    return f"{rate_bytes_per_second * 8 / 1e9:g} Gb/s"


def _describe(rate: float | None, lanes: int | None) -> str:
    parts = [_gbps(rate) if rate is not None else "", f"x{lanes}" if lanes else ""]
    return " ".join(p for p in parts if p) or "unknown"


def port_ratings(
    port: Port, expectation: RatedExpectation | None, advertised: AdvertisedLink | None, state: State
) -> tuple[Rated, ...]:
    """Every rating known for the port, best source first."""
    out = []
    if expectation is not None and (expectation.port_rate_gbps is not None or expectation.port_width is not None):
        rate = None if expectation.port_rate_gbps is None else expectation.port_rate_gbps * 1e9 / 8
        out.append(Rated(SOURCE_CONFIG, rate, expectation.port_width))
    if advertised is not None and port.link_layer == "Ethernet":
        out.append(Rated(SOURCE_ETHTOOL, advertised.speed_mbps * 1e6 / 8, advertised.lanes))
    baseline = state.baselines.get(port_key(port.device, port.number))
    if baseline is not None:
        out.append(Rated(SOURCE_BASELINE, baseline.rate_bytes_per_second, baseline.lanes))
    return tuple(out)


def _first(ratings: tuple[Rated, ...], attr: str) -> tuple[float | int | None, str]:
    for rated in ratings:
        value = getattr(rated, attr)
        if value is not None:
            return value, rated.source
    return None, ""


def judge_port_link(port: Port, ratings: tuple[Rated, ...]) -> LinkJudgement | None:
    """Only an ACTIVE port's rate means anything (a down mlx5 port still prints one)."""
    if not port.is_up or port.rate is None:
        return None
    rate, rate_source = _first(ratings, "rate_bytes_per_second")
    lanes, lanes_source = _first(ratings, "lanes")
    if rate is None and lanes is None:
        return None
    below = (rate is not None and port.rate.bytes_per_second < rate * _TOLERANCE) or (
        lanes is not None and port.rate.lanes < lanes
    )
    source = rate_source or lanes_source
    return LinkJudgement(
        PORT,
        below,
        _describe(port.rate.bytes_per_second, port.rate.lanes),
        f"{_describe(rate, int(lanes) if lanes else None)} ({source})",
        source,
    )


def judge_netdev_link(
    port: Port, snap: Snapshot, expectation: RatedExpectation | None, ratings: tuple[Rated, ...]
) -> LinkJudgement | None:
    if port.link_layer != "Ethernet" or port.netdev is None:
        return None  # an IPoIB netdev's speed says nothing about the IB link
    netdev = snap.netdevs.get(port.netdev)
    speed = None if netdev is None else netdev.speed_bytes_per_second
    if speed is None or not speed:
        return None
    if expectation is not None and expectation.netdev_speed_gbps is not None:
        rated: float | None = expectation.netdev_speed_gbps * 1e9 / 8
        source = SOURCE_CONFIG
    else:
        value, source = _first(ratings, "rate_bytes_per_second")
        rated = None if value is None else float(value)
        if source == SOURCE_BASELINE and not _port_mirrors_netdev(port, speed):
            # The baseline is the port's best rate, a measure of the netdev only where the driver
            # reports the netdev's own speed as the port rate (mlx5 does). rxe buckets it: a 50G to
            # 400G netdev is a 100 Gb/s port, 2.5G and 5G a 10 Gb/s one (the kernel lab's tap_speed),
            # and a healthy 50G netdev read as "below rated 100".
            rated = None
    if rated is None:
        return None
    return LinkJudgement(NETDEV, speed < rated * _TOLERANCE, _gbps(speed), f"{_gbps(rated)} ({source})", source)


def _port_mirrors_netdev(port: Port, netdev_bytes_per_second: float) -> bool:
    rate = port.rate
    return rate is not None and abs(rate.bytes_per_second - netdev_bytes_per_second) <= 0.01 * netdev_bytes_per_second


def judge_pcie(link: PcieLink | None, expectation: RatedExpectation | None) -> LinkJudgement | None:
    if link is None or link.current_speed_gts is None or link.current_width is None:
        return None
    speed, width = link.expected_speed_gts, link.expected_width
    source = SOURCE_DEVICE
    if expectation is not None and (expectation.pcie_speed_gts is not None or expectation.pcie_width is not None):
        speed = expectation.pcie_speed_gts if expectation.pcie_speed_gts is not None else speed
        width = expectation.pcie_width if expectation.pcie_width is not None else width
        source = SOURCE_CONFIG
    if speed is None and width is None:
        return None
    below = (speed is not None and link.current_speed_gts < speed) or (width is not None and link.current_width < width)
    rated = " ".join(p for p in (f"{speed:g} GT/s" if speed else "", f"x{width}" if width else "") if p)
    return LinkJudgement(
        PCIE, below, f"{link.current_speed_gts:g} GT/s x{link.current_width}", f"{rated} ({source})", source
    )


# GID tables rarely change between polls; parsing their addresses each poll would cost more than
# reading them. Keyed by the entries themselves (frozen, hashable), so a change is a cache miss.
@functools.lru_cache(maxsize=1024)
def _v2_ipv4_indices(gids: tuple[GidEntry, ...]) -> Mapping[str, int]:
    out: dict[str, int] = {}
    for entry in gids:
        ipv4 = entry.ipv4
        if entry.type == ROCE_V2 and ipv4 is not None and ipv4 not in out:
            out[ipv4] = entry.index
    return MappingProxyType(out)


def v2_ipv4_indices(port: Port) -> Mapping[str, int]:
    """IPv4 address -> index of its RoCE v2 GID (the lowest, should there be two)."""
    return _v2_ipv4_indices(port.gids)


# The files NCCL reads to pick a GID (ibv_query_gid and the types file); ndevs it does not read.
NCCL_GID_FILES = ("gids", "gid_attrs/types/")
# No slot at all: the tree has no gids/ (a partial capture, a masked sysfs), nothing failed to read.
GIDS_MISSING = "gids/ (missing or empty)"


def gid_table_problem(port: Port, errors: tuple[ReadError, ...]) -> str | None:
    """What of a RoCE port's GID table could not be read, None when all of it was."""
    failed = [
        e
        for e in errors
        if e.device == port.device and e.port == port.number and e.attribute.startswith(NCCL_GID_FILES)
    ]
    if failed:
        shown = ", ".join(f"{e.attribute} ({e.kind})" for e in failed[:3])
        return shown + (f" and {len(failed) - 3} more" if len(failed) > 3 else "")
    if port.gid_table_size == 0:  # every RoCE port has slots: the kernel creates gids/ with the port
        return GIDS_MISSING
    return None


def _family(address: str) -> str:
    return "ipv4" if ipaddress.ip_address(address).version == 4 else "ipv6"


@functools.lru_cache(maxsize=1024)
def _gid_table_addresses(gids: tuple[GidEntry, ...], netdev: str | None) -> Mapping[str, str]:
    out: dict[str, str] = {}
    for entry in gids:
        if entry.is_link_local or entry.netdev is None or entry.netdev != netdev:
            continue
        out[entry.address] = _family(entry.address)
    return MappingProxyType(out)


def gid_table_addresses(port: Port) -> Mapping[str, str]:
    """Addresses the GID table shows for the port's netdev: the fallback when netlink is not there."""
    return _gid_table_addresses(port.gids, port.netdev)


@functools.lru_cache(maxsize=4096)
def is_expected_candidate(address: str) -> bool:
    """Addresses worth remembering: link-local ones are regenerated, not configured."""
    ip = ipaddress.ip_address(address)
    return not (ip.is_link_local or ip.is_loopback or ip.is_multicast)


def judge(
    snap: Snapshot,
    state: State,
    settings: DetectionSettings,
    *,
    addresses: Mapping[str, tuple[AddressLike, ...]] | None = None,
    advertised: Mapping[str, AdvertisedLink] | None = None,
    risks: Mapping[str, frozenset[str]] | None = None,
    flapping: Mapping[tuple[str, int], bool] | None = None,
) -> HostConditions:
    """Judge `snap` against the state and settings. `addresses`: netlink's view by netdev, or None."""
    ports: dict[tuple[str, int], PortView] = {}
    devices: dict[str, DeviceView] = {}
    configured = settings.configured_gid_index
    for dev in snap.devices:
        key = device_key(dev)
        inventoried = key in state.devices or any(same_device(k, dev) for k in state.devices.values())
        devices[key] = DeviceView(key, dev.name, dev.pci_address, True, inventoried)
        expectation = settings.expectation_for(dev)
        pcie = judge_pcie(snap.pcie.get(dev.pci_address) if dev.pci_address else None, expectation)
        for port in dev.ports:
            ports[(dev.name, port.number)] = _port_view(
                dev,
                port,
                snap,
                state,
                expectation,
                pcie,
                configured,
                addresses,
                advertised or {},
                risks or {},
                flapping or {},
                settings.nccl,
                settings.address_forget_after_s,
            )
    for key, known in state.devices.items():
        if key in devices or any(same_device(known, dev) for dev in snap.devices):
            continue  # present (under another key while its `device` link fails or failed)
        if known.name in snap.filtered_out:
            continue  # left out by the device filter: not monitored, not gone
        # Listed under its name but not read yet (a first read hung): registered, not gone.
        # The stuck-read metric says what is wrong; "disappeared" would page the wrong runbook.
        listed = known.name in snap.listed_unread
        devices[key] = DeviceView(key, known.name, known.pci_address, listed, True)
    return HostConditions(snap.taken_at, ports, devices, settings.expected_devices)


def _port_view(
    dev: Device,
    port: Port,
    snap: Snapshot,
    state: State,
    expectation: RatedExpectation | None,
    pcie: LinkJudgement | None,
    configured: int | None,
    addresses: Mapping[str, tuple[AddressLike, ...]] | None,
    advertised: Mapping[str, AdvertisedLink],
    risks: Mapping[str, frozenset[str]],
    flapping: Mapping[tuple[str, int], bool],
    nccl: NcclSettings,
    forget_after_s: float,
) -> PortView:
    pk = port_key(dev.name, port.number)
    netdev = port.netdev
    ratings = port_ratings(port, expectation, advertised.get(netdev) if netdev else None, state)
    links = tuple(
        j
        for j in (judge_port_link(port, ratings), judge_netdev_link(port, snap, expectation, ratings), pcie)
        if j is not None
    )
    indices = v2_ipv4_indices(port)
    transient: frozenset[str] = frozenset()
    if addresses is not None and netdev is not None and netdev in addresses:
        current: Mapping[str, str] | None = {a.address: a.family for a in addresses[netdev]}
        transient = frozenset(a.address for a in addresses[netdev] if a.flags & _TRANSIENT)
        source = "netlink"
    elif port.link_layer == "Ethernet" and netdev is not None:
        current, source = gid_table_addresses(port), "gid_table"
    else:
        current, source = None, ""
    # An address missing for longer than the forget period is no longer expected: the state forgets
    # it at the end of this poll, and a file read after days off must not page for it at start-up.
    remembered = {
        a: known
        for a, known in state.addresses.get(pk, {}).items()
        if snap.taken_at - known.last_seen <= forget_after_s or (current is not None and a in current)
    }
    moved = {
        a: (known.v2_index, indices[a])
        for a, known in remembered.items()
        if known.v2_index is not None and a in indices and indices[a] != known.v2_index
    }
    # Expected: what the netdev carried before (remembered) and what it carries now (remembered
    # from this poll on), so the gauge exists from the first poll.
    # Bounded, and only what NCCL and the GID table care about (detect/expected.py).
    expected = (
        bound_expected(
            remembered,
            current,
            [a for a in current if is_expected_candidate(a) and a not in transient],
            gid_table_addresses(port) if port.link_layer == "Ethernet" else None,
            indices,
        )
        if current is not None
        else {}
    )
    # One judgement of the GID NCCL would use, pinned or auto-selected: the gauge of the configured
    # index and the usable gauge come from it, so they agree. Only where NCCL's RoCE path applies
    # (an ACTIVE Ethernet port of a channel adapter): NCCL never uses another port.
    unreadable = gid_table_problem(port, snap.errors) if uses_roce(dev, port) else None
    pick = judge_pick(port, nccl, configured) if uses_roce(dev, port) and unreadable is None else None
    valid = pick.usable if pick is not None and pick.configured else None
    content = pick.content if pick is not None and pick.configured else ""
    return PortView(
        device=dev.name,
        port=port.number,
        pci_address=dev.pci_address,
        netdev=netdev,
        link_layer=port.link_layer,
        up=port.up,
        gid_hash=port.gid_hash if port.gid_table_size else None,
        v2_ipv4_index=indices,
        moved={a: (int(o), n) for a, (o, n) in moved.items()},
        nccl_index=port.nccl_gid_index,
        configured_index=configured if valid is not None else None,
        configured_index_valid=valid,
        configured_index_content=content,
        configured_index_wanted=nccl.wanted_gid,
        addresses=current,
        addresses_from=source,
        expected=expected,
        rated=ratings,
        links=links,
        flapping=flapping.get((dev.name, port.number), False),
        risks=risks.get(netdev, frozenset()) if netdev else frozenset(),
        nccl_pick=pick,
        gid_table_unreadable=unreadable,
        state_text=f"{port.state or '?'} / {port.phys_state or '?'}",
    )
