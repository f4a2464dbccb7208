"""An unreadable state file (EACCES, EIO, a directory in its place) is kept, not overwritten by
the next save; saving resumes once it reads, with what it held (issue 33, item 3)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from rnic_exporter.detect.detector import Detector
from rnic_exporter.detect.settings import DetectionSettings
from rnic_exporter.detect.state import (
    STATE_FILE,
    StateStore,
    decode_state,
)
from rnic_exporter.sim import SimHost
from tests.support.detector import Daemon, read

# -- item 3: an unreadable state file ---------------------------------------------------------


@pytest.mark.parametrize("code", [errno.EACCES, errno.EIO])
def test_an_unreadable_state_file_is_not_overwritten(sim_host: SimHost, tmp_path: Path, code: int) -> None:
    assert Daemon(sim_host, tmp_path / "state").poll() == ["rnic.device.discovered"] * 3
    path = tmp_path / "state" / STATE_FILE
    before = path.read_bytes()
    store = StateStore(tmp_path / "state")
    real_open = Path.open

    def failing(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self == path:  # as root, a mode of 000 does not stop reads: the error is injected
            raise OSError(code, os.strerror(code))
        return real_open(self, *args, **kwargs)

    mp = pytest.MonkeyPatch()
    mp.setattr(Path, "open", failing)
    try:
        detector = Detector(DetectionSettings(), store)
        assert detector.state_errors["unreadable"] == 1
        sim_host.set_speed("mlx5_0", 800)  # something new to learn: a save is due
        detector.observe(read(sim_host))
        detector.observe(read(sim_host))
    finally:
        mp.undo()
    assert path.read_bytes() == before
    assert detector.state_errors["unreadable"] >= 2
    detector.observe(read(sim_host))  # readable again: what it held, with what was learned meanwhile
    healed = StateStore(tmp_path / "state").load().state
    assert sorted(d.name for d in healed.devices.values()) == ["mlx5_0", "mlx5_1", "mlx5_2"]
    assert healed.devices == json_devices(before)
    assert healed.baselines["mlx5_0/1"].rate_bytes_per_second == 800e9 / 8


def json_devices(raw: bytes) -> dict[str, object]:
    return dict(decode_state(raw).devices)


def test_a_directory_in_place_of_the_state_file_is_left_alone(sim_host: SimHost, tmp_path: Path) -> None:
    (tmp_path / "state" / STATE_FILE).mkdir(parents=True)
    (tmp_path / "state" / STATE_FILE / "keep").write_text("x")
    daemon = Daemon(sim_host, tmp_path / "state")
    assert daemon.poll() == ["rnic.device.discovered"] * 3
    assert daemon.detector.state_errors["unreadable"] >= 2
    assert daemon.detector.state_errors["unwritable"] == 0
    assert (tmp_path / "state" / STATE_FILE / "keep").read_text() == "x"
