"""The simulator's sysfs root as the tests hold it."""

from __future__ import annotations

from collections.abc import Mapping

from rnic_exporter.sim.sysfs_root import SimSysfsRoot
from rnic_exporter.sources.sysfs import SysfsRoot


def refresh_overlay(root: SysfsRoot, overlay: Mapping[str, int]) -> None:
    """Give a simulated root kept across changes of its host the host's errno overlay as it is now
    (`SimHost.errno_overlay` is a copy, not a view)."""
    assert isinstance(root, SimSysfsRoot), f"{root!r} is not the simulator's root"
    root.errno_overlay = overlay
