"""A detector over a simulated host on the real clock, as the daemon runs it: restartable over
the same state directory, with the reader's device filter of the moment."""

from __future__ import annotations

from pathlib import Path

from rnic_exporter.detect.detector import Detector
from rnic_exporter.detect.settings import DetectionSettings
from rnic_exporter.detect.state import StateStore
from rnic_exporter.model.host import Snapshot
from rnic_exporter.sim import SimHost
from rnic_exporter.sim.sysfs_root import SimSysfsRoot
from rnic_exporter.sources.reader import HostReader, ReaderSettings


def read(host: SimHost, settings: ReaderSettings | None = None) -> Snapshot:
    """One full read of the simulated host through the real reading layer."""
    root = SimSysfsRoot(host.root, errno_overlay=host.errno_overlay)
    try:
        return HostReader(root, settings).read(full_gid_tables=True)
    finally:
        root.close()


class Daemon:
    """The detector of one daemon's life; a new one over the same directory is a restart."""

    def __init__(self, host: SimHost, state_dir: Path, settings: ReaderSettings | None = None) -> None:
        self.host, self.state_dir, self.settings = host, state_dir, settings
        self.detector = Detector(DetectionSettings(), StateStore(state_dir))

    def poll(self) -> list[str]:
        """The names of the events of one poll, sorted."""
        return sorted(e.name for e in self.detector.observe(read(self.host, self.settings)))
