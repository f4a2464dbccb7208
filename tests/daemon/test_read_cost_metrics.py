"""What the exporter's reads cost the NIC, as it serves it: rnic_exporter_reads_total{device,kind}
counts the files each scrape's counter pass read (the PMA error counters on their slow timer), and
rnic_exporter_read_path_info says how each device's hw counters are read (a simulated tree: sysfs,
with no kernel behind it to ask)."""

from __future__ import annotations

import pytest

from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.daemon.agent import Agent, ServeConfig
from rnic_exporter.sim import SimHost
from rnic_exporter.sources.counters import RATE_PMA
from rnic_exporter.sources.sysfs import SysfsRoot
from tests.support.exposition import value
from tests.support.wait import wait_for

pytestmark = pytest.mark.sim_host(infiniband=1, gid_table_size=8)


def test_each_scrape_counts_the_files_its_counter_pass_read(host: SimHost) -> None:
    agent = Agent(
        ServeConfig(sysfs=host.root, state_dir=None, watch_netlink=False, watch_udev=False),
        SysfsRoot(host.root, hold_fds=True),
    )
    try:
        agent.poll_once()
        plans = dict(agent.reader.counter_plans())
        first = agent.prometheus.render(None, None)[0]
        (device0,) = [d for d in plans if d.endswith("_0")]

        def next_pass() -> bytes | None:
            """A scrape that ran a counter pass of its own (one under a second old is reused)."""
            page = agent.prometheus.render(None, None)[0]
            moved = value(page, catalog.READS.name, device=device0, kind="hw_counters_file")
            return page if moved != value(first, catalog.READS.name, device=device0, kind="hw_counters_file") else None

        second = wait_for(next_pass, timeout=10, what="a scrape with a counter pass of its own")
        for device, plan in plans.items():
            assert plan is not None
            # The hw counters every scrape; of the PMA files only those rates are drawn from: the
            # error counters wait for their 60 s timer (read by the first pass, served since).
            per_kind = {
                "pma_file": sum(
                    len([n for n in g.names if n in RATE_PMA]) for g in plan.groups if g.kind == "counters"
                ),
                "hw_counters_file": sum(len(g.names) for g in plan.groups if g.kind == "hw"),
            }
            assert per_kind["pma_file"] == 5 * len([g for g in plan.groups if g.kind == "counters"])
            for kind, files in per_kind.items():
                assert files > 0
                before = value(first, catalog.READS.name, device=device, kind=kind)
                after = value(second, catalog.READS.name, device=device, kind=kind)
                assert before is not None and after is not None, (device, kind)
                assert after - before == files, (device, kind)  # one pass between the two
            assert value(first, catalog.READS.name, device=device, kind="netlink_stat") is None
            info = value(first, catalog.READ_PATH.name, device=device, path="sysfs", reason="not_live_sysfs")
            assert info == 1
    finally:
        agent.close()
