"""The exporter's HTTP(S) server: landing page, telemetry path, health endpoints.

Why not prometheus-client's `start_http_server`: it wraps the *listening* socket in TLS, so every
handshake runs inside `accept()` on the one serving thread and a single TCP client that connects
and says nothing stalls all scrapes. Here one reactor thread (`connections.py`) holds every
connection that is not being answered, handshakes and reads request heads without blocking,
each under a whole-step deadline, and a bounded pool of worker threads answers complete
requests in arrival order. So a client that is slow, silent or malicious costs a descriptor and a
few kilobytes, never a thread, and the number of threads is fixed by the limits below.

Limits (flags in the CLI):
- `max_connections` (--web.max-connections): open connections; see `connections.py` for what
  happens at the cap.
- `max_requests` (--web.max-requests, as node_exporter): concurrent scrapes; one over the cap gets
  503 at once. The landing page and health checks are not capped, so a scrape storm does not
  make a liveness probe kill the exporter. Workers: `max_requests` plus a few spare for those.
- `request_timeout`: a request head must be complete this long after the connection (or its
  handshake) is ready, or after its first byte on a keep-alive connection.
- `write_timeout`: the whole response must be written within it (a client that does not read
  frees its worker).
Basic-auth checks that need bcrypt leave the worker and continue when `auth.py` has judged them.
A few keeper threads wait on authenticated keep-alive connections themselves (`_keep`).
"""

from __future__ import annotations

import gc
import html
import http.server
import io
import logging
import os
import select
import socket
import ssl
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, cast
from urllib.parse import unquote, urlsplit

from rnic_exporter.errors import ConfigError
from rnic_exporter.web import trace
from rnic_exporter.web.auth import Credential
from rnic_exporter.web.connections import EVICT_AFTER, MAX_HEAD, Connection, Reactor, close_socket
from rnic_exporter.web.listen import bind, format_host_port, parse_listen_address
from rnic_exporter.web.reload import Security, WebConfigWatcher
from rnic_exporter.web.steer import Priority, bind_steered
from rnic_exporter.web.webconfig import client_sans_allowed

__all__ = ["LandingPage", "MetricsProvider", "WebServer", "parse_listen_address", "render_landing_page"]

log = logging.getLogger(__name__)

HEALTH_PATHS = ("/-/healthy", "/-/ready")
AUTH_CHALLENGE = 'Basic realm="rnic-exporter"'
ALLOWED_METHODS = "GET, HEAD"
TEXT = "text/plain; charset=utf-8"
HTML = "text/html; charset=utf-8"

DEFAULT_MAX_CONNECTIONS = 512  # Prometheus' --web.max-connections default
DEFAULT_MAX_REQUESTS = 40  # node_exporter's --web.max-requests default
# Workers beyond the scrape cap, so health checks, the landing page and 401s are answered while
# every scrape slot is taken; and the pool when scrapes are not capped.
_SPARE_WORKERS = 4
_UNCAPPED_WORKERS = 64
_SWITCH_INTERVAL = 0.001
# Threads that wait on authenticated keep-alive connections themselves (see WebServer._keep).
_KEEPERS = 4

# glibc malloc arenas for the whole process (see _limit_malloc_arenas).
_MALLOC_ARENAS = 2
_M_ARENA_MAX = -8  # mallopt() parameter, malloc.h

# Descriptors beyond the connection cap for everything else (config files, sysfs reads, logs).
_SPARE_DESCRIPTORS = 64

# How long shutdown() waits for workers after forcing their sockets closed.
_SHUTDOWN_GRACE = 3.0


class MetricsProvider(Protocol):
    def render(self, accept_header: str | None, accept_encoding: str | None) -> tuple[bytes, dict[str, str]]:
        """The exposition body and its headers (Content-Type, maybe Content-Encoding).

        Called on a worker thread for every scrape, so it must be cheap and thread-safe.
        """
        ...


@dataclass(frozen=True)
class LandingPage:
    name: str
    description: str
    version: str
    links: tuple[tuple[str, str], ...] = ()  # (path, text)


