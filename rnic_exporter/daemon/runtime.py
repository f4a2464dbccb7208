"""Process tuning, once per daemon: the GIL's switch interval, glibc's malloc arenas, and the garbage
collector after start-up. The daemon's `run()` calls these; no library module sets process policy."""

from __future__ import annotations

import gc
import logging
import os
import sys
import threading

log = logging.getLogger("rnic_exporter.agent")

# A thread waiting for the GIL forces a switch after this long. The default 5 ms, paid on each of a
# scrape's socket calls while the web reactor is busy with a flood, dominates its latency; 1 ms costs
# a CPU-bound thread a few more switches.
SWITCH_INTERVAL_S = 0.001
# glibc malloc arenas for the whole process (see limit_malloc_arenas).
MALLOC_ARENAS = 2
_M_ARENA_MAX = -8  # mallopt() parameter, malloc.h
# Generation 0 collections every ~50k allocations instead of 700: a busy pass allocates a few
# thousand short-lived objects, and the long-lived ones are frozen after start-up.
GC_GEN0_THRESHOLD = 50_000


def tune_process() -> None:
    """Before serving: the switch interval and the malloc arenas (both hold for threads started before)."""
    sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
    limit_malloc_arenas()


def limit_malloc_arenas() -> None:
    """Cap glibc's malloc arenas for the process (unless the operator set MALLOC_ARENA_MAX).

    glibc gives a thread that finds no free arena one of its own (up to 8 per core), and memory
    freed in an arena stays there: each web worker's kept ~0.8 MB after a burst of 40 scrapes, and
    a soak with hung reads grew by an arena every few replaced read workers (46 -> 60 MB in an
    hour). CPython allocates with the GIL held, so two arenas cost no measurable time.
    """
    if os.environ.get("MALLOC_ARENA_MAX"):
        return
    try:
        os.confstr("CS_GNU_LIBC_VERSION")  # glibc only (musl has no arenas to cap)
        import ctypes

        ctypes.CDLL(None).mallopt(_M_ARENA_MAX, MALLOC_ARENAS)
    except (ValueError, OSError, AttributeError):
        log.debug("cannot cap malloc arenas on this C library")


_frozen = threading.Lock()


def freeze_start_up_objects() -> None:
    """Once per process: take what exists now out of the garbage collector's full walks.

    A full collection holds the GIL while it walks every tracked object (a 63 ms pause under
    bench/abuse.py), and what exists at start-up lives as long as the process. Collected before, so
    no garbage is frozen, and after: CPython's next full collection waits for a quarter as many
    new objects as the last one found, which had found everything now frozen (the soak's RSS rose
    ~3 MB an hour from cycles left uncollected).
    """
    if _frozen.acquire(blocking=False):
        gc.collect()
        gc.freeze()
        gc.collect()


def settle_garbage_collector() -> None:
    """After start-up (the first poll done): everything alive moves out of the collector's sight, and
    young objects are collected rarely."""
    freeze_start_up_objects()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


def collect_young_garbage() -> None:
    """The youngest generation collected now, by a part that makes reference cycles by the dozen.

    pyroute2's netlink messages are cycles (each attribute slot and its list), and so are its
    synchronous API's generators and the exceptions of a failed request: 26 to 80 objects per
    ethtool request. Under GC_GEN0_THRESHOLD they waited minutes for a young collection, and the
    wire watch's RSS rose ~2 MB a minute meanwhile (docs/wire.md). A collection of a young
    generation of a few thousand objects takes well under a millisecond.

    An explicit collection counts toward the older generations' thresholds but never starts theirs
    (only the allocator's own trigger does, and it no longer fires): so, as that trigger would, the
    oldest generation past its threshold is collected instead, or a cycle caught alive once (an
    object of another thread's request in flight) would never be collected.
    """
    counts, thresholds = gc.get_count(), gc.get_threshold()
    gc.collect(max((g for g in (1, 2) if counts[g] > thresholds[g]), default=0))
