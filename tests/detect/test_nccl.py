"""The GID index NCCL would auto-select, against NCCL's own algorithm (facts §3, ncclIbGetGidIndex).

Each row is a GID table as sysfs shows it (populated slots only: every other slot reads as the zero
GID with a type that answers EINVAL) and the environment NCCL would run with.
"""

from __future__ import annotations

import ipaddress
import socket

import pytest

from rnic_exporter.config.nccl_env import gid_index_from_env, nccl_param, nccl_settings
from rnic_exporter.model.host import ROCE_V1, ROCE_V2, GidEntry
from rnic_exporter.model.nccl import AddrRange, NcclSettings, select_gid_index

NETDEV = "ens1f0np0"
DEFAULT_GID = "fe80:0000:0000:0000:0e42:a1ff:fe41:2d36"  # EUI-64 of the MAC: the reserved slots 0/1
PRIVACY_LL = "fe80:0000:0000:0000:5c1d:77ff:3a2b:9e41"  # stable-privacy link-local: its own pair
IPV6_GLOBAL = "2001:0db8:0000:0000:0000:0000:0000:0001"
IB_PORT_GID = "fe80:0000:0000:0000:0c42:a103:0065:c7a9"  # subnet prefix + port GUID, FLID 0
IB_FLID_GID = "fec0:0000:0013:0005:0c42:a103:0065:c7a9"  # FLID 0x0013 in bytes 4-5


def v4(address: str) -> str:
    """The IPv4-mapped GID of an address, as the kernel prints it."""
    return ipaddress.IPv6Address(f"::ffff:{address}").exploded


def pair(first: int, gid: str) -> list[GidEntry]:
    """A v1 GID at `first` and its v2 twin right after it, as roce_gid_mgmt adds an address."""
    return [GidEntry(first, gid, ROCE_V1, NETDEV), GidEntry(first + 1, gid, ROCE_V2, NETDEV)]


DEFAULTS = pair(0, DEFAULT_GID)
NORMAL = DEFAULTS + pair(2, v4("10.0.0.1"))
SIZE = 16


