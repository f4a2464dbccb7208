"""Device add/remove/change events for RDMA devices, netdevs and PCI functions (pyudev).

The events come from udevd (source "udev", after its rules ran) when `/run/udev/control` shows
one is running, else straight from the kernel (source "kernel"): many containers and minimal
hosts run no udevd, and a udev-source monitor there hears nothing at all.

Net-device uevents are scoped to the network namespace of the listening socket: run in the
host's namespace to hear about the host's netdevs. Port state and carrier changes are not
uevents (they come over rtnetlink, see `netlink.py`).

One thread owns the monitor. It waits in poll() on the monitor and a wake-up pipe, so
`close()` is prompt; libudev reads one datagram per receive, so poll() loses nothing here
(unlike pyroute2's read-ahead). A full receive buffer (ENOBUFS) means events were lost: the
owner hears `on_change("*", "overrun", "*")` so it can re-read everything. Other failures are
counted, logged once per state change, and retried with backoff; nothing is raised to the owner.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("rnic_exporter.udev")

SUBSYSTEMS = ("infiniband", "net", "pci")
ACTIONS = frozenset({"add", "remove", "change", "move", "bind", "unbind"})
UDEVD_CONTROL = Path("/run/udev/control")
OVERRUN = "overrun"


def event_source(control: Path = UDEVD_CONTROL) -> str:
    """ "udev" when a udev daemon runs (its control socket exists), else "kernel"."""
    return "udev" if control.exists() else "kernel"


class UdevWatcher:
    """Calls `on_change(subsystem, action, sys_name)` from its thread for each device event.

    `sys_name` is the kernel's name (`mlx5_0`, `ens1f0np0`, `0000:3b:00.0`); for `move` (a
    rename) it is the new name.
    """

    def __init__(
        self,
        on_change: Callable[[str, str, str], None],
        *,
        source: str | None = None,
        retry_initial_s: float = 0.5,
        retry_max_s: float = 30.0,
        rcvbuf: int | None = None,
    ) -> None:
        self._on_change = on_change
        self._rcvbuf = rcvbuf  # None: libudev's default (128 MiB for udev sources since systemd 248)
        self.source = source or event_source()
        self._retry_initial_s = retry_initial_s
        self._retry_max_s = retry_max_s
        self._delay = retry_initial_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Event()  # listening, or the first attempt failed
        self._wake_w: int | None = None
        self._thread: threading.Thread | None = None
        self._logged_problem: str | None = None
        self._last_overrun_log = float("-inf")
        self.errors = 0
        self.overruns = 0
        self.healthy = False

    def start(self, timeout: float = 5.0) -> None:
        """Start listening; returns once the monitor listens (or its first attempt failed)."""
        if self._thread is not None:
            raise RuntimeError("UdevWatcher.start() called twice")
        self._thread = threading.Thread(target=self._thread_main, name="udev-watcher", daemon=True)
        self._thread.start()
        self._ready.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        with self._lock:
            if self._wake_w is not None:
                with contextlib.suppress(OSError):  # the pipe is closing too: the stop flag is enough
                    os.write(self._wake_w, b"x")
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                log.warning("udev watcher thread did not stop within %.1fs", timeout)
        self.healthy = False

    def __enter__(self) -> UdevWatcher:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the watcher thread ------------------------------------------------------------------

    def _thread_main(self) -> None:
        while not self._stop.is_set():
            try:
                self._session()
            except Exception as exc:  # never out of this thread: count, log, back off, retry
                self._stop.wait(self._failed(exc))
        self.healthy = False
        self._ready.set()

    def _session(self) -> None:
        import pyudev  # needs libudev; imported only where used

        wake_r, wake_w = os.pipe()
        monitor: Any = None
        try:
            with self._lock:
                self._wake_w = wake_w
            monitor = pyudev.Monitor.from_netlink(pyudev.Context(), source=self.source)
            for subsystem in SUBSYSTEMS:
                monitor.filter_by(subsystem)  # a socket filter: other subsystems never wake us
            if self._rcvbuf is not None:
                monitor.set_receive_buffer_size(self._rcvbuf)
            monitor.start()
            if self._logged_problem is not None:
                log.info("udev watcher recovered after %d error(s)", self.errors)
                self._logged_problem = None
            self.healthy = True
            self._delay = self._retry_initial_s
            self._ready.set()
            # poll(), not select(): the exporter holds thousands of sysfs descriptors, so these
            # fds are above select()'s FD_SETSIZE (1024) on any real host.
            poller = select.poll()
            poller.register(monitor.fileno(), select.POLLIN)
            poller.register(wake_r, select.POLLIN)
            while not self._stop.is_set():
                ready = {fd for fd, _ in poller.poll()}
                if wake_r in ready:
                    return
                self._receive(monitor)
        finally:
            with self._lock:
                self._wake_w = None
            os.close(wake_r)
            os.close(wake_w)
            if monitor is not None:
                del monitor  # pyudev frees the libudev monitor (and its socket) with the object

    def _receive(self, monitor: Any) -> None:
        try:
            device = monitor.poll(timeout=0)
        except OSError as exc:
            # pyudev reports a socket error as POLLERR without its errno: read (and so clear)
            # the pending error to tell an overrun from a broken socket.
            if (exc.errno or _take_socket_error(monitor.fileno())) != errno.ENOBUFS:
                raise
            self.errors += 1
            self.overruns += 1
            now = time.monotonic()
            if now - self._last_overrun_log >= 60.0:  # a storm would otherwise log every datagram
                self._last_overrun_log = now
                log.warning("udev receive buffer overran (ENOBUFS, %d so far): device events were lost", self.overruns)
            self._notify("*", OVERRUN, "*")
            return
        if device is None or device.action not in ACTIONS:
            return  # filtered out by libudev after the wake-up
        self._notify(str(device.subsystem), str(device.action), str(device.sys_name))

    def _notify(self, subsystem: str, action: str, sys_name: str) -> None:
        try:
            self._on_change(subsystem, action, sys_name)
        except Exception:
            log.exception("udev change callback failed for %s %s %s", subsystem, action, sys_name)

    def _failed(self, exc: BaseException) -> float:
        delay = self._delay
        self._delay = min(delay * 2, self._retry_max_s)
        self.errors += 1
        self.healthy = False
        what = f"{type(exc).__name__}: {exc}"
        if what != self._logged_problem:  # once per state change: identical retries stay quiet
            log.warning(
                "udev monitor (source %s) failed (%s); retrying with backoff from %gs, device "
                "add/remove is only seen by polling meanwhile",
                self.source,
                what,
                delay,
            )
        self._logged_problem = what
        self._ready.set()
        return delay


def _take_socket_error(fd: int) -> int:
    with socket.socket(fileno=os.dup(fd)) as sock:  # a duplicate: closing it leaves the monitor's fd open
        return sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)


__all__ = ["ACTIONS", "OVERRUN", "SUBSYSTEMS", "UdevWatcher", "event_source"]
