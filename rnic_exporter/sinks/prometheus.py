"""Snapshot -> Prometheus metric families, rendered once per poll and served from memory.

A scrape never touches sysfs and renders nothing new: the agent hands each snapshot to
`PrometheusSink.update`, and scrapes get the cached bytes for their negotiated format.
"""

from __future__ import annotations

import gzip
import itertools
import platform
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.exposition import choose_encoder

from rnic_exporter import __version__, catalog
from rnic_exporter.catalog import MetricSpec
from rnic_exporter.model import Port, Snapshot
from rnic_exporter.sinks.exposition import Family, Renderer

# Level 1 already shrinks the exposition about 8x; higher levels cost several times the CPU for
# a few percent more, and this runs on every poll a gzip-asking scraper (Prometheus) is around.
_GZIP_LEVEL = 1


@dataclass(frozen=True, slots=True)
class ExporterStats:
    """The exporter's own bookkeeping, carried beside each snapshot."""

    polls: int = 0
    read_errors_by_reason: Mapping[str, int] = field(default_factory=dict)
    config_reload_ok: bool = True


class _Families:
    """Samples grouped by metric, in first-seen order, so each metric is declared exactly once."""

    def __init__(self) -> None:
        self._by_spec: dict[str, Family] = {}

    def add(self, spec: MetricSpec, labels: tuple[str, ...], value: float) -> None:
        family = self._by_spec.get(spec.name)
        if family is None:
            family = self._by_spec[spec.name] = Family(spec)
        family.samples.append((labels, value))

    def __iter__(self) -> Iterator[Family]:
        return iter(self._by_spec.values())


def _opt(value: str | None) -> str:
    return "" if value is None else value


def snapshot_families(snap: Snapshot, stats: ExporterStats) -> Iterator[Family]:
    """Every family for one snapshot; unreadable values are absent (and counted), never 0."""
    f = _Families()
    c = catalog
    for dev in snap.devices:
        f.add(c.DEVICE_INFO, (dev.name, _opt(dev.node_guid), _opt(dev.sys_image_guid), _opt(dev.fw_ver),
                              _opt(dev.hca_type), _opt(dev.board_id), _opt(dev.pci_address)), 1)
        for name, value in dev.hw_counters.items():
            f.add(c.DEVICE_HW_STAT, (dev.name, name), value)
        link = snap.pcie.get(dev.pci_address) if dev.pci_address else None
        if link is not None and dev.pci_address is not None:
            for kind, gts, width in (("current", link.current_speed_gts, link.current_width),
                                     ("max", link.max_speed_gts, link.max_width),
                                     ("upstream_max", link.upstream_max_speed_gts, link.upstream_max_width)):
                if gts is not None:
                    f.add(c.PCIE_LINK_SPEED, (dev.name, dev.pci_address, kind), gts * 1e9)
                if width is not None:
                    f.add(c.PCIE_LINK_WIDTH, (dev.name, dev.pci_address, kind), width)
        for port in dev.ports:
            pl = (dev.name, str(port.number))
            f.add(c.PORT_INFO, (*pl, _opt(port.link_layer), _opt(port.netdev)), 1)
            if port.state is not None:
                f.add(c.PORT_STATE, pl, port.state.number)
            if port.phys_state is not None:
                f.add(c.PORT_PHYSICAL_STATE, pl, port.phys_state.number)
            if port.state is not None and port.phys_state is not None:
                f.add(c.PORT_UP, pl, 1 if port.is_up else 0)
            if port.rate is not None:
                f.add(c.PORT_ACTIVE_RATE, pl, port.rate.bytes_per_second)
                f.add(c.PORT_ACTIVE_WIDTH, pl, port.rate.lanes)
            for name, counter in port.counters.items():
                named = c.NAMED_PMA_COUNTERS.get(name)
                if named is not None:
                    f.add(named, pl, counter.value)
                else:
                    f.add(c.PORT_PMA, (*pl, name), counter.value)
                f.add(c.PORT_PMA_SATURATED, (*pl, name), 1 if counter.saturated else 0)
            for name, value in port.hw_counters.items():
                f.add(c.PORT_HW_STAT, (*pl, name), value)
            _gid_families(f, port)
            for netdev_name in port.netdevs:
                netdev = snap.netdevs.get(netdev_name)
                if netdev is None:
                    continue
                nl = (*pl, netdev_name)
                speed = netdev.speed_bytes_per_second
                if speed is not None:
                    f.add(c.NETDEV_SPEED, nl, speed)
                if netdev.operstate is not None:
                    f.add(c.NETDEV_UP, nl, 1 if netdev.operstate == "up" else 0)
                if netdev.carrier_changes is not None:
                    f.add(c.NETDEV_CARRIER_CHANGES, nl, netdev.carrier_changes)
                if netdev.mtu is not None:
                    f.add(c.NETDEV_MTU, nl, netdev.mtu)
    for err in snap.errors:
        f.add(c.ATTRIBUTE_UNAVAILABLE, (err.device, "" if err.port is None else str(err.port),
                                        err.attribute, err.kind), 1)
    f.add(c.DEVICES, (), len(snap.devices))
    f.add(c.POLL_DURATION, (), snap.read_seconds)
    f.add(c.LAST_POLL, (), snap.taken_at)
    f.add(c.POLLS, (), stats.polls)
    for reason, count in sorted(stats.read_errors_by_reason.items()):
        f.add(c.READ_ERRORS, (reason,), count)
    f.add(c.CONFIG_RELOAD_OK, (), 1 if stats.config_reload_ok else 0)
    f.add(c.BUILD_INFO, (__version__, platform.python_version()), 1)
    yield from f