@pytest.mark.parametrize(
    ("gids", "env", "want"),
    [
        pytest.param(NORMAL, {}, 3, id="defaults-then-ipv4-pair-picks-3"),
        pytest.param(
            DEFAULTS + pair(2, PRIVACY_LL) + pair(4, v4("10.0.0.1")), {}, 5, id="link-local-first-moves-ipv4-to-4-5"
        ),
        pytest.param([*DEFAULTS, GidEntry(2, v4("10.0.0.1"), ROCE_V1, NETDEV)], {}, 2, id="only-v1-ipv4-is-picked"),
        pytest.param(DEFAULTS, {}, 0, id="no-ipv4-stays-at-0"),
        pytest.param(DEFAULTS + pair(2, PRIVACY_LL), {}, 0, id="only-link-local-stays-at-0"),
        pytest.param(
            NORMAL + pair(4, IPV6_GLOBAL), {"NCCL_IB_ADDR_FAMILY": "AF_INET6"}, 5, id="af-inet6-picks-the-global-v2"
        ),
        pytest.param(
            NORMAL + pair(4, v4("10.1.0.1")),
            {"NCCL_IB_ADDR_RANGE": "10.1.0.0/16"},
            5,
            id="range-skips-first-ipv4-takes-second",
        ),
        pytest.param(
            NORMAL + pair(4, v4("10.1.0.1")), {"NCCL_IB_ADDR_RANGE": "10.0.0.0/16"}, 3, id="range-includes-first-ipv4"
        ),
        pytest.param(
            NORMAL + pair(4, v4("10.1.0.1")), {"NCCL_IB_ADDR_RANGE": "10.1.7.7/16"}, 5, id="range-host-bits-are-masked"
        ),
        pytest.param(NORMAL, {"NCCL_IB_ADDR_RANGE": "192.168.0.0/16"}, 0, id="range-matching-nothing-stays-at-0"),
        pytest.param(NORMAL, {"NCCL_IB_ADDR_RANGE": "10.1.0.0"}, 3, id="range-without-prefix-length-is-ignored"),
        pytest.param(
            NORMAL + pair(4, IPV6_GLOBAL) + pair(6, "2001:0db9:0000:0000:0000:0000:0000:0001"),
            {"NCCL_IB_ADDR_FAMILY": "AF_INET6", "NCCL_IB_ADDR_RANGE": "2001:db9::/32"},
            7,
            id="ipv6-range",
        ),
        # envIbAddrRange: inet_pton(family, address) fails for an address of the other family, and NCCL
        # then ignores the range ("Ip address ... is invalid for family AF_INET, ignoring address").
        pytest.param(NORMAL, {"NCCL_IB_ADDR_RANGE": "fd00::/8"}, 3, id="ipv6-range-under-af-inet-is-ignored"),
        pytest.param(
            NORMAL + pair(4, IPV6_GLOBAL),
            {"NCCL_IB_ADDR_FAMILY": "AF_INET6", "NCCL_IB_ADDR_RANGE": "10.0.0.0/8"},
            5,
            id="ipv4-range-under-af-inet6-is-ignored",
        ),
        pytest.param(NORMAL, {"NCCL_IB_ROCE_VERSION_NUM": "1"}, 2, id="roce-version-1"),
        pytest.param(
            NORMAL + pair(4, v4("10.1.0.1")),
            {"NCCL_IB_ROCE_VERSION_NUM": "1"},
            2,
            id="roce-version-1-keeps-the-first-v1",
        ),
        pytest.param(
            [*DEFAULTS, GidEntry(2, v4("10.0.0.1"), ROCE_V1, NETDEV), GidEntry(4, v4("10.0.0.1"), ROCE_V2, NETDEV)],
            {},
            4,
            id="gid-shift-v1-at-2-pending-3-v2-at-4",
        ),
        pytest.param([GidEntry(3, v4("10.0.0.1"), ROCE_V2, NETDEV)], {}, 3, id="only-a-v2-ipv4"),
        pytest.param([], {}, 0, id="all-slots-empty-stays-at-0"),
    ],
)
def test_select_gid_index_roce(gids: list[GidEntry], env: dict[str, str], want: int) -> None:
    assert select_gid_index(gids, SIZE, "Ethernet", nccl_settings(env)) == want


@pytest.mark.parametrize(
    ("gids", "size", "env", "want"),
    [
        pytest.param([GidEntry(0, IB_PORT_GID, ROCE_V1, None)], 128, {}, 0, id="port-gid-only"),
        pytest.param(
            [GidEntry(0, IB_PORT_GID, ROCE_V1, None), GidEntry(1, IB_FLID_GID, ROCE_V1, None)],
            128,
            {},
            1,
            id="routable-flid-at-1",
        ),
        pytest.param(
            [GidEntry(0, IB_PORT_GID, ROCE_V1, None), GidEntry(1, IB_PORT_GID, ROCE_V1, None)],
            128,
            {},
            0,
            id="zero-flid-at-1",
        ),
        pytest.param(
            [GidEntry(0, IB_PORT_GID, ROCE_V1, None), GidEntry(2, IB_FLID_GID, ROCE_V1, None)],
            128,
            {"NCCL_IB_ROUTABLE_FLID_GID_INDEX": "2"},
            2,
            id="routable-index-from-env",
        ),
        pytest.param(
            [GidEntry(0, IB_PORT_GID, ROCE_V1, None), *pair(2, v4("10.0.0.1"))],
            128,
            {},
            0,
            id="ipv4-gids-do-not-matter-on-ib",
        ),
    ],
)
def test_select_gid_index_infiniband(gids: list[GidEntry], size: int, env: dict[str, str], want: int) -> None:
    assert select_gid_index(gids, size, "InfiniBand", nccl_settings(env)) == want


@pytest.mark.parametrize("link_layer", ["Ethernet", "InfiniBand", None])
def test_select_gid_index_without_a_table(link_layer: str | None) -> None:
    assert select_gid_index([], 0, link_layer) is None


