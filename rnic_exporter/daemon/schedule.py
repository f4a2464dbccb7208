"""When the agent polls: when a read is due, and in a short burst after netlink or udev announce a change.

A read is due every `--poll.interval` while anything is read every pass (an InfiniBand port's
state, a device whose announcements are not trusted); otherwise at the reader's next due read
(`next_read`: a PCIe link every 30 s, the safety sweep), so a host that is all RoCE with netlink
trusted wakes twice a minute, not twelve times. An announcement wakes it at once.

The kernel updates the GID table a work-queue hop after it sends the address message, so one read
at the message can miss the change. A burst re-reads at growing offsets after the latest
announcement; each read of the burst re-reads the whole GID tables of the devices announced (of
every device when the source cannot tell), so a new entry at a so far empty slot is found at once
instead of by the slow rotating sweep.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

# Seconds after the latest announcement. The kernel usually settles within milliseconds; the
# tail covers a loaded host, and a later announcement restarts the burst.
BURST_OFFSETS = (0.0, 0.05, 0.15, 0.3, 0.6, 1.2)


@dataclass(frozen=True, slots=True)
class Due:
    reason: str  # "interval", "event", "signal" or a `nudge`'s
    full_gid_tables: bool | frozenset[str]  # True: every device's; a set: those RDMA devices'
    sources: frozenset[str]  # announcing sources since the previous poll


class PollSchedule:
    """Thread-safe: `announce` from watcher threads, `wait` from the polling thread."""

    def __init__(
        self, interval_s: float, wake: threading.Event | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval_s = interval_s
        self.wake = wake or threading.Event()
        self._clock = clock
        self._lock = threading.Lock()
        self._next_interval = clock() + interval_s
        self._burst_start: float | None = None
        self._burst_step = 0
        self._sources: set[str] = set()
        self._burst_devices: set[str] | None = set()  # None: every device's GID tables
        self._nudged: str | None = None  # news judged off the loop (`nudge`), due at once

    def announce(self, source: str, devices: Collection[str] | None = None) -> None:
        """A change `source` saw; `devices` are the RDMA devices it concerns (None: unknown, all)."""
        with self._lock:
            self._sources.add(source)
            if self._burst_due() is None:  # no burst running: this one starts from nothing
                self._burst_devices = set()
            if devices is None or self._burst_devices is None:
                self._burst_devices = None
            else:
                self._burst_devices.update(devices)
            self._burst_start = self._clock()
            self._burst_step = 0
        self.wake.set()

    def next_read(self, at: float | None) -> None:
        """After a poll: the reader's next due read (this schedule's clock), or None when it
        reads every `interval_s`. One already past (a device whose read hangs keeps its due
        time) waits an interval, so a stuck device cannot make the loop spin."""
        with self._lock:
            now = self._clock()
            if at is None:
                self._next_interval = min(self._next_interval, now + self.interval_s)
            else:
                self._next_interval = at if at > now else now + self.interval_s

    def _burst_due(self) -> float | None:
        if self._burst_start is None or self._burst_step >= len(BURST_OFFSETS):
            return None
        return self._burst_start + BURST_OFFSETS[self._burst_step]

    def nudge(self, reason: str) -> None:
        """News judged on another thread (link health) waits for the loop to publish it: a poll
        is due now, with `reason`, and no burst of re-reads (nothing was announced)."""
        with self._lock:
            self._nudged = reason
        self.wake.set()

    def wait(self, stop: threading.Event, interrupt: threading.Event | None = None) -> Due | None:
        """Block until a poll is due; None when `stop` is set. `interrupt` (reload) returns early."""
        while not stop.is_set():
            with self._lock:
                burst = self._burst_due()
                due = self._next_interval if burst is None else min(burst, self._next_interval)
            timeout = due - self._clock()
            if timeout > 0:
                self.wake.wait(timeout)
                self.wake.clear()
            if stop.is_set():
                return None
            now = self._clock()
            with self._lock:
                burst = self._burst_due()
                if burst is not None and burst <= now:
                    while (
                        self._burst_step < len(BURST_OFFSETS)
                        and self._burst_start is not None
                        and (self._burst_start + BURST_OFFSETS[self._burst_step] <= now)
                    ):
                        self._burst_step += 1
                    sources, self._sources = frozenset(self._sources), set()
                    devices = self._burst_devices
                    return Due("event", True if devices is None else frozenset(devices), sources)
                if self._next_interval <= now:
                    self._next_interval = now + self.interval_s
                    return Due("interval", False, frozenset())
            with self._lock:
                nudged, self._nudged = self._nudged, None
            if nudged is not None:
                return Due(nudged, False, frozenset())
            if interrupt is not None and interrupt.is_set():
                return Due("signal", False, frozenset())
        return None
