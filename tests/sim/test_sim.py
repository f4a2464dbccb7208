"""The simulator writes what a kernel would: layout, symlinks and value formats of facts §1-§5.

Values are read back from the files the simulator wrote, with plain file reads (no exporter code),
so these tests hold the simulator to the kernel, not to the reader.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import re
from pathlib import Path

import pytest

from rnic_exporter.model.host import ROCE_V1, ROCE_V2, ZERO_GID, LinkRate
from rnic_exporter.sim import SimDevice, SimHost
from rnic_exporter.sim.gid_table import GidTable, address_gid, mac_default_gid
from rnic_exporter.sim.host import ethernet_rate_text, rate_text
from rnic_exporter.sources.infiniband import parse_rate

BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
GID = re.compile(r"[0-9a-f]{4}(?::[0-9a-f]{4}){7}")
# facts §1.5: the extended PortCounters set, 21 files (mlx5 IB and RoCE).
EXTENDED_PMA = {
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
    "port_xmit_wait",
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_packets",
    "port_rcv_packets",
    "unicast_xmit_packets",
    "unicast_rcv_packets",
    "multicast_xmit_packets",
    "multicast_rcv_packets",
}
# facts §1.6: counters every mlx5 has, whatever its firmware caps.
MLX5_ALWAYS = {"rx_write_requests", "rx_read_requests", "rx_atomic_requests", "out_of_buffer"}


def value(host: SimHost, rel: str) -> str:
    """A file's value; it must be one line ending in exactly one newline, as every sysfs attribute."""
    data = (host.root / rel).read_bytes()
    assert data.endswith(b"\n") and data.count(b"\n") == 1, f"{rel}: {data!r}"
    return data[:-1].decode()


def port_dir(name: str) -> str:
    return f"class/infiniband/{name}/ports/1"


def files_under(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def roce(host: SimHost) -> list[SimDevice]:
    return [d for d in host.devices.values() if d.roce]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> SimHost:
    """The conftest `sim_host` layout, built once for the tests that only look at it (never change it)."""
    return SimHost.build(tmp_path_factory.mktemp("pristine") / "sys", roce=2, infiniband=1, gid_table_size=16)


# -- GID arithmetic --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mac", "gid"),
    [
        pytest.param("0c:42:a1:41:2d:36", "fe80:0000:0000:0000:0e42:a1ff:fe41:2d36", id="facts-example"),
        pytest.param("02:00:00:00:00:01", "fe80:0000:0000:0000:0000:00ff:fe00:0001", id="local-bit-set-is-cleared"),
        pytest.param("ff:ff:ff:ff:ff:ff", "fe80:0000:0000:0000:fdff:ffff:feff:ffff", id="all-ones"),
    ],
)
def test_mac_default_gid(mac: str, gid: str) -> None:
    assert mac_default_gid(mac) == gid


@pytest.mark.parametrize(
    ("address", "gid"),
    [
        pytest.param("192.168.1.100", "0000:0000:0000:0000:0000:ffff:c0a8:0164", id="facts-example"),
        pytest.param("10.0.0.1", "0000:0000:0000:0000:0000:ffff:0a00:0001", id="show-gids-example"),
        pytest.param("2001:db8::1", "2001:0db8:0000:0000:0000:0000:0000:0001", id="ipv6-uncompressed"),
    ],
)
def test_address_gid(address: str, gid: str) -> None:
    assert address_gid(address) == gid


# -- rate strings (facts §1.3) ---------------------------------------------------------------

LANE_GBPS = {
    "SDR": 2.5,
    "DDR": 5.0,
    "QDR": 10.0,
    "FDR10": 10.0,
    "FDR": 14.0,
    "EDR": 25.0,
    "HDR": 50.0,
    "NDR": 100.0,
    "XDR": 200.0,
}


