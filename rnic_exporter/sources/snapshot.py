"""Read every RDMA device of a host into one `Snapshot`.

`HostReader` is the reading layer's front: it enumerates, filters, then reads (a read can itself
upset a restricted NIC, so excluded devices are never touched). It keeps what makes the next poll
cheap, per device registration (inode and ctime of its class directory):
- its shape: static attributes, PCI function, ports, counter file names. Learned once; learned
  again every poll while any of it is unreadable, and when `device/net` or a netdev changes.
- a `ReadPlan` of every attribute a poll reads, re-read in one pass over held descriptors; only
  values whose bytes changed are parsed, and objects none of whose values changed are reused.
- each port's last GID table. Populated GID slots are re-read every poll; the whole table is
  re-read when one of them changed, when the caller asks (netlink or udev announced a change), and
  a rotating sweep reads a slice of the empty slots each poll, so a GID appearing in an empty slot
  is never missed for more than a few polls.
"""

from __future__ import annotations

import errno
import os
import re
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import cast

from rnic_exporter.errors import ConfigError
from rnic_exporter.model import (
    CounterValue,
    Device,
    LinkRate,
    Netdev,
    NumberedState,
    PcieLink,
    Port,
    ReadError,
    Snapshot,
)
from rnic_exporter.nccl import NcclSettings, nccl_environment, select_gid_index
from rnic_exporter.sources import availability, netclass, pci
from rnic_exporter.sources import gids as gid_source
from rnic_exporter.sources.infiniband import (
    CLASS_DIR,
    DEVICE_POLLED,
    DEVICE_STATIC,
    PORT_POLLED,
    counter_attributes,
    parse_link_layer,
    port_counters,
)
from rnic_exporter.sources.plan import RAW_ONLY, Attribute, ReadPlan, under
from rnic_exporter.sources.sysfs import NOT_EXPOSED, ErrorLog, SysfsRoot, errno_reason, interpret

# Empty GID slots checked per port per poll: 255 slots are all seen every 16 polls. Netlink and
# udev wake-ups force a full read, so the sweep is only the safety net.
GID_SWEEP_SLOTS = 16


@dataclass(frozen=True, slots=True)
class ReaderSettings:
    device_include: re.Pattern[str] | None = None  # --collector.infiniband.device-include
    device_exclude: re.Pattern[str] | None = None  # --collector.infiniband.device-exclude
    nccl: NcclSettings = field(default_factory=NcclSettings)

    @classmethod
    def build(cls, device_include: str | None = None, device_exclude: str | None = None,
              nccl_env: Mapping[str, str] | None = None) -> ReaderSettings:
        """From flag values; NCCL settings from `nccl_env` (a config file), the environment beating it."""
        return cls(
            device_include=_compile("--collector.infiniband.device-include", device_include),
            device_exclude=_compile("--collector.infiniband.device-exclude", device_exclude),
            nccl=NcclSettings.from_env(nccl_environment(nccl_env)),
        )

    def wants(self, device: str) -> bool:
        if self.device_include is not None and not self.device_include.search(device):
            return False
        return not (self.device_exclude is not None and self.device_exclude.search(device))


def _compile(flag: str, pattern: str | None) -> re.Pattern[str] | None:
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"{flag} {pattern!r} is not a valid regular expression: {exc}") from None


