"""Real processes for end-to-end tests: the exporter itself and a Debian Prometheus server."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

from tests.support.wait import wait_for


def pid_alive(pid: int) -> bool:
    """Whether `pid` exists (a process of another user still counts: EPERM means it is there)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def require_binary(name: str) -> str:
    """The path of a binary the suite needs; a missing one is a broken install, never a skip."""
    path = shutil.which(name)
    if path is None:
        raise AssertionError(f"{name} is not installed; run `bash scripts/test`, which installs it with apt-get")
    return path


def venv_tool(name: str) -> str:
    """A console script of a test dependency (pip package), next to this interpreter."""
    path = Path(sys.executable).with_name(name)
    if not path.is_file():
        raise AssertionError(f"{name} is not installed; run `bash scripts/test` (it is in the test extra)")
    return str(path)


def http_get(
    url: str, *, headers: dict[str, str] | None = None, context: ssl.SSLContext | None = None, timeout: float = 5.0
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def stop_process(proc: subprocess.Popen[Any], timeout: float = 10) -> None:
    """SIGTERM (the clean stop under test), SIGKILL when it does not end within `timeout`."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def exporter(
    args: Sequence[str],
    *,
    ready_url: str,
    env: dict[str, str] | None = None,
    context: ssl.SSLContext | None = None,
    headers: dict[str, str] | None = None,
    log_path: Path | None = None,
    cwd: Path | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """`rnic-exporter <args>` in a subprocess, waited for until `ready_url` answers 200."""
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "rnic_exporter", *args],
        stdout=log,
        stderr=log,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(
                    f"exporter exited with {proc.returncode}" + (f": {log_path.read_text()}" if log_path else "")
                )
            return http_get(ready_url, context=context, headers=headers, timeout=1)[0] == 200

        wait_for(ready, timeout=20, what=f"exporter at {ready_url}")
        yield proc
    finally:
        stop_process(proc)
        if log_path:
            assert not isinstance(log, int)
            log.close()


class _DebianDaemon:
    """A Debian Prometheus-family server on a free port, its config as JSON (which is YAML) and its
    data and log under `workdir`; started on enter, ready when `/-/ready` answers, stopped on exit."""

    binary = ""
    config_name = ""
    storage_flag = ""
    extra_flags: tuple[str, ...] = ()

    def __init__(self, workdir: Path, config: dict[str, Any]) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_path = workdir / self.config_name
        self.config_path.write_text(json.dumps(config))
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / f"{self.binary}.log"

    def __enter__(self) -> Self:
        binary = require_binary(self.binary)
        self._log = open(self.log_path, "wb")  # closed in __exit__
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={self.config_path}",
                f"{self.storage_flag}={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                *self.extra_flags,
                "--log.level=warn",
            ],
            stdout=self._log,
            stderr=self._log,
        )
        wait_for(self._ready, timeout=30, what=f"{self.binary} /-/ready")
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.binary} exited: {self.log_path.read_text()}")
        return http_get(f"{self.url}/-/ready", timeout=1)[0] == 200

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout=15)
        self._log.close()


class Prometheus(_DebianDaemon):
    """A Debian `prometheus` server on a free port with a storage dir under `workdir`."""

    binary = "prometheus"
    config_name = "prometheus.yml"
    storage_flag = "--storage.tsdb.path"
    extra_flags = ("--web.enable-lifecycle",)

    def __init__(self, workdir: Path, config: dict[str, Any], rule_files: Sequence[Path] = ()) -> None:
        cfg = dict(config)
        if rule_files:
            cfg["rule_files"] = [str(p) for p in rule_files]
        super().__init__(workdir, cfg)

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        status, _, body = http_get(url)
        data = json.loads(body)
        if status != 200 or data.get("status") != "success":
            raise AssertionError(f"query {promql!r} failed: {status} {body[:300]!r}")
        result: list[dict[str, Any]] = data["data"]["result"]
        return result

    def value(self, promql: str) -> float | None:
        result = self.query(promql)
        if not result:
            return None
        if len(result) != 1:
            raise AssertionError(f"{promql!r} returned {len(result)} series: {result}")
        return float(result[0]["value"][1])

    def wait_value(self, promql: str, timeout: float = 20) -> float:
        """The single value of `promql` once it has one (a scrape must have happened first)."""
        holder: list[float] = []

        def probe() -> bool:
            v = self.value(promql)
            if v is None:
                return False
            holder.append(v)
            return True

        wait_for(probe, timeout=timeout, what=f"a value for {promql!r}")
        return holder[-1]


class Alertmanager(_DebianDaemon):
    """A Debian `prometheus-alertmanager` on a free port, alone (no cluster gossip port)."""

    binary = "prometheus-alertmanager"
    config_name = "alertmanager.yml"
    storage_flag = "--storage.path"
    # An empty --cluster.listen-address turns high availability off: no port 9094, no peers.
    extra_flags = ("--cluster.listen-address=",)

    def post_alerts(self, alerts: list[dict[str, Any]]) -> None:
        """Push alerts as Prometheus does (API v2)."""
        request = urllib.request.Request(
            f"{self.url}/api/v2/alerts",
            data=json.dumps(alerts).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            if response.status != 200:
                raise AssertionError(f"alertmanager refused alerts: {response.status}")

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert Alertmanager holds, with `status.state` and `status.inhibitedBy`."""
        status, _, body = http_get(f"{self.url}/api/v2/alerts")
        if status != 200:
            raise AssertionError(f"GET /api/v2/alerts: {status} {body[:300]!r}")
        result: list[dict[str, Any]] = json.loads(body)
        return result
