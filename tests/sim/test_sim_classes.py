"""The simulator's real-host shapes (issue 13): a port without PMA, an IPv6-only RoCE table, a
missing GID table, a missing state file; and the demo playing them."""

from __future__ import annotations

import errno
import signal

import pytest

from rnic_exporter.sim import SimHost
from rnic_exporter.sim.host import PMA_EXTENDED_COUNTERS
from tests.support.processes import free_port, http_get, stop_process
from tests.support.serve import start_demo
from tests.support.wait import wait_for

pytestmark = pytest.mark.sim_host(infiniband=0, gid_table_size=8)

PORT = "class/infiniband/mlx5_0/ports/1"


def test_without_pma_text_survives_traffic_and_flaps(host: SimHost) -> None:
    host.without_pma("mlx5_0")
    host.add_traffic(1.0)
    host.set_port_up("mlx5_0", False)
    host.set_port_up("mlx5_0", True)
    for name in PMA_EXTENDED_COUNTERS:
        assert (host.root / PORT / "counters" / name).read_bytes() == b"N/A (no PMA)\n", name
    assert (host.root / PORT / "state").read_text() == "4: ACTIVE\n"  # the port itself is healthy
    assert (host.root / "class/infiniband/mlx5_1/ports/1/counters/symbol_error").read_text() == "0\n"
    with pytest.raises(ValueError):
        host.without_pma("mlx5_1", "quietly")


def test_without_pma_einval_is_an_overlay(host: SimHost) -> None:
    host.without_pma("mlx5_1", "einval")
    overlay = host.errno_overlay
    port = "class/infiniband/mlx5_1/ports/1"
    assert {rel for rel, code in overlay.items() if "/counters/" in rel and code == errno.EINVAL} == {
        f"{port}/counters/{name}" for name in PMA_EXTENDED_COUNTERS
    }
    assert (host.root / port / "counters/symbol_error").read_text() == "0\n"  # on disk: the value


def test_ipv6_only_table_keeps_the_defaults_and_adds_ipv6_pairs(host: SimHost) -> None:
    host.ipv6_only("mlx5_0")
    gids = [(host.root / PORT / "gids" / str(i)).read_text().strip() for i in range(8)]
    types = [(host.root / PORT / "gid_attrs/types" / str(i)).read_text().strip() for i in range(8)]
    assert gids[0] == gids[1] and gids[0].startswith("fe80:0000:0000:0000:")
    assert gids[2] == gids[3] == "fd00:0000:0000:0000:0000:0000:0000:0001"
    assert types[:4] == ["IB/RoCE v1", "RoCE v2", "IB/RoCE v1", "RoCE v2"]
    assert all(g == "0000:0000:0000:0000:0000:0000:0000:0000" for g in gids[4:])
    assert not any("ffff" in g for g in gids)  # no IPv4-mapped GID left
    assert host.device("mlx5_0").addresses == ["fd00:0:0:0::1"]


def test_dropped_gid_table_and_state_file_stay_dropped(host: SimHost) -> None:
    host.drop_gid_table("mlx5_0")
    host.drop_state_file("mlx5_1")
    host.add_address("mlx5_0", "10.0.9.1")
    host.set_port_up("mlx5_1", False)
    host.set_port_up("mlx5_1", True)
    assert not (host.root / PORT / "gids").exists() and not (host.root / PORT / "gid_attrs").exists()
    assert not any(rel.startswith(PORT + "/gid") for rel in host.errno_overlay)
    other = host.root / "class/infiniband/mlx5_1/ports/1"
    assert not (other / "state").exists() and (other / "phys_state").read_text() == "5: LinkUp\n"


def test_demo_shows_the_link_local_pick_and_the_port_without_pma() -> None:
    port = free_port()
    proc = start_demo(port)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        seen: set[str] = set()

        def both_seen() -> bool:
            body = http_get(url, timeout=1)[2].decode()
            if 'rnic_nccl_gid_usable{device="mlx5_0",port="1"} 0.0' in body:
                seen.add("unusable")
            if (
                'rnic_attribute_unsupported_info{attribute="counters/symbol_error",device="mlx5_4",port="1",'
                'reason="no_pma"} 1.0' in body
            ):
                seen.add("no_pma")
            assert "rnic_attribute_unavailable{" not in body or 'device="mlx5_4"' not in body
            return seen == {"unusable", "no_pma"}

        wait_for(both_seen, timeout=60, what="the demo's IPv6-only step and its port without PMA")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=15)
    finally:
        stop_process(proc)
    assert proc.returncode == 0 and "NCCL would use a link-local GID" in out
