"""UdevWatcher on real kernel uevents: veth interfaces created in a fresh network namespace.

Net-device uevents are scoped to the namespace, so a watcher started inside a new namespace
hears only what the test does there, whatever else the machine is doing.
"""

from __future__ import annotations

import logging
import os
import resource
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from rnic_exporter.sources.udev import UdevWatcher, event_source
from tests.support.limits import assert_failed_once_then_recovered, descriptors_exhausted
from tests.support.netns import Netns, network_namespace
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e


class Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, str, str]] = []

    def __call__(self, subsystem: str, action: str, sys_name: str) -> None:
        with self.lock:
            self.calls.append((subsystem, action, sys_name))

    def saw(self, *call: str) -> bool:
        with self.lock:
            return call in self.calls

    def names(self) -> set[str]:
        with self.lock:
            return {c[2] for c in self.calls}


@pytest.fixture
def ns() -> Iterator[Netns]:
    with network_namespace([]) as created:
        yield created


@contextmanager
def watching(ns: Netns, recorder: Recorder) -> Iterator[UdevWatcher]:
    with ns.entered():  # the watcher's thread is born inside the namespace and stays there
        watcher = UdevWatcher(recorder)
        watcher.start()
    try:
        yield watcher
    finally:
        watcher.close()


def test_source_is_udev_only_when_udevd_runs(tmp_path: Path) -> None:
    assert event_source(tmp_path / "control") == "kernel"
    (tmp_path / "control").touch()
    assert event_source(tmp_path / "control") == "udev"
    assert UdevWatcher(Recorder()).source == event_source()


def test_add_move_remove_of_a_netdev(ns: Netns) -> None:
    recorder = Recorder()
    with watching(ns, recorder) as watcher:
        assert watcher.healthy and watcher.errors == 0
        ns.ip("link", "add", "rnxu0", "type", "veth", "peer", "name", "rnxu1")
        wait_for(
            lambda: recorder.saw("net", "add", "rnxu0") and recorder.saw("net", "add", "rnxu1"),
            timeout=5,
            what="add uevents of both veth ends",
        )
        ns.ip("link", "set", "rnxu0", "name", "rnxu2")
        wait_for(lambda: recorder.saw("net", "move", "rnxu2"), timeout=5, what="the rename's move uevent")
        ns.ip("link", "del", "rnxu2")
        wait_for(
            lambda: recorder.saw("net", "remove", "rnxu2") and recorder.saw("net", "remove", "rnxu1"),
            timeout=5,
            what="remove uevents of both ends",
        )
        with recorder.lock:
            assert {c[0] for c in recorder.calls} == {"net"}


def test_another_namespace_hears_nothing(ns: Netns) -> None:
    """Why the exporter must run in the host's namespace to see the host's netdevs come and go."""
    inside, elsewhere = Recorder(), Recorder()
    with network_namespace([]) as other, watching(ns, inside), watching(other, elsewhere):
        ns.ip("link", "add", "rnxu0", "type", "veth", "peer", "name", "rnxu1")
        wait_for(lambda: inside.saw("net", "add", "rnxu0"), timeout=5, what="the add uevent inside")
        other.ip("link", "add", "rnxo0", "type", "veth", "peer", "name", "rnxo1")
        wait_for(lambda: elsewhere.saw("net", "add", "rnxo0"), timeout=5, what="the other namespace's own uevent")
        # Uevents are sent as the device changes, in order: by the time the later one arrived,
        # the earlier one would have too, had it been broadcast to that namespace.
        assert "rnxu0" not in elsewhere.names() and "rnxo0" not in inside.names()


def test_close_is_prompt_and_leaks_nothing(ns: Netns) -> None:
    before = set(os.listdir("/proc/self/fd"))
    with watching(ns, Recorder()) as watcher:
        time.sleep(0.1)  # parked in poll()
        started = time.monotonic()
        watcher.close()
        took = time.monotonic() - started
    assert took < 0.5, f"close() took {took:.3f}s"
    assert watcher._thread is not None and not watcher._thread.is_alive()
    assert set(os.listdir("/proc/self/fd")) <= before


