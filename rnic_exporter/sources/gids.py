"""A port's GID table: `gids/<i>`, `gid_attrs/types/<i>`, `gid_attrs/ndevs/<i>`."""

from __future__ import annotations

import errno
import re
from collections.abc import Iterable

from rnic_exporter.model import ZERO_GID, GidEntry
from rnic_exporter.sources.sysfs import ErrorLog, MalformedValueError

_GID = re.compile(r"^[0-9a-f]{4}(?::[0-9a-f]{4}){7}$")
# An empty or pending-delete slot answers EINVAL from types/ and ndevs/ by design; an absent
# file (some captures, our simulator's on-disk tree) means the same.
_EMPTY_SLOT = frozenset({errno.EINVAL, errno.ENOENT})
# "fe80::" with a zero interface id is never a real GID; show_gids skips it too.
_BARE_LINK_LOCAL = "fe80:0000:0000:0000:0000:0000:0000:0000"


def parse_gid(text: str) -> str:
    """`fe80:0000:0000:0000:0e42:a1ff:fe41:2d36` (%pI6: eight groups, never `::`-compressed)."""
    value = text.strip()
    if not _GID.match(value):
        raise MalformedValueError(f"GID {text!r} is not eight ':'-separated 4-digit lowercase hex groups")
    return value


def parse_gid_type(text: str) -> str | None:
    """`IB/RoCE v1` or `RoCE v2`; empty (the on-disk stand-in for EINVAL) means an empty slot."""
    value = text.strip()
    return value or None


def parse_netdev_name(text: str) -> str | None:
    """An interface name; empty means no netdev (IB GIDs), as EINVAL does on a kernel."""
    value = text.strip()
    if not value:
        return None
    if "/" in value or any(c.isspace() for c in value):
        raise MalformedValueError(f"netdev name {text!r} is not an interface name")
    return value


def list_gid_indices(log: ErrorLog, port_dir: str, device: str, port: int) -> list[int]:
    """All slot numbers, discovered by listing `gids/` (never a hard-coded table size)."""
    return log.numbered_entries(f"{port_dir}/gids", device=device, port=port, attribute="gids",
                                what="slot number", optional=True)


def read_gid_slot(log: ErrorLog, port_dir: str, index: int, device: str, port: int) -> GidEntry | None:
    """One slot, or None when it is empty (zero GID) or unreadable (recorded in `log`)."""
    gid = log.read(port_dir, f"gids/{index}", parse_gid, device=device, port=port)
    if gid is None or gid in (ZERO_GID, _BARE_LINK_LOCAL):
        return None
    errors_before = len(log.errors)
    gid_type = log.read(port_dir, f"gid_attrs/types/{index}", parse_gid_type, device=device, port=port,
                        expected=_EMPTY_SLOT)
    if gid_type is None and len(log.errors) == errors_before:
        # EINVAL (or empty) for a non-zero GID: the slot is being deleted between our two reads.
        return None
    # Any other failure keeps the entry with an unknown type (recorded in the log).
    netdev = log.read(port_dir, f"gid_attrs/ndevs/{index}", parse_netdev_name, device=device, port=port,
                      expected=_EMPTY_SLOT)
    return GidEntry(index=index, gid=gid, type=gid_type, netdev=netdev)


def read_gid_slots(log: ErrorLog, port_dir: str, indices: Iterable[int], device: str,
                   port: int) -> tuple[GidEntry, ...]:
    entries = (read_gid_slot(log, port_dir, i, device, port) for i in indices)
    return tuple(e for e in entries if e is not None)
