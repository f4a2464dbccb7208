"""Where a process's CPU goes, by thread: the benchmarks' per-thread figures (bench/bench.py).

Python (before 3.14) leaves its threads' OS names as the process's. `THREAD_NAMES` is a directory
whose `sitecustomize` names each OS thread after its Python thread as it starts: first on the
PYTHONPATH of an rnic-exporter, it makes /proc/<pid>/task/<tid>/comm say `state-reads`,
`link-health`, `rnic-web-0`, and `thread_cpu_ns` reads those names with each thread's CPU.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

THREAD_NAMES = Path(__file__).resolve().parent / "thread_names"
MAIN_THREAD = "main (poll loop)"


def with_thread_names(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with `THREAD_NAMES` first on its PYTHONPATH."""
    out = dict(env)
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(THREAD_NAMES), out.get("PYTHONPATH")]))
    return out


def thread_cpu_ns(pid: int) -> dict[int, tuple[str, int]]:
    """Each live thread of `pid`: its name and the CPU it has run (ns, /proc/<pid>/task/<tid>/schedstat).
    The main thread is `MAIN_THREAD`; a thread that exits between listing and reading is left out."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            ran = int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        tid = int(task.name)
        out[tid] = (MAIN_THREAD if tid == pid else name, ran)
    return out


def per_thread_ms(
    before: Mapping[int, tuple[str, int]], after: Mapping[int, tuple[str, int]], seconds: float
) -> dict[str, float]:
    """CPU a minute by thread name between two `thread_cpu_ns` readings `seconds` apart (threads of
    one name summed; one that started in between counts from zero, one that exited is not seen)."""
    out: dict[str, float] = {}
    for tid, (name, ran) in after.items():
        since = ran - before.get(tid, (name, 0))[1]
        out[name] = out.get(name, 0.0) + since / 1e6 * 60 / seconds
    return out
