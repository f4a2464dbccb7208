"""The samples every consumer shares: metric families, the exporter's own bookkeeping, the parts
of a snapshot, and the record the agent hands every sink once per poll.

Neutral ground: detection, the Prometheus sink, the OTLP sink and the dashboards import from here,
never from each other. A part is one piece of the exposition (a device's identity, a port's
state, its GID table, a netdev...) rendered from a few model objects; the reading layer reuses
those objects while their bytes do not change (`model/host.py`), so a sink that keeps a part's output
keyed by its sources re-renders only what changed.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from rnic_exporter import __version__
from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.catalog.events import Event
from rnic_exporter.catalog.metrics import MetricSpec
from rnic_exporter.model.host import (
    CounterGroup,
    CounterValue,
    Device,
    DeviceFreshness,
    GidEntry,
    Netdev,
    PcieLink,
    Port,
    ReadError,
    Snapshot,
)

Sample = tuple[tuple[str, ...], float]


@dataclass(slots=True)
class Family:
    spec: MetricSpec
    samples: list[Sample] = field(default_factory=list)


class FamilyBuilder:
    """Samples grouped by metric, in first-seen order, so each metric is declared exactly once."""

    def __init__(self) -> None:
        self._by_spec: dict[str, Family] = {}

    def add(self, spec: MetricSpec, labels: tuple[str, ...], value: float) -> None:
        family = self._by_spec.get(spec.name)
        if family is None:
            family = self._by_spec[spec.name] = Family(spec)
        family.samples.append((labels, value))

    def __iter__(self) -> Iterator[Family]:
        return iter(self._by_spec.values())


@dataclass(frozen=True, slots=True)
class ExporterStats:
    """The exporter's own bookkeeping, carried beside each snapshot."""

    polls: int = 0
    read_errors_by_reason: Mapping[str, int] = field(default_factory=dict)
    config_reload_ok: bool = True
    last_poll: float | None = None  # wall clock the last state pass finished (None: the snapshot's)
    devices: tuple[DeviceFreshness, ...] = ()
    counter_errors: tuple[ReadError, ...] = ()  # counter files failed in the last counter pass
    counter_unsupported: tuple[ReadError, ...] = ()  # ... and never provided by the driver
    counters_stale: bool | None = None  # None: no counter pass behind this output


@dataclass(frozen=True, slots=True)
class Published:
    """What one poll hands every sink: the same frozen record for all of them."""

    snapshot: Snapshot
    events: tuple[Event, ...]
    stats: ExporterStats
    families: tuple[Family, ...]  # detection's judgments and event counters


# -- the parts of a snapshot, each a function of the sources it is keyed by --------------------


class _Samples(Protocol):
    def add(self, spec: MetricSpec, labels: tuple[str, ...], value: float) -> None: ...


def _opt(value: str | None) -> str:
    return "" if value is None else value


# -- the parts of a snapshot, each a function of the sources it is keyed by --------------------


def device_info_part(f: _Samples, info: tuple[str, ...]) -> None:
    f.add(catalog.DEVICE_INFO, info, 1)


def device_hw_part(f: _Samples, name: str, hw_counters: Mapping[str, int]) -> None:
    for counter, value in hw_counters.items():
        f.add(catalog.DEVICE_HW_STAT, (name, counter), value)


def pcie_part(f: _Samples, name: str, pci_address: str, link: PcieLink | None) -> None:
    c = catalog
    if link is not None and pci_address:
        for kind, gts, width in (
            ("current", link.current_speed_gts, link.current_width),
            ("max", link.max_speed_gts, link.max_width),
            ("upstream_max", link.upstream_max_speed_gts, link.upstream_max_width),
        ):
            if gts is not None:
                f.add(c.PCIE_LINK_SPEED, (name, pci_address, kind), gts * 1e9)
            if width is not None:
                f.add(c.PCIE_LINK_WIDTH, (name, pci_address, kind), width)
        for severity, count in link.aer_errors:
            f.add(c.PCIE_AER_ERRORS, (name, pci_address, severity), count)


def port_part(f: _Samples, pl: tuple[str, str], port: Port) -> None:
    """Uses exactly the fields in `port_source`."""
    c = catalog
    f.add(c.PORT_INFO, (*pl, _opt(port.link_layer), _opt(port.netdev)), 1)
    if port.state is not None:
        f.add(c.PORT_STATE, pl, port.state.number)
    if port.phys_state is not None:
        f.add(c.PORT_PHYSICAL_STATE, pl, port.phys_state.number)
    if port.up is not None:  # unknown (state or phys_state unreadable) stays absent, never 0
        f.add(c.PORT_UP, pl, 1 if port.up else 0)
    if port.rate is not None:
        f.add(c.PORT_ACTIVE_RATE, pl, port.rate.bytes_per_second)
        f.add(c.PORT_ACTIVE_WIDTH, pl, port.rate.lanes)


