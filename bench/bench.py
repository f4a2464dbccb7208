"""Benchmark: rnic-exporter vs node_exporter on the same simulated sysfs tree. Prints figures.

    .venv/bin/python bench/bench.py [--devices 16] [--gid-slots 255] [--seconds 10]

Measures, for `rnic-exporter serve` (as a user runs it: detection, netlink and udev watchers on,
OTLP off) and Debian's `prometheus-node-exporter` (only its infiniband and netclass collectors,
`--path.sysfs` on the same tree), side by side in one run:
- CPU per cycle: ours is one poll plus one scrape (scrapes are served from the last poll);
  node_exporter's is one scrape (it reads sysfs inside the scrape). From /proc/<pid>/stat, over
  the whole window, so every thread and the HTTP handling count.
- scrape latency p50/p99 with 1 and with 50 concurrent keep-alive clients (wrk), and ours again
  on a 4-RNIC host to show it is flat in RNIC count;
- resident memory (VmRSS) after the run;
- in-process, median of 31 calls: sysfs reads and CPU of one poll, split into reading,
  rendering and the rest of the agent's poll (detection), with values unchanged and with every
  counter changing between polls (what a busy node sees).
Needs `prometheus-node-exporter` and `wrk` (apt-get install prometheus-node-exporter wrk).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness import (  # noqa: E402
    cpu_seconds,
    free_port,
    get,
    node_exporter_args,
    ours_args,
    polls,
    require,
    rss_mb,
    running,
    wrk_latency,
)

from rnic_exporter.agent import Agent, ServeConfig  # noqa: E402
from rnic_exporter.samples import ExporterStats  # noqa: E402
from rnic_exporter.sim import SimHost  # noqa: E402
from rnic_exporter.sources.sysfs import SysfsRoot  # noqa: E402


def median_ms(fn: Callable[[], object], calls: int = 31, setup: Callable[[], object] | None = None,
              gap: float = 0.02) -> float:
    """Median CPU ms of one call, each after a short pause as in the daemon (a call straight after
    another finds warm caches and is not what a poll costs). `setup` runs before each call, untimed."""
    times = []
    for _ in range(calls):
        if setup is not None:
            setup()
        time.sleep(gap)
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times) * 1000


def in_process(sysfs: Path, host: SimHost, state_dir: Path) -> dict[str, float]:
    agent = Agent(ServeConfig(sysfs=sysfs, state_dir=state_dir, watch_netlink=False, watch_udev=False),
                  SysfsRoot(sysfs, hold_fds=True))
    agent.poll_once()
    agent.prometheus.render(None, None)
    agent.poll_once()
    reads_before = agent.reader.root.reads
    agent.reader.read()
    reads = agent.reader.root.reads - reads_before
    snap = agent.reader.read()
    stats = ExporterStats(polls=agent.polls)
    # The floor under any reader in Python: one bare pread per attribute a poll reads, on
    # descriptors the reader holds, nothing else.
    fds = [os.open(sysfs / rel, os.O_RDONLY) for rel in agent.reader.held_rels()[:reads]]

    def bare_preads() -> None:
        for fd in fds:
            os.pread(fd, 128, 0)

    figures = {
        "sysfs reads per poll": float(reads),
        "floor: that many bare preads ms": median_ms(bare_preads),
        "read ms": median_ms(agent.reader.read),
        "render ms": median_ms(lambda: agent.prometheus.update(snap, stats)),
        "poll ms (read+detect+render)": median_ms(agent.poll_once),
    }
    # Every counter moves between polls (the simulator's writing is not timed).
    def traffic() -> None:
        host.add_traffic(1.0)

    latest = [snap]

    def traffic_and_read() -> None:
        traffic()
        latest[0] = agent.reader.read()

    figures["busy: read ms"] = median_ms(agent.reader.read, setup=traffic)
    figures["busy: render ms"] = median_ms(lambda: agent.prometheus.update(latest[0], stats), setup=traffic_and_read)
    figures["busy: poll ms"] = median_ms(agent.poll_once, setup=traffic)
    figures["held fds"] = float(agent.reader.root.held_fds)
    for fd in fds:
        os.close(fd)
    agent.close()
    return figures


def cpu_per_cycle_ours(sysfs: Path, state_dir: Path, seconds: float, interval: float) -> tuple[float, float, int]:
    """CPU ms per (poll + one scrape); also RSS MB and cycle count."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    with running(ours_args(sysfs, port, state_dir, "--poll.interval", str(interval)), url) as proc:
        for _ in range(3):  # warm up: every format rendered once, fds held
            get(url)
            time.sleep(interval)
        polls_before = polls(url)
        cpu_before = cpu_seconds(proc.pid)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            get(url)
            time.sleep(interval)  # paced: one scrape per poll interval, as Prometheus would
        cpu_after = cpu_seconds(proc.pid)
        cycles = polls(url) - polls_before
        return (cpu_after - cpu_before) * 1000 / cycles, rss_mb(proc.pid), cycles


