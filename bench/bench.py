"""Benchmark: rnic-exporter vs node_exporter, side by side on the same simulated sysfs tree. Prints figures.

    .venv/bin/python bench/bench.py [--src DIR] [--python PATH] [--devices 16] [--gid-slots 255]
                                    [--warmup 30] [--window 120] [--cycle-window 30] [--extras]

What a user's host runs, measured as a user would measure it (`/proc/<pid>/stat` over a window):
`rnic-exporter serve` at its defaults (detection, netlink, udev and ethtool on; 5 s polls; OTLP
off) and Debian's `prometheus-node-exporter` (only its infiniband and netclass collectors,
`--path.sysfs` on the same tree), both scraped every 15 s by a Prometheus-like client (keep-alive,
Prometheus 2.x's Accept with OpenMetrics first, gzip), at the same time, on one simulated **busy**
host: 16 RoCE RNICs with 255-slot GID tables (`--infiniband N` adds InfiniBand ones, with IPoIB
netdevs), every counter file of every port rewritten every `--busy-period` s by a separate writer
process (its CPU counted for no one), as on a training node. The tree is on tmpfs (/dev/shm) as
sysfs is in memory (`--tree-on-disk`: under the temp directory, as before).

- **CPU per minute at the defaults**: after `--warmup` s of the same scrapes (start-up, first
  reads and the first detections are not a user's steady minute), CPU of each over a real-time
  window of `--window` s (utime+stime of every thread, `/proc/<pid>/stat`, 10 ms ticks: the tick
  counts are printed, so the figure can be checked against a plain reading), per minute, and the
  ratio ours/node_exporter. No time compression: work on timers of one's own (detection refresh,
  the safety sweep, idle threads) is counted as it happens.
- **idle daemon per minute**, in the same window: more rnic-exporters on the same tree that nobody
  scrapes: at the defaults; with `--poll.interval 1m` (the floor of everything not tied to a
  poll); and with netlink off (`--no-watch.netlink`: the fallback that polls every attribute at the
  fast interval, as when the netlink socket fails).
- **the floor**, in the same window: `bench/wake_floor.py`, a bare Python process on the idle
  daemon's timers and reads and nothing else: the idle daemon less it is what our code adds to what
  the detection budgets cost in this runtime.
- **the scrape floor**, scraped alike in the same window: `bench/scrape_floor.py`, a bare Python
  HTTP server that reads every counter file, writes a line per counter and gzips the page for each
  scrape, and nothing else; with the floor above, the least a Python daemon with these budgets and
  scrapes costs here, beside node_exporter.
- **by thread**, in the same window, for the scraped and the idle daemon (and `--compare`'s): CPU a
  minute of each thread by its name (/proc/<pid>/task/*/schedstat; the daemons run with
  tests/support/thread_names on their PYTHONPATH, which gives each OS thread its Python name).
- **CPU per cycle**, busy, one poll and one scrape a second (`--cycle-window` s, 0 skips): ours =
  poll + scrape, node_exporter = a scrape, which reads sysfs (and `--compare`'s, in the same window).
- `--extras`: files read per cycle and per minute (inotify), scrape latency p50/p99 with 1, 40 and
  50 concurrent keep-alive clients (wrk), resident memory; a run then takes about 3 minutes more.

`--src DIR` runs the rnic-exporter found in DIR (a worktree of another branch) with `--python`, so one
script measures two branches; `--compare DIR` runs DIR's beside ours in the same per-minute window
(scraped alike, and an idle one) and in the same per-cycle window, which answers "before or after"
far better than two runs on a shared machine. As root it runs inside a network namespace it makes
(and removes) holding veths named like the simulated netdevs, with their addresses, so rtnetlink
knows them as on a real host (`--no-netdevs`: netlink blind, the fallback everywhere). A run takes about 5 minutes.
Needs `prometheus-node-exporter` (and `wrk` for `--extras`).
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
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import (
    CLK_TCK,
    PROMETHEUS_LIKE,
    BusyWriter,
    Client,
    FileReads,
    Latency,
    ProcessCpu,
    ReadCounts,
    Scraper,
    load_average,
    node_exporter_args,
    node_exporter_binary,
    peak_rss_mb,
    require,
    rss_mb,
    tree_dir,
    wrk_latency,
)

from tests.support.processes import free_port
from tests.support.serve import Ours, running
from tests.support.threads import per_thread_ms, thread_cpu_ns, with_thread_names

SCRAPE_S = 15.0  # Prometheus' default scrape interval
POLL_S = 5.0  # our default --poll.interval
FLOOR = "floor (bare Python, the same timers)"
SCRAPE_FLOOR = "scrape floor (bare Python: reads, lines, gzip)"


@dataclass
class Daemon:
    name: str
    pid: int
    url: str
    cpu: ProcessCpu


@dataclass(frozen=True, slots=True)
class Window:
    cpu_s: float
    ticks: int
    scrapes: int
    seconds: float
    load: float
    threads: dict[str, float]  # CPU a minute by thread name (tests/support/threads.py)

    def per_minute_ms(self) -> float:
        return self.cpu_s * 1000 * 60 / self.seconds

    def per_scrape_ms(self) -> float:
        """CPU per scrape: per cycle where each scrape comes with a poll (the busy cycle window)."""
        return self.cpu_s * 1000 / self.scrapes


def paced_window(
    scraped: Sequence[tuple[Daemon, Client, float]], seconds: float, unscraped: Sequence[Daemon] = ()
) -> dict[str, Window]:
    """Scrape each of `scraped` every its period (offset so they do not coincide) for `seconds`;
    the CPU of each, and of `unscraped` (daemons left alone) over the same window."""
    scrapers = [(d, Scraper(d.url, client), period) for d, client, period in scraped]
    everyone = [d for d, _, _ in scraped] + list(unscraped)
    t0 = {d.name: (d.cpu.seconds(), d.cpu.ticks()) for d in everyone}
    threads0 = {d.name: thread_cpu_ns(d.pid) for d in everyone}
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
    t1 = {d.name: (d.cpu.seconds(), d.cpu.ticks()) for d in everyone}
    threads = {d.name: per_thread_ms(threads0[d.name], thread_cpu_ns(d.pid), elapsed) for d in everyone}
    load = load_average()
    for _, s, _ in scrapers:
        s.close()
    n = {d.name: c for (d, _, _), c in zip(scrapers, counts, strict=True)}
    return {
        d.name: Window(
            t1[d.name][0] - t0[d.name][0],
            t1[d.name][1] - t0[d.name][1],
            n.get(d.name, 0),
            elapsed,
            load,
            threads[d.name],
        )
        for d in everyone
    }


def by_thread(threads: Mapping[str, float]) -> str:
    """`threads` (CPU a minute by name), the dearest first, those under 0.05 ms left out."""
    shown = sorted(((ms, name) for name, ms in threads.items() if ms >= 0.05), reverse=True)
    return ", ".join(f"{name} {ms:.1f}" for ms, name in shown) or "none"


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

    def row(self, name: str, ours: float, theirs: float | None, unit: str, load: float, fmt: str = ".2f") -> None:
        if theirs is None:
            self.rows.append(f"{name:<54}{ours:>11{fmt}} {unit:<3}{'':>15}{'':>9}{load:>7.2f}")
            return
        ratio = f"{ours / theirs:>8.2f}x" if theirs else f"{'-':>9}"
        self.rows.append(f"{name:<54}{ours:>11{fmt}} {unit:<3}{theirs:>11{fmt}} {unit:<3}{ratio}{load:>7.2f}")

    def note(self, text: str) -> None:
        self.rows.append(f"  {text}")

    def print(self) -> None:
        print(f"\n{'figure':<54}{'rnic-exporter':>15}{'node_exporter':>15}{'ours/NE':>9}{'load1':>7}")
        for line in self.rows:
            print(line)


@contextmanager
def ours_running(ours: Ours, sysfs: Path, state: Path, name: str, *flags: str) -> Iterator[Daemon]:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    env = with_thread_names(ours.env())  # per-thread figures
    with running(ours.args(sysfs, port, state, *flags), url, env=env, cwd=ours.cwd()) as proc:
        cpu = ProcessCpu(proc.pid, name)
        try:
            yield Daemon(name, proc.pid, url, cpu)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
            cpu.close()


@contextmanager
def floor_running(python: str, sysfs: Path) -> Iterator[Daemon]:
    """bench/wake_floor.py on the tree: the floor of the idle daemon's timers in this runtime."""
    floor = Path(__file__).resolve().parent / "wake_floor.py"
    proc = subprocess.Popen([python, str(floor), str(sysfs), "--poll", str(POLL_S)])
    cpu = ProcessCpu(proc.pid, FLOOR)
    try:
        yield Daemon(FLOOR, proc.pid, "", cpu)
    finally:
        proc.terminate()
        proc.wait(10)
        cpu.close()


