"""The HTTP front under abuse, over real sockets with real HTTP clients: deadlines, caps, bcrypt fairness."""

from __future__ import annotations

import http.client
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import bcrypt
import pytest

from rnic_exporter.web.auth import BasicAuth, Credential
from tests.support.wait import wait_for
from tests.support.web import (
    BODY,
    DEADLINE,
    FakeProvider,
    ServerFactory,
    basic,
    front_samples,
    read_until_closed,
    request,
    users_yaml,
    write_config,
)


class RecordingCheckpw:
    """Counts bcrypt checks and records the hash each was made against; `gate` holds them."""

    def __init__(self) -> None:
        self.hashes: list[bytes] = []
        self.passwords: list[bytes] = []
        self.nice: list[int] = []  # of the thread each check ran on
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self._real = bcrypt.checkpw

    def __call__(self, password: bytes, hashed: bytes) -> bool:
        self.hashes.append(hashed)
        self.passwords.append(password)
        self.nice.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10), "test never opened the bcrypt gate"
        return self._real(password, hashed)


@pytest.fixture
def checkpw(monkeypatch: pytest.MonkeyPatch) -> RecordingCheckpw:
    recorder = RecordingCheckpw()
    monkeypatch.setattr(bcrypt, "checkpw", recorder)
    return recorder


def record_queued(monkeypatch: pytest.MonkeyPatch, checkpw: RecordingCheckpw, secret: bytes) -> list[int]:
    """How many bcrypt checks had started each time a check of `secret` was queued (BasicAuth.submit)."""
    queued_at: list[int] = []
    real_submit = BasicAuth.submit

    def recording_submit(
        auth: BasicAuth, credential: Credential, verdict: Callable[[bool], None], source: str = ""
    ) -> None:
        real_submit(auth, credential, verdict, source)
        if credential.secret == secret:
            queued_at.append(len(checkpw.passwords))

    monkeypatch.setattr(BasicAuth, "submit", recording_submit)
    return queued_at


def connect(server_address: tuple[str, int], opened: list[socket.socket]) -> socket.socket:
    sock = socket.create_connection(server_address, timeout=DEADLINE)
    opened.append(sock)
    return sock


# -- deadlines ------------------------------------------------------------------------------------


def test_slowloris_is_closed_at_the_request_deadline_and_does_not_block_a_scraper(serve: ServerFactory) -> None:
    server = serve(request_timeout=0.3)
    with socket.create_connection(server.bound[0]) as slow:
        slow.sendall(b"GET /metrics HTTP/1.1\r\n")
        stop = threading.Event()

        def trickle() -> None:  # a header byte every 50 ms: a per-read timeout would never fire
            while not stop.wait(0.05):
                try:
                    slow.sendall(b"X")
                except OSError:
                    return

        dripping = threading.Thread(target=trickle)
        dripping.start()
        try:
            assert request(server).status == 200  # while the slow client holds its connection
            started = time.monotonic()
            assert read_until_closed(slow, timeout=DEADLINE) == b""
            assert time.monotonic() - started < DEADLINE
        finally:
            stop.set()
            dripping.join()


def test_silent_connections_cost_no_thread(serve: ServerFactory, sockets: list[socket.socket]) -> None:
    server = serve()
    assert request(server).status == 200
    threads_before = server.threads
    for _ in range(200):
        connect(server.bound[0], sockets).sendall(b"GET /metr")
    wait_for(lambda: server.open_connections == 200, timeout=DEADLINE, what="200 open connections")
    assert request(server).status == 200
    assert server.threads == threads_before


# -- connection cap -------------------------------------------------------------------------------


def test_at_the_cap_the_longest_waiting_connection_makes_room(
    serve: ServerFactory, sockets: list[socket.socket]
) -> None:
    server = serve(max_connections=3, evict_after=0.1)
    silent = [connect(server.bound[0], sockets) for _ in range(3)]
    wait_for(lambda: server.open_connections == 3, timeout=DEADLINE, what="3 open connections")
    assert request(server).status == 200  # the fourth gets in
    assert read_until_closed(silent[0], timeout=DEADLINE) == b""  # the oldest silent one was closed
    assert server.open_connections <= 3


