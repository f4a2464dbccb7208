"""Reference cycles: none made on the poll and scrape paths, and those that come are collected.

A cycle that outlives the young generations (an object kept across a poll) is freed only by a
full collection, and CPython runs those rarely: memory held meanwhile showed as an RSS rise of
~3 MB an hour in the soak (bench/soak.py --memtrace-census counts what the collector finds).
"""

from __future__ import annotations

import collections
import gc
import subprocess
import sys
from pathlib import Path

from rnic_exporter.daemon.agent import Agent, ServeConfig
from rnic_exporter.sim import SimHost
from rnic_exporter.sources.sysfs import SysfsRoot


def test_a_churning_host_leaves_no_garbage_for_the_collector(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=6, infiniband=2, gid_table_size=16)
    agent = Agent(
        ServeConfig(sysfs=host.root, state_dir=tmp_path / "state", ethtool=False),
        root=SysfsRoot(host.root, hold_fds=True),
    )
    try:
        for _ in range(3):  # caches filled, first-time work done
            agent.poll_once()
            agent.prometheus.render(None, None)
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for i in range(30):  # what the soak does: traffic, flaps, GID shifts, a NIC gone and back
                host.add_traffic(1.0)
                step = i % 10
                if step in (3, 5):
                    host.set_port_up("mlx5_1", step == 5)
                elif step == 7:
                    host.gid_shift("mlx5_2")
                elif step == 8:
                    host.release_gids("mlx5_2")
                elif step == 9:
                    host.remove_device("mlx5_3")
                elif step == 1 and i > 1:
                    host.restore_device("mlx5_3")
                agent.poll_once(full_gid_tables=step == 0)
                agent.prometheus.render(None, None)
                agent.prometheus.render("application/openmetrics-text; version=1.0.0", "gzip")
            gc.collect()
            garbage = collections.Counter(type(o).__qualname__ for o in gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    finally:
        agent.close()
    assert agent.detector.events, "the churn raised no event: it exercised nothing"
    assert not garbage, f"reference cycles made per poll or scrape: {garbage.most_common(8)}"


_AFTER_FREEZE = """
import gc
from rnic_exporter.daemon.runtime import freeze_start_up_objects
start_up = [[i] for i in range(300_000)]  # modules, classes, config: frozen
freeze_start_up_objects()
full = gc.get_stats()[2]["collections"]
kept = []
for _ in range(200_000):
    cycle = {}
    cycle["self"] = cycle
    kept.append(cycle)  # kept across a few young collections, as across a poll
    if len(kept) > 2000:
        kept.pop(0)
print(gc.get_stats()[2]["collections"] - full)
"""


def test_cycles_that_outlive_the_young_generations_are_collected_after_the_freeze() -> None:
    # In a process of its own: gc.freeze() is for the life of the process.
    out = subprocess.run([sys.executable, "-c", _AFTER_FREEZE], capture_output=True, text=True, check=True)
    assert int(out.stdout) >= 1, "no full collection: what the freeze left behind is never collected"
