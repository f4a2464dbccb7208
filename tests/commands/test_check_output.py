"""What `check` says about itself: where each problem is for scripts, which files it judged
against, what it cannot read and why, and which NCCL it models."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rnic_exporter.cli import Exit, NcclIndexParam, main
from rnic_exporter.daemon.agent import Agent, ServeConfig
from rnic_exporter.detect.settings import DetectionSettings
from rnic_exporter.sim import SimHost
from rnic_exporter.sim.sysfs_root import SimSysfsRoot
from rnic_exporter.sources.reader import ReaderSettings
from rnic_exporter.sources.sysfs import SysfsRoot
from tests.support.check import check_in_process


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


def test_another_sysfs_is_not_judged_against_this_hosts_inventory(
    host: SimHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default --state.dir describes /sys: a captured or simulated tree judged against it reports
    this host's devices as missing there (or hides the ones missing here). The variable counts as
    given, as a flag does (the other tests' private state directory)."""
    monkeypatch.delenv("RNIC_EXPORTER_CHECK_STATE_DIR")
    code, out = invoke("check", "--path.sysfs", str(host.root), "--no-netlink")
    assert code == Exit.OK, out
    assert f"note: --path.sysfs {host.root} is not /sys: not judged against this host's inventory" in out
    assert "give --state.dir" in out and "no inventory" not in out


def test_the_state_file_judged_is_named_and_so_is_the_one_to_delete(host: SimHost, tmp_path: Path) -> None:
    state = tmp_path / "state"
    agent = Agent(
        ServeConfig(
            sysfs=host.root,
            state_dir=state,
            detection=DetectionSettings(),
            reader=ReaderSettings(),
            watch_netlink=False,
            watch_udev=False,
        ),
        SysfsRoot(host.root, hold_fds=True),
    )
    try:
        agent.poll_once(full_gid_tables=True)
    finally:
        agent.close()
    state_file = state / "state.json"
    code, out = invoke("check", "--path.sysfs", str(host.root), "--no-netlink", "--state.dir", str(state))
    assert code == Exit.OK and f"note: inventory: judged against the state file {state_file} (3 device(s))" in out
    host.remove_device("mlx5_1")
    code, out = invoke("check", "--path.sysfs", str(host.root), "--no-netlink", "--state.dir", str(state), "--json")
    assert code == Exit.PROBLEMS
    [problem] = json.loads(out)["problems"]
    assert problem["code"] == "device_missing" and f"delete the state file ({state_file}) only if" in problem["fix"]
    code, out = invoke("check", "--path.sysfs", str(host.root), "--no-netlink", "--state.dir", str(tmp_path / "none"))
    assert f"no inventory (state file {tmp_path / 'none' / 'state.json'} not found)" in out


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM])
def test_a_refused_read_is_a_permission_problem_not_a_driver_bug(host: SimHost, tmp_path: Path, code: int) -> None:
    host.fail_with("class/infiniband/mlx5_2/ports/1/rate", code)  # an attribute
    host.fail_with("class/infiniband/mlx5_0/ports/1/gids", code)  # a RoCE port's GID table
    report = check_in_process(host, tmp_path, SimSysfsRoot(host.root, errno_overlay=host.errno_overlay))
    found = {p.code: p.fix for p in report.problems}
    assert set(found) == {"attribute_unreadable", "gid_table_unreadable"}, report.problems
    for fix in found.values():
        assert fix.startswith("a permission problem, not the driver: run check as root") and "driver bug" not in fix


@pytest.mark.parametrize("text", ["abc", "3abc", " ", "1.5"])
def test_a_nccl_gid_index_that_is_no_integer_is_a_usage_error(host: SimHost, text: str) -> None:
    code, out = invoke(
        "check", "--path.sysfs", str(host.root), "--no-netlink", "--state.dir", "", "--nccl-gid-index", text
    )
    assert code == Exit.USAGE and "is not an integer" in out and "CRITICAL" not in out


@pytest.mark.parametrize(("text", "index"), [("3", 3), ("0x3", 3), ("010", 8), ("-1", -1), (" 3 ", 3), ("", None)])
def test_a_nccl_gid_index_is_read_as_nccl_reads_it(text: str, index: int | None) -> None:
    assert NcclIndexParam().convert(text, None, None) == index


def test_check_says_which_nccl_it_models_where_it_judged_a_roce_port(tmp_path: Path) -> None:
    roce = SimHost.build(tmp_path / "roce", roce=1, infiniband=0, gid_table_size=16)
    code, out = invoke("check", "--path.sysfs", str(roce.root), "--no-netlink", "--state.dir", "")
    assert code == Exit.OK
    [line] = [line for line in out.splitlines() if line.startswith("note: NCCL: ")]
    assert "NCCL 2.26 to 2.31" in line and "up to 2.30" in line and "NVIDIA/nccl#2400" in line
    assert "docs/check.md#nccl-versions" in line
    infiniband = SimHost.build(tmp_path / "ib", roce=0, infiniband=1)
    code, out = invoke("check", "--path.sysfs", str(infiniband.root), "--no-netlink", "--state.dir", "")
    assert code == Exit.OK and "NCCL 2.26" not in out  # no RoCE port: NCCL's GID choice is not judged
