"""The series budget (issue 16): one saturation gauge per port, event counters only for events a port
can raise, and counter files a collector filter leaves out never read."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.daemon.agent import Agent, ServeConfig
from rnic_exporter.detect.settings import DetectionSettings
from rnic_exporter.sim import SimHost
from rnic_exporter.sim.sysfs_root import SimSysfsRoot
from rnic_exporter.sinks.detection import PORT_EVENT_RULES, PORT_EVENTS
from rnic_exporter.sources.infiniband import counter_ceiling
from tests.support.agent import make_agent
from tests.support.agent import metrics as scrape
from tests.support.exposition import Samples
from tests.support.wait import wait_for

ROCE = {"device": "mlx5_0", "port": "1"}
IB = {"device": "mlx5_1", "port": "1"}


def events_of(got: Samples, device: str, port: str) -> dict[str, float]:
    return {
        dict(labels)["event"]: value
        for (name, labels), value in got.items()
        if name == catalog.EVENTS.name and dict(labels)["device"] == device and dict(labels)["port"] == port
    }


def scrape_after_poll(agent: Agent) -> Samples:
    agent.poll_once()
    return scrape(agent)


def test_every_port_event_has_a_rule_saying_which_ports_raise_it() -> None:
    named = [spec.name for rule in PORT_EVENT_RULES for spec in rule]
    assert sorted(named) == sorted(PORT_EVENTS)  # each exactly once


def test_event_counters_exist_only_for_events_the_port_can_raise(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=1, infiniband=1, gid_table_size=16)
    agent = make_agent(host, tmp_path / "state")
    agent.poll_once(full_gid_tables=True)
    got = scrape(agent)
    common = {
        "rnic.gid.table_changed",
        "rnic.port.down",
        "rnic.port.up",
        "rnic.port.flapping",
        "rnic.port.stable",
        "rnic.link.below_rated",
        "rnic.link.restored",
        "rnic.address.lost",  # both ports have a netdev (the IB one IPoIB)
        "rnic.address.restored",
        "rnic.port.degrading",  # link health: any port whose counters are read (daemon/link_watch.py)
        "rnic.port.recovered",
    }
    roce_only = {
        "rnic.gid.address_moved",
        "rnic.nccl.gid_index_changed",
        "rnic.nccl.gid_unusable",
        "rnic.nccl.gid_usable",
        "rnic.risk.address_loss",
    }
    assert events_of(got, **ROCE) == dict.fromkeys(common | roce_only, 0)
    assert events_of(got, **IB) == dict.fromkeys(common, 0)  # no NCCL or GID-move events on InfiniBand
    # The first poll added the device to the inventory (counted from 1: no zero can precede it).
    assert events_of(got, "mlx5_1", "") == {
        "rnic.device.disappeared": 0,
        "rnic.device.reappeared": 0,
        "rnic.device.discovered": 1,
    }
    restarted = make_agent(host, tmp_path / "state")  # the device is in the persisted inventory now
    assert events_of(scrape_after_poll(restarted), "mlx5_1", "") == {
        "rnic.device.disappeared": 0,
        "rnic.device.reappeared": 0,
    }
    restarted.close()

    host.set_port_up("mlx5_1", False)
    agent.poll_once()
    assert events_of(scrape(agent), **IB)["rnic.port.down"] == 1  # from 0: increase() sees it


def test_a_configured_nccl_index_adds_its_counters_on_roce_ports_only(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=1, infiniband=1, gid_table_size=16)
    agent = make_agent(host, tmp_path / "state", DetectionSettings(nccl_gid_index=3))
    agent.poll_once(full_gid_tables=True)
    got = scrape(agent)
    configured = {"rnic.nccl.gid_index_invalid", "rnic.nccl.gid_index_valid"}
    assert configured <= set(events_of(got, **ROCE))
    assert not configured & set(events_of(got, **IB))


def _stick(host: SimHost, device: str, counter: str) -> None:
    """Leave a PMA counter at its ceiling, as a real port's counter saturates."""
    dev = host.device(device)
    dev.counters[counter] = counter_ceiling(counter, dev.counters)
    (host.root / "class/infiniband" / device / "ports/1/counters" / counter).write_text(f"{dev.counters[counter]}\n")


def test_saturation_is_one_gauge_per_port_counting_its_stuck_counters(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=1, infiniband=1, gid_table_size=16)
    agent = make_agent(host, tmp_path / "state")
    # Every PMA file every scrape: the error counters' slow timer is not what this is about.
    agent.reader.settings = replace(agent.reader.settings, pma_slow_s=0)
    agent.poll_once(full_gid_tables=True)
    name = catalog.PORT_PMA_SATURATED.name

    def saturated(got: Samples) -> dict[tuple[str, str], float]:
        return {
            (dict(labels)["device"], dict(labels)["port"]): value for (n, labels), value in got.items() if n == name
        }

    def expect(roce: int, ib: int) -> None:
        # A scrape reuses a counter pass under a second old: wait for one that read the change.
        want = {("mlx5_0", "1"): roce, ("mlx5_1", "1"): ib}
        wait_for(lambda: saturated(scrape(agent)) == want, timeout=10, what=f"{name} {want}")

    expect(0, 0)  # one series per port, not one per counter
    _stick(host, "mlx5_0", "symbol_error")
    expect(1, 0)
    _stick(host, "mlx5_0", "port_xmit_wait")
    _stick(host, "mlx5_1", "link_downed")
    expect(2, 1)
    (host.root / "class/infiniband/mlx5_0/ports/1/counters/symbol_error").write_text("0\n")  # perfquery -R
    expect(1, 1)