def port_source(port: Port) -> tuple[object, ...]:
    return port.link_layer, port.netdev, port.state, port.phys_state, port.rate


def counters_part(f: _Samples, pl: tuple[str, str], counters: Mapping[str, CounterValue]) -> None:
    c = catalog
    for name, counter in counters.items():
        named = c.NAMED_PMA_COUNTERS.get(name)
        if named is not None:
            f.add(named, pl, counter.value)
        else:
            f.add(c.PORT_PMA, (*pl, name), counter.value)
    if counters:
        f.add(c.PORT_PMA_SATURATED, pl, sum(1 for counter in counters.values() if counter.saturated))


def hw_part(f: _Samples, pl: tuple[str, str], hw_counters: Mapping[str, int]) -> None:
    for name, value in hw_counters.items():
        f.add(catalog.PORT_HW_STAT, (*pl, name), value)


def gid_part(
    f: _Samples,
    pl: tuple[str, str],
    gids: tuple[GidEntry, ...],
    size: int,
    nccl: int | None,
    gid_hash: Callable[[], int],
) -> None:
    by_type: dict[str, int] = {}
    for entry in gids:
        f.add(
            catalog.GID_ENTRY_INFO,
            (*pl, str(entry.index), entry.gid, _opt(entry.type), _opt(entry.netdev), _opt(entry.ipv4)),
            1,
        )
        by_type[_opt(entry.type)] = by_type.get(_opt(entry.type), 0) + 1
    for gid_type, count in sorted(by_type.items()):
        f.add(catalog.GID_ENTRIES, (*pl, gid_type), count)
    if size:  # no slots read: the table is unknown, and so is NCCL's pick (not "none", -1)
        f.add(catalog.GID_TABLE_SIZE, pl, size)
        f.add(catalog.GID_TABLE_HASH, pl, gid_hash())
        f.add(catalog.NCCL_GID_INDEX, pl, -1 if nccl is None else nccl)


def netdev_part(f: _Samples, nl: tuple[str, str, str], netdev: Netdev) -> None:
    c = catalog
    speed = netdev.speed_bytes_per_second
    if speed is not None:
        f.add(c.NETDEV_SPEED, nl, speed)
    if netdev.operstate is not None:
        f.add(c.NETDEV_UP, nl, 1 if netdev.operstate == "up" else 0)
    if netdev.carrier_changes is not None:
        f.add(c.NETDEV_CARRIER_CHANGES, nl, netdev.carrier_changes)
    if netdev.mtu is not None:
        f.add(c.NETDEV_MTU, nl, netdev.mtu)


def errors_part(f: _Samples, errors: tuple[ReadError, ...]) -> None:
    for err in errors:
        f.add(
            catalog.ATTRIBUTE_UNAVAILABLE,
            (err.device, "" if err.port is None else str(err.port), err.attribute, err.kind),
            1,
        )


def unsupported_part(f: _Samples, unsupported: tuple[ReadError, ...]) -> None:
    for err in unsupported:
        f.add(
            catalog.ATTRIBUTE_UNSUPPORTED,
            (err.device, "" if err.port is None else str(err.port), err.attribute, err.kind),
            1,
        )


def own_part(f: _Samples, snap: Snapshot, stats: ExporterStats) -> None:
    c = catalog
    f.add(c.DEVICES, (), len(snap.devices))
    f.add(c.POLL_DURATION, (), snap.read_seconds)
    f.add(c.LAST_POLL, (), stats.last_poll if stats.last_poll is not None else snap.taken_at)
    f.add(c.POLLS, (), stats.polls)
    for reason, count in sorted(stats.read_errors_by_reason.items()):
        f.add(c.READ_ERRORS, (reason,), count)
    f.add(c.CONFIG_RELOAD_OK, (), 1 if stats.config_reload_ok else 0)
    f.add(c.BUILD_INFO, (__version__, platform.python_version()), 1)
    freshness_part(f, stats)


def freshness_part(f: _Samples, stats: ExporterStats) -> None:
    """How old each device's data is and whether a read of it hangs."""
    c = catalog
    for dev in stats.devices:
        f.add(c.DEVICE_READ_STUCK, (dev.name,), 1 if dev.stuck else 0)
        if dev.fallback is not None:
            f.add(c.POLL_FALLBACK, (dev.name,), 1 if dev.fallback else 0)
        if dev.state_at is not None:
            f.add(c.DEVICE_DATA_TIMESTAMP, (dev.name, "state"), dev.state_at)
        if dev.counters_at is not None:
            f.add(c.DEVICE_DATA_TIMESTAMP, (dev.name, "counters"), dev.counters_at)
        for port, attribute, seconds in dev.backed_off:
            f.add(c.ATTRIBUTE_BACKOFF, (dev.name, "" if port is None else str(port), attribute), seconds)
    if stats.counters_stale is not None:
        f.add(c.COUNTERS_STALE, (), 1 if stats.counters_stale else 0)


