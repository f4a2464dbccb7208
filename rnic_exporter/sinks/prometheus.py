"""Snapshot -> Prometheus metric families, rendered once per poll and served from memory.

A scrape never touches sysfs and renders nothing new: the agent hands each snapshot to
`PrometheusSink.update`, and scrapes get the cached bytes for their negotiated format.

A poll renders only what changed, too. The snapshot is cut into parts (a device's identity and
PCIe link, a port's state, its counters, its hw counters, its GID table, a netdev); each part is
rendered from a few source objects, and the reading layer reuses those objects while their sysfs
bytes do not change. A part whose sources are the same as last poll keeps its rendered text.
"""

from __future__ import annotations

import gzip
import platform
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from rnic_exporter import __version__, catalog
from rnic_exporter.catalog import MetricSpec
from rnic_exporter.model import CounterValue, Device, GidEntry, Netdev, PcieLink, Port, ReadError, Snapshot
from rnic_exporter.sinks.exposition import Assembler, Family, FamilyBuilder, Fragment, Renderer, negotiate

# Level 1 already shrinks the exposition about 8x; higher levels cost several times the CPU for
# a few percent more.
_GZIP_LEVEL = 1


@dataclass(frozen=True, slots=True)
class ExporterStats:
    """The exporter's own bookkeeping, carried beside each snapshot."""

    polls: int = 0
    read_errors_by_reason: Mapping[str, int] = field(default_factory=dict)
    config_reload_ok: bool = True


class _Samples(Protocol):
    def add(self, spec: MetricSpec, labels: tuple[str, ...], value: float) -> None: ...


def _opt(value: str | None) -> str:
    return "" if value is None else value


# -- the parts of a snapshot, each a function of the sources it is keyed by --------------------


def _device_part(f: _Samples, info: tuple[str, ...], hw_counters: Mapping[str, int], link: PcieLink | None) -> None:
    c = catalog
    name, pci_address = info[0], info[6]
    f.add(c.DEVICE_INFO, info, 1)
    for counter, value in hw_counters.items():
        f.add(c.DEVICE_HW_STAT, (name, counter), value)
    if link is not None and pci_address:
        for kind, gts, width in (("current", link.current_speed_gts, link.current_width),
                                 ("max", link.max_speed_gts, link.max_width),
                                 ("upstream_max", link.upstream_max_speed_gts, link.upstream_max_width)):
            if gts is not None:
                f.add(c.PCIE_LINK_SPEED, (name, pci_address, kind), gts * 1e9)
            if width is not None:
                f.add(c.PCIE_LINK_WIDTH, (name, pci_address, kind), width)


def _port_part(f: _Samples, pl: tuple[str, str], port: Port) -> None:
    """Uses exactly the fields in `_port_source`."""
    c = catalog
    f.add(c.PORT_INFO, (*pl, _opt(port.link_layer), _opt(port.netdev)), 1)
    if port.state is not None:
        f.add(c.PORT_STATE, pl, port.state.number)
    if port.phys_state is not None:
        f.add(c.PORT_PHYSICAL_STATE, pl, port.phys_state.number)
    if port.up is not None:  # unknown (state or phys_state unreadable) stays absent, never 0
        f.add(c.PORT_UP, pl, 1 if port.up else 0)
    if port.rate is not None:
        f.add(c.PORT_ACTIVE_RATE, pl, port.rate.bytes_per_second)
        f.add(c.PORT_ACTIVE_WIDTH, pl, port.rate.lanes)


def _port_source(port: Port) -> tuple[object, ...]:
    return port.link_layer, port.netdev, port.state, port.phys_state, port.rate


def _counters_part(f: _Samples, pl: tuple[str, str], counters: Mapping[str, CounterValue]) -> None:
    c = catalog
    for name, counter in counters.items():
        named = c.NAMED_PMA_COUNTERS.get(name)
        if named is not None:
            f.add(named, pl, counter.value)
        else:
            f.add(c.PORT_PMA, (*pl, name), counter.value)
        f.add(c.PORT_PMA_SATURATED, (*pl, name), 1 if counter.saturated else 0)


def _hw_part(f: _Samples, pl: tuple[str, str], hw_counters: Mapping[str, int]) -> None:
    for name, value in hw_counters.items():
        f.add(catalog.PORT_HW_STAT, (*pl, name), value)


