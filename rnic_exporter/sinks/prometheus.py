"""The Prometheus sink: the exposition of the last poll's state plus counters read for each scrape.

State (identity, port state, GID tables, netdevs, detection) changes rarely: each `publish` renders
the parts whose source objects changed and keeps the rest (the reading layer reuses unchanged
objects, `model/host.py`). Counters change all the time on a training node and feed nothing but the
consumers, so they are read when a scrape asks (`CounterFeed`): concurrent scrapes share one counter
pass, a pass under a second old is reused, and only groups whose values moved are re-rendered,
straight from the pass's plain ints into series lines. A scrape waits for the pass at most
`wait_s` (`--web.counter-wait`); then it serves the last values and says so in
`rnic_exporter_counters_stale`.

Before the first poll there is nothing to serve: a scrape waits for it as long as for a counter pass
and then gets 503 (`NotReadyError`). An empty 200 would read to Prometheus as "every series ended" (stale
markers, resolved alerts, `absent()` firing) on each restart.
"""

from __future__ import annotations

import gzip
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from prometheus_client.exposition import gzip_accepted

from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.catalog.metrics import MetricSpec
from rnic_exporter.config.serve import DEFAULT_COUNTER_WAIT_S
from rnic_exporter.errors import NotReadyError
from rnic_exporter.model.host import CounterGroup, Snapshot
from rnic_exporter.sinks.exposition import (
    Assembler,
    Exposition,
    Fragment,
    go_float,
    negotiate,
    series_line,
)
from rnic_exporter.sinks.registry import SelfMetrics
from rnic_exporter.sinks.samples import (
    CounterSlot,
    ExporterStats,
    Published,
    device_parts,
    snapshot_parts,
)

# Level 1 already shrinks the exposition about 8x; higher levels cost several times the CPU for
# a few percent more.
GZIP_LEVEL = 1
_GZIP_WBITS = 16 + zlib.MAX_WBITS  # a gzip header and trailer, as gzip.compress writes


@dataclass(frozen=True, slots=True)
class CounterView:
    """What one counter pass left: every device's counter groups, and the exporter's own stats."""

    groups: dict[tuple[str, str, int | None], CounterGroup]  # (device, kind, port)
    stats: ExporterStats
    generation: int  # changes with every pass (and every stale answer)


class CounterFeed(Protocol):
    def __call__(self, wait_s: float | None) -> CounterView: ...


