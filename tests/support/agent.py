"""An agent on a simulated host, built in-process as `serve` builds it, without netlink or udev."""

from __future__ import annotations

from pathlib import Path

from rnic_exporter.daemon.agent import Agent, ServeConfig
from rnic_exporter.detect.settings import DetectionSettings
from rnic_exporter.sim import SimHost
from rnic_exporter.sim.sysfs_root import SimSysfsRoot


def make_agent(host: SimHost, state_dir: Path, detection: DetectionSettings | None = None) -> Agent:
    config = ServeConfig(
        sysfs=host.root,
        state_dir=state_dir,
        detection=detection or DetectionSettings(),
        watch_netlink=False,
        watch_udev=False,
    )
    return Agent(config, SimSysfsRoot(host.root, hold_fds=True, errno_overlay=host.errno_overlay))