@pytest.mark.parametrize(
    ("lanes", "speed", "text"),
    [
        (1, "SDR", "2.5 Gb/sec (1X SDR)"),
        (4, "SDR", "10 Gb/sec (4X SDR)"),
        (4, "QDR", "40 Gb/sec (4X QDR)"),
        (4, "FDR10", "40 Gb/sec (4X FDR10)"),
        (4, "FDR", "56 Gb/sec (4X FDR)"),
        (1, "EDR", "25 Gb/sec (1X EDR)"),
        (4, "EDR", "100 Gb/sec (4X EDR)"),
        (2, "HDR", "100 Gb/sec (2X HDR)"),
        (4, "HDR", "200 Gb/sec (4X HDR)"),
        (4, "NDR", "400 Gb/sec (4X NDR)"),
        (8, "NDR", "800 Gb/sec (8X NDR)"),
        (4, "XDR", "800 Gb/sec (4X XDR)"),
        (8, "XDR", "1600 Gb/sec (8X XDR)"),
        (12, "EDR", "300 Gb/sec (12X EDR)"),
    ],
)
def test_rate_text(lanes: int, speed: str, text: str) -> None:
    assert rate_text(lanes, speed) == text


@pytest.mark.parametrize("lanes", [1, 2, 4, 8, 12])
@pytest.mark.parametrize("speed", sorted(LANE_GBPS))
def test_rate_text_reads_back(lanes: int, speed: str) -> None:
    assert parse_rate(rate_text(lanes, speed)) == LinkRate(LANE_GBPS[speed] * lanes, lanes, speed)


@pytest.mark.parametrize(
    ("gbps", "text"),
    [
        # translate_eth_*_proto_oper as facts §1.3 lists it (mlx5 RoCE: Ethernet speed -> IB width/speed)
        pytest.param(1, "2.5 Gb/sec (1X SDR)", id="1G-shows-2.5"),
        (5, "5 Gb/sec (1X DDR)"),
        (10, "10 Gb/sec (1X QDR)"),
        (25, "25 Gb/sec (1X EDR)"),
        (40, "40 Gb/sec (4X QDR)"),
        (50, "50 Gb/sec (2X EDR)"),
        (56, "56 Gb/sec (4X FDR)"),
        (100, "100 Gb/sec (4X EDR)"),
        (200, "200 Gb/sec (4X HDR)"),
        (400, "400 Gb/sec (4X NDR)"),
        (800, "800 Gb/sec (8X NDR)"),
        (1600, "1600 Gb/sec (8X XDR)"),
    ],
)
def test_ethernet_rate_text(gbps: int, text: str) -> None:
    assert ethernet_rate_text(gbps) == text


# -- layout ----------------------------------------------------------------------------------


def test_class_infiniband_links_into_the_pci_function(pristine: SimHost) -> None:
    mount = os.path.realpath(pristine.root)
    for dev in pristine.devices.values():
        link = pristine.root / "class/infiniband" / dev.name
        assert link.is_symlink() and not os.path.isabs(os.readlink(link))
        ib_dir = os.path.relpath(os.path.realpath(link), mount)
        assert re.fullmatch(
            rf"devices/pci[0-9a-f]{{4}}:[0-9a-f]{{2}}/(?:{BDF.pattern}/)+infiniband/{dev.name}", ib_dir
        ), ib_dir
        assert not os.path.isabs(os.readlink(link / "device"))
        function = os.path.realpath(link / "device")
        assert BDF.fullmatch(os.path.basename(function)) and os.path.basename(function) == dev.pci_address
        assert os.path.dirname(os.path.dirname(os.path.realpath(link))) == function
        assert os.path.realpath(pristine.root / "bus/pci/devices" / dev.pci_address) == function
        upstream = os.path.dirname(function)
        assert BDF.fullmatch(os.path.basename(upstream)), upstream
        assert os.path.isfile(os.path.join(upstream, "max_link_speed"))


def test_class_net_links_to_the_same_function(pristine: SimHost) -> None:
    for dev in pristine.devices.values():
        link = pristine.root / "class/net" / dev.netdev
        assert link.is_symlink() and not os.path.isabs(os.readlink(link))
        function = os.path.realpath(pristine.root / "class/infiniband" / dev.name / "device")
        assert os.path.realpath(link) == os.path.join(function, "net", dev.netdev)
        assert os.path.realpath(link / "device") == function
        assert os.listdir(os.path.join(function, "net")) == [dev.netdev]
        if dev.roce:  # what ibdev2netdev reads: the netdev of the default GID
            assert value(pristine, f"{port_dir(dev.name)}/gid_attrs/ndevs/0") == dev.netdev


