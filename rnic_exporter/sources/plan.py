"""A device's per-poll reads as one flat list: re-read in one pass, re-parsed only where bytes changed.

The reading layer builds a `ReadPlan` once per device registration (and again when the device's
shape changes: a GID table moved, a netdev came or went). Each poll is then one `read_batch` over
held descriptors and one list comparison; only attributes whose raw bytes (or errno) differ from
the last poll are parsed again, and only the groups (a port's state, a netdev, the PCIe link)
holding such an attribute are rebuilt. Unchanged groups keep their objects, so the sinks can tell
"nothing changed here" by identity.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

from rnic_exporter.model.host import ReadError
from rnic_exporter.sources.sysfs import FdCache, Raw, ReadBatch, interpret

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


@dataclass(frozen=True, slots=True, eq=False)
class Attribute(Generic[T_co]):
    """One sysfs file of an object and how to read it. Compared by identity: each is a constant of
    the class file that knows it (`infiniband.py`, `netclass.py`, `pci.py`, `gids.py`), and a
    group's values are looked up by it (`Values`)."""

    file: str
    parse: Callable[[str], T_co]
    quiet: frozenset[int] = frozenset()  # errnos that mean "no value" rather than a fault


def _unparsed(text: str) -> None:
    return None


# Watched only for change (GID slots: any change means re-reading the whole table).
RAW_ONLY = _unparsed

# (path relative to the mount, attribute label for errors, how to read it)
Slot = tuple[str, str, Attribute[object]]


def under(base: str, attributes: Sequence[Attribute[object]], label_prefix: str = "") -> list[Slot]:
    """Slots for `attributes` of the object at `base`, labelled `label_prefix` + file name."""
    return [(f"{base}/{a.file}", label_prefix + a.file, a) for a in attributes]


class Values:
    """A group's parsed values by the attribute that read them (procfs-style: a build names each
    field after its file). `values[attr]` is what `attr.parse` made of the file, None while it is
    unreadable or quietly absent; `get` also answers None for a file the group does not read."""

    __slots__ = ("_index", "_values")

    def __init__(self, index: Mapping[Attribute[object], int], values: Sequence[object]) -> None:
        self._index = index
        self._values = values

    @classmethod
    def of(cls, attributes: Sequence[Attribute[object]], values: Sequence[object]) -> Values:
        """The values of `attributes`, in that order (a one-shot read)."""
        return cls({a: i for i, a in enumerate(attributes)}, values)

    def __getitem__(self, attr: Attribute[T]) -> T | None:
        # The slot of `attr` holds what `attr.parse` returned, or None: the one place that says so.
        return cast("T | None", self._values[self._index[attr]])

    def get(self, attr: Attribute[T]) -> T | None:
        i = self._index.get(attr)
        return None if i is None else cast("T | None", self._values[i])


@dataclass(frozen=True, slots=True)
class GroupSpec(Generic[T_co]):
    """The files that together make one object, and how: `build` makes it from their values, and
    `watched` are the files of it a pass that trusts announcements reads (what detection judges).
    Each class file (`infiniband.py`, `netclass.py`, `pci.py`, `gids.py`) says all three for its own
    objects."""

    slots: Sequence[Slot]
    build: Callable[[Values], T_co]
    watched: Sequence[Attribute[object]] = ()


class GroupKind(enum.Enum):
    PCIE = "pcie"  # the device's PCI function's link and AER counts
    GIDS = "gids"  # the watched slots of a port's GID table
    PORT = "port"  # a port's state, phys_state, rate, lid
    NETDEV = "netdev"  # a netdev of a port
    DEVICE = "device"  # the device's polled attributes (node_desc)


@dataclass(frozen=True, slots=True)
class GroupKey:
    """Which object a group makes: its kind, and the port or netdev it is of."""

    kind: GroupKind
    port: int | None = None
    netdev: str | None = None

    @classmethod
    def pcie(cls) -> GroupKey:
        return _PCIE

    @classmethod
    def device(cls) -> GroupKey:
        return _DEVICE

    @classmethod
    def of_port(cls, port: int) -> GroupKey:
        return cls(GroupKind.PORT, port)

    @classmethod
    def gids(cls, port: int) -> GroupKey:
        return cls(GroupKind.GIDS, port)

    @classmethod
    def of_netdev(cls, name: str) -> GroupKey:
        return cls(GroupKind.NETDEV, netdev=name)

    def __str__(self) -> str:
        detail = self.netdev if self.netdev is not None else self.port
        return self.kind.value if detail is None else f"{self.kind.value}:{detail}"


_PCIE = GroupKey(GroupKind.PCIE)
_DEVICE = GroupKey(GroupKind.DEVICE)


class Group(Generic[T_co]):
    """A run of slots that together make one object; `start:end` index the plan's slots. `value`
    is the object the last build made (an AttributeError before the first: `built` says)."""

    __slots__ = ("_value", "build", "end", "index", "key", "start", "watched")
    _value: T_co

    def __init__(self, key: GroupKey, start: int, spec: GroupSpec[T_co]) -> None:
        self.key = key
        self.start = start
        self.end = start + len(spec.slots)
        self.build = spec.build
        self.watched = frozenset(a.file for a in spec.watched)
        self.index: Mapping[Attribute[object], int] = {attr: i for i, (_, _, attr) in enumerate(spec.slots)}

    @property
    def built(self) -> bool:
        return hasattr(self, "_value")

    @property
    def value(self) -> T_co:
        return self._value

    def rebuild(self, values: Sequence[object]) -> None:
        self._value = self.build(Values(self.index, values))


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
        self.groups: list[Group[object]] = []
        self._batch = ReadBatch(self.rels)

    def add_group(self, key: GroupKey, spec: GroupSpec[T], *, port: int | None) -> Group[T]:
        start = len(self.rels)
        for rel, label, attr in spec.slots:
            self.rels.append(rel)
            self._labels.append((port, label))
            self._parsers.append(attr.parse)
            self._quiet.append(attr.quiet)
            self._group_of.append(len(self.groups))
        n = len(spec.slots)
        self.raws = [*self.raws, *([None] * n)]
        self.values.extend([None] * n)
        self.reasons.extend([None] * n)
        group = Group(key, start, spec)
        self.groups.append(group)
        return group

    def refresh(self, root: FdCache) -> set[GroupKey]:
        """Re-read every slot; the keys of the groups in which something changed."""
        raws = root.read_batch(self._batch)
        if raws == self.raws:
            return set()
        changed: set[GroupKey] = set()
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

    def rebuild(self, changed: set[GroupKey]) -> None:
        """Build the object of every group that changed or was never built; the others keep theirs
        (the identity-reuse contract of `model/host.py`)."""
        for group in self.groups:
            if not group.built or group.key in changed:
                group.rebuild(self.values[group.start : group.end])

    def keys(self) -> list[tuple[int | None, str]]:
        """(port, attribute) of every slot, as its ReadErrors name them."""
        return list(self._labels)

    def group_errors(self, group: Group[object]) -> list[ReadError]:
        return [
            ReadError(self.device, self._labels[i][0], self._labels[i][1], reason)
            for i in range(group.start, group.end)
            if (reason := self.reasons[i]) is not None
        ]
