"""Reads run off the caller's thread, so one hung read stalls only its own device.

On ConnectX a sysfs counter read is a firmware command, and a sick firmware blocks it for tens
of seconds (mlx5 command timeouts); Python cannot interrupt a blocked `pread`. A pass (every
device's state, or every device's counters) is therefore handed to one worker thread, one
hand-off per pass, and the caller waits with a deadline per device: when a device's job
overruns `deadline_s`, the device is marked stuck (every pass skips it until that job
returns), the worker is written off (it finishes that one job, which touches only that
device's own state, and exits) and a fresh worker carries on with the remaining devices.

One worker per device would be simpler, but costs a thread hand-off per device per pass
(`bench/handoff.py` measures both); a pass over 16 healthy devices takes about a millisecond, so
the hand-off would cost as much as the reads.

A device's reading state (plans, held descriptors, objects) is touched by one thread at a time:
every job holds its `Gate.lock`. A descriptor is only ever closed by a job holding that lock,
so it is never closed under another thread's blocked read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

log = logging.getLogger("rnic_exporter.sources")

# A healthy sysfs read takes microseconds, an mlx5 firmware command a few milliseconds; a job
# (one device's files) that made no progress (see `progress`) for this long is hung, not slow.
DEFAULT_DEADLINE_S = 1.0
# How long a waiter watches an overrun job before writing it off (see ReadRunner.wait), and how
# late a waiter must wake to count as not having run (the process was paused): a scheduling delay
# under load is shorter, and counting it would let a loaded host postpone a write-off for ever.
CONFIRM_S = 0.25
PAUSED_S = 1.0


class _OnWorker(threading.local):
    worker: _Worker | None = None  # the _Worker running on this thread (a class default: no miss to raise)


_on_worker = _OnWorker()


def progress() -> None:
    """Called by a job between its reads (sources/sysfs.py: per batch, and every 32 files of a batch
    that opens them): the deadline counts from the last call. A hung read makes no progress; a job
    of many reads that all answer, slowly (a first read of a big GID table on a loaded host,
    firmware taking milliseconds per counter), does, and is not taken for a hung one (the soak's
    FUSE tree at load 4 had jobs of 1.3 s written off)."""
    worker = _on_worker.worker
    if worker is not None:
        worker.progress_at = worker.clock()


class Gate:
    """One device registration's read lock and stuck-read state."""

    __slots__ = ("lock", "name", "stuck_since")

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.Lock()
        self.stuck_since: float | None = None  # monotonic start of the job that overran

    @property
    def stuck(self) -> bool:
        return self.stuck_since is not None


@dataclass(slots=True)
class _Job:
    seq: int
    gate: Gate
    run: Callable[[], None]
    last: bool = False  # the last job of a submitted batch: its waiters are woken after it


class _Worker:
    __slots__ = ("clock", "current", "progress_at", "started", "thread", "written_off")

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.current: _Job | None = None
        self.started = 0.0
        self.progress_at = 0.0  # the job's start or its last `progress()`: the deadline counts from here
        self.written_off = False
        self.thread: threading.Thread | None = None


