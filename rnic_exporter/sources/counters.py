"""A device's counter files, read per consumer (a scrape, an OTLP export) instead of per poll.

`counters/` and `hw_counters/` are most of what a poll would read (on mlx5 each `counters/` read
is a firmware command) and none of it feeds detection, so they are read only when someone is
about to publish them. A pass is one `pread` per file over held descriptors and one comparison
of the raw bytes; only files whose bytes changed are parsed, into flat lists of plain ints (no
object per value). Consumers compare `CounterGroup.version` to know what to re-render.

Restricted functions (ConnectX-7 in DGX/GB200 systems, switch mode) answer EINVAL or EOPNOTSUPP
on counter reads and log a kernel line per failure: such a file is backed off exponentially,
from `BACKOFF_MIN_S` to `BACKOFF_MAX_S`, so it costs a handful of reads per hour instead of
one per pass. A device re-registration starts a new plan, so its back-off starts over.
"""

from __future__ import annotations

import errno
import itertools
import operator
import re
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from rnic_exporter.model.host import CounterGroup, ReadError
from rnic_exporter.sources import availability
from rnic_exporter.sources.infiniband import counter_ceiling, counter_scale, parse_counter
from rnic_exporter.sources.sysfs import FdCache, Raw, ReadBatch, interpret

# What a function that does not implement an attribute answers (sources/availability.py's
# not_supported, and the old kernels' "N/A (no PMA)"): retried ever more rarely.
BACKED_OFF = frozenset({availability.NOT_SUPPORTED, availability.NO_PMA})
BACKOFF_MIN_S = 60.0
BACKOFF_MAX_S = 3600.0
BACKOFF_AFTER = 3  # consecutive refusals of a file that answered before
# The PMA counters a scrape needs fresh: what the dashboards draw as rates over
# $__rate_interval (throughput, packets, congestion). The others (the twelve error counters, fed
# to 5-minute rates only, and unicast/multicast, fed to nothing) are read on a slower timer.
RATE_PMA = frozenset({"port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets", "port_xmit_wait"})
SLOW_PMA_S = 60.0


def slow_pma(kind: str, name: str) -> bool:
    """A PMA counter file no per-scrape rate needs."""
    return kind == "counters" and name not in RATE_PMA


# A group's files joined, when each is what the kernel prints for a counter: digits and a newline.
_KERNEL_DIGITS = re.compile(rb"(?:[0-9]{1,19}\n)+")  # 20 digits may pass 2**64: per file


@dataclass(slots=True)
class _Backoff:
    interval_s: float
    retry_at: float


