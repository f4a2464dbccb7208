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
EVICT_AFTER; when there is none to close, accepting pauses and new clients wait in the kernel's
listen backlog, with no descriptor and no memory of ours.

At the cap, clients from more than one address share it: the address that holds the most
connections (the hog) gets no new one (it is closed as soon as accepted, before any TLS work, so
the listen backlog drains at the speed of a close), and a client from an address holding less
than half as many takes the place of the hog's longest-waiting unanswered connection, however
young. So a scraper on its own address (Prometheus opening a new connection after an error or a
restart) is not queued behind a flood from another host. Any other newcomer takes an old
connection's place as above, or waits in a small lobby (accepted, nothing read) for a free place,
first come first served; beyond that it is closed at accept too when clients from several
addresses share the cap (pausing the accepts instead would leave a light address's newcomer in the
kernel's backlog, which is first come first served, behind the whole flood: seconds under
bench/abuse.py), and waits in the backlog when they all come from one. A flood from the
scraper's own address cannot be told from it: one address, no sharing. Of the TLS handshakes
ready in a round, those of the least served addresses go first.

Where the kernel allows it, each listen address has a second, priority accept queue for
addresses that proved themselves real scrapers (steer.py): it is drained first every round, it
is not paused at the cap, and its connections take a flood's place at once and are never the
ones closed for room; `on_priority` (the server) handshakes and answers them on a thread of
their own when one is free, so their steps do not wait for rounds a flood makes long.
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

from rnic_exporter.web import trace
from rnic_exporter.web.steer import Priority

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
# Connections from the hog closed at accept per round: a close costs ~20 us, no TLS, and the
# attackers reconnect as fast as they are closed (64 a round did not keep the backlog short).
_REFUSALS_PER_ROUND = 1024
# But closing them stops this far into a round (checked every 16), so that the priority queue and
# the connections of the round's first steps are looked at again soon: a round of 900 refusals
# took 30-60 ms under bench/abuse.py, and a proven scraper's connection waited for it at each step.
_REFUSING_FOR = 0.002
# At the cap, accepted connections that found no place wait here (no TLS, no reads), so that the
# next one in the backlog can be looked at: from another address, it may take the hog's place.
_LOBBY = 32
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

    __slots__ = (
        "_want",
        "accepted_at",
        "address",
        "admitted_at",
        "buffer",
        "deadline",
        "handshaken_at",
        "head_at",
        "phase",
        "priority",
        "proven",
        "requests",
        "since",
        "sock",
    )

    def __init__(self, sock: socket.socket, address: Any) -> None:
        self.sock = sock
        self.address = address
        self.buffer = bytearray()
        self.phase = Phase.WAITING
        self.deadline = 0.0
        self.proven = False  # a request on it passed authentication: a real scraper, evicted last
        self.priority = False  # from the priority queue (steer.py): never closed for room
        self.requests = 0
        self.since = 0.0  # when it started waiting
        self._want = 0  # the events the reactor's selector watches for; 0: not registered
        # When it was accepted, left the lobby, finished its handshake, and completed its latest request head
        # (time.monotonic(); for the timing trace, web/trace.py).
        self.accepted_at = self.admitted_at = self.handshaken_at = self.head_at = 0.0

    def take_head(self) -> bytes | None:
        """The next complete request head from the buffer (removing it), or None."""
        match = _HEAD_END.search(self.buffer)
        if match is None:
            return None
        head = bytes(self.buffer[: match.end()])
        del self.buffer[: match.end()]
        self.head_at = time.monotonic()
        return head


