"""A detector over a simulated host polled by hand, and the names of the events it emitted."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rnic_exporter.catalog.events import Event
from rnic_exporter.detect.detector import Detector
from rnic_exporter.detect.inputs import Inputs
from rnic_exporter.detect.settings import DetectionSettings
from rnic_exporter.detect.state import StateStore
from rnic_exporter.model.host import Snapshot
from rnic_exporter.sim import SimHost
from rnic_exporter.sim.sysfs_root import SimSysfsRoot
from rnic_exporter.sources.reader import HostReader


def read_full(host: SimHost) -> Snapshot:
    root = SimSysfsRoot(host.root, errno_overlay=host.errno_overlay)
    try:
        return HostReader(root).read(full_gid_tables=True)
    finally:
        root.close()


class Run:
    """A detector over a simulated host, polled by hand; keeps every event it emitted."""

    def __init__(self, host: SimHost, state_dir: Path | None = None, settings: DetectionSettings | None = None) -> None:
        self.host = host
        self.detector = Detector(settings or DetectionSettings(), StateStore(state_dir))
        self.clock = 1_000_000.0

    def poll(self, inputs: Inputs | None = None, advance: float = 5.0) -> list[Event]:
        self.clock += advance
        snap = replace(read_full(self.host), taken_at=self.clock)
        return self.detector.observe(snap, inputs)


def names(events: list[Event]) -> list[str]:
    return sorted(e.name for e in events)


def only(events: list[Event], name: str) -> Event:
    found = [e for e in events if e.name == name]
    assert len(found) == 1, f"expected one {name}, got {names(events)}"
    return found[0]
