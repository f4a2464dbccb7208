"""Link health on its own timer: `rnic.port.degrading` / `rnic.port.recovered` even when nobody scrapes.

Every `window_seconds` ([link_health], 60 s) a thread takes a counter pass through the agent's
SingleFlight (a scrape at the same moment shares the read), merges it into the last state
snapshot, and feeds `LinkHealthTracker` (`detect/link_health_events.py`, pure). The events it
answers are handed to the poll loop, which publishes them as it publishes detection's: logged,
counted in `rnic_events_total`, given to every sink (OTLP). The loop is woken for them
(`PollSchedule.nudge`) instead of publishing from here: one thread publishes, in order.

The tracker is fed only from this timer, not from scrapes: it judges windows of at least
`window_seconds`, and this timer closes one each time it fires. Where something scrapes, the timer
reads nothing of its own: it fires up to `REUSE_S` after a window could close and takes the last
scrape's counter pass, if that pass started after the window's end and under `REUSE_S` ago (a
pass is a few milliseconds of CPU a minute, as much as the idle daemon's polls of a quarter
minute); the window then lasts up to `REUSE_S` longer. A host nobody scrapes gets a pass of the
timer's own each window, as before. The counters' time is when their pass started (a fresh pass:
when it returned).
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
# A scrape's counter pass this young stands in for one of the timer's own (Prometheus' default
# scrape interval: a host scraped at it always has one).
REUSE_S = 15.0


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
        recent: Callable[[float], tuple[Snapshot, float] | None] = lambda max_age_s: None,
        last_pass_at: Callable[[], float | None] = lambda: None,
    ) -> None:
        """`read`: a counter pass merged into the last state snapshot (None before the first poll);
        `hand_off`: gives the events to the loop (thread-safe); `conditions`, `consumers`: what the
        events say the port also suffers and who uses it; `failed`: counts a judgement that raised.
        `recent(max_age_s)`: the last counter pass (a scrape's) merged alike with when it started
        (`clock`), if it started under `max_age_s` ago, reading nothing; `last_pass_at`: when the
        last counter pass started, whoever asked for it."""
        self._read = read
        self._recent = recent
        self._last_pass_at = last_pass_at
        self._own_pass_at: float | None = None  # the start of the last pass the timer itself made
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
        """One counter pass judged (a scrape's, when one closes the window); the events handed off
        (and returned)."""
        reused = self._reuse()
        if reused is not None:
            snap, at = reused
            taken = time.time() - max(0.0, self._clock() - at)
        else:
            read = self._read()
            if read is None:
                return []
            snap, at, taken = read, self._clock(), time.time()
            self._own_pass_at = self._last_pass_at()
        events = self.tracker.observe(
            replace(snap, taken_at=taken), at, conditions=self._conditions(), consumers=self._consumers()
        )
        if events:
            self._hand_off(events)
        return events

    def _reuse(self) -> tuple[Snapshot, float] | None:
        """A scrape's pass that closes the window (started at least a window after the last
        judged one) and is under `REUSE_S` old, with when it started."""
        ref = self.tracker.reference_at
        max_age = REUSE_S if ref is None else min(REUSE_S, self._clock() - ref - self.interval_s)
        return None if max_age < 0 else self._recent(max_age)

    def wait_s(self) -> float:
        """Until the next judgement: a window after the last one; `REUSE_S` later where something
        scrapes (a counter pass not the timer's started under `REUSE_S` ago), so the first scrape
        after the window's end is judged instead of a pass of the timer's own."""
        ref = self.tracker.reference_at
        if ref is None:
            return self.interval_s
        now = self._clock()
        last = self._last_pass_at()
        scraped = last is not None and last != self._own_pass_at and now - last < REUSE_S
        return max(0.0, ref + self.interval_s + (REUSE_S if scraped else 0.0) - now)

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
            if self._stop.wait(self.wait_s()):
                return

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0)  # a hung counter read is the read runner's: it gives up on its own
