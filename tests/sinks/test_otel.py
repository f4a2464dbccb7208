"""OTLP sink: the mapping table against the catalogue, settings, resource, and real OTLP bytes.

The receivers are in-process collectors (OTLP/HTTP and gRPC, tests/support/otlp.py) that decode what the exporter
sends with opentelemetry-proto; test_otel_e2e.py points the real daemon at them.
"""

from __future__ import annotations

import os
import re
import socket
import ssl
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc

from rnic_exporter import __version__
from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.catalog.events import BY_NAME as EVENTS
from rnic_exporter.catalog.events import OTEL_SEVERITY_NUMBER, Event
from rnic_exporter.config.otlp import OtlpSettings, resolve
from rnic_exporter.model.host import Snapshot
from rnic_exporter.sim import SimHost
from rnic_exporter.sinks import otel_metrics
from rnic_exporter.sinks.samples import ExporterStats, Family, Published, snapshot_families
from tests.support.agents import CarriedCounters
from tests.support.otel_table import readme_table
from tests.support.otlp import GrpcReceiver, HttpReceiver, Point
from tests.support.tls import self_signed
from tests.support.wait import wait_for

OTEL_DOC = Path(__file__).resolve().parents[2] / "docs" / "opentelemetry.md"


@pytest.fixture(params=["http/protobuf", "grpc"])
def receiver(request: pytest.FixtureRequest) -> Iterator[HttpReceiver | GrpcReceiver]:
    rcv: HttpReceiver | GrpcReceiver = HttpReceiver() if request.param == "http/protobuf" else GrpcReceiver()
    with rcv:
        yield rcv


def protocol_of(rcv: HttpReceiver | GrpcReceiver) -> str:
    return "grpc" if isinstance(rcv, GrpcReceiver) else "http/protobuf"


# --------------------------------------------------------------------------- the mapping table

UCUM = re.compile(r"^(1|By|By/s|s|Cel|V|W|A|\{[a-z]+\}|\{[a-z]+\}/s)$")
OTEL_NAME = re.compile(r"^(hw|rnic)(\.[a-z][a-z0-9_]*)+$")


def test_every_catalogue_metric_is_mapped_or_excluded_with_a_reason() -> None:
    mapped, excluded = set(otel_metrics.BY_SPEC), set(otel_metrics.EXCLUDED)
    assert mapped.isdisjoint(excluded)
    assert mapped | excluded == set(catalog.BY_NAME), "catalogue metrics without an OTel decision"
    assert all(len(reason) > 20 for reason in otel_metrics.EXCLUDED.values())
    assert len(otel_metrics.MAPPINGS) == len(mapped), "a catalogue metric is mapped twice"


def test_mapping_keeps_kind_units_and_labels() -> None:
    by_name: dict[str, otel_metrics.Instrument] = {}
    for mapping in otel_metrics.MAPPINGS:
        spec = mapping.spec
        assert catalog.BY_NAME[spec.name] is spec
        assert mapping.routes and mapping.routes[-1].only is None, f"{spec.name}: some samples have no route"
        for route in mapping.routes:
            inst = route.instrument
            assert by_name.setdefault(inst.name, inst) is inst, f"{inst.name} defined twice, differently"
            assert OTEL_NAME.match(inst.name), inst.name
            assert UCUM.match(inst.unit), f"{inst.name}: {inst.unit!r} is not a UCUM unit we use"
            assert inst.description
            # A Prometheus counter is monotonic: it must stay a counter; gauges and info never become one.
            assert (inst.kind == "counter") == (spec.kind == "counter"), spec.name
            units = {"bytes": "By", "bytes_per_second": "By/s", "seconds": "s", "celsius": "Cel", "volts": "V"}
            units.update(watts="W", amperes="A")
            if spec.unit in units:
                assert inst.unit == units[spec.unit], spec.name
            for label, _ in route.rename:
                assert label in spec.labels
            if route.only is not None:
                assert route.only[0] in spec.labels
            if route.hw_id:
                assert {"device", "port"} <= set(spec.labels)
            if inst.name.startswith("hw."):
                assert route.hw_id, f"{inst.name} requires hw.id (semantic conventions)"
    # Receive and transmit share hw.network.io, told apart by network.io.direction.
    io = [m for m in otel_metrics.MAPPINGS if m.routes[0].instrument.name == "hw.network.io"]
    assert sorted(dict(m.routes[0].constant)["network.io.direction"] for m in io) == ["receive", "transmit"]


