"""The daemon's hw counters over RDMA netlink on the real kernel (issue 30): `serve` reads rxe's
counters with STAT_GET (its read path and reads by kind say so), what it serves lies between the
sysfs reads around the scrape under traffic, and `--no-collector.rdma-netlink` reads the files."""

from __future__ import annotations

from typing import Any

import pytest

from tests.kernel.conftest import scenario_result
from tests.kernel.lab import samples
from tests.kernel.vm import RunReport

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def served(kernel_lab: RunReport) -> dict[str, Any]:
    result: dict[str, Any] = scenario_result(kernel_lab, "netlink_serve")
    assert "error" not in result, result["error"]
    return result


def self_metrics(lines: list[str], name: str, device: str) -> list[tuple[dict[str, str], float]]:
    return samples("\n".join(lines), name, device=device)


def reads_by_kind(lines: list[str], device: str) -> dict[str, float]:
    return {labels["kind"]: value for labels, value in self_metrics(lines, "rnic_exporter_reads_total", device)}


@pytest.mark.parametrize("device", ["rxe0", "rxe1"])
def test_the_read_path_is_netlink_by_default(served: dict[str, Any], device: str) -> None:
    lines = served["netlink"]["self"]
    paths = self_metrics(lines, "rnic_exporter_read_path_info", device)
    assert [(labels["path"], value) for labels, value in paths] == [("netlink", 1.0)], lines
    kinds = reads_by_kind(lines, device)
    assert kinds.get("netlink_stat", 0) > 0, kinds
    assert kinds.get("hw_counters_file", 0) == 0, kinds


def test_served_counters_lie_between_the_sysfs_reads_around_the_scrape(served: dict[str, Any]) -> None:
    rounds = served["rounds"]
    assert len(rounds) >= 3
    for r in rounds:
        assert sorted(r["served"]) == sorted(r["before"]), r  # every hw counter, lifespan aside
    outside = [
        (i, name, r["before"][name], r["served"][name], r["after"][name])
        for i, r in enumerate(rounds)
        for name in r["before"]
        if not r["before"][name] <= r["served"][name] <= r["after"][name]
    ]
    assert outside == [], outside
    moved = [r["after"]["sent_pkts"] - r["before"]["sent_pkts"] for r in rounds]
    assert all(m > 0 for m in moved), moved  # under traffic: the bounds were not trivially equal


def test_without_rdma_netlink_the_path_is_sysfs_and_reads_are_files(served: dict[str, Any]) -> None:
    lines = served["sysfs"]["self"]
    paths = self_metrics(lines, "rnic_exporter_read_path_info", "rxe0")
    assert [(labels["path"], value) for labels, value in paths] == [("sysfs", 1.0)], lines
    assert "disabled" in paths[0][0]["reason"], paths
    kinds = reads_by_kind(lines, "rxe0")
    assert kinds.get("hw_counters_file", 0) > 0, kinds
    assert kinds.get("netlink_stat", 0) == 0, kinds
    assert served["sysfs"]["served"], "no hw counters served on the sysfs path"
