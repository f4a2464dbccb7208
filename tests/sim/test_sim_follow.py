"""The simulator following real netdevs: `ip addr del/add` and `ip link` rewrite the simulated GID tables.

Incident 1 end to end: a job holds the RoCE v2 GID at index 3, the address is deleted and added
back, and the GID comes back at a higher index while index 3 reads zero.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from rnic_exporter.cli import main
from rnic_exporter.sim import SimHost
from rnic_exporter.sim.follow import DEFAULT_DELAY_S, NetlinkFollower
from rnic_exporter.sim.gid_table import address_gid
from tests.support.netns import Netns, network_namespace
from tests.support.serve import follow_netlink_args
from tests.support.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.sim_host(infiniband=0)]

ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"


@pytest.fixture
def ns(host: SimHost) -> Iterator[Netns]:
    """The simulated netdevs as veths, with the simulated MACs (so EUI-64 link-locals equal the default GIDs)."""
    with network_namespace({d.netdev: d.mac for d in host.devices.values()}) as created:
        for dev in host.devices.values():
            created.ip("addr", "add", f"{dev.addresses[0]}/24", "dev", dev.netdev)
        yield created


def table(root: Path, device: str = "mlx5_0") -> dict[int, tuple[str, str]]:
    """Non-empty slots as the files read: index -> (GID, type)."""
    port = root / f"class/infiniband/{device}/ports/1"
    out = {}
    for gid_file in (port / "gids").iterdir():
        gid = gid_file.read_text().strip()
        if gid != ZERO:
            out[int(gid_file.name)] = (gid, (port / "gid_attrs/types" / gid_file.name).read_text().strip())
    return out


def v2_index(root: Path, address: str, device: str = "mlx5_0") -> int | None:
    gid = address_gid(address)
    return next((i for i, (g, t) in sorted(table(root, device).items()) if g == gid and t == "RoCE v2"), None)


def port_state(root: Path, device: str = "mlx5_0") -> str:
    return (root / f"class/infiniband/{device}/ports/1/state").read_text().strip()


def follow(ns: Netns, host: SimHost, *, delay_s: float = DEFAULT_DELAY_S, hold_gids: bool = False) -> NetlinkFollower:
    with ns.entered():  # the follower's threads are born inside the namespace and stay there
        follower = NetlinkFollower(host, delay_s=delay_s, hold_gids=hold_gids)
        follower.start()
    return follower


def test_readd_with_a_held_slot_moves_the_v2_gid_up(ns: Netns, host: SimHost) -> None:
    follower = follow(ns, host, hold_gids=True)
    try:
        assert follower.held == {"mlx5_0": [3], "mlx5_1": [3]}
        assert v2_index(host.root, "10.0.0.1") == 3
        ns.ip("addr", "del", "10.0.0.1/24", "dev", "ens1f0np0")
        wait_for(lambda: v2_index(host.root, "10.0.0.1") is None, timeout=5, what="the GID to go with the address")
        assert 3 not in table(host.root)  # pending delete: reads zero, but the slot is not free
        ns.ip("addr", "add", "10.0.0.1/24", "dev", "ens1f0np0")
        new = wait_for(lambda: v2_index(host.root, "10.0.0.1"), timeout=5, what="the GID to come back")
        assert new > 3
        assert table(host.root)[2] == (address_gid("10.0.0.1"), "IB/RoCE v1")  # v1 was not held: back at 2
        assert v2_index(host.root, "10.0.1.1", "mlx5_1") == 3  # the other RNIC saw nothing
    finally:
        follower.close()


def test_readd_without_a_holder_returns_to_index_3(ns: Netns, host: SimHost) -> None:
    follower = follow(ns, host)
    try:
        before = table(host.root)
        ns.ip("addr", "del", "10.0.0.1/24", "dev", "ens1f0np0")
        wait_for(lambda: v2_index(host.root, "10.0.0.1") is None, timeout=5, what="the GID to go")
        ns.ip("addr", "add", "10.0.0.1/24", "dev", "ens1f0np0")
        wait_for(lambda: table(host.root) == before, timeout=5, what="the same table as before")
        assert v2_index(host.root, "10.0.0.1") == 3
    finally:
        follower.close()


def test_start_syncs_with_the_real_addresses(host: SimHost) -> None:
    with network_namespace({d.netdev: d.mac for d in host.devices.values()}) as ns:
        ns.ip("addr", "add", "10.0.0.7/24", "dev", "ens1f0np0")  # not the simulated 10.0.0.1
        ns.ip("addr", "add", "2001:db8::7/64", "dev", "ens1f0np0", "nodad")
        follower = follow(ns, host)
        try:
            gids = table(host.root)
            assert v2_index(host.root, "10.0.0.1") is None
            assert gids[2] == (address_gid("10.0.0.7"), "IB/RoCE v1") and v2_index(host.root, "10.0.0.7") == 3
            assert v2_index(host.root, "2001:db8::7") == 5
            assert host.device("mlx5_0").addresses == ["10.0.0.7", "2001:db8::7"]
            # mlx5_1's netdev has no address at all: only the default GIDs stay.
            assert sorted(table(host.root, "mlx5_1")) == [0, 1]
        finally:
            follower.close()


def test_link_local_equal_to_the_default_gid_adds_nothing(ns: Netns, host: SimHost) -> None:
    follower = follow(ns, host)
    try:
        eui64 = "fe80::e42:a1ff:fe41:36"  # from MAC 0c:42:a1:41:00:36, the default GID of mlx5_0
        wait_for(
            lambda: any(a.address == eui64 for a in follower.watcher.addresses()["ens1f0np0"]),
            timeout=10,
            what="the link-local address",
        )
        ns.ip("addr", "add", "2001:db8::1/64", "dev", "ens1f0np0", "nodad")  # a later, real one
        wait_for(lambda: v2_index(host.root, "2001:db8::1"), timeout=5, what="the IPv6 GID")
        assert sorted(table(host.root)) == [0, 1, 2, 3, 4, 5]  # defaults, IPv4 pair, IPv6 pair: no link-local pair
        ns.ip("link", "set", "ens1f0np0", "down")  # IPv6 addresses go, the link-local among them
        wait_for(lambda: v2_index(host.root, "2001:db8::1") is None, timeout=5, what="the IPv6 GID to go")
        assert sorted(table(host.root)) == [0, 1, 2, 3]  # default GIDs stay (cache.c never deletes them)
    finally:
        follower.close()


def test_port_state_follows_admin_state_and_carrier(ns: Netns, host: SimHost) -> None:
    follower = follow(ns, host)
    try:
        assert port_state(host.root) == "4: ACTIVE"
        gids = table(host.root)
        ns.ip("link", "set", "ens1f0np0", "down")
        wait_for(lambda: port_state(host.root) == "1: DOWN", timeout=5, what="port down")
        assert table(host.root) == gids  # IPv4 GIDs survive admin down
        ns.ip("link", "set", "ens1f0np0", "up")
        wait_for(lambda: port_state(host.root) == "4: ACTIVE", timeout=5, what="port up")
        ns.set_carrier("ens1f0np0", False)
        wait_for(lambda: port_state(host.root) == "1: DOWN", timeout=5, what="port down on carrier loss")
        assert v2_index(host.root, "10.0.0.1") == 3  # carrier loss keeps every GID
        ns.set_carrier("ens1f0np0", True)
        wait_for(lambda: port_state(host.root) == "4: ACTIVE", timeout=5, what="port up on carrier")
        assert port_state(host.root, "mlx5_1") == "4: ACTIVE"
    finally:
        follower.close()


def test_updates_wait_for_the_work_queue_delay(ns: Netns, host: SimHost) -> None:
    follower = follow(ns, host, delay_s=0.3)
    try:
        started = time.monotonic()
        ns.ip("addr", "del", "10.0.0.1/24", "dev", "ens1f0np0")
        wait_for(lambda: v2_index(host.root, "10.0.0.1") is None, timeout=5, what="the GID to go", interval=0.005)
        assert time.monotonic() - started >= 0.3
    finally:
        follower.close()


def test_simulate_command_follows_netlink_until_sigterm(ns: Netns, tmp_path: Path) -> None:
    root = tmp_path / "sim"
    proc = ns.popen(
        follow_netlink_args(root),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    reader.start()
    wait_for(lambda: lines, timeout=20, what="the simulator's ready line")
    assert "following netlink for ens1f0np0, ens2f0np0" in lines[0] and "mlx5_0 holds GID [3]" in lines[0]
    assert v2_index(root, "10.0.0.1") == 3
    ns.ip("addr", "del", "10.0.0.1/24", "dev", "ens1f0np0")
    ns.ip("addr", "add", "10.0.0.1/24", "dev", "ens1f0np0")
    wait_for(lambda: (v2_index(root, "10.0.0.1") or 0) > 3, timeout=5, what="the GID back at a higher index")
    assert 3 not in table(root)  # still held by the "job": reads zero
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=5) == 0
    assert proc.stderr is not None and "Traceback" not in proc.stderr.read()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hold-gids"], "--hold-gids needs --follow-netlink"),
        (["--roce", "0"], "nothing to simulate"),
        (["--roce", "0", "--infiniband", "1", "--follow-netlink"], "--follow-netlink needs RoCE devices"),
    ],
)
def test_simulate_usage_errors_are_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["simulate", str(tmp_path / "sim"), *args])
    assert result.exit_code == 2
    assert message in result.output and len(result.output.strip().splitlines()) == 1


def test_simulate_refuses_a_directory_that_is_not_a_tree(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me\n")
    result = CliRunner().invoke(main, ["simulate", str(tmp_path)])
    assert result.exit_code == 2 and "is not a simulated sysfs tree" in result.output
    assert (tmp_path / "precious.txt").read_text() == "keep me\n"


def test_simulate_rewrites_an_existing_tree_in_place(host: SimHost) -> None:
    """A reader holding descriptors on the tree (a running exporter) keeps reading the new values."""
    gid3 = host.root / "class/infiniband/mlx5_0/ports/1/gids/3"
    inode = gid3.stat().st_ino
    host.remove_address("mlx5_0", "10.0.0.1")
    assert gid3.read_text() == ZERO + "\n"
    result = CliRunner().invoke(main, ["simulate", str(host.root), "--roce", "2", "--gid-table-size", "16"])
    assert result.exit_code == 0, result.output
    assert gid3.stat().st_ino == inode and gid3.read_text() == address_gid("10.0.0.1") + "\n"
