"""Link health in the daemon (`daemon/link_watch.py`): judged windows of a simulated host's counters
become `rnic.port.degrading` / `rnic.port.recovered`, published by the agent's poll like detection's."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from rnic_exporter.catalog.link_health import LinkHealthThresholds
from rnic_exporter.daemon.agent import Agent
from rnic_exporter.daemon.link_watch import NUDGE, REUSE_S, LinkWatch
from rnic_exporter.daemon.schedule import PollSchedule
from rnic_exporter.model.host import Snapshot
from rnic_exporter.sim import SimHost
from rnic_exporter.sources.reader import ReaderSettings
from tests.support.agent import make_agent, series
from tests.support.wait import wait_for

WINDOW_S = 60.0
UNSCALED = ("port_xmit_packets", "port_rcv_packets", "symbol_error", "link_downed")  # read as the kernel writes them
LIMITS = LinkHealthThresholds(window_seconds=WINDOW_S, clear_after_seconds=2 * WINDOW_S)
# The watch's minutes pass on a fake clock, the reader's PMA timer on the real one: every pass reads the
# error counters, as the 1-minute timer does at a real minute's pace.
FAST_PMA = ReaderSettings(pma_slow_s=0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def current(agent: Agent, host: SimHost) -> Snapshot:
    """A counter pass that read what the simulator wrote last: a pass under a second old is reused
    (COUNTER_PASS_REUSE_S), so wait, with a deadline, for one that saw every device's counters."""

    def probe() -> Snapshot | None:
        snap = agent.counter_snapshot(2.0)
        assert snap is not None
        for dev in snap.devices:
            want = {k: v for k, v in host.device(dev.name).counters.items() if k in UNSCALED}
            port = dev.ports[0]
            if {k: port.counters[k].value for k in want if k in port.counters} != want:
                return None
        return snap

    return wait_for(probe, timeout=10, what="a counter pass that read the simulator's counters")


def watch_of(agent: Agent, host: SimHost, clock: Clock) -> LinkWatch:
    return LinkWatch(
        lambda: current(agent, host), agent.hand_off, LIMITS, conditions=lambda: agent.detector.last, clock=clock
    )


def window(host: SimHost, watch: LinkWatch, clock: Clock) -> list[str]:
    """A busy minute on every port, then one judgement: the events' names and devices."""
    host.add_traffic(WINDOW_S)
    clock.now += WINDOW_S
    return [f"{e.name} {e.device}" for e in watch.tick()]


def test_a_healthy_busy_host_raises_nothing(sim_host: SimHost, tmp_path: Path) -> None:
    agent = make_agent(sim_host, tmp_path / "state", reader=FAST_PMA)
    agent.poll_once(full_gid_tables=True)
    clock = Clock()
    watch = watch_of(agent, sim_host, clock)
    assert watch.tick() == []  # the first window's reference
    for _ in range(4):
        assert window(sim_host, watch, clock) == []
        judged = watch.tracker.last
        # Every port was judged, on moving counters, and found fine.
        assert {(h.facts.device, h.facts.port) for h in judged} == {("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_2", 1)}
        assert all(h.level in ("ok", "unsupported") for h in judged)
        assert all(h.verdict("symbol_error") is not None for h in judged)
    agent.poll_once()
    assert series(agent, "rnic_events_total", event="rnic.port.degrading", device="mlx5_0", port="1") == 0
    agent.close()