class CounterPlan:
    """Every counter file of one device registration, in exposition order; only the thread holding
    the device's read lock calls `refresh`."""

    def __init__(
        self,
        device: str,
        groups: Sequence[tuple[str, int | None, str, Sequence[str]]],
        clock: Callable[[], float] = time.monotonic,
        wants: Callable[[str, str], bool] | None = None,
        slow: Callable[[str, str], bool] | None = None,
        slow_s: float = 0.0,
    ) -> None:
        """`groups`: (kind, port, directory relative to the mount, file names); `wants(kind, name)`
        False: the file is never read (a collector filter, `rnic_exporter/sources/counter_filter.py`);
        `slow(kind, name)` True: the file is read once every `slow_s` seconds (0: every pass), its
        last value served in between (`SLOW_PMA`)."""
        self.device = device
        self._clock = clock
        rels: list[str] = []
        self.groups: list[CounterGroup] = []
        self._group_of: list[int] = []
        for kind, port, directory, all_names in groups:
            names = all_names if wants is None else [n for n in all_names if wants(kind, n)]
            extended_names = frozenset(names) if kind == "counters" else frozenset()
            group = CounterGroup(
                kind,
                port,
                tuple(names),
                len(rels),
                ceilings=tuple(counter_ceiling(n, extended_names) if kind == "counters" else None for n in names),
                scales=tuple(counter_scale(n) if kind == "counters" else 1 for n in names),
                values=[None] * len(names),
                saturated=[False] * len(names),
            )
            self._group_of.extend([len(self.groups)] * len(names))
            self.groups.append(group)
            rels.extend(f"{directory}/{name}" for name in names)
        self.rels = rels
        self._batch = ReadBatch(rels)
        self._raws: list[Raw | None] = [None] * len(rels)
        self._reasons: list[str | None] = [None] * len(rels)
        self._backoff: dict[int, _Backoff] = {}
        self._streak: dict[int, int] = {}  # consecutive failed reads
        self._answered: set[int] = set()  # files that gave a value at least once
        self._failing: list[int] = []
        # Per group: every file answered a value last pass (so none can appear, heal or fail
        # back to the bottom of its back-off): the next pass may take the whole-group path.
        self._clean = [False] * len(self.groups)
        self._scaled = [tuple((k, s) for k, s in enumerate(g.scales) if s != 1) for g in self.groups]
        self.errors: tuple[ReadError, ...] = ()  # every file unreadable now (backed-off ones too)
        self.completed_at: float | None = None  # wall clock of the last finished pass
        # Slots whose values come from elsewhere (a port's hw counters from one RDMA netlink
        # STAT_GET: `feed`) and are not read from their files; and the batches of what is read.
        self._fed: dict[int, int] = {}  # slot -> index in the feed's value list
        self._batches: dict[frozenset[int], tuple[list[int], ReadBatch]] = {}
        self._kind_counts: dict[frozenset[int], dict[str, int]] = {}
        self._never: set[int] = set()  # answered `N/A (no PMA)` from the first read: not read again
        self._slow_s = slow_s
        self._slow = (
            frozenset(i for g in self.groups for i in range(g.start, g.end) if slow(g.kind, g.names[i - g.start]))
            if slow is not None and slow_s > 0
            else frozenset()
        )
        self._slow_due = float("-inf")  # (clock) the slow files are read on the first pass
        self.last_reads: dict[str, int] = {}  # files read by the last pass, per group kind

    @property
    def backed_off(self) -> Mapping[int, float]:
        """Slot -> its current back-off interval in seconds."""
        return {i: b.interval_s for i, b in self._backoff.items()}

    def slot_label(self, index: int) -> tuple[int | None, str]:
        group = self.groups[self._group_of[index]]
        subdir = "counters" if group.kind == "counters" else "hw_counters"
        return group.port, f"{subdir}/{group.names[index - group.start]}"

    def feed_ports(self, ports: Collection[int]) -> None:
        """The hw counters of `ports` are fed to each `refresh` (`fed`, in the groups' name order),
        not read from their files; an empty collection: every file is read again."""
        fed: dict[int, int] = {}
        k = 0
        for group in self.groups:
            if group.kind == "hw" and group.port is not None and group.port in ports:
                for i in range(group.start, group.end):
                    fed[i] = k
                    k += 1
        self._fed = fed

    def fed_names(self) -> list[tuple[int, tuple[str, ...]]]:
        """(port, names) of every fed group, in the order `refresh` wants their values."""
        fed = self._fed
        return [(g.port, g.names) for g in self.groups if g.port is not None and g.names and g.start in fed]

    def _kinds(self, unread: frozenset[int]) -> dict[str, int]:
        """Files read per group kind when `unread` are not (before back-off)."""
        got = self._kind_counts.get(unread)
        if got is None:
            got = {}
            for group in self.groups:
                n = sum(1 for i in range(group.start, group.end) if i not in unread)
                got[group.kind] = got.get(group.kind, 0) + n
            self._kind_counts[unread] = got
        return got

    def _read_set(self, unread: frozenset[int]) -> tuple[list[int], ReadBatch]:
        """The slots a pass reads when `unread` are not read, and their batch (one per variant)."""
        got = self._batches.get(unread)
        if got is None:
            index = [i for i in range(len(self.rels)) if i not in unread]
            got = self._batches[unread] = (index, ReadBatch([self.rels[i] for i in index]))
        return got

    def refresh(
        self, fds: FdCache, fed: Sequence[int] | None = None, *, every_file: bool = True
    ) -> tuple[ReadError, ...]:
        """One pass; returns the errors of the reads it made (the caller counts them). `fed`: the
        values of the fed slots (`feed_ports`), read elsewhere this pass; `every_file` False: the
        slow files only when their timer is due."""
        now = self._clock()
        skip = frozenset(i for i, b in self._backoff.items() if b.retry_at > now) if self._backoff else frozenset()
        if self._never:
            skip |= self._never
        # Not read this pass: the fed slots, and the slow ones until their timer is due.
        unread = frozenset(self._fed)
        if self._slow and not every_file and now < self._slow_due:
            unread |= self._slow
        elif self._slow:
            self._slow_due = now + self._slow_s
        if not unread:
            raws: list[Raw | None] = list(fds.read_batch(self._batch, skip))
        else:
            read_index, batch = self._read_set(unread)
            position = {slot: k for k, slot in enumerate(read_index)} if skip else {}
            got = fds.read_batch(batch, frozenset(position[i] for i in skip if i in position))
            raws = list(self._raws)  # a slow slot keeps what it last answered
            for k, slot in enumerate(read_index):
                raws[slot] = got[k]
            values = fed or ()
            for slot, k in self._fed.items():
                # As the kernel prints it: the same parse, saturation and change path as a file.
                raws[slot] = b"%d\n" % values[k] if k < len(values) else errno.ENODATA
            skip |= unread - self._fed.keys()  # not read: no failure of theirs to count again
        for i in skip:
            raws[i] = self._raws[i]  # a backed-off file keeps what it last answered
        reads = dict(self._kinds(unread))
        for i in skip:
            if i not in unread:
                reads[self.groups[self._group_of[i]].kind] -= 1
        self.last_reads = reads
        if raws != self._raws:
            self._apply(raws)
        failed = []
        for i in self._failing:
            if i in skip:
                continue
            error = self._error(i)
            failed.append(error)
            self._streak[i] = streak = self._streak.get(i, 0) + 1
            # Unsupported from the first read, or refusing pass after pass: a restricted function.
            # A file that answered before and fails once is retried on the next pass.
            symptom = availability.symptom(error)
            if symptom == availability.NO_PMA and i not in self._answered:
                # The port has no PMA (`N/A (no PMA)` from the first read): nothing for this
                # registration will change that, so the file is not asked again.
                self._never.add(i)
                continue
            if symptom in BACKED_OFF and (i not in self._answered or streak >= BACKOFF_AFTER):
                before = self._backoff.get(i)
                interval = BACKOFF_MIN_S if before is None else min(before.interval_s * 2, BACKOFF_MAX_S)
                self._backoff[i] = _Backoff(interval, now + interval)
        self.completed_at = time.time()
        return tuple(failed)

    def _apply(self, raws: list[Raw | None]) -> None:
        """Parse and store what moved, group by group: a busy host changes every file each pass,
        so the per-value path is a handful of operations (the kernel's digits go to `int` as they are)."""
        previous = self._raws
        reasons = self._reasons
        clean = self._clean
        for g, group in enumerate(self.groups):
            start, end = group.start, group.end
            new = raws[start:end]
            old = previous[start:end]
            if new == old:
                continue
            if clean[g] and self._apply_kernel_digits(g, group, new, old):
                continue
            values, saturated = list(group.values), list(group.saturated)
            ceilings, scales = group.ceilings, group.scales
            changed: list[int] = []
            reshaped = False
            for k, raw in enumerate(new):
                if raw == old[k] or raw is None:
                    continue
                changed.append(k)
                i = start + k
                if type(raw) is bytes and 1 < len(raw) < 21 and raw[-1] == 10 and raw[:-1].isdigit():
                    value: int | None = int(raw)  # what the kernel prints: the one check a pass pays
                    reason = None
                else:
                    value, reason = interpret(raw, parse_counter, frozenset())
                if reasons[i] is not None or old[k] is None:
                    self._answered_again(i, reason)
                reasons[i] = reason
                if value is None:
                    reshaped = reshaped or values[k] is not None
                    values[k], saturated[k] = None, False
                    continue
                reshaped = reshaped or values[k] is None
                ceiling = ceilings[k]
                values[k] = value * scales[k]
                saturated[k] = ceiling is not None and value == ceiling
            group.values, group.saturated = values, saturated
            group.changed, group.reshaped = tuple(changed), reshaped
            group.version += 1
            clean[g] = all(r is None for r in reasons[start:end]) and all(v is not None for v in values)
        self._raws = list(raws)
        self._failing = [i for i, reason in enumerate(reasons) if reason is not None]
        self.errors = tuple(self._error(i) for i in self._failing)

    def _apply_kernel_digits(self, g: int, group: CounterGroup, new: list[Raw | None], old: list[Raw | None]) -> bool:
        """The busy host's pass: every file of a group that answered last time answers digits again.
        One regular-expression match and one `map(int)` for the whole group instead of a check per
        file; False (nothing stored) for anything else, which the per-file path sorts out."""
        try:
            joined = b"".join(cast(list[bytes], new))
        except TypeError:  # an errno where bytes were: a read failed
            return False
        if joined.count(b"\n") != len(new) or _KERNEL_DIGITS.fullmatch(joined) is None:
            return False
        try:
            values: list[int | None] = list(map(int, cast(list[bytes], new)))
        except ValueError:  # the newlines sit inside one file, not one per file
            return False
        saturated = list(map(operator.eq, values, group.ceilings))  # a None ceiling is never equal
        for k, scale in self._scaled[g]:
            value = values[k]
            if value is not None:  # never None here (each file gave digits): the check types it
                values[k] = value * scale
        group.values, group.saturated = values, saturated
        group.changed = tuple(itertools.compress(range(len(new)), map(operator.ne, new, old)))
        group.reshaped = False
        group.version += 1
        return True

    def _answered_again(self, index: int, reason: str | None) -> None:
        """A file that failed (or was never read) gave a value: the next failure starts from the bottom."""
        if reason is None:
            self._backoff.pop(index, None)
            self._streak.pop(index, None)
            self._answered.add(index)

    def _error(self, index: int) -> ReadError:
        port, attribute = self.slot_label(index)
        return ReadError(self.device, port, attribute, self._reasons[index] or "unknown")

    def group(self, kind: str, port: int | None) -> CounterGroup | None:
        for group in self.groups:
            if group.kind == kind and group.port == port:
                return group
        return None

    def backoff_samples(self) -> Iterator[tuple[int | None, str, float]]:
        """(port, attribute, back-off interval in seconds) of every backed-off file."""
        if not self._backoff:  # the usual case, asked every scrape: no dict, no sort
            return
        for i, interval in sorted(self.backed_off.items()):
            port, attribute = self.slot_label(i)
            yield port, attribute, interval
