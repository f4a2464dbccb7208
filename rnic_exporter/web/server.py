"""The exporter's HTTP(S) server: landing page, telemetry path, health endpoints.

Why not prometheus-client's `start_http_server`: it wraps the *listening* socket in TLS, so every
handshake runs inside `accept()` on the one serving thread and a single TCP client that connects
and says nothing stalls all scrapes (verified; see ecosystem-notes 1.3). Here the accept loop only
accepts; each connection gets its own daemon thread, which does the TLS handshake under a timeout
and then reads the request under another, so a silent or slow client only ever holds its own
thread.
"""

from __future__ import annotations

import errno
import hashlib
import html
import http.server
import logging
import os
import re
import selectors
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, cast
from urllib.parse import unquote, urlsplit

from rnic_exporter.errors import ConfigError
from rnic_exporter.web.webconfig import BasicAuth, WebConfig, build_ssl_context, client_sans_allowed, load_web_config

log = logging.getLogger(__name__)

HEALTH_PATHS = ("/-/healthy", "/-/ready")
AUTH_CHALLENGE = 'Basic realm="rnic-exporter"'
ALLOWED_METHODS = "GET, HEAD"
TEXT = "text/plain; charset=utf-8"
HTML = "text/html; charset=utf-8"

# How long shutdown() waits for connection threads after forcing their sockets closed.
_SHUTDOWN_GRACE = 3.0

_PORT = re.compile(r"[0-9]{1,5}")


class MetricsProvider(Protocol):
    def render(self, accept_header: str | None, accept_encoding: str | None) -> tuple[bytes, dict[str, str]]:
        """The exposition body and its headers (Content-Type, maybe Content-Encoding).

        Called on the connection's thread for every scrape, so it must be cheap and thread-safe.
        """
        ...


@dataclass(frozen=True)
class LandingPage:
    name: str
    description: str
    version: str
    links: tuple[tuple[str, str], ...] = ()  # (path, text)


def parse_listen_address(address: str) -> tuple[str, int]:
    """(host, port) from node_exporter's syntax: `:9100`, `0.0.0.0:9100`, `[::1]:9100`, `host:port`.

    An empty host means all interfaces.
    """
    host, colon, port_text = address.rpartition(":")
    if not colon:
        raise ConfigError(f"listen address {address!r}: missing ':<port>' (examples: ':9100', '[::1]:9100')")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ConfigError(f"listen address {address!r}: put an IPv6 address in brackets, e.g. '[::1]:9100'")
    if not _PORT.fullmatch(port_text) or int(port_text) > 65535:
        raise ConfigError(f"listen address {address!r}: port {port_text!r} is not a number from 0 to 65535")
    return host, int(port_text)


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


@dataclass(frozen=True)
class _Security:
    """One loaded web config with what is derived from it; swapped whole on reload."""

    config: WebConfig
    ssl_context: ssl.SSLContext | None
    auth: BasicAuth

    @classmethod
    def load(cls, path: Path | None) -> _Security:
        config = WebConfig() if path is None else load_web_config(path)
        return cls(config, build_ssl_context(config), BasicAuth(config.basic_auth_users))


def _fingerprint_files(paths: Sequence[Path]) -> dict[Path, bytes | None]:
    """A digest of each file's content (None: unreadable), to tell whether a reload is due.

    Content rather than mtime: an in-place rewrite within one clock tick keeps mtime and size,
    and these files are a few kilobytes read at most once per reload interval.
    """
    digests: dict[Path, bytes | None] = {}
    for path in paths:
        try:
            digests[path] = hashlib.sha256(path.read_bytes()).digest()
        except OSError:
            digests[path] = None
    return digests


