"""The exporter's own process series (`process_*`, `python_info`, `python_gc_*`) from prometheus-client's
collectors, as every node_exporter and prometheus-client user expects for watching an exporter's cost.

prometheus-client is the right tool for these (it knows /proc's layout and its names are the
convention); its renderer is not (see `sinks/exposition.py`), so its families are turned into ours.
Its process collector counts open descriptors by listing /proc/self/fd, and this daemon holds
thousands (about 340 per RNIC): on a 16-RNIC host that listing costs 1 to 5 ms, more than a quiet
scrape. So the descriptors are counted from the size Linux (6.2 and later) gives that directory,
one `stat` (`OpenFdsCollector`; listed on older kernels, which answer 0), and the collectors run at
most every `REFRESH_S`, on the scrape that comes first after it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.catalog.metrics import MetricSpec
from rnic_exporter.sinks.samples import Family

REFRESH_S = 30.0
_OPEN_FDS = "process_open_fds"


class OpenFdsCollector(ProcessCollector):
    """prometheus-client's process collector (the same families), but `process_open_fds` from one
    `stat` of /proc/<pid>/fd where the kernel gives its size (the count of open descriptors, Linux
    6.2 and later) instead of a listing of thousands of entries."""

    def collect(self) -> Iterable[Metric]:
        pid_dir = os.path.join(self._proc, str(self._pid()).strip())
        try:
            count = os.stat(os.path.join(pid_dir, "fd")).st_size
        except OSError:
            count = 0
        if not count or not self._btime:  # an older kernel answers 0: list, as prometheus-client does
            return super().collect()
        out: list[Metric] = []
        try:
            with open(os.path.join(pid_dir, "stat"), "rb") as f:
                parts = f.read().split(b")")[-1].split()
            out += [
                GaugeMetricFamily("process_virtual_memory_bytes", "Virtual memory size in bytes.", float(parts[20])),
                GaugeMetricFamily(
                    "process_resident_memory_bytes", "Resident memory size in bytes.", float(parts[21]) * self._pagesize
                ),
                GaugeMetricFamily(
                    "process_start_time_seconds",
                    "Start time of the process since unix epoch in seconds.",
                    float(parts[19]) / self._ticks + self._btime,
                ),
                CounterMetricFamily(
                    "process_cpu_seconds_total",
                    "Total user and system CPU time spent in seconds.",
                    (float(parts[11]) + float(parts[12])) / self._ticks,
                ),
            ]
            with open(os.path.join(pid_dir, "limits"), "rb") as f:
                max_fds = next(float(line.split()[3]) for line in f if line.startswith(b"Max open file"))
            out += [
                GaugeMetricFamily(_OPEN_FDS, "Number of open file descriptors.", float(count)),
                GaugeMetricFamily("process_max_fds", "Maximum number of open file descriptors.", max_fds),
            ]
        except (OSError, StopIteration, IndexError, ValueError):
            pass
        return out


class ProcessFamilies:
    """Thread-safe: scrapes on many threads ask, one collects."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        registry = CollectorRegistry()  # private: nothing registers on import, nothing else is collected
        self._collectors = (
            OpenFdsCollector(registry=registry),
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
