"""Read every RDMA device of a host: its state for detection, its counters for whoever publishes.

`HostReader` is the reading layer's front: it enumerates, filters, then reads (a read can itself
upset a restricted NIC, so excluded devices are never touched). It keeps what makes the next pass
cheap, per device registration (inode and ctime of its class directory):
- its shape: static attributes, PCI function, ports, counter file names. Learned once; learned
  again while any of it is unreadable, and when `device/net` or a netdev changes.
- a `ReadPlan` of every state attribute, re-read over held descriptors; only values whose bytes
  changed are parsed, and objects none of whose values changed are reused (see `model/host.py`).
- a `CounterPlan` of its counter files (`sources/counters.py`), read per consumer.
- each port's last GID table.

Two ways to pass over the state (`state_pass`):
- **trusting events** (netlink is healthy, has not overrun, and knows every netdev of the device:
  an announcement can only come for a netdev netlink reports on). Each attribute is polled by what
  announces its change on Linux:
  - rtnetlink announces a RoCE port's netdev: its carrier, operstate, MTU and addresses, and so the
    port's state and rate (derived from the netdev: carrier, ethtool speed; a speed renegotiation
    drops the carrier) and its GIDs (derived from the addresses);
  - udev announces devices and netdevs added, removed, renamed (and the device listing, one
    `listdir` and a `stat` per device, is still made every pass);
  - nothing announces an InfiniBand port's state, physical state and rate, its GID table, or the
    PCIe link's current speed and width.
  A fast pass (every `--poll.interval`) reads only what nothing announces (`_plan_watch`: on an
  all-RoCE host, per device the PCIe link's speed and width and its AER counts) and compares the
  bytes, and sweeps
  `GID_SWEEP_SLOTS` empty slots of each InfiniBand GID table. Nothing moved: the pass ends there.
  Something moved: the device's full state is re-read and its objects rebuilt, with its whole GID
  tables when a port's state or GID files moved. The announcer (netlink, udev) forces a full
  read with whole GID tables of the devices it names. The safety sweep catches a change no
  announcement brought (an event lost without an overrun, a speed change on a driver that keeps
  the carrier): every `safety_s` (`--poll.safety-interval`, 60 s; staggered across devices) a
  device's whole state is re-read, its populated GID slots' files included. Empty GID slots are
  not compared: on a RoCE port a GID is only ever added on an address or netdev event
  (roce_gid_mgmt.c), and a slot freed later, when its last reference is put, reads the same
  before and after (a pending-delete entry reads as empty: docs/gid-index-moves.md); an
  InfiniBand table's empty slots are swept by every fast pass.
- **not trusting events** (netlink off, failing or overrun; `read`): every device's full state
  every pass. Populated GID slots are re-read every pass; the whole table is re-read when one of
  them changed, and a rotating sweep reads `GID_SWEEP_SLOTS` empty slots per port per pass, so a
  GID appearing in an empty slot is seen within ceil(size / GID_SWEEP_SLOTS) passes.
A GID table with a read error is re-read whole on the next pass, until it heals.

Every device is read under its `Gate` lock, on whatever thread the caller's runner provides
(`sources/read_thread.py`): a device whose read hangs is skipped, the others carry on.
"""

from __future__ import annotations

import errno
import os
import re
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

from rnic_exporter.model.host import (
    CounterValue,
    Device,
    DeviceFreshness,
    LinkRate,
    Netdev,
    NumberedState,
    PcieLink,
    Port,
    ReadError,
    Snapshot,
)
from rnic_exporter.model.nccl import NcclSettings, select_gid_index
from rnic_exporter.sources import availability, netclass, pci
from rnic_exporter.sources import gids as gid_source
from rnic_exporter.sources.counter_filter import CounterFilter
from rnic_exporter.sources.counters import CounterPlan
from rnic_exporter.sources.infiniband import (
    CLASS_DIR,
    DEVICE_POLLED,
    DEVICE_STATIC,
    PORT_POLLED,
    PORT_STATES,
    PORT_WATCHED,
    parse_link_layer,
)
from rnic_exporter.sources.plan import RAW_ONLY, Attribute, ReadPlan, under
from rnic_exporter.sources.read_thread import Gate
from rnic_exporter.sources.sysfs import NOT_EXPOSED, ErrorLog, Raw, ReadBatch, SysfsRoot, errno_reason, interpret

# Empty GID slots checked per port per pass while events are not trusted: 255 slots are all seen
# every 16 passes.
GID_SWEEP_SLOTS = 16
# While events are trusted: each device's whole state is re-read every safety sweep (SAFETY_S
# unless set). Devices' sweeps are staggered over SWEEP_STAGGER steps of the safety interval, so
# one fast pass rarely holds more than one.
SAFETY_S = 60.0
SWEEP_STAGGER = 12

Job = tuple[Gate, Callable[[], None]]
Runner = Callable[[Sequence[Job]], object]


def run_here(jobs: Sequence[Job]) -> None:
    """Run jobs on the calling thread (one-shot reads, tests)."""
    for gate, job in jobs:
        with gate.lock:
            job()


# Errnos a read gets when the device itself is being removed (see _DeviceReader._gone).
_GONE_ERRNOS = frozenset({"ENOENT", "ENODEV"})