def render_landing_page(landing: LandingPage, telemetry_path: str) -> bytes:
    """The small HTML page Prometheus' writing_exporters guide asks for at `/`."""
    links = ((telemetry_path, "Metrics"), *landing.links)
    items = "\n".join(
        f'<li><a href="{html.escape(path, quote=True)}">{html.escape(text)}</a></li>' for path, text in links
    )
    name = html.escape(landing.name)
    page = f"""<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>{name}</title></head>
<body>
<h1>{name}</h1>
<p>{html.escape(landing.description)}</p>
<p>Version: {html.escape(landing.version)}</p>
<ul>
{items}
</ul>
</body>
</html>
"""
    return page.encode("utf-8")


class _Workers:
    """At most `size` threads answering jobs in arrival order; started as they are needed."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._jobs: deque[Callable[[], None]] = deque()
        self._ready = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._stopping = False

    def submit(self, job: Callable[[], None]) -> None:
        with self._ready:
            self._jobs.append(job)
            if self._idle:
                self._ready.notify()
                return
            if len(self._threads) >= self.size:
                return  # it waits its turn, without a thread of its own
            thread = threading.Thread(target=self._work, name=f"rnic-web-{len(self._threads)}", daemon=True)
            self._threads.append(thread)
        try:
            thread.start()
        except RuntimeError as exc:  # "can't start new thread": the running ones will get to it
            log.warning("cannot start a web worker thread: %s", exc)
            with self._ready:
                self._threads.remove(thread)

    @property
    def threads(self) -> int:
        return len(self._threads)

    def _work(self) -> None:
        while True:
            with self._ready:
                while not self._jobs and not self._stopping:
                    self._idle += 1
                    self._ready.wait()
                    self._idle -= 1
                if self._stopping and not self._jobs:
                    return
                job = self._jobs.popleft()
            try:
                job()
            except Exception:
                log.exception("web worker job failed")

    def stop(self, timeout: float) -> bool:
        with self._ready:
            self._stopping = True
            self._ready.notify_all()
            threads = list(self._threads)
        deadline = time.monotonic() + timeout
        for thread in threads:
            if thread.ident is not None:  # one being started by submit() sees _stopping and ends
                thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in threads)


class WebServer:
    """Serves the landing page, the telemetry path and health checks on one or more addresses."""

    def __init__(
        self,
        listen_addresses: Sequence[str],
        telemetry_path: str,
        provider: MetricsProvider,
        landing: LandingPage,
        web_config_file: Path | None = None,
        health: Callable[[], tuple[bool, str]] | None = None,
        *,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_requests: int = DEFAULT_MAX_REQUESTS,
        request_timeout: float = 5.0,
        tls_handshake_timeout: float = 5.0,
        idle_timeout: float = 120.0,
        write_timeout: float = 10.0,
        reload_interval: float = 1.0,
        evict_after: float = EVICT_AFTER,
        priority_queue: bool = True,
    ) -> None:
        if not listen_addresses:
            raise ConfigError("no listen address given (example: ':9100')")
        for address in listen_addresses:
            parse_listen_address(address)  # syntax errors surface before anything else starts
        _check_telemetry_path(telemetry_path)
        if max_requests < 0:
            raise ConfigError(f"max requests must be 0 (no limit) or more, got {max_requests}")
        if max_connections < 1:
            raise ConfigError(f"max connections must be 1 or more, got {max_connections}")
        self._addresses = tuple(listen_addresses)
        self.telemetry_path = telemetry_path
        self._provider = provider
        self._landing_html = render_landing_page(landing, telemetry_path)
        self._health = health
        self._slots = threading.BoundedSemaphore(max_requests) if max_requests else None
        self.max_requests = max_requests
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self.tls_handshake_timeout = tls_handshake_timeout
        self.idle_timeout = idle_timeout
        self.write_timeout = write_timeout
        self.evict_after = evict_after
        self.priority_queue = priority_queue  # a second accept queue for proven scrapers (steer.py)
        self.watcher = WebConfigWatcher(web_config_file, reload_interval)
        self._workers = _Workers(max_requests + _SPARE_WORKERS if max_requests else _UNCAPPED_WORKERS)
        self._keepers = threading.BoundedSemaphore(_KEEPERS)
        self._keeping = threading.local()  # on a keeper thread: its connection, and whether to go on
        self._reactor: Reactor | None = None
        self._listeners: list[socket.socket] = []
        self._stopping = threading.Event()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Bind every address now (errors are ConfigErrors), then serve in daemon threads."""
        if self._reactor is not None:
            raise RuntimeError("WebServer.start() called twice")
        listeners: list[socket.socket] = []
        steered: list[socket.socket] = []  # the general listeners that have a priority one
        priority_listeners: list[socket.socket] = []
        try:
            for address in self._addresses:
                general, priority = bind_steered(address) if self.priority_queue else (bind(address), None)
                listeners.append(general)
                if priority is not None:
                    steered.append(general)
                    priority_listeners.append(priority)
        except ConfigError:
            for sock in listeners + priority_listeners:
                sock.close()
            raise
        self._listeners = listeners
        self._reactor = Reactor(
            listeners,
            self._on_request,
            tls=self._tls_context,
            tls_peer_ok=self._tls_peer_ok,
            max_connections=self.max_connections,
            handshake_timeout=self.tls_handshake_timeout,
            request_timeout=self.request_timeout,
            idle_timeout=self.idle_timeout,
            evict_after=self.evict_after,
            priority_listeners=priority_listeners,
            priority=Priority(steered) if steered else None,
            on_priority=self._take_priority,
        )
        bound = self.bound
        _warn_if_descriptors_short(self.max_connections)
        # A thread waiting for the GIL forces a switch after this long. The default 5 ms, paid
        # on each of a scrape's socket calls while the reactor is busy with a flood, dominates its
        # latency; 1 ms costs a CPU-bound thread a few more switches.
        sys.setswitchinterval(min(sys.getswitchinterval(), _SWITCH_INTERVAL))
        _freeze_long_lived_objects()
        _limit_malloc_arenas()
        trace.start_from_environment()
        self._reactor.start()
        scheme = "https" if self.tls_enabled else "http"
        for host, port in bound:
            log.info("listening on %s://%s%s", scheme, format_host_port(host, port), self.telemetry_path)

    def shutdown(self) -> None:
        """Stop accepting, close listeners and open connections, wait briefly for the workers."""
        if self._reactor is None or self._stopping.is_set():
            return
        self._stopping.set()
        self._reactor.stop(_SHUTDOWN_GRACE)
        trace.dump()
        for conn in self._reactor.busy():
            # The base-class shutdown acts on the descriptor even for an SSLSocket whose TLS
            # object a worker is using; it wakes that worker's blocking write.
            with suppress(OSError):
                socket.socket.shutdown(conn.sock, socket.SHUT_RDWR)
        if not self._workers.stop(_SHUTDOWN_GRACE):
            log.warning("web server shut down with requests still busy (e.g. a scrape still rendering)")

    def __enter__(self) -> WebServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.shutdown()

    @property
    def bound(self) -> list[tuple[str, int]]:
        """The actual (host, port) of each listener, e.g. to learn the port picked for port 0."""
        return [cast(tuple[str, int], sock.getsockname()[:2]) for sock in self._listeners]

    @property
    def tls_enabled(self) -> bool:
        return self.watcher.security.ssl_context is not None

    @property
    def config_reload_ok(self) -> bool:
        """False while the web config on disk failed to reload (the previous one is serving)."""
        return self.watcher.ok

    @property
    def threads(self) -> int:
        """Threads serving HTTP now: the reactor plus the workers started so far."""
        return self._workers.threads + (1 if self._reactor is not None else 0)

    @property
    def open_connections(self) -> int:
        return 0 if self._reactor is None else self._reactor.open_connections

    def reload_web_config(self) -> None:
        """Re-read the web config now; a broken or weakening file keeps the old config and logs why."""
        self.watcher.reload()

    # -- from the reactor --------------------------------------------------------------------

    def _tls_context(self) -> ssl.SSLContext | None:
        return self.watcher.current().ssl_context

    def _tls_peer_ok(self, tls: ssl.SSLSocket) -> bool:
        tls_config = self.watcher.security.config.tls_server_config
        allowed = () if tls_config is None else tls_config.client_allowed_sans
        if client_sans_allowed(tls.getpeercert(), allowed):
            return True
        log.debug("client certificate of %s has none of the allowed SANs %s", tls.getpeername(), list(allowed))
        return False

    def _on_request(self, conn: Connection, head: bytes) -> None:
        self._workers.submit(lambda: self._begin(conn, head))

    # -- on a worker -------------------------------------------------------------------------

    def _begin(self, conn: Connection, head: bytes) -> None:
        handler = _Handler(self, conn, head, self.watcher.current())
        if trace.TRACE is not None:
            handler.picked_at = time.monotonic()
        try:
            if not handler.parse():
                self._finish(handler, keep_alive=False)
                return
            verdict = handler.security.auth.decide(handler.headers.get("Authorization"))
        except Exception:
            log.debug("request from %s failed", conn.address, exc_info=True)
            self._finish(handler, keep_alive=False)
            return
        if isinstance(verdict, Credential):
            # bcrypt runs on its own thread, one check at a time; this worker moves on meanwhile.
            handler.security.auth.submit(verdict, lambda ok: self._workers.submit(lambda: self._respond(handler, ok)))
        else:
            self._respond(handler, verdict)

    def _respond(self, handler: _Handler, authorized: bool) -> None:
        keep_alive = False
        try:
            handler.respond(authorized)
            keep_alive = not handler.close_connection
        except Exception:  # the client hung up, stopped reading, or the provider broke
            log.debug("request from %s failed", handler.conn.address, exc_info=True)
        if authorized:
            handler.conn.proven = True
            if self._reactor is not None:
                self._reactor.proven(handler.conn)
        if trace.TRACE is not None:
            _record(handler, keep_alive)
        self._finish(handler, keep_alive)

    def _finish(self, handler: _Handler, keep_alive: bool) -> None:
        reactor = self._reactor
        assert reactor is not None
        conn = handler.conn
        if self._stopping.is_set():
            self._close(conn)
            return
        if keep_alive and conn.proven and getattr(self._keeping, "conn", None) is conn:
            self._keeping.again = True  # this keeper thread waits for the next request itself
            return
        if keep_alive and conn.proven and self._keepers.acquire(blocking=False):
            try:
                threading.Thread(target=self._keep, args=(conn,), name="rnic-web-keep", daemon=True).start()
                return
            except RuntimeError:  # "can't start new thread": the reactor takes it
                self._keepers.release()
        reactor.resume(conn, keep_alive)

    def _take_priority(self, conn: Connection) -> bool:
        """A connection from the priority queue (steer.py), just accepted: handshake and answer it on
        a keeper thread, if one is free, rather than through the reactor's rounds (each of which a
        flood makes long: its accepts, handshakes and reads)."""
        if not self._keepers.acquire(blocking=False):
            return False
        try:
            threading.Thread(target=self._keep, args=(conn, True), name="rnic-web-keep", daemon=True).start()
        except RuntimeError:  # "can't start new thread": the reactor takes it
            self._keepers.release()
            return False
        return True

    def _handshake_here(self, conn: Connection) -> bool:
        """A new connection's TLS handshake on this thread, under the handshake deadline for the whole step."""
        ctx = self._tls_context()
        if ctx is None:
            return True
        deadline = time.monotonic() + self.tls_handshake_timeout
        try:
            conn.sock.setblocking(False)
            tls = ctx.wrap_socket(conn.sock, server_side=True, do_handshake_on_connect=False)
            conn.sock = tls
            poll = select.poll()
            while True:
                try:
                    tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    poll.register(tls, select.POLLIN)
                except ssl.SSLWantWriteError:
                    poll.register(tls, select.POLLOUT)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not poll.poll(remaining * 1000):
                    log.debug("TLS handshake with %s: no complete handshake by the deadline", conn.address)
                    return False
        except (OSError, ValueError) as exc:
            log.debug("TLS handshake with %s failed: %s", conn.address, exc)
            return False
        conn.handshaken_at = time.monotonic()
        return self._tls_peer_ok(tls)

    def _keep(self, conn: Connection, fresh: bool = False) -> None:
        """Wait for a scraper's requests on this thread and answer them here, one after another.

        The reactor would do as well in a quiet room, but during a flood its rounds are full of
        handshakes and evictions, and a request it reads then waits for a worker to wake as well:
        two scheduler hand-offs. A few threads (_KEEPERS) for connections that passed
        authentication give the scrapers one hand-off, as a thread per connection does. With
        `fresh`, a connection just accepted from the priority queue: its handshake first, and its
        first request under the request deadline.
        """
        try:
            if fresh and not self._handshake_here(conn):
                self._close(conn)
                return
            wait = self.request_timeout if fresh else self.idle_timeout
            while True:
                try:
                    head = self._read_head(conn, wait)
                except (OSError, ValueError):
                    head = None
                wait = self.idle_timeout
                if head is None or self._stopping.is_set():
                    self._close(conn)
                    return
                self._keeping.conn, self._keeping.again = conn, False
                try:
                    self._begin(conn, head)
                finally:
                    self._keeping.conn = None
                if not self._keeping.again:  # closed, given to the reactor, or waiting for bcrypt
                    return
        finally:
            self._keepers.release()

    def _read_head(self, conn: Connection, wait: float) -> bytes | None:
        """The next request head (blocking), under `wait` and then the request deadline."""
        deadline = time.monotonic() + wait
        while (head := conn.take_head()) is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or len(conn.buffer) > MAX_HEAD:
                return None
            conn.sock.settimeout(remaining)
            chunk = conn.sock.recv(MAX_HEAD + 1)
            if not chunk:
                return None
            if not conn.buffer:  # the next request started: from now on it has the request deadline
                deadline = min(deadline, time.monotonic() + self.request_timeout)
            conn.buffer += chunk
        return head

    def _close(self, conn: Connection) -> None:
        """Close a connection a worker or keeper holds."""
        assert self._reactor is not None
        if self._stopping.is_set():  # the reactor has stopped or is stopping
            close_socket(conn.sock)
            self._reactor.forget(conn)
        else:  # the reactor closes it: it may be waiting for a free slot to accept again
            self._reactor.resume(conn, keep_alive=False)

    # -- responses ---------------------------------------------------------------------------

    def _route(self, path: str) -> str | None:
        if path == self.telemetry_path:
            return "telemetry"
        if path == "/":
            return "landing"
        if path in HEALTH_PATHS:
            return "health"
        return None

    @contextmanager
    def _scrape_slot(self) -> Iterator[bool]:
        """Whether this scrape may run; held until its response is written (slow readers count)."""
        if self._slots is None:
            yield True
            return
        acquired = self._slots.acquire(blocking=False)
        try:
            yield acquired
        finally:
            if acquired:
                self._slots.release()

    def _telemetry(self, accept: str | None, accept_encoding: str | None) -> tuple[int, bytes, dict[str, str]]:
        try:
            body, headers = self._provider.render(accept, accept_encoding)
        except Exception:
            log.exception("rendering metrics failed")
            return 500, b"rendering metrics failed; see the exporter's log\n", {"Content-Type": TEXT}
        # We frame the body ourselves; a second Content-Length would make clients reject it.
        own = {name: value for name, value in headers.items() if name.lower() != "content-length"}
        return 200, body, {**own, "Vary": "Accept, Accept-Encoding"}

    def _health_check(self) -> tuple[int, bytes, dict[str, str]]:
        if self._health is None:
            return 200, b"OK\n", {"Content-Type": TEXT}
        try:
            healthy, message = self._health()
        except Exception as exc:
            log.exception("health check raised")
            healthy, message = False, f"health check failed: {exc}"
        if healthy:
            return 200, b"OK\n", {"Content-Type": TEXT}
        return 503, f"{message}\n".encode(), {"Content-Type": TEXT}

    def _landing(self) -> tuple[int, bytes, dict[str, str]]:
        return 200, self._landing_html, {"Content-Type": HTML}


