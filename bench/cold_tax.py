"""What a pass costs cold against warm: the same pass back to back, then with the daemon's gaps between.

The daemon's passes come seconds apart (an InfiniBand host's state pass every 5 s, a scrape every
15 s), and by then the caches hold other processes' work: the same code costs several times its
back-to-back figure. This measures that tax on the daemon's own code paths, in one process, CPU
per pass (`time.thread_time`, and the read worker's thread CPU through its clock id):

- **state pass**: a trusted state pass over 16 InfiniBand RNICs (their ports' state and rate
  files, nothing changed), the loop's side and the `ReadRunner` worker's, as `serve` runs it;
- **its floor**: the same port files `pread` in one comprehension on the calling thread, nothing else;
- **scrape**: a counter pass over 16 RoCE RNICs whose every counter moved (the bench's busy
  host's `bump_every_counter` between passes, not timed) and the Prometheus sink's gzipped render;
- **link health**: one window judged (`LinkHealthTracker.observe`) over those 16 ports, every one
  with moving error counters (the bench's busy host: all judged degrading); the read is not timed.

    .venv/bin/python bench/cold_tax.py [--gaps 0,1,5] [--seconds 60]

Each gap runs for about `--seconds` (at least 10 passes); gap 0 is the warm figure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import PROMETHEUS_ACCEPT, bump_every_counter

from rnic_exporter.detect.link_health_events import LinkHealthTracker
from rnic_exporter.model.host import Snapshot
from rnic_exporter.sim import SimHost
from rnic_exporter.sim.sysfs_root import SimSysfsRoot
from rnic_exporter.sinks.samples import ExporterStats
from rnic_exporter.sources.infiniband import PORT_WATCHED
from rnic_exporter.sources.read_thread import ReadRunner
from rnic_exporter.sources.reader import HostReader, Job
from tests.support.agents import FedSink, publish

# The state reads' worker, named as `serve`'s (daemon/agent.py: ReadRunner("state") -> "state-reads").
STATE = "state"


def thread_cpu(thread: threading.Thread | None) -> float:
    """CPU seconds of another thread of this process (0 when there is none)."""
    if thread is None or thread.ident is None:
        return 0.0
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    except (OSError, ValueError):  # the worker exited
        return 0.0


def worker_thread(name: str) -> threading.Thread | None:
    return next((t for t in threading.enumerate() if t.name == name), None)


def measure(
    one_pass: Callable[[], None], between: Callable[[], None], gap: float, seconds: float
) -> tuple[float, float, int]:
    """(caller ms, read worker ms) per pass, and the passes run."""
    passes = 200 if gap == 0 else max(10, int(seconds / gap))
    caller = worker = 0.0
    for _ in range(passes):
        between()
        if gap:
            time.sleep(gap)  # the daemon's interval: what makes the next pass cold is time passing
        w0, t0 = thread_cpu(worker_thread(f"{STATE}-reads")), time.thread_time()
        one_pass()
        caller += time.thread_time() - t0
        worker += thread_cpu(worker_thread(f"{STATE}-reads")) - w0
    return caller * 1000 / passes, worker * 1000 / passes, passes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gaps", default="0,1,5", help="seconds between passes, comma-separated (0: back to back)")
    parser.add_argument("--seconds", type=float, default=60.0, help="about how long each gap runs")
    opts = parser.parse_args()
    gaps = [float(g) for g in opts.gaps.split(",")]
    work = Path(tempfile.mkdtemp(prefix="rnic-cold-"))
    try:
        ib = SimHost.build(work / "ib", roce=0, infiniband=16, gid_table_size=16)
        reader = HostReader(SimSysfsRoot(ib.root, hold_fds=True))
        runner = ReadRunner(STATE)

        def run_state(jobs: Sequence[Job]) -> None:
            runner.run(jobs)

        reader.state_pass(full_gid_tables=True, runner=run_state)

        def state_pass() -> None:
            reader.state_pass(trust_events=True, runner=run_state)

        # The floor of that pass: the same port files (the reader's port tier, as bench/wake_floor.py
        # takes them), `pread` in one comprehension on this thread.
        ports = sorted((ib.root / "class" / "infiniband").glob("*/ports/*"))
        port_files = [port / attribute.file for port in ports for attribute in PORT_WATCHED]
        port_fds = [os.open(path, os.O_RDONLY | os.O_CLOEXEC) for path in port_files]

        def bare_reads() -> None:
            [os.pread(fd, 4096, 0) for fd in port_fds]

        roce = SimHost.build(work / "roce", roce=16, gid_table_size=16)
        counters = HostReader(SimSysfsRoot(roce.root, hold_fds=True))
        fed = FedSink(counters)
        publish(fed.sink, counters.read(), ExporterStats())

        def scrape() -> None:
            fed.counters.due = True
            fed.sink.render(PROMETHEUS_ACCEPT, "gzip")

        # Link health's judgement of a window in which every port's error counters moved (the
        # bench's busy host: every port judged degrading), as the daemon's link-health thread runs it.
        for name in roce.devices:
            roce.degrade_link(name, {"symbol_error": 5.0, "link_error_recovery": 0.1, "out_of_sequence": 50.0})
        judged = HostReader(SimSysfsRoot(roce.root, hold_fds=True))
        tracker = LinkHealthTracker(window_s=1.0)
        window: list[tuple[Snapshot, float]] = []  # the window's snapshot and its time (one a second)

        def next_window() -> None:
            roce.add_traffic(1.0)
            window[:] = [(judged.read(), window[0][1] + 1.0 if window else 0.0)]

        next_window()
        tracker.observe(*window[0])

        def judge() -> None:
            tracker.observe(*window[0])

        print(f"{'pass':<44}{'gap':>6}{'passes':>8}{'caller':>10}{'worker':>10}{'total':>10}  vs warm")
        for label, one, between in (
            ("state pass, 16 InfiniBand RNICs (trusted)", state_pass, lambda: None),
            (f"its floor: {len(port_fds)} port files, bare preads", bare_reads, lambda: None),
            ("scrape, 16 RoCE RNICs, every counter moved", scrape, lambda: bump_every_counter(roce, 1.0)),
            ("link health, 16 RoCE ports all degrading", judge, next_window),
        ):
            warm = None
            for gap in gaps:
                c, w, n = measure(one, between, gap, opts.seconds)
                total = c + w
                warm = total if warm is None else warm
                print(f"{label:<44}{gap:>5g}s{n:>8}{c:>8.3f}ms{w:>8.3f}ms{total:>8.3f}ms  {total / warm:.1f}x")
        runner.close()
        for fd in port_fds:
            os.close(fd)
        print("(CPU per pass: caller = the calling thread, worker = the state reads' worker; ms)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
