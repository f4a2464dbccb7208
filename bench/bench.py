"""Benchmark: rnic-exporter vs node_exporter on the same simulated sysfs tree. Prints figures.

    .venv/bin/python bench/bench.py [--devices 16] [--gid-slots 255] [--seconds 10]

Measures, for `rnic-exporter serve` and Debian's `prometheus-node-exporter` (only its infiniband
and netclass collectors, `--path.sysfs` on the same tree), side by side in one run:
- CPU per cycle: ours is one poll plus one scrape (scrapes are served from the last poll);
  node_exporter's is one scrape (it reads sysfs inside the scrape). From /proc/<pid>/stat.
- scrape latency p50/p99 with 1 and with 50 concurrent keep-alive clients (wrk), and ours again
  on a 4-RNIC host to show it is flat in RNIC count;
- resident memory (VmRSS) after the run;
- in-process: sysfs reads and CPU of one poll, split into read and render.
Needs `prometheus-node-exporter` and `wrk` (apt-get install prometheus-node-exporter wrk).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rnic_exporter.agent import Agent, ServeConfig  # noqa: E402
from rnic_exporter.sim import SimHost  # noqa: E402
from rnic_exporter.sources.sysfs import SysfsRoot  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def rss_mb(pid: int) -> float:
    m = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(m[1]) / 1024 if m else float("nan")


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        body: bytes = r.read()
        return body


def wait_up(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args!r} exited with {proc.returncode}")
        try:
            get(url)
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{url} did not answer within 30 s")


@contextmanager
def running(args: list[str], url: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_up(url, proc)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def wrk_latency(url: str, connections: int, seconds: int) -> tuple[float, float]:
    """(p50, p99) in milliseconds."""
    out = subprocess.run(["wrk", f"-t{min(2, connections)}", f"-c{connections}", f"-d{seconds}s", "--latency", url],
                         capture_output=True, text=True, check=True).stdout

    def pct(p: str) -> float:
        m = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        if m is None:
            raise SystemExit(f"could not read the {p}th percentile from wrk:\n{out}")
        return float(m[1]) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m[2]]

    return pct("50"), pct("99")


def cpu_per_cycle_ours(sysfs: Path, seconds: float, interval: float) -> tuple[float, float, int]:
    """CPU ms per (poll + one scrape); also RSS MB and cycle count."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    args = [sys.executable, "-m", "rnic_exporter", "serve", "--path.sysfs", str(sysfs),
            "--web.listen-address", f"127.0.0.1:{port}", "--poll.interval", str(interval), "--log.level", "warn"]
    with running(args, url) as proc:
        for _ in range(3):  # warm up: every format rendered once, fds held
            get(url)
            time.sleep(interval)
        polls_before = _polls(get(url))
        cpu_before = cpu_seconds(proc.pid)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            get(url)
            time.sleep(interval)
        cpu_after = cpu_seconds(proc.pid)
        polls = _polls(get(url)) - polls_before
        return (cpu_after - cpu_before) * 1000 / polls, rss_mb(proc.pid), polls


def _polls(exposition: bytes) -> int:
    m = re.search(rb"^rnic_exporter_polls_total ([\d.e+]+)$", exposition, re.M)
    assert m is not None
    return int(float(m[1]))


def node_exporter_args(sysfs: Path, port: int) -> list[str]:
    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if binary is None:
        raise SystemExit("node_exporter missing: apt-get install prometheus-node-exporter")
    return [binary, "--collector.disable-defaults", "--collector.infiniband", "--collector.netclass",
            f"--path.sysfs={sysfs}", f"--web.listen-address=127.0.0.1:{port}", "--web.disable-exporter-metrics"]


def cpu_per_scrape_node_exporter(sysfs: Path, scrapes: int) -> tuple[float, float]:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    with running(node_exporter_args(sysfs, port), url) as proc:
        for _ in range(5):
            get(url)
        before = cpu_seconds(proc.pid)
        for _ in range(scrapes):
            get(url)
        return (cpu_seconds(proc.pid) - before) * 1000 / scrapes, rss_mb(proc.pid)


def latencies(args: list[str], url: str, seconds: int) -> tuple[tuple[float, float], tuple[float, float]]:
    with running(args, url):
        get(url)
        return wrk_latency(url, 1, seconds), wrk_latency(url, 50, seconds)