def test_docs_table_is_the_generated_one() -> None:
    table = readme_table()
    assert table in OTEL_DOC.read_text(), (
        "docs/opentelemetry.md's metric table is stale; regenerate it with python -m tests.support.otel_table"
    )
    for spec in catalog.METRICS:
        assert f"| `{spec.name}` |" in table


def test_pma_error_counters_become_hw_errors() -> None:
    mapping = otel_metrics.BY_SPEC[catalog.PORT_PMA.name]
    route = mapping.route(("mlx5_0", "1", "symbol_error"))
    assert route.instrument.name == "hw.errors"
    assert mapping.attributes(route, ("mlx5_0", "1", "symbol_error")) == {
        "device": "mlx5_0",
        "port": "1",
        "error.type": "symbol_error",
        "hw.id": "mlx5_0/1",
        "hw.type": "network",
    }
    other = mapping.route(("mlx5_0", "1", "port_xmit_wait"))
    assert other.instrument.name == "rnic.port.pma"
    assert mapping.attributes(other, ("mlx5_0", "1", "port_xmit_wait")) == {
        "device": "mlx5_0",
        "port": "1",
        "counter": "port_xmit_wait",
    }


# --------------------------------------------------------------------------- settings


def test_no_endpoint_means_no_otlp() -> None:
    assert resolve({}, {}) is None
    assert resolve({"otlp_protocol": "grpc", "otlp_headers": "a=b"}, {"OTEL_EXPORTER_OTLP_HEADERS": "x=y"}) is None


def test_flags_beat_the_standard_variables(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not checked here")
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "https://env:4318",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_HEADERS": "api-key=from-env,x-tenant=gpu%20farm",
        "OTEL_METRIC_EXPORT_INTERVAL": "15000",
        "OTEL_EXPORTER_OTLP_CERTIFICATE": str(ca),
    }
    from_env = resolve({}, env)
    assert from_env == OtlpSettings(
        endpoint="https://env:4318",
        protocol="grpc",
        headers={"api-key": "from-env", "x-tenant": "gpu farm"},
        insecure=False,
        certificate=ca,
        interval_s=15.0,
    )
    flags = {
        "otlp_endpoint": "http://flag:4318",
        "otlp_protocol": "http/protobuf",
        "otlp_headers": "api-key=flag",
        "otlp_interval": 2.0,
        "otlp_timeout": 3.0,
    }
    from_flags = resolve(flags, env)
    assert from_flags is not None
    assert (from_flags.endpoint, from_flags.protocol, from_flags.interval_s, from_flags.timeout_s) == (
        "http://flag:4318",
        "http/protobuf",
        2.0,
        3.0,
    )
    assert from_flags.headers == {"api-key": "flag", "x-tenant": "gpu farm"}  # per name, the flag wins
    assert from_flags.signal_url("logs") == "http://flag:4318/v1/logs"
    assert resolve(
        {"otlp_endpoint": "collector:4317", "otlp_protocol": "grpc", "otlp_insecure": True}, {}
    ) == OtlpSettings(endpoint="collector:4317", protocol="grpc", insecure=True)


@pytest.mark.parametrize(
    "flags, env, message",
    [
        ({"otlp_endpoint": "collector:4318"}, {}, "needs http:// or https://"),
        (
            {},
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
            "OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json' is not supported",
        ),
        ({"otlp_endpoint": "http://c:4318", "otlp_headers": "no-equals-sign"}, {}, "--otlp.headers"),
        ({"otlp_endpoint": "http://c:4318", "otlp_client_key": "/nonexistent/key.pem"}, {}, "not a readable file"),
        ({"otlp_endpoint": "http://c:4318"}, {"OTEL_METRIC_EXPORT_INTERVAL": "soon"}, "OTEL_METRIC_EXPORT_INTERVAL"),
    ],
)
def test_bad_settings_are_one_clear_error(flags: dict[str, Any], env: dict[str, str], message: str) -> None:
    from rnic_exporter.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        resolve(flags, env)


