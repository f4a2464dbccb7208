"""`rnic-exporter serve` for tests and benchmarks: its command line, one running until it answers, and the
figures read from what it serves."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rnic_exporter.catalog.metrics import POLLS
from rnic_exporter.config.serve import ServeConfig
from tests.support.exposition import first_value
from tests.support.processes import http_get, stop_process


def serve_args(
    sysfs: Path | str,
    listen: int | str,
    *extra: str,
    poll: float | None = None,
    state_dir: Path | str | None = None,
) -> list[str]:
    """`serve` reading `sysfs` and listening on `listen` (a port of 127.0.0.1, or `host:port`), then `extra`.

    `state_dir` "" keeps no inventory; None leaves the flag out (the tests' environment points it at tmp_path).
    """
    address = f"127.0.0.1:{listen}" if isinstance(listen, int) else listen
    args = ["serve", "--path.sysfs", str(sysfs), "--web.listen-address", address]
    if poll is not None:
        args += ["--poll.interval", str(poll)]
    if state_dir is not None:
        args += ["--state.dir", str(state_dir)]
    return [*args, *extra]


def python_serve_args(sysfs: Path | str, listen: int | str, *extra: str, **flags: Any) -> list[str]:
    """`serve_args` run as `python -m rnic_exporter` with this interpreter."""
    return [sys.executable, "-m", "rnic_exporter", *serve_args(sysfs, listen, *extra, **flags)]


def follow_netlink_args(root: Path) -> list[str]:
    """`rnic-exporter simulate` writing two RoCE RNICs (16-slot GID tables) under `root` and following the
    namespace's netlink, each holding its RoCE v2 GID as a job would: run it inside the namespace."""
    host = ["--roce", "2", "--gid-table-size", "16"]
    return [sys.executable, "-m", "rnic_exporter", "simulate", str(root), *host, "--follow-netlink", "--hold-gids"]


def start_demo(port: int) -> subprocess.Popen[str]:
    """`rnic-exporter demo` with the shortest story (6 RNICs, 1 s steps, 0.2 s polls) on 127.0.0.1:`port`, its
    output piped as text; the caller ends it (SIGINT, as a user's Ctrl-C) and stops it when a test failed."""
    args = ["demo", "--devices", "6", "--step.seconds", "1", "--poll.interval", "0.2"]
    return subprocess.Popen(
        [sys.executable, "-m", "rnic_exporter", *args, "--web.listen-address", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def get(url: str, headers: dict[str, str] | None = None) -> bytes:
    """The body of a 200 answer; OSError for anything else, as a refused connection."""
    status, _, body = http_get(url, headers=headers, timeout=10)
    if status != 200:
        raise OSError(f"{url} answered {status}")
    return body


def wait_up(url: str, proc: subprocess.Popen[bytes], ready: Callable[[bytes], bool]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args!r} exited with {proc.returncode}")
        try:
            if ready(get(url)):
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"{url} did not answer as expected within 60 s")


def polls(url: str) -> int:
    """The exporter's polls counter, from one scrape of `url`."""
    value = first_value(get(url), POLLS.name)
    if value is None:
        raise SystemExit(f"no {POLLS.name} in the exposition at {url}")
    return int(value)


def has_metrics(body: bytes) -> bool:
    """The exporter has something to serve; ours serves an empty body until its first poll is done."""
    return b"\n" in body


@contextmanager
def running(
    args: list[str],
    url: str,
    ready: Callable[[bytes], bool] = has_metrics,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(env) if env is not None else None, cwd=cwd
    )
    try:
        wait_up(url, proc, ready)
        yield proc
    finally:
        stop_process(proc)


@dataclass(frozen=True, slots=True)
class Ours:
    """Which rnic-exporter to run: an interpreter, and optionally a source tree that goes first on its path
    (so one script measures main and a branch's worktree alike). Run it in `cwd()`: `python -m` puts the
    working directory before PYTHONPATH, and a checkout there would win."""

    python: str = sys.executable
    src: Path | None = None
    flags: tuple[str, ...] = ()  # more `serve` flags, after the benchmark's own (--ours-flag)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.src is not None:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.src), env.get("PYTHONPATH")]))
        return env

    def cwd(self) -> Path:
        return self.src or Path.cwd()

    def args(self, sysfs: Path, port: int, state_dir: Path, *extra: str) -> list[str]:
        """`rnic-exporter serve` as a user runs it, but with its state in the benchmark's directory."""
        return [
            self.python,
            "-m",
            "rnic_exporter",
            *serve_args(sysfs, port, "--log.level", "warn", *extra, *self.flags, state_dir=state_dir),
        ]

    def describe(self) -> str:
        """Where the package that will run comes from, and its commit when it is a git checkout."""
        where = subprocess.run(
            [self.python, "-c", "import rnic_exporter as r; print(r.__file__)"],
            capture_output=True,
            text=True,
            env=self.env(),
            cwd=self.cwd(),
            check=True,
        ).stdout.strip()
        package_root = Path(where).resolve().parents[1]
        commit = subprocess.run(
            ["git", "-C", str(package_root), "log", "-1", "--format=%h %s"], capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(package_root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        state = " (uncommitted changes)" if dirty else ""
        flags = f"; serve flags: {' '.join(self.flags)}" if self.flags else ""
        return f"{package_root} @ {commit[:72] or 'not a git checkout'}{state}{flags}"


def ours_args(sysfs: Path, port: int, state_dir: Path, *extra: str) -> list[str]:
    """`rnic-exporter serve` from this checkout with the running interpreter."""
    return Ours().args(sysfs, port, state_dir, *extra)


def sim_serve_config(sysfs: Path, port: int, **changes: Any) -> ServeConfig:
    """`serve`'s settings over a simulated host's tree on 127.0.0.1:`port`: polls every 0.5 s, no
    watchers, no ethtool link modes, no inventory; `changes` replace any of them."""
    config = ServeConfig(
        sysfs=sysfs,
        listen=(f"127.0.0.1:{port}",),
        poll_interval_s=0.5,
        state_dir=None,
        watch_netlink=False,
        watch_udev=False,
        ethtool=False,
    )
    return replace(config, **changes)


@contextmanager
def serving(config: ServeConfig, **seams: Any) -> Iterator[None]:
    """`serve.run(config, **seams)` on a thread of this process (`seams`: scan=, wire=) for the block;
    stopped and joined after it, and it must have ended."""
    from rnic_exporter.daemon.serve import run

    stop = threading.Event()
    daemon = threading.Thread(target=run, args=(config,), kwargs={"stop": stop, **seams})
    daemon.start()
    try:
        yield
    finally:
        stop.set()
        daemon.join(30)
    assert not daemon.is_alive(), "serve did not stop within 30 s"
