"""The catalogue declares each metric and each event once: every table, dashboard and rule built from it
would otherwise repeat or contradict an entry."""

from __future__ import annotations

from collections import Counter

from rnic_exporter.catalog import events, metrics


def test_each_metric_is_declared_once() -> None:
    repeated = [name for name, n in Counter(m.name for m in metrics.METRICS).items() if n > 1]
    assert repeated == [], f"declared more than once in catalog.metrics.METRICS: {repeated}"
    assert len(metrics.BY_NAME) == len(metrics.METRICS)


def test_each_event_is_declared_once() -> None:
    repeated = [name for name, n in Counter(e.name for e in events.EVENT_SPECS).items() if n > 1]
    assert repeated == [], f"declared more than once in catalog.events.EVENT_SPECS: {repeated}"
