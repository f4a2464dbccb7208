"""The OTLP exporters' failures: why an export failed, in a short stable kind, and each signal's health.

The SDK logs every failed attempt and retry; a collector down for an hour would fill the journal.
Its log records are taken here (`Reasons`) and become the reason of a failure; `Health` logs once
per change of state and counts every failure for rnic_exporter_otlp_export_failures_total. Over
HTTP the exporter's client is wrapped (`note_http_results`) so the reason is the collector's answer
and a retry is not sent without time left in the export's --otlp.timeout.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

log = logging.getLogger("rnic_exporter.otel")

# Less time than this (or half of --otlp.timeout) left for a retry inside one export: not sent.
# Loopback and sidecar collectors answer in a few ms; a try with less left mostly times out and
# reports a hang that is not there.
MIN_TRY_S = 0.05


@dataclass(slots=True)
class Attempt:
    """What one export attempt left behind: the SDK's log lines and, over HTTP, its final result."""

    messages: list[str] = field(default_factory=list)
    outcome: tuple[str, str] | None = None  # (kind, detail)


class Reasons(logging.Handler):
    """Takes the OTel SDK's own log records: exporter retry chatter becomes the reason of a failure.

    The SDK logs every failed attempt (and each retry) as a warning or error; a collector that is
    down for an hour would fill the journal. We log once per change of state instead (`Health`).
    Exports run on the thread that asked for them, so a thread-local attempt collects them.
    """

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.local = threading.local()

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("opentelemetry.exporter"):
            attempt: Attempt | None = getattr(self.local, "attempt", None)
            if attempt is not None:
                attempt.messages.append(record.getMessage())
            log.debug("otel sdk: %s", record.getMessage())
        else:
            log.log(record.levelno, "otel sdk: %s", record.getMessage())

    def capture(self) -> Attempt:
        attempt = self.local.attempt = Attempt()
        return attempt

    def current(self) -> Attempt | None:
        attempt: Attempt | None = getattr(self.local, "attempt", None)
        return attempt


REASONS = Reasons()
_SDK_LOGGER = logging.getLogger("opentelemetry")


def install_reasons() -> None:
    if REASONS not in _SDK_LOGGER.handlers:
        _SDK_LOGGER.addHandler(REASONS)
        _SDK_LOGGER.propagate = False
        _SDK_LOGGER.setLevel(logging.DEBUG)


def error_kind(error: BaseException) -> str:
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


def failure_outcome(result: Any) -> tuple[str, str] | None:
    """(kind, detail) of a failed HTTP result (one try's, or an export's); None for a success."""
    status, error = getattr(result, "status_code", None), getattr(result, "error", None)
    if status is not None:
        return (
            None
            if 200 <= status < 400
            else (f"HTTP {status}", f"{status} {getattr(result, 'reason', '') or ''}".strip())
        )
    if error is not None:
        return error_kind(error), str(error)[:300]
    return None


def note_http_results(exporter: Any, budget_s: float) -> None:
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
        attempt = REASONS.current()
        outcome = failure_outcome(result)
        if attempt is not None and outcome is not None:
            attempt.outcome = outcome
        return result

    def export(data: bytes) -> Any:
        result = inner(data)
        attempt = REASONS.current()
        outcome = failure_outcome(result)
        if attempt is not None and outcome is not None:
            spent = isinstance(getattr(result, "error", None), ExportBudgetSpentError)
            if not (spent and attempt.outcome is not None):
                attempt.outcome = outcome
        return result

    client._submit = guarded_submit
    client.export = export


_GRPC_KINDS = {"UNAVAILABLE": "unreachable", "DEADLINE_EXCEEDED": "timeout"}
_GRPC_CODE = re.compile(r"StatusCode\.(\w+)")


def classify(attempt: Attempt, error: BaseException | None = None) -> tuple[str, str]:
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
class Health:
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
        attempt = REASONS.capture()
        error: BaseException | None = None
        try:
            ok = export() is success
        except Exception as exc:  # an exporter bug must not kill the thread that exports
            error, ok = exc, False
        self.record(ok, *(("", "") if ok else classify(attempt, error)))
        return ok


class TrackedMetricExporter(MetricExporter):
    """Wraps the OTLP metric exporter to count failures and log state changes."""

    def __init__(self, inner: MetricExporter, health: Health) -> None:
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
