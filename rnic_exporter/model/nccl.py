"""NCCL's GID settings, the index it would auto-select on a port (`ncclIbGetGidIndex`), and
whether the GID it would use can carry cross-node traffic.

The one home of the NCCL_IB_* settings: `nccl_environment` merges the config file's `[nccl]`
section with the environment (the environment wins: it is what the jobs on this host get), and
`NcclSettings.from_env` / `gid_index_from_env` parse it the way NCCL does.

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
from types import MappingProxyType

from rnic_exporter.config.bounds import GID_INDEX, check_number
from rnic_exporter.errors import ConfigError
from rnic_exporter.model.host import ZERO_GID, Device, GidEntry, Port

AF_INET = socket.AF_INET
AF_INET6 = socket.AF_INET6
_FAMILIES = {"AF_INET": AF_INET, "AF_INET6": AF_INET6}
_FAMILY_NAMES: dict[int, str] = {int(v): k for k, v in _FAMILIES.items()}

# Every NCCL variable that decides which GID a RoCE connection uses.
NCCL_VARIABLES = (
    "NCCL_IB_GID_INDEX",
    "NCCL_IB_ADDR_FAMILY",
    "NCCL_IB_ADDR_RANGE",
    "NCCL_IB_ROCE_VERSION_NUM",
    "NCCL_IB_ROUTABLE_FLID_GID_INDEX",
)


def nccl_environment(
    file_env: Mapping[str, str] | None = None, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The NCCL_* values jobs on this host run with: the config file's, overridden by the environment."""
    environ = os.environ if environ is None else environ
    merged = dict(file_env or {})
    merged.update({name: environ[name] for name in NCCL_VARIABLES if name in environ})
    return merged


def gid_index_from_env(env: Mapping[str, str]) -> int | None:
    """NCCL_IB_GID_INDEX: None when unset or empty; raises ConfigError when not an integer in the
    range `--nccl-gid-index` and the config file's `nccl.ib_gid_index` accept (one validator)."""
    raw = env.get("NCCL_IB_GID_INDEX", "").strip()
    if not raw:
        return None
    index = _env_int(env, "NCCL_IB_GID_INDEX", 0)
    try:
        return int(check_number("NCCL_IB_GID_INDEX", index, GID_INDEX))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class NcclSettings:
    """NCCL's GID-selection environment; `from_env` reads it the way NCCL does."""

    address_family: int = AF_INET  # NCCL_IB_ADDR_FAMILY
    address_range: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None  # NCCL_IB_ADDR_RANGE
    roce_version: int = 2  # NCCL_IB_ROCE_VERSION_NUM
    routable_flid_gid_index: int = 1  # NCCL_IB_ROUTABLE_FLID_GID_INDEX

    @property
    def family_name(self) -> str:
        return _FAMILY_NAMES.get(self.address_family, str(self.address_family))

    @property
    def wanted_gid(self) -> str:
        """The GID these settings make NCCL use, for messages: 'RoCE v2 IPv4 GID' at the defaults."""
        family = "IPv4" if self.address_family == AF_INET else "routable IPv6"
        return f"RoCE v{self.roce_version} {family} GID"

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
        entry.index: (
            gid_family(entry.gid),
            gid_is_valid(entry.gid),
            entry.roce_version,
            _in_range(entry.gid, settings),
        )
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


# Why the GID NCCL would use cannot carry cross-node traffic (the `reason` of check's problem and
# of the rnic.nccl.gid_unusable event).
LINK_LOCAL = "link_local"  # fe80::/64: not routable; what NCCL keeps when the port has no IPv4 GID
WRONG_ROCE_VERSION = "wrong_roce_version"  # e.g. only a RoCE v1 GID where NCCL_IB_ROCE_VERSION_NUM=2
OUT_OF_RANGE = "out_of_range"  # the GID's address is outside NCCL_IB_ADDR_RANGE
NO_GID = "no_gid"  # the slot is empty, or there is no index NCCL could pick

PICK_PROBLEMS: Mapping[str, str] = MappingProxyType(
    {
        LINK_LOCAL: "a link-local GID, which is not routable between nodes",
        WRONG_ROCE_VERSION: "a GID of another RoCE version than NCCL_IB_ROCE_VERSION_NUM asks for",
        OUT_OF_RANGE: "a GID outside NCCL_IB_ADDR_RANGE",
        NO_GID: "no GID at all",
    }
)


@dataclass(frozen=True, slots=True)
class NcclPick:
    """The GID a RoCE port's NCCL connections would use now, and whether it can work."""

    index: int | None  # NCCL_IB_GID_INDEX when set, else the auto-selection; None: none
    configured: bool  # pinned by NCCL_IB_GID_INDEX (NCCL uses it as it is, without looking)
    problem: str | None  # None when usable, else a key of PICK_PROBLEMS
    content: str  # what sits there, for messages: "index 0 holds v1 fe80::e42:a1ff:fe41:36"

    @property
    def usable(self) -> bool:
        return self.problem is None


def uses_roce(device: Device, port: Port) -> bool:
    """NCCL's RoCE path applies: an Ethernet port of a channel adapter (not iWARP, usNIC or EFA)
    that is ACTIVE (ncclIbInit skips other ports) or whose state is unknown."""
    if port.link_layer != "Ethernet":
        return False
    if device.node_type is not None and device.node_type.number != 1:  # 4 = iWARP RNIC, 5/6 usNIC
        return False
    return port.state is None or port.state.number == 4


def judge_pick(port: Port, settings: NcclSettings, configured_index: int | None = None) -> NcclPick:
    """What NCCL would use on a RoCE port whose GID table was read, judged against `settings`."""
    configured = configured_index is not None and configured_index >= 0
    index = configured_index if configured else port.nccl_gid_index
    if index is None:
        return NcclPick(None, configured, NO_GID, "no index NCCL could pick")
    entry = port.gid(index)
    if entry is None:
        return NcclPick(index, configured, NO_GID, f"index {index} is empty")
    content = f"index {index} holds {entry.version_label} {entry.address}"
    problem = None
    if entry.is_link_local:
        problem = LINK_LOCAL
    elif entry.roce_version is not None and entry.roce_version != settings.roce_version:
        problem = WRONG_ROCE_VERSION
    elif not _in_range(entry.gid, settings):
        problem = OUT_OF_RANGE
    return NcclPick(index, configured, problem, content)
