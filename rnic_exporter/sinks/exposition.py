"""Prometheus text (0.0.4) and OpenMetrics 1.0 rendering that reuses what did not change.

prometheus-client's `generate_latest` rebuilds and re-escapes every label set on every call: on
a 16-RNIC host that is 60 ms or more per exposition, more CPU than reading sysfs (inside the
daemon its memory cost is small, about 1 MB: CPU is the reason for this module). Here each series
keeps its rendered line between polls and a poll only formats the values that moved. The output
is byte-identical to prometheus-client's for the metric kinds we use (tests hold us to it), and
the content negotiation is prometheus-client's own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Protocol

from prometheus_client.exposition import choose_encoder

from rnic_exporter.catalog.metrics import MetricSpec
from rnic_exporter.sinks.labels import label_value
from rnic_exporter.sinks.samples import Sample

Lines = dict[tuple[str, tuple[str, ...]], tuple[float, str]]  # (metric, labels) -> (value, line)

TEXT_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_1_0_0 = "application/openmetrics-text; version=1.0.0; charset=utf-8"


_EXACT_INT = 2**53  # every int below is a float exactly
_EXPONENTS = tuple(f"e+{n:02d}" for n in range(16))  # the exponents of ints below _EXACT_INT


def go_float(value: float) -> str:
    """Values as prometheus-client (and Go) print them: `1.0`, `5e+10`, `+Inf`."""
    if type(value) is int and 0 <= value < _EXACT_INT:
        # Counters are ints, and a busy scrape formats every changed one: below 2**53 a float
        # holds them exactly and its repr is their digits plus ".0", so skip float() and repr().
        digits = str(value)
        n = len(digits)
        if n <= 6:
            return digits + ".0"
        tail = digits[1:].rstrip("0")
        return (f"{digits[0]}.{tail}" if tail else digits[0]) + _EXPONENTS[n - 1]
    try:
        d = float(value)
    except OverflowError:  # an int beyond float range: what float64 would hold is an infinity
        d = math.inf if value > 0 else -math.inf
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:  # Go switches to exponents sooner than Python
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


def negotiate(accept_header: str | None) -> tuple[str, bool]:
    """(Content-Type, OpenMetrics?) for an Accept header: prometheus-client's `choose_encoder` decides."""
    content_type = choose_encoder(accept_header or "")[1]
    return content_type, content_type.startswith("application/openmetrics-text")


def _escape_value(value: str) -> str:
    return label_value(value).replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def headers(spec: MetricSpec) -> tuple[str, str]:
    """(text 0.0.4 header, OpenMetrics header) for one family."""
    text_help = spec.help.replace("\\", r"\\").replace("\n", r"\n")
    om_help = _escape_value(spec.help)
    text_type = "gauge" if spec.kind == "info" else spec.kind
    text = f"# HELP {spec.name} {text_help}\n# TYPE {spec.name} {text_type}\n"
    om = f"# HELP {spec.family_name} {om_help}\n# TYPE {spec.family_name} {spec.kind}\n"
    return text, om


def series_line(spec: MetricSpec, labels: tuple[str, ...], value: float) -> str:
    if labels:
        pairs = sorted(zip(spec.labels, labels, strict=True))
        inner = ",".join(f'{k}="{_escape_value(v)}"' for k, v in pairs)
        return f"{spec.name}{{{inner}}} {go_float(value)}\n"
    return f"{spec.name} {go_float(value)}\n"


class Chunks(Protocol):
    """Anything holding rendered series per metric: a `Fragment`, a counter group's lines."""

    @property
    def chunks(self) -> list[tuple[MetricSpec, str]]: ...

    @property
    def layout(self) -> tuple[str, ...]:
        """The names of the metrics in `chunks`, in order: where its chunks go depends on nothing else."""
        ...


