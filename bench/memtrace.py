"""Where a daemon's memory goes over time: a `sitecustomize` that traces it from inside the process.

`bench/soak.py --memtrace DIR` puts the directory holding this file's generated `sitecustomize.py`
first on the daemon's PYTHONPATH (with PYTHONTRACEMALLOC set), so the exporter itself is not
changed. Every `every` seconds the daemon appends one JSON line to DIR/memory.jsonl: its RSS,
what tracemalloc traces, glibc's `mallinfo2` (arena bytes, in use, free in the heap, mmapped) and
pymalloc's own statistics (arenas, bytes in used and free blocks, unused pools, from
`sys._debugmallocstats` printed by a forked child into a pipe), and the garbage collector's runs
per generation with their total and longest time. Every `snapshot_every` seconds it
also writes a tracemalloc snapshot when tracing (DIR/snap-<seconds>.pickle) and, with `trim`,
calls `malloc_trim(0)` and records RSS before and after (what is free in the heap but kept
resident, i.e. fragmentation, shows up as the difference).

    python bench/memtrace.py diff DIR/snap-A.pickle DIR/snap-B.pickle   # top growth by traceback
    python bench/memtrace.py curve DIR/memory.jsonl                     # the samples as a table
"""

from __future__ import annotations

import json
import sys
import tracemalloc
from pathlib import Path

SITECUSTOMIZE = """
import ctypes, json, os, re, sys, threading, time, tracemalloc

class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

def _rss_kb():
    text = open("/proc/self/status").read()
    return int(re.search(r"VmRSS:\\s+(\\d+)", text)[1])

_PYMALLOC = {"arenas allocated total": "arenas_total", "arenas reclaimed": "arenas_reclaimed",
             "arenas allocated current": "arenas", "bytes in allocated blocks": "blocks_used",
             "bytes in available blocks": "blocks_free"}

def _pymalloc():
    # sys._debugmallocstats() prints to C stderr, which is the daemon's log: a forked child prints
    # it into a pipe instead (the child has the parent's heap as it was, and exits at once).
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.dup2(w, 2)
        sys._debugmallocstats()
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        text = f.read().decode(errors="replace")
    os.waitpid(pid, 0)
    found = {}
    for line in text.splitlines():
        key, _, value = line.lstrip("# ").partition("=")
        if key.strip() in _PYMALLOC:
            found[_PYMALLOC[key.strip()]] = int(value.strip().replace(",", ""))
        elif "unused pools *" in line:
            found["unused_pools"] = int(value.strip().replace(",", ""))
    return found

def _census(out, t):
    # What the collector tracks after a full collection, by type, and the biggest containers: a leak
    # of objects shows here as a count or a length that keeps rising (str and int are not tracked;
    # their holders are). The collection changes the daemon's own curve: run it apart from the RSS run.
    import collections, gc
    # Garbage waiting for the collector is not a leak: count what survives a full collection, and
    # what it collected by type (reference cycles that outlive a poll reach the oldest generation,
    # which is collected rarely, so they hold memory for long).
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        collected = gc.collect()
        garbage = collections.Counter(type(o).__module__ + "." + type(o).__qualname__ for o in gc.garbage)
        gc.garbage.clear()
    finally:
        gc.set_debug(0)
    objects = gc.get_objects()
    types = collections.Counter(type(o).__module__ + "." + type(o).__qualname__ for o in objects)
    big = []
    for o in objects:
        if isinstance(o, (dict, list, set, collections.deque)) and len(o) >= 500:
            first = next(iter(o), None)
            big.append((len(o), type(o).__name__, id(o), repr(first)[:80]))
    big.sort(reverse=True)
    del objects
    with open(os.path.join(out, "census.jsonl"), "a") as f:
        line = {"t": t, "collected": collected, "garbage": dict(garbage), "types": dict(types), "big": big[:25]}
        f.write(json.dumps(line) + "\\n")

_GC = [[0, 0.0, 0.0] for _ in range(3)]  # per generation: collections, seconds, longest (gc.callbacks)
_gc_started = [0.0]

def _on_gc(phase, info):
    if phase == "start":
        _gc_started[0] = time.perf_counter()
    else:
        took = time.perf_counter() - _gc_started[0]
        g = _GC[info["generation"]]
        g[0] += 1
        g[1] += took
        g[2] = max(g[2], took)

def _run(out, every, snapshot_every, trim):
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = _Mallinfo2
    t0 = time.monotonic()
    next_snapshot = t0 + snapshot_every
    while True:
        time.sleep(every)
        now = time.monotonic()
        info = libc.mallinfo2()
        traced, peak = tracemalloc.get_traced_memory()
        line = {"t": round(now - t0, 1), "rss_kb": _rss_kb(), "traced": traced, "traced_peak": peak,
                "tracemalloc_overhead": tracemalloc.get_tracemalloc_memory(),
                "arena": info.arena, "in_use": info.uordblks, "free": info.fordblks, "mmapped": info.hblkhd,
                "keepcost": info.keepcost, "threads": threading.active_count(), "pymalloc": _pymalloc(),
                "gc": [[n, round(total, 4), round(longest, 4)] for n, total, longest in _GC]}
        if now >= next_snapshot:
            next_snapshot += snapshot_every
            if tracemalloc.is_tracing():
                tracemalloc.take_snapshot().dump(os.path.join(out, "snap-%05d.pickle" % (now - t0)))
            if trim:
                line["rss_before_trim_kb"] = _rss_kb()
                libc.malloc_trim(0)
                line["rss_after_trim_kb"] = _rss_kb()
        with open(os.path.join(out, "memory.jsonl"), "a") as f:
            f.write(json.dumps(line) + "\\n")
        if os.environ.get("MEMTRACE_CENSUS") == "1":
            _census(out, line["t"])

_out = os.environ.get("MEMTRACE_DIR")
if _out:
    import gc
    gc.callbacks.append(_on_gc)
    threading.Thread(target=_run, args=(_out, float(os.environ.get("MEMTRACE_EVERY", "60")),
        float(os.environ.get("MEMTRACE_SNAPSHOT_EVERY", "900")), os.environ.get("MEMTRACE_TRIM") == "1"),
        name="memtrace", daemon=True).start()
"""