def test_a_cable_going_bad_degrades_then_recovers_in_log_and_counters(
    sim_host: SimHost, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent = make_agent(sim_host, tmp_path / "state", reader=FAST_PMA)
    agent.poll_once(full_gid_tables=True)
    clock = Clock()
    watch = watch_of(agent, sim_host, clock)
    watch.tick()
    assert window(sim_host, watch, clock) == []
    pl = {"device": "mlx5_0", "port": "1"}
    assert series(agent, "rnic_events_total", event="rnic.port.degrading", **pl) == 0  # from 0: increase() sees it

    sim_host.degrade_link("mlx5_0", {"symbol_error": 2.0, "out_of_sequence": 2000.0})
    assert window(sim_host, watch, clock) == ["rnic.port.degrading mlx5_0"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="rnic_exporter"):
        agent.poll_once()  # the loop's next poll publishes what was handed off
    logged = [r for r in caplog.records if r.name == "rnic_exporter.events"]
    assert [r.fields["event"] for r in logged] == ["rnic.port.degrading"]  # type: ignore[attr-defined]
    fields = logged[0].fields  # type: ignore[attr-defined]
    assert fields["device"] == "mlx5_0" and fields["port"] == "1" and logged[0].levelno == logging.WARNING
    assert "symbol_error" in logged[0].getMessage() and "out_of_sequence" in logged[0].getMessage()
    assert series(agent, "rnic_events_total", event="rnic.port.degrading", **pl) == 1
    assert series(agent, "rnic_events_total", event="rnic.port.degrading", device="mlx5_1", port="1") == 0

    assert window(sim_host, watch, clock) == []  # still failing: one event per failing cable, not per window
    sim_host.degrade_link("mlx5_0", {})
    assert window(sim_host, watch, clock) == []  # one quiet minute is not yet recovered
    assert window(sim_host, watch, clock) == ["rnic.port.recovered mlx5_0"]
    agent.poll_once()
    assert series(agent, "rnic_events_total", event="rnic.port.recovered", **pl) == 1
    assert series(agent, "rnic_events_total", event="rnic.port.degrading", **pl) == 1
    agent.close()


def test_a_scrapes_counter_pass_closes_the_window_and_the_timer_reads_nothing(
    sim_host: SimHost, tmp_path: Path
) -> None:
    """Where something scrapes, the timer judges the scrape's pass (started after the window's end,
    under REUSE_S old) instead of reading every counter once more; one that started before the end
    of the window does not stand in for it."""
    agent = make_agent(sim_host, tmp_path / "state", reader=FAST_PMA)
    agent.poll_once(full_gid_tables=True)
    window_s = 0.3
    own: list[float | None] = []

    def read() -> Snapshot | None:
        snap = agent.counter_snapshot(2.0)
        own.append(agent.counter_pass_at())
        return snap

    watch = LinkWatch(
        read,
        agent.hand_off,
        LinkHealthThresholds(window_seconds=window_s, clear_after_seconds=10.0),
        recent=lambda max_age_s: agent.recent_counter_snapshot(2.0, max_age_s),
        last_pass_at=agent.counter_pass_at,
    )
    assert agent.counter_pass_at() is None
    watch.tick()  # nothing scraped yet: a pass of its own is the first reference
    assert len(own) == 1 and watch.tracker.reference_at is not None
    assert watch.wait_s() <= window_s  # nobody else reads the counters: a window, as before

    agent.counter_view(2.0, 0.0)  # a scrape, too early to close the window
    scraped_at = agent.counter_pass_at()
    assert scraped_at is not None and scraped_at < watch.tracker.reference_at + window_s
    assert watch.wait_s() > REUSE_S  # someone scrapes: wait for the first scrape after the window
    ref = watch.tracker.reference_at
    watch.tick()  # that pass started inside the window: it is not judged, a pass of the timer's is read
    assert len(own) == 2 and watch.tracker.reference_at == ref  # and judged nothing: the window is not over

    wait_for(lambda: time.monotonic() >= ref + window_s, timeout=10, what="the end of the window")
    agent.counter_view(2.0, 0.0)  # the first scrape after it
    scraped_at = agent.counter_pass_at()
    sim_host.add_traffic(window_s)
    watch.tick()
    assert len(own) == 2  # nothing read for the judgement
    assert agent.counter_pass_at() == scraped_at and watch.tracker.reference_at == scraped_at
    assert {(h.facts.device, h.facts.port) for h in watch.tracker.last} == {("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_2", 1)}
    agent.close()


def test_handed_off_events_wake_the_loop_at_once() -> None:
    """The poll loop sleeps until its interval; link health's events must not wait for it."""
    schedule = PollSchedule(3600.0)
    stop = threading.Event()
    got: list[str] = []
    waiter = threading.Thread(target=lambda: got.append(getattr(schedule.wait(stop), "reason", "")))
    waiter.start()
    schedule.nudge(NUDGE)
    waiter.join(10)
    assert got == [NUDGE]
    stop.set()


def test_a_reload_changes_the_window(sim_host: SimHost, tmp_path: Path) -> None:
    agent = make_agent(sim_host, tmp_path / "state", reader=FAST_PMA)
    agent.poll_once(full_gid_tables=True)
    clock = Clock()
    watch = watch_of(agent, sim_host, clock)
    watch.tick()
    watch.reconfigure(LinkHealthThresholds(window_seconds=2 * WINDOW_S))
    assert watch.interval_s == 2 * WINDOW_S
    sim_host.degrade_link("mlx5_1", {"link_downed": 1.0})
    assert window(sim_host, watch, clock) == []  # half a window: nothing judged yet
    assert window(sim_host, watch, clock) == ["rnic.port.degrading mlx5_1"]
    agent.close()


def test_a_judgement_that_raises_is_counted_and_the_timer_carries_on(caplog: pytest.LogCaptureFixture) -> None:
    failures: list[int] = []

    def broken() -> Snapshot | None:
        raise ValueError("a reader bug")

    watch = LinkWatch(
        broken, lambda events: None, LinkHealthThresholds(window_seconds=0.01), failed=lambda: failures.append(1)
    )
    with caplog.at_level(logging.ERROR, logger="rnic_exporter"):
        watch.start()
        try:
            wait_for(lambda: len(failures) >= 3, timeout=10, what="three failed judgements, each counted")
        finally:
            watch.close()
    assert any("judging link health failed" in r.getMessage() for r in caplog.records)