class _DeadlineWriter(io.BufferedIOBase):
    """The response stream: every byte must be written by one deadline for the whole response.

    The clock starts at the first write, not when the request was read: a request may wait for
    bcrypt for longer than the write timeout.
    """

    def __init__(self, sock: socket.socket, timeout: float) -> None:
        self._sock = sock
        self._timeout = timeout
        self._deadline: float | None = None

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if self._deadline is None:
            self._deadline = time.monotonic() + self._timeout
        while view:
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the client did not read the response in time")
            self._sock.settimeout(remaining)
            sent = self._sock.send(view)
            view = view[sent:]
        return len(data)


class _Handler(http.server.BaseHTTPRequestHandler):
    """One request, parsed from the head the reactor read; answered by `respond`.

    Built per request rather than per connection (the base class loops over a connection's
    requests itself); only its parsing and response writing are used.
    """

    protocol_version = "HTTP/1.1"  # keep-alive, so Prometheus reuses its connection
    server_version = "rnic-exporter"
    _date: tuple[int, str] = (0, "")

    def __init__(self, front: WebServer, conn: Connection, head: bytes, security: Security) -> None:
        # No super().__init__(): it would read and answer the whole connection on its own.
        self.front = front
        self.conn = conn
        self.security = security
        self.client_address = conn.address
        self.request = conn.sock
        self.rfile = io.BytesIO(head)
        self.wfile = _DeadlineWriter(conn.sock, front.write_timeout)
        self.close_connection = True
        self.command = ""
        self.request_version = self.default_request_version
        self.requestline = ""
        self._body = b""  # sent with the head by flush_headers
        self.picked_at = 0.0  # when a worker took it (timing trace only)

    def parse(self) -> bool:
        """Parse the head; False when it was answered with an error (or was empty)."""
        self.raw_requestline = self.rfile.readline(65537)
        if len(self.raw_requestline) > 65536:
            self.send_error(414)
            return False
        if not self.raw_requestline or not self.parse_request():
            return False
        if self.headers.get("Content-Length", "0") != "0" or "Transfer-Encoding" in self.headers:
            # We never read request bodies; an unread one would be parsed as the next request.
            self.close_connection = True
        return True

    def respond(self, authorized: bool) -> None:
        front = self.front
        send_body = self.command != "HEAD"
        if not authorized:
            self._send(401, b"Unauthorized\n", {"Content-Type": TEXT, "WWW-Authenticate": AUTH_CHALLENGE}, send_body)
            return
        route = front._route(unquote(urlsplit(self.path).path))
        if route is None:
            self._send(404, b"Not Found\n", {"Content-Type": TEXT}, send_body)
        elif self.command not in ("GET", "HEAD"):
            self.close_connection = True
            self._send(405, b"Method Not Allowed\n", {"Content-Type": TEXT, "Allow": ALLOWED_METHODS}, send_body)
        elif route == "telemetry":
            self._scrape(send_body)
        elif route == "health":
            self._send(*front._health_check(), send_body)
        else:
            self._send(*front._landing(), send_body)

    def version_string(self) -> str:
        return self.server_version  # no Python version in the Server header

    def log_message(self, format: str, *args: Any) -> None:
        if log.isEnabledFor(logging.DEBUG):  # called for every request: format nobody reads costs
            log.debug("%s %s", self.address_string(), format % args)

    def address_string(self) -> str:
        return str(self.client_address[0]) if self.client_address else "-"

    def date_time_string(self, timestamp: float | None = None) -> str:
        """The Date header, formatted once a second rather than for every response."""
        if timestamp is not None:
            return super().date_time_string(timestamp)
        now = int(time.time())
        second, text = _Handler._date
        if second != now:
            text = super().date_time_string(now)
            _Handler._date = (now, text)  # one tuple, swapped whole: safe across threads
        return text

    def end_headers(self) -> None:
        # Every response, error pages from the base class included, carries the configured headers.
        for name, value in self.security.config.http_server_config.headers.items():
            self.send_header(name, value)
        super().end_headers()

    def _scrape(self, send_body: bool) -> None:
        front = self.front
        with front._scrape_slot() as allowed:
            if not allowed:
                body = f"too many concurrent scrapes (limit {front.max_requests})\n".encode()
                self._send(503, body, {"Content-Type": TEXT}, send_body)
                return
            response = front._telemetry(self.headers.get("Accept"), self.headers.get("Accept-Encoding"))
            self._send(*response, send_body)

    def _send(self, status: int, body: bytes, headers: Mapping[str, str], send_body: bool) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self._body = body if send_body else b""
        self.end_headers()

    def flush_headers(self) -> None:
        # Head and body in one write: each socket call gives up the GIL, and getting it back can
        # take a switch interval while the reactor is busy with a flood.
        if hasattr(self, "_headers_buffer") and self._body:
            self._headers_buffer.append(self._body)
            self._body = b""
        super().flush_headers()


