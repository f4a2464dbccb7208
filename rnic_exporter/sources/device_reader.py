"""One registration of one RDMA device: its shape, read plans, GID tables and last objects.

See `sources/reader.py` for the two ways a pass goes over a device's state (trusting events or
not); this file does one device's part of it under its `Gate` lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from rnic_exporter.model.host import Device, Netdev, PcieLink, Port, ReadError
from rnic_exporter.model.nccl import select_gid_index
from rnic_exporter.sources import availability, infiniband, netclass, pci
from rnic_exporter.sources import gids as gid_source
from rnic_exporter.sources.device_counters import DeviceCounters, Registration
from rnic_exporter.sources.discovery import PortShape, Shape, discover, settled
from rnic_exporter.sources.infiniband import CLASS_DIR, DEVICE_STATIC, PORT_STATES, PortPolled
from rnic_exporter.sources.plan import Attribute, Group, GroupKey, GroupKind, ReadPlan
from rnic_exporter.sources.read_context import ReadContext
from rnic_exporter.sources.read_thread import Gate
from rnic_exporter.sources.sysfs import NOT_EXPOSED, interpret
from rnic_exporter.sources.watch_tiers import DUE_SLACK_S, Tier, TierKind, plan_tiers

# Empty GID slots checked per port per pass while events are not trusted: 255 slots are all seen
# every 16 passes.
GID_SWEEP_SLOTS = 16
# Devices' safety sweeps are staggered over SWEEP_STAGGER steps of the safety interval, so one
# fast pass rarely holds more than one.
SWEEP_STAGGER = 12


_DEV_PORT = Attribute("dev_port", netclass.parse_int, NOT_EXPOSED)


class DeviceReader:
    """One registration of one RDMA device: its shape, read plans, GID tables and last objects.
    Every method but the constructor runs under `gate.lock`."""

    def __init__(self, context: ReadContext, name: str, ident: tuple[int, int], ordinal: int) -> None:
        self.context = context
        self.root = context.root
        self.fds = context.root.cache()
        self.gate = Gate(name)
        self.name = name
        self.ident = ident
        self.base = f"{CLASS_DIR}/{name}"
        self.shape: Shape | None = None
        self.gids: dict[int, gid_source.GidTable] = {}
        self.plan: DevicePlan | None = None  # None: plan again on the next full read
        self._built: DevicePlan | None = None  # the last plan made: its objects are what was published
        self._registration = Registration(self.root, self.base, ident)
        self.counters = DeviceCounters(name, self._registration, self.fds, context)
        self.resettle = False  # settings changed: recompute the NCCL picks
        self._faults: dict[GroupKey, list[ReadError]] = {}  # per group, found while planning (GID table reads too)
        self._plan_faults: dict[GroupKey, list[ReadError]] = {}  # those of them that make planning repeat each pass
        self._port_netdevs: dict[int, tuple[str, ...]] = {}
        self._netdev_idents: dict[str, tuple[int, int] | None] = {}
        self._ports: dict[int, Port] = {}
        self.device: Device | None = None
        self._published: Device | None = None
        self.errors: tuple[ReadError, ...] = ()  # of the state, failed (sources/availability.py)
        self.unsupported: tuple[ReadError, ...] = ()  # of the state, never provided by the driver
        self.first_reads = availability.FirstReads()  # the state's
        self.changed = False
        self.state_at: float | None = None
        self._tiers: list[Tier] = []  # what a fast pass reads, by period (sources/watch_tiers.py)
        self._stagger = (ordinal % SWEEP_STAGGER) / SWEEP_STAGGER  # devices' safety sweeps spread out
        self._sweep_due = float("-inf")  # (host clock) when this device's next safety sweep is due
        self.trusted = False  # the last pass trusted announcements for it (else: all polled fast)
        self._read_errors: list[ReadError] = []
        # Until (clock) when a fast pass has only the port tier to read (None: nothing), worked out
        # when the last pass ended; None: a pass must go the whole way (see `_quick_pass`).
        self._quick: tuple[Tier | None, float] | None = None
        self._next_due: float | None = None  # `next_due`, as of the last pass

    def forget(self) -> None:
        self.fds.close()

    def take_read_errors(self) -> list[ReadError]:
        out, self._read_errors = self._read_errors, []
        return out

    def contribute(self, netdevs: dict[str, Netdev], pcie: dict[str, PcieLink]) -> None:
        shape, plan = self.shape, self._built
        if plan is None:
            return
        if shape is not None and shape.pci_address is not None and plan.pcie is not None and plan.pcie.built:
            pcie.setdefault(shape.pci_address, plan.pcie.value)
        for name, group in plan.netdevs.items():
            if group.built:
                netdevs.setdefault(name, group.value)

    def _present(self, errors: Sequence[ReadError]) -> bool:
        """A device going away explains every missing file: then nothing it lacks is "unsupported"."""
        return not self._registration.leaving(errors)

    # -- state ------------------------------------------------------------------------------

    def state_job(self, full_gids: bool, trust_events: bool, counters: bool = False) -> Callable[[], None]:
        def job() -> None:
            self.state(full_gids, trust_events)
            if counters:
                self.counters.job()

        return job

    def state(self, full_gids: bool, trust_events: bool) -> None:
        if trust_events and not full_gids and self._quick_pass():
            return
        self._state(full_gids, trust_events)
        quick = trust_events and not self._unsettled()
        self._quick = self._quick_until() if quick else None
        self._next_due = self._due_after() if quick else None

    def _quick_pass(self) -> bool:
        """The usual fast pass of a settled device, in few steps (a 5 s wake-up is paid in cold
        caches, per line of Python it runs): until another tier or the safety sweep is due, only
        the port tier (an InfiniBand port's state, physical state, rate) is read and compared.
        False: something moved or is due; the whole path below decides (and reads the tier again)."""
        quick = self._quick
        if quick is None or self.resettle:
            return False
        tier, until = quick
        if self.context.clock() >= until:
            return False
        if tier is not None and self.fds.read_batch(tier.batch) != tier.raws:
            return False
        self.trusted = True
        self.changed = False
        self.state_at = time.time()
        return True

    def _quick_until(self) -> tuple[Tier | None, float]:
        """The port tier, and when the first other read is due (the safety sweep, or another
        tier within its `DUE_SLACK_S`, as `Tier.is_due` and `_sweep_now` judge it)."""
        until = self._sweep_due
        for tier in self._tiers:
            if not tier.empty and tier.kind is not TierKind.PORT:
                until = min(until, tier.due - DUE_SLACK_S)
        return self._tier(TierKind.PORT), until

    def _state(self, full_gids: bool, trust_events: bool) -> None:
        before = self.device
        self.trusted = trust_events
        now = self.context.clock()
        # A fast pass reads only what nothing announces and is due; the safety sweep (when due)
        # reads everything, populated GID slots included (`_full`).
        if trust_events and not full_gids and not self._unsettled():
            sweep = self._sweep_now(now)  # before the reads below move the PCIe link's due time
            moved, full_gids = self._read_due_tiers(now, sweep)
            if not moved and not sweep:
                self.changed = False
                self.state_at = time.time()
                return
        self._full(full_gids, sweep=not trust_events)
        if self._sweep_due == float("-inf"):
            self._sweep_due = now + self.context.safety_s * (1 + self._stagger)
        else:
            self._sweep_due = now + self.context.safety_s
        # Read just now: the PCIe link always, the GID tables when read whole.
        if (pcie := self._tier(TierKind.PCIE)) is not None and pcie.is_due(now):
            pcie.due = now + self.context.pcie_s
        if full_gids and (gids := self._tier(TierKind.GIDS)) is not None:
            gids.due = now + self.context.ib_gids_s
        self.changed = self.device is not before
        self.state_at = time.time()

    def _read_due_tiers(self, now: float, sweep: bool) -> tuple[bool, bool]:
        """Read the tiers due and compare them with the last read: (something moved, a port's
        state or GID files moved or an empty GID slot filled: read the GID tables whole). Before
        a safety sweep (`sweep`), which re-reads every watched file, only the empty GID slots."""
        moved = whole_gids = False
        for tier in self._tiers:
            if tier.empty or not tier.is_due(now):
                continue
            tier.due = now + self._period(tier.kind)
            raws = tier.raws if sweep else self.fds.read_batch(tier.batch)
            swept = [n for n in tier.gid_ports if gid_source.sweep(self.fds, self.gids[n], len(self.gids[n].empty))]
            if raws != tier.raws or swept:
                moved = True
                whole_gids = whole_gids or bool(swept) or any(raws[i] != tier.raws[i] for i in tier.states)
        return moved, whole_gids

    def _unsettled(self) -> bool:
        """Something is still unread or unknown: the full path until it settles."""
        shape = self.shape
        return (
            self.device is None
            or self.plan is None
            or shape is None
            or not settled(shape)
            or bool(self._plan_faults)
            or self.resettle
            or any(t.errors for t in self.gids.values())
        )

    def _full(self, full_gids: bool, sweep: bool) -> None:
        shape = self.shape
        if shape is None or not settled(shape) or self._dev_netdevs_changed(shape):
            shape = discover(self.root, self.name, self.base)
            if self._registration.gone():
                # Unregistered (or re-registered) while being learned: what was read is the husk of
                # a leaving device (no `device` link reads as "no PCI parent", every file ENOENT).
                # Publishing it would page a ghost; the next listing retires this registration.
                self.shape, self.plan = None, None
                self.changed, self.device = False, self._published
                return
            self.shape = shape
            self.plan = None
            self.counters.replan(shape)
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
        for tier in self._tiers:
            tier.raws = [plan.raws[i] for i in tier.index]
        if (changed or fresh_gids) and self._registration.gone():
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

    def _dev_netdevs_changed(self, shape: Shape) -> bool:
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

    def _gid_table_moved(self, plan: DevicePlan, port: int, sweep: bool) -> bool:
        """A watched slot's bytes changed, or the sweep found an empty slot filled."""
        table = self.gids[port]
        group = plan.gids[port]
        if plan.raws[group.start : group.end] != table.watched_raws:
            return True
        return sweep and gid_source.sweep(self.fds, table, GID_SWEEP_SLOTS)

    def _read_gid_table(self, port: PortShape) -> bool:
        """Read the port's whole table; False when it is what the last read found (kept as it was)."""
        before = self.gids.get(port.number)
        table = gid_source.read_gid_table(
            self.fds, f"{self.base}/ports/{port.number}", self.name, port.number, previous=before
        )
        if before is not None:
            table = gid_source.keep_listing(table, before)
        table.nccl_gid_index = select_gid_index(table.entries, table.size, port.link_layer, self.context.settings.nccl)
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

    # -- plan -------------------------------------------------------------------------------

    def _build_plan(self, shape: Shape) -> DevicePlan:
        """Every state attribute, grouped by the object it makes, in error-report order; and the
        few of them a pass that trusts events watches."""
        plan = DevicePlan(self.name)
        faults: dict[GroupKey, list[ReadError]] = {}
        if shape.function_dir is not None and shape.pci_address is not None and shape.link_files[0]:
            spec = pci.link_group(shape.pci_address, shape.function_dir, shape.link_files[1], shape.aer_files)
            plan.pcie = plan.add_group(GroupKey.pcie(), spec, port=None)
        known, self._netdev_idents = self._netdev_idents, {}
        for port in shape.ports:
            n = port.number
            port_dir = f"{self.base}/ports/{n}"
            table = self.gids[n]
            key = GroupKey.gids(n)
            plan.gids[n] = plan.add_group(key, gid_source.watch_group(port_dir, table), port=n)
            faults[key] = list(table.errors)
            plan.ports[n] = plan.add_group(GroupKey.of_port(n), infiniband.port_group(port_dir), port=n)
            self._port_netdevs[n] = self._choose_netdevs(shape, n, table, faults)
            for name in self._port_netdevs[n]:
                if name not in self._netdev_idents:
                    self._plan_netdev(plan, name, n, faults, known.get(name))
        plan.node_desc = plan.add_group(GroupKey.device(), infiniband.device_group(self.base), port=None)
        self.plan = self._built = plan
        self._plan_faults = {key: found for key, found in faults.items() if found and key.kind is not GroupKind.GIDS}
        self._faults = faults
        self._ports = {}
        self._plan_watch(plan, shape)
        return plan

    def _plan_watch(self, plan: ReadPlan, shape: Shape) -> None:
        """The plan's slots a fast pass that trusts events reads: what nothing announces. A port's
        netdevs are rtnetlink's (carrier, operstate, MTU, addresses; a speed renegotiation drops the
        carrier); a RoCE port's state, rate and GIDs derive from its netdevs, so they are too. An
        InfiniBand port's state, physical state, rate and GID files, and the PCIe link's current
        speed and width and AER counts, are announced by nothing: each is read at the period of
        its budget (sources/watch_tiers.py)."""
        announced = {
            port.number for port in shape.ports if port.link_layer == "Ethernet" and self._port_netdevs.get(port.number)
        }
        self._tiers = plan_tiers(plan, announced, PORT_STATES, self._tiers)

    def _period(self, kind: TierKind) -> float:
        if kind is TierKind.PCIE:
            return self.context.pcie_s
        if kind is TierKind.GIDS:
            return self.context.ib_gids_s
        return 0.0  # every pass

    def _tier(self, kind: TierKind) -> Tier | None:
        return next((t for t in self._tiers if t.kind is kind and not t.empty), None)

    def _sweep_now(self, now: float) -> bool:
        """The safety sweep is due; or it would be before the PCIe link's next read and that read
        is due now: it rides along (a little early) rather than costing a wake-up of its own.
        "Before" by more than `DUE_SLACK_S`: a sweep due with the next PCIe read is made by that
        read. A wake-up is always a little late, and a sweep due exactly one PCIe period after this
        read (the usual case: both were read together) compared as "before" by those few
        milliseconds: every device was swept at every PCIe read, twice a minute instead of once."""
        if now >= self._sweep_due:
            return True
        pcie = self._tier(TierKind.PCIE)
        return pcie is not None and pcie.is_due(now) and self._sweep_due < now + self.context.pcie_s - DUE_SLACK_S

    def next_due(self) -> float | None:
        """(Reader clock) when this device next has something to read; None: every pass (it has
        InfiniBand ports, or it is not read trusting announcements, or not settled). The safety
        sweep rides along with the PCIe link's reads where it has one. As of the last pass."""
        return None if self.resettle else self._next_due

    def _due_after(self) -> float | None:
        """`next_due` of a settled device read trusting announcements."""
        if self._tier(TierKind.PORT) is not None:
            return None
        dues = [t.due for t in self._tiers if not t.empty]
        return min(dues) if dues else self._sweep_due

    def _plan_netdev(
        self,
        plan: DevicePlan,
        name: str,
        port: int,
        faults: dict[GroupKey, list[ReadError]],
        known: tuple[int, int] | None,
    ) -> None:
        rel = f"{netclass.CLASS_DIR}/{name}"
        self._netdev_idents[name] = ident = self.root.identity(rel)
        if ident is None or ident != known:
            self.fds.forget(rel + "/")  # descriptors of a netdev that went, or of its previous self
        if ident is None:
            return  # the port names a netdev that does not exist (any more): no netdev series
        pci_address, reason = netclass.netdev_pci_address(self.root, name)
        key = GroupKey.of_netdev(name)
        if reason is not None:
            faults.setdefault(key, []).append(ReadError(self.name, port, f"net/{name}/device", reason))
        plan.netdevs[name] = plan.add_group(key, netclass.netdev_group(name, pci_address), port=port)

    def _choose_netdevs(
        self, shape: Shape, port: int, table: gid_source.GidTable, faults: dict[GroupKey, list[ReadError]]
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
                faults.setdefault(GroupKey.of_port(port), []).append(
                    ReadError(self.name, port, f"net/{name}/dev_port", reason)
                )
            if dev_port is None or dev_port == port - 1:
                matching.append(name)
        return tuple(matching)

    # -- objects ----------------------------------------------------------------------------

    def _assemble(self, shape: Shape, plan: DevicePlan, changed: set[GroupKey], fresh_gids: set[int]) -> None:
        """Rebuild what changed; everything else keeps its object (the sinks compare identities)."""
        fresh_plan = not plan.node_desc.built  # a plan's groups are built together, the first time
        plan.rebuild(changed)
        stale = {key.port for key in changed if key.kind in _PORT_KINDS}
        ports = []
        for port in shape.ports:
            n = port.number
            previous = self._ports.get(n)
            if previous is None or n in stale or n in fresh_gids:
                polled = plan.ports[n].value
                table = self.gids[n]
                previous = self._ports[n] = Port(
                    device=self.name,
                    number=n,
                    link_layer=port.link_layer,
                    state=polled.state,
                    phys_state=polled.phys_state,
                    rate=polled.rate,
                    lid=polled.lid,
                    gids=table.entries,
                    gid_table_size=table.size,
                    netdevs=self._port_netdevs[n],
                    nccl_gid_index=table.nccl_gid_index,
                )
            ports.append(previous)
        static = shape.static
        self.device = Device(
            name=self.name,
            node_guid=static.node_guid,
            sys_image_guid=static.sys_image_guid,
            fw_ver=static.fw_ver,
            hca_type=static.hca_type,
            board_id=static.board_id,
            hw_rev=static.hw_rev,
            node_type=static.node_type,
            node_desc=plan.node_desc.value,
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


class DevicePlan(ReadPlan):
    """A device's read plan, with its groups by what each makes (replaced together)."""

    node_desc: Group[str | None]  # added last (error-report order): set once planned

    def __init__(self, device: str) -> None:
        super().__init__(device)
        self.pcie: Group[PcieLink] | None = None
        self.gids: dict[int, Group[None]] = {}
        self.ports: dict[int, Group[PortPolled]] = {}
        self.netdevs: dict[str, Group[Netdev]] = {}


# The kinds of group that are of one port (`GroupKey.port`).
_PORT_KINDS = frozenset({GroupKind.PORT, GroupKind.GIDS})
