"""The simulator's sysfs root as the tests hold it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from rnic_exporter.sim.sysfs_root import SimSysfsRoot
from rnic_exporter.sources.reader import HostReader
from rnic_exporter.sources.sysfs import SysfsRoot


def refresh_overlay(root: SysfsRoot, overlay: Mapping[str, int]) -> None:
    """Give a simulated root kept across changes of its host the host's errno overlay as it is now
    (`SimHost.errno_overlay` is a copy, not a view)."""
    assert isinstance(root, SimSysfsRoot), f"{root!r} is not the simulator's root"
    root.errno_overlay = overlay


class GidTableCounter(SimSysfsRoot):
    """The simulator's root, counting whole GID-table reads: each lists a port's `gids/` (a watched
    slot or a sweep reads single slots and never lists it)."""

    def __init__(
        self, mount: Path | str, *, hold_fds: bool = False, errno_overlay: Mapping[str, int] | None = None
    ) -> None:
        super().__init__(mount, hold_fds=hold_fds, errno_overlay=errno_overlay)
        self.whole_gid_reads = 0

    def listdir(self, rel: str) -> list[str]:
        if rel.endswith("/gids"):
            self.whole_gid_reads += 1
        return super().listdir(rel)


def whole_gid_reads(reader: HostReader) -> int:
    """Whole GID tables `reader` has read so far (its root must be a `GidTableCounter`)."""
    root = reader.root
    assert isinstance(root, GidTableCounter), f"{root!r} does not count GID-table reads"
    return root.whole_gid_reads
