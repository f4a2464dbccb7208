"""The real `serve` daemon exporting over OTLP to an in-process collector: events, metrics, outages."""

from __future__ import annotations

import re
import signal
import socket
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rnic_exporter import __version__
from rnic_exporter.sim import SimHost
from tests.support.otlp import GrpcReceiver, HttpReceiver, Point, Record
from tests.support.processes import exporter, free_port, http_get
from tests.support.serve import serve_args
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e

POLL_S = 0.3


def _serve_args(host: SimHost, tmp_path: Path, port: int, endpoint: str, *extra: str) -> list[str]:
    return [
        *serve_args(host.root, port, poll=POLL_S, state_dir=tmp_path / "state"),
        "--no-watch.netlink",
        "--no-watch.udev",
        "--otlp.endpoint",
        endpoint,
        "--otlp.interval",
        "0.3",
        *extra,
    ]


def _scrape(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, _, body = http_get(f"{base}/metrics", timeout=5)
    assert status == 200
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _events_on_metrics(base: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    for (name, labels), value in _scrape(base).items():
        if name == "rnic_events_total":
            counts[dict(labels)["event"]] += int(value)
    return counts


@pytest.fixture(params=["http/protobuf", "grpc"])
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_events_and_metrics_reach_the_collector(tmp_path: Path, protocol: str) -> None:
    host = SimHost.build(tmp_path / "sys", roce=3, infiniband=1, gid_table_size=32)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with ExitStack() as stack:
        rcv: HttpReceiver | GrpcReceiver = HttpReceiver() if protocol == "http/protobuf" else GrpcReceiver()
        stack.enter_context(rcv)
        args = _serve_args(host, tmp_path, port, rcv.url, "--otlp.protocol", protocol)
        stack.enter_context(exporter(args, ready_url=f"{base}/-/ready", log_path=tmp_path / "exporter.log"))
        got = rcv.received
        wait_for(
            lambda: any(p.attrs.get("device") == "mlx5_1" for p in got.latest_points()),
            timeout=20,
            what="the first metrics export",
        )

        old, new = host.gid_shift("mlx5_0")
        host.remove_device("mlx5_1")
        host.set_speed("mlx5_2", 200)

        def seen() -> dict[str, Record] | None:
            records = {(r.event_name, r.attrs.get("device")): r for r in got.records()}
            wanted = {
                k: records.get(k)
                for k in (
                    ("rnic.gid.address_moved", "mlx5_0"),
                    ("rnic.device.disappeared", "mlx5_1"),
                    ("rnic.link.below_rated", "mlx5_2"),
                )
            }
            return {k[0]: r for k, r in wanted.items() if r is not None} if all(wanted.values()) else None

        records = wait_for(seen, timeout=30, what="the three incidents as log records")
        # One log record per event: the collector's count per event name equals rnic_events_total's.
        wait_for(
            lambda: Counter(r.event_name for r in got.records()) == _events_on_metrics(base),
            timeout=20,
            what="one record per counted event",
        )
        assert set(_events_on_metrics(base)) >= {"rnic.device.discovered", "rnic.gid.address_moved"}

        moved = records["rnic.gid.address_moved"]
        assert (moved.attrs["before"], moved.attrs["after"]) == (str(old), str(new))
        assert moved.attrs["address"] == "10.0.0.1" and moved.attrs["port"] == "1"
        assert moved.attrs["netdev"] == "ens1f0np0"
        assert (moved.severity_number, moved.severity_text) == (17, "ERROR")
        assert str(old) in moved.body and str(new) in moved.body
        gone = records["rnic.device.disappeared"]
        assert gone.attrs["pci_address"] and gone.severity_text == "ERROR"
        slow = records["rnic.link.below_rated"]
        assert slow.severity_number == 13 and slow.attrs["link"] in ("port", "netdev")
        for record in (moved, gone, slow):
            assert record.resource["service.name"] == "rnic-exporter"
            assert record.resource["service.version"] == __version__
            assert record.resource["host.name"] == socket.gethostname()

        def settled() -> list[Point] | None:
            points = got.latest_points()
            rate = [
                p.value
                for p in points
                if p.metric == "hw.network.bandwidth.limit" and p.attrs.get("hw.id") == "mlx5_2/1"
            ]
            return points if rate == [25e9] else None

        points = wait_for(settled, timeout=20, what="mlx5_2's new rate in the export")
        assert not [p for p in points if p.metric == "hw.network.io" and p.attrs.get("device") == "mlx5_1"]
        detected = {(p.metric, p.attrs.get("device"), p.attrs.get("link")): p.value for p in points}
        assert detected[("rnic.device.present", "mlx5_1", None)] == 0  # detection state, passed as extra
        assert 1 in {v for (m, d, _), v in detected.items() if m == "rnic.link.below_rated" and d == "mlx5_2"}
        assert points[0].resource["service.name"] == "rnic-exporter"


def _fail_lines(log: Path, signal: str, what: str) -> list[str]:
    return [line for line in log.read_text().splitlines() if what in line and f"signal={signal}" in line]


class Watch:
    """Scrapes /metrics while the collector misbehaves: every scrape must be fast and polls on time."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.slowest = 0.0

    def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        started = time.monotonic()
        samples = _scrape(self.base)
        self.slowest = max(self.slowest, time.monotonic() - started)
        return samples

    def failures(self, signal: str) -> float:
        return _value(self.scrape(), "rnic_exporter_otlp_export_failures_total", signal=signal)

    def phase(self, what: str, signal: str, more_than: float) -> float:
        """Waits for two failures more than `more_than` while polls keep their schedule; returns the count."""
        first = self.scrape()
        started = time.monotonic()
        # Scraped five times a second, not twenty: every scrape costs the exporter CPU on the same two
        # cores, and a watcher that starves the polls it is timing measures itself.
        count = wait_for(
            lambda: (f := self.failures(signal)) >= more_than + 2 and f,
            timeout=30,
            what=f"{signal} export failures while the collector is {what}",
            interval=0.2,
        )
        wait_for(
            lambda: time.monotonic() - started > 2.0 and self.failures(signal) >= count,
            timeout=10,
            what="two seconds of polls",
            interval=0.2,
        )
        last = self.scrape()
        elapsed = time.monotonic() - started
        polls = _value(last, "rnic_exporter_polls_total") - _value(first, "rnic_exporter_polls_total")
        assert polls >= 0.5 * elapsed / POLL_S, f"{polls} polls in {elapsed:.1f}s while the collector is {what}"
        age = time.time() - _value(last, "rnic_exporter_last_poll_timestamp_seconds")
        assert age < 3 * POLL_S + 1.0, f"last poll {age:.1f}s old while the collector is {what}"
        assert self.slowest < 1.5, f"a scrape took {self.slowest:.2f}s while the collector is {what}"
        return count


def test_collector_down_hanging_refusing_then_back(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=2, infiniband=1, gid_table_size=32)
    port, otlp_port = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "exporter.log"
    args = _serve_args(host, tmp_path, port, f"http://127.0.0.1:{otlp_port}", "--otlp.timeout", "1")
    with exporter(args, ready_url=f"{base}/-/ready", log_path=log):
        watch = Watch(base)
        # Down: nothing listens on the OTLP port. An incident now must still arrive later.
        host.set_speed("mlx5_1", 200)
        down = watch.phase("down", "metrics", 0)
        wait_for(lambda: watch.failures("logs") > 0, timeout=30, what="a failed event export")
        with HttpReceiver(otlp_port) as rcv:
            rcv.mode = "hang"
            hanging = watch.phase("hanging", "metrics", down)
            rcv.mode = "503"
            refused = watch.phase("answering 503", "metrics", hanging)
            # Exports started while the collector hung can still time out inside this phase and be
            # its first failures: wait until a 503 itself was seen (and logged) before healing.
            wait_for(
                lambda: any("HTTP 503" in line for line in _fail_lines(log, "metrics", "OTLP export failing")),
                timeout=30,
                what="an export refused with HTTP 503",
            )
            rcv.mode = "ok"
            wait_for(
                lambda: any(
                    r.event_name == "rnic.link.below_rated" and r.attrs.get("device") == "mlx5_1"
                    for r in rcv.received.records()
                ),
                timeout=30,
                what="the event from the outage, retried",
            )
            seen = rcv.received.metric_count()
            wait_for(lambda: rcv.received.metric_count() >= seen + 3, timeout=20, what="metric exports resuming")
            settled = watch.failures("metrics")
            seen = rcv.received.metric_count()
            wait_for(lambda: rcv.received.metric_count() >= seen + 3, timeout=20, what="three more exports")
            assert watch.failures("metrics") == settled, "exports still failing after the collector came back"
            assert _value(watch.scrape(), "rnic_exporter_otlp_dropped_total", signal="logs") == 0

            # Logged once per change of state, however many exports failed (read before the collector
            # goes away: the daemon's last export at shutdown would fail again).
            failing = _fail_lines(log, "metrics", "OTLP export failing")
            reasons = [
                re.search(r'reason=("[^"]*"|\S+)', line)[1].strip('"')  # type: ignore[index]
                for line in failing
            ]
            assert reasons == ["unreachable", "timeout", "HTTP 503"], failing
            assert refused >= 2 * len(failing)  # six failed exports or more, three lines
            assert len(_fail_lines(log, "metrics", "OTLP export recovered")) == 1
            assert len(_fail_lines(log, "logs", "OTLP export recovered")) == 1


def test_stop_is_prompt_while_the_collector_hangs(tmp_path: Path) -> None:
    """SIGTERM with exports stuck on a collector that never answers: the last export is abandoned
    after SHUTDOWN_BUDGET_S, not after --otlp.timeout per signal (a pod has 30 s to go)."""
    from rnic_exporter.sinks.otel import SHUTDOWN_BUDGET_S

    host = SimHost.build(tmp_path / "sys", roce=1, gid_table_size=8)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "exporter.log"
    with HttpReceiver() as rcv:
        rcv.mode = "hang"
        args = _serve_args(host, tmp_path, port, rcv.url, "--otlp.timeout", "30")
        with exporter(args, ready_url=f"{base}/-/ready", log_path=log) as proc:
            wait_for(lambda: "exporting over OTLP" in log.read_text(), timeout=10, what="OTLP export started")
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=SHUTDOWN_BUDGET_S + 15)
            took = time.monotonic() - started
        assert proc.returncode == 0
        assert took < SHUTDOWN_BUDGET_S + 3, f"stop took {took:.1f}s"
        assert "stopping without it" in log.read_text()
