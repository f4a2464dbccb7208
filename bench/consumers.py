"""Benchmark: one consumers scan (`rnic_exporter.sources.consumers.scan`) over a process table of
10,000 real processes. Prints figures. Needs root (holders use private mount namespaces).

    .venv/bin/python bench/consumers.py [--processes 10000] [--fds 0 29] [--repeat 5] [--holders 4]

Runs in a new PID namespace of its own (`unshare --pid --fork --mount-proc`: this machine is
shared, and other users' processes with thousands of descriptors would otherwise be most of what
is measured), so the procfs scanned holds exactly its own processes. Starts `--processes` real
`/bin/sleep` processes (posix_spawn, one process group, so they are
cheap to start and all killed at the end, also on Ctrl-C), each with 3 descriptors plus
`--fds` more (inherited pipes: a real service holds more than a sleeper). `--holders` of them hold
`/dev/infiniband/uverbsN` open in a private mount namespace (see `tests/support/verbs_holders.py`)
against a simulated sysfs. For each descriptor count, reports the CPU time (this process's
utime+stime, which is the scan alone) and wall time of `--repeat` complete scans (no budget),
min and median, and what the default budget (5 s) leaves complete. Quote `/proc/loadavg` with it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rnic_exporter.sim import SimHost  # noqa: E402
from rnic_exporter.sources.consumers import DEFAULT_BUDGET_S, scan  # noqa: E402
from tests.support.verbs_holders import OPENABLE_CHAR_DEVICES, holders, start  # noqa: E402

SLEEP = "/bin/sleep"


@contextlib.contextmanager
def sleepers(count: int, extra_fds: int) -> Iterator[list[int]]:
    """`count` sleeping processes in one new process group, each inheriting `extra_fds` pipe ends."""
    inherited: list[int] = []
    for _ in range((extra_fds + 1) // 2):
        inherited.extend(os.pipe())
    inherited = inherited[:extra_fds]
    for fd in inherited:
        os.set_inheritable(fd, True)
    pids: list[int] = []
    try:
        for _ in range(count):
            pids.append(os.posix_spawn(SLEEP, [SLEEP, "3600"], os.environ, setpgroup=pids[0] if pids else 0))
        yield pids
    finally:
        if pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pids[0], signal.SIGKILL)
            for pid in pids:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
        for fd in inherited:
            os.close(fd)


def cpu() -> float:
    t = os.times()
    return t.user + t.system


def measure(procfs: Path, sysfs: Path, rootfs: Path, repeat: int) -> tuple[list[float], list[float], int, int]:
    cpus, walls = [], []
    scanned = found = 0
    for _ in range(repeat):
        c0, w0 = cpu(), time.perf_counter()
        result = scan(procfs, sysfs, rootfs, budget_s=600)
        walls.append(time.perf_counter() - w0)
        cpus.append(cpu() - c0)
        assert result.complete
        scanned = result.processes_scanned
        found = sum(len(cs) for cs in result.by_device.values())
    return cpus, walls, scanned, found


def fd_entries(procfs: Path) -> int:
    total = 0
    for name in os.listdir(procfs):
        if name.isdigit():
            with contextlib.suppress(OSError):
                total += len(os.listdir(procfs / name / "fd"))
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)  # inside the PID namespace
    parser.add_argument("--processes", type=int, default=10_000)
    parser.add_argument("--fds", type=int, nargs="+", default=[0, 29], help="extra descriptors per process")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--holders", type=int, default=4)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (a PID namespace; holders mount a tmpfs in a private mount namespace)")
    if not args.inner:
        print(f"load before: {Path('/proc/loadavg').read_text().strip()}", flush=True)
        unshare = ["unshare", "--pid", "--fork", "--mount", "--mount-proc", "--propagation", "private"]
        code = subprocess.call([*unshare, sys.executable, __file__, "--inner", *sys.argv[1:]])
        sys.exit(code)
    with tempfile.TemporaryDirectory(prefix="rnic-bench-consumers-") as tmp:
        host = SimHost.build(Path(tmp) / "sys", roce=3, gid_table_size=4)
        for name, (major, minor) in zip(sorted(host.devices), OPENABLE_CHAR_DEVICES, strict=True):
            host.set_verbs_rdev(name, major, minor)
        procfs, rootfs = Path("/proc"), Path(tmp) / "root"
        with holders() as held:
            for i in range(args.holders):
                n = i % len(OPENABLE_CHAR_DEVICES)
                start(held, {f"uverbs{n}": OPENABLE_CHAR_DEVICES[n]})
            for extra in args.fds:
                t0 = time.perf_counter()
                with sleepers(args.processes, extra):
                    spawned = time.perf_counter() - t0
                    total = sum(1 for name in os.listdir(procfs) if name.isdigit())
                    fds = fd_entries(procfs)
                    cpus, walls, scanned, found = measure(procfs, host.root, rootfs, args.repeat)
                    cpu_ms, wall_ms = statistics.median(cpus) * 1000, statistics.median(walls) * 1000
                    budgeted = scan(procfs, host.root, rootfs, budget_s=DEFAULT_BUDGET_S)
                    print(
                        f"{total} processes ({args.processes} sleepers with {3 + extra} fds, spawned in "
                        f"{spawned:.1f} s), {fds} descriptors, {found} consumers found, {scanned} scanned:\n"
                        f"  CPU  per scan: min {min(cpus) * 1000:.0f} ms, median {cpu_ms:.0f} ms"
                        f" ({1000 * cpu_ms / total:.0f} us per process)\n"
                        f"  wall per scan: min {min(walls) * 1000:.0f} ms, median {wall_ms:.0f} ms\n"
                        f"  default budget {DEFAULT_BUDGET_S:.0f} s: complete={budgeted.complete}, "
                        f"scanned {budgeted.processes_scanned}, unscanned {budgeted.unscanned}, "
                        f"{budgeted.duration_s * 1000:.0f} ms"
                    )


if __name__ == "__main__":
    main()
