"""OTLP sink: the catalogue's metrics as observable instruments, detection events as log records.

The poller only swaps a reference (`publish`); everything else runs on two background threads:
- metrics: the SDK's periodic reader calls our callbacks, which read the last published record
  and ask for one counter pass per export (shared with any scrape under a second old), through
  the table in `otel_metrics.py`. Instruments are cumulative, so a failed export loses nothing:
  the next one carries the same totals. Nothing is queued.
- events: a bounded queue drained by `_LogShipper`, which keeps a failed batch and retries it
  with exponential backoff; beyond the bound the oldest event is dropped and counted.
A collector that is down, hanging or refusing is logged once per change of state and counted in
`rnic_exporter_otlp_export_failures_total` / `_dropped_total` (`otel_failures.py`; served on
/metrics, see `families`). Only this module and `otel_failures.py` import OpenTelemetry (the
`otel` extra).
"""

from __future__ import annotations

import logging
import platform
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from rnic_exporter import __version__
from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.catalog.events import OTEL_SEVERITY_NUMBER, OTEL_SEVERITY_TEXT, Event
from rnic_exporter.config.otlp import OtlpSettings
from rnic_exporter.errors import ConfigError, extra_hint
from rnic_exporter.model.host import CounterGroup
from rnic_exporter.sinks import otel_metrics
from rnic_exporter.sinks.consumer_fields import LOG_KEYS, otel_attributes
from rnic_exporter.sinks.labels import label_value
from rnic_exporter.sinks.registry import SelfMetrics
from rnic_exporter.sinks.samples import ExporterStats, Family, Published, counter_families, snapshot_families

SHUTDOWN_BUDGET_S = 5.0  # the whole last export at stop, both signals
COUNTER_WAIT_S = 2.0  # an export waits this long for its counter pass, then sends the last values

try:
    from opentelemetry._logs import LogRecord, SeverityNumber
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.sdk._logs import ReadableLogRecord
    from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        MetricExporter,
        MetricReader,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.metrics.view import View
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    from rnic_exporter.sinks.otel_failures import Health, TrackedMetricExporter, install_reasons, note_http_results
except ImportError as exc:  # pragma: no cover - exercised through a subprocess that hides the package
    raise ConfigError(f"OTLP export needs the otel extra: {extra_hint('otel')} ({exc})") from None

log = logging.getLogger("rnic_exporter.otel")

