"""OTLP export settings: `serve --otlp.*` flags and the standard `OTEL_*` variables, resolved once.

Precedence, per setting: the flag (or its `RNIC_EXPORTER_SERVE_OTLP_*` variable), then the
standard OpenTelemetry variable, then the default. OTLP is on when an endpoint comes from either.
This module imports nothing of OpenTelemetry: `serve` without an endpoint never loads it.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from rnic_exporter.errors import ConfigError

Protocol = Literal["http/protobuf", "grpc"]
PROTOCOLS: tuple[Protocol, ...] = ("http/protobuf", "grpc")
DEFAULT_INTERVAL_S = 60.0  # OTEL_METRIC_EXPORT_INTERVAL's default
DEFAULT_TIMEOUT_S = 10.0

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class OtlpSettings:
    endpoint: str  # base URL: http(s)://host:4318 (/v1/metrics, /v1/logs appended) or the gRPC target
    protocol: Protocol = "http/protobuf"
    headers: Mapping[str, str] = field(default_factory=dict)
    insecure: bool | None = None  # gRPC only: plaintext; None = from the URL scheme (http:// is plaintext)
    certificate: Path | None = None  # CA bundle that signs the collector's certificate
    client_certificate: Path | None = None  # mTLS
    client_key: Path | None = None
    interval_s: float = DEFAULT_INTERVAL_S  # metric export interval
    timeout_s: float = DEFAULT_TIMEOUT_S  # one export, retries included
    queue_size: int = 2048  # events waiting for export; the oldest is dropped (and counted) beyond it

    def signal_url(self, signal: Literal["metrics", "logs"]) -> str:
        """OTLP/HTTP: the base endpoint plus /v1/<signal>, as OTEL_EXPORTER_OTLP_ENDPOINT is read."""
        return f"{self.endpoint.removesuffix('/')}/v1/{signal}"


def parse_headers(text: str, where: str) -> dict[str, str]:
    """'api-key=s3cret,x-tenant=gpu%20farm' -> {'api-key': 's3cret', 'x-tenant': 'gpu farm'} (W3C baggage form)."""
    headers: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = urllib.parse.unquote(key).strip().lower()
        if not sep or not key or any(c.isspace() for c in key):
            raise ConfigError(f"{where}: {item.strip()!r} is not name=value (comma-separated, URL-encoded)")
        headers[key] = urllib.parse.unquote(value).strip()
    return headers


def _truthy(text: str | None) -> bool:
    return (text or "").strip().lower() == "true"


def _file(value: str | None, where: str) -> Path | None:
    if not value:
        return None
    path = Path(value)
    if not path.is_file():
        raise ConfigError(f"{where}: {value} is not a readable file")
    return path


def resolve(flags: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> OtlpSettings | None:
    """Settings from `serve`'s otlp_* flags over the OTEL_* environment; None when no endpoint is set."""
    env = os.environ if environ is None else environ

    def pick(flag: str, var: str) -> tuple[str | None, str]:
        value = flags.get(flag)
        if value not in (None, ""):
            return str(value), f"--{flag.replace('otlp_', 'otlp.').replace('_', '-')}"
        return env.get(var) or None, var

    endpoint, endpoint_from = pick("otlp_endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT")
    if endpoint is None:
        return None
    protocol_text, protocol_from = pick("otlp_protocol", "OTEL_EXPORTER_OTLP_PROTOCOL")
    protocol = (protocol_text or "http/protobuf").strip()
    if protocol not in PROTOCOLS:
        raise ConfigError(f"{protocol_from}: {protocol!r} is not supported (choose {' or '.join(PROTOCOLS)})")
    scheme = urllib.parse.urlsplit(endpoint).scheme
    if protocol == "http/protobuf" and scheme not in ("http", "https"):
        raise ConfigError(f"{endpoint_from}: {endpoint!r} needs http:// or https:// for OTLP/HTTP")

    headers = parse_headers(env.get("OTEL_EXPORTER_OTLP_HEADERS", ""), "OTEL_EXPORTER_OTLP_HEADERS")
    if flags.get("otlp_headers"):
        headers.update(parse_headers(str(flags["otlp_headers"]), "--otlp.headers"))

    insecure: bool | None = None
    if flags.get("otlp_insecure") or _truthy(env.get("OTEL_EXPORTER_OTLP_INSECURE")):
        insecure = True
    if scheme == "https":  # an explicit https:// wins, as in the OpenTelemetry SDKs
        insecure = False

    files = {
        name: _file(*pick(f"otlp_{name}", f"OTEL_EXPORTER_OTLP_{name.upper()}"))
        for name in ("certificate", "client_certificate", "client_key")
    }
    if (files["client_certificate"] is None) != (files["client_key"] is None):
        raise ConfigError("--otlp.client-certificate and --otlp.client-key go together (mTLS)")

    interval = flags.get("otlp_interval")
    if interval is None:
        raw = env.get("OTEL_METRIC_EXPORT_INTERVAL")  # milliseconds, as the specification says
        try:
            interval = float(raw) / 1000 if raw else DEFAULT_INTERVAL_S
        except ValueError:
            raise ConfigError(f"OTEL_METRIC_EXPORT_INTERVAL: {raw!r} is not a number of milliseconds") from None
    if interval <= 0:
        raise ConfigError("the OTLP export interval must be positive")
    timeout = flags.get("otlp_timeout") or DEFAULT_TIMEOUT_S
    return OtlpSettings(
        endpoint=endpoint,
        protocol=protocol,
        headers=headers,
        insecure=insecure,
        certificate=files["certificate"],
        client_certificate=files["client_certificate"],
        client_key=files["client_key"],
        interval_s=float(interval),
        timeout_s=float(timeout),
    )


