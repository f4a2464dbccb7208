"""What detection needs besides sysfs, gathered in one place for the daemon and for `check`.

The reads themselves are the sources' (`sources/address_risks.py`, `sources/ethtool.py`): this module
only asks the callables it is handed."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from rnic_exporter.detect.conditions import AddressLike, is_expected_candidate
from rnic_exporter.model.host import AdvertisedLink, Snapshot


@dataclass(frozen=True, slots=True)
class Inputs:
    addresses: Mapping[str, tuple[AddressLike, ...]] | None = None  # by netdev; None without netlink
    advertised: Mapping[str, AdvertisedLink] = field(default_factory=dict)  # by netdev
    risks: Mapping[str, frozenset[str]] = field(default_factory=dict)  # by netdev


RiskLookup = Callable[[str, int | None, bool], frozenset[str]]  # (netdev, ifindex, has global IPv6)


def gather_inputs(
    snap: Snapshot,
    risks: RiskLookup,
    addresses: Mapping[str, tuple[AddressLike, ...]] | None,
    advertised: Callable[[str], AdvertisedLink | None],
) -> Inputs:
    """Advertised link modes and address-loss risks of every RoCE netdev in `snap`."""
    best_modes: dict[str, AdvertisedLink] = {}
    found: dict[str, frozenset[str]] = {}
    for port in snap.ports:
        netdev = port.netdev
        if netdev is None or port.link_layer != "Ethernet":
            continue
        best = advertised(netdev)
        if best is not None:
            best_modes[netdev] = best
        info = snap.netdevs.get(netdev)
        has_v6 = addresses is not None and any(
            a.family == "ipv6" and is_expected_candidate(a.address) for a in addresses.get(netdev, ())
        )
        found[netdev] = risks(netdev, info.ifindex if info else None, has_v6)
    return Inputs(addresses, best_modes, found)