@pytest.mark.parametrize(
    ("env", "want"),
    [
        pytest.param({}, NcclSettings(socket.AF_INET, None, 2, 1), id="defaults"),
        pytest.param({"NCCL_IB_ADDR_FAMILY": "AF_INET6"}, NcclSettings(address_family=socket.AF_INET6), id="af-inet6"),
        pytest.param({"NCCL_IB_ADDR_FAMILY": "AF_INET"}, NcclSettings(), id="af-inet"),
        pytest.param({"NCCL_IB_ADDR_FAMILY": ""}, NcclSettings(), id="empty-family-is-unset"),
        pytest.param(
            {"NCCL_IB_ADDR_RANGE": "10.1.0.0/16"},
            NcclSettings(address_range=AddrRange("10.1.0.0/16", bytes([10, 1, 0, 0]), 16)),
            id="range",
        ),
        pytest.param(
            {"NCCL_IB_ADDR_RANGE": " 10.1.2.3/16 "}, NcclSettings(), id="range-with-spaces-is-ignored-by-inet-pton"
        ),
        pytest.param({"NCCL_IB_ADDR_RANGE": "10.1.0.0"}, NcclSettings(), id="range-without-slash-ignored"),
        pytest.param({"NCCL_IB_ADDR_RANGE": ""}, NcclSettings(), id="empty-range"),
        pytest.param({"NCCL_IB_ROCE_VERSION_NUM": "1"}, NcclSettings(roce_version=1), id="roce-version"),
        pytest.param({"NCCL_IB_ROCE_VERSION_NUM": ""}, NcclSettings(), id="empty-roce-version"),
        pytest.param(
            {"NCCL_IB_ROUTABLE_FLID_GID_INDEX": "3"}, NcclSettings(routable_flid_gid_index=3), id="routable-flid-index"
        ),
    ],
)
def test_settings_from_env(env: dict[str, str], want: NcclSettings) -> None:
    assert nccl_settings(env) == want


def test_settings_from_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_IB_ADDR_FAMILY", "AF_INET6")
    monkeypatch.setenv("NCCL_IB_ROCE_VERSION_NUM", "1")
    monkeypatch.delenv("NCCL_IB_ADDR_RANGE", raising=False)
    monkeypatch.delenv("NCCL_IB_ROUTABLE_FLID_GID_INDEX", raising=False)
    assert nccl_settings() == NcclSettings(address_family=socket.AF_INET6, roce_version=1)


