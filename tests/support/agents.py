"""Agents for tests: the collaborators the daemon wires in `daemon/serve.py`, stood in for without netlink."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping

from rnic_exporter.detect.conditions import AddressLike


class Announcements:
    """An `agent.Announcer` whose verdict the test sets: `trust` True trusts every device's
    announcements (a healthy netlink), False none; `addresses` None is netlink off."""

    def __init__(
        self, trusted: bool | Collection[str] = False, addresses: Mapping[str, tuple[AddressLike, ...]] | None = None
    ) -> None:
        self.trust = trusted
        self._addresses = addresses

    def addresses(self) -> Mapping[str, tuple[AddressLike, ...]] | None:
        return self._addresses

    def trusted(self, rnic_netdevs: Mapping[str, str], devices: Callable[[], Iterable[str]]) -> bool | Collection[str]:
        return self.trust