@dataclass(frozen=True, slots=True)
class ReaderSettings:
    device_include: re.Pattern[str] | None = None  # --collector.infiniband.device-include
    device_exclude: re.Pattern[str] | None = None  # --collector.infiniband.device-exclude
    nccl: NcclSettings = field(default_factory=NcclSettings)
    counters: CounterFilter = field(default_factory=CounterFilter)  # --collector.hw_counters.*

    @property
    def filter_text(self) -> str:
        parts = [
            f"{flag} {pattern.pattern!r}"
            for flag, pattern in (
                ("--collector.infiniband.device-include", self.device_include),
                ("--collector.infiniband.device-exclude", self.device_exclude),
            )
            if pattern is not None
        ]
        return " and ".join(parts) or "no device filter"

    def excludes_all(self, snap: Snapshot, sysfs: object) -> str | None:
        """Why nothing is read though RDMA devices are there: the filter leaves out every one (the
        config of another fleet: `^mlx5_` on a Broadcom node). None when that is not the case."""
        if snap.devices or snap.listed_unread or not snap.filtered_out:
            return None
        names = snap.filtered_out
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        return (
            f"the device filter ({self.filter_text}) matches none of the {len(names)} RDMA device(s) under "
            f"{sysfs}/class/infiniband ({shown}): nothing on this host is monitored or checked"
        )

    def wants(self, device: str) -> bool:
        if self.device_include is not None and not self.device_include.search(device):
            return False
        return not (self.device_exclude is not None and self.device_exclude.search(device))


