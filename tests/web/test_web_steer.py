"""The priority accept queue (web/steer.py): the kernel's steering by source address, the fallback
to one listener, and a proven scraper's fresh connection ahead of a flood, over real sockets."""

# ruff: noqa: F811  (test parameters name the fixtures imported from test_web, as pytest requires)

from __future__ import annotations

import errno
import http.client
import logging
import socket
import threading
import time
from pathlib import Path

import pytest

from rnic_exporter.errors import ConfigError
from rnic_exporter.web import listen, steer
from rnic_exporter.web.connections import Connection, Reactor
from rnic_exporter.web.server import WebServer
from tests.support.wait import wait_for
from tests.web.test_web import (  # noqa: F401  (fixtures, found by their names)
    BODY,
    DEADLINE,
    LANDING,
    Certs,
    FakeProvider,
    ServerFactory,
    basic,
    certs,
    client_context,
    confdir,
    provider,
    read_until_closed,
    request,
    serve,
    tls_config,
    write_config,
)
from tests.web.test_web_abuse import sockets  # noqa: F401  (a fixture: the sockets to close after the test)


def pair(address: str, sockets: list[socket.socket]) -> tuple[socket.socket, socket.socket]:
    general, priority = steer.bind_steered(address)
    sockets.append(general)
    assert priority is not None, "this kernel refused the SO_REUSEPORT pair or the classic BPF program"
    sockets.append(priority)
    general.setblocking(False)
    priority.setblocking(False)
    return general, priority


def connect_from(source: str, listener: socket.socket, sockets: list[socket.socket]) -> None:
    family = listener.family if ":" in source else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sockets.append(sock)
    sock.settimeout(DEADLINE)
    sock.bind((source, 0))
    host = "::1" if family == socket.AF_INET6 else "127.0.0.1"
    sock.connect((host, listener.getsockname()[1]))


def accepted(listeners: dict[str, socket.socket], count: int, sockets: list[socket.socket]) -> dict[str, list[str]]:
    """Which listener accepted each of `count` connections: queue name -> client addresses."""
    got: dict[str, list[str]] = {name: [] for name in listeners}

    def probe() -> bool:
        for name, listener in listeners.items():
            while True:
                try:
                    sock, address = listener.accept()
                except BlockingIOError:
                    break
                sockets.append(sock)
                got[name].append(str(address[0]))
        return sum(map(len, got.values())) >= count

    wait_for(probe, timeout=DEADLINE, what=f"{count} connections accepted")
    return got


def test_a_proven_ipv4_address_lands_on_the_priority_queue_and_others_on_the_general_one(
    sockets: list[socket.socket],
) -> None:
    general, priority = pair("127.0.0.1:0", sockets)
    steer.attach(general, steer.program(["127.0.0.2", "::1"]))
    # Several from each: a program returning an index outside the group would make the kernel
    # hash the connections over both queues instead.
    for _ in range(8):
        connect_from("127.0.0.2", general, sockets)
        connect_from("127.0.0.3", general, sockets)
    got = accepted({"general": general, "priority": priority}, 16, sockets)
    assert got == {"general": ["127.0.0.3"] * 8, "priority": ["127.0.0.2"] * 8}


def test_without_a_proven_address_everything_goes_to_the_general_queue(sockets: list[socket.socket]) -> None:
    general, priority = pair("127.0.0.1:0", sockets)  # as bound: the empty program
    for source in ("127.0.0.1", "127.0.0.2") * 4:
        connect_from(source, general, sockets)
    got = accepted({"general": general, "priority": priority}, 8, sockets)
    assert sorted(got["general"]) == ["127.0.0.1"] * 4 + ["127.0.0.2"] * 4
    assert got["priority"] == []


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this host")
def test_ipv6_sources_are_steered(sockets: list[socket.socket]) -> None:
    general, priority = pair("[::1]:0", sockets)
    steer.attach(general, steer.program(["::1"]))
    connect_from("::1", general, sockets)
    assert accepted({"general": general, "priority": priority}, 1, sockets) == {"general": [], "priority": ["::1"]}
    steer.attach(general, steer.program(["::2", "127.0.0.1"]))  # same first words, another address
    connect_from("::1", general, sockets)
    assert accepted({"general": general, "priority": priority}, 1, sockets) == {"general": ["::1"], "priority": []}


@pytest.mark.skipif(not socket.has_dualstack_ipv6() or not _ipv6_loopback(), reason="no dual-stack IPv6 here")
def test_a_dual_stack_listener_steers_ipv4_clients_by_their_ipv4_address(sockets: list[socket.socket]) -> None:
    general, priority = pair("[::]:0", sockets)
    # As the reactor sees them on a dual-stack socket: IPv4-mapped.
    steer.attach(general, steer.program(["::ffff:127.0.0.2"]))
    connect_from("127.0.0.2", general, sockets)
    connect_from("127.0.0.3", general, sockets)
    connect_from("::1", general, sockets)
    got = accepted({"general": general, "priority": priority}, 3, sockets)
    assert sorted(got["general"]) == ["::1", "::ffff:127.0.0.3"]
    assert got["priority"] == ["::ffff:127.0.0.2"]


