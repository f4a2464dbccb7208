"""Read every RDMA device of a host into one `Snapshot`.

`HostReader` is the reading layer's front: it enumerates, filters, then reads (a read can itself
upset a restricted NIC, so excluded devices are never touched). It keeps what makes the next poll
cheap: held file descriptors and each port's last GID table. Populated GID slots are re-read every
poll; the whole table is re-read when one of them changed, when the caller asks (netlink or udev
announced a change), and a rotating sweep reads a slice of the empty slots each poll, so a GID
appearing in an empty slot is never missed for more than a few polls.
"""

from __future__ import annotations

import errno
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from rnic_exporter.errors import ConfigError
from rnic_exporter.model import Device, GidEntry, Netdev, PcieLink, Port, Snapshot
from rnic_exporter.nccl import NcclSettings, select_gid_index
from rnic_exporter.sources import gids as gid_source
from rnic_exporter.sources.infiniband import (
    CLASS_DIR,
    parse_guid,
    parse_lid,
    parse_link_layer,
    parse_numbered_state,
    parse_rate,
    parse_string,
    port_counters,
    read_counter_values,
)
from rnic_exporter.sources.netclass import parse_int, read_netdev
from rnic_exporter.sources.pci import read_pcie_link
from rnic_exporter.sources.sysfs import ErrorLog, SysfsRoot, errno_reason

