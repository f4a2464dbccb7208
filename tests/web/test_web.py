"""WebServer and web config, exercised over real sockets on 127.0.0.1 with real HTTP(S) clients."""

from __future__ import annotations

import http.client
import logging
import re
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import bcrypt
import pytest

from rnic_exporter.config.web_file import load_web_config
from rnic_exporter.errors import ConfigError
from rnic_exporter.sim import SimHost
from rnic_exporter.web.auth import BasicAuth, parse_basic_authorization
from rnic_exporter.web.server import WebServer, parse_listen_address
from rnic_exporter.web.tls import build_ssl_context
from tests.support.tls import self_signed
from tests.support.wait import wait_for
from tests.support.web import (
    BODY,
    CONTENT_TYPE,
    DEADLINE,
    LANDING,
    Certs,
    FakeProvider,
    Reply,
    ServerFactory,
    basic,
    bcrypt_hash,
    client_context,
    read_until_closed,
    request,
    tls_config,
    users_config,
    write_config,
)

# -- plain HTTP routes ------------------------------------------------------------------------


def test_landing_page_names_the_exporter_and_links_escaped(serve: ServerFactory) -> None:
    reply = request(serve(), "/")
    assert reply.status == 200
    assert reply.headers["Content-Type"] == "text/html; charset=utf-8"
    page = reply.body.decode()
    assert "<h1>rnic-exporter &lt;test&gt;</h1>" in page
    assert "RDMA NICs &amp; their health" in page
    assert "0.1.0" in page
    assert '<a href="/metrics">Metrics</a>' in page
    assert '<a href="/debug?x=1&amp;y=2">Debug &lt;info&gt;</a>' in page


def test_telemetry_path_passes_negotiation_headers_to_the_provider(
    serve: ServerFactory, provider: FakeProvider
) -> None:
    accept = "application/openmetrics-text; version=1.0.0"
    reply = request(serve(), headers={"Accept": accept, "Accept-Encoding": "gzip"})
    assert reply.status == 200
    assert reply.body == BODY
    assert reply.headers["Content-Type"] == CONTENT_TYPE
    assert provider.calls == [(accept, "gzip")]


def test_query_string_does_not_change_the_route(serve: ServerFactory) -> None:
    assert request(serve(), "/metrics?name[]=rdma_up").body == BODY


def test_head_sends_headers_without_body(serve: ServerFactory) -> None:
    server = serve()
    for path in ("/metrics", "/", "/-/healthy"):
        get, head = request(server, path), request(server, path, method="HEAD")
        assert head.status == 200
        assert head.body == b""
        assert head.headers["Content-Length"] == str(len(get.body))


def test_nothing_to_serve_yet_is_503_with_the_reason_and_a_retry(serve: ServerFactory, provider: FakeProvider) -> None:
    provider.not_ready = "no poll has completed yet (waited 2s); retry in a moment"
    reply = request(serve())
    assert reply.status == 503 and reply.headers["Retry-After"] == "1"
    assert reply.body == b"no poll has completed yet (waited 2s); retry in a moment\n"


def test_unknown_path_is_404(serve: ServerFactory) -> None:
    assert request(serve(), "/nope").status == 404


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "OPTIONS"])
def test_other_methods_are_405_with_allow(serve: ServerFactory, method: str) -> None:
    reply = request(serve(), method=method, body=b"x=1")
    assert reply.status == 405
    assert reply.headers["Allow"] == "GET, HEAD"


def test_unknown_path_with_other_method_is_still_404(serve: ServerFactory) -> None:
    assert request(serve(), "/nope", method="POST").status == 404


def test_keep_alive_serves_several_requests_on_one_connection(serve: ServerFactory) -> None:
    host, port = serve().bound[0]
    conn = http.client.HTTPConnection(host, port, timeout=DEADLINE)
    try:
        for _ in range(3):
            conn.request("GET", "/metrics")
            response = conn.getresponse()
            assert (response.status, response.read()) == (200, BODY)
    finally:
        conn.close()