def test_every_file_holds_one_value_ending_in_one_newline(pristine: SimHost) -> None:
    """Except the stand-ins for attributes a kernel answers with EINVAL: empty, and listed in the overlay."""
    einval = {
        os.path.realpath(pristine.root / rel) for rel, code in pristine.errno_overlay.items() if code == errno.EINVAL
    }
    checked = 0
    for dirpath, _dirs, files in os.walk(pristine.root):
        for name in files:
            path = os.path.join(dirpath, name)
            data = Path(path).read_bytes()
            if data == b"":
                assert os.path.realpath(path) in einval, f"{path} is empty but no kernel read would fail"
            elif name.startswith("aer_dev_"):  # the kernel's AER counts: one `NAME COUNT` line per error bit
                assert data.endswith(b"\n") and data.splitlines()[-1].startswith(b"TOTAL_ERR_"), f"{path}: {data!r}"
            else:
                assert data.endswith(b"\n") and data.count(b"\n") == 1, f"{path}: {data!r}"
            checked += 1
    assert checked > 3 * 100


def test_gid_tables(pristine: SimHost) -> None:
    for dev in pristine.devices.values():
        port = pristine.root / port_dir(dev.name)
        for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):  # files exist for the whole table
            assert sorted(os.listdir(port / sub), key=int) == [str(i) for i in range(16)], sub
        for i in range(16):
            assert GID.fullmatch(value(pristine, f"{port_dir(dev.name)}/gids/{i}"))


def test_roce_default_gids_are_the_eui64_of_the_mac(pristine: SimHost) -> None:
    for dev in roce(pristine):
        mac = value(pristine, f"class/net/{dev.netdev}/address")
        gids = f"{port_dir(dev.name)}/gids"
        assert value(pristine, f"{gids}/0") == value(pristine, f"{gids}/1") == mac_default_gid(mac)
        assert value(pristine, f"{port_dir(dev.name)}/gid_attrs/types/0") == ROCE_V1 == "IB/RoCE v1"
        assert value(pristine, f"{port_dir(dev.name)}/gid_attrs/types/1") == ROCE_V2 == "RoCE v2"
        assert value(pristine, f"{port_dir(dev.name)}/gid_attrs/ndevs/1") == dev.netdev


def test_roce_ipv4_pair_at_2_and_3(pristine: SimHost) -> None:
    for dev in roce(pristine):
        (address,) = dev.addresses
        port = port_dir(dev.name)
        for index, gid_type in ((2, ROCE_V1), (3, ROCE_V2)):
            gid = value(pristine, f"{port}/gids/{index}")
            assert gid == address_gid(address)
            assert ipaddress.IPv6Address(gid).ipv4_mapped == ipaddress.IPv4Address(address)
            assert value(pristine, f"{port}/gid_attrs/types/{index}") == gid_type
            assert value(pristine, f"{port}/gid_attrs/ndevs/{index}") == dev.netdev
        assert {value(pristine, f"{port}/gids/{i}") for i in range(4, 16)} == {ZERO_GID}


def test_infiniband_gid_is_subnet_prefix_and_port_guid(pristine: SimHost) -> None:
    (dev,) = [d for d in pristine.devices.values() if not d.roce]
    port = port_dir(dev.name)
    port_guid = int(value(pristine, f"class/infiniband/{dev.name}/node_guid").replace(":", ""), 16) + 1
    assert value(pristine, f"{port}/gids/0") == "fe80:0000:0000:0000:" + ":".join(
        f"{port_guid:016x}"[i : i + 4] for i in range(0, 16, 4)
    )
    assert value(pristine, f"{port}/gid_attrs/types/0") == "IB/RoCE v1"
    assert pristine.errno_overlay[f"{port}/gid_attrs/ndevs/0"] == errno.EINVAL  # IB GIDs have no netdev
    assert value(pristine, f"{port}/gids/1") == ZERO_GID
    assert value(pristine, f"{port}/link_layer") == "InfiniBand"


