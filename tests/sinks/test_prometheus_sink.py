"""The Prometheus rendering of snapshots: isolation of bad attributes, golden file, promtool lint."""

from __future__ import annotations

import dataclasses
import gzip
import re
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.model.host import Snapshot
from rnic_exporter.sim import SimHost
from rnic_exporter.sim.sysfs_root import SimSysfsRoot
from rnic_exporter.sinks.samples import ExporterStats
from rnic_exporter.sources.reader import HostReader
from tests.support.agents import FedSink
from tests.support.exposition import render_text, value
from tests.support.processes import require_binary

GOLDEN = Path(__file__).parents[1] / "golden" / "procfs-fixture.prom"


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def read(root: Path, host: SimHost | None = None) -> Snapshot:
    overlay = host.errno_overlay if host is not None else None
    return HostReader(SimSysfsRoot(root, errno_overlay=overlay)).read()


def test_malformed_rate_costs_only_that_series(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=2, infiniband=1, gid_table_size=16)
    healthy = render_text(read(host.root, host))
    host.corrupt("mlx5_1", "ports/1/rate", "garbage\n")
    text = render_text(read(host.root, host))

    rate = catalog.PORT_ACTIVE_RATE.name
    assert value(text, rate, device="mlx5_0", port="1") == 50e9
    assert value(text, rate, device="mlx5_2", port="1") == 50e9
    assert value(text, rate, device="mlx5_1", port="1") is None
    unavailable = [k for k in samples(text) if k[0] == catalog.ATTRIBUTE_UNAVAILABLE.name]
    assert unavailable == [
        (
            catalog.ATTRIBUTE_UNAVAILABLE.name,
            frozenset({("device", "mlx5_1"), ("port", "1"), ("attribute", "rate"), ("reason", "malformed")}),
        )
    ]
    # Everything else is exactly as before: only the rate series went, one unavailable series came.
    before, after = samples(healthy), samples(text)
    gone = set(before) - set(after)
    assert {k[0] for k in gone} == {rate, catalog.PORT_ACTIVE_WIDTH.name}
    assert all(dict(k[1])["device"] == "mlx5_1" for k in gone)
    changed = {k for k in set(before) & set(after) if before[k] != after[k] and not k[0].startswith("rnic_exporter")}
    assert changed == set()


def test_unreadable_value_is_absent_not_zero(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=1, gid_table_size=8)
    host.corrupt("mlx5_0", "ports/1/counters/symbol_error", "N/A (no PMA)\n")
    host.corrupt("mlx5_0", "ports/1/counters/link_downed", "lots\n")
    text = render_text(read(host.root, host))
    assert value(text, catalog.PORT_PMA.name, device="mlx5_0", port="1", counter="symbol_error") is None
    assert value(text, catalog.PORT_PMA.name, device="mlx5_0", port="1", counter="link_downed") is None
    assert value(text, catalog.PORT_PMA.name, device="mlx5_0", port="1", counter="port_rcv_errors") == 0
    # Not provided by the driver from the first read on: listed, never "unavailable" (no alert).
    assert (
        value(
            text,
            catalog.ATTRIBUTE_UNSUPPORTED.name,
            device="mlx5_0",
            port="1",
            attribute="counters/symbol_error",
            reason="no_pma",
        )
        == 1
    )
    assert (
        value(
            text,
            catalog.ATTRIBUTE_UNAVAILABLE.name,
            device="mlx5_0",
            port="1",
            attribute="counters/symbol_error",
            reason="no_pma",
        )
        is None
    )
    assert (
        value(
            text,
            catalog.ATTRIBUTE_UNAVAILABLE.name,
            device="mlx5_0",
            port="1",
            attribute="counters/link_downed",
            reason="malformed",
        )
        == 1
    )


def test_every_exposed_name_is_in_the_catalogue(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=2, infiniband=1, gid_table_size=16)
    host.corrupt("mlx5_0", "ports/1/rate", "x")
    text = render_text(read(host.root, host), ExporterStats(polls=3, read_errors_by_reason={"malformed": 1}))
    exposed = {name for name, _ in samples(text)}
    assert exposed <= set(catalog.BY_NAME), exposed - set(catalog.BY_NAME)
    for spec in catalog.METRICS:
        if spec in catalog.PROCESS_METRICS.values():  # prometheus-client's own names, python_info a gauge
            assert re.fullmatch(r"(process|python)_[a-z0-9_]+", spec.name), spec.name
            continue
        assert re.fullmatch(r"rnic_[a-z0-9_]+", spec.name), spec.name
        assert spec.name.endswith("_total") == (spec.kind == "counter"), spec.name
        assert spec.name.endswith("_info") == (spec.kind == "info"), spec.name


