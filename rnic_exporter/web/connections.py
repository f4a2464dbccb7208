"""Open connections, from accept to a complete request head, on one thread and without a thread each.

A Go server (node_exporter) gives each connection a goroutine, which costs a few kilobytes; a
Python thread costs a stack and a slice of the GIL, so thousands of clients that connect and say
nothing (or a header byte every few seconds: slowloris) used to mean thousands of threads. Here
one thread, the reactor, owns every connection that is not being answered: it accepts, runs the
TLS handshake without blocking, and reads the request head, each under a deadline for the whole
step (not per read, so trickling bytes does not extend it). Only a complete head goes to a worker
thread (`on_request`); the worker gives the connection back with `resume` for keep-alive.

At most `max_connections` are open. When a new client arrives at the cap, the connection that has
waited longest without ever having a request answered (slowloris, silent TLS, idle probes) is
closed to make room, then the longest-idle keep-alive, but none that has waited less than
EVICT_AFTER. When none can be closed yet and the clients come from more than one address, a
newcomer from an address holding less than half as many connections as the address holding the
most (the hog) takes the hog's longest-waiting unanswered place, and any other newcomer is closed
as soon as it is accepted, before any TLS work: so the listen backlog drains at the speed of a
close and a scraper on its own address (Prometheus reconnecting, or opening a connection per
scrape) is not queued in the kernel behind a flood from another host. When they all come from
one address, nobody can be told apart: accepting pauses and new clients wait in the backlog,
with no descriptor and no memory of ours.
"""

from __future__ import annotations

import enum
import errno
import heapq
import itertools
import logging
import re
import selectors
import socket
import ssl
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any, cast

log = logging.getLogger(__name__)

# The request line and headers together; http.server allows 64 KiB per line and 100 headers.
MAX_HEAD = 64 * 1024
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_TOO_LARGE = b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
# Per round of the loop: requests on open connections are read first, then at most this many
# TLS handshake steps and accepts, so a scraper's request waits behind a few handshakes (about
# 0.3 ms of CPU each), never behind a flood of them (the rest stay ready and are taken next round).
_HANDSHAKES_PER_ROUND = 4
_ACCEPTS_PER_ROUND = 8
# Newcomers closed at accept per round (a close costs ~20 us, no TLS), but no more once a round
# has spent this long on them (checked every 16), so ready connections are looked at again soon.
_REFUSALS_PER_ROUND = 1024
_REFUSING_FOR = 0.002
# Out of descriptors: how long to stop accepting when no connection can be closed for room.
_EMFILE_PAUSE = 0.1
# A connection is never closed for room before it has waited this long: a real client has time
# to finish its handshake and send its request, and a flood of reconnecting clients costs at
# most max_connections handshakes per EVICT_AFTER instead of whatever the attacker can send.
EVICT_AFTER = 1.0


class Phase(enum.Enum):
    HANDSHAKE = "handshake"
    WAITING = "waiting"  # for (the rest of) a request head
    BUSY = "busy"  # a worker has it


class Connection:
    """One client connection. The reactor owns it except while BUSY, when one worker does."""

    __slots__ = ("_want", "address", "buffer", "deadline", "phase", "proven", "requests", "since", "sock")

    def __init__(self, sock: socket.socket, address: Any) -> None:
        self.sock = sock
        self.address = address
        self.buffer = bytearray()
        self.phase = Phase.WAITING
        self.deadline = 0.0
        self.proven = False  # a request on it passed authentication: a real scraper, evicted last
        self.requests = 0
        self.since = 0.0  # when it started waiting
        self._want = 0  # the events the reactor's selector watches for; 0: not registered

    def take_head(self) -> bytes | None:
        """The next complete request head from the buffer (removing it), or None."""
        match = _HEAD_END.search(self.buffer)
        if match is None:
            return None
        head = bytes(self.buffer[: match.end()])
        del self.buffer[: match.end()]
        return head