def test_port_device_pcie_and_counter_files(pristine: SimHost) -> None:
    for dev in pristine.devices.values():
        port, ib = port_dir(dev.name), f"class/infiniband/{dev.name}"
        assert value(pristine, f"{ib}/node_type") == "1: CA"
        assert re.fullmatch(r"[0-9a-f]{4}(?::[0-9a-f]{4}){3}", value(pristine, f"{ib}/node_guid"))
        assert value(pristine, f"{ib}/sys_image_guid") == value(pristine, f"{ib}/node_guid")
        assert value(pristine, f"{port}/state") == "4: ACTIVE"
        assert value(pristine, f"{port}/phys_state") == "5: LinkUp"
        assert value(pristine, f"{port}/rate") == "400 Gb/sec (4X NDR)"
        assert value(pristine, f"{port}/link_layer") == ("Ethernet" if dev.roce else "InfiniBand")
        assert re.fullmatch(r"0x[0-9a-f]+", value(pristine, f"{port}/lid"))
        assert value(pristine, f"{port}/pkeys/0") == "0xffff"
        assert set(os.listdir(pristine.root / port / "counters")) == EXTENDED_PMA
        for name in EXTENDED_PMA:
            assert value(pristine, f"{port}/counters/{name}").isdigit()
        hw = set(os.listdir(pristine.root / port / "hw_counters"))
        assert "lifespan" in hw and hw >= MLX5_ALWAYS
        assert value(pristine, f"{port}/hw_counters/lifespan") == "10"
        function = os.path.realpath(pristine.root / ib / "device")
        upstream = os.path.dirname(function)
        for directory in (function, upstream):
            rel = os.path.relpath(directory, os.path.realpath(pristine.root))
            assert value(pristine, f"{rel}/max_link_speed") == "32.0 GT/s PCIe"
            assert value(pristine, f"{rel}/max_link_width") == "16"
        rel = os.path.relpath(function, os.path.realpath(pristine.root))
        assert value(pristine, f"{rel}/current_link_speed") == "32.0 GT/s PCIe"
        assert value(pristine, f"{rel}/current_link_width") == "16"
        net = f"class/net/{dev.netdev}"
        assert value(pristine, f"{net}/speed") == "400000"
        assert value(pristine, f"{net}/operstate") == "up"
        assert value(pristine, f"{net}/carrier") == "1"


def test_errno_overlay_lists_empty_slots_as_einval(sim_host: SimHost) -> None:
    overlay = sim_host.errno_overlay
    for dev in sim_host.devices.values():
        port = port_dir(dev.name)
        populated = {0, 1, 2, 3} if dev.roce else {0}
        for i in range(16):
            assert overlay.get(f"{port}/gid_attrs/types/{i}") == (None if i in populated else errno.EINVAL), i
            without_netdev = i not in populated or not dev.roce
            assert overlay.get(f"{port}/gid_attrs/ndevs/{i}") == (errno.EINVAL if without_netdev else None), i
            assert (sim_host.root / port / "gid_attrs/types" / str(i)).is_file()  # a kernel keeps the file
    assert set(overlay.values()) == {errno.EINVAL}
    sim_host.fail_with(f"{port_dir('mlx5_0')}/rate", errno.EIO)
    assert sim_host.errno_overlay[f"{port_dir('mlx5_0')}/rate"] == errno.EIO


# -- GID table bookkeeping (facts §2) --------------------------------------------------------


def table_with_address() -> GidTable:
    table = GidTable(16)
    table.set_defaults(mac_default_gid("0c:42:a1:41:2d:36"), "ens1f0np0")
    assert table.add_address("10.0.0.1", "ens1f0np0") == [2, 3]
    return table


def test_readd_without_a_holder_returns_to_the_same_slots() -> None:
    table = table_with_address()
    table.delete_address("10.0.0.1", "ens1f0np0")
    assert table.visible(2) is None and table.visible(3) is None and set(table.slots) == {0, 1}
    assert table.add_address("10.0.0.1", "ens1f0np0") == [2, 3]


def test_adding_an_existing_address_is_a_noop() -> None:
    table = table_with_address()
    assert table.add_address("10.0.0.1", "ens1f0np0") == [2, 3]
    assert set(table.slots) == {0, 1, 2, 3}


def test_readd_while_the_v2_slot_is_held_moves_v2_to_4() -> None:
    table = table_with_address()
    table.held.add(3)
    table.delete_address("10.0.0.1", "ens1f0np0")
    assert table.gid_text(3) == ZERO_GID and table.visible(3) is None and 3 in table.slots  # pending delete
    assert table.add_address("10.0.0.1", "ens1f0np0") == [2, 4]
    assert table.index_of("10.0.0.1", ROCE_V1) == 2 and table.index_of("10.0.0.1", ROCE_V2) == 4
    table.release(3)
    assert 3 not in table.slots
    assert table.add_address("10.0.0.2", "ens1f0np0") == [3, 5]