# (cache key, sources, render function, its arguments after the sample sink); sources None: every poll.
Part = tuple[tuple[str, ...], object, Callable[..., None], tuple[Any, ...]]


@dataclass(frozen=True, slots=True)
class CounterSlot:
    """Where a device's counter group goes in the exposition: `kind` "counters" or "hw", port None
    for the device's own `hw_counters/`."""

    device: str
    kind: str
    port: int | None


def device_parts(snap: Snapshot, dev: Device) -> Iterator[Part | CounterSlot]:
    """A device's parts in exposition order; its counters are `CounterSlot`s, rendered from the
    counter pass by whoever publishes (or from the model's counters by `counter_part`)."""
    link = snap.pcie.get(dev.pci_address) if dev.pci_address else None
    info = (
        dev.name,
        _opt(dev.node_guid),
        _opt(dev.sys_image_guid),
        _opt(dev.fw_ver),
        _opt(dev.hca_type),
        _opt(dev.board_id),
        _opt(dev.pci_address),
    )
    yield ("device", dev.name), info, device_info_part, (info,)
    yield CounterSlot(dev.name, "hw", None)
    yield ("pcie", dev.name), (info, link), pcie_part, (dev.name, _opt(dev.pci_address), link)
    for port in dev.ports:
        pl = (dev.name, str(port.number))
        yield ("port", *pl), port_source(port), port_part, (pl, port)
        yield CounterSlot(dev.name, "counters", port.number)
        yield CounterSlot(dev.name, "hw", port.number)
        yield (
            ("gids", *pl),
            (port.gids, port.gid_table_size, port.nccl_gid_index),
            gid_part,
            (pl, port.gids, port.gid_table_size, port.nccl_gid_index, lambda p=port: p.gid_hash),
        )
        for netdev_name in port.netdevs:
            netdev = snap.netdevs.get(netdev_name)
            if netdev is not None:
                yield ("netdev", *pl, netdev_name), netdev, netdev_part, ((*pl, netdev_name), netdev)


def counter_part(dev: Device, slot: CounterSlot) -> Part:
    """A counter slot rendered from the model's own counters (one-shot reads, golden tests)."""
    if slot.port is None:
        return ("hw", dev.name), dev.hw_counters, device_hw_part, (dev.name, dev.hw_counters)
    for port in dev.ports:
        if port.number == slot.port:
            pl = (dev.name, str(port.number))
            if slot.kind == "counters":
                return ("counters", *pl), port.counters, counters_part, (pl, port.counters)
            return ("hw", *pl), port.hw_counters, hw_part, (pl, port.hw_counters)
    raise KeyError(slot)


def snapshot_parts(snap: Snapshot, stats: ExporterStats) -> Iterator[Part]:
    yield ("errors",), (snap.errors, stats.counter_errors), errors_part, ((*snap.errors, *stats.counter_errors),)
    yield (
        ("unsupported",),
        (snap.unsupported, stats.counter_unsupported),
        unsupported_part,
        ((*snap.unsupported, *stats.counter_unsupported),),
    )
    yield ("own",), None, own_part, (snap, stats)


def snapshot_families(snap: Snapshot, stats: ExporterStats) -> Iterator[Family]:
    """Every family for one snapshot whose objects carry their counters (`HostReader.read`);
    unreadable values are absent (and counted), never 0."""
    f = FamilyBuilder()
    for dev in snap.devices:
        for item in device_parts(snap, dev):
            part = counter_part(dev, item) if isinstance(item, CounterSlot) else item
            part[2](f, *part[3])
    for _key, _sources, render, args in snapshot_parts(snap, stats):
        render(f, *args)
    yield from f


def counter_families(groups: Iterable[tuple[str, CounterGroup]]) -> Iterator[Family]:
    """The counter pass's values as families (the OTLP sink), without model objects."""
    f = FamilyBuilder()
    c = catalog
    for device, group in groups:
        if group.port is None:
            for name, value in zip(group.names, group.values, strict=True):
                if value is not None:
                    f.add(c.DEVICE_HW_STAT, (device, name), value)
            continue
        port = str(group.port)
        if group.kind == "hw":
            for name, value in zip(group.names, group.values, strict=True):
                if value is not None:
                    f.add(c.PORT_HW_STAT, (device, port, name), value)
            continue
        read = False
        for name, value in zip(group.names, group.values, strict=True):
            if value is None:
                continue
            read = True
            named = c.NAMED_PMA_COUNTERS.get(name)
            if named is not None:
                f.add(named, (device, port), value)
            else:
                f.add(c.PORT_PMA, (device, port, name), value)
        if read:
            f.add(c.PORT_PMA_SATURATED, (device, port), sum(group.saturated))
    yield from f
