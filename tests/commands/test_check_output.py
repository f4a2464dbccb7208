"""What `check` says about itself: where each problem is for scripts, which files it judged
against, what it cannot read and why, and which NCCL it models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rnic_exporter.cli import Exit, main
from rnic_exporter.sim import SimHost


@pytest.fixture
def host(tmp_path: Path) -> SimHost:
    return SimHost.build(tmp_path / "sys", roce=2, infiniband=1, gid_table_size=16)


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), env=env)
    return result.exit_code, result.output


def check_json(host: SimHost, *extra: str) -> tuple[int, dict[str, object]]:
    code, out = invoke("check", "--path.sysfs", str(host.root), "--no-netlink", "--state.dir", "", "--json", *extra)
    return code, json.loads(out)


def located(report: dict[str, object]) -> list[tuple[str, object, object, object]]:
    problems = report["problems"]
    assert isinstance(problems, list)
    return [(p["code"], p["device"], p["port"], p["netdev"]) for p in problems]


def test_json_problems_name_device_port_and_netdev_as_fields(host: SimHost) -> None:
    host.set_port_up("mlx5_0", False)  # a port's problem: all three
    host.set_port_up("mlx5_2", False)  # an InfiniBand port: its IPoIB netdev
    host.inject_aer("mlx5_1", "fatal")  # a device's problem: no port, no netdev
    code, report = check_json(host, "--expected-devices", "4")  # a host's problem: none
    assert code == Exit.PROBLEMS
    assert sorted(located(report), key=str) == sorted(
        [
            ("device_count", None, None, None),
            ("pcie_aer_fatal", "mlx5_1", None, None),
            ("port_down", "mlx5_0", 1, "ens1f0np0"),
            ("port_down", "mlx5_2", 1, "ibp48s0"),
        ],
        key=str,
    )