def test_full_table_raises_enospc(tmp_path: Path) -> None:
    table = GidTable(4)
    table.set_defaults(mac_default_gid("0c:42:a1:41:2d:36"), "ens1f0np0")
    assert table.add_address("10.0.0.1", "ens1f0np0") == [2, 3]
    with pytest.raises(OSError) as info:
        table.add_address("10.0.0.2", "ens1f0np0")
    assert info.value.errno == errno.ENOSPC == 28
    host = SimHost.build(tmp_path / "sys", roce=1, gid_table_size=4)
    with pytest.raises(OSError) as info:
        host.add_address("mlx5_0", "10.0.9.1")
    assert info.value.errno == errno.ENOSPC


def test_gid_shift_on_the_tree(sim_host: SimHost) -> None:
    dev = sim_host.device("mlx5_0")
    gid = address_gid(dev.addresses[0])
    port = port_dir("mlx5_0")
    assert sim_host.gid_shift("mlx5_0") == (3, 4)
    assert value(sim_host, f"{port}/gids/2") == value(sim_host, f"{port}/gids/4") == gid
    assert value(sim_host, f"{port}/gid_attrs/types/2") == ROCE_V1
    assert value(sim_host, f"{port}/gid_attrs/types/4") == ROCE_V2
    assert value(sim_host, f"{port}/gids/3") == ZERO_GID
    overlay = sim_host.errno_overlay
    assert overlay[f"{port}/gid_attrs/types/3"] == overlay[f"{port}/gid_attrs/ndevs/3"] == errno.EINVAL
    assert f"{port}/gid_attrs/types/4" not in overlay
    sim_host.release_gids("mlx5_0")
    assert sim_host.add_address("mlx5_0", "10.0.0.9") == [3, 5]
    assert value(sim_host, f"{port}/gids/3") == address_gid("10.0.0.9")


# -- fault methods ---------------------------------------------------------------------------


def test_port_down_and_up(sim_host: SimHost) -> None:
    port, net = port_dir("mlx5_0"), "class/net/ens1f0np0"
    before = {
        f: int(value(sim_host, f"{net}/{f}")) for f in ("carrier_changes", "carrier_down_count", "carrier_up_count")
    }
    link_downed = int(value(sim_host, f"{port}/counters/link_downed"))
    gids = files_under(sim_host.root / port / "gids")
    sim_host.set_port_up("mlx5_0", False)
    assert value(sim_host, f"{port}/state") == "1: DOWN"
    assert value(sim_host, f"{port}/phys_state") == "3: Disabled"
    assert value(sim_host, f"{port}/rate") == "40 Gb/sec (4X QDR)"  # mlx5 RoCE defaults with no link
    assert value(sim_host, f"{net}/speed") == "-1"
    assert value(sim_host, f"{net}/carrier") == "0"
    assert value(sim_host, f"{net}/operstate") == "down"
    assert int(value(sim_host, f"{net}/carrier_changes")) == before["carrier_changes"] + 1
    assert int(value(sim_host, f"{net}/carrier_down_count")) == before["carrier_down_count"] + 1
    assert int(value(sim_host, f"{port}/counters/link_downed")) == link_downed + 1
    assert files_under(sim_host.root / port / "gids") == gids  # carrier loss leaves the GIDs alone
    sim_host.set_port_up("mlx5_0", False)  # no change, no count
    assert int(value(sim_host, f"{net}/carrier_changes")) == before["carrier_changes"] + 1
    sim_host.set_port_up("mlx5_0", True)
    assert value(sim_host, f"{port}/state") == "4: ACTIVE"
    assert value(sim_host, f"{port}/phys_state") == "5: LinkUp"
    assert value(sim_host, f"{port}/rate") == "400 Gb/sec (4X NDR)"
    assert value(sim_host, f"{net}/speed") == "400000"
    assert value(sim_host, f"{net}/carrier") == "1"
    assert int(value(sim_host, f"{net}/carrier_changes")) == before["carrier_changes"] + 2
    assert int(value(sim_host, f"{net}/carrier_up_count")) == before["carrier_up_count"] + 1
    sim_host.set_port_up("mlx5_2", False)  # an InfiniBand port without a peer polls
    assert value(sim_host, f"{port_dir('mlx5_2')}/state") == "1: DOWN"
    assert value(sim_host, f"{port_dir('mlx5_2')}/phys_state") == "2: Polling"