def test_exposition_passes_promtool(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=2, infiniband=1, gid_table_size=16)
    host.gid_shift("mlx5_0")
    text = render_text(read(host.root, host))
    lint = subprocess.run([require_binary("promtool"), "check", "metrics"], input=text.encode(), capture_output=True)
    assert lint.returncode == 0 and not lint.stdout and not lint.stderr, lint.stdout + lint.stderr


def test_sink_negotiates_format_and_gzip(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=1, gid_table_size=8)
    reader = HostReader(SimSysfsRoot(host.root, errno_overlay=host.errno_overlay))
    sink = FedSink(reader)
    sink.publish(reader.read(), ExporterStats(polls=1))
    body, headers = sink.render(None, None)
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    om, om_headers = sink.render("application/openmetrics-text; version=1.0.0", None)
    assert om_headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    assert om.endswith(b"# EOF\n") and b"# UNIT rnic_port_active_rate_bytes_per_second bytes_per_second" not in om
    gz, gz_headers = sink.render(None, "gzip, deflate")
    assert gz_headers["Content-Encoding"] == "gzip" and gzip.decompress(gz) == body
    # The same bytes are served until the next poll: a scrape renders nothing new.
    assert sink.render(None, None)[0] is body
    host.set_speed("mlx5_0", 100)
    sink.publish(reader.read(), ExporterStats(polls=2))
    new_body, _ = sink.render(None, None)
    assert value(new_body.decode(), catalog.PORT_ACTIVE_RATE.name, device="mlx5_0", port="1") == 12.5e9