def _record(handler: _Handler, keep_alive: bool) -> None:
    """A traced request's timeline (web/trace.py); the client names it with the X-Trace header."""
    headers = getattr(handler, "headers", None)
    trace_id = headers.get(trace.HEADER) if headers is not None else None
    if trace_id is None or trace.TRACE is None:
        return
    conn = handler.conn
    times = {
        "accepted": conn.accepted_at,
        "admitted": conn.admitted_at,
        "handshaken": conn.handshaken_at,
        "head": conn.head_at,
        "picked": handler.picked_at,
        "written": time.monotonic(),
    }
    times["keeper"] = float(getattr(handler.front._keeping, "conn", None) is conn)
    times["priority"] = float(conn.priority)
    trace.TRACE.request(trace_id, times)


_frozen = threading.Lock()


def _freeze_long_lived_objects() -> None:
    """Once per process: take what exists now out of the garbage collector's full walks.

    A full collection holds the GIL while it walks every tracked object, and a flood of
    connections triggers collections (a 63 ms pause under bench/abuse.py); what exists at start-up
    (modules, classes, config) lives as long as the process. Collected first, so no garbage is
    frozen with it; and once more after, over the now empty oldest generation: CPython runs a full
    collection only once a quarter as many objects as the last full one found have been promoted
    since, and the last one had found everything now frozen, so reference cycles that outlived
    the young generations went uncollected for an hour or more (the soak's RSS rose ~3 MB an hour).
    """
    if _frozen.acquire(blocking=False):
        gc.collect()
        gc.freeze()
        gc.collect()


