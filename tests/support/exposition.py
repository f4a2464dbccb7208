"""Expositions for tests: a snapshot rendered whole (golden files, promtool), and parsed back into a dict
of single samples."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families

from rnic_exporter.model.host import Snapshot
from rnic_exporter.sinks.exposition import Assembler, Fragment, Lines
from rnic_exporter.sinks.samples import ExporterStats, Family, snapshot_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str) -> Samples:
    """(sample name, its labels) -> value, for every sample of every family in `text`."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(text: str | bytes, name: str, **labels: str) -> float | None:
    """The value of the sample `name` whose labels are exactly `labels`, or None."""
    body = text.decode() if isinstance(text, bytes) else text
    return samples(body).get((name, frozenset(labels.items())))


def first_value(text: str | bytes, name: str, **labels: str) -> float | None:
    """The value of the first sample `name` whose labels include `labels`, or None."""
    body = text.decode() if isinstance(text, bytes) else text
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


def label_sets(text: str | bytes, name: str) -> list[dict[str, str]]:
    """The labels of every sample named `name` in `text`, in order."""
    body = text.decode() if isinstance(text, bytes) else text
    return [dict(s.labels) for family in text_string_to_metric_families(body) for s in family.samples if s.name == name]


class Renderer:
    """Renders families; keeps each series' last line for the next call."""

    def __init__(self) -> None:
        self._assembler = Assembler()
        self._lines: Lines = {}

    def render(self, families: Iterable[Family]) -> tuple[bytes, bytes]:
        """(text 0.0.4 body, OpenMetrics body) of `families`, in their order."""
        fragment = Fragment(self._lines)
        for family in families:
            fragment.add_family(family.spec, family.samples)
        self._lines = fragment.done().lines
        return self._assembler.join((fragment,))


def render_text(snap: Snapshot, stats: ExporterStats | None = None) -> str:
    """The text exposition (0.0.4) of one snapshot; for golden tests and `promtool check metrics`."""
    text, _ = Renderer().render(snapshot_families(snap, stats or ExporterStats()))
    return text.decode()