def install(
    directory: Path,
    out: Path,
    every: float,
    snapshot_every: float,
    trim: bool,
    frames: int = 10,
    census: bool = False,
) -> dict[str, str]:
    """Write the sitecustomize into `directory`; the environment the daemon needs to run it.

    `frames` 0: no tracemalloc (it costs memory and time of its own, and its snapshots fragment the
    heap), only RSS and mallinfo2: the run whose RSS curve is the exporter's own. `census`: each
    sample also appends the collector's objects by type and the biggest containers to DIR/census.jsonl.
    """
    directory.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {"PYTHONTRACEMALLOC": str(frames)} if frames else {}
    return env | {
        "MEMTRACE_DIR": str(out),
        "MEMTRACE_EVERY": str(every),
        "MEMTRACE_SNAPSHOT_EVERY": str(snapshot_every),
        "MEMTRACE_TRIM": "1" if trim else "0",
        "MEMTRACE_CENSUS": "1" if census else "0",
    }


def diff(before: Path, after: Path, top: int = 25) -> None:
    a, b = tracemalloc.Snapshot.load(str(before)), tracemalloc.Snapshot.load(str(after))
    keep = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib._bootstrap>")]
    a, b = a.filter_traces(keep), b.filter_traces(keep)
    total_a = sum(s.size for s in a.statistics("filename"))
    total_b = sum(s.size for s in b.statistics("filename"))
    print(f"traced: {total_a / 1e6:.2f} MB -> {total_b / 1e6:.2f} MB ({(total_b - total_a) / 1e3:+.0f} kB)")
    for kind in ("lineno", "traceback"):
        print(f"-- top growth by {kind}")
        for stat in b.compare_to(a, kind)[:top]:
            if stat.size_diff <= 0:
                continue
            print(f"{stat.size_diff / 1e3:+9.1f} kB {stat.count_diff:+7d} blocks  (now {stat.size / 1e3:.1f} kB)")
            frames = stat.traceback.format()[-12:] if kind == "traceback" else stat.traceback.format()[:2]
            for line in frames:
                print(f"      {line}")


def curve(path: Path) -> None:
    """The samples as a table. pymalloc's own figures (MB): `arenas` mapped, `used` in live blocks,
    `free` in free blocks of its pools and in pools no size class holds: what it keeps but does not use;
    the full collections run so far and the longest one."""
    print(
        f"{'t s':>7} {'RSS MB':>7} {'traced':>7} {'arena':>7} {'in use':>7} {'free':>7} {'mmap':>6} "
        f"{'pym ar':>6} {'used':>6} {'free':>6} {'full gc':>7} {'max ms':>6}  trim"
    )
    for raw in path.read_text().splitlines():
        s = json.loads(raw)
        trim = (
            f"{s['rss_before_trim_kb'] / 1024:.1f} -> {s['rss_after_trim_kb'] / 1024:.1f}"
            if "rss_after_trim_kb" in s
            else ""
        )
        pym = s.get("pymalloc") or {}
        full = (s.get("gc") or [[0, 0.0, 0.0]] * 3)[2]  # full collections so far, and the longest
        arenas = pym.get("arenas", 0)
        used = pym.get("blocks_used", 0) / 2**20
        kept = (pym.get("blocks_free", 0) + pym.get("unused_pools", 0)) / 2**20
        print(
            f"{s['t']:7.0f} {s['rss_kb'] / 1024:7.1f} {s['traced'] / 2**20:7.2f} {s['arena'] / 2**20:7.2f} "
            f"{s['in_use'] / 2**20:7.2f} {s['free'] / 2**20:7.2f} {s['mmapped'] / 2**20:6.2f} "
            f"{arenas:6d} {used:6.2f} {kept:6.2f} {full[0]:7d} {full[2] * 1000:6.1f}  {trim}"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["diff"]:
        diff(Path(sys.argv[2]), Path(sys.argv[3]))
    elif sys.argv[1:2] == ["curve"]:
        curve(Path(sys.argv[2]))
    else:
        raise SystemExit(__doc__)
