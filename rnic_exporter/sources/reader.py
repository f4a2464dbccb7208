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
  A fast pass reads only what nothing announces and is due (`sources/watch_tiers.py`: an
  InfiniBand port's state and rate every pass, the PCIe link's speed, width and AER counts every
  `--poll.pcie-interval`, an InfiniBand GID table, every empty slot included, every
  `--poll.gid-interval`) and compares the bytes. Nothing moved: the pass ends there. `next_due`
  says when the next pass has anything to read (the daemon sleeps until then).
  Something moved: the device's full state is re-read and its objects rebuilt, with its whole GID
  tables when a port's state or GID files moved. The announcer (netlink, udev) forces a full
  read with whole GID tables of the devices it names. The safety sweep catches a change no
  announcement brought (an event lost without an overrun, a speed change on a driver that keeps
  the carrier): every `safety_s` (`--poll.safety-interval`, 60 s; staggered across devices) a
  device's whole state is re-read, its populated GID slots' files included. Empty GID slots are
  not compared: on a RoCE port a GID is only ever added on an address or netdev event
  (roce_gid_mgmt.c), and a slot freed later, when its last reference is put, reads the same
  before and after (a pending-delete entry reads as empty: docs/gid-index-moves.md); an
  InfiniBand table's empty slots are swept with its tier.
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
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

from rnic_exporter.model.host import DeviceFreshness, Netdev, PcieLink, ReadError, Snapshot
from rnic_exporter.sources.counter_netlink import HwNetlink
from rnic_exporter.sources.counters import CounterPlan
from rnic_exporter.sources.device_reader import GID_SWEEP_SLOTS, SWEEP_STAGGER, DeviceReader
from rnic_exporter.sources.infiniband import CLASS_DIR
from rnic_exporter.sources.live_tree import is_live_sysfs
from rnic_exporter.sources.read_context import IB_GIDS_S, PCIE_S, SAFETY_S, ReadContext, ReaderSettings
from rnic_exporter.sources.read_path import ReadPath
from rnic_exporter.sources.read_thread import Gate
from rnic_exporter.sources.sysfs import SysfsRoot, errno_reason

Job = tuple[Gate, Callable[[], None]]
Runner = Callable[[Sequence[Job]], object]


def run_here(jobs: Sequence[Job]) -> None:
    """Run jobs on the calling thread (one-shot reads, tests)."""
    for gate, job in jobs:
        with gate.lock:
            job()


