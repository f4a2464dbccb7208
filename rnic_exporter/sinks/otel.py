"""OTLP sink: the catalogue's metrics as observable instruments, detection events as log records.

The poller only swaps a reference (`publish`); everything else runs on two background threads:
- metrics: the SDK's periodic reader calls our callbacks, which read the last published record
  and ask for one counter pass per export (shared with any scrape under a second old), through
  the table in `otel_metrics.py`. Instruments are cumulative, so a failed export loses nothing:
  the next one carries the same totals. Nothing is queued.
- events: a bounded queue drained by `_LogShipper`, which keeps a failed batch and retries it
  with exponential backoff; beyond the bound the oldest event is dropped and counted.
A collector that is down, hanging or refusing is logged once per change of state and counted in
`rnic_exporter_otlp_export_failures_total` / `_dropped_total` (served on /metrics, see
`families`). Only this module imports OpenTelemetry (the `otel` extra).
"""

from __future__ import annotations

import logging
import platform
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rnic_exporter import __version__
from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.catalog.events import OTEL_SEVERITY_NUMBER, OTEL_SEVERITY_TEXT, Event
from rnic_exporter.errors import ConfigError, extra_hint
from rnic_exporter.model.host import CounterGroup
from rnic_exporter.sinks import otel_metrics
from rnic_exporter.sinks.consumer_fields import LOG_KEYS, otel_attributes
from rnic_exporter.sinks.labels import label_value
from rnic_exporter.sinks.otel_settings import OtlpSettings
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
        MetricExportResult,
        MetricReader,
        MetricsData,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.metrics.view import View
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
except ImportError as exc:  # pragma: no cover - exercised through a subprocess that hides the package
    raise ConfigError(f"OTLP export needs the otel extra: {extra_hint('otel')} ({exc})") from None

log = logging.getLogger("rnic_exporter.otel")

