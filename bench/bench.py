"""Benchmark: rnic-exporter vs node_exporter, side by side on the same simulated sysfs tree. Prints figures.

    .venv/bin/python bench/bench.py [--src DIR] [--python PATH] [--devices 16] [--gid-slots 255]
                                    [--seconds 30] [--scale 10] [--realtime 180]

Runs `rnic-exporter serve` as users run it (detection, netlink, udev and ethtool on; OTLP off) and
Debian's `prometheus-node-exporter` (only its infiniband and netclass collectors, `--path.sysfs` on the
same tree) at the same time on one simulated host (16 RoCE RNICs, 255-slot GID tables by default).
`--src DIR` runs the rnic-exporter found in DIR (a worktree of another branch) with `--python`.

- **busy** host: a separate writer process (its CPU counted for no one) rewrites every counter file
  of every port every 0.25 s, as on a training node; **quiet** host: nothing changes.
- **Prometheus-like** client: keep-alive, Prometheus 2.x's Accept (OpenMetrics first), gzip;
  **plain** client: a new connection per scrape, no Accept, no gzip (curl-like).
- **CPU per cycle** at one poll per scrape: ours polls every `--cycle` s and is scraped once per poll
  (ours = poll + scrape), node_exporter is scraped at the same pace (theirs = scrape, which reads sysfs).
  Both run in the same window, so the machine's load falls on both; CPU is utime+stime of every
  thread from /proc/<pid>/stat (10 ms ticks: the window totals are printed).
- **CPU per minute at the defaults** (our 5 s poll, a 15 s scrape for both), with time compressed
  `--scale` times (poll 5/scale s, scrapes 15/scale s) and multiplied back: a compressed minute holds
  the same 12 polls and 4 scrapes, busy and quiet. And one real-time window of `--realtime` seconds
  at the true defaults on the busy host, printed beside it: work an exporter does on timers of its
  own is not compressed, so when the two differ the real-time figure is the one to quote
  (`--realtime 0` skips it: a run then takes about 5 minutes instead of 8).
- scrape latency p50/p99 with 1, 40 and 50 concurrent keep-alive clients (wrk, Prometheus-like
  headers, busy host, our default 5 s poll), one exporter loaded at a time. Both answer 503 at once
  beyond 40 scrapes in flight (their default caps): at 50 clients the percentiles mix those in, so
  the number of such answers is printed, and 40 clients is the most that are all served;
- RSS of the full daemon (VmRSS steady, VmHWM after the 50-client load);
- sysfs files read per cycle and per minute at the defaults by each (inotify IN_ACCESS on the tree,
  one reader at a time): on real mlx5 hardware every `counters/` read is a firmware command (and
  `hw_counters/` one query per 10 ms lifespan), so there the cost follows these counts more than
  the CPU figures.
As root it runs inside a network namespace it makes (and removes) holding veths named like the
simulated netdevs, so rtnetlink knows them as on a real host (`--no-netdevs`: netlink blind, every
device read in full as when netlink fails).
Needs `prometheus-node-exporter` and `wrk` (apt-get install prometheus-node-exporter wrk).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import (
    PLAIN,
    PROMETHEUS_LIKE,
    BusyWriter,
    Client,
    FileReads,
    Latency,
    Ours,
    ReadCounts,
    Scraper,
    cpu_seconds,
    free_port,
    get,
    load_average,
    metric_value,
    node_exporter_args,
    node_exporter_binary,
    peak_rss_mb,
    require,
    rss_mb,
    running,
    wrk_latency,
)

from rnic_exporter.catalog.metrics import POLLS


@dataclass
class Daemon:
    name: str
    pid: int
    url: str


@dataclass(frozen=True, slots=True)
class Window:
    cpu_s: float
    scrapes: int
    polls: int | None  # ours only
    seconds: float
    load: float


def our_polls(url: str) -> int | None:
    value = metric_value(get(url), POLLS.name)
    return None if value is None else int(value)


def paced_window(daemons: list[tuple[Daemon, Client, float]], seconds: float) -> dict[str, Window]:
    """Scrape each daemon every its period (offset so they do not coincide) for `seconds`; CPU of each."""
    scrapers = [(d, Scraper(d.url, client), period) for d, client, period in daemons]
    for i, (_, s, period) in enumerate(scrapers):  # warm: every format rendered once, connections open
        s.scrape()
        time.sleep(period / len(scrapers) if i + 1 < len(scrapers) else 0)
    polls0 = {d.name: our_polls(d.url) if d.name == "ours" else None for d, _, _ in scrapers}
    cpu0 = {d.name: cpu_seconds(d.pid) for d, _, _ in scrapers}
    start = time.monotonic()
    due = [start + i * period / len(scrapers) for i, (_, _, period) in enumerate(scrapers)]
    counts = [0] * len(scrapers)
    while True:
        i = min(range(len(due)), key=due.__getitem__)
        if due[i] >= start + seconds:
            break
        time.sleep(max(0.0, due[i] - time.monotonic()))
        scrapers[i][1].scrape()
        counts[i] += 1
        due[i] += scrapers[i][2]
    time.sleep(max(0.0, start + seconds - time.monotonic()))
    elapsed = time.monotonic() - start
    out = {}
    for (d, s, _), n in zip(scrapers, counts, strict=True):
        cpu = cpu_seconds(d.pid) - cpu0[d.name]
        p0 = polls0[d.name]
        p1 = our_polls(d.url) if p0 is not None else None
        out[d.name] = Window(cpu, n, None if p0 is None or p1 is None else p1 - p0, elapsed, load_average())
        s.close()
    return out


def count_reads(sysfs: Path, daemon: Daemon, client: Client, period: float, scrapes: int) -> ReadCounts:
    """Files read over `scrapes` scrapes `period` apart (and whatever the daemon reads on its own clock
    meanwhile), while this daemon is the only reader. The watches are only up for this."""
    reads = FileReads(sysfs)
    try:
        scraper = Scraper(daemon.url, client)
        scraper.scrape()
        time.sleep(period)
        reads.take()
        for _ in range(scrapes):
            scraper.scrape()
            time.sleep(period)
        scraper.close()
        return reads.take()
    finally:
        reads.close()


def file_rows(table: Table, label: str, mine: ReadCounts, theirs: ReadCounts, load: float) -> None:
    table.row(f"sysfs files read {label}", mine.files, theirs.files, "", load, ".0f")
    table.row("  of which counters/ (mlx5: a firmware command each)", mine.pma_files, theirs.pma_files, "", load, ".0f")
    table.row("  of which hw_counters/ (one query per 10 ms lifespan)", mine.hw_files, theirs.hw_files, "", load, ".0f")
    table.row("  of which gids/ + gid_attrs/", mine.gid_files, theirs.gid_files, "", load, ".0f")
    table.row("  directory listings", mine.listings, theirs.listings, "", load, ".0f")
    if mine.overflowed or theirs.overflowed:
        table.note("inotify queue overflowed: these counts are low")


class Table:
    def __init__(self) -> None:
        self.rows: list[str] = []

    def row(self, name: str, ours: float, theirs: float, unit: str, load: float, fmt: str = ".2f") -> None:
        ratio = f"{ours / theirs:>8.2f}x" if theirs else f"{'-':>9}"
        self.rows.append(f"{name:<54}{ours:>11{fmt}} {unit:<3}{theirs:>11{fmt}} {unit:<3}{ratio}{load:>7.2f}")

    def note(self, text: str) -> None:
        self.rows.append(f"  {text}")

    def print(self) -> None:
        print(f"\n{'figure':<54}{'rnic-exporter':>15}{'node_exporter':>15}{'ours/NE':>9}{'load1':>7}")
        for line in self.rows:
            print(line)


@contextmanager
def ours_running(ours: Ours, sysfs: Path, state: Path, interval: float) -> Iterator[Daemon]:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    with running(
        ours.args(sysfs, port, state, "--poll.interval", str(interval)), url, env=ours.env(), cwd=ours.cwd()
    ) as proc:
        yield Daemon("ours", proc.pid, url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs rnic-exporter")
    parser.add_argument("--src", type=Path, default=None, help="source tree of the rnic-exporter to run")
    parser.add_argument(
        "--ours-flag",
        action="append",
        default=[],
        help="one more `rnic-exporter serve` flag, e.g. --ours-flag=--no-collector.hw_counters (repeatable)",
    )
    parser.add_argument("--devices", type=int, default=16)
    parser.add_argument("--gid-slots", type=int, default=255)
    parser.add_argument("--seconds", type=float, default=30, help="length of each CPU window")
    parser.add_argument(
        "--cycle",
        type=float,
        default=1.25,
        help="poll and scrape period of the per-cycle windows (above ~1 s: a scraper pass under 1 s old may be reused)",
    )
    parser.add_argument("--scale", type=float, default=10, help="time compression of the per-minute windows")
    parser.add_argument("--latency-seconds", type=int, default=8)
    parser.add_argument(
        "--realtime",
        type=float,
        default=180,
        help="seconds of one real-time window at the true defaults (busy host; 0: skip)",
    )
    parser.add_argument(
        "--netdevs",
        action=argparse.BooleanOptionalAction,
        default=os.geteuid() == 0,
        help="run inside a fresh network namespace holding veths named like the simulated "
        "RNICs' netdevs (default as root), so rtnetlink knows them as on a real host and "
        "the exporter takes its event-driven path; --no-netdevs measures netlink blind",
    )
    parser.add_argument("--inside-netns", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.netdevs and not opts.inside_netns:
        sys.exit(_in_namespace(opts.devices))
    require("wrk", "wrk")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stopped: still stop the daemons and the writer
    ours = Ours(opts.python, opts.src.resolve() if opts.src else None, tuple(opts.ours_flag))
    ne_version = subprocess.run([node_exporter_binary(), "--version"], capture_output=True, text=True)
    ne_version_line = (ne_version.stdout or ne_version.stderr).splitlines()[0]

    work = Path(tempfile.mkdtemp(prefix="rnic-bench-"))
    table = Table()
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        sysfs = work / "sys"
        writer = BusyWriter(sysfs, opts.devices, opts.gid_slots)
        stack.callback(writer.close)
        print(
            f"# {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC; simulated host: {opts.devices} RoCE "
            f"RNICs, {opts.gid_slots}-slot GID tables; {os.cpu_count()} CPUs; "
            f"loadavg {Path('/proc/loadavg').read_text().strip()}"
        )
        print(f"# rnic-exporter: {ours.describe()} (python {opts.python})")
        print(f"# {ne_version_line}; both answer 503 beyond 40 scrapes in flight (their defaults)")
        ne_port = free_port()
        ne_url = f"http://127.0.0.1:{ne_port}/metrics"
        ne_proc = stack.enter_context(running(node_exporter_args(sysfs, ne_port), ne_url))
        ne = Daemon("node_exporter", ne_proc.pid, ne_url)
        # Files read: node_exporter reads only when scraped, so it is counted before ours starts.
        ne_reads = count_reads(sysfs, ne, PROMETHEUS_LIKE, 0.5, 4).per(4)
        with ours_running(ours, sysfs, work / "state-cycle", opts.cycle) as us:
            time.sleep(opts.cycle)
            quiet_reads = count_reads(sysfs, us, PROMETHEUS_LIKE, opts.cycle, 8).per(8)
            writer.busy(True)
            busy_reads = count_reads(sysfs, us, PROMETHEUS_LIKE, opts.cycle, 8).per(8)
            load = load_average()
            file_rows(table, "per cycle, busy", busy_reads, ne_reads, load)
            if quiet_reads != busy_reads:
                file_rows(table, "per cycle, quiet", quiet_reads, ne_reads, load)
            else:
                table.note("quiet host: the same files")

            # CPU per cycle, one poll per scrape, both in the same windows.
            for busy in (True, False):
                writer.busy(busy)
                for client in (PROMETHEUS_LIKE, PLAIN):
                    w = paced_window([(us, client, opts.cycle), (ne, client, opts.cycle)], opts.seconds)
                    o, t = w["ours"], w["node_exporter"]
                    label = f"CPU per cycle, {'busy' if busy else 'quiet'}, {client.name}"
                    table.row(label, o.cpu_s * 1000 / o.scrapes, t.cpu_s * 1000 / t.scrapes, "ms", t.load)
                    table.note(
                        f"ours {o.cpu_s * 1000:.0f} ms over {o.scrapes} scrapes / {o.polls} polls, "
                        f"node_exporter {t.cpu_s * 1000:.0f} ms over {t.scrapes} scrapes, {o.seconds:.0f} s"
                    )
            steady_rss = rss_mb(us.pid), rss_mb(ne.pid)

        # CPU per minute at the defaults, time scaled down.
        scaled: dict[bool, float] = {}
        with ours_running(ours, sysfs, work / "state-minute", 5.0 / opts.scale) as us:
            for busy in (True, False):
                writer.busy(busy)
                w = paced_window(
                    [(us, PROMETHEUS_LIKE, 15.0 / opts.scale), (ne, PROMETHEUS_LIKE, 15.0 / opts.scale)], opts.seconds
                )
                o, t = w["ours"], w["node_exporter"]
                minutes = o.seconds * opts.scale / 60
                label = f"CPU per minute at defaults, {'busy' if busy else 'quiet'}"
                table.row(label, o.cpu_s * 1000 / minutes, t.cpu_s * 1000 / minutes, "ms", t.load)
                table.note(
                    f"time / {opts.scale:g}: {minutes:.1f} scaled minutes, ours {o.polls} polls + "
                    f"{o.scrapes} scrapes, node_exporter {t.scrapes} scrapes"
                )
                scaled[busy] = o.cpu_s / t.cpu_s

        # Latency, RSS and the optional real-time window at our true default poll interval.
        writer.busy(True)
        with ours_running(ours, sysfs, work / "state-default", 5.0) as us:
            # Files read in one real minute at the defaults (work on timers of its own is not compressed).
            file_rows(
                table,
                "per minute at defaults, busy",
                count_reads(sysfs, us, PROMETHEUS_LIKE, 15.0, 4),
                ne_reads.per(1 / 4),
                load_average(),
            )
            lat: dict[str, list[Latency]] = {}
            concurrency = (1, 40, 50)
            for d in (us, ne):
                lat[d.name] = [
                    wrk_latency(d.url, c, opts.latency_seconds, PROMETHEUS_LIKE.headers) for c in concurrency
                ]
            load = load_average()
            for i, clients in enumerate(concurrency):
                ol, tl = lat["ours"][i], lat["node_exporter"][i]
                name = f"{clients} client{'s' if clients > 1 else ''}, busy"
                table.row(f"scrape p50, {name}", ol.p50_ms, tl.p50_ms, "ms", load)
                table.row(f"scrape p99, {name}", ol.p99_ms, tl.p99_ms, "ms", load)
                table.note(
                    f"ours {ol.requests} answers ({ol.failed} not 2xx), node_exporter {tl.requests} "
                    f"({tl.failed} not 2xx) in {opts.latency_seconds} s"
                )
            table.row("RSS steady (full daemon, after the cycle windows)", *steady_rss, "MB", load)
            table.row("RSS peak (VmHWM, after 50 clients)", peak_rss_mb(us.pid), peak_rss_mb(ne.pid), "MB", load)
            if opts.realtime > 0:
                w = paced_window([(us, PROMETHEUS_LIKE, 15.0), (ne, PROMETHEUS_LIKE, 15.0)], opts.realtime)
                o, t = w["ours"], w["node_exporter"]
                minutes = o.seconds / 60
                table.row(
                    "CPU per minute at defaults, busy, REAL TIME",
                    o.cpu_s * 1000 / minutes,
                    t.cpu_s * 1000 / minutes,
                    "ms",
                    t.load,
                )
                real = o.cpu_s / t.cpu_s
                table.note(
                    f"{minutes:.1f} real minutes, ours {o.polls} polls + {o.scrapes} scrapes; ratio "
                    f"{real:.2f}x against {scaled[True]:.2f}x compressed, same run"
                    + (
                        ""
                        if abs(real / scaled[True] - 1) < 0.15
                        else ": they differ, trust real time (work on timers of its own is not compressed)"
                    )
                )
    table.print()
    print(
        "(ours: one cycle = one poll + one scrape; node_exporter: one scrape, which reads sysfs; "
        "load1 = 1-minute load average at the end of the measurement)"
    )


def _in_namespace(devices: int) -> int:
    """Re-run this benchmark inside a namespace with the simulator's netdev names (removed afterwards)."""
    from tests.support.netns import network_namespace

    names = [f"ens{n}f0np0" for n in range(1, devices + 1)]  # rnic_exporter.sim's RoCE netdev names
    with network_namespace(names, prefix="rnb") as ns:
        return subprocess.run(ns.exec_args(sys.executable, *sys.argv, "--inside-netns")).returncode


if __name__ == "__main__":
    main()