def cpu_per_scrape_ours(sysfs: Path, state_dir: Path, scrapes: int) -> float:
    """CPU ms of one scrape alone (no poll runs in the window): the HTTP side of a cycle."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    with running(ours_args(sysfs, port, state_dir, "--poll.interval", "3600"), url) as proc:
        for _ in range(5):
            get(url)
        before = cpu_seconds(proc.pid)
        for _ in range(scrapes):
            get(url)
        return (cpu_seconds(proc.pid) - before) * 1000 / scrapes


def rss_sinks_only(sysfs: Path, state_dir: Path, interval: float) -> float:
    """RSS MB of the daemon with the Prometheus sink alone: no netlink/udev watchers, no ethtool
    (those load pyroute2, which imports its whole package: ~10 MB)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    args = ours_args(sysfs, port, state_dir, "--poll.interval", str(interval), "--no-watch.netlink",
                     "--no-watch.udev", "--no-collector.ethtool")
    with running(args, url) as proc:
        for _ in range(5):
            get(url)
            time.sleep(interval)
        return rss_mb(proc.pid)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=16)
    parser.add_argument("--gid-slots", type=int, default=255)
    parser.add_argument("--seconds", type=int, default=10, help="length of each measurement window")
    parser.add_argument("--interval", type=float, default=0.1, help="poll interval during the CPU window")
    opts = parser.parse_args()
    require("wrk", "wrk")

    work = Path(tempfile.mkdtemp(prefix="rnic-bench-"))
    try:
        sysfs = work / "sys"
        host = SimHost.build(sysfs, roce=opts.devices, gid_table_size=opts.gid_slots)
        small = SimHost.build(work / "small", roce=4, gid_table_size=opts.gid_slots)
        print(f"# simulated host: {opts.devices} RNICs, {opts.gid_slots}-slot GID tables; "
              f"{os.cpu_count()} CPUs; Python {sys.version.split()[0]}")

        ip = in_process(sysfs, host, work / "state-in-process")
        print("\n## in-process poll (ours, median CPU ms of one call)")
        for k, v in ip.items():
            print(f"{k:>30}: {v:.3f}")

        ours_cpu, ours_rss, cycles = cpu_per_cycle_ours(sysfs, work / "state", opts.seconds, opts.interval)
        ne_cpu, ne_rss = cpu_per_scrape_node_exporter(sysfs, scrapes=max(cycles, 50))
        scrape_cpu = cpu_per_scrape_ours(sysfs, work / "state", scrapes=500)
        lean_rss = rss_sinks_only(sysfs, work / "state", opts.interval)
        port = free_port()
        ours_lat = latencies(ours_args(sysfs, port, work / "state"), f"http://127.0.0.1:{port}/metrics", opts.seconds)
        port_small = free_port()
        small_lat = latencies(ours_args(small.root, port_small, work / "state-small"),
                              f"http://127.0.0.1:{port_small}/metrics", opts.seconds)
        ne_port = free_port()
        ne_lat = latencies(node_exporter_args(sysfs, ne_port), f"http://127.0.0.1:{ne_port}/metrics", opts.seconds)

        print("\n## side by side (same tree, same run)")
        print(f"{'figure':<42}{'rnic-exporter':>16}{'node_exporter':>16}{'ratio':>10}")

        def row(name: str, ours: float, theirs: float, unit: str) -> None:
            print(f"{name:<42}{ours:>13.3f} {unit:<2}{theirs:>13.3f} {unit:<2}{ours / theirs:>10.3f}")

        row(f"CPU per cycle ({cycles} cycles)", ours_cpu, ne_cpu, "ms")
        row("  of which one scrape (ours: no poll)", scrape_cpu, ne_cpu, "ms")
        row("scrape p50, 1 client", ours_lat[0][0], ne_lat[0][0], "ms")
        row("scrape p99, 1 client", ours_lat[0][1], ne_lat[0][1], "ms")
        row("scrape p50, 50 clients", ours_lat[1][0], ne_lat[1][0], "ms")
        row("scrape p99, 50 clients", ours_lat[1][1], ne_lat[1][1], "ms")
        row("RSS", ours_rss, ne_rss, "MB")
        row("  RSS, Prometheus sink only (no watchers)", lean_rss, ne_rss, "MB")
        print(f"\n## flat in RNIC count: ours on 4 RNICs: p50/p99 1 client "
              f"{small_lat[0][0]:.3f}/{small_lat[0][1]:.3f} ms, "
              f"50 clients {small_lat[1][0]:.3f}/{small_lat[1][1]:.3f} ms")
        print("(ours: one cycle = one poll + one scrape; node_exporter: one scrape, which reads sysfs)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
