"""rnic.port.degrading / rnic.port.recovered over successive real reads of a simulated host."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from rnic_exporter.catalog.events import Event
from rnic_exporter.detect.link_health_events import LinkHealthTracker
from rnic_exporter.sim import SimHost
from rnic_exporter.sources.reader import HostReader
from rnic_exporter.sources.sysfs import SysfsRoot

POLL_S = 5.0


@pytest.fixture
def host(tmp_path: Path) -> SimHost:
    return SimHost.build(tmp_path / "sys", roce=1, infiniband=1, gid_table_size=16)  # mlx5_0 RoCE, mlx5_1 NDR


@pytest.fixture
def reader(host: SimHost) -> Iterator[HostReader]:
    reader = HostReader(SysfsRoot(host.root))
    with contextlib.closing(reader):
        yield reader


def busy(host: SimHost) -> None:
    host.add_traffic(POLL_S, utilisation=0.8)
    host.add_counts("mlx5_0", {"np_ecn_marked_roce_packets": 90_000, "np_cnp_sent": 15_000, "out_of_sequence": 60})


def play(
    tracker: LinkHealthTracker, reader: HostReader, host: SimHost, seconds: float, start: float, *extra: dict[str, int]
) -> list[tuple[float, Event]]:
    """Poll every 5 s for `seconds` of busy traffic; `extra`: counts added to mlx5_1 at each poll."""
    out = []
    t = start
    while t < start + seconds:
        busy(host)
        for counts in extra:
            host.add_counts("mlx5_1", counts)
        t += POLL_S
        out += [(t, e) for e in tracker.observe(reader.read(), t)]
    return out


def test_a_healthy_busy_host_raises_nothing(host: SimHost, reader: HostReader) -> None:
    tracker = LinkHealthTracker()
    assert tracker.observe(reader.read(), 0.0) == []
    assert play(tracker, reader, host, 1800.0, 0.0) == []
    assert tracker.last and all(not h.degrading for h in tracker.last)


def test_a_cable_going_bad_degrades_then_recovers(host: SimHost, reader: HostReader) -> None:
    tracker = LinkHealthTracker()
    tracker.observe(reader.read(), 0.0)
    assert play(tracker, reader, host, 300.0, 0.0) == []
    # Symbol errors at 2 a second (BER 5e-12 on 4 x 100 Gb/s): the first full window says so.
    events = play(tracker, reader, host, 300.0, 300.0, {"symbol_error": 10})
    [(t, event)] = events
    assert event.name == "rnic.port.degrading" and event.severity == "warning"
    assert (event.device, event.port, event.before, event.after) == ("mlx5_1", 1, "ok", "degrading")
    assert 300.0 < t <= 360.0 + POLL_S
    assert event.attributes["signals"] == "symbol_error"
    assert event.message.startswith("mlx5_1 port 1 (ibp32s0) is degrading: symbol_error +")
    assert tracker.degrading() == {("mlx5_1", 1)}
    # Still bad: no repeat. Then a healthy 15 minutes: recovered, once.
    assert play(tracker, reader, host, 300.0, 600.0, {"symbol_error": 10}) == []
    quiet = play(tracker, reader, host, 1200.0, 900.0)
    assert [(e.name, e.severity, e.before, e.after) for _, e in quiet] == [
        ("rnic.port.recovered", "info", "degrading", "ok")
    ]
    assert 900.0 + 900.0 <= quiet[0][0] <= 900.0 + 900.0 + 60.0 + POLL_S
    assert tracker.degrading() == frozenset()


def test_retries_exceeded_raises_the_event_to_critical(host: SimHost, reader: HostReader) -> None:
    host.device("mlx5_0").hw_counters["req_transport_retries_exceeded"] = 0  # newer kernels' mlx5
    host.add_counts("mlx5_0", {"req_transport_retries_exceeded": 0})
    tracker = LinkHealthTracker()
    tracker.observe(reader.read(), 0.0)
    events = play(tracker, reader, host, 120.0, 0.0, {"link_error_recovery": 1})
    assert [(e.device, e.severity) for _, e in events] == [("mlx5_1", "warning")]
    host.add_counts("mlx5_0", {"req_transport_retries_exceeded": 2})
    events = play(tracker, reader, host, 65.0, 120.0)
    assert [(e.name, e.device, e.severity, e.after) for _, e in events] == [
        ("rnic.port.degrading", "mlx5_0", "critical", "critical")
    ]


def test_a_reset_or_a_clock_going_back_raises_nothing(host: SimHost, reader: HostReader) -> None:
    tracker = LinkHealthTracker()
    tracker.observe(reader.read(), 100.0)
    host.add_counts("mlx5_1", {"symbol_error": 5000})
    assert tracker.observe(reader.read(), 50.0) == []  # clock went back: a new reference, no judgement
    dev = host.device("mlx5_1")
    dev.counters["symbol_error"] = 0  # perfquery -R
    host.add_counts("mlx5_1", {"symbol_error": 0})
    assert tracker.observe(reader.read(), 200.0) == []
