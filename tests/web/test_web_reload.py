"""Web config reload never weakens security silently: refusals, incomplete files, hostile files."""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from rnic_exporter.catalog.metrics import CONFIG_RELOAD_OK
from rnic_exporter.config.web_file import load_web_config
from rnic_exporter.errors import ConfigError
from rnic_exporter.sim import SimHost
from rnic_exporter.web import reload
from rnic_exporter.web.reload import WebConfigWatcher
from tests.support.processes import free_port, http_get, stop_process
from tests.support.serve import python_serve_args
from tests.support.wait import wait_for
from tests.support.web import (
    Certs,
    ServerFactory,
    basic,
    client_context,
    request,
    tls_config,
    users_config,
    write_config,
)

RELOAD_OK = CONFIG_RELOAD_OK.name
DEEP_LIST = "basic_auth_users: " + "[" * 3000 + "]" * 3000 + "\n"
NON_UTF8 = b"basic_auth_users:\n  alice: '\xff\xfe'\n"


def reload_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and "reload failed" in r.getMessage()]


@pytest.fixture
def with_auth(serve: ServerFactory, tmp_path: Path) -> tuple[object, Path]:
    path = write_config(tmp_path, users_config({"alice": "pw", "bob": "pw2"}))
    server = serve(path, reload_interval=0.0)  # every request checks the file: the worst case
    assert request(server).status == 401
    return server, path


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("", "empty"),
        ("# all commented out\n", "empty"),
        ("basic_auth_users:\n", "authentication off"),  # truncated after the first line
        ("http_server_config:\n  headers:\n    X-Frame-Options: deny\n", "authentication off"),
        (users_config({"alice": "pw"})[:-20], "not valid YAML"),  # truncated inside a quoted hash
        (users_config({"alice": "pw"}).replace("'", "")[:-20], "bcrypt"),  # ... an unquoted one
        (DEEP_LIST, "nested more than"),
    ],
    ids=[
        "empty",
        "comments-only",
        "truncated-after-key",
        "auth-removed",
        "truncated-in-quoted-hash",
        "truncated-in-hash",
        "deep-nesting",
    ],
)
def test_a_reload_that_would_drop_or_garble_auth_keeps_the_running_config(
    serve: ServerFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture, content: str, reason: str
) -> None:
    path = write_config(tmp_path, users_config({"alice": "pw"}))
    server = serve(path, reload_interval=0.0)
    path.write_text(content)
    with caplog.at_level(logging.ERROR):
        statuses = [request(server).status for _ in range(30)]  # each one checks the file
        assert request(server, headers=basic("alice", "pw")).status == 200
    assert statuses == [401] * 30
    assert not server.config_reload_ok
    errors = reload_errors(caplog)
    assert len(errors) == 1  # said once, not once per check
    assert reason in errors[0]
    assert str(path) in errors[0]


