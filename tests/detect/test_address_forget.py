"""Addresses missing for longer than the forget period are not expected: a state file read after
days off does not page for them at start-up (issue 33, item 7)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from rnic_exporter.catalog import events as ev
from rnic_exporter.detect.conditions import judge
from rnic_exporter.detect.settings import DetectionSettings
from rnic_exporter.detect.state import (
    KnownAddress,
    State,
    StateStore,
)
from rnic_exporter.sim import SimHost
from tests.support.detector import Daemon, read

# -- item 7: addresses last seen long ago -------------------------------------------------------


def test_addresses_gone_longer_than_the_forget_period_do_not_page_at_start_up(
    sim_host: SimHost, tmp_path: Path
) -> None:
    assert Daemon(sim_host, tmp_path / "state").poll() == ["rnic.device.discovered"] * 3
    store = StateStore(tmp_path / "state")
    state = store.load().state
    two_days_ago = time.time() - 2 * 86400
    state.addresses["mlx5_0/1"]["10.9.9.9"] = KnownAddress("ens1f0np0", two_days_ago, None)
    state.addresses["mlx5_0/1"]["10.9.9.8"] = KnownAddress("ens1f0np0", time.time() - 3600, None)
    store.save(state)
    events = Daemon(sim_host, tmp_path / "state").detector.observe(read(sim_host))
    lost = sorted(e.attributes["address"] for e in events if e.name == ev.ADDRESS_LOST.name)
    assert lost == ["10.9.9.8"]  # an hour ago is a loss; two days ago is forgotten, not paged
    assert "10.9.9.9" not in StateStore(tmp_path / "state").load().state.addresses["mlx5_0/1"]


def test_a_state_of_the_default_clock_is_judged_on_the_snapshot_clock(sim_host: SimHost) -> None:
    """The forget period is measured on the snapshot's clock, not the wall clock of the judge."""
    snap = read(sim_host)
    state = State(addresses={"mlx5_0/1": {"10.9.9.9": KnownAddress("ens1f0np0", 1000.0, None)}})
    for taken_at, expected in ((1000.0 + 3600, True), (1000.0 + 2 * 86400, False)):
        cur = judge(replace(snap, taken_at=taken_at), state, DetectionSettings())
        assert ("10.9.9.9" in cur.ports[("mlx5_0", 1)].expected) is expected