def test_the_program_holds_the_cap_of_addresses_of_both_families(sockets: list[socket.socket]) -> None:
    general, priority = pair("127.0.0.1:0", sockets)
    hosts = [f"127.0.1.{n}" for n in range(steer.MAX_ADDRESSES // 2)]
    hosts += [f"2001:db8::{n:x}" for n in range(steer.MAX_ADDRESSES - len(hosts) - 1)] + ["127.0.0.5"]
    steer.attach(general, steer.program(hosts))
    connect_from("127.0.0.5", general, sockets)  # the last one compared
    connect_from("127.0.0.6", general, sockets)
    got = accepted({"general": general, "priority": priority}, 2, sockets)
    assert got == {"general": ["127.0.0.6"], "priority": ["127.0.0.5"]}
    with pytest.raises(ValueError, match="at most"):
        steer.program([*hosts, "127.0.0.7"])


def test_a_port_held_by_another_reuseport_socket_is_still_address_in_use(provider: FakeProvider) -> None:
    other = socket.socket()
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # as another process of ours could
    try:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        server = WebServer([f"127.0.0.1:{port}"], "/metrics", provider, LANDING)
        with pytest.raises(ConfigError, match=r"[Aa]ddress already in use"):
            server.start()
    finally:
        other.close()


def test_a_second_exporter_on_the_same_port_is_refused(serve: ServerFactory, provider: FakeProvider) -> None:
    first = serve()
    assert first._reactor is not None and first._reactor.priority is not None  # steering is on
    port = first.bound[0][1]
    second = WebServer([f"127.0.0.1:{port}"], "/metrics", provider, LANDING)
    with pytest.raises(ConfigError, match=r"[Aa]ddress already in use"):
        second.start()


def _refuse_attach(sock: socket.socket, instructions: bytes) -> None:
    raise OSError(errno.ENOPROTOOPT, "Protocol not available")


def _refuse_reuseport(sock: socket.socket) -> None:
    raise listen.ReusePortError("this platform has no SO_REUSEPORT")


@pytest.mark.parametrize("refused", ["attach", "reuseport"])
def test_where_the_kernel_refuses_steering_one_listener_serves_as_before(
    serve: ServerFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, refused: str
) -> None:
    if refused == "attach":
        monkeypatch.setattr(steer, "attach", _refuse_attach)
    else:
        monkeypatch.setattr(listen, "_reuse_port", _refuse_reuseport)
    with caplog.at_level(logging.WARNING, logger="rnic_exporter.web.steer"):
        server = serve()
    assert [r.getMessage() for r in caplog.records if "one accept queue" in r.getMessage()] != []
    assert len(caplog.records) == 1
    reactor = server._reactor
    assert reactor is not None and reactor.priority is None
    assert request(server).body == BODY
    # A plain listener again: no SO_REUSEPORT left on it for another socket to join.
    port = server.bound[0][1]
    joiner = socket.socket()
    joiner.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    with joiner, pytest.raises(OSError) as exc:
        joiner.bind(("127.0.0.1", port))
    assert exc.value.errno == errno.EADDRINUSE


def steered(reactor: Reactor, host: str) -> None:
    assert reactor.priority is not None
    wait_for(lambda: host in reactor.priority.steered, timeout=DEADLINE, what=f"{host} steered to the priority queue")  # type: ignore[union-attr]


def test_an_address_is_steered_once_a_request_from_it_was_answered(serve: ServerFactory) -> None:
    server = serve()
    reactor = server._reactor
    assert reactor is not None and reactor.priority is not None
    assert reactor.priority.steered == frozenset()
    assert request(server).body == BODY  # from 127.0.0.1, no auth configured: answered is proven
    steered(reactor, "127.0.0.1")
    assert request(server).body == BODY
    assert reactor.prioritized == 1  # the second connection came through the priority queue


@pytest.mark.parametrize("priority_queue", [True, False])
def test_a_proven_scrapers_fresh_connection_is_answered_while_a_flood_fills_the_backlog(
    serve: ServerFactory, sockets: list[socket.socket], priority_queue: bool
) -> None:
    # One flooding address at the cap, its connections too young to close (30 s): the reactor
    # leaves the rest of the flood in the kernel's accept queue, first come first served. A
    # scraper's new connection behind it waited there until the deadline (the False case, as
    # before the priority queue); through the priority queue it takes the flood's place at once.
    server = serve(max_connections=4, evict_after=30.0, priority_queue=priority_queue)
    reactor = server._reactor
    assert reactor is not None
    assert request(server).body == BODY  # the scraper's earlier scrape proves its address
    if priority_queue:
        steered(reactor, "127.0.0.1")
    # Closed on the server's side too, so the flood's is the only address the reactor holds.
    wait_for(lambda: server.open_connections == 0, timeout=DEADLINE, what="the scrape's connection closed")
    host, port = server.bound[0]
    flood = []
    for _ in range(4 + 32 + 20):  # the cap, the lobby, and the backlog
        sock = socket.create_connection((host, port), timeout=DEADLINE, source_address=("127.0.0.2", 0))
        sockets.append(sock)
        flood.append(sock)
    wait_for(lambda: not reactor._accepting, timeout=DEADLINE, what="the reactor to stop accepting the flood")
    scraper = http.client.HTTPConnection(host, port, timeout=DEADLINE)
    try:
        if priority_queue:
            scraper.request("GET", "/metrics")
            assert scraper.getresponse().read() == BODY
            assert read_until_closed(flood[0], timeout=DEADLINE) == b""  # the flood's oldest made room
        else:
            with pytest.raises(TimeoutError):
                scraper.request("GET", "/metrics")
                scraper.getresponse()
    finally:
        scraper.close()


def test_a_priority_connection_is_not_closed_for_room(serve: ServerFactory, sockets: list[socket.socket]) -> None:
    # Any waiting connection may be closed for room at once (evict_after 0): without the priority
    # queue the longest-waiting, the scraper's new connection that has not sent its request yet,
    # was the first to go.
    server = serve(max_connections=3, evict_after=0.0)
    reactor = server._reactor
    assert reactor is not None
    assert request(server).body == BODY
    steered(reactor, "127.0.0.1")
    host, port = server.bound[0]
    quiet = socket.create_connection((host, port), timeout=DEADLINE)  # from the proven address
    sockets.append(quiet)
    wait_for(lambda: reactor.prioritized == 1, timeout=DEADLINE, what="the connection through the priority queue")
    others = []
    for n in range(2, 12):  # each from an address of its own, so none is refused as the hog
        sock = socket.create_connection((host, port), timeout=DEADLINE, source_address=(f"127.0.0.{n}", 0))
        sockets.append(sock)
        others.append(sock)
    assert read_until_closed(others[0], timeout=DEADLINE) == b""  # closed for room
    quiet.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert read_until_closed(quiet, timeout=DEADLINE).endswith(BODY)


def test_a_proven_scrapers_fresh_https_connection_is_handshaken_and_answered_off_the_reactor(
    serve: ServerFactory, confdir: Path, certs: Certs
) -> None:
    server = serve(write_config(confdir, tls_config({"alice": "s3cret"})))
    reactor = server._reactor
    assert reactor is not None and reactor.priority is not None
    ctx = client_context(certs)
    assert request(server, context=ctx, headers=basic("alice", "wrong")).status == 401  # proves nothing
    assert request(server, context=ctx, headers=basic("alice", "s3cret")).status == 200
    steered(reactor, "127.0.0.1")
    read_by_reactor: list[Connection] = []
    on_request = reactor._on_request

    def recording(conn: Connection, head: bytes) -> None:
        read_by_reactor.append(conn)
        on_request(conn, head)

    reactor._on_request = recording
    reply = request(server, context=ctx, headers=basic("alice", "s3cret"))
    assert (reply.status, reply.body) == (200, BODY)
    assert reactor.prioritized == 1
    assert read_by_reactor == []  # its handshake and request were a keeper thread's


def test_a_trickling_client_from_a_proven_address_is_closed_at_the_handshake_deadline(
    serve: ServerFactory, confdir: Path, certs: Certs
) -> None:
    server = serve(write_config(confdir, tls_config()), tls_handshake_timeout=0.3)
    reactor = server._reactor
    assert reactor is not None
    ctx = client_context(certs)
    assert request(server, context=ctx).status == 200  # no auth: an answered request is proven
    steered(reactor, "127.0.0.1")
    with socket.create_connection(server.bound[0], timeout=DEADLINE) as slow:
        wait_for(lambda: reactor.prioritized == 1, timeout=DEADLINE, what="the connection through the priority queue")
        stop = threading.Event()

        def trickle() -> None:  # a ClientHello a byte every 50 ms: a per-read timeout would never fire
            for byte in b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(500):
                if stop.wait(0.05):
                    return
                try:
                    slow.sendall(bytes([byte]))
                except OSError:
                    return

        dripping = threading.Thread(target=trickle)
        started = time.monotonic()
        dripping.start()
        try:
            assert read_until_closed(slow, timeout=DEADLINE) == b""
            assert time.monotonic() - started < DEADLINE
        finally:
            stop.set()
            dripping.join()
    assert request(server, context=ctx).status == 200


def keepers() -> int:
    return sum(1 for thread in threading.enumerate() if thread.name == "rnic-web-keep")


def test_with_every_keeper_busy_a_priority_connection_is_served_by_the_reactor(serve: ServerFactory) -> None:
    server = serve()
    reactor = server._reactor
    assert reactor is not None
    assert request(server).body == BODY
    steered(reactor, "127.0.0.1")
    host, port = server.bound[0]
    held = [http.client.HTTPConnection(host, port, timeout=DEADLINE) for _ in range(4)]
    try:
        for conn in held:  # each keep-alive connection then waits for its next request on a keeper
            conn.request("GET", "/metrics")
            assert conn.getresponse().read() == BODY
        wait_for(lambda: keepers() == 4, timeout=DEADLINE, what="every keeper thread taken")
        reply = request(server)
        assert (reply.status, reply.body) == (200, BODY)
        assert reactor.prioritized == 5
    finally:
        for conn in held:
            conn.close()