def test_a_scrapers_keep_alive_connection_outlives_silent_ones_at_the_cap(
    serve: ServerFactory, sockets: list[socket.socket]
) -> None:
    server = serve(max_connections=3, evict_after=0.1)
    host, port = server.bound[0]
    scraper = http.client.HTTPConnection(host, port, timeout=DEADLINE)
    try:
        scraper.request("GET", "/metrics")
        assert scraper.getresponse().read() == BODY
        kept = scraper.sock
        for _ in range(10):  # each one arriving at the cap pushes out an older silent one
            connect(server.bound[0], sockets)
        wait_for(lambda: server.open_connections == 3, timeout=DEADLINE, what="the cap to be reached")
        scraper.request("GET", "/metrics")
        assert scraper.getresponse().read() == BODY
        assert scraper.sock is kept  # the same connection: it was not evicted
    finally:
        scraper.close()


def test_at_the_cap_a_client_on_its_own_address_does_not_wait_behind_a_flood_from_others(
    serve: ServerFactory, sockets: list[socket.socket]
) -> None:
    # Connections are old enough to close only after 30 s: by that rule alone a newcomer would
    # wait in the listen backlog far beyond the request's 2 s deadline.
    server = serve(max_connections=4, evict_after=30.0)
    flood_address = server.bound[0]

    def flood(source: str) -> socket.socket:
        sock = socket.create_connection(flood_address, timeout=DEADLINE, source_address=(source, 0))
        sockets.append(sock)
        return sock

    first = [flood("127.0.0.2") for _ in range(3)] + [flood("127.0.0.3")]
    wait_for(lambda: server.open_connections == 4, timeout=DEADLINE, what="the flood to fill the cap")
    host, port = server.bound[0]
    scraper = http.client.HTTPConnection(host, port, timeout=DEADLINE)  # from 127.0.0.1
    try:
        scraper.request("GET", "/metrics")  # a new connection at the cap: it takes the hog's oldest place
        assert scraper.getresponse().read() == BODY
        assert read_until_closed(first[0], timeout=DEADLINE) == b""
        # The flood's next connection, at the cap again, is closed as soon as it is accepted.
        late = flood("127.0.0.2")
        assert read_until_closed(late, timeout=DEADLINE) == b""
        assert server.open_connections == 4
        scraper.request("GET", "/metrics")  # and the scraper's keep-alive connection is still served
        assert scraper.getresponse().read() == BODY
    finally:
        scraper.close()
    closed = front_samples(server)
    assert closed["rnic_exporter_http_connections_closed_for_room_total"] == [(("waiting",), 1.0), (("accept",), 1.0)]


def test_at_the_cap_a_flood_from_several_addresses_is_closed_rather_than_left_ahead_of_a_scraper(
    serve: ServerFactory, sockets: list[socket.socket]
) -> None:
    # Two flooding addresses, neither clearly less served than the other: the newcomers of both are
    # closed at accept; pausing the accepts instead (as before) left the scraper's new connection in
    # the kernel's backlog behind theirs until the oldest could be evicted (30 s here).
    server = serve(max_connections=4, evict_after=30.0)
    address = server.bound[0]

    def flood(source: str) -> socket.socket:
        sock = socket.create_connection(address, timeout=DEADLINE, source_address=(source, 0))
        sockets.append(sock)
        return sock

    for source in ("127.0.0.2", "127.0.0.3") * 2:
        flood(source)
    wait_for(lambda: server.open_connections == 4, timeout=DEADLINE, what="the flood to fill the cap")

    def refused() -> float:
        closed = dict(front_samples(server)["rnic_exporter_http_connections_closed_for_room_total"])
        return closed[("accept",)]

    for source in ("127.0.0.2", "127.0.0.3") * 40:
        flood(source)
    wait_for(lambda: refused() == 80, timeout=DEADLINE, what="the flood's newcomers to be closed")
    host, port = address
    scraper = http.client.HTTPConnection(host, port, timeout=DEADLINE)  # from 127.0.0.1
    try:
        scraper.request("GET", "/metrics")
        assert scraper.getresponse().read() == BODY
    finally:
        scraper.close()


