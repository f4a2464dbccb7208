"""NCCL's GID settings, the index it would auto-select on a port (`ncclIbGetGidIndex`), and
whether the GID it would use can carry cross-node traffic.

Pure: the settings come read from the environment and the config file as NCCL reads them
(`config/nccl_env.py`).

Modelled on NCCL 2.26 and later (identical from 2.26.2 to master). 2.21-2.25 differ: 2.21 and
2.22 crash on an NCCL_IB_ADDR_RANGE without `/`, 2.21 has no FLID rule for InfiniBand, and 2.23-2.25
fail (instead of skipping a slot) when a GID type file answers EINVAL, as in some containers.

NCCL starts at index 0 and walks 1..len-1, replacing its pick
when (a) the candidate's address family differs from the pick's, equals the wanted family and is in
`NCCL_IB_ADDR_RANGE`; or (b) the candidate has the wanted family, is a configured non-link-local
GID in range, its RoCE version is the wanted one, and differs from the pick's (or the pick is not
valid). On a normal host that is the lowest-index IPv4 `RoCE v2` GID. InfiniBand ports use
`NCCL_IB_ROUTABLE_FLID_GID_INDEX` (default 1) when that GID carries a FLID, else 0; a negative
one makes NCCL fail (it queries that slot).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from rnic_exporter.model.host import ZERO_GID, Device, GidEntry, Port

AF_INET = socket.AF_INET
AF_INET6 = socket.AF_INET6
_FAMILY_NAMES: dict[int, str] = {int(AF_INET): "AF_INET", int(AF_INET6): "AF_INET6"}


@dataclass(frozen=True, slots=True)
class AddrRange:
    """NCCL_IB_ADDR_RANGE as NCCL parsed it: a base address of the wanted family and a prefix length
    (a negative one, from `/-8`, matches nothing: NCCL's matcher then never reaches length 0)."""

    text: str
    base: bytes  # 4 bytes (AF_INET) or 16 (AF_INET6)
    prefixlen: int

    def __str__(self) -> str:
        return self.text

    def matches(self, raw_gid: bytes) -> bool:
        """matchGidAddrPrefix: IPv4 compares the GID's last 32 bits, IPv6 the GID word by word."""
        prefixlen = self.prefixlen
        if len(self.base) == 4:
            if prefixlen <= 0:
                return prefixlen == 0
            mask = (0xFFFFFFFF ^ ((1 << (32 - prefixlen)) - 1)) & 0xFFFFFFFF
            return (int.from_bytes(self.base, "big") ^ int.from_bytes(raw_gid[12:], "big")) & mask == 0
        word = 0
        while prefixlen > 0 and word < 4:
            ours = int.from_bytes(self.base[4 * word : 4 * word + 4], "big")
            theirs = int.from_bytes(raw_gid[4 * word : 4 * word + 4], "big")
            bits = min(prefixlen, 32)
            mask = (0xFFFFFFFF ^ ((1 << (32 - bits)) - 1)) & 0xFFFFFFFF
            if (ours ^ theirs) & mask:
                break
            prefixlen -= bits
            word += 1
        return prefixlen == 0


@dataclass(frozen=True, slots=True)
class NcclSettings:
    """NCCL's GID-selection environment, as `config.nccl_env.nccl_settings` reads it the way NCCL does."""

    address_family: int = AF_INET  # NCCL_IB_ADDR_FAMILY
    address_range: AddrRange | None = None  # NCCL_IB_ADDR_RANGE
    roce_version: int = 2  # NCCL_IB_ROCE_VERSION_NUM
    routable_flid_gid_index: int = 1  # NCCL_IB_ROUTABLE_FLID_GID_INDEX
    # Whether the operator said which family the fabric routes (NCCL_IB_ADDR_FAMILY exactly AF_INET or
    # AF_INET6, from the environment, the config's `[nccl] ib_addr_family` or NCCL's files, or a range
    # NCCL parsed; a misspelt family is only a note, not a statement to fail a pin on):
    # a pinned index of the other family is then wrong, not merely different from NCCL's own pick.
    family_stated: bool = field(default=False, compare=False)
    # How NCCL reads values that do not say plainly what NCCL does with them (check prints them).
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def family_name(self) -> str:
        return _FAMILY_NAMES.get(self.address_family, str(self.address_family))

    @property
    def wanted_gid(self) -> str:
        """The GID these settings make NCCL use, for messages: 'RoCE v2 IPv4 GID' at the defaults."""
        family = "IPv4" if self.address_family == AF_INET else "routable IPv6"
        return f"RoCE v{self.roce_version} {family} GID"


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
    return True if net is None else net.matches(_raw(gid))


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
        if settings.routable_flid_gid_index < 0:  # NCCL queries that slot, and ibv_query_gid fails
            return None
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


# Which NCCL the judgement models and what a GID change does to a running job on each (check prints
# it where it judged a RoCE port; docs/check.md#nccl-versions has the long form). NCCL picks the
# index when a connection is set up: an established connection keeps it.
VERSIONS_NOTE = (
    "NCCL: the GID judged is the one NCCL 2.26 to 2.31 would use now; a GID change under a running job: "
    "up to 2.30 its connections keep the old index (the job fails or hangs), 2.31 re-reads the GID for new "
    "connections only (on dual-port HCAs not yet: NVIDIA/nccl#2400), opt-in port failover (2.29+) moves "
    "traffic only between fused NICs (docs/check.md#nccl-versions)"
)


# Why the GID NCCL would use cannot carry cross-node traffic (the `reason` of check's problem and
# of the rnic.nccl.gid_unusable event).
LINK_LOCAL = "link_local"  # fe80::/64: not routable; what NCCL keeps when the port has no IPv4 GID
WRONG_ROCE_VERSION = "wrong_roce_version"  # e.g. only a RoCE v1 GID where NCCL_IB_ROCE_VERSION_NUM=2
OUT_OF_RANGE = "out_of_range"  # the GID's address is outside NCCL_IB_ADDR_RANGE
WRONG_FAMILY = "wrong_family"  # a pinned GID of another family than the operator stated
NO_GID = "no_gid"  # the slot is empty, or there is no index NCCL could pick

PICK_PROBLEMS: Mapping[str, str] = MappingProxyType(
    {
        LINK_LOCAL: "a link-local GID, which is not routable between nodes",
        WRONG_ROCE_VERSION: "a GID of another RoCE version than NCCL_IB_ROCE_VERSION_NUM asks for",
        OUT_OF_RANGE: "a GID outside NCCL_IB_ADDR_RANGE",
        WRONG_FAMILY: "a GID of another address family than NCCL_IB_ADDR_FAMILY / NCCL_IB_ADDR_RANGE state",
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
    # A usable pin whose family differs from the GID NCCL's own choice would use on this port, where
    # nobody stated the family: what NCCL would pick instead ("index 3 holds v2 10.0.0.1"). A warning:
    # it works only if the fabric routes that family.
    differs_from_auto: str | None = None

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
    """What NCCL would use on a RoCE port whose GID table was read, judged against `settings`.

    A pinned index is used as it is: NCCL does not look at NCCL_IB_ADDR_FAMILY for it. But the family
    says what the fabric routes: where the operator stated it (`NcclSettings.family_stated`) a pin of
    the other family is unusable (WRONG_FAMILY); where nobody did, a pin whose family differs from
    NCCL's own choice on the port is usable with `differs_from_auto` set (check warns). A pin is also
    judged against NCCL_IB_ADDR_RANGE."""
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
    elif configured and settings.family_stated and gid_family(entry.gid) != settings.address_family:
        problem = WRONG_FAMILY
    elif not _in_range(entry.gid, settings):
        problem = OUT_OF_RANGE
    differs = None
    if configured and problem is None and not settings.family_stated and port.nccl_gid_index is not None:
        auto = port.gid(port.nccl_gid_index)
        if auto is not None and auto.index != index and gid_family(auto.gid) != gid_family(entry.gid):
            differs = f"index {auto.index} holds {auto.version_label} {auto.address}"
    return NcclPick(index, configured, problem, content, differs)
