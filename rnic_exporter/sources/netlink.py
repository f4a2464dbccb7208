"""Links and addresses of the current network namespace, kept up to date from rtnetlink.

A `NetlinkWatcher` owns one rtnetlink socket in one thread of its own, which runs a private
asyncio loop around pyroute2's `AsyncIPRoute`. Why that shape (pyroute2 0.9.7):
- pyroute2 reads ahead into its own queue, so `select()` on its fd before `get()` can say "idle"
  while messages wait there: events get lost or delayed. Only its `get()` may be trusted.
- The socket is bound to the thread that made it (`_check_tid`), so one thread owns it for life.
- A blocking sync `get()` cannot be interrupted from another thread without poking at the
  socket's thread-local internals; cancelling the asyncio task that awaits `get()` can
  (`call_soon_threadsafe(task.cancel)`), which is how `close()` stops the thread at once.

Bind first, then dump: events that happen during the dump wait in the socket and are applied
after it, in order, so nothing falls in between. A full receive buffer (ENOBUFS: the kernel
dropped events) is answered at once with a new socket and a fresh dump: pyroute2 0.9.7 keeps the
first error a socket received and raises it on every later request, so the old socket cannot
dump again. Any other failure closes the socket and retries with backoff. The watcher never
raises into its owner: it counts, logs and reports `healthy`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from rnic_exporter.sources import pyroute2_parts
from rnic_exporter.sources.watcher import RetryingWatcher

log = logging.getLogger("rnic_exporter.netlink")

# linux/rtnetlink.h multicast group bits (RTMGRP_*): link changes and both address families.
RTMGRP_LINK = 0x1
RTMGRP_IPV4_IFADDR = 0x10
RTMGRP_IPV6_IFADDR = 0x100
GROUPS = RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR

IFF_UP = 0x1
IFF_LOWER_UP = 0x10000  # carrier

ChangeKind = Literal["address_added", "address_removed", "link"]
Family = Literal["ipv4", "ipv6"]


@dataclass(frozen=True, slots=True)
class IpAddress:
    address: str  # no prefix; `ipaddress` normalised text ("10.0.0.1", "fe80::1")
    prefixlen: int
    family: Family
    scope: int  # RT_SCOPE_*: 0 universe, 253 link, 254 host
    flags: int  # IFA_F_* (IFA_FLAGS when present: it carries bits above the 8 of ifa_flags)


@dataclass(frozen=True, slots=True)
class LinkInfo:
    ifname: str
    index: int
    admin_up: bool  # IFF_UP
    lower_up: bool  # IFF_LOWER_UP: carrier
    operstate: str  # as sysfs prints it: "up", "down", "lowerlayerdown", "unknown", ...
    # Kept so that a change of them is announced too: the exporter polls what netlink announces
    # only on its slow safety sweep (sources/reader.py).
    mtu: int | None = None
    mac: str | None = None  # IFLA_ADDRESS


@dataclass(frozen=True, slots=True)
class NetlinkEvent:
    """One state change, in the order the kernel announced it (what `on_event` receives)."""

    ifname: str
    kind: ChangeKind
    address: IpAddress | None = None  # for address_added / address_removed
    link: LinkInfo | None = None  # for link: the new state, None when the link was deleted


# An address is identified as the kernel does: IPv4 by (local, prefixlen), IPv6 by the address.
_AddressKey = tuple[str, int]


def _key(addr: IpAddress) -> _AddressKey:
    return (addr.address, addr.prefixlen if addr.family == "ipv4" else 128)


def parse_address(msg: Any) -> tuple[int, IpAddress] | None:
    """An `ifaddrmsg` as pyroute2 decodes it -> (ifindex, IpAddress); None for other families.

    For IPv4 the own address is IFA_LOCAL; IFA_ADDRESS is the peer on point-to-point links.
    """
    family = msg["family"]
    if family == socket.AF_INET:
        text = msg.get("IFA_LOCAL") or msg.get("IFA_ADDRESS")
        fam: Family = "ipv4"
    elif family == socket.AF_INET6:
        text = msg.get("IFA_ADDRESS") or msg.get("IFA_LOCAL")
        fam = "ipv6"
    else:
        return None
    if not text:
        return None
    flags = msg.get("IFA_FLAGS")
    return int(msg["index"]), IpAddress(
        address=str(ipaddress.ip_address(text)),
        prefixlen=int(msg["prefixlen"]),
        family=fam,
        scope=int(msg["scope"]),
        flags=int(flags if flags is not None else msg["flags"]),
    )


def parse_link(msg: Any) -> LinkInfo | None:
    """An `ifinfmsg` -> LinkInfo; None for messages without a name (e.g. AF_BRIDGE port info)."""
    if msg["family"] != socket.AF_UNSPEC:
        return None
    name = msg.get("IFLA_IFNAME")
    if not name:
        return None
    flags = int(msg["flags"])
    operstate = msg.get("IFLA_OPERSTATE")
    return LinkInfo(
        ifname=str(name),
        index=int(msg["index"]),
        admin_up=bool(flags & IFF_UP),
        lower_up=bool(flags & IFF_LOWER_UP),
        operstate=str(operstate).lower() if operstate is not None else "unknown",
        mtu=int(mtu) if (mtu := msg.get("IFLA_MTU")) is not None else None,
        mac=str(mac) if (mac := msg.get("IFLA_ADDRESS")) is not None else None,
    )


class _State:
    """Links by index and addresses by index; every mutation returns the changes it made."""

    def __init__(self) -> None:
        self.links: dict[int, LinkInfo] = {}
        self.addrs: dict[int, dict[_AddressKey, IpAddress]] = {}

    def name(self, index: int) -> str | None:
        link = self.links.get(index)
        return link.ifname if link else None

    def set_link(self, link: LinkInfo) -> list[NetlinkEvent]:
        old = self.links.get(link.index)
        self.links[link.index] = link
        if old == link:
            return []  # statistics and other attributes we do not keep
        changes = [NetlinkEvent(link.ifname, "link", link=link)]
        if old is not None and old.ifname != link.ifname:
            changes.insert(0, NetlinkEvent(old.ifname, "link", link=None))
        return changes

    def del_link(self, index: int) -> list[NetlinkEvent]:
        link = self.links.pop(index, None)
        gone = self.addrs.pop(index, {})
        if link is None:
            return []
        return [NetlinkEvent(link.ifname, "address_removed", address=a) for a in gone.values()] + [
            NetlinkEvent(link.ifname, "link", link=None)
        ]

    def add_address(self, index: int, addr: IpAddress) -> list[NetlinkEvent]:
        table = self.addrs.setdefault(index, {})
        known = _key(addr) in table
        table[_key(addr)] = addr  # keep the newest flags (IPv6: tentative -> permanent)
        name = self.name(index)
        if known or name is None:
            return []  # a re-announcement (IPv6 flag or lifetime update) is not a change
        return [NetlinkEvent(name, "address_added", address=addr)]

    def del_address(self, index: int, addr: IpAddress) -> list[NetlinkEvent]:
        old = self.addrs.get(index, {}).pop(_key(addr), None)
        name = self.name(index)
        if old is None or name is None:
            return []
        return [NetlinkEvent(name, "address_removed", address=old)]

    def replace(self, links: Iterable[LinkInfo], addrs: Iterable[tuple[int, IpAddress]]) -> list[NetlinkEvent]:
        """Take a fresh dump; the changes are what differs from the state it replaces."""
        new = _State()
        for link in links:
            new.links[link.index] = link
        for index, addr in addrs:
            new.addrs.setdefault(index, {})[_key(addr)] = addr
        changes: list[NetlinkEvent] = []
        for index in self.links.keys() - new.links.keys():
            changes += self.del_link(index)
        for index, link in new.links.items():
            changes += self.set_link(link)
            old_addrs = self.addrs.get(index, {})
            new_addrs = new.addrs.get(index, {})
            for key in old_addrs.keys() - new_addrs.keys():
                changes += self.del_address(index, old_addrs[key])
            for addr in new_addrs.values():
                changes += self.add_address(index, addr)
        self.addrs = {i: a for i, a in new.addrs.items() if i in new.links}
        return changes


class NetlinkWatcher(RetryingWatcher):
    """Keeps the links and addresses of the current netns, and says when they change.

    `on_change(ifname, kind)` and `on_event(NetlinkEvent)` run in the watcher's thread, once per
    actual change (re-announcements and link messages that change nothing we keep are dropped;
    after a re-dump, whatever differs from the state before it is reported). A slow callback
    delays the watcher (and can overrun its buffer); an exception in one is logged and ignored.
    """

    name = "netlink"
    meanwhile = "addresses and links may be stale meanwhile"
    lost = "the kernel dropped events; re-reading all links and addresses"

    def __init__(
        self,
        on_change: Callable[[str, str], None] | None = None,
        *,
        on_event: Callable[[NetlinkEvent], None] | None = None,
        retry_initial_s: float = 0.5,
        retry_max_s: float = 30.0,
        rcvbuf: int = 1 << 20,
    ) -> None:
        # `start` returns once the first dump finished (or the first attempt failed).
        super().__init__(log, retry_initial_s=retry_initial_s, retry_max_s=retry_max_s)
        self._on_change = on_change
        self._on_event = on_event
        self._rcvbuf = rcvbuf
        self._state = _State()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    # -- public ------------------------------------------------------------------------------

    def addresses(self) -> Mapping[str, tuple[IpAddress, ...]]:
        """Addresses per interface name, kernel order; a consistent copy."""
        with self._lock:
            out = {
                link.ifname: tuple(self._state.addrs.get(index, {}).values())
                for index, link in self._state.links.items()
            }
        return MappingProxyType(out)

    def links(self) -> Mapping[str, LinkInfo]:
        with self._lock:
            out = {link.ifname: link for link in self._state.links.values()}
        return MappingProxyType(out)

    # -- the watcher thread ------------------------------------------------------------------

    def _interrupt(self) -> None:
        """Cancel the task awaiting `get()`: the socket closes with it."""
        with self._lock:
            loop, task = self._loop, self._task
        if loop is not None and task is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed in between: nothing to cancel
                loop.call_soon_threadsafe(task.cancel)

    def _describe(self, exc: BaseException) -> str:
        return _describe(exc)

    def _thread_main(self) -> None:
        while not self._stop.is_set():
            try:
                loop = asyncio.new_event_loop()  # needs descriptors too: may fail like the socket
            except OSError as exc:
                self._stop.wait(self._failed(exc))
                continue
            try:
                with self._lock:  # `close` sets `_stop`, then takes the lock to cancel the task
                    if self._stop.is_set():
                        return
                    self._loop, self._task = loop, loop.create_task(self._run())
                asyncio.set_event_loop(loop)
                loop.run_until_complete(self._task)
            except asyncio.CancelledError:
                pass
            except Exception:  # a bug in here must not take the process down
                log.exception("netlink watcher stopped unexpectedly")
            finally:
                self.healthy = False
                self._ready.set()
                with contextlib.suppress(Exception):
                    loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()
            return

    async def _run(self) -> None:
        while not self._stop.is_set():
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    self._overrun()  # at once, no backoff: a fresh socket and dump rebuild the state
                else:
                    await asyncio.sleep(self._failed(exc))
            except Exception as exc:
                await asyncio.sleep(self._failed(exc))

    async def _session(self) -> None:
        ipr = pyroute2_parts.module("iproute.linux").AsyncIPRoute(rcvbuf=self._rcvbuf)  # not all of pyroute2
        try:
            await ipr.bind(groups=GROUPS)
            await self._dump(ipr)
            self._up()
            while True:
                async for msg in ipr.get():
                    self._handle(msg)
        finally:
            ipr.close()

    async def _dump(self, ipr: Any) -> None:
        links = [link for msg in [m async for m in await ipr.get_links()] if (link := parse_link(msg))]
        addrs = [parsed for msg in [m async for m in await ipr.get_addr()] if (parsed := parse_address(msg))]
        with self._lock:
            changes = self._state.replace(links, addrs)
        if self._ready.is_set():  # the first dump is the starting point, not a change
            self._notify(changes)

    def _handle(self, msg: Any) -> None:
        event = msg.get("event")
        changes: list[NetlinkEvent] = []
        with self._lock:
            if event in ("RTM_NEWADDR", "RTM_DELADDR"):
                parsed = parse_address(msg)
                if parsed is not None:
                    index, addr = parsed
                    if event == "RTM_NEWADDR":
                        changes = self._state.add_address(index, addr)
                    else:
                        changes = self._state.del_address(index, addr)
            elif event == "RTM_NEWLINK":
                link = parse_link(msg)
                if link is not None:
                    changes = self._state.set_link(link)
            elif event == "RTM_DELLINK" and msg["family"] == socket.AF_UNSPEC:
                changes = self._state.del_link(int(msg["index"]))
        self._notify(changes)

    def _notify(self, changes: list[NetlinkEvent]) -> None:
        for change in changes:
            try:
                if self._on_event is not None:
                    self._on_event(change)
                if self._on_change is not None:
                    self._on_change(change.ifname, change.kind)
            except Exception:
                log.exception("netlink change callback failed for %s %s", change.ifname, change.kind)


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if not isinstance(exc, OSError) else text


__all__ = ["GROUPS", "IpAddress", "LinkInfo", "NetlinkEvent", "NetlinkWatcher", "parse_address", "parse_link"]