def test_set_speed_and_pcie(sim_host: SimHost) -> None:
    rows = [  # device, Gb/s (RoCE), lanes and speed (IB), rate, netdev speed
        ("mlx5_0", 200, None, None, "200 Gb/sec (4X HDR)", "200000"),
        ("mlx5_0", 100, None, None, "100 Gb/sec (4X EDR)", "100000"),
        ("mlx5_0", 1, None, None, "2.5 Gb/sec (1X SDR)", "1000"),
        ("mlx5_2", 0, 2, "HDR", "100 Gb/sec (2X HDR)", "100000"),
        ("mlx5_2", 0, 4, "NDR", "400 Gb/sec (4X NDR)", "400000"),
    ]
    for name, gbps, lanes, ib_speed, rate, speed in rows:
        sim_host.set_speed(name, gbps, lanes=lanes, ib_speed=ib_speed)
        assert value(sim_host, f"{port_dir(name)}/rate") == rate, (name, gbps, lanes, ib_speed)
        assert value(sim_host, f"class/net/{sim_host.device(name).netdev}/speed") == speed
        assert value(sim_host, f"{port_dir('mlx5_1')}/rate") == "400 Gb/sec (4X NDR)"
    dev = sim_host.device("mlx5_1")  # PCIe: only the current link of that function changes
    upstream = os.path.dirname(dev.function_dir)
    sim_host.set_pcie("mlx5_1", 16.0, 8)
    assert value(sim_host, f"{dev.function_dir}/current_link_speed") == "16.0 GT/s PCIe"
    assert value(sim_host, f"{dev.function_dir}/current_link_width") == "8"
    assert value(sim_host, f"{dev.function_dir}/max_link_speed") == "32.0 GT/s PCIe"
    assert value(sim_host, f"{dev.function_dir}/max_link_width") == "16"
    assert value(sim_host, f"{upstream}/max_link_speed") == "32.0 GT/s PCIe"
    assert value(sim_host, f"{sim_host.device('mlx5_0').function_dir}/current_link_speed") == "32.0 GT/s PCIe"


def test_remove_and_restore_device(sim_host: SimHost) -> None:
    dev = sim_host.device("mlx5_1")
    function = sim_host.root / dev.function_dir
    before = files_under(function)
    links = [f"class/infiniband/{dev.name}", f"class/net/{dev.netdev}", f"bus/pci/devices/{dev.pci_address}"]
    sim_host.remove_device("mlx5_1")
    for rel in links:
        assert not os.path.lexists(sim_host.root / rel), rel
    assert not function.exists()
    assert function.parent.is_dir()  # the root port stays on the bus
    assert not any(key.startswith("class/infiniband/mlx5_1/") for key in sim_host.errno_overlay)
    assert os.listdir(sim_host.root / "class/infiniband") != [] and (sim_host.root / "class/infiniband/mlx5_0").is_dir()
    sim_host.restore_device("mlx5_1")
    for rel in links:
        assert os.path.realpath(sim_host.root / rel).startswith(str(os.path.realpath(function))), rel
    assert files_under(function) == before
    assert "class/infiniband/mlx5_1/ports/1/gid_attrs/types/4" in sim_host.errno_overlay


def test_fault_methods_work_for_an_unprivileged_user(tmp_path: Path) -> None:
    """`rnic-exporter demo` runs as an ordinary user: the simulator must rewrite the files it made.

    As root (CI) the scenario runs in a child process that drops to uid/gid 65534 first, since
    root writes through any file mode; it works in a directory it owns, by relative paths.
    """

    def play(root: Path) -> None:
        host = SimHost.build(root, roce=1, gid_table_size=8)
        host.set_port_up("mlx5_0", False)
        host.set_speed("mlx5_0", 100)
        host.add_address("mlx5_0", "10.0.9.1")

    if os.geteuid() != 0:
        play(tmp_path / "sys")
        return
    workdir = tmp_path / "unprivileged"
    workdir.mkdir()
    os.chown(workdir, 65534, 65534)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status only
        status = 1
        try:
            os.chdir(workdir)
            os.setgid(65534)
            os.setuid(65534)
            play(Path("sys"))
            status = 0
        except PermissionError:
            status = errno.EACCES
        finally:
            os._exit(status)
    _, wait_status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(wait_status)
    assert code == 0, "EACCES: the simulator cannot rewrite its own files" if code == errno.EACCES else code
