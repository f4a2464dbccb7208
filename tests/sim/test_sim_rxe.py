"""The simulator's rxe follows the kernel lab (Debian 6.1, tests/kernel/): its GID index moves only
while something holds the deleted entry, its rate follows `ib_get_width_and_speed`, and the exporter
calls such a host healthy. The tree itself is compared file by file with the kernel's captures in
tests/kernel/test_sim_fixture.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from rnic_exporter.cli import Exit, main
from rnic_exporter.model.host import ROCE_V2
from rnic_exporter.sim import SimHost
from rnic_exporter.sim.host import rxe_rate_text


@pytest.fixture
def rxe(tmp_path: Path) -> SimHost:
    return SimHost.build(tmp_path / "sys", roce=2, ethernet_gbps=10, driver="rxe")


def test_a_deleted_address_comes_back_at_its_index_unless_its_entry_is_held(rxe: SimHost) -> None:
    """incident_a_holders on the kernel: nobody holding it, the re-add takes slot 1 again; a QP past
    RTR holding it, slot 1 stays taken (zero GID, EINVAL) and the re-add lands at 2; once the holder
    is gone the next re-add is back at 1."""
    table = rxe.device("rxe0").gid_table
    assert table.index_of("10.0.0.1", ROCE_V2) == 1
    rxe.remove_address("rxe0", "10.0.0.1")
    assert rxe.add_address("rxe0", "10.0.0.1") == [1]
    rxe.hold_gid("rxe0", "10.0.0.1")
    rxe.remove_address("rxe0", "10.0.0.1")
    overlay = rxe.errno_overlay
    assert (rxe.root / "class/infiniband/rxe0/ports/1/gids/1").read_text().startswith("0000:")
    assert "class/infiniband/rxe0/ports/1/gid_attrs/types/1" in overlay
    assert rxe.add_address("rxe0", "10.0.0.1") == [2]
    rxe.release_gids("rxe0")
    rxe.remove_address("rxe0", "10.0.0.1")
    assert rxe.add_address("rxe0", "10.0.0.1") == [1]


@pytest.mark.parametrize(
    ("mbps", "text"),
    [
        (1000, "2.5 Gb/sec (1X SDR)"),
        (2500, "10 Gb/sec (1X FDR10)"),
        (10000, "10 Gb/sec (1X FDR10)"),
        (20000, "20 Gb/sec (4X DDR)"),
        (25000, "25 Gb/sec (1X EDR)"),
        (40000, "40 Gb/sec (4X FDR10)"),
        (50000, "100 Gb/sec (4X EDR)"),
        (400000, "100 Gb/sec (4X EDR)"),
    ],
)
def test_rxe_rate_follows_the_netdev_speed_as_the_kernel_lab_measured(mbps: int, text: str) -> None:
    """tests/kernel/scenarios/tap_speed.py: `ethtool -s tap0 speed N` on the kernel read back as these."""
    assert rxe_rate_text(mbps) == text


def test_a_port_whose_peer_went_down_reads_polling_at_the_same_rate(rxe: SimHost) -> None:
    port = rxe.root / "class/infiniband/rxe0/ports/1"
    rxe.set_port_up("rxe0", False)
    assert (port / "state").read_text() == "1: DOWN\n"
    assert (port / "phys_state").read_text() == "2: Polling\n"
    assert (port / "rate").read_text() == "10 Gb/sec (1X FDR10)\n"
    assert (rxe.root / "class/net/veth0/operstate").read_text() == "lowerlayerdown\n"


def test_a_healthy_rxe_host_passes_check_and_show(rxe: SimHost) -> None:
    """The kernel lab's first run: check exited 1 on exactly this host (an empty fw_ver)."""
    result = CliRunner().invoke(main, ["check", "--path.sysfs", str(rxe.root), "--no-netlink", "--state.dir", ""])
    assert result.exit_code == Exit.OK, result.output
    assert "WARNING" not in result.output and "CRITICAL" not in result.output
    result = CliRunner().invoke(main, ["show", "--path.sysfs", str(rxe.root)])
    assert result.exit_code == 0 and "rxe0" in result.output and "veth0" in result.output, result.output