def _limit_malloc_arenas() -> None:
    """Cap glibc's malloc arenas for the process (unless the operator set MALLOC_ARENA_MAX).

    glibc gives a thread that finds no free arena an arena of its own (up to 8 per core), and
    memory freed in an arena stays there. After one burst of 40 concurrent scrapes each web
    worker's arena kept about 0.8 MB of the bodies it had built and sent (+7 MB resident,
    bench/bench.py's 50 clients); and every read worker written off behind a hung read is
    replaced by a thread that found the old one's arena still taken, so a soak with hung reads
    grew by an arena every few hung reads (46 -> 60 MB in an hour, with flat Python objects).
    CPython allocates with the GIL held, so threads rarely contend for an arena; two cost no
    measurable time. Set here because serving always starts the web front; the cap holds for
    threads started before it too (they share the arenas that exist).
    """
    if os.environ.get("MALLOC_ARENA_MAX"):
        return
    try:
        os.confstr("CS_GNU_LIBC_VERSION")  # glibc only (musl has no arenas to cap)
        import ctypes

        ctypes.CDLL(None).mallopt(_M_ARENA_MAX, _MALLOC_ARENAS)
    except (ValueError, OSError, AttributeError):
        log.debug("cannot cap malloc arenas on this C library")


def _warn_if_descriptors_short(max_connections: int) -> None:
    """Say once at start-up when the descriptor limit cannot hold the connection cap.

    Past the limit accept() fails with EMFILE; the reactor then closes a waiting connection for
    room or pauses, so it keeps working, but the operator should know the cap is not the limit.
    """
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0
    if soft != resource.RLIM_INFINITY and soft < in_use + max_connections + _SPARE_DESCRIPTORS:
        log.warning(
            "descriptor limit %d is below the %d already open plus --web.max-connections %d; "
            "raise it (systemd LimitNOFILE=, ulimit -n) or lower the cap",
            soft,
            in_use,
            max_connections,
        )


def _check_telemetry_path(path: str) -> None:
    if not path.startswith("/") or "?" in path or "#" in path:
        raise ConfigError(f"telemetry path {path!r} must be a plain path starting with '/', e.g. '/metrics'")
    if path in HEALTH_PATHS:
        raise ConfigError(f"telemetry path {path!r} is taken by the health endpoint")
    if path == "/":
        raise ConfigError("telemetry path '/' is taken by the landing page; use e.g. '/metrics'")