def _hw_series(got: Samples) -> set[tuple[str, str]]:
    """(device or device/port, counter) of every driver counter series."""
    out = set()
    for name, labels in got:
        d = dict(labels)
        if name == catalog.PORT_HW_STAT.name:
            out.add((f"{d['device']}/{d['port']}", d["counter"]))
        elif name == catalog.DEVICE_HW_STAT.name:
            out.add((d["device"], d["counter"]))
    return out


def test_excluded_hw_counters_are_never_read(tmp_path: Path) -> None:
    from rnic_exporter.config.file import reader_settings
    from rnic_exporter.sources.counter_filter import CounterFilter

    host = SimHost.build(tmp_path / "sys", roce=1, gid_table_size=16)
    overlay = host.errno_overlay
    # A read of an excluded file would fail loudly (EIO: an error series and a read error).
    overlay["class/infiniband/mlx5_0/ports/1/hw_counters/rx_write_requests"] = 5
    counters = CounterFilter.build(hw_include="np_.*|rp_.*|out_of_sequence", hw_exclude="rp_cnp_ignored")
    config = ServeConfig(
        sysfs=host.root,
        state_dir=tmp_path / "state",
        reader=reader_settings(counters=counters),
        watch_netlink=False,
        watch_udev=False,
    )
    agent = Agent(config, SimSysfsRoot(host.root, hold_fds=True, errno_overlay=overlay))
    agent.poll_once(full_gid_tables=True)
    got = scrape(agent)
    # Anchored like node_exporter's filters: `np_.*` is the np_ family, `out_of_sequence` that one file.
    assert _hw_series(got) == {
        ("mlx5_0/1", "np_cnp_sent"),
        ("mlx5_0/1", "np_ecn_marked_roce_packets"),
        ("mlx5_0/1", "rp_cnp_handled"),
        ("mlx5_0/1", "out_of_sequence"),
    }
    ((_, plan),) = agent.reader.counter_plans()
    assert plan is not None
    kept = tuple(f"/hw_counters/{counter}" for _, counter in _hw_series(got))
    assert [rel for rel in plan.rels if "/hw_counters/" in rel and not rel.endswith(kept)] == []
    assert not [key for key in got if key[0] == catalog.ATTRIBUTE_UNAVAILABLE.name]
    assert sum(1 for key in got if key[0] == catalog.PORT_PMA.name) == 17  # counters/ are read whatever the filter

    # A reload with the collector off: learned again, and no driver counter is read any more.
    agent.reader.settings = reader_settings(counters=CounterFilter.build(hw_counters=False))
    agent.poll_once(full_gid_tables=True)
    wait_for(lambda: not _hw_series(scrape(agent)), timeout=10, what="no driver counter series after the reload")
    ((_, plan),) = agent.reader.counter_plans()
    assert plan is not None and not [rel for rel in plan.rels if "/hw_counters/" in rel]


def test_counter_filters_from_the_file_lose_to_the_flags(tmp_path: Path) -> None:
    from rnic_exporter.config import file as config
    from rnic_exporter.errors import ConfigError
    from rnic_exporter.sources.counter_filter import CounterFilter

    path = tmp_path / "rnic.toml"
    path.write_text('[collector.hw_counters]\nenabled = true\ninclude = "np_.*"\nexclude = "np_cnp_sent"\n')
    from_file = config.resolve(path).reader.counters
    assert (from_file.hw_include and from_file.hw_include.pattern, from_file.hw_exclude is not None) == ("np_.*", True)
    assert from_file.wants("hw", "np_ecn_marked_roce_packets") and not from_file.wants("hw", "np_cnp_sent")
    flags = CounterFilter.build(hw_include="rp_.*")
    resolved = config.resolve(path, counters=flags, explicit={"hw_counters_include"}).reader.counters
    assert resolved.wants("hw", "rp_cnp_handled") and not resolved.wants("hw", "np_ecn_marked_roce_packets")
    assert not resolved.wants("hw", "np_cnp_sent")  # the file's exclude still holds: no flag said otherwise

    path.write_text('[collector.hw_counters]\nenabled = "no"\ninclude = "("\n')
    try:
        config.resolve(path)
    except ConfigError as exc:
        message = str(exc)
    else:
        raise AssertionError("a bad [collector.hw_counters] table was accepted")
    assert "collector.hw_counters.enabled: expected true or false" in message
    assert "collector.hw_counters.include" in message and "\n" not in message


def test_otlp_gets_the_same_one_saturation_gauge_per_port(tmp_path: Path) -> None:
    from rnic_exporter.sinks.samples import counter_families

    host = SimHost.build(tmp_path / "sys", roce=1, gid_table_size=16)
    _stick(host, "mlx5_0", "symbol_error")
    _stick(host, "mlx5_0", "VL15_dropped")
    agent = make_agent(host, tmp_path / "state")
    agent.poll_once(full_gid_tables=True)
    scrape(agent)  # a counter pass
    groups = [(device, group) for device, plan in agent.reader.counter_plans() if plan for group in plan.groups]
    families = {family.spec.name: family.samples for family in counter_families(groups)}
    assert families[catalog.PORT_PMA_SATURATED.name] == [(("mlx5_0", "1"), 2)]