def _gid_part(f: _Samples, pl: tuple[str, str], gids: tuple[GidEntry, ...], size: int, nccl: int | None,
              gid_hash: Callable[[], int]) -> None:
    by_type: dict[str, int] = {}
    for entry in gids:
        f.add(catalog.GID_ENTRY_INFO, (*pl, str(entry.index), entry.gid, _opt(entry.type), _opt(entry.netdev),
                                       _opt(entry.ipv4)), 1)
        by_type[_opt(entry.type)] = by_type.get(_opt(entry.type), 0) + 1
    for gid_type, count in sorted(by_type.items()):
        f.add(catalog.GID_ENTRIES, (*pl, gid_type), count)
    if size:  # no slots read: the table is unknown, and so is NCCL's pick (not "none", -1)
        f.add(catalog.GID_TABLE_SIZE, pl, size)
        f.add(catalog.GID_TABLE_HASH, pl, gid_hash())
        f.add(catalog.NCCL_GID_INDEX, pl, -1 if nccl is None else nccl)


def _netdev_part(f: _Samples, nl: tuple[str, str, str], netdev: Netdev) -> None:
    c = catalog
    speed = netdev.speed_bytes_per_second
    if speed is not None:
        f.add(c.NETDEV_SPEED, nl, speed)
    if netdev.operstate is not None:
        f.add(c.NETDEV_UP, nl, 1 if netdev.operstate == "up" else 0)
    if netdev.carrier_changes is not None:
        f.add(c.NETDEV_CARRIER_CHANGES, nl, netdev.carrier_changes)
    if netdev.mtu is not None:
        f.add(c.NETDEV_MTU, nl, netdev.mtu)


def _errors_part(f: _Samples, errors: tuple[ReadError, ...]) -> None:
    for err in errors:
        f.add(catalog.ATTRIBUTE_UNAVAILABLE, (err.device, "" if err.port is None else str(err.port),
                                              err.attribute, err.kind), 1)


def _unsupported_part(f: _Samples, unsupported: tuple[ReadError, ...]) -> None:
    for err in unsupported:
        f.add(catalog.ATTRIBUTE_UNSUPPORTED, (err.device, "" if err.port is None else str(err.port),
                                              err.attribute, err.kind), 1)


def _own_part(f: _Samples, snap: Snapshot, stats: ExporterStats) -> None:
    c = catalog
    f.add(c.DEVICES, (), len(snap.devices))
    f.add(c.POLL_DURATION, (), snap.read_seconds)
    f.add(c.LAST_POLL, (), snap.taken_at)
    f.add(c.POLLS, (), stats.polls)
    for reason, count in sorted(stats.read_errors_by_reason.items()):
        f.add(c.READ_ERRORS, (reason,), count)
    f.add(c.CONFIG_RELOAD_OK, (), 1 if stats.config_reload_ok else 0)
    f.add(c.BUILD_INFO, (__version__, platform.python_version()), 1)


# (cache key, sources, render function, its arguments after the sample sink); sources None: every poll.
_Part = tuple[tuple[str, ...], object, Callable[..., None], tuple[Any, ...]]


def _device_parts(snap: Snapshot, dev: Device) -> Iterator[_Part]:
    link = snap.pcie.get(dev.pci_address) if dev.pci_address else None
    info = (dev.name, _opt(dev.node_guid), _opt(dev.sys_image_guid), _opt(dev.fw_ver), _opt(dev.hca_type),
            _opt(dev.board_id), _opt(dev.pci_address))
    yield ("device", dev.name), (info, dev.hw_counters, link), _device_part, (info, dev.hw_counters, link)
    for port in dev.ports:
        pl = (dev.name, str(port.number))
        yield ("port", *pl), _port_source(port), _port_part, (pl, port)
        yield ("counters", *pl), port.counters, _counters_part, (pl, port.counters)
        yield ("hw", *pl), port.hw_counters, _hw_part, (pl, port.hw_counters)
        yield (("gids", *pl), (port.gids, port.gid_table_size, port.nccl_gid_index), _gid_part,
               (pl, port.gids, port.gid_table_size, port.nccl_gid_index, lambda p=port: p.gid_hash))
        for netdev_name in port.netdevs:
            netdev = snap.netdevs.get(netdev_name)
            if netdev is not None:
                yield ("netdev", *pl, netdev_name), netdev, _netdev_part, ((*pl, netdev_name), netdev)


def _device_sources(snap: Snapshot, dev: Device) -> tuple[object, ...]:
    """Every object a device's parts are rendered from."""
    link = snap.pcie.get(dev.pci_address) if dev.pci_address else None
    return dev, link, *(snap.netdevs.get(name) for port in dev.ports for name in port.netdevs)


def _snapshot_parts(snap: Snapshot, stats: ExporterStats) -> Iterator[_Part]:
    yield ("errors",), snap.errors, _errors_part, (snap.errors,)
    yield ("unsupported",), snap.unsupported, _unsupported_part, (snap.unsupported,)
    yield ("own",), None, _own_part, (snap, stats)