class ReadRunner:
    """Runs jobs in order on one worker thread at a time; thread-safe (several callers may submit)."""

    def __init__(
        self, name: str, deadline_s: float = DEFAULT_DEADLINE_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.name = name
        self.deadline_s = deadline_s
        self._clock = clock
        self._cond = threading.Condition()
        self._queue: deque[_Job] = deque()
        self._worker: _Worker | None = None
        self._submitted = 0
        self._finished = 0  # every job up to this one has run or been written off
        self._closed = False
        self.handoffs = 0
        self.written_off = 0

    def run(
        self,
        jobs: Sequence[tuple[Gate, Callable[[], None]]],
        wait_s: float | None = None,
        stop: threading.Event | None = None,
    ) -> bool:
        """Run `jobs`, skipping stuck devices; True once all ran or were written off, False when
        `wait_s` passed or `stop` was set first (the rest still run, in the background)."""
        ticket = self.submit(jobs)
        return self.wait(ticket, wait_s, stop)

    def submit(self, jobs: Sequence[tuple[Gate, Callable[[], None]]]) -> int:
        with self._cond:
            batch = [
                _Job(self._submitted + 1 + i, gate, job)
                for i, (gate, job) in enumerate((g, j) for g, j in jobs if not g.stuck)
            ]
            if batch:
                batch[-1].last = True
                self._submitted += len(batch)
                self._queue.extend(batch)
            if self._queue and self._worker is None and not self._closed:
                self._start_worker()
            self.handoffs += 1
            self._cond.notify_all()
            return self._submitted

    def done(self, ticket: int) -> bool:
        with self._cond:
            return self._finished >= ticket

    def wait(self, ticket: int, wait_s: float | None = None, stop: threading.Event | None = None) -> bool:
        until = None if wait_s is None else self._clock() + wait_s
        # A job that overran is written off only once this waiter has itself watched it run on for
        # CONFIRM_S. When the whole process was paused (SIGSTOP, a frozen cgroup, a starved CPU),
        # the read and this waiter stopped together: on waking the clock says the job overran, but
        # a read that was never stuck finishes within moments. A false "stuck" pages for a healthy NIC.
        suspect: int | None = None  # the job this waiter saw overrun, and since when
        suspect_since = woke_by = 0.0
        with self._cond:
            while self._finished < ticket:
                if stop is not None and stop.is_set():
                    return False
                now = self._clock()
                if now > woke_by + PAUSED_S:
                    suspect = None  # this waiter was not running either: whatever it saw is stale
                worker = self._worker
                timeout = None if until is None else until - now
                if worker is not None and (job := worker.current) is not None:
                    overrun = worker.progress_at + self.deadline_s - now
                    if overrun > 0:
                        suspect = None  # it answered since: what was suspected is over
                    else:
                        if suspect != job.seq:
                            suspect, suspect_since = job.seq, now
                        overrun = suspect_since + CONFIRM_S - now
                        if overrun <= 0:
                            self._write_off(worker, now)
                            continue
                    timeout = overrun if timeout is None else min(timeout, overrun)
                if timeout is not None and timeout <= 0:
                    return False
                # Bounded so a stop set by a signal handler on this thread is seen soon.
                step = 0.5 if timeout is None else min(timeout, 0.5)
                woke_by = now + step
                self._cond.wait(step)
            return True

    def close(self) -> None:
        """No more jobs; workers exit after their current one (a blocked one may never return)."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._finished = self._submitted
            if self._worker is not None:
                self._worker.written_off = True
                self._worker = None
            self._cond.notify_all()

    # -- under self._cond -------------------------------------------------------------------

    def _start_worker(self) -> None:
        worker = _Worker(self._clock)
        worker.thread = threading.Thread(target=self._work, args=(worker,), name=f"{self.name}-reads", daemon=True)
        self._worker = worker
        worker.thread.start()

    def _write_off(self, worker: _Worker, now: float) -> None:
        job = worker.current
        assert job is not None
        job.gate.stuck_since = worker.started  # the job's identity too: see _work
        worker.written_off = True
        self.written_off += 1
        self._finished = max(self._finished, job.seq)
        log.warning(
            "a sysfs read is hung; skipping the device until it returns",
            extra={
                "fields": {"device": job.gate.name, "pass": self.name, "blocked_s": round(now - worker.progress_at, 1)}
            },
        )
        self._worker = None
        if self._queue and not self._closed:
            self._start_worker()

    # -- on a worker thread -----------------------------------------------------------------

    def _work(self, worker: _Worker) -> None:
        """Jobs are popped without the lock (deque operations are atomic) and the waiters woken
        once per submitted batch, not per job: a pass costs one hand-off, not one per device."""
        _on_worker.worker = worker
        queue = self._queue
        while True:
            try:
                job = queue.popleft()
            except IndexError:
                with self._cond:
                    if not queue and not worker.written_off:
                        self._cond.wait()
                    if worker.written_off:
                        return
                continue
            if worker.written_off:
                queue.appendleft(job)  # the fresh worker's now
                return
            worker.started = worker.progress_at = self._clock()
            worker.current = job  # after `started`: a waiter that sees the job sees its start
            try:
                if not job.gate.stuck:
                    with job.gate.lock:
                        job.run()
            except Exception:  # a reader bug costs that device's pass, never the thread
                log.exception("reading a device failed", extra={"fields": {"device": job.gate.name}})
            worker.current = None
            if worker.written_off:
                with self._cond:
                    if job.gate.stuck_since == worker.started:
                        job.gate.stuck_since = None
                        log.info(
                            "a hung sysfs read returned",
                            extra={
                                "fields": {
                                    "device": job.gate.name,
                                    "pass": self.name,
                                    "blocked_s": round(self._clock() - worker.started, 1),
                                }
                            },
                        )
                return
            self._finished = job.seq
            if job.last or not queue:
                with self._cond:
                    self._cond.notify_all()


class SingleFlight:
    """One pass at a time for many consumers: a consumer joins the pass in flight, or starts one
    when the last is older than `max_age_s`, and waits at most its own bound for it.

    `scope()` names what a pass would cover now (the devices and their counter plans): a pass made
    for another scope never stands in for this one, even when young. At start-up the first scrape
    can come before the first poll has listed a device; reusing its empty pass served a second of
    scrapes with no counter series that said they were fresh."""

    def __init__(
        self,
        runner: ReadRunner,
        jobs: Callable[[], Sequence[tuple[Gate, Callable[[], None]]]],
        max_age_s: float,
        clock: Callable[[], float] = time.monotonic,
        scope: Callable[[], object] = lambda: None,
    ) -> None:
        self._runner = runner
        self._jobs = jobs
        self.max_age_s = max_age_s
        self._clock = clock
        self._scope = scope
        self._lock = threading.Lock()
        self._ticket: int | None = None
        self._ticket_scope: object = None
        self._started = float("-inf")
        self.passes = 0

    @property
    def started(self) -> float | None:
        """(clock) When the last pass started; None before the first."""
        return None if self._ticket is None else self._started

    def refresh(self, wait_s: float | None, max_age_s: float | None = None) -> bool:
        """True when the pass this consumer joined (the one in flight, or a new one when the last
        finished more than `max_age_s` (the flight's own unless given) after it started, or covered
        another scope) finished; False when the wait ran out."""
        with self._lock:
            now = self._clock()
            scope = self._scope()
            stale = now - self._started >= (self.max_age_s if max_age_s is None else max_age_s)
            if (
                self._ticket is None
                or scope != self._ticket_scope  # queued behind the one in flight
                or (stale and self._runner.done(self._ticket))
            ):
                self._ticket = self._runner.submit(self._jobs())
                self._ticket_scope = scope
                self._started = now
                self.passes += 1
            ticket = self._ticket
        return self._runner.wait(ticket, wait_s)
