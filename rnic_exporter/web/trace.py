"""Where a request's time goes in the web front: a hidden timing trace for `bench/abuse.py`.

Off unless the environment variable RNIC_EXPORTER_WEB_TRACE names a file; then the front records,
and writes there as JSON when it shuts down:
- every round of the reactor's loop: when it started, how long its work took (after select
  returned), and how many reads, handshake steps and accepts it did;
- for each request carrying an `X-Trace` header: when its connection was accepted, its TLS
  handshake finished, its head was complete, a worker (or keeper) took it, its response was
  written (all `time.monotonic()`, which is one clock for every process on the host, so the bench
  joins them with the client's own timestamps);
- a probe thread that sleeps 2 ms in a loop and records how late it wakes: a thread that wants the
  GIL back waits for whoever holds it (and for a core), so its lateness is what any of the front's
  threads pays to run again;
- the CPU time of the process's threads, by thread name (workers together, keepers together),
  sampled every half second.
Costs nothing when off: the front tests one module attribute per round and per request.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

ENV = "RNIC_EXPORTER_WEB_TRACE"
HEADER = "X-Trace"
_PROBE_SLEEP = 0.002
_CPU_EVERY = 0.5


class Trace:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.rounds: deque[tuple[float, float, int, int, int]] = deque(maxlen=500_000)
        self.requests: list[dict[str, Any]] = []
        self.probe: deque[tuple[float, float]] = deque(maxlen=500_000)  # (when, how late)
        # (when, thread name -> CPU seconds so far); threads that ended keep their last figure
        self.cpu: deque[tuple[float, dict[str, float]]] = deque(maxlen=20_000)
        self._cpu_by_tid: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._clock_tick = os.sysconf("SC_CLK_TCK")

    def start(self) -> None:
        threading.Thread(target=self._probe, name="rnic-web-trace-probe", daemon=True).start()
        threading.Thread(target=self._sample_cpu, name="rnic-web-trace-cpu", daemon=True).start()

    def round(self, started: float, reads: int, handshakes: int, accepts: int) -> None:
        self.rounds.append((started, time.monotonic() - started, reads, handshakes, accepts))

    def request(self, trace_id: str, times: dict[str, float]) -> None:
        self.requests.append({"id": trace_id, **times})

    def _probe(self) -> None:
        while not self._stop.is_set():
            before = time.monotonic()
            time.sleep(_PROBE_SLEEP)
            self.probe.append((before, time.monotonic() - before - _PROBE_SLEEP))

    def _sample_cpu(self) -> None:
        while not self._stop.wait(_CPU_EVERY):
            self._read_cpu()

    def _read_cpu(self) -> None:
        for thread in threading.enumerate():
            tid = thread.native_id
            if tid is None:
                continue
            try:
                fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            name = thread.name.rstrip("0123456789-") or thread.name  # workers together, keepers together
            self._cpu_by_tid[tid] = (name, (int(fields[11]) + int(fields[12])) / self._clock_tick)
        totals: dict[str, float] = {}
        for name, seconds in self._cpu_by_tid.values():
            totals[name] = totals.get(name, 0.0) + seconds
        self.cpu.append((time.monotonic(), totals))

    def dump(self) -> None:
        self._stop.set()
        self._read_cpu()
        data = {
            "rounds": list(self.rounds),
            "requests": self.requests,
            "probe": list(self.probe),
            "cpu": list(self.cpu),
            "switch_interval": __import__("sys").getswitchinterval(),
        }
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.path)


TRACE: Trace | None = None


def start_from_environment() -> None:
    global TRACE  # noqa: PLW0603 (one per process, tested by the front without a call)
    path = os.environ.get(ENV)
    if path and TRACE is None:
        TRACE = Trace(Path(path))
        TRACE.start()


def dump() -> None:
    if TRACE is not None:
        TRACE.dump()
