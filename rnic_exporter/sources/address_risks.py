"""Host network configuration that decides whether an RNIC's addresses survive a port flap.

Incident 1 (GID index shift) starts with an address manager removing the address on carrier loss.
Two signs of that risk are readable without privileges:
- NetworkManager keeps a state file per managed device: `/run/NetworkManager/devices/<ifindex>`
  (keyfile, `[device] managed=true`). NetworkManager removes IP configuration on carrier loss.
- IPv6 removes a netdev's addresses on admin down unless `keep_addr_on_down` is set for the
  netdev or for `all` (`/proc/sys/net/ipv6/conf/<if>/keep_addr_on_down`, > 0 keeps them).
"""

from __future__ import annotations

import configparser
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rnic_exporter.model.host import IPV6_KEEP_ADDR_OFF, NETWORKMANAGER


@dataclass(frozen=True, slots=True)
class HostPaths:
    procfs: Path = Path("/proc")
    rootfs: Path = Path("/")


def networkmanager_manages(paths: HostPaths, ifindex: int) -> bool:
    """True when NetworkManager's runtime state marks the device managed."""
    text = _read(f"{paths.rootfs}/run/NetworkManager/devices/{ifindex}")
    if text is None:
        return False  # the usual answer on a host without NetworkManager: no parser built for it
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text)
    except configparser.Error:
        return False
    # NetworkManager writes managed=true/false; a state file without the key is a device it manages.
    return parser.get("device", "managed", fallback="true").strip().lower() in ("true", "1", "yes")


def _read(path: str) -> str | None:
    """A small file's text, None when it cannot be read. Plain strings, no pathlib: detection asks
    this for every RoCE netdev each minute, and most of the files do not exist."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def _keep_addr(paths: HostPaths, conf: str) -> int | None:
    text = _read(f"{paths.procfs}/sys/net/ipv6/conf/{conf}/keep_addr_on_down")
    try:
        return None if text is None else int(text.strip())
    except ValueError:
        return None


def ipv6_keeps_addresses(paths: HostPaths, ifname: str) -> bool | None:
    """None when IPv6 is absent for the netdev (nothing to lose)."""
    own = _keep_addr(paths, ifname)
    if own is None:
        return None
    return own > 0 or (_keep_addr(paths, "all") or 0) > 0


def address_loss_risks(paths: HostPaths, ifname: str, ifindex: int | None, has_global_ipv6: bool) -> frozenset[str]:
    risks = set()
    if ifindex is not None and networkmanager_manages(paths, ifindex):
        risks.add(NETWORKMANAGER)
    # Only a risk for a netdev that carries IPv6 addresses whose GIDs a flap would delete.
    if has_global_ipv6 and ipv6_keeps_addresses(paths, ifname) is False:
        risks.add(IPV6_KEEP_ADDR_OFF)
    return frozenset(risks)


def host_risks(paths: HostPaths) -> Callable[[str, int | None, bool], frozenset[str]]:
    """`address_loss_risks` bound to this host's paths: detection's risk lookup by (netdev, ifindex,
    has a global IPv6 address)."""

    def lookup(netdev: str, ifindex: int | None, has_global_ipv6: bool) -> frozenset[str]:
        return address_loss_risks(paths, netdev, ifindex, has_global_ipv6)

    return lookup
