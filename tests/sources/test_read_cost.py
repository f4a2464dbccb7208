"""The firmware-command model: the kernel's rules per read kind (rnic-linux-facts.md §7)."""

from __future__ import annotations

from pathlib import Path

from rnic_exporter.sim.host import SimHost
from rnic_exporter.sources.read_cost import (
    PortReads,
    commands_of,
    driver_of,
    firmware_commands,
    refresh_commands,
    with_netlink,
)
from rnic_exporter.sources.reader import HostReader
from rnic_exporter.sources.sysfs import SysfsRoot


def test_a_refresh_costs_one_to_three_commands_by_the_counters_present() -> None:
    assert refresh_commands(["out_of_buffer", "rx_write_requests"]) == 1
    assert refresh_commands(["out_of_buffer", "np_cnp_sent"]) == 2  # QUERY_CONG_STATISTICS too
    assert refresh_commands(["out_of_buffer", "rp_cnp_handled", "rx_icrc_encapsulated"]) == 3  # and PPCNT


def test_pma_files_cost_one_each_and_hw_files_a_refresh_each_with_optional_counters() -> None:
    port = PortReads("mlx5_0", 1, pma_files=21, hw_files=28, refresh=2, optional_counters=True)
    assert commands_of(port) == {"pma_file": 21, "hw_counters_file": 56, "netlink_stat": 0, "port_attribute": 0}
    cached = PortReads("mlx5_0", 1, pma_files=21, hw_files=28, refresh=2, optional_counters=False)
    assert commands_of(cached)["hw_counters_file"] == 2  # one quick pass: one refresh


def test_netlink_replaces_each_ports_hw_files_by_one_refresh_and_keeps_the_rest() -> None:
    plan = [
        PortReads("mlx5_0", 1, pma_files=21, hw_files=28, refresh=3),
        PortReads("mlx5_0", None, hw_files=4, refresh=1),  # device-wide: no netlink request of its own
    ]
    count = firmware_commands(with_netlink(plan))
    assert dict(count.by_kind) == {"pma_file": 21, "hw_counters_file": 4, "netlink_stat": 3, "port_attribute": 0}
    assert dict(count.reads) == {"pma_file": 21, "hw_counters_file": 4, "netlink_stat": 1, "port_attribute": 0}
    assert count.commands == 28


def test_drivers_without_rules_are_counted_as_reads_not_commands() -> None:
    assert driver_of("mlx5_bond_0") == "mlx5" and driver_of("rxe0") == "rxe" and driver_of("irdma1") == "irdma"
    count = firmware_commands([PortReads("rxe0", 1, hw_files=15), PortReads("mlx5_0", 1, pma_files=2)])
    assert (count.commands, count.unmodelled_reads) == (2, 15)


def test_the_readers_plan_of_a_simulated_host_models_as_the_bench_says(tmp_path: Path) -> None:
    """bench/read_cost.py's input: the reader's counter plan of a SimHost tree, per port."""
    host = SimHost.build(tmp_path / "sys", roce=2, infiniband=0, gid_table_size=8)
    reader = HostReader(SysfsRoot(host.root))
    try:
        reader.read()
        plans = reader.counter_plans()
    finally:
        reader.close()
    ports = [
        PortReads(device, g.port, pma_files=len(g.names), refresh=1)
        if g.kind == "counters"
        else PortReads(device, g.port, hw_files=len(g.names), refresh=refresh_commands(g.names))
        for device, plan in plans
        if plan is not None
        for g in plan.groups
        if g.names
    ]
    today, netlink = firmware_commands(ports), firmware_commands(with_netlink(ports))
    assert today.reads["pma_file"] > 0 and today.reads["hw_counters_file"] > 0
    assert netlink.reads["netlink_stat"] == 2  # one per port
    assert netlink.commands < today.commands / 2
