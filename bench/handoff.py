"""What moving reads off the poll loop costs: one sacrificial thread per pass vs one thread per device.

Each pass runs 16 jobs (one per simulated device) of 8 `pread`s on held descriptors, the state
pass of a quiet 16-RNIC host:
- inline: on the calling thread (no isolation at all);
- one worker per pass: `ReadRunner` (the design shipped), one hand-off per pass;
- one worker per device: a thread per device, woken per pass (16 hand-offs per pass).
Prints the process CPU and the wall time per pass.

    .venv/bin/python bench/handoff.py --passes 2000
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rnic_exporter.sources.read_thread import Gate, ReadRunner

DEVICES, FILES = 16, 8


class PerDevice:
    """One long-lived thread per device; a pass wakes each and waits for all."""

    def __init__(self, jobs: list[Callable[[], None]]) -> None:
        self._jobs = jobs
        self._go = [threading.Event() for _ in jobs]
        self._done = threading.Semaphore(0)
        self._stop = False
        self._threads = [threading.Thread(target=self._work, args=(i,), daemon=True) for i in range(len(jobs))]
        for t in self._threads:
            t.start()

    def _work(self, i: int) -> None:
        while True:
            self._go[i].wait()
            self._go[i].clear()
            if self._stop:
                return
            self._jobs[i]()
            self._done.release()

    def run(self) -> None:
        for go in self._go:
            go.set()
        for _ in self._jobs:
            self._done.acquire()

    def close(self) -> None:
        self._stop = True
        for go in self._go:
            go.set()


def measure(label: str, run: Callable[[], None], passes: int) -> None:
    for _ in range(50):
        run()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(passes):
        run()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(f"{label:>22}: {cpu / passes * 1e6:7.1f} us CPU  {wall / passes * 1e6:7.1f} us wall per pass")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passes", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fds = []
        for d in range(DEVICES):
            row = []
            for f in range(FILES):
                path = Path(tmp) / f"{d}-{f}"
                path.write_text("4: ACTIVE\n")
                row.append(os.open(path, os.O_RDONLY))
            fds.append(row)

        def job(row: list[int]) -> Callable[[], None]:
            def read() -> None:
                for fd in row:
                    os.pread(fd, 128, 0)

            return read

        jobs = [job(row) for row in fds]
        gates = [Gate(f"dev{d}") for d in range(DEVICES)]

        def inline() -> None:
            for gate, j in zip(gates, jobs, strict=True):
                with gate.lock:
                    j()

        runner = ReadRunner("bench")
        per_device = PerDevice(jobs)
        print(f"{DEVICES} devices x {FILES} preads per pass, {args.passes} passes, {os.cpu_count()} CPUs")
        measure("inline", inline, args.passes)

        def handed_off() -> None:
            runner.run(list(zip(gates, jobs, strict=True)))

        measure("one worker per pass", handed_off, args.passes)
        measure("one worker per device", per_device.run, args.passes)
        runner.close()
        per_device.close()


if __name__ == "__main__":
    main()
