"""Differential test: the simulator against the real kernel (rdma_rxe), step by step.

The kernel half ran in the VM (scenarios/sim_diff.py); here the same steps run on
`rnic_exporter.sim.SimHost` and the two sysfs trees are compared after normalising what must
differ (GUIDs, MAC-derived GIDs, the netdev's name, counter values; generic driver-model files the
exporter never reads). Today the simulator models mlx5 only, so these fail where an rxe-like
device differs; each failure lists every difference.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.kernel.conftest import scenario_result
from tests.kernel.lab import Tree
from tests.kernel.simdiff import STEPS, compare, gid_rows, sim_steps
from tests.kernel.vm import RunReport

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def kernel_side(kernel_lab: RunReport) -> dict[str, Any]:
    result: dict[str, Any] = scenario_result(kernel_lab, "sim_diff")
    return result


@pytest.fixture(scope="module")
def sim_side(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Tree], dict[str, Any]]:
    return sim_steps(Path(tmp_path_factory.mktemp("sim")))


@pytest.mark.parametrize("step", STEPS)
def test_gid_table_matches_the_kernel(
    step: str, kernel_side: dict[str, Any], sim_side: tuple[dict[str, Tree], dict[str, Any]]
) -> None:
    trees, info = sim_side
    kernel = {
        i: (g if not g.startswith("fe80:") else "<link-local>", t, "<netdev>" if n == kernel_side["netdev"] else n)
        for i, (g, t, n) in gid_rows(kernel_side["steps"][step]["tree"]).items()
    }
    sim = {
        i: (g if not g.startswith("fe80:") else "<link-local>", t, "<netdev>" if n == info["netdev"] else n)
        for i, (g, t, n) in gid_rows(trees[step]).items()
    }
    assert sim == kernel


@pytest.mark.parametrize("step", STEPS)
def test_tree_matches_the_kernel(
    step: str, kernel_side: dict[str, Any], sim_side: tuple[dict[str, Tree], dict[str, Any]]
) -> None:
    trees, info = sim_side
    diffs = compare(kernel_side["steps"][step]["tree"], kernel_side["netdev"], trees[step], info["netdev"])
    assert not diffs, f"{len(diffs)} difference(s) after step {step!r}:\n" + "\n".join(diffs)


def test_device_removal(kernel_side: dict[str, Any], sim_side: tuple[dict[str, Tree], dict[str, Any]]) -> None:
    removed = kernel_side["removed"]
    assert not removed["class_entry_exists"] and not removed["devices_virtual_exists"]
    assert removed["rdma_link_show"].strip() == ""
    assert removed["netdev_still_there"], "rdma link delete must leave the netdev"
    assert sim_side[1]["removed"] == {"class_entry_exists": False}