def _parts(snap: Snapshot, stats: ExporterStats) -> Iterator[_Part]:
    """The snapshot's parts in exposition order."""
    for dev in snap.devices:
        yield from _device_parts(snap, dev)
    yield from _snapshot_parts(snap, stats)


def snapshot_families(snap: Snapshot, stats: ExporterStats) -> Iterator[Family]:
    """Every family for one snapshot; unreadable values are absent (and counted), never 0."""
    f = FamilyBuilder()
    for _key, _sources, render, args in _parts(snap, stats):
        render(f, *args)
    yield from f


@dataclass(slots=True)
class _Rendered:
    sources: object
    fragment: Fragment


class PrometheusSink:
    """Holds the exposition of the last snapshot, rendered once per poll in both formats."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._assembler = Assembler()
        self._parts: dict[tuple[str, ...], _Rendered] = {}
        # Per device: the objects its parts came from, its fragments, its parts by key.
        self._devices: dict[str, tuple[tuple[object, ...], list[Fragment], dict[tuple[str, ...], _Rendered]]] = {}
        self._bodies: dict[tuple[bool, bool], bytes] = {}  # (openmetrics, gzip) -> body
        self._negotiated: dict[str | None, tuple[str, bool]] = {}

    def update(self, snap: Snapshot, stats: ExporterStats, extra: Iterable[Family] = ()) -> None:
        """Render `snap` plus `extra` families (detection state, OTLP counters) for the next scrapes."""
        previous = self._parts
        parts: dict[tuple[str, ...], _Rendered] = {}
        devices: dict[str, tuple[tuple[object, ...], list[Fragment], dict[tuple[str, ...], _Rendered]]] = {}
        fragments: list[Fragment] = []
        for dev in snap.devices:
            sources = _device_sources(snap, dev)
            before = self._devices.get(dev.name)
            if before is not None and len(before[0]) == len(sources) and all(
                    a is b for a, b in zip(before[0], sources, strict=True)):
                own_parts, own_fragments = before[2], before[1]  # not one object of the device changed
            else:
                own_parts = {}
                own_fragments = [self._part(previous, own_parts, *part) for part in _device_parts(snap, dev)]
            devices[dev.name] = (sources, own_fragments, own_parts)
            parts.update(own_parts)
            fragments += own_fragments
        self._devices = devices
        fragments += [self._part(previous, parts, *part) for part in _snapshot_parts(snap, stats)]
        for family in extra:
            samples = tuple(family.samples)
            fragments.append(self._part(previous, parts, ("extra", family.spec.name), (family.spec, samples),
                                        Fragment.add_family, (family.spec, samples)))
        self._parts = parts
        text, om = self._assembler.join(fragments)
        bodies = {(False, False): text, (True, False): om}
        with self._lock:
            self._bodies = bodies

    @staticmethod
    def _part(previous: dict[tuple[str, ...], _Rendered], parts: dict[tuple[str, ...], _Rendered],
              key: tuple[str, ...], sources: object, render: Callable[..., None], args: tuple[Any, ...]) -> Fragment:
        before = previous.get(key)
        # `==` on the sources tuple compares identities first: reused objects cost nothing.
        if before is not None and sources is not None and before.sources == sources:
            parts[key] = before
            return before.fragment
        fragment = Fragment(before.fragment.lines if before is not None else None)
        render(fragment, *args)
        parts[key] = _Rendered(sources, fragment.done())
        return fragment

    def render(self, accept_header: str | None, accept_encoding: str | None) -> tuple[bytes, dict[str, str]]:
        negotiated = self._negotiated.get(accept_header)
        if negotiated is None:
            negotiated = negotiate(accept_header)
            if len(self._negotiated) < 64:  # scrapers send a handful of distinct headers
                self._negotiated[accept_header] = negotiated
        content_type, openmetrics = negotiated
        gz = "gzip" in (accept_encoding or "")
        with self._lock:
            bodies = self._bodies
            body = bodies.get((openmetrics, gz))
            if body is None:
                body = bodies.get((openmetrics, False), b"# EOF\n" if openmetrics else b"")
                if gz:
                    # Once per poll, for the first scraper that asks: under the lock, so concurrent
                    # gzip scrapers wait for that one instead of compressing again.
                    body = bodies[(openmetrics, True)] = _gzip(body)
        headers = {"Content-Type": content_type}
        if gz:
            headers["Content-Encoding"] = "gzip"
        return body, headers


def _gzip(body: bytes) -> bytes:
    return gzip.compress(body, compresslevel=_GZIP_LEVEL, mtime=0)


def render_text(snap: Snapshot, stats: ExporterStats | None = None) -> str:
    """The text exposition (0.0.4) of one snapshot; for golden tests and `promtool check metrics`."""
    text, _ = Renderer().render(snapshot_families(snap, stats or ExporterStats()))
    return text.decode()
