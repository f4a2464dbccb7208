"""The exporter's own process series (`process_*`, `python_info`, `python_gc_*`) from prometheus-client's
collectors, as every node_exporter and prometheus-client user expects for watching an exporter's cost.

prometheus-client is the right tool for these (it knows /proc's layout and its names are the
convention); its renderer is not (see `sinks/exposition.py`), so its families are turned into ours.
Its process collector counts open descriptors by listing /proc/self/fd, and this daemon holds
thousands (about 340 per RNIC): on a 16-RNIC host that listing costs 1 to 4 ms, more than a quiet
scrape. So the collectors run at most every `REFRESH_S`, on the scrape that comes first after it:
a 15 s scrape interval sees fresh values every other scrape, and the cost is a few ms a minute.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.metrics_core import Metric

from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.catalog.metrics import MetricSpec
from rnic_exporter.sinks.samples import Family

REFRESH_S = 30.0


class ProcessFamilies:
    """Thread-safe: scrapes on many threads ask, one collects."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        registry = CollectorRegistry()  # private: nothing registers on import, nothing else is collected
        self._collectors = (
            ProcessCollector(registry=registry),
            PlatformCollector(registry=registry),
            GCCollector(registry=registry),
        )
        self._clock = clock
        self._lock = threading.Lock()
        self._at = float("-inf")
        self._families: tuple[Family, ...] = ()

    def families(self) -> tuple[Family, ...]:
        with self._lock:
            now = self._clock()
            if now - self._at >= REFRESH_S:
                self._families = tuple(_ours(metric for c in self._collectors for metric in c.collect()))
                self._at = now
            return self._families


def _ours(metrics: Iterable[Metric]) -> Iterable[Family]:
    for metric in metrics:
        spec = catalog.PROCESS_METRICS.get(metric.name)  # the family's name (a counter's without _total)
        if spec is None:
            continue  # a series a newer prometheus-client adds: not in the catalogue, not served
        yield Family(
            spec,
            [(_labels(spec, sample.labels), sample.value) for sample in metric.samples if sample.name == spec.name],
        )


def _labels(spec: MetricSpec, labels: dict[str, str]) -> tuple[str, ...]:
    return tuple(labels.get(name, "") for name in spec.labels)
