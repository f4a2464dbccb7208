"""The GID index NCCL would auto-select on a port, reproduced from `ncclIbGetGidIndex`.

NCCL (2.21+, `NCCL_IB_GID_INDEX=-1`) starts at index 0 and walks 1..len-1, replacing its pick
when (a) the candidate's address family differs from the pick's, equals the wanted family and is in
`NCCL_IB_ADDR_RANGE`; or (b) the candidate has the wanted family, is a configured non-link-local
GID in range, its RoCE version is the wanted one, and differs from the pick's (or the pick is not
valid). On a normal host that is the lowest-index IPv4 `RoCE v2` GID. InfiniBand ports use
`NCCL_IB_ROUTABLE_FLID_GID_INDEX` (default 1) when that GID carries a FLID, else 0.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rnic_exporter.errors import ConfigError
from rnic_exporter.model import ZERO_GID, GidEntry

AF_INET = socket.AF_INET
AF_INET6 = socket.AF_INET6
_FAMILIES = {"AF_INET": AF_INET, "AF_INET6": AF_INET6}


@dataclass(frozen=True, slots=True)
class NcclSettings:
    """NCCL's GID-selection environment; `from_env` reads it the way NCCL does."""

    address_family: int = AF_INET  # NCCL_IB_ADDR_FAMILY
    address_range: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None  # NCCL_IB_ADDR_RANGE
    roce_version: int = 2  # NCCL_IB_ROCE_VERSION_NUM
    routable_flid_gid_index: int = 1  # NCCL_IB_ROUTABLE_FLID_GID_INDEX

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> NcclSettings:
        env = os.environ if env is None else env
        family_name = env.get("NCCL_IB_ADDR_FAMILY", "AF_INET").strip() or "AF_INET"
        if family_name not in _FAMILIES:
            raise ConfigError(f"NCCL_IB_ADDR_FAMILY={family_name!r}: NCCL accepts AF_INET or AF_INET6")
        family = _FAMILIES[family_name]
        address_range = None
        raw_range = env.get("NCCL_IB_ADDR_RANGE", "").strip()
        if "/" in raw_range:  # NCCL ignores a value without a prefix length
            try:
                address_range = ipaddress.ip_network(raw_range, strict=False)
            except ValueError as exc:
                raise ConfigError(f"NCCL_IB_ADDR_RANGE={raw_range!r} is not a CIDR: {exc}") from None
            # NCCL parses the base with inet_pton(family): a range of the other family fails to
            # parse, is logged and ignored, and every GID then matches.
            if (address_range.version == 4) != (family == AF_INET):
                address_range = None
        return cls(
            address_family=family,
            address_range=address_range,
            roce_version=_env_int(env, "NCCL_IB_ROCE_VERSION_NUM", 2),
            routable_flid_gid_index=_env_int(env, "NCCL_IB_ROUTABLE_FLID_GID_INDEX", 1),
        )


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None


def _raw(gid: str) -> bytes:
    return bytes.fromhex(gid.replace(":", ""))


def gid_family(gid: str) -> int:
    """AF_INET for IPv4-mapped (and mapped multicast) GIDs, else AF_INET6 (getGidAddrFamily)."""
    raw = _raw(gid)
    mapped = raw[:10] == bytes(10) and raw[10:12] == b"\xff\xff"
    mapped_mcast = raw[:4] == b"\xff\x0e\x00\x00" and raw[4:10] == bytes(6) and raw[10:12] == b"\xff\xff"
    return AF_INET if (mapped or mapped_mcast) else AF_INET6


def gid_is_valid(gid: str) -> bool:
    """configuredGid && !linkLocalGid: not zero, not `fe80::/64`."""
    raw = _raw(gid)
    return raw != bytes(16) and raw[:8] != b"\xfe\x80" + bytes(6)


def _in_range(gid: str, settings: NcclSettings) -> bool:
    net = settings.address_range
    if net is None:
        return True
    address = ipaddress.IPv6Address(_raw(gid))
    if settings.address_family == AF_INET:
        mapped = address.ipv4_mapped
        if mapped is None:
            mapped = ipaddress.IPv4Address(_raw(gid)[12:])
        return isinstance(net, ipaddress.IPv4Network) and mapped in net
    return isinstance(net, ipaddress.IPv6Network) and address in net


def select_gid_index(
    gids: Sequence[GidEntry],
    table_size: int,
    link_layer: str | None,
    settings: NcclSettings = NcclSettings(),
) -> int | None:
    """The index NCCL would pick, or None when the table is empty or unknown.

    A populated slot whose type could not be read makes NCCL fail (ncclSystemError) as soon as
    it compares that slot's version, so there is then no index it would pick: None.

    `gids` are the populated slots; every other slot reads as the zero GID with no type, which
    is also what NCCL sees (ibv_query_gid gives zero, the type file EINVAL).
    """
    if table_size <= 0:
        return None
    by_index = {entry.index: entry for entry in gids}
    if link_layer == "InfiniBand":
        flid_entry = by_index.get(settings.routable_flid_gid_index)
        if flid_entry is not None and _raw(flid_entry.gid)[4:6] != b"\x00\x00":
            return settings.routable_flid_gid_index
        return 0

    # Per slot: (family, valid, version, in range). Empty slots read as the zero GID with no type.
    empty = (gid_family(ZERO_GID), False, None, _in_range(ZERO_GID, settings))
    unreadable = {entry.index for entry in gids if entry.type is None}
    slots = {
        entry.index: (gid_family(entry.gid), gid_is_valid(entry.gid), entry.roce_version,
                      _in_range(entry.gid, settings))
        for entry in gids
    }
    pick = 0
    cur = slots.get(0, empty)
    for candidate in range(1, table_size):
        cand = slots.get(candidate, empty)
        cand_family, cand_valid, cand_version, cand_in_range = cand
        if cand_family != cur[0] and cand_family == settings.address_family and cand_in_range:
            pick, cur = candidate, cand
            continue
        if cand_family != settings.address_family or not cand_valid or not cand_in_range:
            continue
        if candidate in unreadable or pick in unreadable:
            return None
        if (cur[2] != cand_version or not cur[1]) and cand_version == settings.roce_version:
            pick, cur = candidate, cand
    return pick