# -- health -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/-/healthy", "/-/ready"])
def test_health_without_a_check_is_ok(serve: ServerFactory, path: str) -> None:
    reply = request(serve(), path)
    assert (reply.status, reply.body) == (200, b"OK\n")


@pytest.mark.parametrize("path", ["/-/healthy", "/-/ready"])
def test_health_reports_the_checks_verdict(serve: ServerFactory, path: str) -> None:
    verdict = [(True, "fine")]
    server = serve(health=lambda: verdict[0])
    assert request(server, path).status == 200
    verdict[0] = (False, "sysfs unreadable: /sys/class/infiniband")
    reply = request(server, path)
    assert reply.status == 503
    assert reply.body == b"sysfs unreadable: /sys/class/infiniband\n"


def test_health_check_that_raises_is_503(serve: ServerFactory) -> None:
    def broken() -> tuple[bool, str]:
        raise RuntimeError("poller died")

    reply = request(serve(health=broken), "/-/ready")
    assert reply.status == 503
    assert b"poller died" in reply.body


# -- headers from the web config --------------------------------------------------------------


def test_configured_headers_are_on_every_response(serve: ServerFactory, tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"
        "    Content-Security-Policy: \"default-src 'none'\"\n" + users_config({"alice": "pw"}),
    )
    server = serve(config)
    replies = [
        request(server, "/", headers=basic("alice", "pw")),
        request(server, "/metrics", headers=basic("alice", "pw")),
        request(server, "/nope", headers=basic("alice", "pw")),
        request(server, "/", method="POST", headers=basic("alice", "pw")),
        request(server, "/"),  # 401
    ]
    assert [reply.status for reply in replies] == [200, 200, 404, 405, 401]
    for reply in replies:
        assert reply.headers["X-Frame-Options"] == "deny"
        assert reply.headers["Content-Security-Policy"] == "default-src 'none'"


# -- TLS, basic auth, mTLS --------------------------------------------------------------------


def test_https_with_basic_auth(serve: ServerFactory, confdir: Path, certs: Certs) -> None:
    server = serve(write_config(confdir, tls_config({"alice": "s3cret"})))
    ctx = client_context(certs)
    assert server.tls_enabled
    ok = request(server, context=ctx, headers=basic("alice", "s3cret"))
    assert (ok.status, ok.body) == (200, BODY)
    for headers in ({}, basic("alice", "wrong"), basic("mallory", "s3cret"), {"Authorization": "Bearer s3cret"}):
        denied = request(server, context=ctx, headers=headers)
        assert denied.status == 401
        assert denied.headers["WWW-Authenticate"] == 'Basic realm="rnic-exporter"'
    assert request(server, "/", context=ctx).status == 401  # auth covers every route but the health checks


def test_plain_http_client_on_the_tls_port_gets_no_response(serve: ServerFactory, confdir: Path) -> None:
    server = serve(write_config(confdir, tls_config()))
    with pytest.raises((OSError, http.client.HTTPException)):
        request(server)


def test_mtls_rejects_a_client_without_certificate(serve: ServerFactory, confdir: Path, certs: Certs) -> None:
    extra = "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: client.crt\n"
    server = serve(write_config(confdir, tls_config(extra_tls=extra)))
    with pytest.raises((OSError, http.client.HTTPException)):
        request(server, context=client_context(certs))
    assert request(server, context=client_context(certs, with_cert=True)).status == 200


@pytest.mark.parametrize(("sans", "allowed"), [("[scraper.example]", True), ("[other.example]", False)])
def test_mtls_client_allowed_sans(serve: ServerFactory, confdir: Path, certs: Certs, sans: str, allowed: bool) -> None:
    extra = (
        f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: client.crt\n  client_allowed_sans: {sans}\n"
    )
    server = serve(write_config(confdir, tls_config(extra_tls=extra)))
    ctx = client_context(certs, with_cert=True)
    if allowed:
        assert request(server, context=ctx).status == 200
    else:
        with pytest.raises((OSError, http.client.HTTPException)):
            request(server, context=ctx)


