"""What the agent tells the poll schedule after a poll: the reader's next due read (an all-RoCE
host trusting netlink sleeps until its PCIe links are due) or None (read every interval), and its
health allows for that sleep."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rnic_exporter.config.serve import ServeConfig
from rnic_exporter.daemon.agent import Agent
from rnic_exporter.sim import SimHost
from rnic_exporter.sim.sysfs_root import SimSysfsRoot
from tests.support.agents import Announcements


def agent_of(host: SimHost, tmp_path: Path, trusted: bool) -> Agent:
    config = ServeConfig(sysfs=host.root, state_dir=tmp_path, watch_netlink=False, watch_udev=False)
    root = SimSysfsRoot(host.root, hold_fds=True, errno_overlay=host.errno_overlay)
    return Agent(config, root, announcer=Announcements(trusted=trusted))


@pytest.mark.parametrize("sim_host", [{"roce": 2, "infiniband": 0}], indirect=True)
def test_an_all_roce_host_trusting_netlink_sleeps_until_its_pcie_links_are_due(
    sim_host: SimHost, tmp_path: Path
) -> None:
    agent = agent_of(sim_host, tmp_path, trusted=True)
    try:
        agent.poll_once(full_gid_tables=True)
        agent.poll_once()  # the first pass trusting events reads every tier
        due = agent.next_read_at
        assert due is not None
        assert agent.config.pcie_interval_s - 1 <= due - time.monotonic() <= agent.config.pcie_interval_s
        agent.last_poll = time.time() - 40  # asleep for longer than 3 intervals is not unhealthy
        assert agent.healthy()[0]
    finally:
        agent.close()


def test_infiniband_ports_or_distrust_read_every_interval(sim_host: SimHost, tmp_path: Path) -> None:
    for trusted in (True, False):  # mlx5_2 is InfiniBand; not trusting, every device is
        agent = agent_of(sim_host, tmp_path / str(trusted), trusted=trusted)
        try:
            agent.poll_once(full_gid_tables=True)
            agent.poll_once()
            assert agent.next_read_at is None
            agent.last_poll = time.time() - 40
            assert not agent.healthy()[0]
        finally:
            agent.close()
