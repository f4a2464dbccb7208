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


def test_wire_metrics_follow_the_catalogue_conventions() -> None:
    names = [m.name for m in metrics.WIRE_METRICS]
    assert len(set(names)) == len(names)
    assert set(names) <= set(metrics.BY_NAME), "a wire metric is missing from METRICS"
    for spec in metrics.WIRE_METRICS:
        assert spec.name.startswith("rnic_") and spec.name == spec.name.lower(), spec.name
        assert spec.name.endswith("_total") == (spec.kind == "counter"), spec.name
        assert spec.name.endswith("_info") == (spec.kind == "info"), spec.name
        if spec.unit:  # base units only, named in the metric (before _total)
            assert spec.unit in {"celsius", "volts", "watts", "amperes", "seconds"}, spec.name
            assert spec.name.removesuffix("_total").endswith(spec.unit), spec.name
        assert not any(word in spec.name for word in ("milli", "dbm", "_ma_", "_mw")), spec.name