@contextmanager
def scrape_floor_running(python: str, sysfs: Path) -> Iterator[Daemon]:
    """bench/scrape_floor.py on the tree: the floor of a scrape in this runtime (scraped alike)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    script = Path(__file__).resolve().parent / "scrape_floor.py"
    with running([python, str(script), str(sysfs), "--port", str(port)], url) as proc:
        cpu = ProcessCpu(proc.pid, SCRAPE_FLOOR)
        try:
            yield Daemon(SCRAPE_FLOOR, proc.pid, url, cpu)
        finally:
            cpu.close()


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
    parser.add_argument(
        "--compare-flag",
        action="append",
        default=None,
        help="the --compare checkout's serve flags instead of --ours-flag's (repeatable; '' for none): "
        "with --compare of the same checkout, two settings side by side in one window",
    )
    parser.add_argument("--devices", type=int, default=16, help="RoCE RNICs of the simulated host")
    parser.add_argument(
        "--infiniband",
        type=int,
        default=0,
        help="InfiniBand RNICs besides (with IPoIB netdevs): --devices 0 --infiniband 16 is all InfiniBand, "
        "--devices 8 --infiniband 8 mixed",
    )
    parser.add_argument("--gid-slots", type=int, default=255)
    parser.add_argument("--busy-period", type=float, default=1.0, help="seconds between rewrites of every counter")
    parser.add_argument("--warmup", type=float, default=30, help="seconds of scrapes before the per-minute window")
    parser.add_argument("--window", type=float, default=120, help="seconds of the per-minute window (real time)")
    parser.add_argument(
        "--cycle-window", type=float, default=30, help="seconds of the per-cycle window, one poll and scrape a second"
    )
    parser.add_argument(
        "--compare",
        type=Path,
        default=None,
        help="source tree of another rnic-exporter, run beside ours in the per-minute window (scraped and idle)",
    )
    parser.add_argument("--extras", action="store_true", help="also files read, scrape latency under load, memory")
    parser.add_argument(
        "--tree-on-disk",
        action="store_true",
        help="build the simulated tree under the temp directory instead of tmpfs (sysfs is in memory: on a "
        "disk filesystem reads also pay atime journal writes and page-cache misses)",
    )
    parser.add_argument("--latency-seconds", type=int, default=8)
    parser.add_argument(
        "--netdevs",
        action=argparse.BooleanOptionalAction,
        default=os.geteuid() == 0,
        help="run inside a fresh network namespace holding veths named like the simulated "
        "RNICs' netdevs, with their addresses (default as root), so rtnetlink knows them as on a "
        "real host; --no-netdevs measures netlink blind (the fallback)",
    )
    parser.add_argument("--inside-netns", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.netdevs and not opts.inside_netns:
        sys.exit(_in_namespace(opts.devices, opts.infiniband))
    if opts.extras:
        require("wrk", "wrk")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stopped: still stop the daemons and the writer
    ours = Ours(opts.python, opts.src.resolve() if opts.src else None, tuple(opts.ours_flag))
    ne_version = subprocess.run([node_exporter_binary(), "--version"], capture_output=True, text=True)
    ne_version_line = (ne_version.stdout or ne_version.stderr).splitlines()[0]

    work = Path(tempfile.mkdtemp(prefix="rnic-bench-"))
    table = Table()
    started = time.monotonic()
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        tree, tree_where = tree_dir("rnic-bench-sys-", opts.tree_on_disk)
        stack.callback(shutil.rmtree, tree, True)
        sysfs = tree / "sys"
        writer = BusyWriter(sysfs, opts.devices, opts.gid_slots, opts.busy_period, opts.infiniband)
        stack.callback(writer.close)
        writer.busy(True)
        print(
            f"# {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC; simulated host: {opts.devices} RoCE "
            f"and {opts.infiniband} InfiniBand RNICs, {opts.gid_slots}-slot GID tables, every counter rewritten "
            f"every {opts.busy_period:g} s; "
            f"{os.cpu_count()} CPUs; loadavg {Path('/proc/loadavg').read_text().strip()}"
        )
        print(f"# the tree on {tree_where}")
        print(f"# rnic-exporter: {ours.describe()} (python {opts.python})")
        print(f"# {ne_version_line}; {'netdevs known to rtnetlink' if opts.netdevs else 'netlink blind'}")
        ne_port = free_port()
        ne_url = f"http://127.0.0.1:{ne_port}/metrics"
        ne_proc = stack.enter_context(running(node_exporter_args(sysfs, ne_port), ne_url))
        ne = Daemon("node_exporter", ne_proc.pid, ne_url, ProcessCpu(ne_proc.pid, "node_exporter"))
        stack.callback(ne.cpu.close)
        ne_reads = count_reads(sysfs, ne, PROMETHEUS_LIKE, 0.5, 4).per(4) if opts.extras else None

        # CPU per minute at the defaults, and idle daemons beside, in one real-time window.
        us = stack.enter_context(ours_running(ours, sysfs, work / "state-default", "ours"))
        idle = [
            stack.enter_context(ours_running(ours, sysfs, work / "state-idle", "idle")),
            stack.enter_context(ours_running(ours, sysfs, work / "state-idle-1m", "idle, 1m", "--poll.interval", "60")),
            stack.enter_context(
                ours_running(ours, sysfs, work / "state-idle-nonl", "idle, netlink off", "--no-watch.netlink")
            ),
        ]
        idle.append(stack.enter_context(floor_running(opts.python, sysfs)))
        scrape_floor = stack.enter_context(scrape_floor_running(opts.python, sysfs))
        scraped = [(us, PROMETHEUS_LIKE, SCRAPE_S), (ne, PROMETHEUS_LIKE, SCRAPE_S)]
        scraped.append((scrape_floor, PROMETHEUS_LIKE, SCRAPE_S))
        if opts.compare is not None:  # another checkout, scraped and idle, in the same windows
            flags = opts.ours_flag if opts.compare_flag is None else [f for f in opts.compare_flag if f]
            other = Ours(opts.python, opts.compare.resolve(), tuple(flags))
            them = stack.enter_context(ours_running(other, sysfs, work / "state-compare", "compared"))
            scraped.insert(1, (them, PROMETHEUS_LIKE, SCRAPE_S))
            idle.append(stack.enter_context(ours_running(other, sysfs, work / "state-cidle", "compared idle")))
        paced_window(scraped, opts.warmup)  # the same cadence: start-up and first reads are no user's minute
        w = paced_window(scraped, opts.window, idle)
        o, t = w["ours"], w["node_exporter"]
        table.row("CPU per minute at defaults, busy, 15 s scrapes", o.per_minute_ms(), t.per_minute_ms(), "ms", t.load)
        table.note(
            f"{o.seconds:.0f} s after {opts.warmup:.0f} s of warm-up, {o.scrapes} scrapes each; /proc/<pid>/stat: "
            f"ours {o.ticks}, node_exporter {t.ticks} ticks ({CLK_TCK} a second: "
            f"{o.ticks / CLK_TCK * 60000 / o.seconds:.0f} and {t.ticks / CLK_TCK * 60000 / t.seconds:.0f} ms a minute)"
        )
        if not us.cpu.precise:
            table.note("no writable cpuacct cgroup: CPU from /proc/<pid>/stat ticks (10 ms) only")
        if "compared" in w:
            c = w["compared"]
            table.row("  the same, compared checkout (--compare)", c.per_minute_ms(), t.per_minute_ms(), "ms", t.load)
            table.note(f"{opts.compare}: {c.ticks} ticks; ours/compared {o.cpu_s / c.cpu_s:.2f}x")
        for d in idle:
            i = w[d.name]
            table.row(f"CPU per minute, {d.name}, no scrapes", i.per_minute_ms(), None, "ms", i.load)
        table.note(
            f"{FLOOR}: bench/wake_floor.py, a bare Python process on the idle daemon's timers and reads (the "
            "InfiniBand ports every 5 s, the PCIe links every 30 s), nothing else; the idle daemon less it: "
            f"{w['idle'].per_minute_ms() - w[FLOOR].per_minute_ms():.1f} ms a minute"
        )
        sf = w[SCRAPE_FLOOR]
        table.row(f"CPU per minute, {SCRAPE_FLOOR}, 15 s scrapes", sf.per_minute_ms(), t.per_minute_ms(), "ms", sf.load)
        floors = w[FLOOR].per_minute_ms() + sf.per_minute_ms()
        table.note(
            f"{SCRAPE_FLOOR}: bench/scrape_floor.py, {sf.scrapes} scrapes; the two floors together, the least a "
            f"Python daemon with these budgets and scrapes costs here: {floors:.1f} ms a minute, "
            f"{floors / t.per_minute_ms():.2f}x node_exporter (ours {o.per_minute_ms() / t.per_minute_ms():.2f}x)"
        )
        for name in ("ours", "idle", "compared", "compared idle"):
            if name in w:
                table.note(f"{name} by thread, ms a minute: {by_thread(w[name].threads)}")
        table.note(
            "the scrapes' own share: "
            f"{o.per_minute_ms() - w['idle'].per_minute_ms():.0f} ms a minute (ours less the idle daemon)"
        )
        steady_rss = rss_mb(us.pid), rss_mb(ne.pid)
        for d in idle:
            os.kill(d.pid, signal.SIGTERM)  # done: their `running` reaps them at the end

        if opts.cycle_window > 0:
            with ExitStack() as cycles:
                cyc = cycles.enter_context(
                    ours_running(ours, sysfs, work / "state-cycle", "ours", "--poll.interval", "1")
                )
                cycle = [(cyc, PROMETHEUS_LIKE, 1.0), (ne, PROMETHEUS_LIKE, 1.0)]
                if opts.compare is not None:  # the compared checkout's cycle, in the same window
                    them_cycle = cycles.enter_context(
                        ours_running(other, sysfs, work / "state-ccycle", "compared", "--poll.interval", "1")
                    )
                    cycle.insert(1, (them_cycle, PROMETHEUS_LIKE, 1.0))
                paced_window(cycle, 5)
                w = paced_window(cycle, opts.cycle_window)
                o, t = w["ours"], w["node_exporter"]
                for name, label in (
                    ("ours", "CPU per cycle, busy, 1 s polls and scrapes"),
                    ("compared", "  the same, compared checkout (--compare)"),
                ):
                    if name in w:
                        table.row(label, w[name].per_scrape_ms(), t.per_scrape_ms(), "ms", t.load)
                table.note(f"ours {o.ticks} ticks over {o.scrapes} scrapes, node_exporter {t.ticks} over {t.scrapes}")
                if "compared" in w:
                    table.note(f"per cycle, ours/compared {o.per_scrape_ms() / w['compared'].per_scrape_ms():.2f}x")

        if opts.extras and ne_reads is not None:
            _extras(opts, table, sysfs, us, ne, ne_reads, steady_rss)
    table.print()
    print(
        f"(ours: the default daemon, 5 s polls; a cycle = one poll + one scrape; node_exporter reads sysfs per "
        f"scrape; load1 = 1-minute load average at the end of the window; run took {time.monotonic() - started:.0f} s)"
    )


def _extras(
    opts: argparse.Namespace,
    table: Table,
    sysfs: Path,
    us: Daemon,
    ne: Daemon,
    ne_reads: ReadCounts,
    steady_rss: tuple[float, float],
) -> None:
    file_rows(
        table, "per cycle, busy", count_reads(sysfs, us, PROMETHEUS_LIKE, POLL_S, 3).per(3), ne_reads, load_average()
    )
    file_rows(
        table,
        "per minute at defaults, busy",
        count_reads(sysfs, us, PROMETHEUS_LIKE, SCRAPE_S, 4),
        ne_reads.per(1 / 4),
        load_average(),
    )
    lat: dict[str, list[Latency]] = {}
    concurrency = (1, 40, 50)
    for d in (us, ne):
        lat[d.name] = [wrk_latency(d.url, c, opts.latency_seconds, PROMETHEUS_LIKE.headers) for c in concurrency]
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
    table.row("RSS steady (full daemon, after the per-minute window)", *steady_rss, "MB", load)
    table.row("RSS peak (VmHWM, after 50 clients)", peak_rss_mb(us.pid), peak_rss_mb(ne.pid), "MB", load)


def _in_namespace(devices: int, infiniband: int) -> int:
    """Re-run this benchmark inside a namespace with the simulator's netdev names and addresses (removed
    afterwards); the InfiniBand RNICs' IPoIB netdevs too, as on a real host."""
    from tests.support.netns import network_namespace

    netdevs: dict[str, str | None] = {f"ens{n + 1}f0np0": f"0c:42:a1:41:{n:02x}:36" for n in range(devices)}
    netdevs.update(
        {f"ibp{0x10 + n * 0x10}s0": None for n in range(devices, devices + infiniband)}
    )  # rnic_exporter.sim's
    with network_namespace(netdevs, prefix="rnb") as ns:
        for n in range(devices):
            ns.ip("addr", "add", f"10.0.{n}.1/24", "dev", f"ens{n + 1}f0np0")
        return subprocess.run(ns.exec_args(sys.executable, *sys.argv, "--inside-netns")).returncode


if __name__ == "__main__":
    main()
