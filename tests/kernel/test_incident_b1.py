"""Incident 2 (NIC degradation) on the real kernel, part 1: a speed drop, a carrier loss, a device
deleted, the driver unloaded; what the kernel did and what `serve` (scrape) and `check` said."""

from __future__ import annotations

from typing import Any

import pytest

from tests.kernel.conftest import scenario_result
from tests.kernel.lab import sample, samples
from tests.kernel.steps import KEPT_FOR_GONE, events, problems, scrape, step
from tests.kernel.vm import RunReport

pytestmark = pytest.mark.kernel

ALL = ("rxe0", "rxe1", "rxe2", "rxe3")


@pytest.fixture(scope="module")
def res(kernel_lab: RunReport) -> dict[str, Any]:
    result: dict[str, Any] = scenario_result(kernel_lab, "incident_b1")
    print(f"incident_b1: {result.get('seconds')} s")
    return result


def test_scenario_completed(res: dict[str, Any]) -> None:
    assert "error" not in res, res["error"]


def test_serve_survived(res: dict[str, Any]) -> None:
    assert res["serve_exit"] == 0, res["serve_log"]
    assert "Traceback" not in res["serve_log"], res["serve_log"]


# -- 1. speed drop 100G -> 25G -> 100G on rxe2's tap --------------------------------------------


def test_speed_drop_kernel(res: dict[str, Any]) -> None:
    st = step(res, "speed_25g")
    assert st["kernel"]["rate"] == "25 Gb/sec (1X EDR)" and st["netdev_speed"] == "25000", st["kernel"]
    assert step(res, "start")["kernel"]["rxe2"]["rate"] == "100 Gb/sec (4X EDR)"


def test_speed_drop_rate_metrics(res: dict[str, Any]) -> None:
    s = scrape(step(res, "speed_25g"))
    assert sample(s, "rnic_port_active_rate_bytes_per_second", device="rxe2") == 25e9 / 8
    assert sample(s, "rnic_port_active_width_lanes", device="rxe2") == 1
    assert sample(s, "rnic_netdev_speed_bytes_per_second", device="rxe2", netdev="tap0") == 25e9 / 8


def test_speed_drop_is_below_rated(res: dict[str, Any]) -> None:
    st = step(res, "speed_25g")
    s = scrape(st)
    assert sample(s, "rnic_link_below_rated", device="rxe2", link="port") == 1.0
    assert sample(s, "rnic_link_below_rated", device="rxe2", link="netdev") == 1.0
    assert events(st, "rnic.link.below_rated", "rxe2") == 2  # one per link: port and netdev
    codes = sorted(p["code"] for p in problems(st, "rxe2") if p["code"].endswith("_below_rated"))
    assert codes == ["netdev_below_rated", "port_below_rated"], st["check"]
    line = next(p for p in problems(st, "rxe2", "port_below_rated"))
    assert line["what"] == "port link runs at 25 Gb/s x1, rated 100 Gb/s x4 (baseline)", line


def test_rxe_rating_comes_only_from_the_learned_baseline(res: dict[str, Any]) -> None:
    """rxe on a tap advertises no ethtool link modes and no config is given: the only rating is the
    best rate the daemon saw while ACTIVE (so a port already degraded when serve first starts has none)."""
    s = scrape(step(res, "speed_25g"))
    sources = {labels["source"] for labels, _ in samples(s, "rnic_port_rated_rate_bytes_per_second", device="rxe2")}
    assert sources == {"baseline"}
    assert sample(s, "rnic_port_rated_rate_bytes_per_second", device="rxe2", source="baseline") == 100e9 / 8
    assert sample(s, "rnic_port_rated_width_lanes", device="rxe2", source="baseline") == 4


def test_speed_restored_leaves_nothing_stale(res: dict[str, Any]) -> None:
    st = step(res, "speed_100g_again")
    s = scrape(st)
    assert st["kernel"]["rate"] == "100 Gb/sec (4X EDR)"
    assert sample(s, "rnic_link_below_rated", device="rxe2", link="port") == 0.0
    assert sample(s, "rnic_link_below_rated", device="rxe2", link="netdev") == 0.0
    assert events(st, "rnic.link.restored", "rxe2") == 2
    assert [p for p in problems(st, "rxe2") if p["code"].endswith("_below_rated")] == [], st["check"]


