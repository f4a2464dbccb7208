"""Health checks through basic auth and TLS as probes send them, and the container's healthcheck command.

Over real sockets: the kubelet's httpGet sends no credentials and, with `scheme: HTTPS`, does not
check the certificate; the container's HEALTHCHECK reads the exporter's command line.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rnic_exporter.commands import healthcheck
from tests.support.serve import serve_args
from tests.support.web import (
    Certs,
    FakeProvider,
    ServerFactory,
    basic,
    client_context,
    request,
    tls_config,
    users_yaml,
    write_config,
)

REPO = Path(__file__).resolve().parents[2]


def kubelet_probes() -> list[str]:
    """The paths of the DaemonSet's httpGet probes."""
    docs = yaml.safe_load_all((REPO / "packaging/kubernetes/daemonset.yaml").read_text())
    (daemonset,) = [doc for doc in docs if doc and doc.get("kind") == "DaemonSet"]
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    return [container[probe]["httpGet"]["path"] for probe in ("livenessProbe", "readinessProbe")]


def unverified() -> ssl.SSLContext:
    """What the kubelet does with `scheme: HTTPS`: TLS without checking the certificate."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    return ctx


def test_the_daemonsets_probes_pass_with_basic_auth_over_plain_http(serve: ServerFactory, tmp_path: Path) -> None:
    server = serve(write_config(tmp_path, users_yaml({"alice": ("s3cret", 4)})))
    for path in kubelet_probes():
        reply = request(server, path)  # no credentials: a probe cannot send them
        assert (reply.status, reply.body) == (200, b"OK\n"), path
    assert request(server).status == 401
    assert request(server, "/").status == 401
    assert request(server, headers=basic("alice", "s3cret")).status == 200


def test_the_daemonsets_probes_pass_with_tls_and_basic_auth_over_https(
    serve: ServerFactory, confdir: Path, certs: Certs
) -> None:
    server = serve(write_config(confdir, tls_config({"alice": "s3cret"})))
    for path in kubelet_probes():
        assert request(server, path, context=unverified()).status == 200, path
    assert request(server, context=client_context(certs)).status == 401


def test_an_unhealthy_exporter_says_why_without_credentials(provider: FakeProvider, tmp_path: Path) -> None:
    from rnic_exporter.web.server import WebServer
    from tests.support.web import LANDING

    config = write_config(tmp_path, users_yaml({"alice": ("s3cret", 4)}))
    server = WebServer(["127.0.0.1:0"], "/metrics", provider, LANDING, config, health=lambda: (False, "no poll yet"))
    with server:
        reply = request(server, "/-/healthy")
    assert (reply.status, reply.body) == (503, b"no poll yet\n")


def installed_argv(server_address: tuple[str, int], *rest: str) -> list[str]:
    """The command line of the packaged exporter listening where `server_address` is."""
    host, port = server_address
    return ["/opt/rnic-exporter/bin/rnic-exporter", "serve", f"--web.listen-address={host}:{port}", *rest]


def test_healthcheck_follows_the_listen_address_and_the_web_configs_tls(serve: ServerFactory, confdir: Path) -> None:
    plain = serve()
    assert healthcheck.check(installed_argv(plain.bound[0]), confdir) is None
    tls = serve(write_config(confdir, tls_config({"alice": "s3cret"})))
    assert healthcheck.check(installed_argv(tls.bound[0], "--web.config.file", "web.yml"), confdir) is None
    # The same port without the web config: plain HTTP to a TLS port gets no answer.
    with pytest.raises((OSError, http.client.HTTPException)):
        healthcheck.check(installed_argv(tls.bound[0]), confdir)


def test_healthcheck_with_client_certificates_required_checks_the_connection(
    serve: ServerFactory, confdir: Path, sockets: list[socket.socket]
) -> None:
    text = tls_config(extra_tls="  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: client.crt\n")
    server = serve(write_config(confdir, text))
    assert healthcheck.check(installed_argv(server.bound[0], "--web.config.file=web.yml"), confdir) is None
    server.shutdown()
    with pytest.raises(OSError):
        healthcheck.check(installed_argv(server.bound[0], "--web.config.file=web.yml"), confdir)


def test_healthcheck_reads_the_exporters_command_line_and_exits_by_its_health(
    serve: ServerFactory, confdir: Path, tmp_path: Path
) -> None:
    server = serve(write_config(confdir, tls_config({"alice": "s3cret"})))
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cmdline").write_bytes(
        b"\0".join(a.encode() for a in installed_argv(server.bound[0], "--web.config.file", "web.yml"))
    )
    os.symlink(confdir, proc / "cwd")  # the exporter's working directory: the relative config path
    assert healthcheck.main(proc) == 0
    server.shutdown()
    assert healthcheck.main(proc) == 1


def dockerfile_healthcheck() -> list[str]:
    """The Dockerfile's HEALTHCHECK command."""
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    (line,) = [line for line in text.splitlines() if line.startswith("HEALTHCHECK")]
    return list(json.loads(line.split(" CMD ", 1)[1]))


def test_the_dockerfiles_healthcheck_passes_against_serve_with_tls_basic_auth_and_another_port(
    confdir: Path, tmp_path: Path
) -> None:
    from rnic_exporter.sim import SimHost
    from tests.support.processes import exporter, free_port, http_get

    host = SimHost.build(tmp_path / "sys", roce=1, gid_table_size=8)
    write_config(confdir, tls_config({"alice": "s3cret"}))
    port = free_port()
    args = serve_args(
        host.root, port, "--no-watch.netlink", "--no-watch.udev", "--no-collector.ethtool", poll=0.5, state_dir=""
    )
    command = [sys.executable if word == "python" else word for word in dockerfile_healthcheck()]
    with exporter(
        [*args, "--web.config.file", "web.yml"], ready_url=f"https://127.0.0.1:{port}/-/ready", context=unverified(),
        cwd=confdir, log_path=tmp_path / "exporter.log",
    ) as proc:  # fmt: skip
        assert http_get(f"https://127.0.0.1:{port}/metrics", context=unverified())[0] == 401
        done = subprocess.run([*command, str(proc.pid)], capture_output=True, text=True, timeout=30, check=False)
        assert (done.returncode, done.stderr) == (0, "")
    done = subprocess.run([*command, str(os.getpid())], capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 1  # pytest's own command line: the default address, where nothing listens
