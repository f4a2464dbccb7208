"""In-process OTLP collectors (HTTP and gRPC) that decode what the exporter sends with opentelemetry-proto,
and the points and records they received."""

from __future__ import annotations

import gzip
import http.server
import ssl
import threading
import zlib
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

# --------------------------------------------------------------------------- receivers


def value_of(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return None if kind is None else getattr(v, kind)


def attrs_of(kvs: Any) -> dict[str, Any]:
    return {kv.key: value_of(kv.value) for kv in kvs}


@dataclass(frozen=True)
class Point:
    metric: str
    unit: str
    kind: str  # "sum" | "gauge"
    monotonic: bool
    attrs: dict[str, Any]
    value: float | int
    resource: dict[str, Any]


@dataclass(frozen=True)
class Record:
    event_name: str
    severity_number: int
    severity_text: str
    body: Any
    attrs: dict[str, Any]
    time_unix_nano: int
    resource: dict[str, Any]
    scope: str


@dataclass
class Received:
    """What a receiver decoded; thread-safe, with a condition to wait on."""

    metric_requests: list[metrics_service_pb2.ExportMetricsServiceRequest] = field(default_factory=list)
    log_requests: list[logs_service_pb2.ExportLogsServiceRequest] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_metrics(self, req: metrics_service_pb2.ExportMetricsServiceRequest, headers: dict[str, str]) -> None:
        with self.lock:
            self.metric_requests.append(req)
            self.headers.append(headers)

    def add_logs(self, req: logs_service_pb2.ExportLogsServiceRequest, headers: dict[str, str]) -> None:
        with self.lock:
            self.log_requests.append(req)
            self.headers.append(headers)

    def metric_count(self) -> int:
        with self.lock:
            return len(self.metric_requests)

    def latest_points(self) -> list[Point]:
        """Every data point of the newest metrics request (cumulative: it holds every series)."""
        with self.lock:
            if not self.metric_requests:
                return []
            req = self.metric_requests[-1]
        points: list[Point] = []
        for rm in req.resource_metrics:
            res = attrs_of(rm.resource.attributes)
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    kind = m.WhichOneof("data")
                    data = getattr(m, kind)
                    for dp in data.data_points:
                        value = getattr(dp, dp.WhichOneof("value"))
                        points.append(
                            Point(
                                m.name,
                                m.unit,
                                kind,
                                kind == "sum" and data.is_monotonic,
                                attrs_of(dp.attributes),
                                value,
                                res,
                            )
                        )
        return points

    def records(self) -> list[Record]:
        with self.lock:
            reqs = list(self.log_requests)
        out: list[Record] = []
        for req in reqs:
            for rl in req.resource_logs:
                res = attrs_of(rl.resource.attributes)
                for sl in rl.scope_logs:
                    for lr in sl.log_records:
                        out.append(
                            Record(
                                lr.event_name,
                                lr.severity_number,
                                lr.severity_text,
                                value_of(lr.body),
                                attrs_of(lr.attributes),
                                lr.time_unix_nano,
                                res,
                                sl.scope.name,
                            )
                        )
        return out


class HttpReceiver:
    """An OTLP/HTTP collector stand-in on 127.0.0.1: mode "ok", "hang" (answers nothing) or "503"; HTTPS with `tls`."""

    def __init__(self, port: int = 0, tls: ssl.SSLContext | None = None) -> None:
        self.received = Received()
        self.mode = "ok"
        self.release = threading.Event()  # ends every hanging request (at close)
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                encoding = self.headers.get("Content-Encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                mode = receiver.mode
                if mode == "hang":
                    receiver.release.wait(60)
                    return
                if mode == "503":
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                headers = {k.lower(): v for k, v in self.headers.items()}
                response: Any
                if self.path == "/v1/metrics":
                    req = metrics_service_pb2.ExportMetricsServiceRequest()
                    req.ParseFromString(body)
                    receiver.received.add_metrics(req, headers)
                    response = metrics_service_pb2.ExportMetricsServiceResponse()
                elif self.path == "/v1/logs":
                    logs = logs_service_pb2.ExportLogsServiceRequest()
                    logs.ParseFromString(body)
                    receiver.received.add_logs(logs, headers)
                    response = logs_service_pb2.ExportLogsServiceResponse()
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                payload = response.SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HttpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class GrpcReceiver:
    """An OTLP/gRPC collector stand-in on 127.0.0.1, plaintext or TLS with `tls` = (cert, key)."""

    def __init__(self, tls: tuple[Path, Path] | None = None) -> None:
        import grpc

        self.received = Received()
        received = self.received

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - the gRPC method name
                received.add_metrics(request, dict(context.invocation_metadata()))
                return metrics_service_pb2.ExportMetricsServiceResponse()

        class Logs(logs_service_pb2_grpc.LogsServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - the gRPC method name
                received.add_logs(request, dict(context.invocation_metadata()))
                return logs_service_pb2.ExportLogsServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), self.server)  # type: ignore[no-untyped-call]
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(Logs(), self.server)  # type: ignore[no-untyped-call]
        if tls is None:
            self.port = self.server.add_insecure_port("127.0.0.1:0")
        else:
            creds = grpc.ssl_server_credentials([(tls[1].read_bytes(), tls[0].read_bytes())])
            self.port = self.server.add_secure_port("127.0.0.1:0", creds)
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"

    def __enter__(self) -> GrpcReceiver:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(grace=None)