SCOPE = "rnic_exporter"
MACHINE_ID_FILES = (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id"))
MAX_LOG_BATCH = 512
BACKOFF_MIN_S, BACKOFF_MAX_S = 1.0, 60.0
# Less time than this (or half of --otlp.timeout) left for a retry inside one export: not sent.
# Loopback and sidecar collectors answer in a few ms; a try with less left mostly times out and
# reports a hang that is not there.
MIN_TRY_S = 0.05
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


@dataclass(slots=True)
class _Attempt:
    """What one export attempt left behind: the SDK's log lines and, over HTTP, its final result."""

    messages: list[str] = field(default_factory=list)
    outcome: tuple[str, str] | None = None  # (kind, detail)


class _Reasons(logging.Handler):
    """Takes the OTel SDK's own log records: exporter retry chatter becomes the reason of a failure.

    The SDK logs every failed attempt (and each retry) as a warning or error; a collector that is
    down for an hour would fill the journal. We log once per change of state instead (`_Health`).
    Exports run on the thread that asked for them, so a thread-local attempt collects them.
    """

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.local = threading.local()

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("opentelemetry.exporter"):
            attempt: _Attempt | None = getattr(self.local, "attempt", None)
            if attempt is not None:
                attempt.messages.append(record.getMessage())
            log.debug("otel sdk: %s", record.getMessage())
        else:
            log.log(record.levelno, "otel sdk: %s", record.getMessage())

    def capture(self) -> _Attempt:
        attempt = self.local.attempt = _Attempt()
        return attempt

    def current(self) -> _Attempt | None:
        attempt: _Attempt | None = getattr(self.local, "attempt", None)
        return attempt


_REASONS = _Reasons()
_SDK_LOGGER = logging.getLogger("opentelemetry")


def _install_reasons() -> None:
    if _REASONS not in _SDK_LOGGER.handlers:
        _SDK_LOGGER.addHandler(_REASONS)
        _SDK_LOGGER.propagate = False
        _SDK_LOGGER.setLevel(logging.DEBUG)


def _error_kind(error: BaseException) -> str:
    """urllib3's exceptions by family; NewConnectionError subclasses ConnectTimeoutError, so it goes first."""
    cause = getattr(error, "reason", None)  # MaxRetryError wraps the cause
    if isinstance(cause, BaseException):
        error = cause
    names = {cls.__name__ for cls in type(error).__mro__}
    if names & {
        "NewConnectionError",
        "NameResolutionError",
        "ConnectionRefusedError",
        "ProtocolError",
        "ConnectionError",
    }:
        return "unreachable"
    if names & {"TimeoutError", "Timeout"}:
        return "timeout"
    return type(error).__name__


class ExportBudgetSpentError(TimeoutError):
    """The export's --otlp.timeout ran out between the SDK's retries, before the next try was sent."""


def _failure_outcome(result: Any) -> tuple[str, str] | None:
    """(kind, detail) of a failed HTTP result (one try's, or an export's); None for a success."""
    status, error = getattr(result, "status_code", None), getattr(result, "error", None)
    if status is not None:
        return (
            None
            if 200 <= status < 400
            else (f"HTTP {status}", f"{status} {getattr(result, 'reason', '') or ''}".strip())
        )
    if error is not None:
        return _error_kind(error), str(error)[:300]
    return None


def _note_http_results(exporter: Any, budget_s: float) -> None:
    """The HTTP exporters log only "failed due to timeout, max retries or shutdown" when a collector is
    down or hangs; their client's results say which, so we read them (pinned SDK: `_client._submit`,
    one try, and `_client.export`, the tries of one export)."""
    client: Any = getattr(exporter, "_client", None)
    inner, submit = getattr(client, "export", None), getattr(client, "_submit", None)
    if inner is None or submit is None:
        return
    floor_s = min(MIN_TRY_S, budget_s / 2)  # an export's first try has the whole budget: always sent

    def guarded_submit(data: bytes, timeout: float) -> Any:
        # After a backoff wait the SDK sends with max(deadline - now, 0). A wait that a loaded host
        # wakes late from leaves 0, which urllib3 refuses with a ValueError ("Attempted to set total
        # timeout to 0.0"), or a few ms, which time out ("read timeout=0"): either became the reason
        # logged while the collector was answering 503. Out of time is what happened; the last
        # answer stays the reason, and the next export tries again with a whole budget.
        if timeout < floor_s:
            raise ExportBudgetSpentError("the export's --otlp.timeout ran out between retries")
        result = submit(data, timeout)
        attempt = _REASONS.current()
        outcome = _failure_outcome(result)
        if attempt is not None and outcome is not None:
            attempt.outcome = outcome
        return result

    def export(data: bytes) -> Any:
        result = inner(data)
        attempt = _REASONS.current()
        outcome = _failure_outcome(result)
        if attempt is not None and outcome is not None:
            spent = isinstance(getattr(result, "error", None), ExportBudgetSpentError)
            if not (spent and attempt.outcome is not None):
                attempt.outcome = outcome
        return result

    client._submit = guarded_submit
    client.export = export


_GRPC_KINDS = {"UNAVAILABLE": "unreachable", "DEADLINE_EXCEEDED": "timeout"}
_GRPC_CODE = re.compile(r"StatusCode\.(\w+)")


def classify(attempt: _Attempt, error: BaseException | None = None) -> tuple[str, str]:
    """(kind, detail) of a failed export: kind is short and stable (unreachable, timeout, HTTP 503...)."""
    if error is not None:
        return type(error).__name__, str(error)[:300]
    if attempt.outcome is not None:
        return attempt.outcome
    codes = [(m[1], text) for text in attempt.messages if (m := _GRPC_CODE.search(text))]
    # The SDK sends its last retry with whatever is left of the deadline, nothing when its backoff
    # wait woke late, and that try ends DEADLINE_EXCEEDED: an earlier answer is the reason.
    answered = [(code, text) for code, text in codes if code != "DEADLINE_EXCEEDED"]
    if codes:
        code, text = (answered or codes)[-1]
        return _GRPC_KINDS.get(code, f"gRPC {code}"), text[:300]
    return "failed", (attempt.messages[-1][:300] if attempt.messages else "no detail")


@dataclass(slots=True)
class _Health:
    """One signal's export state; logs on change only, counts every failure."""

    signal: str
    endpoint: str
    failures: int = 0
    dropped: int = 0
    failing: str | None = None  # the failure kind while failing
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, ok: bool, kind: str = "", detail: str = "") -> None:
        with self.lock:
            if ok:
                if self.failing is not None:
                    log.info(
                        "OTLP export recovered",
                        extra={
                            "fields": {
                                "signal": self.signal,
                                "endpoint": self.endpoint,
                                "failures_total": self.failures,
                            }
                        },
                    )
                self.failing = None
                return
            self.failures += 1
            if self.failing != kind:
                log.warning(
                    "OTLP export failing; retrying with backoff",
                    extra={
                        "fields": {"signal": self.signal, "endpoint": self.endpoint, "reason": kind, "detail": detail}
                    },
                )
            self.failing = kind

    def drop(self, count: int = 1) -> None:
        with self.lock:
            self.dropped += count

    def attempt(self, export: Callable[[], object], success: object) -> bool:
        """Run one export, collecting the SDK's log lines; record whether it returned `success`."""
        attempt = _REASONS.capture()
        error: BaseException | None = None
        try:
            ok = export() is success
        except Exception as exc:  # an exporter bug must not kill the thread that exports
            error, ok = exc, False
        self.record(ok, *(("", "") if ok else classify(attempt, error)))
        return ok


