"""What wakes the poller early: rtnetlink and udev announcements, and what netlink tells the agent.

Both watchers are built before the agent and started after it (`daemon/serve.py`): the agent gets
the netlink side as its `Announcer`, and the watchers call the agent only through the hook handed
to `start`. A failing watcher leaves polling alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

from rnic_exporter.daemon.schedule import PollSchedule

if TYPE_CHECKING:
    from rnic_exporter.sources.netlink import IpAddress, NetlinkWatcher


class Watcher(Protocol):
    errors: int

    def close(self) -> None: ...


class NetlinkAnnouncer:
    """rtnetlink for the agent: each netdev's addresses, which devices' announcements to trust, and
    a wake-up for an announced RDMA device."""

    def __init__(self, schedule: PollSchedule) -> None:
        from rnic_exporter.sources.netlink import NetlinkWatcher

        self._schedule = schedule
        self._ours: Callable[[str, str], str | None] = lambda ifname, kind: None
        self.watcher: NetlinkWatcher = NetlinkWatcher(self._on_change)
        self._overruns = self.watcher.overruns

    def start(self, ours: Callable[[str, str], str | None]) -> None:
        """`ours(ifname, kind)`: the RDMA device an announcement concerns, or None."""
        self._ours = ours
        self.watcher.start()

    def _on_change(self, ifname: str, kind: str) -> None:
        device = self._ours(ifname, kind)
        if device is not None:
            self._schedule.announce("netlink", (device,))

    def addresses(self) -> Mapping[str, tuple[IpAddress, ...]]:
        return self.watcher.addresses()

    def trusted(self, rnic_netdevs: Mapping[str, str], devices: Callable[[], Iterable[str]]) -> frozenset[str]:
        """Healthy, nothing dropped since the last pass (an overrun loses announcements), and only
        devices all of whose netdevs netlink knows (it announces nothing about the others)."""
        netlink = self.watcher
        seen, self._overruns = self._overruns, netlink.overruns
        if not netlink.healthy or seen != netlink.overruns:
            return frozenset()
        links = netlink.links()
        unknown = {device for netdev, device in rnic_netdevs.items() if netdev not in links}
        # A device without netdevs (InfiniBand without IPoIB) has nothing netlink could announce:
        # trusted, its fast pass reads what nothing announces (its ports' state, rate, GIDs).
        return frozenset(name for name in devices() if name not in unknown)


def start_watchers(
    netlink: NetlinkAnnouncer | None,
    udev: bool,
    ours: Callable[[str, str], str | None],
    rnic_netdevs: Callable[[], Mapping[str, str]],
    schedule: PollSchedule,
    cleanup: contextlib.ExitStack,
) -> dict[str, Watcher]:
    """Start netlink (built before the agent) and udev; `ours` and `rnic_netdevs` are the agent's."""
    watchers: dict[str, Watcher] = {}
    if netlink is not None:
        netlink.start(ours)
        cleanup.callback(netlink.watcher.close)
        watchers["netlink"] = netlink.watcher
    if udev:
        from rnic_exporter.sources.udev import UdevWatcher

        def on_udev(subsystem: str, action: str, sys_name: str) -> None:
            if subsystem != "net" or sys_name in rnic_netdevs():
                schedule.announce("udev")

        watcher = UdevWatcher(on_udev)
        watcher.start()
        cleanup.callback(watcher.close)
        watchers["udev"] = watcher
    return watchers
