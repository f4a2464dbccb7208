"""Address churn (issue 14.10): what is expected per port is bounded, NCCL's addresses first."""

from __future__ import annotations

from pathlib import Path

from rnic_exporter.detect.expected import MAX_EXPECTED_PER_PORT
from rnic_exporter.detect.inputs import Inputs
from rnic_exporter.detect.state import StateStore
from rnic_exporter.sim import SimHost
from tests.support.detect import Run, names


class Addr:
    def __init__(self, address: str, family: str = "ipv4", flags: int = 0) -> None:
        self.address, self.family, self.flags = address, family, flags


def test_deleting_4000_secondary_addresses_pages_a_bounded_number_of_times(sim_host: SimHost, tmp_path: Path) -> None:
    primary = Addr("10.0.0.1")  # has the RoCE v2 GID NCCL picks (index 3)
    secondaries = tuple(Addr(f"10.9.{i // 250}.{i % 250 + 1}") for i in range(4000))
    run = Run(sim_host, tmp_path / "state")
    run.poll(Inputs(addresses={"ens1f0np0": (*secondaries, primary)}))
    run.poll(Inputs(addresses={"ens1f0np0": (*secondaries, primary)}))
    view = run.detector.last.ports[("mlx5_0", 1)] if run.detector.last else None
    assert view is not None and len(view.expected) == MAX_EXPECTED_PER_PORT
    assert view.expected["10.0.0.1"] is True  # NCCL's address is always among them
    remembered = StateStore(tmp_path / "state").load().state.addresses["mlx5_0/1"]
    assert len(remembered) == MAX_EXPECTED_PER_PORT  # the state file is bounded too
    assert (tmp_path / "state/state.json").stat().st_size < 20_000

    events = run.poll(Inputs(addresses={"ens1f0np0": (primary,)}))  # all 4,000 deleted at once
    lost = [e for e in events if e.name == "rnic.address.lost"]
    assert 0 < len(lost) <= MAX_EXPECTED_PER_PORT - 1
    assert "10.0.0.1" not in {e.attributes["address"] for e in lost}

    # Losing NCCL's address itself is still seen, however many others went.
    events = run.poll(Inputs(addresses={"ens1f0np0": secondaries}))
    assert "rnic.address.lost" in names(events)
    assert any(e.attributes["address"] == "10.0.0.1" for e in events if e.name == "rnic.address.lost")