class Fragment:
    """The series of one part of the exposition (one port's counters, say), grouped by metric.

    Built from the part's previous fragment: a series whose value did not change keeps its line.
    `chunks` holds, per metric in first-seen order, its lines joined.
    """

    __slots__ = ("_by_metric", "_previous", "chunks", "layout", "lines")

    def __init__(self, previous: Lines | None = None) -> None:
        self._previous: Lines = previous or {}
        self.lines: Lines = {}
        self._by_metric: dict[str, tuple[MetricSpec, list[str]]] = {}
        self.chunks: list[tuple[MetricSpec, str]] = []
        self.layout: tuple[str, ...] = ()

    def declare(self, spec: MetricSpec) -> None:
        """A metric with no series yet still gets its HELP and TYPE, as prometheus-client prints it."""
        if spec.name not in self._by_metric:
            self._by_metric[spec.name] = (spec, [])

    def add(self, spec: MetricSpec, labels: tuple[str, ...], value: float) -> None:
        key = (spec.name, labels)
        cached = self._previous.get(key)
        if cached is None:
            line = series_line(spec, labels, value)
        elif cached[0] == value:
            line = cached[1]
        else:  # a moved counter: keep the escaped name and labels, print the new value
            old = cached[1]
            line = f"{old[: old.rfind(' ') + 1]}{go_float(value)}\n"
        self.lines[key] = (value, line)
        entry = self._by_metric.get(spec.name)
        if entry is None:
            self._by_metric[spec.name] = (spec, [line])
        else:
            entry[1].append(line)

    def add_family(self, spec: MetricSpec, samples: Iterable[Sample]) -> None:
        """Every sample of one metric; declared even when there are none."""
        self.declare(spec)
        for labels, value in samples:
            self.add(spec, labels, value)

    def done(self) -> Fragment:
        self.chunks = [(spec, "".join(lines)) for spec, lines in self._by_metric.values()]
        self.layout = tuple(self._by_metric)
        self._by_metric = {}
        self._previous = {}
        return self


class Exposition:
    """One assembled exposition; each format is built the first time it is asked for."""

    __slots__ = ("_bodies", "_chunks", "_pieces", "_plan")

    def __init__(self, plan: _Plan, chunks: list[list[tuple[MetricSpec, str]]]) -> None:
        self._plan = plan
        self._chunks = chunks
        self._pieces: dict[bool, list[str]] = {}
        self._bodies: dict[bool, bytes] = {}

    def pieces(self, openmetrics: bool) -> list[str]:
        """The body's strings in order: headers and chunks are the very objects of the last
        exposition where they did not change (a compressor can start where they differ)."""
        pieces = self._pieces.get(openmetrics)
        if pieces is None:
            chunks = self._chunks
            pieces = self._pieces[openmetrics] = []
            for heads, refs in self._plan:
                pieces.append(heads[openmetrics])
                pieces += [chunks[i][j][1] for i, j in refs]
            if openmetrics:
                pieces.append(_EOF)
        return pieces

    def body(self, openmetrics: bool) -> bytes:
        body = self._bodies.get(openmetrics)
        if body is None:
            body = self._bodies[openmetrics] = "".join(self.pieces(openmetrics)).encode()
        return body


_EOF = "# EOF\n"


# Per metric in first-seen order: (text header, OpenMetrics header), and where its chunks are
# (fragment index, chunk index), in fragment order.
_Plan = list[tuple[tuple[str, str], list[tuple[int, int]]]]


class Assembler:
    """Joins fragments into an exposition, each metric declared once, in first-seen order.

    Where each fragment's chunks go depends only on which metrics each fragment holds (its
    `layout`), which changes when a series appears or goes, not when values move: the plan is
    made again only then, and a pass only gathers the chunks in the plan's order.
    """

    def __init__(self) -> None:
        self._headers: dict[str, tuple[str, str]] = {}
        self._layouts: list[tuple[str, ...]] = []
        self._plan: _Plan = []

    def assemble(self, fragments: Sequence[Chunks]) -> Exposition:
        layouts = [f.layout for f in fragments]
        if layouts != self._layouts:
            self._plan = self._make_plan(fragments)
            self._layouts = layouts
        return Exposition(self._plan, [f.chunks for f in fragments])

    def join(self, fragments: Sequence[Chunks]) -> tuple[bytes, bytes]:
        """(text 0.0.4 body, OpenMetrics body)."""
        exposition = self.assemble(fragments)
        return exposition.body(False), exposition.body(True)

    def _make_plan(self, fragments: Sequence[Chunks]) -> _Plan:
        by_name: dict[str, tuple[tuple[str, str], list[tuple[int, int]]]] = {}
        for i, fragment in enumerate(fragments):
            for j, (spec, _) in enumerate(fragment.chunks):
                entry = by_name.get(spec.name)
                if entry is None:
                    heads = self._headers.get(spec.name)
                    if heads is None:
                        heads = self._headers[spec.name] = headers(spec)
                    by_name[spec.name] = (heads, [(i, j)])
                else:
                    entry[1].append((i, j))
        return list(by_name.values())
