"""The exporter's port rate and netdev speed agree with the kernel for each Ethernet speed rxe maps."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.kernel.conftest import scenario_result
from tests.kernel.vm import RunReport

pytestmark = pytest.mark.kernel

RATE = re.compile(r"^(\d+)(\.5)? Gb/sec \((\d+)X(?: (\w+))?\)\n$")


@pytest.fixture(scope="module")
def rows(kernel_lab: RunReport) -> list[dict[str, Any]]:
    result: dict[str, Any] = scenario_result(kernel_lab, "tap_speed")
    rows: list[dict[str, Any]] = result["rows"]
    return rows


def test_rate_matches_the_kernel_at_every_speed(rows: list[dict[str, Any]]) -> None:
    wrong = []
    for row in rows:
        m = RATE.match(row["kernel_rate"])
        assert m, f"kernel rate {row['kernel_rate']!r} at {row['mbps']} Mb/s does not parse"
        gbps = float(m.group(1)) + (0.5 if m.group(2) else 0)
        got = row["show_rate"]
        if got is None or (got["gbps"], got["lanes"], got["speed"]) != (gbps, int(m.group(3)), m.group(4)):
            wrong.append(f"{row['mbps']} Mb/s: kernel {row['kernel_rate'].strip()!r}, show {got}")
    assert not wrong, "\n".join(wrong)


def test_netdev_speed_matches_the_kernel(rows: list[dict[str, Any]]) -> None:
    assert [(r["mbps"], r["show_netdev_speed_mbps"]) for r in rows] == [
        (r["mbps"], int(r["netdev_speed"])) for r in rows
    ]
    assert all(int(r["netdev_speed"]) == r["mbps"] for r in rows)