class _TrackedMetricExporter(MetricExporter):
    """Wraps the OTLP metric exporter to count failures and log state changes."""

    def __init__(self, inner: MetricExporter, health: _Health) -> None:
        super().__init__(
            preferred_temporality=inner._preferred_temporality, preferred_aggregation=inner._preferred_aggregation
        )
        self._inner = inner
        self._health = health

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        ok = self._health.attempt(
            lambda: self._inner.export(metrics_data, timeout_millis=timeout_millis), MetricExportResult.SUCCESS
        )
        return MetricExportResult.SUCCESS if ok else MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis)


class CounterSource(Protocol):
    """A counter pass for one export (the agent's `counter_view`); `groups` keyed (device, kind, port)."""

    def __call__(self, wait_s: float | None) -> Any: ...


class _Observer:
    """Builds every instrument's observations once per collection from the last published record
    and one counter pass."""

    def __init__(self, counters: CounterSource | None = None) -> None:
        self.state: Published | None = None
        self._counters = counters
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
            stats, generation = state.stats, 0
            groups: list[tuple[str, CounterGroup]] = []
            health: tuple[Family, ...] = ()  # the sinks' own (consumer scan, OTLP health), as of now
            if self._counters is not None:
                view = self._counters(COUNTER_WAIT_S)
                stats, generation, health = view.stats, view.generation, view.families
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
        health: tuple[Family, ...] = (),
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
        self, exporter: LogRecordExporter, res: Resource, health: _Health, limit: int, max_backoff_s: float
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
    _note_http_results(metrics, settings.timeout_s)
    _note_http_results(logs, settings.timeout_s)
    return metrics, logs


class OtelSink:
    """An `agent.EventSink`: `publish` costs the poller a reference swap and a queue append."""

    def __init__(
        self,
        settings: OtlpSettings,
        counters: CounterSource | None = None,
        *,
        machine_id_files: Sequence[Path] = MACHINE_ID_FILES,
    ) -> None:
        _install_reasons()
        self.settings = settings
        metric_exporter, log_exporter = _exporters(settings)
        self.resource = resource(machine_id_files)
        where = settings.endpoint
        self.metrics_health = _Health("metrics", where)
        self.logs_health = _Health("logs", where)
        self._observer = _Observer(counters)
        self._reader = PeriodicExportingMetricReader(
            _TrackedMetricExporter(metric_exporter, self.metrics_health),
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
        """rnic_exporter_otlp_* for /metrics (the agent passes them to PrometheusSink.update)."""
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
