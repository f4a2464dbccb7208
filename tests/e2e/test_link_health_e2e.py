"""The real `serve` daemon judging link health with nobody scraping: a cable going bad on a simulated host is
`rnic.port.degrading` in its JSON log, in OTLP (real protobuf bytes, decoded) and in `rnic_events_total`; a
busy healthy port raises nothing; the bad one recovers after the quiet period."""

from __future__ import annotations

import json
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rnic_exporter.sim import SimHost
from tests.support.otlp import HttpReceiver, Record
from tests.support.processes import exporter, free_port, http_get
from tests.support.serve import serve_args
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e

# Short windows so the story plays in seconds; the defaults are 60 s and 15 minutes.
CONFIG = "[link_health]\nwindow_seconds = 1\nclear_after_seconds = 3\n"


def _events_total(base: str) -> Counter[tuple[str, str]]:
    status, _, body = http_get(f"{base}/metrics", timeout=5)
    assert status == 200
    out: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if s.name == "rnic_events_total":
                out[(s.labels["event"], s.labels["device"])] += int(s.value)
    return out


def _logged(log: Path, event: str) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == event]


def test_a_degrading_port_reaches_log_otlp_and_counters(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=2, gid_table_size=16)
    config = tmp_path / "rnic.toml"
    config.write_text(CONFIG)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "exporter.log"
    with ExitStack() as stack:
        rcv = stack.enter_context(HttpReceiver())
        args = [
            *serve_args(host.root, port, poll=0.3, state_dir=tmp_path / "state"),
            "--no-watch.netlink",
            "--no-watch.udev",
            "--collector.pma.slow-interval",  # symbol errors within the test's 1 s windows
            "1s",
            "--log.format",
            "json",
            "--config",
            str(config),
            "--otlp.endpoint",
            rcv.url,
            "--otlp.interval",
            "0.3",
        ]
        stack.enter_context(exporter(args, ready_url=f"{base}/-/ready", log_path=log))
        got = rcv.received

        def records(name: str) -> list[Record]:
            host.add_traffic(1.0)  # both ports busy all along: counters move on every pass
            return [r for r in got.records() if r.event_name == name]

        host.degrade_link("mlx5_0", {"symbol_error": 1000.0, "out_of_sequence": 1_000_000.0})
        degrading = wait_for(lambda: records("rnic.port.degrading"), timeout=30, what="rnic.port.degrading in OTLP")
        assert [(r.attrs["device"], r.attrs["port"]) for r in degrading] == [("mlx5_0", "1")]  # mlx5_1 is healthy
        record = degrading[0]
        assert record.severity_text == "WARN" and "symbol_error" in record.body
        assert set(str(record.attrs["signals"]).split(",")) >= {"symbol_error", "out_of_sequence"}
        assert _events_total(base)[("rnic.port.degrading", "mlx5_0")] == 1
        assert _events_total(base)[("rnic.port.degrading", "mlx5_1")] == 0  # counted from 0
        line = wait_for(lambda: _logged(log, "rnic.port.degrading"), timeout=10, what="the event's log line")
        assert [(x["device"], x["port"], x["severity"]) for x in line] == [("mlx5_0", "1", "warning")]

        host.degrade_link("mlx5_0", {})
        recovered = wait_for(lambda: records("rnic.port.recovered"), timeout=30, what="rnic.port.recovered")
        assert [r.attrs["device"] for r in recovered] == ["mlx5_0"]
        assert _logged(log, "rnic.port.recovered")

        # One record per counted event, the link-health ones included.
        def per_event() -> Counter[str]:
            out: Counter[str] = Counter()
            for (event, _), n in _events_total(base).items():
                out[event] += n
            return +out  # the zeros dropped

        wait_for(
            lambda: Counter(r.event_name for r in got.records()) == per_event(),
            timeout=20,
            what="one OTLP record per counted event",
        )
        assert not records("rnic.port.degrading")[1:]  # mlx5_1 stayed healthy, mlx5_0 degraded once
