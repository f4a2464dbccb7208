"""The web front's tests' parts: a fixed provider, HTTP(S) requests over real sockets, web config
texts and client TLS contexts. The fixtures built from them are in tests/web/conftest.py."""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import bcrypt

from rnic_exporter.errors import NotReadyError
from rnic_exporter.web.server import LandingPage, WebServer

BODY = b"# HELP rdma_up Whether the port is up.\n# TYPE rdma_up gauge\nrdma_up 1\n"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LANDING = LandingPage(
    name="rnic-exporter <test>",
    description="RDMA NICs & their health",
    version="0.1.0",
    links=(("/debug?x=1&y=2", "Debug <info>"),),
)
DEADLINE = 2.0  # seconds any single request may take in these tests


class FakeProvider:
    """Returns a fixed body; `gate`, when set, holds render() until released (for the cap test)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str | None, str | None]] = []
        self.entered = threading.Event()
        self.gate: threading.Event | None = None
        self.not_ready: str | None = None  # render raises NotReadyError with this message

    def render(self, accept_header: str | None, accept_encoding: str | None) -> tuple[bytes, dict[str, str]]:
        self.calls.append((accept_header, accept_encoding))
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(10)
        if self.not_ready is not None:
            raise NotReadyError(self.not_ready)
        return BODY, {"Content-Type": CONTENT_TYPE}


@dataclass(frozen=True)
class Certs:
    server_cert: Path
    server_key: Path
    client_cert: Path  # self-signed, so it doubles as the client CA
    client_key: Path


@dataclass(frozen=True)
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: bytes


ServerFactory = Callable[..., WebServer]


def front_samples(server: WebServer) -> dict[str, list[tuple[tuple[str, ...], float]]]:
    """The front's own families (rnic_exporter_http_*) as a scrape would carry them: name -> samples."""
    return {family.spec.name: family.samples for family in server.families()}


def request(
    server: WebServer,
    path: str = "/metrics",
    *,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    context: ssl.SSLContext | None = None,
    body: bytes | None = None,
    timeout: float = DEADLINE,
) -> Reply:
    host, port = server.bound[0]
    conn: http.client.HTTPConnection
    if context is None:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    else:
        conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return Reply(response.status, response.headers, response.read())
    finally:
        conn.close()


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def bcrypt_hash(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()


def write_config(directory: Path, text: str) -> Path:
    path = directory / "web.yml"
    path.write_text(text)
    return path


def tls_config(users: dict[str, str] | None = None, extra_tls: str = "") -> str:
    text = f"tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n{extra_tls}"
    return text + users_config(users) if users else text


def users_config(users: dict[str, str]) -> str:
    return "basic_auth_users:\n" + "".join(f"  {user}: '{bcrypt_hash(pw)}'\n" for user, pw in users.items())


def users_yaml(users: dict[str, tuple[str, int]]) -> str:
    """basic_auth_users with each user's bcrypt cost chosen."""
    lines = [
        f"  {user}: '{bcrypt.hashpw(pw.encode(), bcrypt.gensalt(rounds=cost)).decode()}'\n"
        for user, (pw, cost) in users.items()
    ]
    return "basic_auth_users:\n" + "".join(lines)


def client_context(certs: Certs, *, with_cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(certs.server_cert))
    if with_cert:
        ctx.load_cert_chain(certs.client_cert, certs.client_key)
    return ctx


def read_until_closed(sock: socket.socket, timeout: float) -> bytes:
    """Everything the server sends until it closes; fails the test if it is still open at the deadline."""
    sock.settimeout(timeout)
    received = b""
    while chunk := sock.recv(4096):
        received += chunk
    return received