T = TypeVar("T")

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
        """From flag values; NCCL settings from the environment, `nccl_env` (a config file) first."""
        env = dict(os.environ)
        env.update(nccl_env or {})
        return cls(
            device_include=_compile("--collector.infiniband.device-include", device_include),
            device_exclude=_compile("--collector.infiniband.device-exclude", device_exclude),
            nccl=NcclSettings.from_env(env),
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


@dataclass(slots=True)
class _GidCache:
    indices: list[int]
    entries: tuple[GidEntry, ...]
    nccl_gid_index: int | None
    sweep_at: int = 0


class HostReader:
    """Reads snapshots from one sysfs root; reuse one instance across polls."""

    def __init__(self, root: SysfsRoot, settings: ReaderSettings | None = None) -> None:
        self.root = root
        self._settings = settings or ReaderSettings()
        self._gid_cache: dict[tuple[str, int], _GidCache] = {}
        self._identity: dict[str, tuple[int, int]] = {}
        self._paths: dict[str, set[str]] = {}  # device -> path prefixes whose fds it owns
        # Values that only change when the device is re-registered (firmware version, GUIDs,
        # link layer, counter file names): read once per identity, and again while unreadable.
        self._static: dict[str, dict[str, object]] = {}
        self.full_gid_reads = 0

    @property
    def settings(self) -> ReaderSettings:
        return self._settings

    @settings.setter
    def settings(self, settings: ReaderSettings) -> None:
        """New settings (a config reload): cached NCCL picks were made with the old ones."""
        self._settings = settings
        self._gid_cache.clear()

    def read(self, *, full_gid_tables: bool = False) -> Snapshot:
        """One snapshot. `full_gid_tables` forces a whole-table GID read on every port."""
        started = time.monotonic()
        taken_at = time.time()
        log = ErrorLog(self.root)
        names = self._list_devices(log)
        devices: list[Device] = []
        netdevs: dict[str, Netdev] = {}
        pcie: dict[str, PcieLink] = {}
        for name in names:
            fresh = self._check_identity(name)
            if fresh is None:
                continue  # vanished between listing and reading
            devices.append(self._read_device(log, name, netdevs, pcie, full_gid_tables or fresh))
        self._drop_vanished({d.name for d in devices})
        return Snapshot(
            devices=tuple(devices),
            netdevs=netdevs,
            pcie=pcie,
            errors=tuple(log.errors),
            taken_at=taken_at,
            read_seconds=time.monotonic() - started,
        )

    def close(self) -> None:
        self.root.close()

    # -- enumeration ------------------------------------------------------------------------

    def _list_devices(self, log: ErrorLog) -> list[str]:
        try:
            names = self.root.listdir(CLASS_DIR)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return []  # no RDMA stack loaded: no devices, not a failure
            log.add("-", None, CLASS_DIR, errno_reason(exc))
            return []
        return sorted(n for n in names if self.settings.wants(n))

    def _check_identity(self, name: str) -> bool | None:
        """True when the device is new or was re-registered since the last poll; None when gone."""
        try:
            st = os.stat(self.root.path(f"{CLASS_DIR}/{name}"))
        except OSError:
            return None
        ident = (st.st_ino, st.st_ctime_ns)
        previous = self._identity.get(name)
        self._identity[name] = ident
        if previous is not None and previous != ident:
            self._forget_device(name)
            return True
        return previous is None

    def _forget_device(self, name: str) -> None:
        self._static.pop(name, None)
        for prefix in self._paths.pop(name, set()):
            self.root.forget(prefix)
        for key in [k for k in self._gid_cache if k[0] == name]:
            del self._gid_cache[key]

    def _drop_vanished(self, present: set[str]) -> None:
        for name in [n for n in self._identity if n not in present]:
            self._forget_device(name)
            del self._identity[name]

    # -- one device -------------------------------------------------------------------------

    def _read_device(self, log: ErrorLog, name: str, netdevs: dict[str, Netdev],
                     pcie: dict[str, PcieLink], full_gids: bool) -> Device:
        base = f"{CLASS_DIR}/{name}"
        owned = self._paths.setdefault(name, {base + "/"})

        static = self._static.setdefault(name, {})

        def dev_attr(file: str, parse: Callable[[str], T], optional: bool = False) -> T | None:
            return self._once(static, file, log, lambda: log.read(base, file, parse, device=name,
                                                                   optional=optional))

        pci_address, function_dir = self._once(static, "device", log, lambda: self._pci_function(log, name))
        if function_dir is not None:
            owned.add(function_dir + "/")
            owned.add(os.path.dirname(function_dir) + "/")
            if pci_address is not None and pci_address not in pcie:
                link = read_pcie_link(log, function_dir, name)
                if link is not None:
                    pcie[pci_address] = link

        dev_netdevs = tuple(sorted(log.listdir(f"{base}/device/net", device=name, attribute="device/net",
                                               optional=True))) if function_dir is not None else ()
        ports = []
        for number in self._port_numbers(log, name):
            port = self._read_port(log, name, number, dev_netdevs, full_gids, static)
            ports.append(port)
            for netdev_name in port.netdevs:
                if netdev_name not in netdevs:
                    netdev = read_netdev(log, netdev_name, name, number)
                    if netdev is not None:
                        netdevs[netdev_name] = netdev
                        owned.add(f"class/net/{netdev_name}/")
                    else:
                        self.root.forget(f"class/net/{netdev_name}/")
        return Device(
            name=name,
            node_guid=dev_attr("node_guid", parse_guid),
            sys_image_guid=dev_attr("sys_image_guid", parse_guid),
            fw_ver=dev_attr("fw_ver", parse_string),
            hca_type=dev_attr("hca_type", parse_string, optional=True),
            board_id=dev_attr("board_id", parse_string, optional=True),
            hw_rev=dev_attr("hw_rev", parse_string, optional=True),
            node_type=dev_attr("node_type", parse_numbered_state),
            node_desc=log.read(base, "node_desc", parse_string, device=name, optional=True),  # writable
            pci_address=pci_address,
            ports=tuple(ports),
            hw_counters=self._hw_counters(log, base, name, None, static),
            netdevs=dev_netdevs,
        )

    def _pci_function(self, log: ErrorLog, name: str) -> tuple[str | None, str | None]:
        """(BDF, function dir relative to the mount) through the `device` link, if it is PCI."""
        rel = f"{CLASS_DIR}/{name}/device"
        try:
            target = self.root.realpath(rel)
        except OSError as exc:
            if exc.errno != errno.ENOENT:  # software devices (rxe, siw) have no parent: normal
                log.add(name, None, "device", f"{errno_reason(exc)}: not a symlink to the parent device")
            return None, None
        function_dir = os.path.relpath(target, os.path.realpath(self.root.mount))
        bdf = os.path.basename(target)
        if not re.match(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$", bdf):
            return None, function_dir  # auxiliary-bus parent (mlx5 sub-function): no BDF
        return bdf, function_dir

    def _port_numbers(self, log: ErrorLog, name: str) -> list[int]:
        return log.numbered_entries(f"{CLASS_DIR}/{name}/ports", device=name, port=None, attribute="ports",
                                    what="port number")

    @staticmethod
    def _once(static: dict[str, object], key: str, log: ErrorLog, read: Callable[[], T]) -> T:
        """`read()` the first time, the cached value after - unless the read recorded an error."""
        if key in static:
            return static[key]  # type: ignore[return-value]
        errors_before = len(log.errors)
        value = read()
        if len(log.errors) == errors_before:
            static[key] = value
        return value

    def _listing(self, log: ErrorLog, static: dict[str, object], rel: str, device: str,
                 port: int | None, attribute: str) -> list[str]:
        return self._once(static, rel, log, lambda: sorted(
            log.listdir(rel, device=device, port=port, attribute=attribute, optional=True)))

    def _hw_counters(self, log: ErrorLog, base: str, device: str, port: int | None,
                     static: dict[str, object]) -> dict[str, int]:
        """Every `hw_counters/` file whatever the driver calls it, except `lifespan` (a setting)."""
        names = [n for n in self._listing(log, static, f"{base}/hw_counters", device, port, "hw_counters")
                 if n != "lifespan"]
        return read_counter_values(log, base, "hw_counters", names, device, port)

    def _read_port(self, log: ErrorLog, device: str, number: int, dev_netdevs: tuple[str, ...],
                   full_gids: bool, static: dict[str, object]) -> Port:
        port_dir = f"{CLASS_DIR}/{device}/ports/{number}"

        def attr(file: str, parse: Callable[[str], T], optional: bool = False) -> T | None:
            return log.read(port_dir, file, parse, device=device, port=number, optional=optional)

        link_layer = self._once(static, f"{number}/link_layer", log, lambda: attr("link_layer", parse_link_layer))
        gids, table_size, nccl_index = self._read_gids(log, port_dir, device, number, full_gids, link_layer)
        # Drivers without process_mad (irdma, efa, rxe) have no counters/ at all: not an error.
        pma_names = self._listing(log, static, f"{port_dir}/counters", device, number, "counters")
        netdevs = self._port_netdevs(log, device, number, gids, dev_netdevs)
        return Port(
            device=device,
            number=number,
            link_layer=link_layer,
            state=attr("state", parse_numbered_state),
            phys_state=attr("phys_state", parse_numbered_state),
            rate=attr("rate", parse_rate),
            lid=attr("lid", parse_lid, optional=True),
            counters=port_counters(read_counter_values(log, port_dir, "counters", pma_names, device, number)),
            hw_counters=self._hw_counters(log, port_dir, device, number, static),
            gids=gids,
            gid_table_size=table_size,
            netdevs=netdevs,
            nccl_gid_index=nccl_index,
        )

    def _read_gids(self, log: ErrorLog, port_dir: str, device: str, port: int, full: bool,
                   link_layer: str | None) -> tuple[tuple[GidEntry, ...], int, int | None]:
        """(populated entries, table size, NCCL's pick); the pick is recomputed only on change."""
        key = (device, port)
        cache = self._gid_cache.get(key)
        if not full and cache is not None:
            errors_before = len(log.errors)
            current = gid_source.read_gid_slots(log, port_dir, (e.index for e in cache.entries),
                                                device, port)
            changed = current != cache.entries or len(log.errors) != errors_before
            if not changed:
                changed = self._sweep(log, port_dir, device, port, cache)
            if not changed:
                return cache.entries, len(cache.indices), cache.nccl_gid_index
            del log.errors[errors_before:]  # the full read below reports them once
        self.full_gid_reads += 1
        indices = gid_source.list_gid_indices(log, port_dir, device, port)
        entries = gid_source.read_gid_slots(log, port_dir, indices, device, port)
        nccl = select_gid_index(entries, len(indices), link_layer, self.settings.nccl)
        self._gid_cache[key] = _GidCache(indices=indices, entries=entries, nccl_gid_index=nccl)
        return entries, len(indices), nccl

    def _sweep(self, log: ErrorLog, port_dir: str, device: str, port: int, cache: _GidCache) -> bool:
        """Read the next slice of empty slots; True when one of them is no longer empty."""
        populated = {e.index for e in cache.entries}
        empty = [i for i in cache.indices if i not in populated]
        if not empty:
            return False
        start = cache.sweep_at % len(empty)
        chunk = (empty[start:] + empty[:start])[:GID_SWEEP_SLOTS]
        cache.sweep_at = start + len(chunk)
        return any(gid_source.read_gid_slot(log, port_dir, i, device, port) is not None for i in chunk)

    def _port_netdevs(self, log: ErrorLog, device: str, port: int, gids: tuple[GidEntry, ...],
                      dev_netdevs: tuple[str, ...]) -> tuple[str, ...]:
        """The port's netdevs: GID ndevs (what ibdev2netdev uses), else `device/net` by `dev_port`."""
        seen: list[str] = []
        for entry in gids:
            if entry.netdev is not None and entry.netdev not in seen:
                seen.append(entry.netdev)
        if seen or not dev_netdevs:
            return tuple(seen)
        matching = []
        for name in dev_netdevs:
            dev_port = log.read(f"class/net/{name}", "dev_port", parse_int, device=device, port=port,
                                optional=True, label_prefix=f"net/{name}/")
            if dev_port is None or dev_port == port - 1:
                matching.append(name)
        return tuple(matching)
