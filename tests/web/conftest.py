"""The web front runs in the daemon's process, which `run()` tunes once (daemon/runtime.py): these tests
start the front alone, so they tune the test process the same way. And the fixtures every web test
file uses: certificates, a config directory, the fake provider, servers that are shut down after."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rnic_exporter.daemon.runtime import tune_process
from rnic_exporter.web.server import WebServer
from tests.support.tls import self_signed
from tests.support.web import LANDING, Certs, FakeProvider, ServerFactory


@pytest.fixture(autouse=True, scope="session")
def _daemon_process_tuning() -> None:
    tune_process()


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    directory = tmp_path_factory.mktemp("certs")
    server_cert, server_key = self_signed(directory, "server", cn="server")
    client_cert, client_key = self_signed(directory, "client", cn="client", subject_alt_name="DNS:scraper.example")
    return Certs(server_cert, server_key, client_cert, client_key)


@pytest.fixture
def confdir(tmp_path: Path, certs: Certs) -> Path:
    """A directory with the certificates next to where the config goes, for relative paths."""
    for source in (certs.server_cert, certs.server_key, certs.client_cert, certs.client_key):
        shutil.copy(source, tmp_path / source.name)
    return tmp_path


@pytest.fixture
def provider() -> FakeProvider:
    return FakeProvider()


@pytest.fixture
def serve(provider: FakeProvider) -> Iterator[ServerFactory]:
    """Starts WebServers on 127.0.0.1:0 and shuts every one down after the test."""
    servers: list[WebServer] = []

    def start(web_config_file: Path | None = None, **kwargs: Any) -> WebServer:
        server = WebServer(["127.0.0.1:0"], "/metrics", provider, LANDING, web_config_file, **kwargs)
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.shutdown()


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    """Client sockets a test opens, closed after it."""
    opened: list[socket.socket] = []
    yield opened
    for sock in opened:
        sock.close()
