"""Offline half of the differential test (no VM, runs in the unit suite): the simulator against the
rxe trees captured from Debian's 6.1 kernel in tests/fixtures/kernel-rxe-6.1 (see its README).

Not kernel-marked on purpose: it needs only the fixture. Same comparison as test_sim_diff.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.kernel.lab import Tree
from tests.kernel.simdiff import FIXTURE_DIR, STEPS, compare, gid_rows, load_fixture, sim_steps


@pytest.fixture(scope="module")
def captured() -> tuple[dict[str, Tree], dict[str, Any]]:
    if not (FIXTURE_DIR / "meta.json").exists():
        pytest.fail(f"kernel fixture missing: {FIXTURE_DIR}", pytrace=False)
    return load_fixture()


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Tree], dict[str, Any]]:
    return sim_steps(Path(tmp_path_factory.mktemp("sim")))


def test_fixture_round_trips(captured: tuple[dict[str, Tree], dict[str, Any]]) -> None:
    trees, meta = captured
    assert meta["kernel"].startswith("6.1.")
    assert len([p for p in trees["created"] if p.startswith("ports/1/gids/")]) == 1024


@pytest.mark.parametrize("step", STEPS)
def test_sim_gid_table_matches_captured_kernel(
    step: str, captured: tuple[dict[str, Tree], dict[str, Any]], sim: tuple[dict[str, Tree], dict[str, Any]]
) -> None:
    def norm(t: Tree, netdev: str) -> dict[int, tuple[str, str, str]]:
        return {
            i: (g if not g.startswith("fe80:") else "<link-local>", ty, "<netdev>" if n == netdev else n)
            for i, (g, ty, n) in gid_rows(t).items()
        }

    assert norm(sim[0][step], sim[1]["netdev"]) == norm(captured[0][step], captured[1]["netdev"])


@pytest.mark.parametrize("step", STEPS)
def test_sim_tree_matches_captured_kernel(
    step: str, captured: tuple[dict[str, Tree], dict[str, Any]], sim: tuple[dict[str, Tree], dict[str, Any]]
) -> None:
    diffs = compare(captured[0][step], captured[1]["netdev"], sim[0][step], sim[1]["netdev"])
    assert not diffs, f"{len(diffs)} difference(s) after step {step!r}:\n" + "\n".join(diffs)
