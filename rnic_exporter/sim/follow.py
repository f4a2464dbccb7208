"""Make a simulated host's GID tables follow real netdevs, as the kernel's roce_gid_mgmt does.

Tests create veth interfaces named like the simulated RNICs' netdevs (`ens1f0np0`, ...) in a
network namespace and drive them with plain `ip addr del/add` and `ip link set down/up`; the
follower turns the rtnetlink events into GID table changes in the simulated sysfs tree:

- each event is applied `delay_s` after it arrived, one at a time in arrival order: the kernel
  sends the rtnetlink message first and updates the GID cache from an ordered work queue;
- a new address takes the lowest free slot (`GidTable`), and a slot still referenced by a QP
  (`SimHost.hold_gid`) stays taken while pending delete, so a re-added address lands higher;
- an IPv6 address equal to the MAC-derived default GID adds nothing and deletes nothing
  (cache.c matches the default entry on add and excludes default entries on delete);
- RoCE port state is admin up and carrier (mlx5_query_port_roce); carrier loss leaves the GIDs;
  admin up re-adds the netdev's addresses that are missing (the NETDEV_UP enumeration).
"""

from __future__ import annotations

import ipaddress
import logging
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rnic_exporter.errors import ConfigError
from rnic_exporter.model.host import ROCE_V2
from rnic_exporter.sim.gid_table import address_gid, mac_default_gid
from rnic_exporter.sim.host import SimDevice, SimHost
from rnic_exporter.sources.netlink import IpAddress, LinkInfo, NetlinkEvent, NetlinkWatcher

log = logging.getLogger("rnic_exporter.sim.follow")

DEFAULT_DELAY_S = 0.03  # the work-queue hop between the rtnetlink message and the GID cache update


@dataclass(frozen=True, slots=True)
class _Pending:
    due: float
    event: NetlinkEvent


class NetlinkFollower:
    """Follows the real netdevs named like `host`'s RoCE netdevs (in the current netns)."""

    def __init__(
        self,
        host: SimHost,
        *,
        delay_s: float = DEFAULT_DELAY_S,
        hold_gids: bool = False,
        on_arrival: Callable[[NetlinkEvent], None] | None = None,
    ) -> None:
        """`on_arrival` sees every rtnetlink event as it reaches the follower, before any delay (the benchmark
        times the announcement from there)."""
        self.host = host
        self.on_arrival = on_arrival
        self.delay_s = delay_s
        self.hold_gids = hold_gids
        self.devices: dict[str, str] = {
            dev.netdev: dev.name for dev in host.devices.values() if dev.roce and dev.name not in host.removed
        }
        self.held: dict[str, list[int]] = {}  # RoCE v2 GID indices held since start (hold_gids)
        self.watcher = NetlinkWatcher(on_event=self._arrived)
        self._pending: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._worker: threading.Thread | None = None
        self._admin_up: dict[str, bool] = {}

    def start(self, timeout: float = 5.0) -> None:
        """Start watching, then sync the tables with the netdevs' current addresses and state."""
        self.watcher.start(timeout)
        if not self.watcher.healthy:
            self.watcher.close()
            raise OSError(f"netlink is not usable ({self.watcher.errors} failed attempt(s), see the log)")
        self.sync()
        if self.hold_gids:
            self.held = self.hold()
        self._worker = threading.Thread(target=self._work, name="netlink-follower", daemon=True)
        self._worker.start()

    def close(self) -> None:
        self._stop.set()
        self._pending.put(None)
        if self._worker is not None:
            self._worker.join(5)
        self.watcher.close()

    def __enter__(self) -> NetlinkFollower:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def sync(self) -> None:
        """Make each followed table hold exactly its netdev's addresses, and its port state match.

        Events queued meanwhile are applied afterwards; replaying them is harmless (adding a
        present address and deleting an absent one change nothing).
        """
        links = self.watcher.links()
        addresses = self.watcher.addresses()
        with self.host.lock:
            for netdev, name in self.devices.items():
                dev = self.host.device(name)
                real = [a for a in addresses.get(netdev, ()) if not _is_default_gid(dev, a)]
                wanted = {a.address for a in real}
                for address in list(dev.addresses):
                    if address not in wanted:
                        self.host.remove_address(name, address)
                for addr in sorted(real, key=lambda a: a.family != "ipv4"):  # IPv4 first, as the kernel
                    self._add(dev, addr)
                link = links.get(netdev)
                if link is None:
                    log.warning("no netdev %s to follow for %s: its port stays as built", netdev, name)
                    continue
                self._admin_up[netdev] = link.admin_up
                self.host.set_port_up(name, link.admin_up and link.lower_up)

    def hold(self) -> dict[str, list[int]]:
        """A job's QPs reference the RoCE v2 GID of every IPv4 address: returns the held indices."""
        held: dict[str, list[int]] = {}
        with self.host.lock:
            for name in self.devices.values():
                dev = self.host.device(name)
                for address in dev.addresses:
                    if (
                        ipaddress.ip_address(address).version == 4
                        and dev.gid_table.index_of(address, ROCE_V2) is not None
                    ):
                        held.setdefault(name, []).append(self.host.hold_gid(name, address))
        return held

    # -- event handling ----------------------------------------------------------------------

    def _arrived(self, event: NetlinkEvent) -> None:
        if self.on_arrival is not None:
            self.on_arrival(event)
        if event.ifname in self.devices:
            self._pending.put(_Pending(time.monotonic() + self.delay_s, event))

    def _work(self) -> None:
        while True:
            item = self._pending.get()
            if item is None or self._stop.is_set():
                return
            wait = item.due - time.monotonic()
            if wait > 0 and self._stop.wait(wait):
                return
            try:
                self._apply(item.event)
            except Exception:  # one bad event must not stop the follower
                log.exception("could not apply %s on %s to the simulated tree", item.event.kind, item.event.ifname)

    def _apply(self, event: NetlinkEvent) -> None:
        name = self.devices[event.ifname]
        with self.host.lock:
            dev = self.host.device(name)
            if event.kind == "address_added" and event.address is not None:
                if not _is_default_gid(dev, event.address):
                    self._add(dev, event.address)
            elif event.kind == "address_removed" and event.address is not None:
                if not _is_default_gid(dev, event.address):
                    self.host.remove_address(name, event.address.address)
            elif event.kind == "link":
                self._link(dev, event.link)

    def _link(self, dev: SimDevice, link: LinkInfo | None) -> None:
        if link is None:  # the netdev went away: no carrier, nothing to follow until it returns
            self.host.set_port_up(dev.name, False)
            self._admin_up.pop(dev.netdev, None)
            return
        was_up = self._admin_up.get(dev.netdev, False)
        self._admin_up[dev.netdev] = link.admin_up
        if link.admin_up and not was_up:
            for addr in self.watcher.addresses().get(dev.netdev, ()):
                if not _is_default_gid(dev, addr):
                    self._add(dev, addr)
        self.host.set_port_up(dev.name, link.admin_up and link.lower_up)

    def _add(self, dev: SimDevice, addr: IpAddress) -> None:
        try:
            self.host.add_address(dev.name, addr.address)
        except OSError as exc:  # ENOSPC: the kernel logs "unable to add gid ... error=-28" and goes on
            log.warning("GID table of %s is full, %s gets no GID: %s", dev.name, addr.address, exc)