# -- one silent client must not stall anyone else ---------------------------------------------


def test_idle_tcp_client_does_not_stall_https_scrapes(serve: ServerFactory, confdir: Path, certs: Certs) -> None:
    server = serve(write_config(confdir, tls_config()))
    with socket.create_connection(server.bound[0]):  # connects, never starts the handshake
        started = time.monotonic()
        reply = request(server, context=client_context(certs), timeout=DEADLINE)
        assert reply.status == 200
        assert time.monotonic() - started < DEADLINE


def test_half_request_line_does_not_stall_http_scrapes(serve: ServerFactory) -> None:
    server = serve()
    with socket.create_connection(server.bound[0]) as slow:
        slow.sendall(b"GET /metr")
        started = time.monotonic()
        assert request(server, timeout=DEADLINE).status == 200
        assert time.monotonic() - started < DEADLINE


def test_silent_tls_client_is_dropped_after_the_handshake_timeout(serve: ServerFactory, confdir: Path) -> None:
    server = serve(write_config(confdir, tls_config()), tls_handshake_timeout=0.2)
    with socket.create_connection(server.bound[0]) as idle:
        assert read_until_closed(idle, timeout=DEADLINE) == b""


def test_silent_http_client_is_dropped_after_the_request_timeout(serve: ServerFactory) -> None:
    server = serve(request_timeout=0.2)
    with socket.create_connection(server.bound[0]) as slow:
        slow.sendall(b"GET /metr")
        assert read_until_closed(slow, timeout=DEADLINE) == b""


# -- concurrency cap --------------------------------------------------------------------------


def test_scrapes_over_the_cap_get_503_at_once(serve: ServerFactory, provider: FakeProvider) -> None:
    provider.gate = threading.Event()
    server = serve(max_requests=1)
    first: list[Reply] = []
    blocked = threading.Thread(target=lambda: first.append(request(server, timeout=10)))
    blocked.start()
    try:
        assert provider.entered.wait(DEADLINE), "first scrape never reached the provider"
        second = request(server)
        assert second.status == 503
        assert b"limit 1" in second.body
        assert request(server, "/").status == 200  # only scrapes are capped
    finally:
        provider.gate.set()
        blocked.join(DEADLINE)
    assert first[0].status == 200
    # The slot is given back once the worker has finished with the reply, which can be just after
    # the client has read it: wait for it (a slot never given back fails at the deadline).
    wait_for(lambda: request(server).status == 200, timeout=DEADLINE, what="the scrape slot given back")


# -- listening --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        (":9100", ("", 9100)),
        ("0.0.0.0:9100", ("0.0.0.0", 9100)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("[::1]:9100", ("::1", 9100)),
        ("[::]:9100", ("::", 9100)),
        ("localhost:65535", ("localhost", 65535)),
    ],
)
def test_parse_listen_address(address: str, expected: tuple[str, int]) -> None:
    assert parse_listen_address(address) == expected


