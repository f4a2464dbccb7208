"""The lifecycle the netlink and udev watchers share (`netlink.py`, `udev.py`).

A watcher owns one thread of its own, started once and stopped promptly by `close()`. It never
raises into its owner: a failure is counted (`errors`), logged once per state change (identical
retries stay quiet) and retried with exponential backoff; a session that comes up after failing
logs "recovered"; an overrun (ENOBUFS: the kernel dropped messages) is counted (`overruns`) and
logged at most once a minute. `healthy` says whether it listens now.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import ClassVar, Self

# A storm of overruns would otherwise log one line per datagram (or per re-dump).
_OVERRUN_LOG_S = 60.0


class RetryingWatcher:
    """A subclass runs its sessions in `_thread_main` and stops them when `_interrupt` is called;
    it calls `_up` once listening, `_failed` for the delay before the next attempt, `_overrun`."""

    name: ClassVar[str]  # "netlink", "udev": its thread and log lines
    meanwhile: ClassVar[str]  # what a failure means until it recovers
    lost: ClassVar[str]  # what an overrun means

    def __init__(self, log: logging.Logger, *, retry_initial_s: float, retry_max_s: float) -> None:
        self._log = log
        self._retry_initial_s = retry_initial_s
        self._retry_max_s = retry_max_s
        self._delay = retry_initial_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Event()  # listening, or the first attempt failed
        self._thread: threading.Thread | None = None
        self._logged_problem: str | None = None
        self._last_overrun_log = float("-inf")
        self.errors = 0  # failures, overruns included
        self.overruns = 0  # ENOBUFS: messages were lost
        self.healthy = False

    def start(self, timeout: float = 5.0) -> None:
        """Start the thread; returns once it listens, its first attempt failed, or after `timeout`
        (it keeps retrying in the background: see `healthy`, `errors`)."""
        if self._thread is not None:
            raise RuntimeError(f"{type(self).__name__}.start() called twice")
        self._thread = threading.Thread(target=self._thread_main, name=f"{self.name}-watcher", daemon=True)
        self._thread.start()
        self._ready.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread; prompt even while it waits for a message."""
        self._stop.set()  # first: a session woken by `_interrupt` must not start another
        self._interrupt()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                self._log.warning("%s watcher thread did not stop within %.1fs", self.name, timeout)
        self.healthy = False

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- for the subclass ---------------------------------------------------------------------

    def _thread_main(self) -> None:
        raise NotImplementedError

    def _interrupt(self) -> None:
        """Wake the thread from its wait for a message (`_stop` is set already)."""
        raise NotImplementedError

    def _subject(self) -> str:
        """What failed, as the failure's log line names it."""
        return self.name

    def _describe(self, exc: BaseException) -> str:
        return f"{type(exc).__name__}: {exc}"

    def _up(self) -> None:
        """Listening (again): a recovery is logged, the backoff starts over."""
        if self._logged_problem is not None:
            self._log.info("%s watcher recovered after %d error(s)", self.name, self.errors)
            self._logged_problem = None
        self.healthy = True
        self._delay = self._retry_initial_s
        self._ready.set()

    def _failed(self, exc: BaseException) -> float:
        """Count and log a failure; returns the seconds to wait before the next attempt."""
        delay = self._delay
        self._delay = min(delay * 2, self._retry_max_s)
        self.errors += 1
        self.healthy = False
        what = self._describe(exc)
        if what != self._logged_problem:  # once per state change: identical retries stay quiet
            self._log.warning(
                "%s failed (%s); retrying with backoff from %gs, %s", self._subject(), what, delay, self.meanwhile
            )
        self._logged_problem = what
        self._ready.set()
        return delay

    def _overrun(self) -> None:
        self.errors += 1
        self.overruns += 1
        now = time.monotonic()
        if now - self._last_overrun_log >= _OVERRUN_LOG_S:
            self._last_overrun_log = now
            self._log.warning("%s receive buffer overran (ENOBUFS, %d so far): %s", self.name, self.overruns, self.lost)
