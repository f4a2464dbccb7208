"""A NIC left out by the device filter is not a lost one, and a `device` link healed after
discovery is the same device, not a phantom that pages for ever (issue 33, items 1 and 2)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from rnic_exporter.catalog import events as ev
from rnic_exporter.detect.conditions import judge
from rnic_exporter.detect.problems import find_problems
from rnic_exporter.detect.settings import DetectionSettings
from rnic_exporter.detect.state import (
    STATE_FILE,
    StateStore,
)
from rnic_exporter.sim import SimHost
from rnic_exporter.sources.reader import ReaderSettings
from tests.support.detector import Daemon, read

EXCLUDE_MLX5_1 = ReaderSettings(device_exclude=re.compile("^mlx5_1$"))


# -- item 1: a NIC left out by the device filter ----------------------------------------------


def test_excluding_a_nic_by_reload_is_not_a_disappearance_and_keeps_the_other_baselines(
    sim_host: SimHost, tmp_path: Path
) -> None:
    daemon = Daemon(sim_host, tmp_path / "state")
    assert daemon.poll() == ["rnic.device.discovered"] * 3
    daemon.settings = EXCLUDE_MLX5_1  # what a SIGHUP with device_exclude does to the reader
    assert ev.DEVICE_DISAPPEARED.name not in daemon.poll()
    last = daemon.detector.last
    assert last is not None
    assert all(d.present for d in last.devices.values()), last.devices
    state = StateStore(tmp_path / "state").load().state
    assert sorted(d.name for d in state.devices.values()) == ["mlx5_0", "mlx5_2"]
    assert {"mlx5_0/1", "mlx5_2/1"} <= set(state.baselines)  # the others' baselines are kept


def test_excluding_a_nic_by_restart_neither_pages_nor_fails_check(sim_host: SimHost, tmp_path: Path) -> None:
    assert Daemon(sim_host, tmp_path / "state").poll() == ["rnic.device.discovered"] * 3
    snap = read(sim_host, EXCLUDE_MLX5_1)
    # `check` after the restart: the inventory on disk still lists mlx5_1.
    cur = judge(snap, StateStore(tmp_path / "state").load().state, DetectionSettings())
    assert [p.code for p in find_problems(cur) if p.code == "device_missing"] == []
    restarted = Daemon(sim_host, tmp_path / "state", EXCLUDE_MLX5_1)
    assert ev.DEVICE_DISAPPEARED.name not in restarted.poll()
    again = Daemon(sim_host, tmp_path / "state", EXCLUDE_MLX5_1)
    assert again.poll() == []
    assert again.detector.last is not None and again.detector.last.present_devices == 2
    # Monitored again: it is back in the inventory, with the baseline it had.
    included = Daemon(sim_host, tmp_path / "state")
    assert included.poll() == ["rnic.device.discovered"]
    assert "mlx5_1/1" in StateStore(tmp_path / "state").load().state.baselines


# -- item 2: a `device` link missing at discovery ---------------------------------------------


def test_a_device_link_healed_after_discovery_is_the_same_device_not_a_phantom(
    sim_host: SimHost, tmp_path: Path
) -> None:
    link = sim_host.root / "class/infiniband/mlx5_1/device"
    target = os.readlink(link)
    link.unlink()  # not there yet when the device is first read: known by its node GUID
    daemon = Daemon(sim_host, tmp_path / "state")
    assert daemon.poll() == ["rnic.device.discovered"] * 3
    assert any(k.startswith("guid:") for k in daemon.detector.state.devices)
    link.symlink_to(target)
    assert daemon.poll() == []  # neither "disappeared" (the GUID entry) nor "discovered" (the PCI one)
    keys = sorted(StateStore(tmp_path / "state").load().state.devices)
    assert keys == ["0000:11:00.0", "0000:19:00.0", "0000:21:00.0"], keys
    restarted = Daemon(sim_host, tmp_path / "state")
    assert restarted.poll() == []
    link.unlink()  # failing again later: still the entry under its PCI address
    assert restarted.poll() == []
    assert sorted(restarted.detector.state.devices) == keys


def test_a_phantom_left_by_an_older_version_is_retired(sim_host: SimHost, tmp_path: Path) -> None:
    assert Daemon(sim_host, tmp_path / "state").poll() == ["rnic.device.discovered"] * 3
    path = tmp_path / "state" / STATE_FILE
    data = json.loads(path.read_text())
    entry = dict(data["devices"]["0000:19:00.0"], pci_address=None)
    data["devices"][f"guid:{entry['node_guid']}"] = entry
    path.write_text(json.dumps(data))
    daemon = Daemon(sim_host, tmp_path / "state")
    assert daemon.poll() == []
    assert not any(k.startswith("guid:") for k in StateStore(tmp_path / "state").load().state.devices)