def _is_default_gid(dev: SimDevice, addr: IpAddress) -> bool:
    return addr.family == "ipv6" and address_gid(addr.address) == mac_default_gid(dev.mac)


def run_simulator(
    directory: Path,
    *,
    roce: int,
    infiniband: int,
    gid_table_size: int,
    follow: bool,
    delay_s: float,
    hold_gids: bool,
    echo: Callable[[str], None],
) -> int:
    """`rnic-exporter simulate`: write the tree; with `follow`, follow netlink until SIGTERM/SIGINT.

    An existing tree is rewritten in place (same files), so an exporter reading it keeps working.
    """
    if roce + infiniband == 0:
        raise ConfigError("nothing to simulate: give --roce and/or --infiniband a count above 0")
    if follow and roce == 0:
        raise ConfigError("--follow-netlink needs RoCE devices (--roce N): InfiniBand ports have no netdev addresses")
    if hold_gids and not follow:
        raise ConfigError("--hold-gids needs --follow-netlink: without it no address ever comes and goes")
    if directory.exists() and (
        not directory.is_dir() or (any(directory.iterdir()) and not (directory / "class/infiniband").is_dir())
    ):
        raise ConfigError(f"{directory} exists and is not a simulated sysfs tree: give an empty or new directory")
    host = SimHost.build(directory, roce=roce, infiniband=infiniband, gid_table_size=gid_table_size)
    if not follow:
        echo(f"wrote a simulated host with {roce + infiniband} RNIC(s) under {directory}")
        return 0
    stop = threading.Event()
    old = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in old:
        signal.signal(sig, lambda *_: stop.set())
    follower = NetlinkFollower(host, delay_s=delay_s, hold_gids=hold_gids)
    try:
        try:
            follower.start()
        except OSError as exc:
            raise ConfigError(f"cannot follow netlink: {exc}") from exc
        echo(
            f"simulating {roce + infiniband} RNIC(s) under {directory}; following netlink for "
            f"{', '.join(follower.devices)} (GID updates {delay_s * 1000:g} ms after each event)"
            + "".join(f"; {name} holds GID {indices}" for name, indices in follower.held.items())
        )
        stop.wait()
    finally:
        follower.close()
        for sig, handler in old.items():
            signal.signal(sig, handler)
    return 0


__all__ = ["DEFAULT_DELAY_S", "NetlinkFollower", "run_simulator"]