# --------------------------------------------------------------------------- the sink, in process


def test_resource_has_service_host_and_user_attributes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rnic_exporter.sinks.otel import resource

    machine_id = tmp_path / "machine-id"
    machine_id.write_text("0123456789abcdef0123456789abcdef\n")
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=prod,k8s.node.name=gpu-17")
    attrs = dict(resource([tmp_path / "missing", machine_id]).attributes)
    assert attrs["service.name"] == "rnic-exporter" and attrs["service.version"] == __version__
    assert attrs["host.name"] == socket.gethostname()
    assert attrs["host.id"] == "0123456789abcdef0123456789abcdef"
    assert attrs["k8s.node.name"] == "gpu-17" and attrs["deployment.environment.name"] == "prod"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "rnic-exporter-canary")
    attrs = dict(resource([tmp_path / "missing"]).attributes)
    assert attrs["service.name"] == "rnic-exporter-canary" and "host.id" not in attrs


def _events(snap: Snapshot) -> list[Event]:
    return [
        Event(
            EVENTS["rnic.gid.address_moved"],
            "mlx5_0 port 1: 10.0.0.1 moved from GID index 3 to 5",
            device="mlx5_0",
            port=1,
            netdev="ens1f0np0",
            pci_address="0000:3b:00.0",
            before="3",
            after="5",
            attributes={"address": "10.0.0.1"},
            time=snap.taken_at,
        ),
        Event(
            EVENTS["rnic.device.disappeared"],
            "mlx5_1 (0000:5e:00.0) is gone",
            device="mlx5_1",
            pci_address="0000:5e:00.0",
            time=snap.taken_at,
        ),
        Event(
            EVENTS["rnic.link.below_rated"],
            "mlx5_2 port 1 runs at 200 Gb/s, rated 400",
            device="mlx5_2",
            port=1,
            before="400 Gb/s",
            after="200 Gb/s",
            attributes={"link": "port"},
            severity_override="critical",
            time=snap.taken_at,
        ),
    ]


def _settings(rcv: HttpReceiver | GrpcReceiver, **kw: Any) -> OtlpSettings:
    return OtlpSettings(
        endpoint=rcv.url,
        protocol=protocol_of(rcv),  # type: ignore[arg-type]
        headers={"x-tenant": "gpu-farm"},
        interval_s=0.2,
        timeout_s=2.0,
        **kw,
    )


