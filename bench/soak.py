"""Soak: a real `rnic-exporter serve` under a host that keeps failing, for an hour. Prints figures.

    .venv/bin/python bench/soak.py [--minutes 60] [--devices 16] [--poll 2] [--src DIR] [--hung-reads 120:20]

Every RNIC of a simulated host runs through the same cycle, one step each time the exporter has
reported the previous one: a flap (down, up), a GID shift as in incident 1 (a job holds the v2 GID,
the port goes down, the address is removed, the port comes up, the address comes back at a higher
index, the job ends), a rate drop and its recovery, a PCIe link drop and its recovery, and the
device falling off the bus and registering again. Devices start at different points of the cycle,
so with 16 RNICs and a 2 s poll something changes several times a second.

Checked, and printed with a verdict:
- **every injected event seen exactly once**: for each step the simulator side says which events it
  must cause (port up/down, address lost/restored, GID moved, GID table changed when the visible
  table changed, link below rated/restored per link, device disappeared/reappeared, flapping on the
  4th transition of a device's life within the flap window, discovery at start). The exporter's
  JSON event log lines are counted against that, as they arrive (a second sighting is a failure at
  once), and `rnic_events_total` is compared with the log at every sample and at the end.
  NCCL's pick (`rnic.nccl.*`) and address-loss risks are derived, not injected: counted, checked against
  the metric, not against the oracle.
- **no growth after warm-up**: RSS, open descriptors and threads of the daemon, sampled every
  `--sample` seconds at a moment when every device is registered (removals wait for the sample).
- with `--hung-reads EVERY:SECONDS` the daemon reads the tree through the FUSE fault filesystem
  (`tests/support/faultfs.py`) and one device's counter read blocks for SECONDS every EVERY seconds.
  Until reads are isolated per device, a blocked read stalls the whole poll: then leave it off.

Injections are made right after a poll ended (the exporter runs at debug level for its "poll" line;
its event lines serve too), with the exporter paused by SIGSTOP while the files are written, so
no poll reads a half-written change (a change of several files is not atomic here, nor in the
kernel; on a loaded machine the writes of a re-registration can take longer than a poll interval).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import memtrace

from tests.support.serve import Ours
from tests.support.soak import SoakConfig, report, run_soak


def _tracer(opts: argparse.Namespace) -> Callable[[Path, float, float], dict[str, str]] | None:
    """With --memtrace: installs the daemon's memory tracer (bench/memtrace.py) with the flags' choices."""
    if opts.memtrace is None:
        return None
    out = opts.memtrace.resolve()

    def install(site: Path, every: float, snapshot_every: float) -> dict[str, str]:
        return memtrace.install(
            site, out, every, snapshot_every, opts.memtrace_trim, opts.memtrace_frames, opts.memtrace_census
        )

    return install


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--devices", type=int, default=16)
    parser.add_argument("--gid-slots", type=int, default=255)
    parser.add_argument("--poll", type=float, default=2.0, help="the exporter's --poll.interval")
    parser.add_argument("--sample", type=float, default=60.0, help="seconds between resource samples")
    parser.add_argument("--warmup", type=float, default=None, help="seconds before growth counts (default: 1/6)")
    parser.add_argument(
        "--hung-reads",
        default="",
        metavar="EVERY:SECONDS",
        help="block one counter read for SECONDS every EVERY seconds (FUSE; off by default)",
    )
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--src", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--step-timeout", type=float, default=None, help="seconds a step may take to be seen")
    parser.add_argument("--log", type=Path, default=None, help="append every line the exporter logs to this file")
    parser.add_argument(
        "--memtrace",
        type=Path,
        default=None,
        metavar="DIR",
        help="run the daemon under tracemalloc: a memory line every --sample seconds and four snapshots in DIR "
        "(bench/memtrace.py diff/curve reads them)",
    )
    parser.add_argument(
        "--memtrace-trim", action="store_true", help="malloc_trim(0) at each snapshot (RSS before/after)"
    )
    parser.add_argument(
        "--memtrace-frames", type=int, default=10, help="tracemalloc frames (0: no tracemalloc, RSS and mallinfo2 only)"
    )
    parser.add_argument(
        "--memtrace-census", action="store_true", help="the collector's objects by type at each sample (census.jsonl)"
    )
    parser.add_argument(
        "--netns",
        action=argparse.BooleanOptionalAction,
        default=os.geteuid() == 0,
        help="run in a fresh, empty network namespace (default as root): the netdevs other work on this "
        "machine creates and removes are not seen by the exporter's netlink watcher",
    )
    parser.add_argument("--inside-netns", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.netns and not opts.inside_netns:
        from tests.support.netns import network_namespace

        with network_namespace([], prefix="rsk") as ns:
            sys.exit(subprocess.run(ns.exec_args(sys.executable, *sys.argv, "--inside-netns")).returncode)
    hung_every, hung_block = (float(x) for x in opts.hung_reads.split(":")) if opts.hung_reads else (0.0, 20.0)
    seconds = opts.minutes * 60
    ours = Ours(opts.python, opts.src.resolve() if opts.src else None)
    config = SoakConfig(
        seconds=seconds,
        devices=opts.devices,
        gid_slots=opts.gid_slots,
        poll_s=opts.poll,
        sample_s=opts.sample,
        warmup_s=opts.warmup if opts.warmup is not None else seconds / 6,
        hung_every_s=hung_every,
        hung_block_s=hung_block,
        ours=ours,
        seed=opts.seed,
        step_timeout_s=opts.step_timeout,
        log_copy=opts.log,
        tracer=_tracer(opts),
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC; rnic-exporter {ours.describe()}; "
        f"loadavg {Path('/proc/loadavg').read_text().strip()}",
        flush=True,
    )
    result = run_soak(config, lambda line: print(line, flush=True))
    report(result)
    sys.exit(0 if result.ok else 1)


if __name__ == "__main__":
    main()