@pytest.mark.parametrize("address", ["9100", "::1:9100", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:http"])
def test_bad_listen_address_is_a_config_error(address: str) -> None:
    with pytest.raises(ConfigError, match="listen address"):
        parse_listen_address(address)


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return int(probe.getsockname()[1])


def test_port_in_use_is_a_config_error_from_start(provider: FakeProvider) -> None:
    first = free_port()
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        server = WebServer([f"127.0.0.1:{first}", f"127.0.0.1:{port}"], "/metrics", provider, LANDING)
        with pytest.raises(ConfigError, match=rf"127\.0\.0\.1:{port}.*[Aa]ddress already in use"):
            server.start()
        server.shutdown()  # a no-op, but callers may do it unconditionally
    # The address that did bind before the failure was released again.
    socket.create_server(("127.0.0.1", first)).close()


def test_unresolvable_host_is_a_config_error(provider: FakeProvider) -> None:
    server = WebServer(["no-such-host.invalid:0"], "/metrics", provider, LANDING)
    with pytest.raises(ConfigError, match=re.escape("no-such-host.invalid")):
        server.start()


@pytest.mark.skipif(not socket.has_dualstack_ipv6(), reason="no IPv6 on this host")
def test_port_only_listens_on_ipv4_and_ipv6(provider: FakeProvider) -> None:
    with WebServer([":0"], "/metrics", provider, LANDING) as server:
        host, port = server.bound[0]
        assert host == "::"
        for loopback in ("127.0.0.1", "::1"):
            conn = http.client.HTTPConnection(loopback, port, timeout=DEADLINE)
            conn.request("GET", "/metrics")
            assert conn.getresponse().status == 200
            conn.close()


@pytest.mark.parametrize("path", ["metrics", "/", "/-/healthy"])
def test_bad_telemetry_path_is_a_config_error(provider: FakeProvider, path: str) -> None:
    with pytest.raises(ConfigError, match="telemetry path"):
        WebServer(["127.0.0.1:0"], path, provider, LANDING)


def test_shutdown_closes_keep_alive_connections_promptly(serve: ServerFactory) -> None:
    server = serve()
    host, port = server.bound[0]
    keep_alive = http.client.HTTPConnection(host, port, timeout=DEADLINE)
    try:
        keep_alive.request("GET", "/metrics")
        response = keep_alive.getresponse()
        assert (response.status, response.read()) == (200, BODY)
        assert keep_alive.sock is not None, "the connection should still be open for the next request"
        started = time.monotonic()
        server.shutdown()
        assert time.monotonic() - started < 1.0
        assert read_until_closed(keep_alive.sock, timeout=DEADLINE) == b""
    finally:
        keep_alive.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, port), timeout=DEADLINE)


# -- web config parsing -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key_path", "reason"),
    [
        ("surprise: 1\n", "surprise", "unknown key"),
        (tls_config(extra_tls="  client_cert_file: x\n"), "tls_server_config.client_cert_file", "unknown key"),
        (tls_config(extra_tls="  client_auth_type: Sometimes\n"), "tls_server_config.client_auth_type", "Sometimes"),
        (tls_config(extra_tls="  min_version: TLS14\n"), "tls_server_config.min_version", "TLS14"),
        (
            tls_config(extra_tls="  min_version: TLS13\n  max_version: TLS12\n"),
            "tls_server_config.min_version",
            "above",
        ),
        (
            "tls_server_config:\n  cert_file: gone.crt\n  key_file: server.key\n",
            "tls_server_config.cert_file",
            "gone.crt",
        ),
        ("tls_server_config:\n  cert_file: server.crt\n", "tls_server_config.key_file", "missing"),
        ("basic_auth_users:\n  alice: hunter2\n", "basic_auth_users.alice", "bcrypt"),
        ("basic_auth_users:\n  alice: [a]\n", "basic_auth_users.alice", "string"),
        ("basic_auth_users: [alice]\n", "basic_auth_users", "mapping"),
        (
            "http_server_config:\n  headers:\n    X-Powered-By: me\n",
            "http_server_config.headers.X-Powered-By",
            "cannot",
        ),
        ("http_server_config:\n  headers:\n    X-Frame-Options: allow\n", "X-Frame-Options", "deny"),
        (
            'http_server_config:\n  headers:\n    Content-Security-Policy: "a\\nb"\n',
            "Content-Security-Policy",
            "control",
        ),
        ("http_server_config:\n  http2: maybe\n", "http_server_config.http2", "true or false"),
        (tls_config(extra_tls="  client_auth_type: RequireAnyClientCert\n"), "client_auth_type", "not supported"),
        (
            tls_config(extra_tls="  client_auth_type: RequireAndVerifyClientCert\n"),
            "tls_server_config.client_ca_file",
            "required",
        ),
        (tls_config(extra_tls="  client_ca_file: client.crt\n"), "tls_server_config.client_ca_file", "NoClientCert"),
        (tls_config(extra_tls="  client_allowed_sans: [a]\n"), "tls_server_config.client_allowed_sans", "requires"),
        (tls_config(extra_tls="  cipher_suites: [TLS_AES_128_GCM_SHA256]\n"), "cipher_suites", "not supported"),
        ("rate_limit:\n  interval: 1s\n  burst: 5\n", "rate_limit", "not implemented"),
        ("basic_auth_users:\n  alice: x\n  alice: y\n", "duplicate key", "alice"),
        ("basic_auth_users: {alice: [\n", "not valid YAML", "web.yml"),
        # A NUL byte in a file's path: open() raises ValueError, which escaped as a traceback.
        (
            'tls_server_config:\n  cert_file: "server\\0.crt"\n  key_file: server.key\n',
            "tls_server_config.cert_file",
            "NUL byte at offset 6",
        ),
        (
            'tls_server_config:\n  cert_file: server.crt\n  key_file: "\\0"\n',
            "tls_server_config.key_file",
            "NUL byte",
        ),
        (
            tls_config(extra_tls='  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: "ca\\0"\n'),
            "tls_server_config.client_ca_file",
            "NUL byte",
        ),
    ],
)
def test_config_errors_name_file_key_and_reason(confdir: Path, text: str, key_path: str, reason: str) -> None:
    path = write_config(confdir, text)
    with pytest.raises(ConfigError) as caught:
        load_web_config(path)
    message = str(caught.value)
    assert str(path) in message
    assert key_path in message
    assert reason in message