class _Connections:
    """The sockets of open connections, so shutdown can cut idle keep-alives short."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._open: set[socket.socket] = set()

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.add(sock)

    def replace(self, old: socket.socket, new: socket.socket) -> None:
        with self._lock:
            self._open.discard(old)
            self._open.add(new)

    def remove(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.discard(sock)
            self._lock.notify_all()

    def close_all(self) -> None:
        with self._lock:
            for sock in self._open:
                # The base-class shutdown acts on the descriptor even for an SSLSocket whose TLS
                # object another thread is using; it wakes that thread's blocking read.
                with suppress(OSError):
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def wait_closed(self, timeout: float) -> bool:
        with self._lock:
            return self._lock.wait_for(lambda: not self._open, timeout)


class WebServer:
    """Serves the landing page, the telemetry path and health checks on one or more addresses.

    `max_requests` caps concurrent telemetry requests like node_exporter's --web.max-requests
    (0: no cap); a scrape over the cap gets 503 at once. The landing page and health checks are
    not capped, so a scrape storm does not make a liveness probe kill the exporter.
    """

    def __init__(
        self,
        listen_addresses: Sequence[str],
        telemetry_path: str,
        provider: MetricsProvider,
        landing: LandingPage,
        web_config_file: Path | None = None,
        health: Callable[[], tuple[bool, str]] | None = None,
        *,
        max_requests: int = 40,
        request_timeout: float = 10.0,
        tls_handshake_timeout: float = 10.0,
        reload_interval: float = 1.0,
    ) -> None:
        if not listen_addresses:
            raise ConfigError("no listen address given (example: ':9100')")
        for address in listen_addresses:
            parse_listen_address(address)  # syntax errors surface before anything else starts
        _check_telemetry_path(telemetry_path)
        if max_requests < 0:
            raise ConfigError(f"max requests must be 0 (no limit) or more, got {max_requests}")
        self._addresses = tuple(listen_addresses)
        self.telemetry_path = telemetry_path
        self._provider = provider
        self._landing_html = render_landing_page(landing, telemetry_path)
        self._health = health
        self._slots = threading.BoundedSemaphore(max_requests) if max_requests else None
        self.max_requests = max_requests
        self.request_timeout = request_timeout
        self.tls_handshake_timeout = tls_handshake_timeout

        self._config_file = web_config_file
        self._reload_interval = reload_interval
        self._reload_lock = threading.Lock()
        self._next_reload_check = 0.0
        self._last_reload_error: str | None = None
        self._fingerprints: dict[Path, bytes | None] | None = None
        self._security = self._load_security(() if web_config_file is None else (web_config_file,))

        self._listeners: list[socket.socket] = []
        self._connections = _Connections()
        self._stopping = threading.Event()
        self._wake: tuple[socket.socket, socket.socket] | None = None
        self._acceptor: threading.Thread | None = None
        self._server = _ConnectionServer(self)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Bind every address now (errors are ConfigErrors), then serve in daemon threads."""
        if self._acceptor is not None:
            raise RuntimeError("WebServer.start() called twice")
        listeners: list[socket.socket] = []
        try:
            for address in self._addresses:
                listeners.append(_bind(address))
        except ConfigError:
            for sock in listeners:
                sock.close()
            raise
        for sock in listeners:
            sock.setblocking(False)
        self._listeners = listeners
        self._wake = socket.socketpair()
        self._acceptor = threading.Thread(target=self._accept_loop, name="rnic-web-accept", daemon=True)
        self._acceptor.start()
        scheme = "https" if self._security.ssl_context else "http"
        for host, port in self.bound:
            log.info("listening on %s://%s%s", scheme, _format_host_port(host, port), self.telemetry_path)

    def shutdown(self) -> None:
        """Stop accepting, close listeners and open connections, wait briefly for their threads."""
        if self._acceptor is None or self._stopping.is_set():
            return
        self._stopping.set()
        assert self._wake is not None
        with suppress(OSError):
            self._wake[1].send(b"\0")
        self._acceptor.join(timeout=_SHUTDOWN_GRACE)
        for sock in (*self._listeners, *self._wake):
            sock.close()
        self._connections.close_all()
        if not self._connections.wait_closed(_SHUTDOWN_GRACE):
            log.warning("web server shut down with connections still busy (e.g. a scrape still rendering)")

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
        return self._security.ssl_context is not None

    # -- web config reload -------------------------------------------------------------------

    def reload_web_config(self) -> None:
        """Re-read the web config now; a broken file keeps the old config and logs an error."""
        if self._config_file is None:
            return
        with self._reload_lock:
            self._last_reload_error = None  # an explicit reload always reports its outcome
            self._reload_locked()

    def _current_security(self) -> _Security:
        self._maybe_reload()
        return self._security

    def _maybe_reload(self) -> None:
        """Reload when the config file or a file it names changed; checked at most once an interval.

        Runs on connection threads; whoever finds the lock taken just uses the current config.
        """
        now = time.monotonic()
        if self._config_file is None or now < self._next_reload_check:
            return
        if not self._reload_lock.acquire(blocking=False):
            return
        try:
            if now < self._next_reload_check:
                return
            self._next_reload_check = now + self._reload_interval
            if self._fingerprints is not None and _fingerprint_files(self._security.config.files) == self._fingerprints:
                return
            self._reload_locked()
        finally:
            self._reload_lock.release()

    def _reload_locked(self) -> None:
        try:
            security = self._load_security(self._security.config.files)
            if (security.ssl_context is None) != (self._security.ssl_context is None):
                raise ConfigError(
                    f"web config {self._config_file}: tls_server_config: turning TLS on or off needs "
                    "a restart; keeping the previous config"
                )
        except ConfigError as exc:
            # Keep retrying each interval (the fix may be a file we do not know to watch yet), but
            # say so once per distinct problem instead of once a second.
            self._fingerprints = None
            if str(exc) != self._last_reload_error:
                log.error("web config reload failed, keeping the previous config: %s", exc)
                self._last_reload_error = str(exc)
            return
        self._security = security
        self._last_reload_error = None
        log.info("web config reloaded from %s", self._config_file)

    def _load_security(self, watched_before: Sequence[Path]) -> _Security:
        """Load the config and remember its files' fingerprints, unless one changed while loading."""
        before = _fingerprint_files(watched_before)
        security = _Security.load(self._config_file)
        after = _fingerprint_files(security.config.files)
        raced = any(before[path] != after[path] for path in before.keys() & after.keys())
        # A change during the load may or may not be in what we read: forget the fingerprints so
        # the next check loads again.
        self._fingerprints = None if raced else after
        return security

    # -- accepting ---------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._wake is not None
        wake = self._wake[0]
        with selectors.DefaultSelector() as selector:
            for sock in self._listeners:
                selector.register(sock, selectors.EVENT_READ)
            selector.register(wake, selectors.EVENT_READ)
            while not self._stopping.is_set():
                for key, _ in selector.select():
                    if key.fileobj is not wake:
                        self._accept(cast(socket.socket, key.fileobj))

    def _accept(self, listener: socket.socket) -> None:
        try:
            conn, address = listener.accept()
        except (BlockingIOError, InterruptedError):
            return  # the client gave up between readiness and accept
        except OSError as exc:
            # Out of descriptors or buffers: the listener stays readable, so pause instead of
            # spinning a core until something frees up.
            log.warning("accept on %s failed: %s", listener.getsockname(), exc)
            self._stopping.wait(0.1)
            return
        conn.setblocking(True)
        try:
            self._server.process_request(conn, address)
        except RuntimeError as exc:  # "can't start new thread"
            log.warning("dropping connection from %s: %s", address, exc)
            conn.close()

    # -- per connection (on its own thread) --------------------------------------------------

    def _serve_connection(self, sock: socket.socket, address: Any) -> None:
        self._connections.add(sock)
        conn: socket.socket | None = sock
        try:
            if self._stopping.is_set():
                return
            conn = self._secure(sock, address)
            if conn is None:
                return
            if conn is not sock:
                self._connections.replace(sock, conn)
            try:
                self._server.finish_request(conn, address)
            except Exception:
                self._server.handle_error(conn, address)
        finally:
            if conn is not None:
                _close_connection(conn)
            sock.close()
            self._connections.remove(sock)
            if conn is not None:
                self._connections.remove(conn)

    def _secure(self, sock: socket.socket, address: Any) -> socket.socket | None:
        """The TLS-wrapped socket (or `sock` itself without TLS); None when the client failed."""
        security = self._current_security()
        ctx = security.ssl_context
        if ctx is None:
            return sock
        sock.settimeout(self.tls_handshake_timeout)
        try:
            tls = ctx.wrap_socket(sock, server_side=True)
        except (OSError, ValueError) as exc:
            log.debug("TLS handshake with %s failed: %s", address, exc)
            return None
        tls.settimeout(None)
        tls_config = security.config.tls_server_config
        allowed = () if tls_config is None else tls_config.client_allowed_sans
        if not client_sans_allowed(tls.getpeercert(), allowed):
            log.debug("client certificate of %s has none of the allowed SANs %s", address, list(allowed))
            _close_connection(tls)
            return None
        return tls

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