def test_an_idle_scraper_is_not_evicted_while_young_silent_connections_wait(
    serve: ServerFactory, sockets: list[socket.socket]
) -> None:
    server = serve(max_connections=3, evict_after=0.5)
    host, port = server.bound[0]
    scraper = http.client.HTTPConnection(host, port, timeout=DEADLINE)
    try:
        scraper.request("GET", "/metrics")
        assert scraper.getresponse().read() == BODY
        kept = scraper.sock
        time.sleep(0.6)  # the scraper's connection is now past evict_after; the silent ones will not be
        for _ in range(3):  # two fill the cap, the third finds no connection old enough to close
            connect(server.bound[0], sockets)
        wait_for(lambda: server.open_connections == 3, timeout=DEADLINE, what="the cap to be reached")
        scraper.request("GET", "/metrics")
        assert scraper.getresponse().read() == BODY
        assert scraper.sock is kept
    finally:
        scraper.close()


def test_over_the_cap_with_every_connection_busy_new_clients_wait_not_fail(
    serve: ServerFactory, provider: FakeProvider
) -> None:
    provider.gate = threading.Event()
    server = serve(max_connections=1)
    first: list[int] = []
    busy = threading.Thread(target=lambda: first.append(request(server, timeout=10).status))
    busy.start()
    try:
        assert provider.entered.wait(DEADLINE)
        # The kernel's listen backlog completes the TCP handshake; we do not accept it yet.
        with socket.create_connection(server.bound[0], timeout=DEADLINE) as waiting:
            waiting.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
            waiting.settimeout(0.3)
            with pytest.raises(TimeoutError):
                waiting.recv(1)
            provider.gate.set()
            waiting.settimeout(DEADLINE)
            assert waiting.recv(64).startswith(b"HTTP/1.1 200")
    finally:
        provider.gate.set()
        busy.join(DEADLINE)
    assert first == [200]


# -- bcrypt ---------------------------------------------------------------------------------------


def test_bcrypt_waits_do_not_hold_workers(serve: ServerFactory, tmp_path: Path, checkpw: RecordingCheckpw) -> None:
    server = serve(write_config(tmp_path, users_yaml({"alice": ("a", 4), "bob": ("b", 4)})), max_requests=1)
    assert request(server, headers=basic("alice", "a")).status == 200  # alice is cached now
    checkpw.gate = threading.Event()
    checkpw.entered.clear()
    guesses = [
        threading.Thread(target=request, args=(server,), kwargs={"headers": basic("bob", f"guess{n}"), "timeout": 10})
        for n in range(12)
    ]
    for guess in guesses:
        guess.start()
    try:
        assert checkpw.entered.wait(DEADLINE)
        # 12 requests wait for bcrypt, more than the 5 workers; a cached user is still answered.
        assert request(server, headers=basic("alice", "a")).status == 200
    finally:
        checkpw.gate.set()
        for guess in guesses:
            guess.join(10)


def test_a_wrong_password_flood_delays_a_correct_user_by_at_most_the_queue_ahead(
    serve: ServerFactory, tmp_path: Path, checkpw: RecordingCheckpw, monkeypatch: pytest.MonkeyPatch
) -> None:
    flooders = 8
    server = serve(write_config(tmp_path, users_yaml({"alice": ("right", 4)})))
    stop = threading.Event()
    # Checks are counted from when alice's is queued, not from when her request was sent: on a
    # loaded machine flood checks run while it crosses the socket and the parser, and those were
    # never behind it.
    queued_at = record_queued(monkeypatch, checkpw, b"right")

    def flood(n: int) -> None:
        attempt = 0
        while not stop.is_set():
            attempt += 1
            request(server, headers=basic("alice", f"wrong-{n}-{attempt}"), timeout=10)

    threads = [threading.Thread(target=flood, args=(n,)) for n in range(flooders)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: len(checkpw.hashes) > 3 * flooders, timeout=DEADLINE, what="the flood to reach bcrypt")
        checks_before = len(checkpw.passwords)
        assert request(server, headers=basic("alice", "right"), timeout=10).status == 200
        # Negative when her check began before the recorder read the count (the queue was empty).
        position = checkpw.passwords.index(b"right", checks_before) - queued_at[0]
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    # FIFO: each flooder has at most one request queued ahead of alice's; nothing behind it goes first.
    assert position <= flooders