# Each row as NCCL master's ncclLoadParam / envIbAddrFamily / envIbAddrRange read it (checked by
# compiling those functions against these values): never refused, read as NCCL reads it.
@pytest.mark.parametrize(
    ("env", "want", "note"),
    [
        ({"NCCL_IB_ADDR_FAMILY": "AF_UNIX"}, NcclSettings(), "NCCL uses AF_INET"),
        ({"NCCL_IB_ADDR_FAMILY": "af_inet6"}, NcclSettings(), "NCCL uses AF_INET"),
        ({"NCCL_IB_ADDR_FAMILY": "AF_INET6 "}, NcclSettings(), "NCCL uses AF_INET"),
        ({"NCCL_IB_ADDR_RANGE": "10.0.0.0/33"}, NcclSettings(), "too long for AF_INET"),
        ({"NCCL_IB_ADDR_RANGE": "10.0.0/8x"}, NcclSettings(), "not an AF_INET address"),
        ({"NCCL_IB_ADDR_RANGE": "not-an-address/8"}, NcclSettings(), "not an AF_INET address"),
        ({"NCCL_IB_ADDR_RANGE": "10.0.0.0"}, NcclSettings(), "has no '/'"),
        (
            {"NCCL_IB_ADDR_RANGE": "10.0.0.0/8x"},
            NcclSettings(address_range=AddrRange("10.0.0.0/8x", bytes([10, 0, 0, 0]), 8)),
            "reads the prefix length as 8",
        ),
        (
            {"NCCL_IB_ADDR_RANGE": "10.0.0.0/4294967304"},  # (int)strtol: wraps to 8
            NcclSettings(address_range=AddrRange("10.0.0.0/4294967304", bytes([10, 0, 0, 0]), 8)),
            "reads the prefix length as 8",
        ),
        (
            {"NCCL_IB_ADDR_RANGE": "10.0.0.0/-1"},
            NcclSettings(address_range=AddrRange("10.0.0.0/-1", bytes([10, 0, 0, 0]), -1)),
            "find no GID in range",
        ),
        ({"NCCL_IB_ROCE_VERSION_NUM": "two"}, NcclSettings(roce_version=0), "reads as 0"),
        ({"NCCL_IB_ROCE_VERSION_NUM": "2.0"}, NcclSettings(), "reads as 2"),
        ({"NCCL_IB_ROCE_VERSION_NUM": "0x2"}, NcclSettings(), "reads as 2"),
        ({"NCCL_IB_ROCE_VERSION_NUM": "4294967297"}, NcclSettings(roce_version=1), "wraps to a C int as 1"),
        ({"NCCL_IB_ROCE_VERSION_NUM": "99999999999999999999"}, NcclSettings(), "uses its default, 2"),
        ({"NCCL_IB_ROUTABLE_FLID_GID_INDEX": "first"}, NcclSettings(routable_flid_gid_index=0), "reads as 0"),
        ({"NCCL_IB_ROUTABLE_FLID_GID_INDEX": "-1"}, NcclSettings(routable_flid_gid_index=-1), None),
        ({"NCCL_IB_GID_INDEX": "010"}, NcclSettings(), "NCCL_IB_GID_INDEX='010': NCCL reads as 8"),
    ],
)
def test_settings_are_read_as_nccl_reads_them(env: dict[str, str], want: NcclSettings, note: str | None) -> None:
    settings = nccl_settings(env)
    assert settings == want
    assert (note is None and not settings.notes) or any(note in n for n in settings.notes if note), settings.notes


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("3", 3),
        ("010", 8),
        ("0x3", 3),
        ("0X1f", 31),
        ("08", 0),
        ("0x", 0),
        (" +3", 3),
        ("-0x1", -1),
        ("3abc", 3),
        ("three", 0),
        (" ", 0),
        ("-2", -2),
        ("4294967298", 2),  # an int64 cut to NCCL's int
        ("2147483648", -(1 << 31)),
        ("99999999999999999999", -1),  # ERANGE: the default
        ("-99999999999999999999", -1),
    ],
)
def test_integers_are_read_with_strtoll_base_0_then_cut_to_int(raw: str, want: int) -> None:
    assert nccl_param({"NCCL_IB_GID_INDEX": raw}, "NCCL_IB_GID_INDEX")[0] == want
    assert gid_index_from_env({"NCCL_IB_GID_INDEX": raw}) == want


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({"NCCL_IB_ROUTABLE_FLID_GID_INDEX": "-1"}, None),  # NCCL queries slot -1 and fails
        ({"NCCL_IB_ROUTABLE_FLID_GID_INDEX": "4294967295"}, None),  # the same -1 once cut to int
        ({"NCCL_IB_ROUTABLE_FLID_GID_INDEX": "0x1"}, 1),
        ({"NCCL_IB_ROUTABLE_FLID_GID_INDEX": "99"}, 0),  # beyond the table: index 0
    ],
)
def test_infiniband_flid_index_as_nccl_uses_it(env: dict[str, str], want: int | None) -> None:
    gids = [GidEntry(0, IB_PORT_GID, None, None), GidEntry(1, IB_FLID_GID, None, None)]
    assert select_gid_index(gids, 4, "InfiniBand", nccl_settings(env)) == want


@pytest.mark.parametrize(
    ("range_text", "gid", "inside"),
    [
        ("10.1.0.0/16", v4("10.1.200.3"), True),
        ("10.1.0.0/16", v4("10.2.0.3"), False),
        ("10.1.2.3/0", v4("192.168.0.1"), True),
        ("10.1.0.0/-1", v4("10.1.0.1"), False),  # a negative length: NCCL's matcher never reaches 0
        ("10.1.0.0/32", v4("10.1.0.0"), True),
    ],
)
def test_range_matches_as_nccl_matches(range_text: str, gid: str, inside: bool) -> None:
    settings = nccl_settings({"NCCL_IB_ADDR_RANGE": range_text})
    assert settings.address_range is not None
    assert settings.address_range.matches(bytes.fromhex(gid.replace(":", ""))) is inside
