"""The exporter's HTTP(S) server: landing page, telemetry path, health endpoints.

Not prometheus-client's `start_http_server`: it wraps the *listening* socket in TLS, so one TCP
client that connects and says nothing stalls every scrape. Here one reactor thread
(`connections.py`) holds every connection that is not being answered, and a bounded pool of
worker threads answers complete requests in arrival order: a slow, silent or malicious client
costs a descriptor and a few kilobytes, never a thread. Limits: `max_connections` (see
`connections.py`); `max_requests` concurrent scrapes, one more gets 503 at once (the landing page
and health checks are not capped, so a scrape storm does not get the exporter killed by its
liveness probe); a request head must be complete `request_timeout` after the connection is ready
(or its next request's first byte); a response must be written within `write_timeout`. bcrypt
checks leave the worker and continue when `auth.py` has judged them. The health endpoints need no
basic auth: probes cannot send credentials without writing them into the manifest.
"""

from __future__ import annotations

import html
import http.server
import io
import logging
import os
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, cast
from urllib.parse import unquote, urlsplit

from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.errors import ConfigError, NotReadyError
from rnic_exporter.sinks.samples import Family
from rnic_exporter.web.auth import Credential
from rnic_exporter.web.connections import EVICT_AFTER, Connection, Reactor, client_host, close_socket
from rnic_exporter.web.listen import bind, format_host_port, parse_listen_address
from rnic_exporter.web.reload import Security, WebConfigWatcher
from rnic_exporter.web.tls import client_sans_allowed

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
        self.watcher = WebConfigWatcher(web_config_file, reload_interval)
        self._workers = _Workers(max_requests + _SPARE_WORKERS if max_requests else _UNCAPPED_WORKERS)
        self._codes: dict[int, int] = {}  # responses by status code
        self._limited = 0  # scrapes answered 503 at --web.max-requests
        self._counting = threading.Lock()
        self._reactor: Reactor | None = None
        self._listeners: list[socket.socket] = []
        self._stopping = threading.Event()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Bind every address now (errors are ConfigErrors), then serve in daemon threads."""
        if self._reactor is not None:
            raise RuntimeError("WebServer.start() called twice")
        listeners: list[socket.socket] = []
        try:
            for address in self._addresses:
                listeners.append(bind(address))
        except ConfigError:
            for sock in listeners:
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
        )
        bound = self.bound
        _warn_if_descriptors_short(self.max_connections)
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
        self.watcher.current().auth.cancel()  # a flood's queued guesses are not checked after the end
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

    def families(self) -> list[Family]:
        """rnic_exporter_http_* for /metrics: responses by code, scrapes over the cap, connections closed for room."""
        with self._counting:
            codes = sorted(self._codes.items())
            limited = self._limited
        reactor = self._reactor
        requests = Family(catalog.HTTP_REQUESTS, [((str(code),), float(n)) for code, n in codes])
        if reactor is not None and reactor.too_large:
            requests.samples.append((("431",), float(reactor.too_large)))
            requests.samples.sort(key=lambda sample: int(sample[0][0]))
        closed = Family(catalog.HTTP_CONNECTIONS_CLOSED_FOR_ROOM)
        if reactor is not None:
            closed.samples += [(("waiting",), float(reactor.evicted)), (("accept",), float(reactor.refused))]
        return [requests, Family(catalog.HTTP_REQUESTS_LIMITED, [((), float(limited))]), closed]

    def _count(self, code: int, limited: bool = False) -> None:
        with self._counting:
            self._codes[code] = self._codes.get(code, 0) + 1
            self._limited += limited

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
        try:
            if not handler.parse():
                self._finish(handler, keep_alive=False)
                return
            if self._route(handler.route_path()) == "health":
                verdict: bool | Credential = True  # probes cannot send credentials (module docstring)
            else:
                verdict = handler.security.auth.decide(handler.headers.get("Authorization"))
        except Exception:
            log.debug("request from %s failed", conn.address, exc_info=True)
            self._finish(handler, keep_alive=False)
            return
        if isinstance(verdict, Credential):
            # bcrypt runs on its own thread, one check at a time; this worker moves on meanwhile.
            handler.security.auth.submit(
                verdict, lambda ok: self._workers.submit(lambda: self._respond(handler, ok)), client_host(conn.address)
            )
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
        self._finish(handler, keep_alive)

    def _finish(self, handler: _Handler, keep_alive: bool) -> None:
        conn = handler.conn
        if self._stopping.is_set():
            self._close(conn)
            return
        assert self._reactor is not None
        self._reactor.resume(conn, keep_alive)

    def _close(self, conn: Connection) -> None:
        """Close a connection a worker holds."""
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

    def _telemetry(self, accept: str | None, accept_encoding: str | None) -> tuple[int, bytes, dict[str, str]]:
        try:
            body, headers = self._provider.render(accept, accept_encoding)
        except NotReadyError as exc:
            return 503, f"{exc}\n".encode(), {"Content-Type": TEXT, "Retry-After": "1"}
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
    _limited = False  # answered 503 at --web.max-requests

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
        route = front._route(self.route_path())
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

    def route_path(self) -> str:
        return unquote(urlsplit(self.path).path)

    def send_response(self, code: int, message: str | None = None) -> None:
        self.front._count(code, limited=self._limited)
        super().send_response(code, message)

    def version_string(self) -> str:
        return self.server_version  # no Python version in the Server header

    def log_message(self, format: str, *args: Any) -> None:
        if log.isEnabledFor(logging.DEBUG):  # called for every request: format nobody reads costs
            log.debug("%s %s", self.address_string(), format % args)

    def address_string(self) -> str:
        return str(self.client_address[0]) if self.client_address else "-"

    def end_headers(self) -> None:
        # Every response, error pages from the base class included, carries the configured headers.
        for name, value in self.security.config.http_server_config.headers.items():
            self.send_header(name, value)
        super().end_headers()

    def _scrape(self, send_body: bool) -> None:
        """A scrape slot is held until the response is written (slow readers count)."""
        front, slots = self.front, self.front._slots
        if slots is not None and not slots.acquire(blocking=False):
            self._limited = True
            body = f"too many concurrent scrapes (limit {front.max_requests})\n".encode()
            self._send(503, body, {"Content-Type": TEXT}, send_body)
            return
        try:
            self._send(*front._telemetry(self.headers.get("Accept"), self.headers.get("Accept-Encoding")), send_body)
        finally:
            if slots is not None:
                slots.release()

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
