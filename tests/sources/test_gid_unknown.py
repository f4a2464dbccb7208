"""A briefly unreadable GID slot is unknown, not empty (issue 14.8): no change alerts on break and heal."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.daemon.agent import Agent, ServeConfig
from rnic_exporter.detect.settings import DetectionSettings
from rnic_exporter.sim import SimHost
from rnic_exporter.sim.sysfs_root import SimSysfsRoot
from rnic_exporter.sources import gids
from tests.support.agent import series
from tests.support.sim import refresh_overlay

PORT = {"device": "mlx5_0", "port": "1"}


def _events(agent: Agent, event: str) -> float | None:
    return series(agent, catalog.EVENTS.name, event=event, **PORT)


@pytest.mark.parametrize("file", ["gids/3", "gid_attrs/types/3", "gid_attrs/ndevs/3"])
@pytest.mark.parametrize("code", [errno.EIO, errno.EAGAIN])
def test_an_unreadable_slot_keeps_the_hash_and_the_nccl_pick(tmp_path: Path, file: str, code: int) -> None:
    host = SimHost.build(tmp_path / "sys", roce=2, infiniband=0, gid_table_size=16)
    config = ServeConfig(
        sysfs=host.root,
        state_dir=None,
        detection=DetectionSettings(),
        watch_netlink=False,
        watch_udev=False,
        ethtool=False,
    )
    agent = Agent(config, SimSysfsRoot(host.root, hold_fds=True, errno_overlay=host.errno_overlay))
    try:
        agent.poll_once(full_gid_tables=True)
        hash_before = series(agent, catalog.GID_TABLE_HASH.name, **PORT)
        assert series(agent, catalog.NCCL_GID_INDEX.name, **PORT) == 3  # 10.0.0.1's RoCE v2 GID
        for full in (False, True):  # the watched-slot path and a whole-table read
            host.fail_with(f"class/infiniband/mlx5_0/ports/1/{file}", code)
            refresh_overlay(agent.reader.root, host.errno_overlay)
            agent.poll_once(full_gid_tables=full)
            assert (
                series(agent, catalog.ATTRIBUTE_UNAVAILABLE.name, **PORT, attribute=file, reason=errno.errorcode[code])
                == 1
            )  # said, not hidden
            assert series(agent, catalog.GID_TABLE_HASH.name, **PORT) == hash_before
            assert series(agent, catalog.NCCL_GID_INDEX.name, **PORT) == 3
            table = agent.reader._devices["mlx5_0"].gids[1]
            assert table.partly_unreadable and table.unreadable == (3,)
            host.heal()
            refresh_overlay(agent.reader.root, host.errno_overlay)
            agent.poll_once(full_gid_tables=full)
            assert series(agent, catalog.GID_TABLE_HASH.name, **PORT) == hash_before
        assert _events(agent, "rnic.gid.table_changed") == 0
        assert _events(agent, "rnic.nccl.gid_index_changed") == 0
    finally:
        agent.close()


def test_a_first_read_with_an_unreadable_slot_knows_nothing_of_it(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=1, infiniband=0, gid_table_size=16)
    host.fail_with("class/infiniband/mlx5_0/ports/1/gids/3", errno.EIO)
    root = SimSysfsRoot(host.root, errno_overlay=host.errno_overlay)
    table = gids.read_gid_table(root, "class/infiniband/mlx5_0/ports/1", "mlx5_0", 1)
    assert table.unreadable == (3,) and 3 not in [e.index for e in table.entries]
    again = gids.read_gid_table(root, "class/infiniband/mlx5_0/ports/1", "mlx5_0", 1, previous=table)
    assert again.entries == table.entries  # nothing known is invented
