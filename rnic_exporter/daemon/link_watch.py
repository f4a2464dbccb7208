"""Link health on its own timer: `rnic.port.degrading` / `rnic.port.recovered` even when nobody scrapes.

Every `window_seconds` ([link_health], 60 s) a thread takes a counter pass through the agent's
SingleFlight (a scrape at the same moment shares the read), merges it into the last state
snapshot, and feeds `LinkHealthTracker` (`detect/link_health_events.py`, pure). The events it
answers are handed to the poll loop, which publishes them as it publishes detection's: logged,
counted in `rnic_events_total`, given to every sink (OTLP). The loop is woken for them
(`PollSchedule.nudge`) instead of publishing from here: one thread publishes, in order.

The tracker is fed only from this timer, not from scrapes: it judges windows of at least
`window_seconds`, and this timer closes one each time it fires. The counters' time is taken when
the pass returned; a pass reused from a scrape (`COUNTER_PASS_REUSE_S`, 1 s) is at most that old.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from rnic_exporter.catalog.events import Event
from rnic_exporter.catalog.link_health import LinkHealthThresholds
from rnic_exporter.detect.conditions import HostConditions
from rnic_exporter.detect.link_health_events import LinkHealthTracker
from rnic_exporter.model.host import Snapshot

log = logging.getLogger("rnic_exporter.agent")

# The reason a poll is due for these events (`PollSchedule.nudge`).
NUDGE = "link_health"


class LinkWatch:
    """`tick` is one judgement (tests call it with their own clock); `start` runs it on a thread."""

    def __init__(
        self,
        read: Callable[[], Snapshot | None],
        hand_off: Callable[[list[Event]], None],
        settings: LinkHealthThresholds,
        *,
        conditions: Callable[[], HostConditions | None] = lambda: None,
        consumers: Callable[[], Mapping[str, tuple[str, ...]] | None] = lambda: None,
        failed: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`read`: a counter pass merged into the last state snapshot (None before the first poll);
        `hand_off`: gives the events to the loop (thread-safe); `conditions`, `consumers`: what the
        events say the port also suffers and who uses it; `failed`: counts a judgement that raised."""
        self._read = read
        self._hand_off = hand_off
        self._conditions = conditions
        self._consumers = consumers
        self._failed = failed
        self._clock = clock
        self.tracker = LinkHealthTracker(settings, settings.window_seconds, settings.clear_after_seconds)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def interval_s(self) -> float:
        return self.tracker.window_s

    def reconfigure(self, settings: LinkHealthThresholds) -> None:
        """A config reload: new limits and windows from the next judgement on (the reference stays)."""
        tracker = self.tracker
        tracker.thresholds = settings
        tracker.window_s, tracker.clear_after_s = settings.window_seconds, settings.clear_after_seconds

    def tick(self) -> list[Event]:
        """One counter pass judged; the events handed off (and returned)."""
        snap = self._read()
        if snap is None:
            return []
        at = self._clock()
        events = self.tracker.observe(
            replace(snap, taken_at=time.time()), at, conditions=self._conditions(), consumers=self._consumers()
        )
        if events:
            self._hand_off(events)
        return events

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="link-health", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        # The first pass is the first window's reference; each later one closes a window.
        while True:
            try:
                self.tick()
            except Exception:  # a bug here costs link health, never the daemon
                self._failed()
                log.exception("judging link health failed; trying again next window")
            if self._stop.wait(self.interval_s):
                return

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0)  # a hung counter read is the read runner's: it gives up on its own
