"""The HTTP front's own metrics (rnic_exporter_http_*), over real sockets."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from tests.support.wait import wait_for
from tests.support.web import (
    DEADLINE,
    FakeProvider,
    ServerFactory,
    basic,
    front_samples,
    request,
    users_yaml,
    write_config,
)

# -- the front's own metrics -------------------------------------------------------------------


def test_responses_are_counted_by_code_and_the_scrape_cap_apart(
    serve: ServerFactory, provider: FakeProvider, tmp_path: Path
) -> None:
    provider.gate = threading.Event()
    server = serve(write_config(tmp_path, users_yaml({"alice": ("s3cret", 4)})), max_requests=1)
    auth = basic("alice", "s3cret")
    held: list[int] = []
    busy = threading.Thread(target=lambda: held.append(request(server, headers=auth, timeout=10).status))
    busy.start()
    try:
        assert provider.entered.wait(DEADLINE)
        assert request(server, headers=auth).status == 503  # the one scrape slot is taken
    finally:
        provider.gate.set()
        busy.join(DEADLINE)
    assert held == [200]
    assert request(server).status == 401
    assert request(server, "/nowhere", headers=auth).status == 404
    assert request(server, "/-/healthy", headers=auth).status == 200
    counted = front_samples(server)
    assert counted["rnic_exporter_http_requests_total"] == [
        (("200",), 2.0),
        (("401",), 1.0),
        (("404",), 1.0),
        (("503",), 1.0),
    ]
    assert counted["rnic_exporter_http_requests_limited_total"] == [((), 1.0)]


def test_a_request_head_too_large_is_counted_as_431(serve: ServerFactory, sockets: list[socket.socket]) -> None:
    server = serve()
    sock = socket.create_connection(server.bound[0], timeout=DEADLINE)
    sockets.append(sock)
    sock.sendall(b"GET / HTTP/1.1\r\nX: " + b"a" * (70 * 1024))
    assert sock.recv(64).startswith(b"HTTP/1.1 431")
    wait_for(
        lambda: (("431",), 1.0) in front_samples(server)["rnic_exporter_http_requests_total"],
        timeout=DEADLINE,
        what="431",
    )


def test_connections_closed_for_room_are_counted(serve: ServerFactory, sockets: list[socket.socket]) -> None:
    server = serve(max_connections=2, evict_after=0.1)
    for _ in range(2):
        sockets.append(socket.create_connection(server.bound[0], timeout=DEADLINE))
    wait_for(lambda: server.open_connections == 2, timeout=DEADLINE, what="the cap to be reached")
    assert request(server).status == 200  # it takes the oldest silent connection's place
    assert front_samples(server)["rnic_exporter_http_connections_closed_for_room_total"] == [
        (("waiting",), 1.0),
        (("accept",), 0.0),
    ]