SCOPE = "rnic_exporter"
MACHINE_ID_FILES = (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id"))
MAX_LOG_BATCH = 512
BACKOFF_MIN_S, BACKOFF_MAX_S = 1.0, 60.0
# The SDK's default cap of 2000 attribute sets per instrument would fold big hosts' hw counters
# into an overflow series; this bounds memory without ever being reached by real hardware.
CARDINALITY_LIMIT = 50_000


def resource(machine_id_files: Sequence[Path] = MACHINE_ID_FILES) -> Resource:
    """service.*, host.*, process.runtime.*; OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME win over ours."""
    attrs: dict[str, str] = {
        "service.name": "rnic-exporter",
        "service.version": __version__,
        "host.name": socket.gethostname(),
        "process.runtime.name": platform.python_implementation(),
        "process.runtime.version": platform.python_version(),
    }
    for path in machine_id_files:
        try:
            machine_id = path.read_text().strip()
        except OSError:
            continue
        if machine_id:
            attrs["host.id"] = machine_id
            break
    return Resource.create(attrs).merge(OTELResourceDetector().detect())


class CounterSource(Protocol):
    """A counter pass for one export (the agent's `counter_view`); `groups` keyed (device, kind, port)."""

    def __call__(self, wait_s: float | None) -> Any: ...


class _Observer:
    """Builds every instrument's observations once per collection from the last published record
    and one counter pass."""

    def __init__(self, counters: CounterSource, health: SelfMetrics | None = None) -> None:
        self.state: Published | None = None
        self._counters = counters
        self._health = health or SelfMetrics()
        self._lock = threading.Lock()
        self._built_for: tuple[Published, int] | None = None
        self._observations: dict[str, list[Observation]] = {}
        self._attrs: dict[tuple[str, tuple[str, ...]], tuple[str, dict[str, str]]] = {}

    def callback(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return self.observations().get(name, ())

        return observe

    def observations(self) -> dict[str, list[Observation]]:
        state = self.state
        if state is None:
            return {}
        with self._lock:
            view = self._counters(COUNTER_WAIT_S)
            stats, generation = self._health.stats(view.stats), view.generation
            health = self._health.collect()  # the exporter's own (consumer scan, OTLP health), as of now
            groups = [(key[0], group) for key, group in view.groups.items()]
            if self._built_for is None or self._built_for[0] is not state or self._built_for[1] != generation:
                self._observations = self._build(state, stats, groups, health)
                self._built_for = (state, generation)
            return self._observations

    def _build(
        self,
        state: Published,
        stats: ExporterStats,
        groups: list[tuple[str, CounterGroup]],
        health: tuple[Family, ...],
    ) -> dict[str, list[Observation]]:
        out: dict[str, list[Observation]] = {}
        attrs_cache: dict[tuple[str, tuple[str, ...]], tuple[str, dict[str, str]]] = {}
        families = [*snapshot_families(state.snapshot, stats), *counter_families(groups), *state.families, *health]
        for family in families:
            mapping = otel_metrics.BY_SPEC.get(family.spec.name)
            if mapping is None:
                continue  # excluded, with its reason, in otel_metrics.EXCLUDED
            for labels, value in family.samples:
                key = (family.spec.name, labels)
                cached = self._attrs.get(key)
                if cached is None:
                    route = mapping.route(labels)
                    cached = (route.instrument.name, mapping.attributes(route, labels))
                attrs_cache[key] = cached
                out.setdefault(cached[0], []).append(Observation(otel_metrics.otlp_number(value), cached[1]))
        self._attrs = attrs_cache  # keeps only live series: a removed NIC's attributes go
        return out


# In the record's own fields (event_name, severity) or spelled the OTel way (consumer_fields).
_NOT_ATTRIBUTES = frozenset(("event", "severity", *LOG_KEYS))


class _LogShipper:
    """Bounded event queue and the thread that exports it as log records, retrying with backoff."""

    def __init__(
        self, exporter: LogRecordExporter, res: Resource, health: Health, limit: int, max_backoff_s: float
    ) -> None:
        self._exporter = exporter
        self._resource = res
        self._scope = InstrumentationScope(f"{SCOPE}.events", __version__)
        self._health = health
        self._limit = limit
        self._max_backoff_s = max_backoff_s
        self._queue: deque[tuple[int, Event]] = deque()
        self._seq = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otlp-logs", daemon=True)
        self._thread.start()

    def put(self, events: Sequence[Event]) -> None:
        with self._lock:
            for event in events:
                if len(self._queue) >= self._limit:
                    self._queue.popleft()
                    self._health.drop()
                self._seq += 1
                self._queue.append((self._seq, event))
        self._wake.set()

    def record(self, event: Event) -> ReadableLogRecord:
        attributes: dict[str, Any] = {k: label_value(v) for k, v in event.fields().items() if k not in _NOT_ATTRIBUTES}
        if event.consumers is not None:  # semantic-convention names (k8s.pod.name...), not the log's
            attributes.update(otel_attributes(event.consumers))
        now = time.time_ns()
        return ReadableLogRecord(
            log_record=LogRecord(
                timestamp=int(event.time * 1e9) if event.time else now,
                observed_timestamp=now,
                severity_number=SeverityNumber(OTEL_SEVERITY_NUMBER[event.severity]),
                severity_text=OTEL_SEVERITY_TEXT[event.severity],
                body=label_value(event.message),
                attributes=attributes,
                event_name=event.name,
            ),
            resource=self._resource,
            instrumentation_scope=self._scope,
        )

    def _export(self, batch: list[tuple[int, Event]]) -> bool:
        return self._health.attempt(
            lambda: self._exporter.export([self.record(e) for _, e in batch]), LogRecordExportResult.SUCCESS
        )

    def _run(self) -> None:
        backoff = 0.0
        while True:
            if backoff:
                self._stop.wait(backoff)  # new events wait too: they join the retried batch's queue
            else:
                self._wake.wait()
            self._wake.clear()
            closing = self._stop.is_set()
            with self._lock:
                batch = list(self._queue)[:MAX_LOG_BATCH]
            if not batch:
                if closing:
                    return
                backoff = 0.0
                continue
            if self._export(batch):
                backoff = 0.0
                with self._lock:
                    while self._queue and self._queue[0][0] <= batch[-1][0]:
                        self._queue.popleft()
                    if self._queue:
                        self._wake.set()
            else:
                backoff = min(max(backoff * 2, BACKOFF_MIN_S), self._max_backoff_s)
            if closing:
                return  # one last attempt at close, never an endless one

    def close(self, timeout_s: float) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)
        self._exporter.shutdown()  # type: ignore[no-untyped-call]


def meter_provider(res: Resource, reader: MetricReader, observer: _Observer) -> MeterProvider:
    """A provider holding every instrument of the catalogue, each observed through `observer`
    (the sink's, and the fuzz run's: one home for the View and the instruments)."""
    provider = MeterProvider(
        resource=res,
        metric_readers=[reader],
        shutdown_on_exit=False,
        views=[View(instrument_name="*", aggregation_cardinality_limit=CARDINALITY_LIMIT)],
    )
    meter = provider.get_meter(SCOPE, __version__)
    create = {
        "counter": meter.create_observable_counter,
        "gauge": meter.create_observable_gauge,
        "updowncounter": meter.create_observable_up_down_counter,
    }
    for inst in otel_metrics.instruments():
        create[inst.kind](
            inst.name, callbacks=[observer.callback(inst.name)], unit=inst.unit, description=inst.description
        )
    return provider


def _exporters(settings: OtlpSettings) -> tuple[MetricExporter, LogRecordExporter]:
    """The OTLP exporters for the protocol; a missing extra is a one-line ConfigError."""
    if settings.protocol == "grpc":
        try:
            import grpc
            from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogs
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetrics
        except ImportError:
            raise ConfigError(f"--otlp.protocol grpc needs the grpc extra: {extra_hint('grpc')}") from None
        credentials = None
        if not settings.insecure:

            def read(path: Path | None) -> bytes | None:
                return path.read_bytes() if path else None

            credentials = grpc.ssl_channel_credentials(
                read(settings.certificate), read(settings.client_key), read(settings.client_certificate)
            )
        common: dict[str, Any] = {
            "endpoint": settings.endpoint,
            "insecure": settings.insecure,
            "credentials": credentials,
            "headers": dict(settings.headers),
            "timeout": settings.timeout_s,
        }
        return GrpcMetrics(**common), GrpcLogs(**common)
    try:
        from opentelemetry.exporter.http.transport._urllib3 import Urllib3HTTPTransport
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogs
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetrics
    except ImportError:
        raise ConfigError(f"OTLP export needs the otel extra: {extra_hint('otel')}") from None

    def transport() -> Urllib3HTTPTransport:
        # urllib3 instead of the default requests session: requests alone costs ~6 MB of RSS, and
        # the exporter's `_transport` hook (pinned SDK) takes the same TLS settings.
        client = settings.client_certificate, settings.client_key
        return Urllib3HTTPTransport(
            verify=str(settings.certificate) if settings.certificate else True,
            cert=(str(client[0]), str(client[1])) if client[0] and client[1] else None,
        )

    shared: dict[str, Any] = {"headers": dict(settings.headers), "timeout": settings.timeout_s}
    metrics = HttpMetrics(endpoint=settings.signal_url("metrics"), _transport=transport(), **shared)
    logs = HttpLogs(endpoint=settings.signal_url("logs"), _transport=transport(), **shared)
    note_http_results(metrics, settings.timeout_s)
    note_http_results(logs, settings.timeout_s)
    return metrics, logs


class OtelSink:
    """An `agent.EventSink`: `publish` costs the poller a reference swap and a queue append."""

    def __init__(
        self,
        settings: OtlpSettings,
        counters: CounterSource,
        *,
        health: SelfMetrics | None = None,
        machine_id_files: Sequence[Path] = MACHINE_ID_FILES,
    ) -> None:
        install_reasons()
        self.settings = settings
        metric_exporter, log_exporter = _exporters(settings)
        self.resource = resource(machine_id_files)
        where = settings.endpoint
        self.metrics_health = Health("metrics", where)
        self.logs_health = Health("logs", where)
        self._observer = _Observer(counters, health)
        self._reader = PeriodicExportingMetricReader(
            TrackedMetricExporter(metric_exporter, self.metrics_health),
            export_interval_millis=settings.interval_s * 1000,
            export_timeout_millis=settings.timeout_s * 1000,
        )
        self._provider = meter_provider(self.resource, self._reader, self._observer)
        # Events retry at most a metric interval apart (a minute by default), so they arrive no
        # later than the metrics once the collector is back.
        self._logs = _LogShipper(
            log_exporter,
            self.resource,
            self.logs_health,
            settings.queue_size,
            min(BACKOFF_MAX_S, max(settings.interval_s, BACKOFF_MIN_S)),
        )
        log.info(
            "exporting over OTLP",
            extra={
                "fields": {
                    "endpoint": settings.endpoint,
                    "protocol": settings.protocol,
                    "interval_s": settings.interval_s,
                }
            },
        )

    def publish(self, record: Published) -> None:
        self._observer.state = record
        if record.events:
            self._logs.put(record.events)

    def families(self) -> list[Family]:
        """rnic_exporter_otlp_*: the sink's own health, collected through `SelfMetrics` by every sink."""
        failures, dropped = Family(catalog.OTLP_EXPORT_FAILURES), Family(catalog.OTLP_DROPPED)
        for health in (self.metrics_health, self.logs_health):
            failures.samples.append(((health.signal,), health.failures))
            dropped.samples.append(((health.signal,), health.dropped))
        return [failures, dropped]

    def close(self) -> None:
        """A last export of both signals, bounded in total: a collector that is down must not hold up
        a stop (Kubernetes kills a pod 30 s after SIGTERM, and the web server is already down)."""
        flush = threading.Thread(target=self._final_export, name="otlp-final-export", daemon=True)
        flush.start()
        flush.join(SHUTDOWN_BUDGET_S)  # the only bound: abandoning the daemon thread cannot race with it
        if flush.is_alive():
            log.warning("OTLP: the last export did not finish within %gs; stopping without it", SHUTDOWN_BUDGET_S)

    def _final_export(self) -> None:
        """Each signal as the SDK does it, bounded by --otlp.timeout; close() cuts the whole short."""
        self._logs.close(self.settings.timeout_s + 1)
        self._provider.shutdown(timeout_millis=(self.settings.timeout_s + 1) * 1000)