def test_failures_are_counted_logged_once_and_retried(ns: Netns, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="rnic_exporter.udev")
    recorder = Recorder()
    with ns.entered(), descriptors_exhausted():  # no new descriptor at all
        watcher = UdevWatcher(recorder, retry_initial_s=0.02, retry_max_s=0.05)
        watcher.start()
        assert not watcher.healthy
        wait_for(lambda: watcher.errors >= 3, timeout=5, what="several failed attempts")
    try:
        wait_for(lambda: watcher.healthy, timeout=5, what="recovery once descriptors are available")
        ns.ip("link", "add", "rnxu0", "type", "veth", "peer", "name", "rnxu1")
        wait_for(lambda: recorder.saw("net", "add", "rnxu0"), timeout=5, what="events after recovery")
    finally:
        watcher.close()
    assert_failed_once_then_recovered(caplog, "failed")


def test_a_failing_callback_does_not_stop_the_watcher(ns: Netns) -> None:
    seen: list[str] = []

    def flaky(subsystem: str, action: str, sys_name: str) -> None:
        seen.append(sys_name)
        if len(seen) == 1:
            raise RuntimeError("consumer bug")

    with ns.entered():
        watcher = UdevWatcher(flaky)
        watcher.start()
    try:
        ns.ip("link", "add", "rnxu0", "type", "veth", "peer", "name", "rnxu1")
        wait_for(lambda: {"rnxu0", "rnxu1"} <= set(seen), timeout=5, what="both uevents despite the raising callback")
        assert watcher.healthy and watcher.errors == 0
    finally:
        watcher.close()


def test_a_full_receive_buffer_is_reported_as_an_overrun(ns: Netns, tmp_path: Path) -> None:
    """Lost uevents cannot be re-read: the owner hears ("*", "overrun", "*") and re-reads sysfs."""
    stalled, release = threading.Event(), threading.Event()
    recorder = Recorder()

    def staller(subsystem: str, action: str, sys_name: str) -> None:
        recorder(subsystem, action, sys_name)
        if not stalled.is_set():
            stalled.set()
            release.wait(10)

    with ns.entered():
        watcher = UdevWatcher(staller, rcvbuf=4096)
        watcher.start()
    try:
        ns.ip("link", "add", "rnxs0", "type", "veth", "peer", "name", "rnxs1")
        wait_for(stalled.is_set, timeout=5, what="the watcher stalled in its callback")
        batch = tmp_path / "links.ip"
        batch.write_text("".join(f"link add rnxa{i} type veth peer name rnxb{i}\n" for i in range(100)))
        ns.ip("-batch", str(batch))
        release.set()
        wait_for(lambda: recorder.saw("*", "overrun", "*"), timeout=5, what="the overrun callback")
        assert watcher.overruns >= 1 and watcher.errors >= watcher.overruns
        ns.ip("link", "add", "rnxz0", "type", "veth", "peer", "name", "rnxz1")
        wait_for(lambda: recorder.saw("net", "add", "rnxz0"), timeout=5, what="events after the overrun")
        assert watcher.healthy
    finally:
        watcher.close()


def test_descriptors_above_1024_still_hear_events(ns: Netns) -> None:
    """The daemon holds thousands of sysfs descriptors, so the monitor's fd is past select()'s 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2048:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    filler = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    try:
        recorder = Recorder()
        with watching(ns, recorder) as watcher:
            ns.ip("link", "add", "rnxh0", "type", "veth", "peer", "name", "rnxh1")
            wait_for(lambda: recorder.saw("net", "add", "rnxh0"), timeout=5, what="an add uevent on a high fd")
            assert watcher.healthy and watcher.errors == 0
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