def otlp_options(f: F) -> F:
    """The `serve --otlp.*` flags; `resolve()` reads them."""
    import click

    from rnic_exporter.config.bounds import OTLP_INTERVAL, OTLP_TIMEOUT, NumberParam

    path = click.Path(dir_okay=False)
    options = [
        click.option(
            "--otlp.endpoint",
            "otlp_endpoint",
            default=None,
            metavar="URL",
            help="Export metrics and events over OTLP to this collector (http://host:4318 for "
            "http/protobuf, host:4317 for grpc). [env: OTEL_EXPORTER_OTLP_ENDPOINT]",
        ),
        click.option(
            "--otlp.protocol",
            "otlp_protocol",
            type=click.Choice(PROTOCOLS),
            default=None,
            help="http/protobuf (default) or grpc (needs rnic-exporter[grpc]). [env: OTEL_EXPORTER_OTLP_PROTOCOL]",
        ),
        click.option(
            "--otlp.headers",
            "otlp_headers",
            default=None,
            metavar="K=V,...",
            help="Request headers, e.g. api-key=...; added to OTEL_EXPORTER_OTLP_HEADERS.",
        ),
        click.option(
            "--otlp.insecure",
            "otlp_insecure",
            is_flag=True,
            default=False,
            help="gRPC without TLS for an endpoint without a scheme. [env: OTEL_EXPORTER_OTLP_INSECURE]",
        ),
        click.option(
            "--otlp.certificate",
            "otlp_certificate",
            type=path,
            default=None,
            metavar="FILE",
            help="CA certificate to verify the collector. [env: OTEL_EXPORTER_OTLP_CERTIFICATE]",
        ),
        click.option(
            "--otlp.client-certificate",
            "otlp_client_certificate",
            type=path,
            default=None,
            metavar="FILE",
            help="Client certificate for mTLS. [env: OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE]",
        ),
        click.option(
            "--otlp.client-key",
            "otlp_client_key",
            type=path,
            default=None,
            metavar="FILE",
            help="Client key for mTLS. [env: OTEL_EXPORTER_OTLP_CLIENT_KEY]",
        ),
        click.option(
            "--otlp.interval",
            "otlp_interval",
            type=NumberParam(OTLP_INTERVAL),
            default=None,
            help="Time between metric exports (30s, 1m, or seconds). "
            "[env: OTEL_METRIC_EXPORT_INTERVAL in ms; default 60]",
        ),
        click.option(
            "--otlp.timeout",
            "otlp_timeout",
            type=NumberParam(OTLP_TIMEOUT),
            default=None,
            help=f"Time (10s, 500ms, or seconds) one export may take, retries included. "
            f"[default: {DEFAULT_TIMEOUT_S:g}]",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f