_BDF = re.compile(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_GID_SLOT = Attribute("gid slot", RAW_ONLY)
_DEV_PORT = Attribute("dev_port", netclass.parse_int, NOT_EXPOSED)


@dataclass(slots=True)
class _PortShape:
    number: int
    link_layer: str | None
    counter_names: list[str]
    hw_names: list[str]


def _settled(shape: _Shape) -> bool:
    """Learned whole: nothing failed (what the driver does not provide never comes:
    sources/availability.py; the `device` link is the device's identity, retried whatever it
    answers), and the ports are there (the kernel adds a device's ports after the device itself:
    `ports/` listed empty at registration is not the last word)."""
    return bool(shape.ports) and not any(
        availability.symptom(e) is None or e.attribute == "device" for e in shape.errors
    )


@dataclass(slots=True)
class _Shape:
    """What does not change while the device stays registered (or is re-learned while unreadable)."""

    static: dict[str, object]
    pci_address: str | None
    function_dir: str | None
    link_files: tuple[bool, bool]
    dev_netdevs: tuple[str, ...]
    aer_files: tuple[Attribute, ...]
    ports: list[_PortShape]
    hw_names: list[str]
    errors: list[ReadError] = field(default_factory=list)


class HostReader:
    """Reads one sysfs root; reuse one instance across passes.

    `state_pass` runs on the daemon's loop, `counter_jobs` on whatever consumer asks; each
    device's reads hold its gate, so the two never touch one device at the same time.
    """

    def __init__(
        self, root: SysfsRoot, settings: ReaderSettings | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.root = root
        self.clock = clock  # counter back-off's and the safety sweep's time
        self.safety_s = SAFETY_S  # --poll.safety-interval: what events announce is re-read this often
        self._settings = settings or ReaderSettings()
        self._devices: dict[str, _DeviceReader] = {}
        self._order: tuple[_DeviceReader, ...] = ()  # replaced, never mutated: consumers' threads read it
        self._retired: list[_DeviceReader] = []  # gone, descriptors to close once no read of them runs
        self._errors_lock = threading.Lock()
        self.full_gid_reads = 0
        self._last: Snapshot | None = None
        self._filtered_out: tuple[str, ...] = ()
        self._listing_failed = False
        self._passes = 0
        self._recheck = True  # the last pass changed something: check every registration's identity
        self._identities_due = float("-inf")  # (clock) when identities are checked anyway

    @property
    def settings(self) -> ReaderSettings:
        return self._settings

    @settings.setter
    def settings(self, settings: ReaderSettings) -> None:
        """New settings (a config reload): cached NCCL picks were made with the old ones."""
        refilter = settings.counters != self._settings.counters
        self._settings = settings
        for device in self._devices.values():
            device.resettle = True
            if refilter:
                device.shape = None  # learned again, with a counter plan of the new filter

    # -- one-shot ---------------------------------------------------------------------------

    def read(self, *, full_gid_tables: bool | Collection[str] = False) -> Snapshot:
        """Everything, counters included, on this thread, as if events were not trusted.
        `full_gid_tables` forces a whole-table GID read on every port (True) or on the ports of the
        named devices."""
        snap = self.state_pass(full_gid_tables=full_gid_tables, trust_events=False, counters=True).snapshot
        devices = tuple(self._devices[d.name].with_counters(d) for d in snap.devices)
        errors = [e for e in snap.errors if e.device == "-"]  # the listing itself failed
        unsupported = []
        for reader in self._order:
            errors += [*reader.errors, *reader.counter_failed]
            unsupported += [*reader.unsupported, *reader.counter_unsupported]
        return replace(snap, devices=devices, errors=tuple(errors), unsupported=tuple(unsupported))

    # -- passes -----------------------------------------------------------------------------

    def state_pass(
        self,
        *,
        full_gid_tables: bool | Collection[str] = False,
        trust_events: bool | Collection[str] = False,
        runner: Runner = run_here,
        counters: bool = False,
    ) -> StatePass:
        """One pass over every device's state (and its counters with `counters`); `runner` runs
        the per-device jobs (and may skip a stuck device, which keeps its last objects).
        `trust_events`: every device (True), or the devices named, is read trusting announcements."""
        started = time.monotonic()
        listing_errors: list[ReadError] = []
        # A registration's identity (a `stat` through the class link, per device) is checked on an
        # announcement, on the safety sweep, and after a pass that changed anything; a fast pass
        # that trusts events lists the names only (udev and rtnetlink announce a re-registration,
        # and its held files stop answering, which changes the pass).
        now = self.clock()
        check = not trust_events or bool(full_gid_tables) or self._recheck or now >= self._identities_due
        readers = self._enumerate(listing_errors, check)
        if check:
            self._identities_due = now + self.safety_s
        jobs: list[Job] = []
        self._passes += 1
        for reader in readers:
            full = full_gid_tables if isinstance(full_gid_tables, bool) else reader.name in full_gid_tables
            trusted = trust_events if isinstance(trust_events, bool) else reader.name in trust_events
            jobs.append((reader.gate, reader.state_job(bool(full), trusted, counters)))
        runner(jobs)
        self._close_retired()
        listing_failed, self._listing_failed = self._listing_failed, bool(listing_errors)
        changed = [r.name for r in readers if r.changed]
        self._recheck = bool(changed) or bool(listing_errors) or any(r.device is None for r in readers)
        last = self._last
        present = tuple(r for r in readers if r.device is not None)
        unread = tuple(r.name for r in readers if r.device is None)
        if (
            last is not None
            and not changed
            and not listing_errors
            and not listing_failed
            and unread == last.listed_unread
            and self._filtered_out == last.filtered_out
            and len(present) == len(last.devices)
            and all(r.device is d for r, d in zip(present, last.devices, strict=True))
        ):
            return StatePass(last, (), self._counted(readers), time.monotonic() - started)
        netdevs: dict[str, Netdev] = {}
        pcie: dict[str, PcieLink] = {}
        errors: list[ReadError] = list(listing_errors)
        unsupported: list[ReadError] = []
        for reader in readers:  # a device not published (identity unreadable) still says why
            if reader.device is not None:
                reader.contribute(netdevs, pcie)
            errors.extend(reader.errors)
            unsupported.extend(reader.unsupported)
        snap = self._last = Snapshot(
            devices=tuple(cast(Device, r.device) for r in present),
            netdevs=netdevs,
            pcie=pcie,
            errors=tuple(errors),
            taken_at=time.time(),
            read_seconds=time.monotonic() - started,
            unsupported=tuple(unsupported),
            listed_unread=unread,
            filtered_out=self._filtered_out,
        )
        return StatePass(
            snap, tuple(changed) or ("-",), self._counted(readers) + tuple(listing_errors), snap.read_seconds
        )

    def _counted(self, readers: Sequence[_DeviceReader]) -> tuple[ReadError, ...]:
        """The errors of the reads this pass made (not of devices it left alone)."""
        out: list[ReadError] = []
        for reader in readers:
            out.extend(reader.take_read_errors())
        return tuple(out)

    def device_names(self) -> tuple[str, ...]:
        """The devices the last pass listed, in exposition order."""
        return tuple(r.name for r in self._order)

    def counter_jobs(self) -> list[Job]:
        """One job per device that has a counter plan; each returns its failed reads via `take_counter_errors`."""
        return [(r.gate, r.counter_job) for r in self._order]

    def take_counter_errors(self) -> tuple[ReadError, ...]:
        out: list[ReadError] = []
        for reader in self._order:
            out.extend(reader.take_counter_errors())
        return tuple(out)

    def counter_judgements(self) -> list[tuple[tuple[ReadError, ...], tuple[ReadError, ...]]]:
        """Per device still registered: (failed, unsupported) counter files of its last counter pass."""
        return [(r.counter_failed, r.counter_unsupported) for r in self._order if not r.counter_gone]

    def counter_plans(self) -> list[tuple[str, CounterPlan | None]]:
        """(device, its counter plan) in exposition order."""
        return [(r.name, r.counter_plan) for r in self._order]

    def freshness(self) -> tuple[DeviceFreshness, ...]:
        out = []
        for r in self._order:
            plan = r.counter_plan
            out.append(
                DeviceFreshness(
                    r.name,
                    r.gate.stuck,
                    r.state_at,
                    plan.completed_at if plan else None,
                    tuple(plan.backoff_samples()) if plan else (),
                    None if r.state_at is None else not r.trusted,
                )
            )
        return tuple(out)

    def close(self) -> None:
        """Close every descriptor no hung read may be using (the others go with the process)."""
        for reader in [*self._devices.values(), *self._retired]:
            if reader.gate.lock.acquire(blocking=False):
                try:
                    reader.forget()
                finally:
                    reader.gate.lock.release()

    def _enumerate(self, errors: list[ReadError], check: bool = True) -> list[_DeviceReader]:
        names = self._list_devices(errors)
        if names is None:
            return list(self._order)  # a failed listing is a failed pass, not an empty host
        if not check and names == [r.name for r in self._order]:
            return list(self._order)  # the same names: the same registrations until a check says not
        readers = []
        for name in names:
            ident = self.root.identity(f"{CLASS_DIR}/{name}")
            if ident is None:
                continue  # vanished between listing and reading
            reader = self._devices.get(name)
            if reader is None or reader.ident != ident:
                if reader is not None:
                    self._retired.append(reader)  # re-registered: new firmware, counters reset, new fds
                reader = self._devices[name] = _DeviceReader(self, name, ident, len(self._devices))
            readers.append(reader)
        present = {r.name for r in readers}
        for name in [n for n in self._devices if n not in present]:
            self._retired.append(self._devices.pop(name))
        self._order = tuple(readers)
        return readers

    def _close_retired(self) -> None:
        kept = []
        for reader in self._retired:
            if reader.gate.lock.acquire(blocking=False):
                try:
                    reader.forget()
                finally:
                    reader.gate.lock.release()
            else:
                kept.append(reader)  # a read of it still runs (or hangs): close after it
        self._retired = kept

    def _list_devices(self, errors: list[ReadError]) -> list[str] | None:
        try:
            names = self.root.listdir(CLASS_DIR)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return []  # no RDMA stack loaded: no devices, not a failure
            errors.append(ReadError("-", None, CLASS_DIR, errno_reason(exc)))
            return None
        wanted = sorted(n for n in names if self.settings.wants(n))
        self._filtered_out = tuple(sorted(set(names) - set(wanted)))
        return wanted


@dataclass(frozen=True, slots=True)
class StatePass:
    snapshot: Snapshot  # the previous pass's very object when nothing changed
    changed: tuple[str, ...]  # devices whose objects changed ("-": the device list did)
    read_errors: tuple[ReadError, ...]  # failures of the reads this pass made
    seconds: float


class _DeviceReader:
    """One registration of one RDMA device: its shape, read plans, GID tables and last objects.
    Every method but the constructor runs under `gate.lock`."""

    def __init__(self, host: HostReader, name: str, ident: tuple[int, int], ordinal: int) -> None:
        self.host = host
        self.root = host.root
        self.fds = host.root.cache()
        self.gate = Gate(name)
        self.name = name
        self.ident = ident
        self.base = f"{CLASS_DIR}/{name}"
        self.shape: _Shape | None = None
        self.gids: dict[int, gid_source.GidTable] = {}
        self.plan: ReadPlan | None = None
        self.counter_plan: CounterPlan | None = None
        self.resettle = False  # settings changed: recompute the NCCL picks
        self._faults: dict[str, list[ReadError]] = {}  # per group, found while planning (GID table reads too)
        self._plan_faults: dict[str, list[ReadError]] = {}  # those of them that make planning repeat each pass
        self._port_netdevs: dict[int, tuple[str, ...]] = {}
        self._netdev_idents: dict[str, tuple[int, int] | None] = {}
        self._netdev_pci: dict[str, str | None] = {}
        self._built: dict[str, object] = {}
        self._ports: dict[int, Port] = {}
        self.device: Device | None = None
        self._published: Device | None = None
        self.errors: tuple[ReadError, ...] = ()  # of the state, failed (sources/availability.py)
        self.unsupported: tuple[ReadError, ...] = ()  # of the state, never provided by the driver
        self.counter_failed: tuple[ReadError, ...] = ()
        self.counter_unsupported: tuple[ReadError, ...] = ()
        self.counter_gone = False  # the last counter pass found the device unregistered under it
        self.first_reads = availability.FirstReads()  # the state's
        self._counter_reads = availability.FirstReads()
        self._counter_plan_read = False
        self.changed = False
        self.state_at: float | None = None
        self._watch = ReadBatch([])
        self._watch_index: list[int] = []  # plan slot of each watched file
        self._watch_states: list[int] = []  # watched indices of port state, phys_state and GID files
        self._watch_raws: list[Raw | None] = []
        self._stagger = (ordinal % SWEEP_STAGGER) / SWEEP_STAGGER  # devices' safety sweeps spread out
        self._sweep_due = float("-inf")  # (host clock) when this device's next safety sweep is due
        self._fast_gid_ports: list[int] = []  # ports whose GID table nothing announces (InfiniBand)
        self.trusted = False  # the last pass trusted announcements for it (else: all polled fast)
        self._read_errors: list[ReadError] = []
        self._counter_errors: list[ReadError] = []
        self._merged: tuple[Device, tuple[int, ...], Device] | None = None

    def forget(self) -> None:
        self.fds.close()

    def take_read_errors(self) -> list[ReadError]:
        out, self._read_errors = self._read_errors, []
        return out

    def take_counter_errors(self) -> list[ReadError]:
        out, self._counter_errors = self._counter_errors, []
        return out

    def contribute(self, netdevs: dict[str, Netdev], pcie: dict[str, PcieLink]) -> None:
        shape = self.shape
        if shape is not None and shape.pci_address is not None and "pcie" in self._built:
            pcie.setdefault(shape.pci_address, cast(PcieLink, self._built["pcie"]))
        for name in self._netdev_pci:
            netdev = self._built.get(f"netdev:{name}")
            if netdev is not None:
                netdevs.setdefault(name, cast(Netdev, netdev))

    # -- counters ---------------------------------------------------------------------------

    def counter_job(self) -> None:
        plan = self.counter_plan
        if plan is None:
            return
        refresh_errors = plan.refresh(self.fds)
        # The device went away under held descriptors (`rdma link delete`, a NIC off the bus: the
        # kernel answers ENODEV): its failed reads stay in a one-shot read's snapshot (what was and was
        # not read), but the daemon's counter view leaves them out (`counter_judgements`): the next
        # state pass sees the device gone, which is the news, not a warning per counter file (the
        # kernel lab logged 15 of them before "disappeared").
        self.counter_gone = self._gone(refresh_errors)
        first = () if self._counter_plan_read else [plan.slot_label(i) for i in range(len(plan.rels))]
        self._counter_plan_read = True
        judged = self._counter_reads.judge(plan.errors, first, present=not self.counter_gone)
        self.counter_failed, self.counter_unsupported = judged.failed, judged.unsupported
        if not self.counter_gone:
            # rnic_exporter_read_errors_total counts failures: a file the driver never provided (a
            # restricted function's `N/A (no PMA)`, EINVAL since the first read) is not one.
            lacking = {(e.port, e.attribute) for e in judged.unsupported}
            self._counter_errors.extend(e for e in refresh_errors if (e.port, e.attribute) not in lacking)

    def _gone(self, errors: Sequence[ReadError]) -> bool:
        """ENOENT (a path looked up afresh) or ENODEV (a held descriptor of a removed kernfs node) may
        mean the device is going away under us; one stat says whether its registration is gone."""
        return any(e.kind in _GONE_ERRNOS for e in errors) and self._unregistered()

    def _present(self, errors: Sequence[ReadError]) -> bool:
        """A device going away explains every missing file: then nothing it lacks is "unsupported"."""
        return not self._gone(errors)

    def with_counters(self, device: Device) -> Device:
        """`device` with its counters (one-shot reads); the same object while nothing changed."""
        plan = self.counter_plan
        if plan is None:
            return device
        versions = tuple(g.version for g in plan.groups)
        merged = self._merged
        if merged is not None and merged[0] is device and merged[1] == versions:
            return merged[2]
        ports = []
        for port in device.ports:
            counters, hw = plan.group("counters", port.number), plan.group("hw", port.number)
            ports.append(
                replace(
                    port,
                    counters=cast(Mapping[str, CounterValue], counters.as_mapping()) if counters else {},
                    hw_counters=cast(Mapping[str, int], hw.as_mapping()) if hw else {},
                )
            )
        hw_device = plan.group("hw", None)
        out = replace(
            device, ports=tuple(ports), hw_counters=cast(Mapping[str, int], hw_device.as_mapping()) if hw_device else {}
        )
        self._merged = (device, versions, out)
        return out

    # -- state ------------------------------------------------------------------------------

    def state_job(self, full_gids: bool, trust_events: bool, counters: bool = False) -> Callable[[], None]:
        def job() -> None:
            self.state(full_gids, trust_events)
            if counters:
                self.counter_job()

        return job

    def state(self, full_gids: bool, trust_events: bool) -> None:
        before = self.device
        self.trusted = trust_events
        now = self.host.clock()
        # A fast pass reads only what nothing announces; the safety sweep (when due) reads everything,
        # populated GID slots included (`_full`).
        if trust_events and not full_gids and not self._unsettled() and now < self._sweep_due:
            raws = self.fds.read_batch(self._watch)
            swept = [n for n in self._fast_gid_ports if gid_source.sweep(self.fds, self.gids[n], GID_SWEEP_SLOTS)]
            if raws == self._watch_raws and not swept:
                self.changed = False
                self.state_at = time.time()
                return
            full_gids = bool(swept) or any(raws[i] != self._watch_raws[i] for i in self._watch_states)
        self._full(full_gids, sweep=not trust_events)
        if self._sweep_due == float("-inf"):
            self._sweep_due = now + self.host.safety_s * (1 + self._stagger)
        else:
            self._sweep_due = now + self.host.safety_s
        self.changed = self.device is not before
        self.state_at = time.time()

    def _unsettled(self) -> bool:
        """Something is still unread or unknown: the full path until it settles."""
        shape = self.shape
        return (
            self.device is None
            or self.plan is None
            or shape is None
            or not _settled(shape)
            or bool(self._plan_faults)
            or self.resettle
            or any(t.errors for t in self.gids.values())
        )

    def _full(self, full_gids: bool, sweep: bool) -> None:
        shape = self.shape
        if shape is None or not _settled(shape) or self._dev_netdevs_changed(shape):
            shape = self._discover()
            if self._unregistered():
                # Unregistered (or re-registered) while being learned: what was read is the husk of
                # a leaving device (no `device` link reads as "no PCI parent", every file ENOENT).
                # Publishing it would page a ghost; the next listing retires this registration.
                self.shape, self.plan = None, None
                self.changed, self.device = False, self._published
                return
            self.shape = shape
            self.plan = None
            self.counter_plan = self._counter_plan(shape)
            self._counter_plan_read = False
        resettle, self.resettle = self.resettle, False
        fresh_gids: set[int] = set()
        for port in shape.ports:
            table = self.gids.get(port.number)
            if (full_gids or table is None or table.errors or resettle) and self._read_gid_table(port):
                fresh_gids.add(port.number)
        plan = self.plan
        if plan is None or fresh_gids or self._plan_faults or self._netdevs_moved():
            plan = self._build_plan(shape)
        changed = plan.refresh(self.fds)
        moved = [
            port
            for port in shape.ports
            if port.number not in fresh_gids and self._gid_table_moved(plan, port.number, sweep)
        ]
        if moved:
            for port in moved:
                if self._read_gid_table(port):
                    fresh_gids.add(port.number)
            plan = self._build_plan(shape)
            changed = plan.refresh(self.fds)
        self._watch_raws = [plan.raws[i] for i in self._watch_index]
        if (changed or fresh_gids) and self._unregistered():
            # Unregistered while being read (one stat, paid only when something changed): the files
            # read after it left answer ENOENT, and an empty GID listing would read as "every
            # address left". Keep what was last published; the next listing retires the device.
            self.resettle = True
            self.changed, self.device = False, self._published
            return
        if changed or fresh_gids or self.device is None:
            self._assemble(shape, plan, changed, fresh_gids)
        self._read_errors.extend(self.errors)
        if any(e.port is None and e.attribute == "device" for e in shape.errors):
            # Which PCI function this is could not be read: publishing it under a guessed identity
            # (its name alone) would later page as a vanished NIC once the link reads again. Keep
            # what was last published; a device never read whole waits (its errors still count).
            self.device = self._published
        self._published = self.device

    def _unregistered(self) -> bool:
        """This registration is gone (or replaced) since the reader was made: one stat."""
        return self.root.identity(self.base) != self.ident

    def _dev_netdevs_changed(self, shape: _Shape) -> bool:
        """IPoIB and representor netdevs come and go without the RDMA device re-registering."""
        if shape.function_dir is None:
            return False
        try:
            listing = tuple(sorted(self.root.listdir(f"{self.base}/device/net")))
        except OSError:
            listing = ()
        return listing != shape.dev_netdevs

    def _netdevs_moved(self) -> bool:
        """A netdev appeared, vanished or was re-created since the plan was made."""
        for name, ident in self._netdev_idents.items():
            if self.root.identity(f"{netclass.CLASS_DIR}/{name}") != ident:
                self.fds.forget(f"{netclass.CLASS_DIR}/{name}/")
                return True
        return False

    def _gid_table_moved(self, plan: ReadPlan, port: int, sweep: bool) -> bool:
        """A watched slot's bytes changed, or the sweep found an empty slot filled."""
        table = self.gids[port]
        group = plan.group(f"gids:{port}")
        if plan.raws[group.start : group.end] != table.watched_raws:
            return True
        return sweep and gid_source.sweep(self.fds, table, GID_SWEEP_SLOTS)

    def _read_gid_table(self, port: _PortShape) -> bool:
        """Read the port's whole table; False when it is what the last read found (kept as it was)."""
        self.host.full_gid_reads += 1
        before = self.gids.get(port.number)
        table = gid_source.read_gid_table(
            self.fds, f"{self.base}/ports/{port.number}", self.name, port.number, previous=before
        )
        if before is not None:
            table = gid_source.keep_listing(table, before)
        table.nccl_gid_index = select_gid_index(table.entries, table.size, port.link_layer, self.host.settings.nccl)
        if before is not None and (
            before.entries,
            before.size,
            before.errors,
            before.nccl_gid_index,
            before.watched,
        ) == (table.entries, table.size, table.errors, table.nccl_gid_index, table.watched):
            before.watched_raws, before.empty = table.watched_raws, table.empty
            return False
        self.gids[port.number] = table
        return True

    def _counter_plan(self, shape: _Shape) -> CounterPlan:
        groups: list[tuple[str, int | None, str, Sequence[str]]] = [
            ("hw", None, f"{self.base}/hw_counters", shape.hw_names)
        ]
        for port in shape.ports:
            port_dir = f"{self.base}/ports/{port.number}"
            groups.append(("counters", port.number, f"{port_dir}/counters", port.counter_names))
            groups.append(("hw", port.number, f"{port_dir}/hw_counters", port.hw_names))
        counters = self.host.settings.counters
        return CounterPlan(self.name, groups, self.host.clock, None if counters.everything else counters.wants)

    # -- shape ------------------------------------------------------------------------------

    def _discover(self) -> _Shape:
        log = ErrorLog(self.root)
        name, base = self.name, self.base
        static: dict[str, object] = {}
        raws = self.root.read_many([f"{base}/{attr.file}" for attr in DEVICE_STATIC])
        for attr, raw in zip(DEVICE_STATIC, raws, strict=True):
            static[attr.file], reason = interpret(raw, attr.parse, attr.quiet)
            if reason is not None:
                log.add(name, None, attr.file, reason)
        pci_address, function_dir = self._pci_function(log)
        link_files = (False, False)
        aer_files: tuple[Attribute, ...] = ()
        dev_netdevs: tuple[str, ...] = ()
        if function_dir is not None:
            link_files = pci.link_files(self.root, function_dir)
            aer_files = pci.aer_files(self.root, function_dir) if link_files[0] else ()
            dev_netdevs = tuple(
                sorted(log.listdir(f"{base}/device/net", device=name, attribute="device/net", optional=True))
            )
        ports = []
        for number in log.numbered_entries(
            f"{base}/ports", device=name, port=None, attribute="ports", what="port number"
        ):
            port_dir = f"{base}/ports/{number}"
            link_layer = log.read(port_dir, "link_layer", parse_link_layer, device=name, port=number)
            # Drivers without process_mad (irdma, efa, rxe) have no counters/ at all: not an error.
            counters = sorted(
                log.listdir(f"{port_dir}/counters", device=name, port=number, attribute="counters", optional=True)
            )
            ports.append(_PortShape(number, link_layer, counters, self._hw_names(log, port_dir, number)))
        return _Shape(
            static=static,
            pci_address=pci_address,
            function_dir=function_dir,
            link_files=link_files,
            dev_netdevs=dev_netdevs,
            aer_files=aer_files,
            ports=ports,
            hw_names=self._hw_names(log, base, None),
            errors=log.errors,
        )

    def _hw_names(self, log: ErrorLog, base: str, port: int | None) -> list[str]:
        """Every `hw_counters/` file whatever the driver calls it, except `lifespan` (a setting)."""
        names = log.listdir(f"{base}/hw_counters", device=self.name, port=port, attribute="hw_counters", optional=True)
        return sorted(n for n in names if n != "lifespan")

    def _pci_function(self, log: ErrorLog) -> tuple[str | None, str | None]:
        """(BDF, function dir relative to the mount) through the `device` link, if it is PCI."""
        try:
            target = self.root.realpath(f"{self.base}/device")
        except OSError as exc:
            if exc.errno != errno.ENOENT:  # software devices (rxe, siw) have no parent: normal
                log.add(self.name, None, "device", f"{errno_reason(exc)}: not a symlink to the parent device")
            return None, None
        function_dir = os.path.relpath(target, os.path.realpath(self.root.mount))
        bdf = os.path.basename(target)
        if not _BDF.match(bdf):
            return None, function_dir  # auxiliary-bus parent (mlx5 sub-function): no BDF
        return bdf, function_dir

    # -- plan -------------------------------------------------------------------------------

    def _build_plan(self, shape: _Shape) -> ReadPlan:
        """Every state attribute, grouped by the object it makes, in error-report order; and the
        few of them a pass that trusts events watches."""
        plan = ReadPlan(self.name)
        faults: dict[str, list[ReadError]] = {}
        if shape.function_dir is not None and shape.pci_address is not None and shape.link_files[0]:
            slots = under(shape.function_dir, pci.LINK_POLLED, "device/")
            if shape.link_files[1]:
                slots += under(os.path.dirname(shape.function_dir), pci.UPSTREAM_POLLED, "device/../")
            up = len(slots)
            slots += under(shape.function_dir, shape.aer_files, "device/")
            address, aer_names = shape.pci_address, [a.file for a in shape.aer_files]
            plan.add_group(
                "pcie",
                slots,
                port=None,
                watched=(*pci.LINK_WATCHED, *shape.aer_files),  # errors count between events too
                build=lambda values: pci.pcie_link(
                    address, values[:4], values[4:up] or (None, None), list(zip(aer_names, values[up:], strict=True))
                ),
            )
        known, self._netdev_idents = self._netdev_idents, {}
        self._netdev_pci = {}
        for port in shape.ports:
            port_dir = f"{self.base}/ports/{port.number}"
            table = self.gids[port.number]
            gid_slots: list[tuple[str, str, Attribute]] = []
            for index in table.watched:
                gid_slots.extend((rel, rel, _GID_SLOT) for rel in gid_source.slot_rels(port_dir, index))
            plan.add_group(f"gids:{port.number}", gid_slots, port=port.number)
            faults[f"gids:{port.number}"] = list(table.errors)
            n = port.number
            plan.add_group(f"port:{n}", under(port_dir, PORT_POLLED), port=n, watched=PORT_WATCHED)
            self._port_netdevs[port.number] = self._choose_netdevs(shape, port.number, table, faults)
            for name in self._port_netdevs[port.number]:
                if name not in self._netdev_idents:
                    self._plan_netdev(plan, name, port.number, faults, known.get(name))
        plan.add_group("device", under(self.base, DEVICE_POLLED), port=None)
        self.plan = plan
        self._plan_faults = {key: found for key, found in faults.items() if found and not key.startswith("gids:")}
        self._faults = faults
        self._built = {}
        self._ports = {}
        self._plan_watch(plan, shape)
        return plan

    def _plan_watch(self, plan: ReadPlan, shape: _Shape) -> None:
        """The plan's slots a fast pass that trusts events reads: what nothing announces. A port's
        netdevs are rtnetlink's (carrier, operstate, MTU, addresses; a speed renegotiation drops the
        carrier); a RoCE port's state, rate and GIDs derive from its netdevs, so they are too. An
        InfiniBand port's state, physical state, rate and GID files, and the PCIe link's current
        speed and width, are announced by nothing: every fast pass reads them."""
        announced = {
            port.number for port in shape.ports if port.link_layer == "Ethernet" and self._port_netdevs.get(port.number)
        }
        index: list[int] = []
        states: list[int] = []
        fast_gids: list[int] = []
        for group in plan.groups:
            kind, _, number = group.key.partition(":")
            if kind == "netdev" or (kind in ("port", "gids") and int(number) in announced):
                continue
            if kind == "gids":
                fast_gids.append(int(number))
                states.extend(range(len(index), len(index) + group.end - group.start))
                index.extend(range(group.start, group.end))
                continue
            for i in range(group.start, group.end):
                name = plan.rels[i].rsplit("/", 1)[1]
                if name in group.watched:
                    if name in PORT_STATES:
                        states.append(len(index))
                    index.append(i)
        self._watch_index, self._watch_states, self._fast_gid_ports = index, states, fast_gids
        self._watch = ReadBatch([plan.rels[i] for i in index])

    def _plan_netdev(
        self, plan: ReadPlan, name: str, port: int, faults: dict[str, list[ReadError]], known: tuple[int, int] | None
    ) -> None:
        rel = f"{netclass.CLASS_DIR}/{name}"
        self._netdev_idents[name] = ident = self.root.identity(rel)
        if ident is None or ident != known:
            self.fds.forget(rel + "/")  # descriptors of a netdev that went, or of its previous self
        if ident is None:
            return  # the port names a netdev that does not exist (any more): no netdev series
        pci_address, reason = netclass.netdev_pci_address(self.root, name)
        self._netdev_pci[name] = pci_address
        key = f"netdev:{name}"
        if reason is not None:
            faults.setdefault(key, []).append(ReadError(self.name, port, f"net/{name}/device", reason))
        plan.add_group(
            key,
            under(rel, netclass.NETDEV_POLLED, f"net/{name}/"),
            port=port,
            watched=netclass.NETDEV_WATCHED,
            build=lambda values: netclass.netdev_from_values(name, values, pci_address),
        )

    def _choose_netdevs(
        self, shape: _Shape, port: int, table: gid_source.GidTable, faults: dict[str, list[ReadError]]
    ) -> tuple[str, ...]:
        """The port's netdevs: GID ndevs (what ibdev2netdev uses), else `device/net` by `dev_port`."""
        seen: list[str] = []
        for entry in table.entries:
            if entry.netdev is not None and entry.netdev not in seen:
                seen.append(entry.netdev)
        if seen or not shape.dev_netdevs:
            return tuple(seen)
        matching = []
        for name in shape.dev_netdevs:
            rel = f"{netclass.CLASS_DIR}/{name}/dev_port"
            dev_port, reason = interpret(self.root.read_many([rel])[0], _DEV_PORT.parse, _DEV_PORT.quiet)
            if reason is not None:
                faults.setdefault(f"port:{port}", []).append(ReadError(self.name, port, f"net/{name}/dev_port", reason))
            if dev_port is None or dev_port == port - 1:
                matching.append(name)
        return tuple(matching)

    # -- objects ----------------------------------------------------------------------------

    def _assemble(self, shape: _Shape, plan: ReadPlan, changed: set[str], fresh_gids: set[int]) -> None:
        """Rebuild what changed; everything else keeps its object (the sinks compare identities)."""
        built = self._built
        fresh_plan = not built
        for group in plan.groups:
            key = group.key
            if key in built and key not in changed:
                continue
            built[key] = group.build(plan.group_values(group))
        stale = {key.partition(":")[2] for key in changed}
        ports = []
        for port in shape.ports:
            n = port.number
            previous = self._ports.get(n)
            if previous is None or str(n) in stale or n in fresh_gids:
                state, phys_state, rate, lid = cast(list[object], built[f"port:{n}"])
                table = self.gids[n]
                previous = self._ports[n] = Port(
                    device=self.name,
                    number=n,
                    link_layer=port.link_layer,
                    state=cast(NumberedState | None, state),
                    phys_state=cast(NumberedState | None, phys_state),
                    rate=cast(LinkRate | None, rate),
                    lid=cast(int | None, lid),
                    gids=table.entries,
                    gid_table_size=table.size,
                    netdevs=self._port_netdevs[n],
                    nccl_gid_index=table.nccl_gid_index,
                )
            ports.append(previous)
        static = shape.static
        (node_desc,) = cast(list[object], built["device"])
        self.device = Device(
            name=self.name,
            node_guid=cast(str | None, static["node_guid"]),
            sys_image_guid=cast(str | None, static["sys_image_guid"]),
            fw_ver=cast(str | None, static["fw_ver"]),
            hca_type=cast(str | None, static["hca_type"]),
            board_id=cast(str | None, static["board_id"]),
            hw_rev=cast(str | None, static["hw_rev"]),
            node_type=cast(NumberedState | None, static["node_type"]),
            node_desc=cast(str | None, node_desc),
            pci_address=shape.pci_address,
            ports=tuple(ports),
            netdevs=shape.dev_netdevs,
        )
        errors = list(shape.errors)
        for group in plan.groups:
            errors.extend(self._faults.get(group.key, ()))
            errors.extend(plan.group_errors(group))
        # Unsupported (unreadable since the first read, with a driver's "I don't have it" answer) or failed.
        first = (
            [*plan.keys(), *((None, a.file) for a in DEVICE_STATIC), *((p.number, "link_layer") for p in shape.ports)]
            if fresh_plan
            else ()
        )
        judged = self.first_reads.judge(errors, first, present=self._present(errors))
        self.errors, self.unsupported = judged.failed, judged.unsupported