def in_process(sysfs: Path, host: SimHost, polls: int) -> dict[str, float]:
    agent = Agent(ServeConfig(sysfs=sysfs), SysfsRoot(sysfs, hold_fds=True))
    agent.poll_once()
    agent.prometheus.render(None, None)  # a scraper asked for text: rendered eagerly from now on
    agent.poll_once()
    reads_before = agent.reader.root.reads
    t0 = time.process_time()
    for _ in range(polls):
        agent.reader.read()
    read_ms = (time.process_time() - t0) * 1000 / polls
    reads = (agent.reader.root.reads - reads_before) / polls
    t0 = time.process_time()
    for _ in range(polls):
        agent.poll_once()
    poll_ms = (time.process_time() - t0) * 1000 / polls
    return {"sysfs reads per poll": reads, "read ms": read_ms, "poll+render ms": poll_ms,
            "held fds": float(agent.reader.root.held_fds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=16)
    parser.add_argument("--gid-slots", type=int, default=255)
    parser.add_argument("--seconds", type=int, default=10, help="length of each measurement window")
    parser.add_argument("--interval", type=float, default=0.25, help="poll interval during the CPU window")
    opts = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk missing: apt-get install wrk")

    work = Path(tempfile.mkdtemp(prefix="rnic-bench-"))
    try:
        sysfs = work / "sys"
        host = SimHost.build(sysfs, roce=opts.devices, gid_table_size=opts.gid_slots)
        small = SimHost.build(work / "small", roce=4, gid_table_size=opts.gid_slots)
        print(f"# simulated host: {opts.devices} RNICs, {opts.gid_slots}-slot GID tables; "
              f"{os.cpu_count()} CPUs; Python {sys.version.split()[0]}")

        ip = in_process(sysfs, host, polls=50)
        print("\n## in-process poll (ours)")
        for k, v in ip.items():
            print(f"{k:>24}: {v:.3f}")

        ours_cpu, ours_rss, cycles = cpu_per_cycle_ours(sysfs, opts.seconds, opts.interval)
        ne_cpu, ne_rss = cpu_per_scrape_node_exporter(sysfs, scrapes=cycles)
        port = free_port()
        ours_args = [sys.executable, "-m", "rnic_exporter", "serve", "--path.sysfs", str(sysfs),
                     "--web.listen-address", f"127.0.0.1:{port}", "--log.level", "warn"]
        ours_lat = latencies(ours_args, f"http://127.0.0.1:{port}/metrics", opts.seconds)
        port_small = free_port()
        small_args = [sys.executable, "-m", "rnic_exporter", "serve", "--path.sysfs", str(small.root),
                      "--web.listen-address", f"127.0.0.1:{port_small}", "--log.level", "warn"]
        small_lat = latencies(small_args, f"http://127.0.0.1:{port_small}/metrics", opts.seconds)
        ne_port = free_port()
        ne_lat = latencies(node_exporter_args(sysfs, ne_port), f"http://127.0.0.1:{ne_port}/metrics", opts.seconds)

        print("\n## side by side (same tree, same run)")
        print(f"{'figure':<42}{'rnic-exporter':>16}{'node_exporter':>16}{'ratio':>10}")

        def row(name: str, ours: float, theirs: float, unit: str) -> None:
            print(f"{name:<42}{ours:>13.3f} {unit:<2}{theirs:>13.3f} {unit:<2}{ours / theirs:>10.3f}")

        row(f"CPU per cycle ({cycles} cycles)", ours_cpu, ne_cpu, "ms")
        row("scrape p50, 1 client", ours_lat[0][0], ne_lat[0][0], "ms")
        row("scrape p99, 1 client", ours_lat[0][1], ne_lat[0][1], "ms")
        row("scrape p50, 50 clients", ours_lat[1][0], ne_lat[1][0], "ms")
        row("scrape p99, 50 clients", ours_lat[1][1], ne_lat[1][1], "ms")
        row("RSS", ours_rss, ne_rss, "MB")
        print(f"\n## flat in RNIC count: ours on 4 RNICs: p50/p99 1 client "
              f"{small_lat[0][0]:.3f}/{small_lat[0][1]:.3f} ms, "
              f"50 clients {small_lat[1][0]:.3f}/{small_lat[1][1]:.3f} ms")
        print("(ours: one cycle = one poll + one scrape; node_exporter: one scrape, which reads sysfs)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
