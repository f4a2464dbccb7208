"""Real rtnetlink and uevents as the exporter sees them: each event shows in a scrape in time."""

from __future__ import annotations

from typing import Any

import pytest

from tests.kernel.conftest import scenario_result
from tests.kernel.vm import RunReport

pytestmark = pytest.mark.kernel

# Budget under TCG emulation with 1 s polls (KVM is far faster): event to scrape.
BUDGET_S = {"address_deleted": 10.0, "carrier_lost": 15.0, "device_removed": 15.0}


@pytest.fixture(scope="module")
def events(kernel_lab: RunReport) -> dict[str, Any]:
    result: dict[str, Any] = scenario_result(kernel_lab, "events")
    return result


@pytest.mark.parametrize("what", sorted(BUDGET_S))
def test_event_reaches_a_scrape_in_time(what: str, events: dict[str, Any]) -> None:
    figure = events["figures"][what]
    print(f"{what}: sysfs {figure['sysfs_s']} s, scrape {figure['scrape_s']} s")
    assert figure["scrape_s"] <= BUDGET_S[what], figure


def test_serve_survived_the_events(events: dict[str, Any]) -> None:
    assert events["serve_exit"] == 0, events["serve_log"]
    assert "Traceback" not in events["serve_log"], events["serve_log"]


def test_device_removal_is_not_reported_as_unreadable_attributes(events: dict[str, Any]) -> None:
    """A removed device's held files answer ENODEV: that is the removal, not a driver fault to warn about."""
    noise = [
        line
        for line in events["serve_log"].splitlines()
        if "attribute unreadable" in line and "device=rxe0" in line and "reason=ENODEV" in line
    ]
    assert noise == [], f"{len(noise)} warning(s) on removal, e.g. {noise[0]}"