def test_golden_exposition_of_captured_tree(request: pytest.FixtureRequest, fixture_sys: Path) -> None:
    snap = dataclasses.replace(read(fixture_sys), taken_at=1_700_000_000.0, read_seconds=0.001)
    text = render_text(snap)
    text = re.sub(r"^rnic_exporter_build_info\{.*\n", "", text, flags=re.M)  # carries the Python version
    if request.config.getoption("--update-golden"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "exposition changed; review and rerun with --update-golden"


def test_renderer_matches_prometheus_client_in_both_formats(tmp_path: Path) -> None:
    """Our cached renderer must print exactly what prometheus-client's encoders print."""
    from prometheus_client.exposition import generate_latest
    from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

    from rnic_exporter.sinks.samples import snapshot_families
    from tests.support.exposition import Renderer

    host = SimHost.build(tmp_path / "sys", roce=2, infiniband=1, gid_table_size=16)
    host.corrupt("mlx5_0", "ports/1/rate", 'bad "quoted" \\ value')
    families = list(snapshot_families(read(host.root, host), ExporterStats(polls=2)))

    client: list[Metric] = []
    for family in families:
        spec = family.spec
        metric: Metric
        if spec.kind == "info":
            metric = InfoMetricFamily(spec.family_name, spec.help, labels=spec.labels)
            for labels, _ in family.samples:
                metric.add_metric([], dict(zip(spec.labels, labels, strict=True)))
        else:
            cls = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
            metric = cls(spec.family_name, spec.help, labels=spec.labels)
            for labels, v in family.samples:
                metric.add_metric(list(labels), v)
        client.append(metric)

    class Registry:
        def collect(self) -> list[Metric]:
            return client

    renderer = Renderer()
    for _ in range(2):  # the second pass serves cached lines
        text, om = renderer.render(families)
        assert text == generate_latest(Registry())
        assert om == generate_openmetrics(Registry())  # type: ignore[no-untyped-call]


def test_incremental_rendering_matches_a_full_render_poll_after_poll(tmp_path: Path) -> None:
    """The sink re-renders only parts whose sources changed; its bytes must still be exactly what a
    from-scratch render of the same snapshot and extra families gives, whatever changed between polls."""
    import itertools

    from rnic_exporter.sinks.samples import Family, snapshot_families
    from tests.support.exposition import Renderer

    host = SimHost.build(tmp_path / "sys", roce=3, infiniband=1, gid_table_size=16)
    overlay = host.errno_overlay
    reader = HostReader(SimSysfsRoot(host.root, hold_fds=True, errno_overlay=overlay))
    sink = FedSink(reader)
    detection = catalog.BY_NAME[catalog.PORT_UP.name]  # any spec; the extra families stand in for detection

    def step(change: str) -> None:
        if change == "traffic":
            host.add_traffic(1.0)
        elif change == "speed":
            host.set_speed("mlx5_1", 100)
        elif change == "port down":
            host.set_port_up("mlx5_2", False)
        elif change == "gid shift":
            host.gid_shift("mlx5_0")
        elif change == "fault":
            overlay["class/infiniband/mlx5_1/ports/1/rate"] = 5  # EIO
        elif change == "mend":
            overlay.pop("class/infiniband/mlx5_1/ports/1/rate")
        elif change == "remove":
            host.remove_device("mlx5_0")
        elif change == "restore":
            host.restore_device("mlx5_0")
            overlay.update(host.errno_overlay)

    changes = [
        "none",
        "none",
        "traffic",
        "speed",
        "port down",
        "gid shift",
        "fault",
        "none",
        "mend",
        "remove",
        "traffic",
        "restore",
        "none",
    ]
    for polls, change in enumerate(changes, start=1):
        step(change)
        snap = reader.read()
        stats = ExporterStats(polls=polls, read_errors_by_reason={"EIO": polls // 3} if polls > 3 else {})
        extra = [Family(detection, [(("mlx5_9", "1"), float(polls % 2))]), Family(catalog.DEVICES, [])]
        sink.publish(snap, stats, iter(extra))
        want_text, want_om = Renderer().render(itertools.chain(snapshot_families(snap, stats), extra))
        assert sink.render(None, None)[0] == want_text, change
        assert sink.render("application/openmetrics-text; version=1.0.0", None)[0] == want_om, change


@pytest.mark.parametrize(
    "accept",
    [
        None,
        "",
        "*/*",
        "text/plain",
        "text/plain;version=0.0.4",
        "text/plain; version=1.0.0",
        "text/plain;version=1.0.0;escaping=allow-utf-8",
        "text/plain;version=1.0.0;escaping=bogus",
        "application/openmetrics-text",
        "application/openmetrics-text; version=1.0.0",
        "application/openmetrics-text;version=0.0.1",
        "application/openmetrics-text;version=0.0.1,text/plain;q=0.5",
        "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
        "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",  # Prometheus 2.42's
        "application/openmetrics-text;version=1.0.0;escaping=underscores",
        "application/json",
    ],
)
def test_negotiation_is_prometheus_clients(accept: str | None) -> None:
    from prometheus_client.exposition import choose_encoder

    from rnic_exporter.sinks.exposition import negotiate

    _, client_type = choose_encoder(accept or "")
    assert negotiate(accept) == (client_type, client_type.startswith("application/openmetrics-text"))


def test_gzip_is_compressed_once_per_poll_for_whoever_asks(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=1, gid_table_size=8)
    reader = HostReader(SimSysfsRoot(host.root, errno_overlay=host.errno_overlay))
    sink = FedSink(reader)
    sink.publish(reader.read(), ExporterStats(polls=1))
    first, _ = sink.render(None, "gzip")
    assert sink.render(None, "gzip")[0] is first
    sink.publish(reader.read(), ExporterStats(polls=2))
    second, _ = sink.render(None, "gzip")
    assert second is not first and gzip.decompress(second) == sink.render(None, None)[0]
    assert value(gzip.decompress(second).decode(), catalog.POLLS.name) == 2


def test_gzip_resumes_after_what_did_not_change_and_still_decompresses_to_the_body(tmp_path: Path) -> None:
    """The compressor's state after the unchanged beginning is reused; whatever moved (the own series
    at the end, a port in the middle, back to quiet), each body decompresses to the plain one."""
    host = SimHost.build(tmp_path / "sys", roce=2, gid_table_size=8)
    reader = HostReader(SimSysfsRoot(host.root, errno_overlay=host.errno_overlay))
    sink = FedSink(reader)
    for polls, change in enumerate([None, None, None, "down", None, None, "traffic", None], start=1):
        if change == "down":
            host.set_port_up("mlx5_1", False)
        elif change == "traffic":
            host.add_traffic(1.0)
        sink.publish(reader.read(), ExporterStats(polls=polls))
        for accept in (None, "application/openmetrics-text; version=1.0.0"):
            plain, _ = sink.render(accept, None)
            gz, headers = sink.render(accept, "gzip")
            assert headers["Content-Encoding"] == "gzip" and gzip.decompress(gz) == plain
            assert value(plain.decode().replace("# EOF\n", ""), catalog.POLLS.name) == polls


def test_the_sink_renders_with_its_own_renderer() -> None:
    """prometheus-client's generate_latest costs 60 ms or more per exposition of a 16-RNIC host (CPU,
    not memory: inside the daemon the library costs about 1 MB): the sink uses only its negotiation
    and process collectors, never its renderer or registry."""
    import rnic_exporter.sinks.prometheus as sink

    assert not hasattr(sink, "generate_latest") and not hasattr(sink, "CollectorRegistry")


def test_go_float_int_fast_path_matches_prometheus_client() -> None:
    """Counters skip float(): every digit count and the 2**53 edge print as prometheus-client does."""
    from prometheus_client.utils import floatToGoString

    from rnic_exporter.sinks.exposition import go_float

    values = [0, 1, 999_999, 1_000_000, 1_230_000, 2**53 - 1, 2**53, 2**64 - 1]
    values += [10**k + d for k in range(1, 20) for d in (-1, 0, 1)]
    for v in values:
        assert go_float(v) == floatToGoString(v), v  # type: ignore[no-untyped-call]
    assert go_float(True) == "1.0"
