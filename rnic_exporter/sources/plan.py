"""A device's per-poll reads as one flat list: re-read in one pass, re-parsed only where bytes changed.

The reading layer builds a `ReadPlan` once per device registration (and again when the device's
shape changes: a GID table moved, a netdev came or went). Each poll is then one `read_batch` over
held descriptors and one list comparison; only attributes whose raw bytes (or errno) differ from
the last poll are parsed again, and only the groups (a port's counters, a netdev, the PCIe link)
holding such an attribute are rebuilt. Unchanged groups keep their objects, so the sinks can tell
"nothing changed here" by identity.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rnic_exporter.model.host import ReadError
from rnic_exporter.sources.sysfs import FdCache, Raw, ReadBatch, interpret


@dataclass(frozen=True, slots=True)
class Attribute:
    """One sysfs file of an object and how to read it."""

    file: str
    parse: Callable[[str], object]
    quiet: frozenset[int] = frozenset()  # errnos that mean "no value" rather than a fault


def _unparsed(text: str) -> object:
    return None


# Watched only for change (GID slots: any change means re-reading the whole table).
RAW_ONLY = _unparsed


def under(base: str, attributes: Sequence[Attribute], label_prefix: str = "") -> list[tuple[str, str, Attribute]]:
    """Slots for `attributes` of the object at `base`, labelled `label_prefix` + file name."""
    return [(f"{base}/{a.file}", label_prefix + a.file, a) for a in attributes]


def as_values(values: Sequence[object]) -> object:
    """A group whose values are used as they are (port state, node_desc, GID slots watched)."""
    return list(values)


@dataclass(frozen=True, slots=True)
class Group:
    """A run of slots that together make one object; `start:end` index the plan's slots.

    `build` makes the object from the group's values (in slot order), and `watched` names the
    files of it a pass that trusts announcements reads (what detection judges): each class file
    (`infiniband.py`, `netclass.py`, `pci.py`) says both for its own files."""

    key: str  # what it builds, e.g. "port:1", "netdev:ens1f0np0"
    start: int
    end: int
    build: Callable[[Sequence[object]], object] = as_values
    watched: frozenset[str] = frozenset()


class ReadPlan:
    """The slots of one device, in the order their errors are reported."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.rels: list[str] = []
        self.raws: Sequence[Raw | None] = []  # None: not read yet
        self.values: list[object] = []
        self.reasons: list[str | None] = []
        self._labels: list[tuple[int | None, str]] = []  # (port, attribute) for ReadErrors
        self._parsers: list[Callable[[str], object]] = []
        self._quiet: list[frozenset[int]] = []
        self._group_of: list[int] = []
        self.groups: list[Group] = []
        self._by_key: dict[str, Group] = {}
        self._batch = ReadBatch(self.rels)

    def add_group(
        self,
        key: str,
        slots: Sequence[tuple[str, str, Attribute]],
        *,
        port: int | None,
        build: Callable[[Sequence[object]], object] = as_values,
        watched: Sequence[Attribute] = (),
    ) -> Group:
        """`slots`: (path relative to the mount, attribute label for errors, how to read it)."""
        start = len(self.rels)
        for rel, label, attr in slots:
            self.rels.append(rel)
            self._labels.append((port, label))
            self._parsers.append(attr.parse)
            self._quiet.append(attr.quiet)
            self._group_of.append(len(self.groups))
        n = len(slots)
        self.raws = [*self.raws, *([None] * n)]
        self.values.extend([None] * n)
        self.reasons.extend([None] * n)
        group = Group(key, start, start + n, build, frozenset(a.file for a in watched))
        self.groups.append(group)
        self._by_key[key] = group
        return group

    def group(self, key: str) -> Group:
        return self._by_key[key]

    def refresh(self, root: FdCache) -> set[str]:
        """Re-read every slot; the keys of the groups in which something changed."""
        raws = root.read_batch(self._batch)
        if raws == self.raws:
            return set()
        changed: set[str] = set()
        previous = self.raws
        for i, raw in enumerate(raws):
            if raw == previous[i]:
                continue
            parse = self._parsers[i]
            if parse is RAW_ONLY:
                self.values[i], self.reasons[i] = None, None
            else:
                self.values[i], self.reasons[i] = interpret(raw, parse, self._quiet[i])
            changed.add(self.groups[self._group_of[i]].key)
        self.raws = raws
        return changed

    def keys(self) -> list[tuple[int | None, str]]:
        """(port, attribute) of every slot, as its ReadErrors name them."""
        return list(self._labels)

    def group_values(self, group: Group) -> list[object]:
        return self.values[group.start : group.end]

    def group_errors(self, group: Group) -> list[ReadError]:
        return [
            ReadError(self.device, self._labels[i][0], self._labels[i][1], reason)
            for i in range(group.start, group.end)
            if (reason := self.reasons[i]) is not None
        ]