class _CounterLines:
    """One counter group's series lines, re-formatted only for values that moved.

    The lines sit in one flat list, metric after metric (`_spans`), so a pass writes each moved
    value's line into its cell and joins each metric's run of cells: a handful of operations per
    value, whatever the metric."""

    __slots__ = (
        "_cells",
        "_last",
        "_lines",
        "_metric",
        "_prefix",
        "_sat",
        "_sat_metric",
        "_sat_pos",
        "_spans",
        "_value_pos",
        "chunks",
        "layout",
        "specs",
        "version",
    )

    def __init__(self, device: str, group: CounterGroup) -> None:
        c = catalog
        self.version = -1
        self.chunks: list[tuple[MetricSpec, str]] = []
        self.layout: tuple[str, ...] = ()
        n = len(group.names)
        self._last: list[int | None] = [None] * n
        self._lines: list[str] = [""] * n
        self._prefix: list[str] = []
        self._metric: list[int] = []
        self._sat: list[str] = []  # counters: the port's saturation line for 0..n counters stuck
        self._cells: list[str] = []
        self._spans: list[tuple[MetricSpec, int, int]] = []
        self._value_pos: list[int] = [0] * n  # each value's cell
        self._sat_pos = -1  # the cell of the port's saturation line
        specs: list[MetricSpec] = []
        port = "" if group.port is None else str(group.port)

        def metric(spec: MetricSpec) -> int:
            if spec not in specs:
                specs.append(spec)
            return specs.index(spec)

        for name in group.names:
            labels: tuple[str, ...]
            if group.port is None:
                spec, labels = c.DEVICE_HW_STAT, (device, name)
            elif group.kind == "hw":
                spec, labels = c.PORT_HW_STAT, (device, port, name)
            else:
                named = c.NAMED_PMA_COUNTERS.get(name)
                spec, labels = (named, (device, port)) if named is not None else (c.PORT_PMA, (device, port, name))
            self._metric.append(metric(spec))
            line = series_line(spec, labels, 0)
            self._prefix.append(line[: line.rfind(" ") + 1])
        if group.kind == "counters" and group.port is not None:
            sat = c.PORT_PMA_SATURATED
            metric(sat)
            self._sat = [series_line(sat, (device, port), k) for k in range(n + 1)]
        self.specs = tuple(specs)
        self._sat_metric = specs.index(c.PORT_PMA_SATURATED) if self._sat else -1

    def update(self, group: CounterGroup) -> None:
        if group.version == self.version:
            return
        if group.version == self.version + 1 and not group.reshaped and self.version >= 0:
            self._patch(group)  # one pass behind: only the values that pass changed
        else:
            self._rebuild(group)
        self.version = group.version

    def _rebuild(self, group: CounterGroup) -> None:
        """Lay the cells out again: which values are present decides which lines and metrics exist."""
        values, saturated = group.values, group.saturated
        by_metric: list[list[int]] = [[] for _ in self.specs]  # per metric, its values' k
        order: list[int] = []
        sat, s = self._sat, self._sat_metric
        last, lines, prefix, metric = self._last, self._lines, self._prefix, self._metric
        for k, value in enumerate(values):
            if value is None:
                continue
            if last[k] != value or not lines[k]:
                lines[k] = f"{prefix[k]}{go_float(value)}\n"
                last[k] = value
            m = metric[k]
            if not by_metric[m]:
                order.append(m)
            by_metric[m].append(k)
        cells: list[str] = []
        spans: list[tuple[MetricSpec, int, int]] = []
        for m in order:
            start = len(cells)
            for k in by_metric[m]:
                self._value_pos[k] = len(cells)
                cells.append(lines[k])
            spans.append((self.specs[m], start, len(cells)))
        self._sat_pos = -1
        if sat and order:  # one line per port, after its counters
            self._sat_pos = len(cells)
            cells.append(sat[sum(saturated)])
            spans.append((self.specs[s], self._sat_pos, len(cells)))
        self._cells, self._spans = cells, spans
        self.layout = tuple(spec.name for spec, _, _ in spans)
        self._join()

    def _patch(self, group: CounterGroup) -> None:
        values, saturated = group.values, group.saturated
        cells, value_pos, prefix, lines, last = self._cells, self._value_pos, self._prefix, self._lines, self._last
        for k in group.changed:
            value = values[k]
            if value is None:
                continue
            line = lines[k] = f"{prefix[k]}{go_float(value)}\n"
            last[k] = value
            cells[value_pos[k]] = line
        if self._sat_pos >= 0:
            cells[self._sat_pos] = self._sat[sum(saturated)]
        self._join()

    def _join(self) -> None:
        cells = self._cells
        self.chunks = [(spec, cells[a] if b - a == 1 else "".join(cells[a:b])) for spec, a, b in self._spans]


@dataclass(slots=True)
class _Rendered:
    sources: object
    fragment: Fragment


# A device's exposition: its rendered state fragments and its counter slots, in order.
_DeviceItems = list[Fragment | CounterSlot]


