"""Table tests of every sysfs value parser and of the model's derived properties.

Inputs are the kernel's formats (reference/rnic-linux-facts.md §1-§5) and the quirks of real captures.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rnic_exporter.model.host import (
    GidEntry,
    LinkRate,
    Netdev,
    NumberedState,
    PcieLink,
    Port,
    pcie_generation,
)
from rnic_exporter.sources.gids import parse_gid, parse_gid_type, parse_netdev_name
from rnic_exporter.sources.infiniband import (
    parse_counter,
    parse_guid,
    parse_lid,
    parse_link_layer,
    parse_numbered_state,
    parse_rate,
    parse_string,
)
from rnic_exporter.sources.netclass import parse_bool01, parse_int, parse_mac, parse_operstate
from rnic_exporter.sources.pci import parse_link_speed, parse_link_width
from rnic_exporter.sources.sysfs import MalformedValueError, SysfsRoot

# -- port rate (§1.3) ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("2.5 Gb/sec (1X SDR)", LinkRate(2.5, 1, "SDR")),
        ("10 Gb/sec (4X SDR)", LinkRate(10.0, 4, "SDR")),
        pytest.param("10 Gb/sec (4X)", LinkRate(10.0, 4, "SDR"), id="old-kernel-sdr-without-name"),
        ("40 Gb/sec (4X QDR)", LinkRate(40.0, 4, "QDR")),
        ("40 Gb/sec (4X FDR10)", LinkRate(40.0, 4, "FDR10")),
        ("56 Gb/sec (4X FDR)", LinkRate(56.0, 4, "FDR")),
        ("25 Gb/sec (1X EDR)", LinkRate(25.0, 1, "EDR")),
        ("100 Gb/sec (4X EDR)", LinkRate(100.0, 4, "EDR")),
        pytest.param("100 Gb/sec (2X HDR)", LinkRate(100.0, 2, "HDR"), id="hdr100-split-port"),
        ("200 Gb/sec (4X HDR)", LinkRate(200.0, 4, "HDR")),
        ("400 Gb/sec (4X NDR)", LinkRate(400.0, 4, "NDR")),
        ("800 Gb/sec (8X NDR)", LinkRate(800.0, 8, "NDR")),
        ("800 Gb/sec (4X XDR)", LinkRate(800.0, 4, "XDR")),
        ("1600 Gb/sec (8X XDR)", LinkRate(1600.0, 8, "XDR")),
        ("300 Gb/sec (12X EDR)", LinkRate(300.0, 12, "EDR")),
        pytest.param("100 Gb/sec (4X EDR)\n", LinkRate(100.0, 4, "EDR"), id="trailing-newline"),
    ],
)
def test_parse_rate(text: str, want: LinkRate) -> None:
    assert parse_rate(text) == want


@pytest.mark.parametrize(
    "text",
    [
        "garbage",
        "",
        "N/A",
        pytest.param("40 Gb/sec (3X QDR)", id="3-lanes"),
        pytest.param("0 Gb/sec (0X QDR)", id="0-lanes"),
        pytest.param("40 Gb/sec (4x QDR)", id="lowercase-x"),
        pytest.param("2.7 Gb/sec (1X SDR)", id="tenths-other-than-5"),
        pytest.param("40 Gb/s (4X QDR)", id="Gb/s-not-Gb/sec"),
        pytest.param("40 Gb/sec", id="no-width"),
        pytest.param("-40 Gb/sec (4X QDR)", id="negative"),
    ],
)
def test_parse_rate_rejects(text: str) -> None:
    with pytest.raises(MalformedValueError):
        parse_rate(text)


@pytest.mark.parametrize(
    ("rate", "bytes_per_second", "per_lane_gbps"),
    [
        (LinkRate(2.5, 1, "SDR"), 312_500_000.0, 2.5),
        (LinkRate(100.0, 2, "HDR"), 12_500_000_000.0, 50.0),
        (LinkRate(400.0, 4, "NDR"), 50_000_000_000.0, 100.0),
        (LinkRate(1600.0, 8, "XDR"), 200_000_000_000.0, 200.0),
    ],
)
def test_link_rate_units(rate: LinkRate, bytes_per_second: float, per_lane_gbps: float) -> None:
    assert rate.bytes_per_second == bytes_per_second
    assert rate.bits_per_second == bytes_per_second * 8
    assert rate.per_lane_gbps == per_lane_gbps


# -- "<n>: <name>" values: state, phys_state, node_type (§1.1, §1.2) ---------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("0: NOP", NumberedState(0, "NOP")),
        ("1: DOWN", NumberedState(1, "DOWN")),
        ("4: ACTIVE", NumberedState(4, "ACTIVE")),
        ("5: ACTIVE_DEFER", NumberedState(5, "ACTIVE_DEFER")),
        ("5: LinkUp", NumberedState(5, "LinkUp")),
        pytest.param("7: Phy Test", NumberedState(7, "Phy Test"), id="name-with-space"),
        pytest.param("0: <unknown>", NumberedState(0, "<unknown>"), id="phys-state-0-unknown"),
        pytest.param("9: UNKNOWN", NumberedState(9, "UNKNOWN"), id="state-out-of-range"),
        pytest.param("1: CA", NumberedState(1, "CA"), id="node-type"),
        pytest.param("4: ACTIVE\n", NumberedState(4, "ACTIVE"), id="trailing-newline"),
    ],
)
def test_parse_numbered_state(text: str, want: NumberedState) -> None:
    state = parse_numbered_state(text)
    assert state == want
    assert str(state) == text.strip()


@pytest.mark.parametrize("text", ["", "ACTIVE", "4 ACTIVE", "4:", "x: ACTIVE", "-1: DOWN"])
def test_parse_numbered_state_rejects(text: str) -> None:
    with pytest.raises(MalformedValueError):
        parse_numbered_state(text)


# -- GUIDs, LIDs, link layer, free text ------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("0c42:a103:0065:c7a8\n", "0c42:a103:0065:c7a8"),
        pytest.param("0a7f:bc12:45ef:d23b", "0a7f:bc12:45ef:d23b", id="no-newline-as-in-capture"),
    ],
)
def test_parse_guid(text: str, want: str) -> None:
    assert parse_guid(text) == want


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0c42a1030065c7a8",
        "0c42:a103:0065",
        "0c42:a103:0065:c7a8:0000",
        "zzzz:a103:0065:c7a8",
        "c42:a103:65:c7a8",
    ],
)
def test_parse_guid_rejects(text: str) -> None:
    with pytest.raises(MalformedValueError):
        parse_guid(text)


@pytest.mark.parametrize(("text", "want"), [("0x0", 0), ("0x1a", 26), ("0xffff", 65535), ("0x1a\n", 26)])
def test_parse_lid(text: str, want: int) -> None:
    assert parse_lid(text) == want


@pytest.mark.parametrize("text", ["", "26", "0x", "0xzz", "lid"])
def test_parse_lid_rejects(text: str) -> None:
    with pytest.raises(MalformedValueError):
        parse_lid(text)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("InfiniBand", "InfiniBand"),
        ("Ethernet", "Ethernet"),
        ("Unknown", "Unknown"),
        # mlx4_0 port 2 of the capture holds "InfiniBand\n\n"; SysfsRoot strips one newline.
        pytest.param("InfiniBand\n", "InfiniBand", id="extra-blank-line"),
    ],
)
def test_parse_link_layer(text: str, want: str) -> None:
    assert parse_link_layer(text) == want


@pytest.mark.parametrize("text", ["", "\n", "Infini Band"])
def test_parse_link_layer_rejects(text: str) -> None:
    with pytest.raises(MalformedValueError):
        parse_link_layer(text)


def test_link_layer_with_blank_line_read_from_capture(fixture_sys: Path) -> None:
    rel = "class/infiniband/mlx4_0/ports/2/link_layer"
    assert (fixture_sys / rel).read_bytes() == b"InfiniBand\n\n"  # the quirk this test is about
    assert parse_link_layer(SysfsRoot(fixture_sys).read_text(rel)) == "InfiniBand"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("28.39.2048", "28.39.2048"),
        (
            "HPE 100Gb 1-port OP101 QSFP28 x16 PCIe Gen3 with Intel Omni-Path Adapter\n",
            "HPE 100Gb 1-port OP101 QSFP28 x16 PCIe Gen3 with Intel Omni-Path Adapter",
        ),
    ],
)
def test_parse_string(text: str, want: str) -> None:
    assert parse_string(text) == want


def test_parse_string_rejects_empty() -> None:
    with pytest.raises(MalformedValueError):
        parse_string("\n")


# -- counters (§1.5, §1.6) -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("0", 0),
        ("2880761508848", 2880761508848),
        ("18446744073709551615", 2**64 - 1),
        ("42\n", 42),
    ],
)
def test_parse_counter(text: str, want: int) -> None:
    assert parse_counter(text) == want


@pytest.mark.parametrize(
    ("text", "match"),
    [
        pytest.param("N/A (no PMA)", "PMA", id="old-kernel-mad-failure"),
        pytest.param("-1", "decimal", id="negative"),
        pytest.param("0x10", "decimal", id="hex"),
        pytest.param("", "decimal", id="empty"),
        pytest.param("1.5", "decimal", id="fraction"),
        pytest.param("1e3", "decimal", id="exponent"),
    ],
)
def test_parse_counter_rejects(text: str, match: str) -> None:
    with pytest.raises(MalformedValueError, match=match):
        parse_counter(text)


# -- GID table (§1.4) ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "fe80:0000:0000:0000:0e42:a1ff:fe41:2d36",
        "0000:0000:0000:0000:0000:ffff:c0a8:0164",
        "0000:0000:0000:0000:0000:0000:0000:0000",
    ],
)
def test_parse_gid(text: str) -> None:
    assert parse_gid(text + "\n") == text


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("fe80::e42:a1ff:fe41:2d36", id="compressed"),
        pytest.param("::ffff:192.168.1.100", id="compressed-dotted"),
        pytest.param("::", id="compressed-zero"),
        pytest.param("FE80:0000:0000:0000:0E42:A1FF:FE41:2D36", id="uppercase"),
        pytest.param("fe80:0000:0000:0000:0e42:a1ff:fe41", id="seven-groups"),
        pytest.param("fe80:0000:0000:0000:0e42:a1ff:fe41:2d3", id="short-group"),
        pytest.param("", id="empty"),
    ],
)
def test_parse_gid_rejects(text: str) -> None:
    with pytest.raises(MalformedValueError):
        parse_gid(text)


@pytest.mark.parametrize(
    ("parse", "text", "want"),
    [
        (parse_gid_type, "IB/RoCE v1", "IB/RoCE v1"),
        (parse_gid_type, "RoCE v2\n", "RoCE v2"),
        pytest.param(parse_gid_type, "", None, id="type-empty-file-stands-for-EINVAL"),
        (parse_netdev_name, "ens1f0np0", "ens1f0np0"),
        (parse_netdev_name, "ens1f0np0.100\n", "ens1f0np0.100"),
        pytest.param(parse_netdev_name, "", None, id="ndev-empty-file-stands-for-EINVAL"),
    ],
)
def test_parse_gid_attrs(parse: Callable[[str], str | None], text: str, want: str | None) -> None:
    assert parse(text) == want


@pytest.mark.parametrize("text", ["bond 0", "../eth0"])
def test_parse_netdev_name_rejects(text: str) -> None:
    with pytest.raises(MalformedValueError):
        parse_netdev_name(text)


# -- PCIe link (§4) --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("2.5 GT/s PCIe", 2.5),
        ("5.0 GT/s PCIe", 5.0),
        ("8.0 GT/s PCIe", 8.0),
        ("16.0 GT/s PCIe", 16.0),
        ("32.0 GT/s PCIe", 32.0),
        ("64.0 GT/s PCIe", 64.0),
        pytest.param("2.5 GT/s", 2.5, id="old-2.5"),
        pytest.param("5 GT/s", 5.0, id="old-5"),
        pytest.param("16 GT/s", 16.0, id="old-16"),
        pytest.param("Unknown", None, id="unknown"),
        pytest.param("Unknown speed", None, id="old-unknown"),
        pytest.param("32.0 GT/s PCIe\n", 32.0, id="trailing-newline"),
    ],
)
def test_parse_link_speed(text: str, want: float | None) -> None:
    assert parse_link_speed(text) == want


@pytest.mark.parametrize("text", ["", "16", "16.0 Gb/s", "fast", "16.0 GT/s PCIe Gen4", "x GT/s"])
def test_parse_link_speed_rejects(text: str) -> None:
    with pytest.raises(MalformedValueError):
        parse_link_speed(text)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("16", 16),
        ("8", 8),
        ("1", 1),
        ("16\n", 16),
        pytest.param("0", None, id="vf-reads-zero"),
        pytest.param("63", None, id="all-ones-config-read"),
    ],
)
def test_parse_link_width(text: str, want: int | None) -> None:
    assert parse_link_width(text) == want


@pytest.mark.parametrize("text", ["", "x16", "-1", "16 lanes"])
def test_parse_link_width_rejects(text: str) -> None:
    with pytest.raises(MalformedValueError):
        parse_link_width(text)


# -- netdev (§5) -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("100000", 100000),
        ("400000\n", 400000),
        ("0", 0),
        pytest.param("-1", -1, id="speed-without-carrier"),
    ],
)
def test_parse_int(text: str, want: int) -> None:
    assert parse_int(text) == want


@pytest.mark.parametrize("text", ["", "fast", "1.5", "0x10"])
def test_parse_int_rejects(text: str) -> None:
    with pytest.raises(MalformedValueError):
        parse_int(text)


@pytest.mark.parametrize("state", ["unknown", "notpresent", "down", "lowerlayerdown", "testing", "dormant", "up"])
def test_parse_operstate(state: str) -> None:
    assert parse_operstate(state + "\n") == state


@pytest.mark.parametrize("text", ["", "UP", "running", "up down"])
def test_parse_operstate_rejects(text: str) -> None:
    with pytest.raises(MalformedValueError):
        parse_operstate(text)


@pytest.mark.parametrize(("text", "want"), [("0", False), ("1\n", True)])
def test_parse_bool01(text: str, want: bool) -> None:
    assert parse_bool01(text) is want


@pytest.mark.parametrize("text", ["", "2", "true", "-1"])
def test_parse_bool01_rejects(text: str) -> None:
    with pytest.raises(MalformedValueError):
        parse_bool01(text)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("0c:42:a1:41:2d:36", "0c:42:a1:41:2d:36"),
        ("0C:42:A1:41:2D:36\n", "0c:42:a1:41:2d:36"),
        pytest.param(
            "00:00:10:87:fe:80:00:00:00:00:00:00:0c:42:a1:03:00:65:c7:a9",
            "00:00:10:87:fe:80:00:00:00:00:00:00:0c:42:a1:03:00:65:c7:a9",
            id="ipoib-20-bytes",
        ),
    ],
)
def test_parse_mac(text: str, want: str) -> None:
    assert parse_mac(text) == want


@pytest.mark.parametrize("text", ["", "0c42a1412d36", "0c:42:a1:41:2d:3", "zz:42:a1:41:2d:36"])
def test_parse_mac_rejects(text: str) -> None:
    with pytest.raises(MalformedValueError):
        parse_mac(text)


# -- model properties ------------------------------------------------------------------------

_LL = "fe80:0000:0000:0000:0e42:a1ff:fe41:2d36"
_V4 = "0000:0000:0000:0000:0000:ffff:c0a8:0164"
_V6 = "2001:0db8:0000:0000:0000:0000:0000:0001"


@pytest.mark.parametrize(
    ("gid", "ipv4", "address", "link_local"),
    [
        (_LL, None, "fe80::e42:a1ff:fe41:2d36", True),
        (_V4, "192.168.1.100", "192.168.1.100", False),
        (_V6, None, "2001:db8::1", False),
        pytest.param(
            "fe80:0000:0000:0001:0e42:a1ff:fe41:2d36",
            None,
            "fe80::1:e42:a1ff:fe41:2d36",
            False,
            id="fe80-prefix-but-not-fe80::/64",
        ),
    ],
)
def test_gid_entry_addresses(gid: str, ipv4: str | None, address: str, link_local: bool) -> None:
    entry = GidEntry(index=2, gid=gid, type="RoCE v2", netdev="ens1f0np0")
    assert entry.ipv4 == ipv4
    assert entry.address == address
    assert entry.is_link_local is link_local


@pytest.mark.parametrize(
    ("gid_type", "version", "label"),
    [
        ("IB/RoCE v1", 1, "v1"),
        ("RoCE v1", 1, "v1"),
        ("RoCE v2", 2, "v2"),
        (None, None, "?"),
        ("bogus", None, "bogus"),
    ],
)
def test_gid_entry_versions(gid_type: str | None, version: int | None, label: str) -> None:
    entry = GidEntry(index=0, gid=_LL, type=gid_type, netdev=None)
    assert entry.roce_version == version
    assert entry.version_label == label


@pytest.mark.parametrize(
    ("gts", "generation"),
    [
        (2.5, 1),
        (5.0, 2),
        (8.0, 3),
        (16.0, 4),
        (32.0, 5),
        (64.0, 6),
        (4.0, None),
        (None, None),
    ],
)
def test_pcie_generation(gts: float | None, generation: int | None) -> None:
    assert pcie_generation(gts) == generation


@pytest.mark.parametrize(
    ("own", "upstream", "want"),
    [
        pytest.param((32.0, 16), (16.0, 8), (16.0, 8), id="x16-gen5-card-in-x8-gen4-slot"),
        pytest.param((16.0, 8), (32.0, 16), (16.0, 8), id="slot-faster-than-card"),
        pytest.param((32.0, 16), (None, None), (32.0, 16), id="no-upstream"),
        pytest.param((None, None), (32.0, 16), (32.0, 16), id="own-unknown"),
        pytest.param((None, None), (None, None), (None, None), id="all-unknown"),
        pytest.param((16.0, 16), (0.0, 0), (16.0, 16), id="zero-is-unknown"),
    ],
)
def test_pcie_link_expected(
    own: tuple[float | None, int | None],
    upstream: tuple[float | None, int | None],
    want: tuple[float | None, int | None],
) -> None:
    link = PcieLink(
        pci_address="0000:3b:00.0",
        current_speed_gts=own[0],
        max_speed_gts=own[0],
        current_width=own[1],
        max_width=own[1],
        upstream_max_speed_gts=upstream[0],
        upstream_max_width=upstream[1],
    )
    assert (link.expected_speed_gts, link.expected_width) == want


@pytest.mark.parametrize(("speed_mbps", "want"), [(400000, 50e9), (-1, None), (None, None)])
def test_netdev_speed_bytes(speed_mbps: int | None, want: float | None) -> None:
    netdev = Netdev(
        name="ens1f0np0",
        ifindex=4,
        address=None,
        mtu=None,
        speed_mbps=speed_mbps,
        operstate="up",
        carrier=True,
        carrier_changes=None,
        carrier_up_count=None,
        carrier_down_count=None,
        pci_address=None,
    )
    assert netdev.speed_bytes_per_second == want


@pytest.mark.parametrize(
    ("state", "phys", "up"),
    [
        ("4: ACTIVE", "5: LinkUp", True),
        ("2: INIT", "5: LinkUp", False),
        ("1: DOWN", "3: Disabled", False),
        ("4: ACTIVE", None, False),
    ],
)
def test_port_is_up(state: str, phys: str | None, up: bool) -> None:
    port = Port(
        device="mlx5_0",
        number=1,
        link_layer="Ethernet",
        state=parse_numbered_state(state),
        phys_state=None if phys is None else parse_numbered_state(phys),
        rate=None,
        lid=None,
    )
    assert port.is_up is up
