"""The GID index NCCL would auto-select, against NCCL's own algorithm (facts §3, ncclIbGetGidIndex).

Each row is a GID table as sysfs shows it (populated slots only: every other slot reads as the zero
GID with a type that answers EINVAL) and the environment NCCL would run with.
"""

from __future__ import annotations

import ipaddress
import socket

import pytest

from rnic_exporter.errors import ConfigError
from rnic_exporter.model.host import ROCE_V1, ROCE_V2, GidEntry
from rnic_exporter.model.nccl import NcclSettings, select_gid_index

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
    assert select_gid_index(gids, SIZE, "Ethernet", NcclSettings.from_env(env)) == want


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
    assert select_gid_index(gids, size, "InfiniBand", NcclSettings.from_env(env)) == want


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
            NcclSettings(address_range=ipaddress.IPv4Network("10.1.0.0/16")),
            id="range",
        ),
        pytest.param(
            {"NCCL_IB_ADDR_RANGE": " 10.1.2.3/16 "},
            NcclSettings(address_range=ipaddress.IPv4Network("10.1.0.0/16")),
            id="range-host-bits",
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
    assert NcclSettings.from_env(env) == want


def test_settings_from_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_IB_ADDR_FAMILY", "AF_INET6")
    monkeypatch.setenv("NCCL_IB_ROCE_VERSION_NUM", "1")
    monkeypatch.delenv("NCCL_IB_ADDR_RANGE", raising=False)
    monkeypatch.delenv("NCCL_IB_ROUTABLE_FLID_GID_INDEX", raising=False)
    assert NcclSettings.from_env() == NcclSettings(address_family=socket.AF_INET6, roce_version=1)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("NCCL_IB_ADDR_FAMILY", "AF_UNIX"),
        ("NCCL_IB_ADDR_FAMILY", "inet"),
        ("NCCL_IB_ADDR_RANGE", "10.0.0.0/33"),
        ("NCCL_IB_ADDR_RANGE", "10.0.0/8x"),
        ("NCCL_IB_ADDR_RANGE", "not-an-address/8"),
        ("NCCL_IB_ROCE_VERSION_NUM", "two"),
        ("NCCL_IB_ROCE_VERSION_NUM", "2.0"),
        ("NCCL_IB_ROUTABLE_FLID_GID_INDEX", "first"),
    ],
)
def test_settings_reject_bad_values(variable: str, value: str) -> None:
    with pytest.raises(ConfigError, match=variable) as info:
        NcclSettings.from_env({variable: value})
    assert repr(value) in str(info.value)
