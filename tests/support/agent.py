"""An agent on a simulated host, built in-process as `serve` builds it, without netlink or udev, and what it serves."""

from __future__ import annotations

from pathlib import Path

from rnic_exporter.daemon.agent import Agent, ServeConfig
from rnic_exporter.detect.settings import DetectionSettings
from rnic_exporter.sim import SimHost
from rnic_exporter.sim.sysfs_root import SimSysfsRoot
from rnic_exporter.sources.reader import ReaderSettings
from tests.support.exposition import Samples, samples


def make_agent(
    host: SimHost, state_dir: Path, detection: DetectionSettings | None = None, reader: ReaderSettings | None = None
) -> Agent:
    config = ServeConfig(
        sysfs=host.root,
        state_dir=state_dir,
        detection=detection or DetectionSettings(),
        watch_netlink=False,
        watch_udev=False,
        reader=reader or ReaderSettings(),
    )
    return Agent(config, SimSysfsRoot(host.root, hold_fds=True, errno_overlay=host.errno_overlay))


def metrics(agent: Agent) -> Samples:
    """Every sample of the agent's text exposition, as a scrape gets it now."""
    body, _ = agent.prometheus.render(None, None)
    return samples(body.decode())


def series(agent: Agent, name: str, **labels: str) -> float | None:
    """The value of the sample `name` with exactly `labels`, or None."""
    return metrics(agent).get((name, frozenset(labels.items())))