def test_a_first_scrape_behind_300_clients_guessing_distinct_passwords_waits_one_guess_per_address(
    serve: ServerFactory, tmp_path: Path, checkpw: RecordingCheckpw, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 33 item 6, at the cost the issue measured (bcrypt cost 10): 300 unauthenticated clients,
    each guessing a new password per request from four addresses of their own (as bench/abuse.py
    attacks), keep about 300 checks queued; Prometheus' first scrape, on an address of its own, was
    answered after 19 s behind one FIFO of them. Judged in bcrypt checks, which a loaded machine does
    not change: at most the one running and one per flooding address run before hers (a FIFO ran
    about 300). At cost 10 that is under a second on an idle core (0.83 s measured); the wall time
    is printed, not asserted."""
    clients, addresses = 300, 4
    queued_at = record_queued(monkeypatch, checkpw, b"right")  # counted from when hers is queued
    server = serve(write_config(tmp_path, users_yaml({"prometheus": ("right", 10)})))
    host, port = server.bound[0]
    stop = threading.Event()
    sent = threading.Semaphore(0)

    def guess(n: int) -> None:
        attempt = 0
        conn = http.client.HTTPConnection(host, port, timeout=60, source_address=(f"127.0.0.{2 + n % addresses}", 0))
        try:
            while not stop.is_set():
                attempt += 1
                conn.request("GET", "/metrics", headers=basic("prometheus", f"guess-{n}-{attempt}"))
                if attempt == 1:
                    sent.release()
                conn.getresponse().read()
        except OSError:
            pass  # closed at the end of the test
        finally:
            conn.close()

    threads = [threading.Thread(target=guess, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(clients):
            assert sent.acquire(timeout=60), "a guessing client never sent its first request"
        wait_for(lambda: len(checkpw.passwords) >= 3, timeout=DEADLINE, what="bcrypt to be busy with the guesses")
        started, before = time.monotonic(), len(checkpw.passwords)
        reply = request(server, headers=basic("prometheus", "right"), timeout=60)
        took = time.monotonic() - started
    finally:
        stop.set()
        server.shutdown()
        for thread in threads:
            thread.join(10)
    assert not any(thread.is_alive() for thread in threads)
    assert reply.status == 200 and reply.body == BODY
    # Negative when her check began before the recorder read the count.
    ahead = checkpw.passwords.index(b"right", before) - queued_at[0]
    assert ahead <= addresses, f"{ahead} bcrypt checks ran ahead of the first scrape ({took:.1f} s)"
    auth = server.watcher.current().auth
    wait_for(lambda: auth.pending == 0, timeout=DEADLINE, what="the guesses queued at shutdown to be dropped")


def test_the_bcrypt_queue_takes_one_check_from_each_address_in_turn(checkpw: RecordingCheckpw) -> None:
    auth = BasicAuth({"alice": bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=4))})
    checkpw.gate = threading.Event()
    done = threading.Semaphore(0)
    order: list[str] = []

    def submit(password: str, source: str) -> None:
        credential = auth.decide(basic("alice", password)["Authorization"])
        assert isinstance(credential, Credential)

        def verdict(ok: bool) -> None:
            order.append(password)
            done.release()

        auth.submit(credential, verdict, source)

    submit("first", "192.0.2.1")
    assert checkpw.entered.wait(DEADLINE)  # the thread holds "first": the rest queue behind it
    for n in range(5):
        submit(f"flood-v4-{n}", "192.0.2.1")
        submit(f"flood-v6-{n}", f"2001:db8::{n + 1}")  # one /64: one queue, whatever the address
    submit("right", "198.51.100.7")
    checkpw.gate.set()
    for _ in range(12):
        assert done.acquire(timeout=DEADLINE)
    assert order.index("right") <= 3, order
    assert [p for p in order if p.startswith("flood-v6")] == [f"flood-v6-{n}" for n in range(5)]


def test_one_bcrypt_check_per_distinct_credential_at_a_time(checkpw: RecordingCheckpw) -> None:
    auth = BasicAuth({"alice": bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4))})
    checkpw.gate = threading.Event()
    verdicts: list[bool] = []
    done = threading.Semaphore(0)

    def verdict(ok: bool) -> None:
        verdicts.append(ok)
        done.release()

    for header in [basic("alice", "pw")["Authorization"]] * 10 + [basic("alice", "other")["Authorization"]] * 5:
        pending = auth.decide(header)
        assert isinstance(pending, Credential)
        auth.submit(pending, verdict)
    checkpw.gate.set()
    for _ in range(15):
        assert done.acquire(timeout=DEADLINE)
    assert sorted(verdicts) == [False] * 5 + [True] * 10
    assert len(checkpw.hashes) == 2  # one per distinct credential


def test_failed_checks_are_cached_briefly(checkpw: RecordingCheckpw) -> None:
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4))
    auth = BasicAuth({"alice": hashed})
    assert not auth.check("alice", "wrong")
    assert not auth.check("alice", "wrong")
    assert not auth.check("nobody", "wrong")
    assert not auth.check("nobody", "wrong")
    assert len(checkpw.hashes) == 2  # once each
    assert auth.check("alice", "pw")  # a cached failure says nothing about another password
    expiring = BasicAuth({"alice": hashed}, failure_ttl=0.0)
    assert not expiring.check("alice", "wrong")
    assert not expiring.check("alice", "wrong")
    assert len(checkpw.hashes) == 5  # expired at once: checked again


def test_unknown_users_take_the_same_path_at_the_costs_of_real_users(checkpw: RecordingCheckpw) -> None:
    users = {
        "alice": bcrypt.hashpw(b"a", bcrypt.gensalt(rounds=4)),
        "bob": bcrypt.hashpw(b"b", bcrypt.gensalt(rounds=5)),
    }
    auth = BasicAuth(users)
    assert not auth.check("alice", "wrong")
    assert checkpw.hashes == [users["alice"]]  # a real user: one check against their own hash
    picked: dict[str, bytes] = {}
    for n in range(64):
        name = f"nobody{n}"
        assert not auth.check(name, "wrong")
        picked[name] = checkpw.hashes[-1]
    assert len(checkpw.hashes) == 65  # one bcrypt check per unknown user, as for a real one
    assert set(picked.values()) == set(users.values())  # both costs, so a fast answer names no one
    assert {int(h[4:6]) for h in picked.values()} == {4, 5}  # $2b$<cost>$
    assert not auth.check("nobody0", "again")
    assert checkpw.hashes[-1] == picked["nobody0"]  # the same name always costs the same


def test_bcrypt_runs_at_a_lower_priority_than_serving(checkpw: RecordingCheckpw) -> None:
    auth = BasicAuth({"alice": bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4))})
    assert not auth.check("alice", "wrong")
    assert checkpw.nice == [min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)]


def test_a_request_that_waited_for_bcrypt_still_gets_its_whole_write_deadline(
    serve: ServerFactory, tmp_path: Path, checkpw: RecordingCheckpw
) -> None:
    server = serve(write_config(tmp_path, users_yaml({"alice": ("a", 4)})), write_timeout=0.3)
    checkpw.gate = threading.Event()
    replies: list[int] = []
    waiting = threading.Thread(target=lambda: replies.append(request(server, headers=basic("alice", "x")).status))
    waiting.start()
    try:
        assert checkpw.entered.wait(DEADLINE)
        time.sleep(0.5)  # longer in the bcrypt queue than the write timeout
    finally:
        checkpw.gate.set()
        waiting.join(DEADLINE)
    assert replies == [401]


def test_a_reloaded_config_keeps_the_success_of_users_whose_hash_it_did_not_change(
    serve: ServerFactory, tmp_path: Path, checkpw: RecordingCheckpw
) -> None:
    """A rewritten web config (a certificate rotation, a header) must not send the scraper back to
    bcrypt, where a flood may be queued; a changed hash still drops the user's success at once."""
    alice, bob = bcrypt.hashpw(b"a", bcrypt.gensalt(rounds=4)), bcrypt.hashpw(b"b", bcrypt.gensalt(rounds=4))
    users = f"basic_auth_users:\n  alice: '{alice.decode()}'\n  bob: '{bob.decode()}'\n"
    path = write_config(tmp_path, users)
    server = serve(path, reload_interval=0.0)
    assert request(server, headers=basic("alice", "a")).status == 200
    assert request(server, headers=basic("bob", "b")).status == 200
    assert len(checkpw.passwords) == 2
    new_bob = bcrypt.hashpw(b"b2", bcrypt.gensalt(rounds=4))
    path.write_text(
        f"basic_auth_users:\n  alice: '{alice.decode()}'\n  bob: '{new_bob.decode()}'\n"
        "http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n"
    )
    wait_for(
        lambda: request(server, headers=basic("alice", "a")).headers.get("X-Content-Type-Options") == "nosniff",
        timeout=DEADLINE,
        what="the rewritten config to be applied",
    )
    assert len(checkpw.passwords) == 2  # alice's hash is unchanged: no bcrypt
    assert request(server, headers=basic("bob", "b")).status == 401  # bob's changed: his old password is out
    assert request(server, headers=basic("bob", "b2")).status == 200