def test_a_non_utf8_byte_is_an_error_that_keeps_serving(
    serve: ServerFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_config(tmp_path, users_config({"alice": "pw"}))
    server = serve(path, reload_interval=0.0)
    path.write_bytes(NON_UTF8)
    with caplog.at_level(logging.ERROR):
        assert [request(server, headers=basic("alice", "pw")).status for _ in range(10)] == [200] * 10
    assert not server.config_reload_ok
    assert "not UTF-8: byte 0xff" in reload_errors(caplog)[0]


@pytest.mark.parametrize("content", [DEEP_LIST, "a: " + "{b: " * 3000 + "}" * 3000 + "\n"], ids=["list", "mapping"])
def test_deep_nesting_is_a_config_error_at_start(tmp_path: Path, content: str) -> None:
    with pytest.raises(ConfigError, match="nested more than 16 levels"):
        load_web_config(write_config(tmp_path, content))


def test_non_utf8_is_a_config_error_at_start(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_bytes(NON_UTF8)
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_web_config(path)


def test_a_fixed_file_clears_the_failure(serve: ServerFactory, tmp_path: Path) -> None:
    path = write_config(tmp_path, users_config({"alice": "pw"}))
    server = serve(path, reload_interval=0.0)
    path.write_text("")
    assert request(server).status == 401
    assert not server.config_reload_ok
    write_config(tmp_path, users_config({"alice": "new"}))
    assert request(server, headers=basic("alice", "new")).status == 200
    assert server.config_reload_ok


def test_turning_tls_off_is_refused_and_reported(serve: ServerFactory, confdir: Path, certs: Certs) -> None:
    server = serve(write_config(confdir, tls_config()), reload_interval=0.0)
    write_config(confdir, users_config({"alice": "pw"}))  # valid, with auth, but no TLS
    assert request(server, context=client_context(certs)).status == 200
    assert not server.config_reload_ok
    assert server.tls_enabled


@pytest.mark.parametrize(
    ("before", "after", "reason"),
    [
        ("  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: client.crt\n", "", "weakening"),
        (
            "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: client.crt\n",
            "  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: client.crt\n",
            "weakening",
        ),
        (
            "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: client.crt\n"
            "  client_allowed_sans: [scraper.example]\n",
            "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: client.crt\n",
            "client_allowed_sans",
        ),
    ],
    ids=["mtls-off", "mtls-optional", "sans-removed"],
)
def test_weakening_client_certificate_checks_is_refused(
    serve: ServerFactory,
    confdir: Path,
    certs: Certs,
    caplog: pytest.LogCaptureFixture,
    before: str,
    after: str,
    reason: str,
) -> None:
    server = serve(write_config(confdir, tls_config(extra_tls=before)))
    write_config(confdir, tls_config(extra_tls=after))
    with caplog.at_level(logging.ERROR):
        server.watcher.reload()
    assert reason in reload_errors(caplog)[0]
    with pytest.raises(OSError):
        request(server, context=client_context(certs))  # still no entry without a client certificate
    assert request(server, context=client_context(certs, with_cert=True)).status == 200


def test_non_atomic_rewrites_never_let_an_anonymous_scrape_through(with_auth: tuple[object, Path]) -> None:
    server, path = with_auth
    content = path.read_bytes()
    stop = threading.Event()
    statuses: list[int] = []

    def scrape() -> None:
        while not stop.is_set():
            statuses.append(request(server).status)  # type: ignore[arg-type]

    scrapers = [threading.Thread(target=scrape) for _ in range(4)]
    for scraper in scrapers:
        scraper.start()
    try:
        for _ in range(60):  # truncate, then write in two pieces, as `cat > file` can
            with path.open("wb") as rewrite:
                rewrite.flush()
                rewrite.write(content[: len(content) // 2])
                rewrite.flush()
                rewrite.write(content[len(content) // 2 :])
    finally:
        stop.set()
        for scraper in scrapers:
            scraper.join(10)
    assert statuses and set(statuses) == {401}


def test_a_change_is_applied_only_once_it_reads_the_same_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(reload, "_clock", lambda: now[0])
    path = write_config(tmp_path, users_config({"alice": "pw", "bob": "pw2"}))
    watcher = WebConfigWatcher(path, interval=1.0)

    def check_after_interval() -> set[str]:
        now[0] += 1.0
        watcher.maybe_reload()
        return set(watcher.security.config.basic_auth_users)

    assert check_after_interval() == {"alice", "bob"}
    write_config(tmp_path, users_config({"alice": "pw"}))  # a partial write, caught mid-way
    assert check_after_interval() == {"alice", "bob"}  # first seen: not applied yet
    write_config(tmp_path, users_config({"alice": "pw", "carol": "pw3"}))  # the write completes
    assert check_after_interval() == {"alice", "bob"}  # changed since: still waiting
    assert check_after_interval() == {"alice", "carol"}  # the same twice: applied
    assert watcher.ok


def test_serve_reports_a_refused_web_config_reload_in_its_metric(sim_host: SimHost, tmp_path: Path) -> None:
    web_config = write_config(tmp_path, users_config({"alice": "pw"}))
    port = free_port()
    proc = subprocess.Popen(
        python_serve_args(
            sim_host.root,
            port,
            *("--web.config.file", str(web_config), "--web.max-connections", "8", "--web.max-requests", "2"),
            *("--no-watch.netlink", "--no-watch.udev", "--no-collector.ethtool"),
            poll=0.2,
            state_dir="",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        alice = basic("alice", "pw")

        def reload_ok() -> str | None:
            status, _, body = http_get(url, headers=alice, timeout=1)
            line = next((x for x in body.decode().splitlines() if x.startswith(RELOAD_OK)), None)
            return line if status == 200 else None

        assert wait_for(reload_ok, timeout=20, what="first scrape") == f"{RELOAD_OK} 1.0"
        web_config.write_text("")  # what a non-atomic rewrite looks like for an instant, or a mistake
        wait_for(lambda: reload_ok() == f"{RELOAD_OK} 0.0", timeout=10, what="the refused reload in the metric")
        assert http_get(url, timeout=1)[0] == 401  # auth still on
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    finally:
        stop_process(proc)  # only when the test failed before the process ended
    assert proc.returncode == 0
    assert b"empty" in err and b"Traceback" not in err
