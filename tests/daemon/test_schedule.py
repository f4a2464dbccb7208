"""When the agent polls: the interval, the re-read burst after an announcement, stop and reload."""

from __future__ import annotations

import threading
import time

from rnic_exporter.daemon.schedule import BURST_OFFSETS, Due, PollSchedule


def test_interval_polls_read_no_whole_tables() -> None:
    schedule = PollSchedule(0.05)
    stop = threading.Event()
    due = schedule.wait(stop)
    assert due == Due("interval", False, frozenset())


def test_an_announcement_starts_a_burst_of_whole_table_reads_for_its_device() -> None:
    schedule = PollSchedule(3600)
    stop = threading.Event()
    schedule.announce("netlink", ("mlx5_0",))
    started = time.monotonic()
    first = schedule.wait(stop)
    assert first == Due("event", frozenset({"mlx5_0"}), frozenset({"netlink"}))
    assert time.monotonic() - started < 0.5  # at once, not at the hour-long interval
    schedule.announce("netlink", ("mlx5_1",))  # during the burst: joins it, restarts the offsets
    rest = [schedule.wait(stop) for _ in range(len(BURST_OFFSETS) - 1)]
    assert all(d is not None and d.reason == "event" for d in rest)
    assert rest[0] is not None and rest[0].full_gid_tables == frozenset({"mlx5_0", "mlx5_1"})
    assert rest[-1] is not None and rest[-1].sources == frozenset()  # announced once, reported once
    elapsed = time.monotonic() - started
    assert BURST_OFFSETS[-2] <= elapsed < BURST_OFFSETS[-1] + 1.0  # the offsets were waited for


def test_a_burst_after_a_finished_one_starts_clean() -> None:
    schedule = PollSchedule(3600)
    stop = threading.Event()
    schedule.announce("netlink", ("mlx5_0",))
    for _ in BURST_OFFSETS:
        schedule.wait(stop)
    schedule.announce("netlink", ("mlx5_3",))
    due = schedule.wait(stop)
    assert due is not None and due.full_gid_tables == frozenset({"mlx5_3"})


def test_a_source_that_cannot_name_the_device_reads_every_table() -> None:
    schedule = PollSchedule(3600)
    stop = threading.Event()
    schedule.announce("netlink", ("mlx5_0",))
    schedule.announce("udev")
    due = schedule.wait(stop)
    assert due is not None and due.full_gid_tables is True and due.sources == {"netlink", "udev"}


def test_stop_and_reload_end_the_wait() -> None:
    schedule = PollSchedule(3600)
    stop, reload = threading.Event(), threading.Event()
    reload.set()
    schedule.wake.set()
    assert schedule.wait(stop, reload) == Due("signal", False, frozenset())

    def stop_now() -> None:
        stop.set()
        schedule.wake.set()

    threading.Timer(0.05, stop_now).start()
    assert schedule.wait(stop) is None


def test_a_host_with_nothing_due_sleeps_until_its_next_due_read() -> None:
    """All RoCE with netlink trusted: no read is due at the interval, the next is the reader's."""
    schedule = PollSchedule(0.05)
    stop = threading.Event()
    started = time.monotonic()
    schedule.next_read(started + 0.5)
    assert schedule.wait(stop) == Due("interval", False, frozenset())
    assert time.monotonic() - started >= 0.5  # not at the 0.05 s interval


def test_an_announcement_wakes_a_sleeping_host_at_once() -> None:
    schedule = PollSchedule(0.05)
    stop = threading.Event()
    schedule.next_read(time.monotonic() + 3600)
    started = time.monotonic()
    threading.Timer(0.1, schedule.announce, ("netlink", ("mlx5_0",))).start()
    due = schedule.wait(stop)
    assert due is not None and due.reason == "event"
    assert time.monotonic() - started < 2.0


def test_a_read_due_every_interval_or_already_past_waits_the_interval() -> None:
    """None (an InfiniBand port, a device not trusted) brings a later wake-up back to the
    interval; a due time already past (a device whose read hangs keeps its own) waits one
    interval rather than spinning."""
    schedule = PollSchedule(0.2)
    stop = threading.Event()
    schedule.next_read(time.monotonic() + 3600)
    schedule.next_read(None)
    started = time.monotonic()
    assert schedule.wait(stop) is not None
    assert time.monotonic() - started < 2.0
    schedule.next_read(time.monotonic() - 1.0)
    started = time.monotonic()
    assert schedule.wait(stop) is not None
    assert time.monotonic() - started >= 0.2