def test_empty_config_means_plain_http_without_auth(tmp_path: Path) -> None:
    config = load_web_config(write_config(tmp_path, ""))
    assert config.tls_server_config is None
    assert not config.basic_auth_users
    assert build_ssl_context(config) is None


def test_relative_paths_resolve_against_the_config_directory(
    confdir: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_config(confdir, tls_config(extra_tls="  min_version: TLS13\n"))
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    tls = load_web_config(path).tls_server_config
    assert tls is not None
    assert (tls.cert_file, tls.key_file, tls.min_version) == (confdir / "server.crt", confdir / "server.key", "TLS13")


def test_unusable_key_pair_is_a_config_error(confdir: Path, provider: FakeProvider) -> None:
    shutil.copy(confdir / "client.key", confdir / "server.key")  # a key that does not match the cert
    config = write_config(confdir, tls_config())
    with pytest.raises(ConfigError, match=r"tls_server_config\.cert_file.*matching"):
        WebServer(["127.0.0.1:0"], "/metrics", provider, LANDING, config)


def test_unreadable_web_config_is_a_config_error(tmp_path: Path, provider: FakeProvider) -> None:
    with pytest.raises(ConfigError, match=re.escape("missing.yml")):
        WebServer(["127.0.0.1:0"], "/metrics", provider, LANDING, tmp_path / "missing.yml")


# -- basic auth internals ---------------------------------------------------------------------


class CountingCheckpw:
    def __init__(self) -> None:
        self.calls = 0
        self._real = bcrypt.checkpw

    def __call__(self, password: bytes, hashed: bytes) -> bool:
        self.calls += 1
        return self._real(password, hashed)


@pytest.fixture
def checkpw(monkeypatch: pytest.MonkeyPatch) -> CountingCheckpw:
    counter = CountingCheckpw()
    monkeypatch.setattr(bcrypt, "checkpw", counter)
    return counter


def test_successful_checks_are_cached_without_the_plaintext(checkpw: CountingCheckpw) -> None:
    auth = BasicAuth({"alice": bcrypt_hash("s3cret").encode()})
    assert auth.check("alice", "s3cret")
    assert auth.check("alice", "s3cret")
    assert checkpw.calls == 1
    assert not any(b"s3cret" in value for value in auth._successes.values())
    assert not auth.check("alice", "wrong")  # a cached success does not vouch for another password
    assert checkpw.calls == 2


def test_unknown_user_still_costs_a_bcrypt_check(checkpw: CountingCheckpw) -> None:
    auth = BasicAuth({"alice": bcrypt_hash("s3cret").encode()})
    assert not auth.check("mallory", "s3cret")  # even with a real user's password
    assert checkpw.calls == 1


def test_overlong_password_is_rejected_not_an_error() -> None:
    assert not BasicAuth({"alice": bcrypt_hash("s3cret").encode()}).check("alice", "x" * 100)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("Basic YWxpY2U6czNjcjp0", ("alice", b"s3cr:t")),
        ("basic YWxpY2U6", ("alice", b"")),
        ("Basic YWxpY2U=", None),  # no colon
        ("Basic !!!", None),
        ("Bearer YWxpY2U6eA==", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_basic_authorization(header: str | None, expected: tuple[str, bytes] | None) -> None:
    assert parse_basic_authorization(header) == expected


# -- reload -----------------------------------------------------------------------------------


def test_reload_applies_new_users(serve: ServerFactory, tmp_path: Path) -> None:
    config = write_config(tmp_path, users_config({"alice": "old"}))
    server = serve(config)
    assert request(server, headers=basic("alice", "old")).status == 200
    write_config(tmp_path, users_config({"alice": "new"}))
    server.watcher.reload()
    assert request(server, headers=basic("alice", "old")).status == 401
    assert request(server, headers=basic("alice", "new")).status == 200


def test_broken_file_on_reload_keeps_the_old_config(
    serve: ServerFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = write_config(tmp_path, users_config({"alice": "old"}))
    server = serve(config)
    write_config(tmp_path, "basic_auth_users:\n  alice: not-a-hash\n")
    with caplog.at_level(logging.ERROR, logger="rnic_exporter.web.server"):
        server.watcher.reload()
    assert any("basic_auth_users.alice" in record.getMessage() for record in caplog.records)
    assert request(server, headers=basic("alice", "old")).status == 200


def test_changed_file_is_picked_up_without_an_explicit_reload(serve: ServerFactory, tmp_path: Path) -> None:
    config = write_config(tmp_path, users_config({"alice": "old"}))
    server = serve(config, reload_interval=0.0)
    assert request(server, headers=basic("alice", "old")).status == 200
    write_config(tmp_path, users_config({"alice": "new"}))  # same size; maybe the same mtime
    assert request(server, headers=basic("alice", "new")).status == 200


def test_rotated_certificate_is_served_to_new_connections(serve: ServerFactory, confdir: Path, certs: Certs) -> None:
    server = serve(write_config(confdir, tls_config()), reload_interval=0.0)
    assert request(server, context=client_context(certs)).status == 200
    self_signed(confdir, "server", cn="server")  # rotate in place: new key and cert
    with pytest.raises(ssl.SSLCertVerificationError):
        request(server, context=client_context(certs))  # the client still trusts only the old one
    assert request(server, context=ssl.create_default_context(cafile=str(confdir / "server.crt"))).status == 200


def test_reload_that_would_turn_tls_off_is_refused(
    serve: ServerFactory, confdir: Path, certs: Certs, caplog: pytest.LogCaptureFixture
) -> None:
    config = write_config(confdir, tls_config())
    server = serve(config)
    write_config(confdir, "")
    with caplog.at_level(logging.ERROR, logger="rnic_exporter.web.server"):
        server.watcher.reload()
    assert any("restart" in record.getMessage() for record in caplog.records)
    assert request(server, context=client_context(certs)).status == 200


def test_a_nul_byte_in_a_tls_file_path_stops_serve_with_one_line(tmp_path: Path) -> None:
    config = write_config(tmp_path, 'tls_server_config:\n  cert_file: "server\\0.crt"\n  key_file: server.key\n')
    sysfs = SimHost.build(tmp_path / "sys", roce=1, infiniband=0, gid_table_size=8).root
    state = tmp_path / "state"
    serve = ["serve", "--path.sysfs", str(sysfs), "--state.dir", str(state), "--web.config.file", str(config)]
    result = subprocess.run(
        [sys.executable, "-m", "rnic_exporter", *serve, "--web.listen-address", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "NUL byte" in lines[0] and "Traceback" not in result.stderr, result.stderr
