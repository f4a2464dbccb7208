"""Helpers shared by the benchmarks: processes, CPU and memory from /proc, HTTP load with wrk."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rnic_exporter.catalog import POLLS

CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process (all threads), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mb(pid: int) -> float:
    m = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(m[1]) / 1024 if m else float("nan")


def get(url: str, headers: dict[str, str] | None = None) -> bytes:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
        body: bytes = r.read()
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
    prefix = f"{POLLS.name} ".encode()
    for line in get(url).splitlines():
        if line.startswith(prefix):
            return int(float(line.split()[1]))
    raise SystemExit(f"no {POLLS.name} in the exposition at {url}")


def has_metrics(body: bytes) -> bool:
    """The exporter has something to serve; ours serves an empty body until its first poll is done."""
    return b"\n" in body


@contextmanager
def running(args: list[str], url: str,
            ready: Callable[[bytes], bool] = has_metrics) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_up(url, proc, ready)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def require(binary: str, package: str) -> str:
    path = shutil.which(binary)
    if path is None:
        raise SystemExit(f"{binary} missing: apt-get install {package}")
    return path


def wrk_latency(url: str, connections: int, seconds: int) -> tuple[float, float]:
    """(p50, p99) in milliseconds over `seconds` of closed-loop keep-alive load."""
    out = subprocess.run([require("wrk", "wrk"), f"-t{min(2, connections)}", f"-c{connections}", f"-d{seconds}s",
                          "--latency", url], capture_output=True, text=True, check=True).stdout

    def pct(p: str) -> float:
        m = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        if m is None:
            raise SystemExit(f"could not read the {p}th percentile from wrk:\n{out}")
        return float(m[1]) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m[2]]

    return pct("50"), pct("99")


def ours_args(sysfs: Path, port: int, state_dir: Path, *extra: str) -> list[str]:
    """`rnic-exporter serve` as a user runs it, but with its state in the benchmark's directory."""
    return [sys.executable, "-m", "rnic_exporter", "serve", "--path.sysfs", str(sysfs),
            "--web.listen-address", f"127.0.0.1:{port}", "--state.dir", str(state_dir), "--log.level", "warn",
            *extra]


def node_exporter_args(sysfs: Path, port: int) -> list[str]:
    """node_exporter with only the collectors that read what we read, on the same tree."""
    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if binary is None:
        raise SystemExit("node_exporter missing: apt-get install prometheus-node-exporter")
    return [binary, "--collector.disable-defaults", "--collector.infiniband", "--collector.netclass",
            f"--path.sysfs={sysfs}", f"--web.listen-address=127.0.0.1:{port}", "--web.disable-exporter-metrics"]
