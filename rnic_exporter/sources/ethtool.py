"""The best link mode a netdev advertises, over ethtool netlink (pyroute2), as a rated speed.

pyroute2 reports the *advertised* modes in the field named `supported_modes` when it uses
netlink (the OURS bitset's value), and the truly supported ones over the ioctl fallback; either
way the best listed mode is what the port can reach, so it serves as the netdev's rating.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from rnic_exporter.model.host import AdvertisedLink
from rnic_exporter.sources import pyroute2_parts

log = logging.getLogger("rnic_exporter.ethtool")

# "400000baseCR4/Full", "100000baseSR4_Full", "25000baseCR/Full", "200000baseCR2/Full"
_MODE = re.compile(r"^(\d+)base([A-Za-z]+?)(\d*)(?:[/_](?:Full|Half))?$")


def best_mode(modes: list[str] | tuple[str, ...]) -> AdvertisedLink | None:
    best: AdvertisedLink | None = None
    for mode in modes:
        match = _MODE.match(mode.strip())
        if match is None:
            continue
        speed = int(match.group(1))
        lanes = int(match.group(3)) if match.group(3) else 1
        if best is None or speed > best.speed_mbps:
            best = AdvertisedLink(speed, lanes)
    return best


class EthtoolReader:
    """Reads advertised modes per netdev; a failure yields None and is counted, never raised."""

    def __init__(self) -> None:
        self._ethtool: Any = None
        self.errors = 0

    def advertised(self, ifname: str) -> AdvertisedLink | None:
        try:
            if self._ethtool is None:
                self._ethtool = pyroute2_parts.module("ethtool").Ethtool()  # not all of pyroute2
            mode = self._ethtool.get_link_mode(ifname)
        except Exception as exc:  # pyroute2 raises a variety (NetlinkError, OSError, NotSupported...)
            self.errors += 1
            log.debug("ethtool link modes unavailable", extra={"fields": {"netdev": ifname, "err": repr(exc)}})
            return None
        if mode is None:
            return None
        return best_mode(list(getattr(mode, "supported_modes", None) or ()))

    def close(self) -> None:
        if self._ethtool is not None:
            try:
                self._ethtool.close()
            except Exception:  # closing a broken socket must not take the exporter down
                log.debug("ethtool close failed", exc_info=True)
            self._ethtool = None