class HostReader:
    """Reads one sysfs root; reuse one instance across passes.

    `state_pass` runs on the daemon's loop, `counter_jobs` on whatever consumer asks; each
    device's reads hold its gate, so the two never touch one device at the same time.
    """

    def __init__(
        self,
        root: SysfsRoot,
        settings: ReaderSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        netlink: HwNetlink | None = None,
    ) -> None:
        """`netlink`: RDMA netlink for the hw counters; by default one of this process's network
        namespace where `root` is a sysfs mount (`/sys`, or the host's at `/host/sys` in a pod); a
        captured or simulated tree has no kernel behind it."""
        self.root = root
        self.clock = clock  # counter back-off's and the safety sweep's time
        if netlink is None and is_live_sysfs(root.mount):
            netlink = HwNetlink()
        # What the device readers see of this reader (instead of a back-reference to it).
        self._context = ReadContext(root, clock, settings or ReaderSettings(), netlink=netlink)
        self._devices: dict[str, DeviceReader] = {}
        self._order: tuple[DeviceReader, ...] = ()  # replaced, never mutated: consumers' threads read it
        self._retired: list[DeviceReader] = []  # gone, descriptors to close once no read of them runs
        self._errors_lock = threading.Lock()
        self._last: Snapshot | None = None
        self._filtered_out: tuple[str, ...] = ()
        self._listing_failed = False
        self._passes = 0
        self._recheck = True  # the last pass changed something: check every registration's identity
        self._identities_due = float("-inf")  # (clock) when identities are checked anyway
        self._listed: tuple[ReaderSettings, list[str], tuple[str, ...]] | None = None  # settings, listing, wanted

    @property
    def safety_s(self) -> float:
        """--poll.safety-interval: what events announce is re-read this often."""
        return self._context.safety_s

    @safety_s.setter
    def safety_s(self, seconds: float) -> None:
        self._context.safety_s = seconds

    def set_periods(self, *, pcie_s: float, ib_gids_s: float) -> None:
        """--poll.pcie-interval and --poll.gid-interval: how often a pass that trusts events reads
        the PCIe links and the InfiniBand GID tables (sources/watch_tiers.py)."""
        self._context.pcie_s, self._context.ib_gids_s = pcie_s, ib_gids_s

    def next_due(self) -> float | None:
        """(clock) When a state pass next has something to read; None: at the poll interval (a
        device is read every pass: InfiniBand ports, announcements not trusted, not settled, or
        no device at all). The device listing and identity checks ride along with it."""
        dues = [r.next_due() for r in self._order]
        if not dues or None in dues:
            return None
        return min(d for d in dues if d is not None)

    @property
    def settings(self) -> ReaderSettings:
        return self._context.settings

    @settings.setter
    def settings(self, settings: ReaderSettings) -> None:
        """New settings (a config reload): cached NCCL picks were made with the old ones."""
        old = self._context.settings
        refilter = (settings.counters, settings.rdma_netlink, settings.pma_slow_s) != (
            old.counters,
            old.rdma_netlink,
            old.pma_slow_s,
        )
        self._context.settings = settings
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
        devices = self.with_counters(snap).devices
        errors = [e for e in snap.errors if e.device == "-"]  # the listing itself failed
        unsupported = []
        for reader in self._order:
            errors += [*reader.errors, *reader.counters.failed]
            unsupported += [*reader.unsupported, *reader.counters.unsupported]
        return replace(snap, devices=devices, errors=tuple(errors), unsupported=tuple(unsupported))

    def with_counters(self, snap: Snapshot, wait_s: float | None = None) -> Snapshot:
        """`snap` (a state pass's) with each device's ports carrying its last counter pass's values.
        Each device is merged under its gate; one whose read hangs (its gate stuck, or not free
        within `wait_s`) or that is no longer read keeps its ports without counters."""
        devices = []
        for device in snap.devices:
            reader = self._devices.get(device.name)
            if reader is None or reader.gate.stuck:
                devices.append(device)
                continue
            if not reader.gate.lock.acquire(timeout=-1 if wait_s is None else wait_s):
                devices.append(device)
                continue
            try:
                devices.append(reader.counters.with_counters(device))
            finally:
                reader.gate.lock.release()
        return replace(snap, devices=tuple(devices))

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
        present = tuple(device for r in readers if (device := r.device) is not None)
        unread = tuple(r.name for r in readers if r.device is None)
        if (
            last is not None
            and not changed
            and not listing_errors
            and not listing_failed
            and unread == last.listed_unread
            and self._filtered_out == last.filtered_out
            and len(present) == len(last.devices)
            and all(d is before for d, before in zip(present, last.devices, strict=True))
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
            devices=present,
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

    def _counted(self, readers: Sequence[DeviceReader]) -> tuple[ReadError, ...]:
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
        return [(r.gate, r.counters.scrape_job) for r in self._order]

    def take_counter_errors(self) -> tuple[ReadError, ...]:
        out: list[ReadError] = []
        for reader in self._order:
            out.extend(reader.counters.take_errors())
        return tuple(out)

    def counter_judgements(self) -> list[tuple[tuple[ReadError, ...], tuple[ReadError, ...]]]:
        """Per device still registered: (failed, unsupported) counter files of its last counter pass."""
        return [(r.counters.failed, r.counters.unsupported) for r in self._order if not r.counters.gone]

    def counter_plans(self) -> list[tuple[str, CounterPlan | None]]:
        """(device, its counter plan) in exposition order."""
        return [(r.name, r.counters.plan) for r in self._order]

    @property
    def netlink_failures(self) -> int:
        """RDMA netlink requests that failed a device read through it (monotone)."""
        netlink = self._context.netlink
        return 0 if netlink is None else netlink.failures

    def read_costs(self) -> list[tuple[str, ReadPath | None, dict[str, int]]]:
        """(device, how its hw counters are read, its reads so far per kind) in exposition order."""
        return [(r.name, r.counters.read_path, dict(r.counters.reads)) for r in self._order]

    def freshness(self) -> tuple[DeviceFreshness, ...]:
        out = []
        for r in self._order:
            plan = r.counters.plan
            out.append(
                DeviceFreshness(
                    r.name,
                    r.gate.stuck,
                    r.state_at,
                    plan.completed_at if plan else None,
                    tuple(plan.backoff_samples()) if plan else (),
                    None if r.state_at is None else not r.trusted,
                    None if (path := r.counters.read_path) is None else (path.path, path.code),
                    tuple(sorted(r.counters.reads.items())),
                )
            )
        return tuple(out)

    def close(self) -> None:
        """Close every descriptor no hung read may be using (the others go with the process)."""
        if self._context.netlink is not None:
            self._context.netlink.close()
        for reader in [*self._devices.values(), *self._retired]:
            if reader.gate.lock.acquire(blocking=False):
                try:
                    reader.forget()
                finally:
                    reader.gate.lock.release()

    def _enumerate(self, errors: list[ReadError], check: bool = True) -> list[DeviceReader]:
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
                reader = self._devices[name] = DeviceReader(self._context, name, ident, len(self._devices))
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
        settings = self.settings
        listed = self._listed
        if listed is not None and listed[0] is settings and listed[1] == names:
            return list(listed[2])  # the same listing: filtered as last time (most passes)
        wanted = sorted(n for n in names if settings.wants(n))
        self._filtered_out = tuple(sorted(set(names) - set(wanted)))
        self._listed = (settings, names, tuple(wanted))
        return wanted


@dataclass(frozen=True, slots=True)
class StatePass:
    snapshot: Snapshot  # the previous pass's very object when nothing changed
    changed: tuple[str, ...]  # devices whose objects changed ("-": the device list did)
    read_errors: tuple[ReadError, ...]  # failures of the reads this pass made
    seconds: float


__all__ = [
    "GID_SWEEP_SLOTS",
    "IB_GIDS_S",
    "PCIE_S",
    "SAFETY_S",
    "SWEEP_STAGGER",
    "HostReader",
    "Job",
    "ReaderSettings",
    "Runner",
    "StatePass",
    "run_here",
]