_BDF = re.compile(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_GID_SLOT = Attribute("gid slot", RAW_ONLY)
_DEV_PORT = Attribute("dev_port", netclass.parse_int, NOT_EXPOSED)


@dataclass(slots=True)
class _PortShape:
    number: int
    link_layer: str | None
    counter_names: list[str]
    hw_names: list[str]


@dataclass(slots=True)
class _Shape:
    """What does not change while the device stays registered (or is re-learned while unreadable)."""

    static: dict[str, object]
    pci_address: str | None
    function_dir: str | None
    link_files: tuple[bool, bool]
    dev_netdevs: tuple[str, ...]
    ports: list[_PortShape]
    hw_names: list[str]
    errors: list[ReadError] = field(default_factory=list)


class HostReader:
    """Reads snapshots from one sysfs root; reuse one instance across polls."""

    def __init__(self, root: SysfsRoot, settings: ReaderSettings | None = None) -> None:
        self.root = root
        self._settings = settings or ReaderSettings()
        self._devices: dict[str, _DeviceReader] = {}
        self.full_gid_reads = 0

    @property
    def settings(self) -> ReaderSettings:
        return self._settings

    @settings.setter
    def settings(self, settings: ReaderSettings) -> None:
        """New settings (a config reload): cached NCCL picks were made with the old ones."""
        self._settings = settings
        for device in self._devices.values():
            device.gids.clear()

    def read(self, *, full_gid_tables: bool | Collection[str] = False) -> Snapshot:
        """One snapshot. `full_gid_tables` forces a whole-table GID read on every port (True) or on
        the ports of the named devices (netlink announced a change on one of their netdevs)."""
        started = time.monotonic()
        taken_at = time.time()
        errors: list[ReadError] = []
        unsupported: list[ReadError] = []
        names = self._list_devices(errors)
        devices: list[Device] = []
        netdevs: dict[str, Netdev] = {}
        pcie: dict[str, PcieLink] = {}
        for name in names:
            ident = self.root.identity(f"{CLASS_DIR}/{name}")
            if ident is None:
                continue  # vanished between listing and reading
            reader = self._devices.get(name)
            if reader is None or reader.ident != ident:
                if reader is not None:
                    reader.forget()  # re-registered: new firmware, counters reset, new fds
                reader = self._devices[name] = _DeviceReader(self, name, ident)
            full = full_gid_tables if isinstance(full_gid_tables, bool) else name in full_gid_tables
            devices.append(reader.read(full, netdevs, pcie, errors, unsupported))
        present = {d.name for d in devices}
        for name in [n for n in self._devices if n not in present]:
            self._devices.pop(name).forget()
        return Snapshot(
            devices=tuple(devices),
            netdevs=netdevs,
            pcie=pcie,
            errors=tuple(errors),
            taken_at=taken_at,
            read_seconds=time.monotonic() - started,
            unsupported=tuple(unsupported),
        )

    def close(self) -> None:
        self.root.close()

    def _list_devices(self, errors: list[ReadError]) -> list[str]:
        try:
            names = self.root.listdir(CLASS_DIR)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return []  # no RDMA stack loaded: no devices, not a failure
            errors.append(ReadError("-", None, CLASS_DIR, errno_reason(exc)))
            return []
        return sorted(n for n in names if self.settings.wants(n))


class _DeviceReader:
    """One registration of one RDMA device: its shape, read plan, GID tables and last objects."""

    def __init__(self, host: HostReader, name: str, ident: tuple[int, int]) -> None:
        self.host = host
        self.root = host.root
        self.name = name
        self.ident = ident
        self.base = f"{CLASS_DIR}/{name}"
        self.owned = {self.base + "/"}  # path prefixes whose descriptors this registration holds
        self.shape: _Shape | None = None
        self.gids: dict[int, gid_source.GidTable] = {}
        self.plan: ReadPlan | None = None
        self._faults: dict[str, list[ReadError]] = {}  # per group, found while planning (GID table reads too)
        self._plan_faults: dict[str, list[ReadError]] = {}  # those of them that make planning repeat each poll
        self._port_netdevs: dict[int, tuple[str, ...]] = {}
        self._netdev_idents: dict[str, tuple[int, int] | None] = {}
        self._netdev_pci: dict[str, str | None] = {}
        self._built: dict[str, object] = {}
        self._ports: dict[int, Port] = {}
        self._device: Device | None = None
        self._errors: tuple[ReadError, ...] = ()
        self._unsupported: tuple[ReadError, ...] = ()
        self.first_reads = availability.FirstReads()

    def forget(self) -> None:
        for prefix in self.owned:
            self.root.forget(prefix)

    # -- one poll ---------------------------------------------------------------------------

    def read(self, full_gids: bool, netdevs: dict[str, Netdev], pcie: dict[str, PcieLink],
             errors: list[ReadError], unsupported: list[ReadError]) -> Device:
        shape = self.shape
        # Learned again while part of it failed; what the driver does not provide never comes (availability).
        if shape is None or any(availability.symptom(e) is None for e in shape.errors) \
                or self._dev_netdevs_changed(shape):
            shape = self.shape = self._discover()
            self.plan = None
        fresh_gids: set[int] = set()
        for port in shape.ports:
            if full_gids or port.number not in self.gids:
                self._read_gid_table(port)
                fresh_gids.add(port.number)
        plan = self.plan
        if plan is None or fresh_gids or self._plan_faults or self._netdevs_moved():
            plan = self._build_plan(shape)
        changed = plan.refresh(self.root)
        moved = [port for port in shape.ports
                 if port.number not in fresh_gids and self._gid_table_moved(plan, port.number)]
        if moved:
            for port in moved:
                self._read_gid_table(port)
                fresh_gids.add(port.number)
            plan = self._build_plan(shape)
            changed = plan.refresh(self.root)
        if changed or fresh_gids or self._device is None:
            self._assemble(shape, plan, changed, fresh_gids)
        device = self._device
        assert device is not None
        if shape.pci_address is not None and "pcie" in self._built:
            pcie.setdefault(shape.pci_address, cast(PcieLink, self._built["pcie"]))
        for name in self._netdev_pci:
            netdev = self._built.get(f"netdev:{name}")
            if netdev is not None:
                netdevs.setdefault(name, cast(Netdev, netdev))
        errors.extend(self._errors)
        unsupported.extend(self._unsupported)
        return device

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
                self.root.forget(f"{netclass.CLASS_DIR}/{name}/")
                return True
        return False

    def _gid_table_moved(self, plan: ReadPlan, port: int) -> bool:
        """A watched slot's bytes changed, or the sweep found an empty slot filled."""
        table = self.gids[port]
        group = plan.group(f"gids:{port}")
        if plan.raws[group.start:group.end] != table.watched_raws:
            return True
        return gid_source.sweep(self.root, table, GID_SWEEP_SLOTS)

    def _read_gid_table(self, port: _PortShape) -> None:
        self.host.full_gid_reads += 1
        table = gid_source.read_gid_table(self.root, f"{self.base}/ports/{port.number}", self.name, port.number,
                                          previous=self.gids.get(port.number))
        table.nccl_gid_index = select_gid_index(table.entries, table.size, port.link_layer,
                                                self.host.settings.nccl)
        self.gids[port.number] = table

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
        dev_netdevs: tuple[str, ...] = ()
        if function_dir is not None:
            self.owned.update({function_dir + "/", os.path.dirname(function_dir) + "/"})
            link_files = pci.link_files(self.root, function_dir)
            dev_netdevs = tuple(sorted(log.listdir(f"{base}/device/net", device=name, attribute="device/net",
                                                   optional=True)))
        ports = []
        for number in log.numbered_entries(f"{base}/ports", device=name, port=None, attribute="ports",
                                           what="port number"):
            port_dir = f"{base}/ports/{number}"
            link_layer = log.read(port_dir, "link_layer", parse_link_layer, device=name, port=number)
            # Drivers without process_mad (irdma, efa, rxe) have no counters/ at all: not an error.
            counters = sorted(log.listdir(f"{port_dir}/counters", device=name, port=number, attribute="counters",
                                          optional=True))
            ports.append(_PortShape(number, link_layer, counters, self._hw_names(log, port_dir, number)))
        return _Shape(static=static, pci_address=pci_address, function_dir=function_dir, link_files=link_files,
                      dev_netdevs=dev_netdevs, ports=ports, hw_names=self._hw_names(log, base, None),
                      errors=log.errors)

    def _hw_names(self, log: ErrorLog, base: str, port: int | None) -> list[str]:
        """Every `hw_counters/` file whatever the driver calls it, except `lifespan` (a setting)."""
        names = log.listdir(f"{base}/hw_counters", device=self.name, port=port, attribute="hw_counters",
                            optional=True)
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
        """Every attribute a poll reads, grouped by the object it makes, in error-report order."""
        plan = ReadPlan(self.name)
        faults: dict[str, list[ReadError]] = {}
        if shape.function_dir is not None and shape.pci_address is not None and shape.link_files[0]:
            slots = under(shape.function_dir, pci.LINK_POLLED, "device/")
            if shape.link_files[1]:
                slots += under(os.path.dirname(shape.function_dir), pci.UPSTREAM_POLLED, "device/../")
            plan.add_group("pcie", slots, port=None)
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
            plan.add_group(f"port:{n}", under(port_dir, PORT_POLLED), port=n)
            plan.add_group(f"counters:{n}", under(port_dir, counter_attributes("counters", port.counter_names)), port=n)
            plan.add_group(f"hw:{n}", under(port_dir, counter_attributes("hw_counters", port.hw_names)), port=n)
            self._port_netdevs[port.number] = self._choose_netdevs(shape, port.number, table, faults)
            for name in self._port_netdevs[port.number]:
                if name not in self._netdev_idents:
                    self._plan_netdev(plan, name, port.number, faults, known.get(name))
        plan.add_group("device", under(self.base, DEVICE_POLLED), port=None)
        plan.add_group("hw:device", under(self.base, counter_attributes("hw_counters", shape.hw_names)), port=None)
        self.plan = plan
        self._plan_faults = {key: found for key, found in faults.items() if found and not key.startswith("gids:")}
        self._faults = faults
        self._built = {}
        self._ports = {}
        return plan

    def _plan_netdev(self, plan: ReadPlan, name: str, port: int, faults: dict[str, list[ReadError]],
                     known: tuple[int, int] | None) -> None:
        rel = f"{netclass.CLASS_DIR}/{name}"
        self._netdev_idents[name] = ident = self.root.identity(rel)
        if ident is None or ident != known:
            self.root.forget(rel + "/")  # descriptors of a netdev that went, or of its previous self
        if ident is None:
            return  # the port names a netdev that does not exist (any more): no netdev series
        self.owned.add(rel + "/")
        pci_address, reason = netclass.netdev_pci_address(self.root, name)
        self._netdev_pci[name] = pci_address
        key = f"netdev:{name}"
        if reason is not None:
            faults.setdefault(key, []).append(ReadError(self.name, port, f"net/{name}/device", reason))
        plan.add_group(key, under(rel, netclass.NETDEV_POLLED, f"net/{name}/"), port=port)

    def _choose_netdevs(self, shape: _Shape, port: int, table: gid_source.GidTable,
                        faults: dict[str, list[ReadError]]) -> tuple[str, ...]:
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
            values = plan.group_values(group)
            kind, _, which = key.partition(":")
            if kind == "pcie":
                assert shape.pci_address is not None
                built[key] = pci.pcie_link(shape.pci_address, values[:4], values[4:] or (None, None))
            elif kind == "counters":
                port = self._port_shape(shape, which)
                built[key] = port_counters({n: cast(int, v) for n, v in zip(port.counter_names, values, strict=True)
                                            if v is not None}, cast(dict[str, CounterValue] | None, built.get(key)))
            elif kind == "hw":
                names = shape.hw_names if which == "device" else self._port_shape(shape, which).hw_names
                built[key] = {n: cast(int, v) for n, v in zip(names, values, strict=True) if v is not None}
            elif kind == "netdev":
                built[key] = netclass.netdev_from_values(which, values, self._netdev_pci[which])
            else:  # port state, device node_desc, GID slots: used as values
                built[key] = values
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
                    counters=cast(dict[str, CounterValue], built[f"counters:{n}"]),
                    hw_counters=cast(dict[str, int], built[f"hw:{n}"]),
                    gids=table.entries,
                    gid_table_size=table.size,
                    netdevs=self._port_netdevs[n],
                    nccl_gid_index=table.nccl_gid_index,
                )
            ports.append(previous)
        static = shape.static
        (node_desc,) = cast(list[object], built["device"])
        self._device = Device(
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
            hw_counters=cast(dict[str, int], built["hw:device"]),
            netdevs=shape.dev_netdevs,
        )
        errors = list(shape.errors)
        for group in plan.groups:
            errors.extend(self._faults.get(group.key, ()))
            errors.extend(plan.group_errors(group))
        # Unsupported (unreadable since the first read, with a driver's "I don't have it" answer) or failed.
        first = [*plan.keys(), *((None, a.file) for a in DEVICE_STATIC),
                 *((p.number, "link_layer") for p in shape.ports)] if fresh_plan else ()
        # ENOENT may mean the device is going away under us: then nothing it lacks is "unsupported".
        present = all(e.kind != "ENOENT" for e in errors) or self.root.identity(self.base) == self.ident
        judged = self.first_reads.judge(errors, first, present=present)
        self._errors, self._unsupported = judged.failed, judged.unsupported

    @staticmethod
    def _port_shape(shape: _Shape, which: str) -> _PortShape:
        for port in shape.ports:
            if str(port.number) == which:
                return port
        raise KeyError(which)