class PrometheusSink:
    """Holds the exposition of the last poll, with counters read per scrape from `counters`."""

    def __init__(
        self,
        counters: CounterFeed,
        wait_s: float = DEFAULT_COUNTER_WAIT_S,
        health: SelfMetrics | None = None,
    ) -> None:
        self._counters = counters
        self.wait_s = wait_s
        self._health = health or SelfMetrics()  # the exporter's own families, collected per exposition
        self._lock = threading.Lock()  # the published state and everything below: scrapes run on many threads
        self._assembler = Assembler()
        self._parts: dict[tuple[str, ...], _Rendered] = {}
        self._devices: dict[str, tuple[tuple[object, ...], _DeviceItems, dict[tuple[str, ...], _Rendered]]] = {}
        self._published: tuple[Snapshot, ExporterStats, list[_DeviceItems], list[Fragment]] | None = None
        self._first_published = threading.Event()
        self._state_generation = 0
        self._lines: dict[tuple[str, str, int | None], tuple[CounterGroup, _CounterLines]] = {}
        self._tail: dict[tuple[str, ...], _Rendered] = {}
        self._key: tuple[int, int] | None = None
        self._exposition: Exposition | None = None
        self._gzipped: dict[bool, bytes] = {}  # openmetrics? -> the exposition's gzipped body
        self._compressors = {False: _PrefixGzip(), True: _PrefixGzip()}
        self._negotiated: dict[str | None, tuple[str, bool]] = {}

    # -- the agent's side -------------------------------------------------------------------

    def publish(self, record: Published) -> None:
        """Render the poll's state parts and families for the next scrapes."""
        snap = record.snapshot
        previous = self._parts
        parts: dict[tuple[str, ...], _Rendered] = {}
        devices: dict[str, tuple[tuple[object, ...], _DeviceItems, dict[tuple[str, ...], _Rendered]]] = {}
        order: list[_DeviceItems] = []
        for dev in snap.devices:
            sources = _device_sources(snap, dev)
            before = self._devices.get(dev.name)
            if (
                before is not None
                and len(before[0]) == len(sources)
                and all(a is b for a, b in zip(before[0], sources, strict=True))
            ):
                own_parts, items = before[2], before[1]  # not one object of the device changed
            else:
                own_parts = {}
                items = [
                    part if isinstance(part, CounterSlot) else _part(previous, own_parts, *part)
                    for part in device_parts(snap, dev)
                ]
            devices[dev.name] = (sources, items, own_parts)
            parts.update(own_parts)
            order.append(items)
        self._devices = devices
        extra = []
        for family in record.families:
            samples = tuple(family.samples)
            extra.append(
                _part(
                    previous,
                    parts,
                    ("extra", family.spec.name),
                    (family.spec, samples),
                    Fragment.add_family,
                    (family.spec, samples),
                )
            )
        self._parts = parts
        with self._lock:
            self._published = (snap, record.stats, order, extra)
            self._state_generation += 1
        self._first_published.set()

    # -- the scrapes' side ------------------------------------------------------------------

    def render(self, accept_header: str | None, accept_encoding: str | None) -> tuple[bytes, dict[str, str]]:
        negotiated = self._negotiated.get(accept_header)
        if negotiated is None:
            negotiated = negotiate(accept_header)
            if len(self._negotiated) < 64:  # scrapers send a handful of distinct headers
                self._negotiated[accept_header] = negotiated
        content_type, openmetrics = negotiated
        gz = gzip_accepted(accept_encoding or "")
        if not self._first_published.wait(self.wait_s):
            raise NotReadyError(f"no poll has completed yet (waited {self.wait_s:g}s); retry in a moment")
        view = self._counters(self.wait_s)
        with self._lock:
            key = (self._state_generation, view.generation)
            if key != self._key:
                self._exposition = self._assemble(view)
                self._gzipped = {}
                self._key = key
            exposition = self._exposition
            if not gz:
                body = self._plain(exposition, openmetrics)  # the format asked for, once per exposition
            else:
                body = self._gzipped.get(openmetrics, b"")
                if not body:
                    # Once per exposition, for the first scraper that asks: under the lock, so
                    # concurrent gzip scrapers wait for that one instead of compressing again.
                    body = self._gzipped[openmetrics] = (
                        _gzip(self._plain(None, openmetrics))
                        if exposition is None
                        else self._compressors[openmetrics].compress(exposition.pieces(openmetrics))
                    )
        headers = {"Content-Type": content_type}
        if gz:
            headers["Content-Encoding"] = "gzip"
        return body, headers

    @staticmethod
    def _plain(exposition: Exposition | None, openmetrics: bool) -> bytes:
        if exposition is None:  # before the first poll
            return b"# EOF\n" if openmetrics else b""
        return exposition.body(openmetrics)

    def _assemble(self, view: CounterView) -> Exposition | None:
        published = self._published
        if published is None:
            return None
        snap, _stats, order, extra = published  # the poll's stats: the view has them as of this scrape
        fragments: list[Any] = []
        lines: dict[tuple[str, str, int | None], tuple[CounterGroup, _CounterLines]] = {}
        unread = False  # a counter group of a published device that this view lacks
        for items in order:
            for item in items:
                if not isinstance(item, CounterSlot):
                    fragments.append(item)
                else:
                    key = (item.device, item.kind, item.port)
                    group = view.groups.get(key)
                    if group is None:
                        unread = True  # not read yet (the first pass of a new device) or stuck since start
                        continue
                    kept = self._lines.get(key)
                    if kept is None or kept[0] is not group:
                        kept = (group, _CounterLines(item.device, group))
                    kept[1].update(group)
                    lines[key] = kept
                    fragments.append(kept[1])
        self._lines = lines
        own_stats = self._health.stats(view.stats)  # as of this scrape, not of the poll
        if unread:  # series missing are not fresh ones: say so rather than serve a gap as current
            own_stats = replace(own_stats, counters_stale=True)
        tail: dict[tuple[str, ...], _Rendered] = {}
        fragments += [_part(self._tail, tail, *part) for part in snapshot_parts(snap, own_stats)]
        fragments += extra
        for family in self._health.collect():
            samples = tuple(family.samples)
            fragments.append(
                _part(
                    self._tail,
                    tail,
                    ("health", family.spec.name),
                    (family.spec, samples),
                    Fragment.add_family,
                    (family.spec, samples),
                )
            )
        self._tail = tail
        return self._assembler.assemble(fragments)