def test_sink_exports_the_catalogue_and_events(
    receiver: HttpReceiver | GrpcReceiver, sim_host: SimHost, read_sim: Callable[[SimHost], Snapshot]
) -> None:
    from rnic_exporter.sinks.otel import OtelSink

    snap = read_sim(sim_host)
    stats = ExporterStats(polls=7, read_errors_by_reason={"EIO": 2})
    detection = Family(catalog.LINK_BELOW_RATED, [(("mlx5_2", "1", "port"), 1)])
    sink = OtelSink(_settings(receiver), CarriedCounters(stats))
    try:
        events = _events(snap)
        sink.publish(Published(snap, tuple(events), stats, (detection,)))
        rcv = receiver.received
        wait_for(lambda: len(rcv.records()) == 3 and rcv.latest_points(), timeout=20, what="metrics and 3 records")
    finally:
        sink.close()

    points = rcv.latest_points()
    by_metric: dict[str, list[Point]] = {}
    for p in points:
        by_metric.setdefault(p.metric, []).append(p)
    # Every mapped family the snapshot has arrives, under its OTel name, with its unit and kind.
    expected: set[str] = set()
    for family in [*snapshot_families(snap, stats), detection]:
        mapping = otel_metrics.BY_SPEC.get(family.spec.name)
        if mapping is not None and family.samples:
            expected |= {mapping.route(labels).instrument.name for labels, _ in family.samples}
    assert set(by_metric) == expected
    units = {i.name: i for i in otel_metrics.instruments()}
    for name, pts in by_metric.items():
        inst = units[name]
        assert {p.unit for p in pts} == {inst.unit}
        want_kind = ("gauge", False) if inst.kind == "gauge" else ("sum", inst.kind == "counter")
        assert {(p.kind, p.monotonic) for p in pts} == {want_kind}, name

    def one(metric: str, **attrs: Any) -> float | int:
        found = [p.value for p in by_metric[metric] if attrs.items() <= p.attrs.items()]
        assert len(found) == 1, (metric, attrs, found)
        return found[0]

    port0 = next(p for p in snap.ports if p.device == "mlx5_0")
    assert (
        one("hw.network.io", **{"hw.id": "mlx5_0/1", "network.io.direction": "transmit"})
        == port0.counters["port_xmit_data"].value
    )
    assert one("hw.network.bandwidth.limit", device="mlx5_0", port="1") == 50e9
    assert one("hw.network.up", **{"hw.id": "mlx5_2/1"}) == 1
    gid_hash = one("rnic.gid.table.hash", device="mlx5_0", port="1")
    assert gid_hash == port0.gid_hash and isinstance(gid_hash, int)  # exact: sent as an integer
    assert one("rnic.exporter.polls") == 7 and one("rnic.exporter.read_errors", reason="EIO") == 2
    assert one("rnic.link.below_rated", device="mlx5_2", link="port") == 1
    assert one("rnic.netdev.speed", netdev="ens1f0np0") == 50e9
    assert points[0].resource["service.name"] == "rnic-exporter"

    records = {r.event_name: r for r in rcv.records()}
    assert set(records) == {e.name for e in events}
    moved = records["rnic.gid.address_moved"]
    assert moved.severity_number == OTEL_SEVERITY_NUMBER["critical"] == 17 and moved.severity_text == "ERROR"
    assert moved.attrs == {
        "device": "mlx5_0",
        "port": "1",
        "netdev": "ens1f0np0",
        "pci_address": "0000:3b:00.0",
        "before": "3",
        "after": "5",
        "address": "10.0.0.1",
    }
    assert moved.body == events[0].message and moved.time_unix_nano == int(snap.taken_at * 1e9)
    assert moved.scope == "rnic_exporter.events"
    assert moved.resource["service.version"] == __version__ and moved.resource["host.name"] == socket.gethostname()
    slow = records["rnic.link.below_rated"]
    assert (slow.severity_number, slow.severity_text) == (17, "ERROR")  # the event raised its severity
    assert records["rnic.device.disappeared"].attrs == {"device": "mlx5_1", "pci_address": "0000:5e:00.0"}
    # Headers reach the collector (authenticated collectors) on both signals.
    with rcv.lock:
        assert all(h.get("x-tenant") == "gpu-farm" for h in rcv.headers)
    assert sink.families()[0].samples == [(("metrics",), 0), (("logs",), 0)]


def test_a_removed_nic_leaves_the_export(sim_host: SimHost, read_sim: Callable[[SimHost], Snapshot]) -> None:
    from rnic_exporter.sinks.otel import OtelSink

    with HttpReceiver() as rcv:
        sink = OtelSink(_settings(rcv), CarriedCounters())
        try:
            sink.publish(Published(read_sim(sim_host), (), ExporterStats(), ()))
            wait_for(
                lambda: any(p.attrs.get("device") == "mlx5_1" for p in rcv.received.latest_points()),
                timeout=20,
                what="mlx5_1 exported",
            )
            sim_host.remove_device("mlx5_1")
            sink.publish(Published(read_sim(sim_host), (), ExporterStats(), ()))
            wait_for(
                lambda: (
                    rcv.received.latest_points()
                    and not any(p.attrs.get("device") == "mlx5_1" for p in rcv.received.latest_points())
                ),
                timeout=20,
                what="mlx5_1 gone from the export",
            )
        finally:
            sink.close()