class Reactor:
    """Accepts on `listeners` and hands complete request heads to `on_request` (on this thread).

    `tls()` gives the TLS context for a new connection (None: plain HTTP), `tls_peer_ok` judges
    a finished handshake (the client certificate's SANs).
    """

    def __init__(
        self,
        listeners: Sequence[socket.socket],
        on_request: Callable[[Connection, bytes], None],
        *,
        tls: Callable[[], ssl.SSLContext | None],
        tls_peer_ok: Callable[[ssl.SSLSocket], bool],
        max_connections: int,
        handshake_timeout: float,
        request_timeout: float,
        idle_timeout: float,
        evict_after: float = EVICT_AFTER,
    ) -> None:
        self._listeners = list(listeners)
        self._on_request = on_request
        self._tls = tls
        self._tls_peer_ok = tls_peer_ok
        self.max_connections = max_connections
        self.handshake_timeout = handshake_timeout
        self.request_timeout = request_timeout
        self.idle_timeout = idle_timeout
        self.evict_after = evict_after
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stopping = threading.Event()
        self._resumed: deque[tuple[Connection, bool]] = deque()
        self._open: set[Connection] = set()
        # Waiting connections by how long they have waited, oldest first: the eviction order.
        self._unproven: OrderedDict[Connection, None] = OrderedDict()
        self._proven: OrderedDict[Connection, None] = OrderedDict()
        self._deadlines: list[tuple[float, int, Connection]] = []
        self._by_host: dict[str, int] = {}  # open connections per client address
        self.evicted = 0  # waiting connections closed to make room for a newcomer
        self.refused = 0  # newcomers closed at accept, at the cap
        self.too_large = 0  # request heads over MAX_HEAD, answered 431
        self._seq = itertools.count()
        self._accepting = False
        self._accept_paused_until = 0.0
        self._thread: threading.Thread | None = None

    # -- control (any thread) ---------------------------------------------------------------

    def start(self) -> None:
        for sock in self._listeners:
            sock.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._listen(True)
        self._thread = threading.Thread(target=self._run, name="rnic-web-io", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Stop accepting and close every connection the reactor holds; BUSY ones are the caller's."""
        self._stopping.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout)

    def resume(self, conn: Connection, keep_alive: bool) -> None:
        """A worker is done with `conn`: wait for its next request, or close it."""
        self._resumed.append((conn, keep_alive))
        self._wake()

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def busy(self) -> list[Connection]:
        return [conn for conn in list(self._open) if conn.phase is Phase.BUSY]

    def _wake(self) -> None:
        with suppress(OSError):  # full: a wake-up is pending anyway; closed: stopping
            self._wake_w.send(b"\0")

    # -- the loop (reactor thread) ----------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                handshakes: list[Connection] = []
                listeners: list[socket.socket] = []
                for key, _ in self._selector.select(self._timeout()):
                    target = key.data
                    if target is None:
                        self._drain_wake()
                    elif not isinstance(target, Connection):
                        listeners.append(cast(socket.socket, key.fileobj))
                    elif target.phase is Phase.HANDSHAKE:
                        handshakes.append(target)
                    elif target.phase is Phase.WAITING:
                        self._guarded(self._read, target)
                self._take_resumed()
                for conn in handshakes[:_HANDSHAKES_PER_ROUND]:  # the rest stay ready: next round
                    if conn.phase is Phase.HANDSHAKE and conn in self._open:
                        self._guarded(self._handshake, conn)
                refuse_until = time.monotonic() + _REFUSING_FOR
                for sock in listeners:
                    self._accept(sock, refuse_until)
                self._expire()
        finally:
            self._close_everything()

    def _guarded(self, step: Callable[[Connection], None], conn: Connection) -> None:
        """Run one connection's step; a bug it hits closes that connection, never the reactor."""
        try:
            step(conn)
        except Exception:
            log.exception("web connection from %s failed; closing it", conn.address)
            self._close(conn)

    def _timeout(self) -> float | None:
        wakeups = [self._deadlines[0][0]] if self._deadlines else []
        if not self._accepting and self._accept_paused_until:
            wakeups.append(self._accept_paused_until)
        return max(0.0, min(wakeups) - time.monotonic()) if wakeups else None

    def _drain_wake(self) -> None:
        with suppress(OSError):
            while self._wake_r.recv(4096):
                pass

    def _listen(self, on: bool) -> None:
        """Accept on every listener, or pause them all."""
        if on != self._accepting:
            for sock in self._listeners:
                if on:
                    self._selector.register(sock, selectors.EVENT_READ, sock)
                else:
                    self._selector.unregister(sock)
        self._accepting = on

    # -- accepting -----------------------------------------------------------------------------

    def _accept(self, listener: socket.socket, refuse_until: float) -> None:
        """Accept what this round may from `listener`."""
        admitted = refused = 0
        while admitted < _ACCEPTS_PER_ROUND and refused < _REFUSALS_PER_ROUND:
            at_cap = len(self._open) >= self.max_connections
            victim = self._victim() if at_cap else None
            if at_cap and victim is None and len(self._by_host) < 2:
                self._pause_at_cap()  # one address: nobody to tell apart, let the backlog hold the rest
                return
            try:
                sock, address = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                spare = self._victim()
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM) and spare is not None:
                    self._evict(spare)
                    continue  # a descriptor was freed
                log.warning("accept on %s failed: %s", listener.getsockname(), exc)
                # The listener stays readable; pause instead of spinning a core.
                self._listen(False)
                self._accept_paused_until = time.monotonic() + _EMFILE_PAUSE
                return
            if at_cap and victim is None:
                hog = max(self._by_host.items(), key=lambda item: item[1])
                if self._by_host.get(client_host(address), 0) < hog[1] // 2:
                    victim = self._victim(hog[0])  # a clearly less served address takes the hog's place
                if victim is None:
                    close_socket(sock)  # before any TLS work: the backlog drains at the speed of a close
                    self.refused += 1
                    refused += 1
                    if refused % 16 == 0 and time.monotonic() > refuse_until:
                        return  # the rest next round, after the connections that are ready
                    continue
            if victim is not None:
                self._evict(victim)
            self._admit(sock, address)
            admitted += 1

    def _admit(self, sock: socket.socket, address: Any) -> None:
        sock.setblocking(False)
        # With Nagle on, a small response written after the client's last ACK waits for its delayed
        # ACK (40 ms on Linux) on every keep-alive scrape.
        with suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = Connection(sock, address)
        self._open.add(conn)
        host = client_host(address)
        self._by_host[host] = self._by_host.get(host, 0) + 1
        self._guarded(self._start, conn)

    def _start(self, conn: Connection) -> None:
        now = time.monotonic()
        ctx = self._tls()
        if ctx is None:
            self._wait(conn, now + self.request_timeout)
            return
        try:
            conn.sock = ctx.wrap_socket(conn.sock, server_side=True, do_handshake_on_connect=False)
        except (OSError, ValueError) as exc:
            log.debug("TLS setup for %s failed: %s", conn.address, exc)
            self._close(conn)
            return
        conn.phase = Phase.HANDSHAKE
        self._wait(conn, now + self.handshake_timeout)  # its ClientHello is read next round

    def _victim(self, host: str | None = None) -> Connection | None:
        """The waiting connection that matters least, if it has waited long enough to be closed.

        With `host`: that address's longest-waiting unanswered connection, whatever its age.
        """
        if host is not None:
            return next((conn for conn in self._unproven if client_host(conn.address) == host), None)
        # A proven connection (a scraper between scrapes) goes only when no unproven one waits,
        # however young: its client would reconnect through the backlog, behind the flood.
        waiting = self._unproven or self._proven
        if not waiting:
            return None
        conn = next(iter(waiting))
        return conn if conn.since <= time.monotonic() - self.evict_after else None

    def _evict(self, conn: Connection) -> None:
        log.debug("connection cap %d reached: closing %s, waiting since longest", self.max_connections, conn.address)
        self.evicted += 1
        self._close(conn)

    def _pause_at_cap(self) -> None:
        """Stop accepting until a connection closes or the oldest waiting one may be closed."""
        self._listen(False)
        waiting = self._unproven or self._proven
        self._accept_paused_until = next(iter(waiting)).since + self.evict_after if waiting else 0.0

    # -- per connection ------------------------------------------------------------------------

    def _wait(self, conn: Connection, deadline: float, want: int = selectors.EVENT_READ) -> None:
        """Watch `conn` for input (or output) until `deadline`."""
        if conn.phase is Phase.BUSY:
            conn.phase = Phase.WAITING
        queue = self._proven if conn.proven else self._unproven
        if conn not in queue:
            queue[conn] = None  # appended: it has now waited least
            conn.since = time.monotonic()
        if conn.deadline != deadline:
            conn.deadline = deadline
            heapq.heappush(self._deadlines, (deadline, next(self._seq), conn))
        # Tracked on the connection: the selector's KeyError for "not registered" formats the
        # socket's repr, which costs more than the whole step.
        if not conn._want:
            self._selector.register(conn.sock, want, conn)
        elif conn._want != want:
            self._selector.modify(conn.sock, want, conn)
        conn._want = want

    def _unwatch(self, conn: Connection) -> None:
        self._unproven.pop(conn, None)
        self._proven.pop(conn, None)
        if conn._want:
            conn._want = 0
            with suppress(KeyError, ValueError):
                self._selector.unregister(conn.sock)

    def _handshake(self, conn: Connection) -> None:
        tls = cast(ssl.SSLSocket, conn.sock)
        try:
            tls.do_handshake()
        except ssl.SSLWantReadError:
            self._wait(conn, conn.deadline, selectors.EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self._wait(conn, conn.deadline, selectors.EVENT_WRITE)
            return
        except (OSError, ValueError) as exc:
            log.debug("TLS handshake with %s failed: %s", conn.address, exc)
            self._close(conn)
            return
        if not self._tls_peer_ok(tls):
            self._close(conn)
            return
        conn.phase = Phase.WAITING
        self._wait(conn, time.monotonic() + self.request_timeout)
        if tls.pending():
            self._read(conn)

    def _read(self, conn: Connection) -> None:
        first_byte = not conn.buffer
        try:
            while True:
                chunk = conn.sock.recv(MAX_HEAD + 1)
                if not chunk:
                    self._close(conn)  # the client hung up (between requests, that is normal)
                    return
                conn.buffer += chunk
                if len(conn.buffer) > MAX_HEAD or not isinstance(conn.sock, ssl.SSLSocket) or not conn.sock.pending():
                    break
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
            pass
        except ssl.SSLWantWriteError:
            self._wait(conn, conn.deadline, selectors.EVENT_WRITE)
            return
        except (OSError, ValueError) as exc:
            log.debug("reading from %s failed: %s", conn.address, exc)
            self._close(conn)
            return
        if conn._want != selectors.EVENT_READ:
            self._wait(conn, conn.deadline)
        self._dispatch(conn, first_byte)

    def _dispatch(self, conn: Connection, first_byte: bool = False) -> None:
        head = conn.take_head()
        if head is not None:
            self._unwatch(conn)
            conn.phase = Phase.BUSY
            conn.requests += 1
            self._on_request(conn, head)
        elif len(conn.buffer) > MAX_HEAD:
            self.too_large += 1
            with suppress(OSError):
                conn.sock.send(_TOO_LARGE)
            self._close(conn)
        elif first_byte and conn.buffer and conn.requests:
            # A keep-alive connection started its next request: from now on it has the request
            # deadline, not the idle one.
            self._wait(conn, time.monotonic() + self.request_timeout)

    def _take_resumed(self) -> None:
        while self._resumed:
            conn, keep_alive = self._resumed.popleft()
            if not keep_alive or self._stopping.is_set():
                self._close(conn)
                continue
            try:
                conn.sock.setblocking(False)
            except OSError:
                self._close(conn)
                continue
            conn.phase = Phase.WAITING
            deadline = time.monotonic() + (self.idle_timeout if conn.proven else self.request_timeout)
            if conn.buffer:  # a pipelined request already started
                deadline = time.monotonic() + self.request_timeout
            self._wait(conn, deadline)
            self._guarded(self._dispatch, conn)
            if conn.phase is Phase.WAITING and isinstance(conn.sock, ssl.SSLSocket) and conn.sock.pending():
                self._guarded(self._read, conn)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, _, conn = heapq.heappop(self._deadlines)
            if conn in self._open and conn.phase is not Phase.BUSY and conn.deadline == deadline:
                log.debug("closing %s: no complete request by the deadline (%s)", conn.address, conn.phase.value)
                self._close(conn)
        # Closed connections leave their entries behind (each holding its Connection, socket and
        # buffer): rebuild soon, or a scraper's thousand connections were a megabyte held for nothing.
        if len(self._deadlines) > 4 * len(self._open) + 64:
            self._deadlines = [(c.deadline, next(self._seq), c) for c in self._open if c.phase is not Phase.BUSY]
            heapq.heapify(self._deadlines)
        if not self._accepting and self._accept_paused_until and now >= self._accept_paused_until:
            self._accept_paused_until = 0.0
            self._listen(True)  # the accept loop pauses again if it still finds no room

    def _close(self, conn: Connection) -> None:
        self._unwatch(conn)
        self._forget_open(conn)
        close_socket(conn.sock)
        if not self._accepting and not self._stopping.is_set():
            self._accept_paused_until = 0.0  # a slot (and a descriptor) is free
            self._listen(True)

    def _close_everything(self) -> None:
        for conn in list(self._open):
            if conn.phase is not Phase.BUSY:
                self._close(conn)
        self._listen(False)
        for sock in self._listeners:
            sock.close()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def forget(self, conn: Connection) -> None:
        """A worker closed `conn` itself (after stop)."""
        self._forget_open(conn)

    def _forget_open(self, conn: Connection) -> None:
        if conn in self._open:
            self._open.discard(conn)
            host = client_host(conn.address)
            left = self._by_host.get(host, 1) - 1
            if left > 0:
                self._by_host[host] = left
            else:
                self._by_host.pop(host, None)


def client_host(address: Any) -> str:
    """The client's address without its port (IPv4 or IPv6 socket addresses)."""
    return str(address[0]) if isinstance(address, tuple) and address else str(address)


def close_socket(sock: socket.socket) -> None:
    with suppress(OSError):
        sock.shutdown(socket.SHUT_WR)  # flush what we wrote before the close, as TCPServer does
    with suppress(OSError):
        sock.close()
