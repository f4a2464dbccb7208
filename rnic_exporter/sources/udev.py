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
counted, logged once per state change, and retried with backoff; nothing is raised to the owner
(`watcher.py`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rnic_exporter.sources.watcher import RetryingWatcher

log = logging.getLogger("rnic_exporter.udev")

SUBSYSTEMS = ("infiniband", "net", "pci")
ACTIONS = frozenset({"add", "remove", "change", "move", "bind", "unbind"})
UDEVD_CONTROL = Path("/run/udev/control")
OVERRUN = "overrun"


def event_source(control: Path = UDEVD_CONTROL) -> str:
    """ "udev" when a udev daemon runs (its control socket exists), else "kernel"."""
    return "udev" if control.exists() else "kernel"


class UdevWatcher(RetryingWatcher):
    """Calls `on_change(subsystem, action, sys_name)` from its thread for each device event.

    `sys_name` is the kernel's name (`mlx5_0`, `ens1f0np0`, `0000:3b:00.0`); for `move` (a
    rename) it is the new name.
    """

    name = "udev"
    meanwhile = "device add/remove is only seen by polling meanwhile"
    lost = "device events were lost"

    def __init__(
        self,
        on_change: Callable[[str, str, str], None],
        *,
        source: str | None = None,
        retry_initial_s: float = 0.5,
        retry_max_s: float = 30.0,
        rcvbuf: int | None = None,
    ) -> None:
        super().__init__(log, retry_initial_s=retry_initial_s, retry_max_s=retry_max_s)
        self._on_change = on_change
        self._rcvbuf = rcvbuf  # None: libudev's default (128 MiB for udev sources since systemd 248)
        self.source = source or event_source()
        self._wake_w: int | None = None

    def _interrupt(self) -> None:
        with self._lock:
            if self._wake_w is not None:
                with contextlib.suppress(OSError):  # the pipe is closing too: the stop flag is enough
                    os.write(self._wake_w, b"x")

    def _subject(self) -> str:
        return f"udev monitor (source {self.source})"

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
            self._up()
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
            self._overrun()
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


def _take_socket_error(fd: int) -> int:
    with socket.socket(fileno=os.dup(fd)) as sock:  # a duplicate: closing it leaves the monitor's fd open
        return sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)


__all__ = ["ACTIONS", "OVERRUN", "SUBSYSTEMS", "UdevWatcher", "event_source"]