def test_full_event_queue_drops_the_oldest_and_counts(
    sim_host: SimHost, read_sim: Callable[[SimHost], Snapshot]
) -> None:
    from rnic_exporter.sinks.otel import OtelSink

    snap = read_sim(sim_host)
    with HttpReceiver() as rcv:
        rcv.mode = "503"
        sink = OtelSink(_settings(rcv, queue_size=2), CarriedCounters())
        try:
            sink.publish(Published(snap, tuple(_events(snap)), ExporterStats(), ()))  # three events, room for two
            assert sink.families()[1].samples == [(("metrics",), 0), (("logs",), 1)]
            wait_for(lambda: dict(sink.families()[0].samples)[("logs",)] >= 1, timeout=20, what="a failed export")
            rcv.mode = "ok"
            wait_for(lambda: len(rcv.received.records()) == 2, timeout=30, what="the two kept events")
            assert [r.event_name for r in rcv.received.records()] == [
                "rnic.device.disappeared",
                "rnic.link.below_rated",
            ]
        finally:
            sink.close()


def record_tries(client: Any) -> list[float]:
    """The timeout of every HTTP try the SDK's OTLP client sends, in order."""
    sent: list[float] = []
    request = client._transport.request

    def recording_request(*args: Any, **kwargs: Any) -> Any:
        sent.append(kwargs["timeout"])
        return request(*args, **kwargs)

    client._transport.request = recording_request
    return sent


class LateWakingEvent(threading.Event):
    """The SDK's backoff wait on a loaded host: it wakes `late_s` after it was asked to."""

    def __init__(self, late_s: float) -> None:
        super().__init__()
        self.late_s = late_s

    def wait(self, timeout: float | None = None) -> bool:
        time.sleep((timeout or 0.0) + self.late_s)
        return self.is_set()


@pytest.mark.parametrize("late_s", [2.0, 1.97], ids=["past the deadline", "30 ms before it"])
def test_a_retry_without_time_left_keeps_the_collectors_answer_as_the_reason(late_s: float) -> None:
    """CI saw reason=ValueError ("Attempted to set total timeout to 0.0") and reason=timeout ("read
    timeout=0") while the collector answered 503: the SDK's backoff wait woke at or just before the
    export's deadline, and it sent a try with no time left."""
    from rnic_exporter.sinks.otel import _exporters
    from rnic_exporter.sinks.otel_failures import Health, install_reasons

    install_reasons()
    with HttpReceiver() as rcv:
        rcv.mode = "503"
        metrics, _logs = _exporters(OtlpSettings(endpoint=rcv.url, protocol="http/protobuf", timeout_s=3.0))
        client = metrics._client  # type: ignore[attr-defined]
        client._jitter = 0.0  # a backoff of exactly 1 s: it fits the 3 s budget unless the 503 took 2 s
        client._shutdown_event = LateWakingEvent(late_s)
        sent = record_tries(client)
        health = Health("metrics", rcv.url)
        results: list[Any] = []

        def export() -> Any:
            results.append(client.export(b""))
            return results[-1]

        assert not health.attempt(export, object())
    assert len(sent) == 1 and sent[0] > 0, sent  # the 503; no try is sent with no time left
    assert results[0].error is not None, "the SDK gave up before it retried: nothing tested"
    assert health.failing == "HTTP 503" and health.failures == 1
    assert isinstance(results[0].error, TimeoutError)  # what the SDK itself reports: out of time


def test_the_first_try_is_sent_at_the_smallest_timeout_allowed() -> None:
    from rnic_exporter.config.bounds import OTLP_TIMEOUT
    from rnic_exporter.sinks.otel import _exporters

    with HttpReceiver() as rcv:
        metrics, _logs = _exporters(
            OtlpSettings(endpoint=rcv.url, protocol="http/protobuf", timeout_s=OTLP_TIMEOUT.low)
        )
        client = metrics._client  # type: ignore[attr-defined]
        sent = record_tries(client)
        client.export(b"")  # whether 50 ms was enough on a loaded machine is not the question
    assert len(sent) >= 1 and sent[0] > OTLP_TIMEOUT.low / 2