class Reactor:
    """Accepts on `listeners` and hands complete request heads to `on_request` (on this thread).

    `tls()` gives the TLS context for a new connection (None: plain HTTP), `tls_peer_ok` judges
    a finished handshake (the client certificate's SANs). `priority_listeners` are the priority
    queues `priority` steers proven addresses to (steer.py); `on_priority` may take a connection
    from them BUSY, straight after accept (True), to handshake and answer it off this thread.
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
        priority_listeners: Sequence[socket.socket] = (),
        priority: Priority | None = None,
        on_priority: Callable[[Connection], bool] | None = None,
    ) -> None:
        self._listeners = list(listeners)
        self._priority_listeners = list(priority_listeners)
        self.priority = priority
        self._on_priority = on_priority
        self._proofs: deque[str] = deque()  # addresses with a request that passed authentication, from workers
        self._hog_now: str | None = None  # the hog of the latest round at the cap
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
        self._kept: OrderedDict[Connection, None] = OrderedDict()  # waiting priority ones: never evicted
        self._deadlines: list[tuple[float, int, Connection]] = []
        self._by_host: dict[str, int] = {}  # open connections per client address
        self.refused = 0  # connections closed at accept, at the cap, because their address held the most
        self.prioritized = 0  # connections admitted from a priority queue (steer.py)
        # And when it was accepted, and whether it came from the priority queue (those go first).
        self._lobby: deque[tuple[socket.socket, Any, float, bool]] = deque()
        self._seq = itertools.count()
        self._refuse_until = 0.0  # this round closes no more at accept after this (time.monotonic())
        self._accepting = False
        self._registered: set[socket.socket] = set()  # listeners the selector watches
        self._accept_paused_until = 0.0
        self._thread: threading.Thread | None = None

    # -- control (any thread) ---------------------------------------------------------------

    def start(self) -> None:
        for sock in self._listeners + self._priority_listeners:
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

    def proven(self, conn: Connection) -> None:
        """A request on `conn` passed authentication (any thread): its address may be steered."""
        if self.priority is not None:
            host = _host(conn.address)
            self._proofs.append(host)
            if host not in self.priority.steered:  # a change for the program: do not wait for the next event
                self._wake()

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
                reads = 0
                ready = self._selector.select(self._timeout())
                started = time.monotonic()
                self._refuse_until = started + _REFUSING_FOR
                for key, _ in ready:
                    target = key.data
                    if target is None:
                        self._drain_wake()
                    elif not isinstance(target, Connection):
                        listeners.append(cast(socket.socket, key.fileobj))
                    elif target.phase is Phase.HANDSHAKE:
                        handshakes.append(target)
                    elif target.phase is Phase.WAITING:
                        reads += 1
                        self._guarded(self._read, target)
                self._take_resumed()
                self._admit_from_lobby()
                if len(handshakes) > _HANDSHAKES_PER_ROUND:
                    # The least served addresses first: a scraper's handshake is not queued behind a
                    # flood's (the rest stay ready and come next round).
                    handshakes.sort(key=lambda c: (not c.priority, self._by_host.get(_host(c.address), 0)))
                for conn in handshakes[:_HANDSHAKES_PER_ROUND]:
                    if conn.phase is Phase.HANDSHAKE and conn in self._open:
                        self._guarded(self._handshake, conn)
                if len(listeners) > 1:
                    listeners.sort(key=lambda sock: sock not in self._priority_listeners)  # priority first
                accepts = sum(self._accept(sock, sock in self._priority_listeners) for sock in listeners)
                self._expire()
                if self.priority is not None:
                    self._steer()
                if trace.TRACE is not None:
                    trace.TRACE.round(started, reads, min(len(handshakes), _HANDSHAKES_PER_ROUND), accepts)
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
        now = time.monotonic()
        wakeups = []
        if self._deadlines:
            wakeups.append(self._deadlines[0][0])
        if not self._accepting and self._accept_paused_until:
            wakeups.append(self._accept_paused_until)
        if self.priority is not None and (steer_at := self.priority.wake_at()) is not None:
            wakeups.append(steer_at)
        waiting = self._unproven or self._proven
        if self._lobby and waiting:  # the lobby moves on when the oldest waiting one may be closed
            wakeups.append(next(iter(waiting)).since + self.evict_after)
        return max(0.0, min(wakeups) - now) if wakeups else None

    def _drain_wake(self) -> None:
        with suppress(OSError):
            while self._wake_r.recv(4096):
                pass

    def _listen(self, on: bool, *, everything: bool = False) -> None:
        """Accept on every listener, or pause the general ones (with `everything`, all of them).

        The priority listeners are not paused at the cap: their connections take a flood's place.
        """
        wanted = self._listeners + self._priority_listeners if on else [] if everything else self._priority_listeners
        for sock in self._listeners + self._priority_listeners:
            if sock in wanted and sock not in self._registered:
                self._selector.register(sock, selectors.EVENT_READ, sock)
                self._registered.add(sock)
            elif sock not in wanted and sock in self._registered:
                self._selector.unregister(sock)
                self._registered.discard(sock)
        self._accepting = on

    # -- accepting -----------------------------------------------------------------------------

    def _accept(self, listener: socket.socket, priority: bool = False) -> int:
        """Accept what this round may from `listener`; how many were accepted (refused ones too)."""
        admitted = refused = lobbied = 0
        hog: str | None = None
        for _ in range(_ACCEPTS_PER_ROUND + _REFUSALS_PER_ROUND):
            if admitted >= _ACCEPTS_PER_ROUND or refused >= _REFUSALS_PER_ROUND:
                break
            at_cap = len(self._open) >= self.max_connections
            if at_cap and hog is None:
                hog = self._hog_now = self._hog()  # once per round: it changes by a connection or two
            victim = self._victim() if at_cap else None
            shared = len(self._by_host) > 1
            if at_cap and victim is None and len(self._lobby) >= _LOBBY and not shared and not priority:
                self._pause_at_cap()  # one address: nobody to tell apart, let the backlog hold the rest
                break
            try:
                sock, address = listener.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                spare = self._victim()
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM) and spare is not None:
                    self._evict(spare)
                    continue  # a descriptor was freed
                log.warning("accept on %s failed: %s", listener.getsockname(), exc)
                # The listener stays readable; pause instead of spinning a core.
                self._listen(False, everything=True)
                self._accept_paused_until = time.monotonic() + _EMFILE_PAUSE
                break
            host = _host(address)
            # The kernel's program lags the reactor's view by up to a second: judged again here.
            favoured = priority and self._favoured(host)
            if at_cap and favoured:
                victim = self._victim(hog) or victim  # the flood's place, however young
                if victim is None:
                    if len(self._lobby) >= 2 * _LOBBY:  # bounded for everyone
                        close_socket(sock)
                        self.refused += 1
                        refused += 1
                        continue
                    self._lobby.appendleft((sock, address, time.monotonic(), True))  # ahead of the flood's
                    lobbied += 1
                    continue
            elif at_cap and hog is not None:
                held, most = self._by_host.get(host, 0), self._by_host.get(hog, 0)
                # The hog, and an address holding about as many when the lobby is full, are closed
                # at once rather than paused for: a paused accept leaves a light address's newcomer
                # in the kernel's backlog behind all of them (seconds, under bench/abuse.py).
                lobby_full = victim is None and len(self._lobby) >= _LOBBY
                if shared and (host == hog or (held >= most // 2 and lobby_full)):
                    self._refuse(sock, host)  # before any TLS work: the backlog drains at close speed
                    refused += 1
                    if refused % 16 == 0 and time.monotonic() > self._refuse_until:
                        break  # the rest next round, after the priority queue and the ready connections
                    continue
                if host != hog and held < most // 2:
                    # A clearly less served address takes the hog's place at once.
                    victim = self._victim(hog) or victim
                if victim is None and len(self._lobby) >= 2 * _LOBBY:  # light ones too: the lobby is bounded
                    self._refuse(sock, host)
                    refused += 1
                    continue
                if victim is None:
                    self._lobby.append((sock, address, time.monotonic(), False))  # waits as in the backlog
                    lobbied += 1
                    continue
            if victim is not None:
                self._evict(victim)
            self._admit(sock, address, 0.0, favoured)
            admitted += 1
        return admitted + refused + lobbied

    def _refuse(self, sock: socket.socket, host: str) -> None:
        close_socket(sock)
        self.refused += 1
        if self.priority is not None:
            self.priority.refused(host, time.monotonic())

    def _favoured(self, host: str) -> bool:
        assert self.priority is not None
        return self.priority.eligible(host, self._by_host.get(host, 0), time.monotonic())

    def _steer(self) -> None:
        """Take the workers' proofs and update the kernel's program when due (steer.py)."""
        assert self.priority is not None
        now = time.monotonic()
        while self._proofs:
            self.priority.proven(self._proofs.popleft(), now)
        self.priority.refresh(self._by_host, now)

    def _admit_from_lobby(self) -> None:
        while self._lobby:
            if len(self._open) >= self.max_connections:
                victim = self._victim(self._hog_now) if self._lobby[0][3] and self._hog_now else None
                victim = victim or self._victim()
                if victim is None:
                    return
                self._evict(victim)
            self._admit(*self._lobby.popleft())

    def _admit(self, sock: socket.socket, address: Any, accepted_at: float = 0.0, priority: bool = False) -> None:
        sock.setblocking(False)
        # Headers and body go out in two writes; with Nagle on, a small body then waits for the
        # client's delayed ACK (40 ms on Linux) on every keep-alive scrape.
        with suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = Connection(sock, address)
        conn.priority = priority
        self.prioritized += priority
        conn.admitted_at = time.monotonic()
        conn.accepted_at = accepted_at or conn.admitted_at
        self._open.add(conn)
        host = _host(address)
        self._by_host[host] = self._by_host.get(host, 0) + 1
        if priority and self._on_priority is not None:
            conn.phase = Phase.BUSY
            if self._on_priority(conn):
                return  # a proven scraper's connection: its next steps do not wait for this loop's rounds
            conn.phase = Phase.WAITING
        self._guarded(self._start, conn)

    def _start(self, conn: Connection) -> None:
        sock, address = conn.sock, conn.address
        now = time.monotonic()
        ctx = self._tls()
        if ctx is not None:
            try:
                conn.sock = ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            except (OSError, ValueError) as exc:
                log.debug("TLS setup for %s failed: %s", address, exc)
                self._close(conn)
                return
            conn.phase = Phase.HANDSHAKE
            self._wait(conn, now + self.handshake_timeout)  # its ClientHello is read next round
        else:
            self._wait(conn, now + self.request_timeout)

    def _hog(self) -> str | None:
        """At the cap, the address holding the most connections."""
        if not self._by_host:
            return None
        return max(self._by_host.items(), key=lambda item: item[1])[0]

    def _victim(self, hog: str | None = None) -> Connection | None:
        """The waiting connection that matters least, if it has waited long enough to be closed.

        With `hog`: that address's longest-waiting unanswered connection, whatever its age.
        """
        if hog is not None:
            return next((conn for conn in self._unproven if _host(conn.address) == hog), None)
        # A proven connection (a scraper between scrapes) goes only when no unproven one waits,
        # however young: its client would reconnect through the backlog, behind the flood.
        waiting = self._unproven or self._proven
        if not waiting:
            return None
        conn = next(iter(waiting))
        return conn if conn.since <= time.monotonic() - self.evict_after else None

    def _evict(self, conn: Connection) -> None:
        log.debug("connection cap %d reached: closing %s, waiting since longest", self.max_connections, conn.address)
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
        queue = self._kept if conn.priority else self._proven if conn.proven else self._unproven
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
        self._kept.pop(conn, None)
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
        conn.handshaken_at = time.monotonic()
        self._wait(conn, conn.handshaken_at + self.request_timeout)
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
        # Closed connections leave their entries behind; rebuild before they outgrow the live ones.
        if len(self._deadlines) > 4 * len(self._open) + 1024:
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
        while self._lobby:
            close_socket(self._lobby.popleft()[0])
        for conn in list(self._open):
            if conn.phase is not Phase.BUSY:
                self._close(conn)
        self._listen(False, everything=True)
        for sock in self._listeners + self._priority_listeners:
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
            host = _host(conn.address)
            left = self._by_host.get(host, 1) - 1
            if left > 0:
                self._by_host[host] = left
            else:
                self._by_host.pop(host, None)


def _host(address: Any) -> str:
    """The client's address without its port (IPv4 or IPv6 socket addresses)."""
    return str(address[0]) if isinstance(address, tuple) and address else str(address)


def close_socket(sock: socket.socket) -> None:
    with suppress(OSError):
        sock.shutdown(socket.SHUT_WR)  # flush what we wrote before the close, as TCPServer does
    with suppress(OSError):
        sock.close()
