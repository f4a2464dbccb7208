"""A port's GID table: `gids/<i>`, `gid_attrs/types/<i>`, `gid_attrs/ndevs/<i>`."""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass

from rnic_exporter.model.host import ZERO_GID, GidEntry, ReadError
from rnic_exporter.sources.plan import RAW_ONLY, Attribute, GroupSpec, Values
from rnic_exporter.sources.sysfs import ErrorLog, MalformedValueError, Raw, Tree, interpret

_GID = re.compile(r"^[0-9a-f]{4}(?::[0-9a-f]{4}){7}$")
# An empty or pending-delete slot answers EINVAL from types/ and ndevs/ by design; an absent
# file (some captures, our simulator's on-disk tree) means the same.
_EMPTY_SLOT = frozenset({errno.EINVAL, errno.ENOENT})
# "fe80::" with a zero interface id is never a real GID; show_gids skips it too.
_BARE_LINK_LOCAL = "fe80:0000:0000:0000:0000:0000:0000:0000"
# What an empty slot's `gids/<i>` holds, byte for byte: such a slot needs no parsing.
EMPTY_RAWS = frozenset({f"{ZERO_GID}\n".encode(), f"{_BARE_LINK_LOCAL}\n".encode()})


def parse_gid(text: str) -> str:
    """`fe80:0000:0000:0000:0e42:a1ff:fe41:2d36` (%pI6: eight groups, never `::`-compressed)."""
    value = text.strip()
    if not _GID.match(value):
        raise MalformedValueError(f"GID {text[:60]!r} is not eight ':'-separated 4-digit lowercase hex groups")
    return value


def parse_gid_type(text: str) -> str | None:
    """`IB/RoCE v1` or `RoCE v2`; empty (the on-disk stand-in for EINVAL) means an empty slot."""
    value = text.strip()
    if "\0" in value:
        raise MalformedValueError(f"GID type {text[:40]!r} holds a NUL byte")
    return value or None


# The kernel's dev_valid_name(): under IFNAMSIZ (16) bytes, not "." or "..", no "/", ":",
# whitespace or NUL. The name becomes a path (class/net/<name>) and a label: anything else is malformed.
IFNAMSIZ = 16


def parse_netdev_name(text: str) -> str | None:
    """An interface name; empty means no netdev (IB GIDs), as EINVAL does on a kernel."""
    value = text.strip()
    if not value:
        return None
    if len(value) >= IFNAMSIZ or value in (".", "..") or any(c in "/:\0" or c.isspace() for c in value):
        raise MalformedValueError(f"netdev name {text[:40]!r} is not an interface name")
    return value


def slot_rels(port_dir: str, index: int) -> tuple[str, str, str]:
    return f"{port_dir}/gids/{index}", f"{port_dir}/gid_attrs/types/{index}", f"{port_dir}/gid_attrs/ndevs/{index}"


def gid_slot(index: int, gid_raw: Raw, type_raw: Raw, ndev_raw: Raw) -> tuple[GidEntry | None, list[tuple[str, str]]]:
    """One slot from its three files: (entry or None when empty, [(attribute, reason)] of what failed).

    The GID is the entry's key: unreadable, there is no entry. A non-zero GID whose type answers
    EINVAL (or is empty) is being deleted between the reads: no entry either. Any other type or
    netdev failure keeps the entry with that field unknown.
    """
    faults: list[tuple[str, str]] = []
    gid, reason = interpret(gid_raw, parse_gid, frozenset())
    if reason is not None:
        return None, [(f"gids/{index}", reason)]
    if gid is None or gid in (ZERO_GID, _BARE_LINK_LOCAL):
        return None, []
    gid_type, reason = interpret(type_raw, parse_gid_type, _EMPTY_SLOT)
    if reason is not None:
        faults.append((f"gid_attrs/types/{index}", reason))
    elif gid_type is None:
        return None, []
    netdev, reason = interpret(ndev_raw, parse_netdev_name, _EMPTY_SLOT)
    if reason is not None:
        faults.append((f"gid_attrs/ndevs/{index}", reason))
    return GidEntry(index=index, gid=gid, type=gid_type, netdev=netdev), faults