def test_healthy_50g_netdev_is_not_below_rated(res: dict[str, Any]) -> None:
    """rxe3's tap has run at 50G from the start; 6.1's rxe rates any netdev of 50G or more `100 Gb/sec (4X
    EDR)` (6.12's says `50 Gb/sec (2X EDR)`). The netdev was never faster: judging its 50 Gb/s against
    the port's rate bucket is a false alarm."""
    st = step(res, "start")
    assert st["kernel"]["rxe3"]["rate"] in ("100 Gb/sec (4X EDR)", "50 Gb/sec (2X EDR)")
    s = scrape(st)
    # No judgement (absent: the port's rate is no measure of this netdev, and it advertises no link
    # modes) or a judgement of 0; never 1.
    assert sample(s, "rnic_link_below_rated", device="rxe3", link="netdev") in (None, 0.0), [
        ln for ln in st["scrape"] if 'device="rxe3"' in ln and ("rated" in ln or "speed" in ln)
    ]
    assert [p for p in problems(st, "rxe3") if p["code"].endswith("_below_rated")] == [], st["check"]


# -- 2. carrier loss: rxe0's link partner (vb) down, then up -------------------------------------


def test_carrier_loss_kernel(res: dict[str, Any]) -> None:
    assert step(res, "carrier_lost")["kernel"] == {
        "state": "1: DOWN",
        "phys_state": "2: Polling",
        "rate": "10 Gb/sec (1X FDR10)",
    }


def test_carrier_loss_metrics_event_and_check(res: dict[str, Any]) -> None:
    st = step(res, "carrier_lost")
    s = scrape(st)
    assert sample(s, "rnic_port_up", device="rxe0") == 0.0
    assert sample(s, "rnic_port_state", device="rxe0") == 1.0
    assert sample(s, "rnic_port_physical_state", device="rxe0") == 2.0
    assert sample(s, "rnic_netdev_up", device="rxe0", netdev="va") == 0.0
    assert events(st, "rnic.port.down", "rxe0") == 1
    line = problems(st, "rxe0", "port_down")
    assert [(p["severity"], p["what"]) for p in line] == [
        ("warning", "port is not ACTIVE/LinkUp (1: DOWN / 2: Polling)")
    ], st["check"]
    assert st["check"]["code"] == 1


def test_carrier_back_clears_the_port_down(res: dict[str, Any]) -> None:
    st = step(res, "carrier_back")
    s = scrape(st)
    assert st["kernel"]["state"] == "4: ACTIVE"
    assert sample(s, "rnic_port_up", device="rxe0") == 1.0
    assert events(st, "rnic.port.up", "rxe0") == 1
    assert problems(st, "rxe0", "port_down") == [], st["check"]


# -- 3. rdma link delete rxe0 ---------------------------------------------------------------------


def test_deleted_device_is_absent_not_missing(res: dict[str, Any]) -> None:
    st = step(res, "deleted")
    s = scrape(st)
    assert st["kernel_present"] is False
    assert sample(s, "rnic_device_present", device="rxe0") == 0.0
    assert sample(s, "rnic_device_present", device="rxe1") == 1.0
    assert events(st, "rnic.device.disappeared", "rxe0") == 1
    assert "rxe0" not in st["show"]["devices"]


def test_deleted_device_leaves_no_stale_series(res: dict[str, Any]) -> None:
    st = step(res, "deleted")
    stale = [ln for ln in st["scrape"] if 'device="rxe0"' in ln and ln.split("{")[0] not in KEPT_FOR_GONE]
    assert stale == []


def test_deleted_device_in_check(res: dict[str, Any]) -> None:
    st = step(res, "deleted")
    line = problems(st, "rxe0")
    assert [(p["code"], p["severity"], p["where"]) for p in line] == [("device_missing", "critical", "rxe0 (-)")]
    assert st["check"]["code"] == 1


# -- 4. modprobe -r rdma_rxe: every NIC at once ---------------------------------------------------


def test_unload_removes_every_device(res: dict[str, Any]) -> None:
    st = step(res, "unload")
    assert (st["modprobe_code"], st["class_infiniband"], st["module_loaded"]) == (0, [], False), st
    s = scrape(st)
    assert st["rnic_devices"] == 0.0
    for dev in ALL:
        assert sample(s, "rnic_device_present", device=dev) == 0.0, dev
    for dev in ("rxe1", "rxe2", "rxe3"):
        assert events(st, "rnic.device.disappeared", dev) == 1, dev
    assert st["show"]["devices"] == {}


def test_unload_leaves_no_stale_series(res: dict[str, Any]) -> None:
    st = step(res, "unload")
    assert [ln for ln in st["scrape"] if ln.split("{")[0] not in KEPT_FOR_GONE] == []


def test_unload_in_check(res: dict[str, Any]) -> None:
    st = step(res, "unload")
    missing = sorted(p["where"] for p in st["check"]["problems"] if p["code"] == "device_missing")
    assert missing == [f"{d} (-)" for d in ALL], st["check"]
    assert all(p["severity"] == "critical" for p in st["check"]["problems"])
    assert st["check"]["code"] == 1