class _ConnectionServer(socketserver.ThreadingMixIn, socketserver.BaseServer):
    """Gives each accepted connection a daemon thread (ThreadingMixIn) running `_Handler`.

    It has no socket of its own: WebServer's accept loop hands it connections from all listeners.
    """

    daemon_threads = True
    block_on_close = False  # WebServer.shutdown waits for connections itself, with a deadline

    def __init__(self, front: WebServer) -> None:
        super().__init__(("", 0), _Handler)
        self.front = front

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        self.front._serve_connection(cast(socket.socket, request), client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # The default prints a traceback to stderr for every client that hangs up mid-response.
        log.debug("connection from %s failed", client_address, exc_info=True)


class _Handler(http.server.BaseHTTPRequestHandler):
    # Headers and body go out in two writes; with Nagle on, a small body then waits for the
    # client's delayed ACK (40 ms on Linux) on every keep-alive scrape.
    disable_nagle_algorithm = True
    protocol_version = "HTTP/1.1"  # keep-alive, so Prometheus reuses its connection
    server_version = "rnic-exporter"
    _security: _Security | None = None
    _date: tuple[int, str] = (0, "")

    @property
    def front(self) -> WebServer:
        return cast(_ConnectionServer, self.server).front

    def setup(self) -> None:
        super().setup()
        # A per-recv/send timeout: a client that stops sending (or reading) frees this thread.
        self.connection.settimeout(self.front.request_timeout)

    def version_string(self) -> str:
        return self.server_version  # no Python version in the Server header

    def log_message(self, format: str, *args: Any) -> None:
        if log.isEnabledFor(logging.DEBUG):  # called for every request: format nobody reads costs
            log.debug("%s %s", self.address_string(), format % args)

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
        security = self._security or self.front._security
        for name, value in security.config.http_server_config.headers.items():
            self.send_header(name, value)
        super().end_headers()

    def do_GET(self) -> None:
        self._handle(send_body=True, method_allowed=True)

    def do_HEAD(self) -> None:
        self._handle(send_body=False, method_allowed=True)

    def _disallowed_method(self) -> None:
        self._handle(send_body=True, method_allowed=False)

    # The names are the base class's dispatch convention. Methods it finds no handler for get
    # 501, which is right for ones HTTP does not define.
    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _disallowed_method  # noqa: N815

    def _handle(self, *, send_body: bool, method_allowed: bool) -> None:
        front = self.front
        self._security = security = front._current_security()
        if self.headers.get("Content-Length", "0") != "0" or "Transfer-Encoding" in self.headers:
            # We never read request bodies; an unread one would be parsed as the next request.
            self.close_connection = True
        if security.auth.enabled and not security.auth.check_header(self.headers.get("Authorization")):
            self._send(401, b"Unauthorized\n", {"Content-Type": TEXT, "WWW-Authenticate": AUTH_CHALLENGE}, send_body)
            return
        route = front._route(unquote(urlsplit(self.path).path))
        if route is None:
            self._send(404, b"Not Found\n", {"Content-Type": TEXT}, send_body)
        elif not method_allowed:
            self.close_connection = True
            self._send(405, b"Method Not Allowed\n", {"Content-Type": TEXT, "Allow": ALLOWED_METHODS}, send_body)
        elif route == "telemetry":
            self._scrape(send_body)
        elif route == "health":
            self._send(*front._health_check(), send_body)
        else:
            self._send(*front._landing(), send_body)

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
        self.end_headers()
        if send_body:
            self.wfile.write(body)


def _check_telemetry_path(path: str) -> None:
    if not path.startswith("/") or "?" in path or "#" in path:
        raise ConfigError(f"telemetry path {path!r} must be a plain path starting with '/', e.g. '/metrics'")
    if path in HEALTH_PATHS:
        raise ConfigError(f"telemetry path {path!r} is taken by the health endpoint")
    if path == "/":
        raise ConfigError("telemetry path '/' is taken by the landing page; use e.g. '/metrics'")


def _bind(address: str) -> socket.socket:
    host, port = parse_listen_address(address)
    try:
        if host == "":
            return _bind_all_interfaces(port)
        family, sockaddr = _resolve(host, port)
        dual = family == socket.AF_INET6 and sockaddr[0] == "::" and socket.has_dualstack_ipv6()
        # `[::]` listens on IPv4 too, as it does in Go (and so in node_exporter).
        return socket.create_server(sockaddr, family=family, dualstack_ipv6=dual)
    except socket.gaierror as exc:
        raise ConfigError(f"cannot listen on {address!r}: cannot resolve {host!r}: {exc.strerror}") from exc
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise ConfigError(f"cannot listen on {address!r}: {reason}") from exc


def _bind_all_interfaces(port: int) -> socket.socket:
    """`:port`: one dual-stack socket when the host has IPv6, else IPv4 only."""
    if socket.has_dualstack_ipv6():
        try:
            return socket.create_server(("::", port), family=socket.AF_INET6, dualstack_ipv6=True)
        except OSError as exc:
            # IPv6 switched off at runtime (sysctl disable_ipv6) shows up only when binding.
            if exc.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT):
                raise
    return socket.create_server(("0.0.0.0", port))


def _resolve(host: str, port: int) -> tuple[int, tuple[Any, ...]]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = infos[0]
    return int(family), tuple(sockaddr)


def _close_connection(sock: socket.socket) -> None:
    with suppress(OSError):
        sock.shutdown(socket.SHUT_WR)  # flush what we wrote before the close, as TCPServer does
    sock.close()


def _format_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