@dataclass(slots=True)
class GidTable:
    """What a whole-table read of one port found, and what later polls watch.

    `watched` are the slots that were not plainly empty (populated, being deleted, or unreadable):
    their three files are re-read every poll and compared byte for byte with `watched_raws`.
    `empty` are the rest, swept a slice per poll.
    """

    size: int
    entries: tuple[GidEntry, ...]
    errors: tuple[ReadError, ...]
    watched: list[int]
    watched_raws: list[Raw]
    empty: list[str]  # `gids/<i>` of the other slots, relative to the mount
    nccl_gid_index: int | None = None
    sweep_at: int = 0
    # Slots with a file that could not be read: their content is unknown, not empty. Each keeps
    # what the last read knew of it, so a slot that is briefly unreadable changes neither the
    # table hash nor NCCL's pick (no table_changed / gid_index_changed on break and on heal).
    unreadable: tuple[int, ...] = ()

    @property
    def partly_unreadable(self) -> bool:
        return bool(self.unreadable)


def read_gid_table(root: Tree, port_dir: str, device: str, port: int, previous: GidTable | None = None) -> GidTable:
    """Every slot, discovered by listing `gids/` (never a hard-coded table size), in two batches.

    A slot whose files cannot be read takes its entry from `previous` (the last read of this
    port's table) when that read knew it: unknown is not empty.
    """
    log = ErrorLog(root)
    indices = log.numbered_entries(
        f"{port_dir}/gids", device=device, port=port, attribute="gids", what="slot number", optional=True
    )
    gid_rels = [f"{port_dir}/gids/{i}" for i in indices]
    gid_raws = root.read_many(gid_rels)
    watched = [i for i, raw in zip(indices, gid_raws, strict=True) if raw not in EMPTY_RAWS]
    attr_rels: list[str] = []
    for i in watched:
        attr_rels.extend(slot_rels(port_dir, i)[1:])
    attr_raws = root.read_many(attr_rels)
    by_index = dict(zip(indices, gid_raws, strict=True))
    entries: list[GidEntry] = []
    errors = list(log.errors)
    watched_raws: list[Raw] = []
    known = {} if previous is None else {e.index: e for e in previous.entries}
    unreadable: list[int] = []
    for k, i in enumerate(watched):
        triple = (by_index[i], attr_raws[2 * k], attr_raws[2 * k + 1])
        watched_raws.extend(triple)
        entry, faults = gid_slot(i, *triple)
        if faults:
            unreadable.append(i)
            last = known.get(i)
            if last is not None and (entry is None or entry.gid == last.gid):
                entry = last  # the GID, or a field of it, is unknown now: keep what was known
        if entry is not None:
            entries.append(entry)
        errors.extend(ReadError(device, port, attribute, reason) for attribute, reason in faults)
    watched_set = set(watched)
    return GidTable(
        size=len(indices),
        entries=tuple(entries),
        errors=tuple(errors),
        watched=watched,
        watched_raws=watched_raws,
        empty=[rel for i, rel in zip(indices, gid_rels, strict=True) if i not in watched_set],
        unreadable=tuple(unreadable),
    )


# A watched slot's file: compared byte for byte, never parsed (a change re-reads the whole table).
_GID_SLOT = Attribute("gid slot", RAW_ONLY)


def _nothing(values: Values) -> None:
    return None


def watch_group(port_dir: str, table: GidTable) -> GroupSpec[None]:
    """The files of the table's watched slots, for a read plan to compare: they build nothing."""
    return GroupSpec([(rel, rel, _GID_SLOT) for index in table.watched for rel in slot_rels(port_dir, index)], _nothing)


def sweep(root: Tree, table: GidTable, slots: int) -> bool:
    """Read the next `slots` empty slots; True when one of them is no longer plainly empty."""
    empty = table.empty
    if not empty:
        return False
    start = table.sweep_at % len(empty)
    chunk = (empty[start:] + empty[:start])[:slots] if start + slots > len(empty) else empty[start : start + slots]
    table.sweep_at = start + len(chunk)
    return any(raw not in EMPTY_RAWS for raw in root.read_many(chunk))


def keep_listing(table: GidTable, before: GidTable) -> GidTable:
    """A listing of `gids/` that failed read nothing: the table is the last one known, not empty
    (its hash and NCCL's pick stay; the error says the table is unreadable now)."""
    if not any(e.attribute == "gids" for e in table.errors):
        return table
    return GidTable(
        size=before.size,
        entries=before.entries,
        errors=table.errors,
        watched=before.watched,
        watched_raws=before.watched_raws,
        empty=before.empty,
        sweep_at=before.sweep_at,
        unreadable=before.unreadable,
    )
