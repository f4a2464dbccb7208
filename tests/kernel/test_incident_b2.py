"""Incident 2 (NIC degradation) on the real kernel, part 2: a device re-added under its name, renamed,
its netdev renamed, its MTU changed, and the RDMA subsystem in exclusive netns mode; what the kernel
did and what `serve` (scrape, from the root namespace) and `check` said."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.kernel.conftest import scenario_result
from tests.kernel.lab import sample, samples
from tests.kernel.steps import events, problems, scrape, stale, step
from tests.kernel.vm import RunReport

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def res(kernel_lab: RunReport) -> dict[str, Any]:
    result: dict[str, Any] = scenario_result(kernel_lab, "incident_b2")
    print(f"incident_b2: {result.get('seconds')} s")
    return result


def test_scenario_completed(res: dict[str, Any]) -> None:
    assert "error" not in res, res["error"]


def test_netns_mode_restored(res: dict[str, Any]) -> None:
    assert res["netns_mode_restore"] == 0 and "shared" in res["netns_mode_after"], res


def test_serve_survived(res: dict[str, Any]) -> None:
    assert res["serve_exit"] == 0, res["serve_log"]
    assert "Traceback" not in res["serve_log"], res["serve_log"]


# -- 5. deleted and re-added under the same name --------------------------------------------------


def test_readded_device_is_present_again(res: dict[str, Any]) -> None:
    st = step(res, "readded")
    s = scrape(st)
    assert sample(scrape(step(res, "deleted")), "rnic_device_present", device="rxe0") == 0.0
    assert sample(s, "rnic_device_present", device="rxe0") == 1.0
    assert sample(s, "rnic_port_up", device="rxe0") == 1.0
    assert events(st, "rnic.device.disappeared", "rxe0") == 1
    assert events(st, "rnic.device.reappeared", "rxe0") == 1


def test_readded_device_leaves_no_stale_error(res: dict[str, Any]) -> None:
    st = step(res, "readded")
    assert problems(st, "rxe0") == [], st["check"]
    assert samples(scrape(st), "rnic_attribute_unavailable", device="rxe0") == []


# -- 6. renamed: rdma dev set rxe0 name rxe9 ------------------------------------------------------


def test_rename_kernel(res: dict[str, Any]) -> None:
    st = step(res, "renamed")
    assert "rxe9" in st["class_infiniband"] and "rxe0" not in st["class_infiniband"]
    assert st["guid"] == step(res, "readded")["guid"]  # the same device: its node GUID did not change


def test_rename_new_name_present_old_name_has_no_series(res: dict[str, Any]) -> None:
    st = step(res, "renamed")
    s = scrape(st)
    assert sample(s, "rnic_port_up", device="rxe9") == 1.0
    assert sample(s, "rnic_device_present", device="rxe9") == 1.0
    assert stale(st, "rxe0") == []


def test_rename_is_not_a_lost_device(res: dict[str, Any]) -> None:
    """A rename keeps the device (same node GUID, same netdev, nothing for a job to lose): reporting
    the old name as a disappeared, missing NIC pages the operator for nothing."""
    st = step(res, "renamed")
    assert events(st, "rnic.device.disappeared", "rxe0") == 1, "a second disappearance for the rename"
    assert problems(st, "rxe0", "device_missing") == [], st["check"]
    assert sample(scrape(st), "rnic_device_present", device="rxe0") != 0.0


# -- 7. its netdev renamed va -> vz ----------------------------------------------------------------


def test_netdev_rename_is_followed(res: dict[str, Any]) -> None:
    st = step(res, "netdev_renamed")
    s = scrape(st)
    assert st["parent"] == "vz" and st["ndev_of_gid1"] == "vz", st
    assert sample(s, "rnic_port_info", device="rxe9", netdev="vz") == 1.0
    assert [ln for ln in st["scrape"] if 'netdev="va"' in ln] == []
    assert st["show"]["devices"]["rxe9"][0]["netdevs"][0]["name"] == "vz"
    assert [p for p in problems(st, "rxe9") if p["severity"] != "info"] == [], st["check"]


# -- 8. MTU 1200 on the netdev ----------------------------------------------------------------------


def test_mtu_change_is_exported(res: dict[str, Any]) -> None:
    st = step(res, "mtu")
    assert st["netdev_mtu"] == "1200"
    assert sample(scrape(st), "rnic_netdev_mtu_bytes", device="rxe9", netdev="vz") == 1200.0
    assert st["show"]["devices"]["rxe9"][0]["netdevs"][0]["mtu"] == 1200


def test_rxe_active_mtu_follows_the_netdev(res: dict[str, Any]) -> None:
    """rxe has no ports/1/active_mtu in sysfs; verbs (ibv_devinfo) show the IB MTU the netdev's allows."""
    st = step(res, "mtu")
    assert "active_mtu" not in st["port_files"]
    assert "active_mtu:\t\t1024 (3)" in st["ibv_devinfo"], st["ibv_devinfo"]


# -- 9. exclusive netns mode ------------------------------------------------------------------------


def test_exclusive_mode_set(res: dict[str, Any]) -> None:
    ex = step(res, "exclusive")
    assert ex["set_code"] == 0 and "exclusive" in ex["mode_after"], ex


def test_rxe_made_in_netns_b_registers_in_init_net(res: dict[str, Any]) -> None:
    """Kernel fact (6.1): `rdma link add` run in netns b under exclusive mode registers rxe1 in init_net,
    and rxe refuses `rdma dev set rxe1 netns b` (no disassociate_ucontext: EOPNOTSUPP)."""
    ex = step(res, "exclusive")
    made = ex["created_in_b"]
    assert "rxe1" in made["root_sysfs"] and made["b_sysfs"] == [], made
    assert ex["moved"]["code"] != 0 and "Operation not supported" in ex["moved"]["out"], ex["moved"]


def test_exclusive_mode_each_namespace_exporter_matches_its_sysfs(res: dict[str, Any]) -> None:
    ex = step(res, "exclusive")
    made = ex["created_in_b"]
    root = made["root_exporter"]
    assert sorted(root["show"]["devices"]) == sorted(d for d in made["root_sysfs"] if d.startswith("rxe"))
    assert sample(scrape(root), "rnic_port_up", device="rxe1") == 1.0
    show = ex["b_show"]
    assert show["code"] == 0, show
    assert [d["name"] for d in json.loads(show["stdout"])["devices"]] == made["b_sysfs"]