def test_a_grpc_retry_without_time_left_keeps_the_collectors_answer_as_the_reason() -> None:
    """The gRPC exporter sends its retry with `deadline - now`, negative when its backoff wait woke
    late: DEADLINE_EXCEEDED at once, while the collector had answered UNAVAILABLE."""
    import grpc
    from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData

    from rnic_exporter.sinks.otel import _exporters
    from rnic_exporter.sinks.otel_failures import REASONS, Health, install_reasons

    calls: list[float | None] = []

    class Refusing(metrics_service_pb2_grpc.MetricsServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - the gRPC method name
            calls.append(context.time_remaining())
            context.abort(grpc.StatusCode.UNAVAILABLE, "collector overloaded")

    install_reasons()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Refusing(), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        metrics, _logs = _exporters(OtlpSettings(endpoint=f"http://127.0.0.1:{port}", protocol="grpc", timeout_s=3.0))
        # The SDK's backoff (0.8-1.2 s) fits the 3 s budget; its wait then wakes past the deadline.
        metrics._shutdown_in_progress = LateWakingEvent(late_s=2.5)  # type: ignore[attr-defined]
        health = Health("metrics", "collector")
        assert not health.attempt(lambda: metrics.export(MetricsData(resource_metrics=[])), MetricExportResult.SUCCESS)
    finally:
        server.stop(grace=None)
    attempt = REASONS.current()
    assert attempt is not None and any("retrying" in m for m in attempt.messages), "no retry: nothing tested"
    assert len(calls) == 1  # the UNAVAILABLE; the retry with no time left never reached the collector
    assert health.failing == "unreachable" and health.failures == 1


def test_tls_collector_with_ca_and_client_certificate(
    tmp_path: Path, sim_host: SimHost, read_sim: Callable[[SimHost], Snapshot]
) -> None:
    from rnic_exporter.sinks.otel import OtelSink

    server_cert, server_key = self_signed(tmp_path, "collector")
    client_cert, client_key = self_signed(tmp_path, "client")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(server_cert, server_key)
    ctx.verify_mode = ssl.CERT_REQUIRED  # mTLS: the collector wants our client certificate
    ctx.load_verify_locations(client_cert)
    snap = read_sim(sim_host)
    with HttpReceiver(tls=ctx) as rcv:
        assert rcv.url.startswith("https://")
        base: dict[str, Any] = {"endpoint": rcv.url, "certificate": server_cert, "interval_s": 0.2, "timeout_s": 1.0}
        sink = OtelSink(OtlpSettings(**base, client_certificate=client_cert, client_key=client_key), CarriedCounters())
        try:
            sink.publish(Published(snap, tuple(_events(snap)), ExporterStats(), ()))
            wait_for(
                lambda: rcv.received.latest_points() and len(rcv.received.records()) == 3,
                timeout=20,
                what="metrics and events over mTLS",
            )
        finally:
            sink.close()
        before = rcv.received.metric_count()
        anonymous = OtelSink(OtlpSettings(**base), CarriedCounters())  # no client certificate: the handshake fails
        try:
            anonymous.publish(Published(snap, (), ExporterStats(), ()))
            wait_for(
                lambda: dict(anonymous.families()[0].samples)[("metrics",)] >= 2,
                timeout=20,
                what="refused exports counted",
            )
        finally:
            anonymous.close()
        assert rcv.received.metric_count() == before


def test_grpc_over_tls_with_the_collector_ca(
    tmp_path: Path, sim_host: SimHost, read_sim: Callable[[SimHost], Snapshot]
) -> None:
    from rnic_exporter.sinks.otel import OtelSink

    cert, key = self_signed(tmp_path, "collector")
    snap = read_sim(sim_host)
    with GrpcReceiver(tls=(cert, key)) as rcv:
        settings = OtlpSettings(
            endpoint=f"127.0.0.1:{rcv.port}",
            protocol="grpc",
            certificate=cert,
            headers={"authorization": "Bearer t0ken"},
            interval_s=0.2,
            timeout_s=2.0,
        )
        sink = OtelSink(settings, CarriedCounters())
        try:
            sink.publish(Published(snap, tuple(_events(snap)[:1]), ExporterStats(), ()))
            wait_for(
                lambda: rcv.received.latest_points() and rcv.received.records(),
                timeout=20,
                what="metrics and an event over gRPC with TLS",
            )
        finally:
            sink.close()
        with rcv.received.lock:
            assert all(h.get("authorization") == "Bearer t0ken" for h in rcv.received.headers)


# --------------------------------------------------------------------------- imports and extras


def _run_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    root = Path(__file__).resolve().parents[2]
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, **(env or {})},
        timeout=60,
    )


