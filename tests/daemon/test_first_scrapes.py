"""The scrapes around start-up: none may be served as whole when it is not (an empty page, or
devices without their counters said to be fresh). The end-to-end race is in
tests/e2e/test_serve_e2e.py; these pin each cause on its own, deterministically."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.daemon.agent import Agent, ServeConfig
from rnic_exporter.errors import NotReadyError
from rnic_exporter.sim import SimHost
from rnic_exporter.sinks.prometheus import CounterView, PrometheusSink
from rnic_exporter.sources.sysfs import SysfsRoot
from tests.support.agents import publish
from tests.support.exposition import samples

pytestmark = pytest.mark.sim_host(infiniband=0, gid_table_size=8)

STALE: tuple[str, frozenset[tuple[str, str]]] = (catalog.COUNTERS_STALE.name, frozenset())


def _agent(host: SimHost) -> Agent:
    return Agent(
        ServeConfig(sysfs=host.root, state_dir=None, watch_netlink=False, watch_udev=False),
        SysfsRoot(host.root, hold_fds=True),
    )


def _counted_devices(text: str) -> set[str]:
    return {
        dict(labels)["device"] for name, labels in samples(text) if name == "rnic_port_data_transmitted_bytes_total"
    }


def test_a_scrape_before_the_first_poll_waits_for_it(host: SimHost) -> None:
    agent = _agent(host)
    try:
        pages: list[bytes] = []
        scrape = threading.Thread(target=lambda: pages.append(agent.prometheus.render(None, None)[0]))
        scrape.start()
        agent.poll_once()
        scrape.join(timeout=10)
        (page,) = pages
        assert _counted_devices(page.decode()) == {"mlx5_0", "mlx5_1"}
        assert samples(page.decode())[STALE] == 0
    finally:
        agent.close()


def test_a_scrape_with_no_poll_in_its_wait_is_refused_not_served_empty(host: SimHost) -> None:
    agent = _agent(host)
    agent.prometheus.wait_s = 0.05
    try:
        with pytest.raises(NotReadyError, match="no poll has completed yet"):
            agent.prometheus.render(None, "gzip")
    finally:
        agent.close()


def test_a_counter_pass_from_before_the_poll_does_not_stand_in_for_one_after(host: SimHost) -> None:
    """The start-up race, step by step: a scrape's pass before any device was listed covered none;
    it is young (under a second), but it must not be reused once the poll has listed devices."""
    agent = _agent(host)
    try:
        assert agent.counter_view(5).groups == {}  # the pass a too-early scrape started
        agent.poll_once()
        page = agent.prometheus.render(None, None)[0].decode()
        assert _counted_devices(page) == {"mlx5_0", "mlx5_1"} and samples(page)[STALE] == 0
        passes = agent._counter_pass.passes
        agent.prometheus.render(None, None)
        assert agent._counter_pass.passes == passes  # the same scope: the young pass is reused
    finally:
        agent.close()


def test_counter_groups_missing_from_a_view_are_served_as_stale(host: SimHost) -> None:
    """Whatever the cause (a device's first pass not done, a read stuck since start), a page that
    lacks a published device's counters must not say its counters are fresh."""
    agent = _agent(host)
    try:
        agent.poll_once()

        def without_mlx5_1(wait_s: float | None) -> CounterView:
            view = agent.counter_view(wait_s)
            groups = {key: group for key, group in view.groups.items() if key[0] != "mlx5_1"}
            return replace(view, groups=groups)

        sink = PrometheusSink(without_mlx5_1)
        assert agent.last is not None
        publish(sink, agent.last, agent.stats())
        page = sink.render(None, None)[0].decode()
        assert _counted_devices(page) == {"mlx5_0"} and samples(page)[STALE] == 1
    finally:
        agent.close()