def _part(
    previous: dict[tuple[str, ...], _Rendered],
    parts: dict[tuple[str, ...], _Rendered],
    key: tuple[str, ...],
    sources: object,
    render: Callable[..., None],
    args: tuple[Any, ...],
) -> Fragment:
    before = previous.get(key)
    # `==` on the sources tuple compares identities first: reused objects cost nothing.
    if before is not None and sources is not None and before.sources == sources:
        parts[key] = before
        return before.fragment
    fragment = Fragment(before.fragment.lines if before is not None else None)
    render(fragment, *args)
    parts[key] = _Rendered(sources, fragment.done())
    return fragment


def _device_sources(snap: Snapshot, dev: Any) -> tuple[object, ...]:
    """Every object a device's parts are rendered from."""
    link = snap.pcie.get(dev.pci_address) if dev.pci_address else None
    return dev, link, *(snap.netdevs.get(name) for port in dev.ports for name in port.netdevs)


def _gzip(body: bytes) -> bytes:
    return gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0)


class _PrefixGzip:
    """gzip of bodies that begin as the last one did: what did not change since is compressed once.

    On a quiet host every exposition differs from the last only in the exporter's own series at
    its end. The compressor's state after the common beginning is kept (flushed to a byte
    boundary), and each body copies it and compresses only the rest: one valid gzip stream.
    Only the thread holding the sink's lock calls it.
    """

    __slots__ = ("_compressor", "_count", "_head", "_pieces")

    def __init__(self) -> None:
        self._pieces: list[str] = []  # the last body's
        self._count = 0  # how many of them `_compressor` has compressed
        self._compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, _GZIP_WBITS)
        self._head = b""  # what it wrote for them

    def compress(self, pieces: list[str]) -> bytes:
        previous = self._pieces
        same = 0
        for a, b in zip(pieces, previous, strict=False):  # the common beginning of two lengths
            if a is not b:
                break
            same += 1
        if same < self._count:  # the beginning moved: start over from where it still holds
            self._compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, _GZIP_WBITS)
            self._head, self._count = b"", 0
        if same > self._count:
            grown = self._compressor.compress("".join(pieces[self._count : same]).encode())
            self._head += grown + self._compressor.flush(zlib.Z_SYNC_FLUSH)
            self._count = same
        self._pieces = pieces
        rest = self._compressor.copy()
        return self._head + rest.compress("".join(pieces[self._count :]).encode()) + rest.flush()