_SERVE_ONE_POLL = """
    import sys, threading, tempfile, urllib.request, time
    from pathlib import Path
    from rnic_exporter.daemon import agent, serve
    from rnic_exporter.sim import SimHost
    from rnic_exporter.config.otlp import resolve
    host = SimHost.build(Path(tempfile.mkdtemp()) / "sys", roce=2, gid_table_size=16)
    otlp = resolve({"otlp_endpoint": sys.argv[1] if len(sys.argv) > 1 else None})
    config = agent.ServeConfig(sysfs=host.root, listen=("127.0.0.1:0",), state_dir=None, poll_interval_s=0.1,
                               watch_netlink=False, watch_udev=False, otlp=otlp)
    stop = threading.Event()
    polled = []
    real = agent.Agent.poll_once
    def poll_once(self, *a, **k):
        snap = real(self, *a, **k)
        polled.append(snap)
        return snap
    agent.Agent.poll_once = poll_once
    t = threading.Thread(target=serve.run, args=(config,), kwargs={"stop": stop})
    t.start()
    deadline = time.monotonic() + 30
    while len(polled) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    t.join(30)
    assert len(polled) >= 2, "the daemon did not poll"
    print(" ".join(sorted(m for m in sys.modules if m.split(".")[0] in ("opentelemetry", "grpc"))))
"""


def test_without_an_endpoint_nothing_of_opentelemetry_is_imported() -> None:
    env = {k: "" for k in os.environ if k.startswith("OTEL_")}
    off = _run_python(_SERVE_ONE_POLL, env)
    assert off.returncode == 0, off.stderr
    assert off.stdout.strip() == "", f"imported without --otlp.endpoint: {off.stdout[:300]}"
    # The same program with an endpoint does load it: the check above can fail.
    with HttpReceiver() as rcv:
        on = _run_python(_SERVE_ONE_POLL.replace("sys.argv[1] if len(sys.argv) > 1 else None", repr(rcv.url)), env)
    assert on.returncode == 0, on.stderr
    assert "opentelemetry.sdk.metrics" in on.stdout.split()


@pytest.mark.parametrize(
    "hidden, protocol, message",
    [
        (
            "grpc",
            ["--otlp.protocol", "grpc", "--otlp.insecure"],
            "--otlp.protocol grpc needs the grpc extra: reinstall with it from the checkout (pip install '.[grpc]')",
        ),
        (
            "opentelemetry.sdk",
            [],
            "OTLP export needs the otel extra: reinstall with it from the checkout (pip install '.[otel]')",
        ),
    ],
)
def test_a_missing_extra_is_a_one_line_error(tmp_path: Path, hidden: str, protocol: list[str], message: str) -> None:
    host = SimHost.build(tmp_path / "sys", roce=1, gid_table_size=8)
    code = f"""
        import sys
        sys.modules[{hidden!r}] = None  # as if the extra was not installed
        sys.argv = ["rnic-exporter", "serve", "--path.sysfs", {str(host.root)!r}, "--state.dir", "",
                    "--web.listen-address", "127.0.0.1:0", "--otlp.endpoint", "http://collector:4317", *{protocol!r}]
        from rnic_exporter.cli import run
        run()
    """
    result = _run_python(code)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"rnic-exporter: error: {message}")
    assert "Traceback" not in result.stderr


def test_serve_rejects_a_bad_standard_variable_in_one_line(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from rnic_exporter.cli import main

    result = CliRunner().invoke(
        main,
        ["serve", "--path.sysfs", str(tmp_path), "--state.dir", ""],
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"},
    )
    assert result.exit_code == 2
    assert result.output.strip() == (
        "rnic-exporter: error: OTEL_EXPORTER_OTLP_ENDPOINT: 'collector:4318' needs http:// or https:// for OTLP/HTTP"
    )