def _gid_families(f: _Families, port: Port) -> None:
    pl = (port.device, str(port.number))
    by_type: dict[str, int] = {}
    for entry in port.gids:
        f.add(catalog.GID_ENTRY_INFO, (*pl, str(entry.index), entry.gid, _opt(entry.type), _opt(entry.netdev),
                                       _opt(entry.ipv4)), 1)
        by_type[_opt(entry.type)] = by_type.get(_opt(entry.type), 0) + 1
    for gid_type, count in sorted(by_type.items()):
        f.add(catalog.GID_ENTRIES, (*pl, gid_type), count)
    if port.gid_table_size:
        f.add(catalog.GID_TABLE_SIZE, pl, port.gid_table_size)
        f.add(catalog.GID_TABLE_HASH, pl, port.gid_hash)
    f.add(catalog.NCCL_GID_INDEX, pl, -1 if port.nccl_gid_index is None else port.nccl_gid_index)


class PrometheusSink:
    """Holds the exposition of the last snapshot, rendered once per poll in both formats."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._renderer = Renderer()
        self._bodies: dict[tuple[bool, bool], bytes] = {}  # (openmetrics, gzip) -> body
        self._gzip_wanted: set[bool] = set()  # formats scrapers asked gzipped: compressed eagerly

    def update(self, snap: Snapshot, stats: ExporterStats, extra: Iterable[Family] = ()) -> None:
        """Render `snap` plus `extra` families (detection state, OTLP counters) for the next scrapes."""
        text, om = self._renderer.render(itertools.chain(snapshot_families(snap, stats), extra))
        bodies = {(False, False): text, (True, False): om}
        for openmetrics in list(self._gzip_wanted):
            bodies[(openmetrics, True)] = _gzip(bodies[(openmetrics, False)])
        with self._lock:
            self._bodies = bodies

    def render(self, accept_header: str | None, accept_encoding: str | None) -> tuple[bytes, dict[str, str]]:
        _, content_type = choose_encoder(accept_header or "")
        openmetrics = content_type.startswith("application/openmetrics-text")
        gz = "gzip" in (accept_encoding or "")
        with self._lock:
            bodies = self._bodies
        body = bodies.get((openmetrics, gz))
        if body is None:
            plain = bodies.get((openmetrics, False), b"# EOF\n" if openmetrics else b"")
            body = _gzip(plain) if gz else plain
            if gz:
                with self._lock:
                    if self._bodies is bodies:
                        bodies[(openmetrics, True)] = body
                    self._gzip_wanted.add(openmetrics)
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
