"""The wire in the daemon (issue 32): `serve` over a simulated host with a simulated wire exports the
module, FEC, pause and read-cost series of its RoCE netdevs on /metrics; a veth of our own, read by
the real ethtool netlink reader, raises nothing and counts no error; a reader that raises is counted
and never stops the daemon; --no-collector.wire builds nothing."""

from __future__ import annotations

import gc
from collections.abc import Mapping
from pathlib import Path

import pytest

from rnic_exporter.catalog import metrics as c
from rnic_exporter.catalog.events import PORT_DOWN, Event
from rnic_exporter.config.serve import ServeConfig
from rnic_exporter.daemon.agent import Agent
from rnic_exporter.daemon.runtime import GC_GEN0_THRESHOLD
from rnic_exporter.daemon.wire_watch import ERROR_OPERATIONS, RESCAN_S, WireWatch, roce_netdevs
from rnic_exporter.model.host import Snapshot
from rnic_exporter.model.wire import NetdevWire
from rnic_exporter.sim import SimHost
from rnic_exporter.sim.wire import SimEthtool, SimWire
from rnic_exporter.sinks.samples import Family, Published
from rnic_exporter.sinks.wire_samples import Netdev
from rnic_exporter.sources.ethtool_netlink import EthtoolNetlink
from rnic_exporter.sources.wire import WireReader, WireSettings
from tests.support.agent import make_agent
from tests.support.exposition import samples
from tests.support.netns import network_namespace
from tests.support.processes import free_port, http_get
from tests.support.serve import serving, sim_serve_config
from tests.support.wait import wait_for


def _series(families: list[Family]) -> dict[str, list[tuple[tuple[str, ...], float]]]:
    return {f.spec.name: list(f.samples) for f in families}


def _snapshot(host: SimHost, tmp_path: Path) -> Snapshot:
    agent = make_agent(host, tmp_path / "state")
    try:
        return agent.poll_once(full_gid_tables=True)
    finally:
        agent.close()


def test_only_roce_ports_netdevs_are_read(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=2, infiniband=1)
    netdevs = roce_netdevs(_snapshot(host, tmp_path))
    assert netdevs == {
        "ens1f0np0": ("mlx5_0", "1", "ens1f0np0"),
        "ens2f0np0": ("mlx5_1", "1", "ens2f0np0"),
    }
    assert roce_netdevs(None) == {}


def test_serve_exports_the_simulated_wire(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=2, infiniband=1, gid_table_size=16)
    wire = SimWire()
    wire.add("ens1f0np0")
    wire.add("ens2f0np0")
    wire.fec_errors("ens1f0np0", corrected=1200, uncorrectable=3)
    port = free_port()

    def scraped() -> dict[tuple[str, frozenset[tuple[str, str]]], float] | None:
        try:
            status, _, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        except OSError:
            return None
        got = samples(body.decode()) if status == 200 else {}
        charged = any(name == c.READS.name and dict(lb)["kind"] == "module_page" for name, lb in got)
        return got if charged and any(name == c.MODULE_RX_POWER.name for name, _ in got) else None

    with serving(sim_serve_config(host.root, port), wire=WireReader(SimEthtool(wire), gstats=wire.gstats)):
        got = wait_for(scraped, timeout=30, what="the wire series on /metrics")
    nd = {"device": "mlx5_0", "port": "1", "netdev": "ens1f0np0"}
    assert got[(c.MODULE_RX_POWER.name, frozenset({**nd, "lane": "1"}.items()))] == pytest.approx(0.9e-3)
    assert got[(c.MODULE_TEMPERATURE.name, frozenset(nd.items()))] == pytest.approx(45.0, abs=0.01)
    high_warning = frozenset({**nd, "limit": "high_warning"}.items())
    assert got[(c.MODULE_RX_POWER_THRESHOLD.name, high_warning)] == pytest.approx(1.7378e-3, rel=1e-3)
    assert got[(c.FEC_CORRECTED_BLOCKS.name, frozenset(nd.items()))] == 1200
    assert got[(c.FEC_UNCORRECTABLE_BLOCKS.name, frozenset(nd.items()))] == 3
    assert (c.PAUSE_FRAMES.name, frozenset({**nd, "direction": "received"}.items())) in got
    netdevs = {dict(labels).get("netdev") for name, labels in got if name == c.MODULE_INFO.name}
    assert netdevs == {"ens1f0np0", "ens2f0np0"}  # the InfiniBand port has no module path
    assert got[(c.ETHTOOL_REQUESTS.name, frozenset({("operation", "module_eeprom")}))] >= 6
    # ... and charged to each RoCE port's RDMA device in the read-cost counter, beside its counter reads
    reads = {(dict(lb)["device"], dict(lb)["kind"]): v for (name, lb), v in got.items() if name == c.READS.name}
    for device in ("mlx5_0", "mlx5_1"):
        assert reads[(device, "module_page")] >= 3 and reads[(device, "ethtool_link_state")] >= 1, reads
        assert reads[(device, "pma_file")] > 0  # the counter pass's own kinds are still there
    assert not [kind for device, kind in reads if device == "mlx5_2" and kind.startswith(("module", "ethtool"))]
    errors = {dict(labels)["operation"]: v for (name, labels), v in got.items() if name == c.WIRE_READ_ERRORS.name}
    assert errors == dict.fromkeys(ERROR_OPERATIONS, 0.0)


def test_a_veth_raises_nothing_and_counts_no_error(tmp_path: Path) -> None:
    """The real reader on a veth named as the simulated RoCE netdev: link state only, the rest
    Unsupported and asked once, no error counted."""
    host = SimHost.build(tmp_path / "sys", roce=1)
    snap = _snapshot(host, tmp_path)
    with network_namespace(["ens1f0np0"]) as ns, ns.entered():
        watch = WireWatch(WireReader(EthtoolNetlink()), lambda: snap)
        try:
            first = watch.poll_once()
            watch.poll_once(now=1e9)
            requests = dict(watch.reader.requests)
            families = _series(list(watch.families()))
        finally:
            watch.close()
    assert set(first) == {"ens1f0np0"} and isinstance(first["ens1f0np0"], NetdevWire)
    assert {requests[op] for op in ("fec", "pause", "module_eeprom", "gstats")} == {1}  # once: unsupported
    assert all(v == 0 for _, v in families[c.WIRE_READ_ERRORS.name])
    wire_series = set(families) - {c.ETHTOOL_REQUESTS.name, c.WIRE_READ_ERRORS.name}
    assert wire_series <= {c.LINK_DOWN_EVENTS.name}, wire_series


class _Broken(WireReader):
    def poll(self, netdevs: object) -> dict[str, NetdevWire]:
        raise RuntimeError("a reader bug")


def test_a_reader_that_raises_is_counted_and_never_raised(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=1)
    snap = _snapshot(host, tmp_path)
    wire = SimWire()
    wire.add("ens1f0np0")
    watch = WireWatch(_Broken(SimEthtool(wire), gstats=wire.gstats), lambda: snap)
    assert watch.poll_once() == {} and watch.poll_once() == {}
    errors = dict(_series(list(watch.families()))[c.WIRE_READ_ERRORS.name])
    assert errors[("poll",)] == 2 and errors[("fec",)] == 0


def test_without_the_collector_no_wire_family_is_registered(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=1)
    port = free_port()
    wire = SimWire()
    wire.add("ens1f0np0")

    def scraped() -> str | None:
        try:
            status, _, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        except OSError:
            return None
        text = body.decode()
        return text if status == 200 and "rnic_port_info" in text else None

    config = sim_serve_config(host.root, port, wire=False)
    with serving(config, wire=WireReader(SimEthtool(wire), gstats=wire.gstats)):
        text = wait_for(scraped, timeout=30, what="a scrape after the first poll")
    assert "rnic_module_" not in text and c.WIRE_READ_ERRORS.name not in text


class _Records:
    """An `agent.EventSink` keeping every published event."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def publish(self, record: Published) -> None:
        self.events.extend(record.events)

    def families(self) -> list[Family]:
        return []

    def close(self) -> None:
        pass


def test_a_port_down_event_says_why_the_link_is_down(tmp_path: Path) -> None:
    """The agent's port-down events carry the driver's extended link state (asked at the event), as the
    log line and the OTLP record spell `Event.fields()`; a port whose driver does not say keeps its event."""
    host = SimHost.build(tmp_path / "sys", roce=2)
    wire = SimWire()
    wire.add("ens1f0np0")
    wire.add("ens2f0np0")
    records = _Records()
    holder: list[Agent] = []
    watch = WireWatch(WireReader(SimEthtool(wire), gstats=wire.gstats), lambda: holder[0].last)
    agent = Agent(sim_serve_config(host.root, 0), sinks=(lambda _counters: records,), annotate=watch.annotate)
    holder.append(agent)
    try:
        agent.poll_once(full_gid_tables=True)
        host.set_port_up("mlx5_0", False)
        host.set_port_up("mlx5_1", False)
        wire.link_down("ens1f0np0", ext_state=5, ext_substate=1)  # cable issue, unsupported cable
        wire.link_down("ens2f0np0", ext_state=None)
        agent.poll_once(event=True)
    finally:
        agent.close()
    down = {e.netdev: e.fields() for e in records.events if e.spec is PORT_DOWN}
    assert set(down) == {"ens1f0np0", "ens2f0np0"}, records.events
    assert down["ens1f0np0"]["link_down_reason"] == "cable_issue"
    assert down["ens1f0np0"]["link_down_substate"] == "unsupported_cable"
    assert "link_down_reason" not in down["ens2f0np0"]


def _reasons(watch: WireWatch) -> dict[str, str]:
    """Each netdev's link-down reason in the watch's families."""
    for family in watch.families():
        if family.spec is c.LINK_DOWN_REASON_INFO:
            return {labels[2]: labels[3] for labels, _ in family.samples}
    return {}


def test_port_events_have_the_series_follow_at_once(tmp_path: Path) -> None:
    """An up link's state is read every 10 minutes (nothing in it changes until it drops); a port
    event wakes the watch to read it again, so the reason series comes with the drop and goes with
    the port-up event, not at the next timed read."""
    host = SimHost.build(tmp_path / "sys", roce=2)
    wire = SimWire()
    wire.add("ens1f0np0")
    wire.add("ens2f0np0")
    holder: list[Agent] = []
    reader = WireReader(SimEthtool(wire), gstats=wire.gstats)
    watch = WireWatch(reader, lambda: holder[0].last)
    agent = Agent(sim_serve_config(host.root, 0), sinks=(lambda _counters: _Records(),), annotate=watch.annotate)
    holder.append(agent)
    try:
        agent.poll_once(full_gid_tables=True)
        watch.start()
        wait_for(lambda: watch.polls, timeout=10, what="the watch's first poll")
        assert _reasons(watch) == {} and reader.next_due() > 50  # every source read: nothing due soon
        host.set_port_up("mlx5_0", False)
        wire.link_down("ens1f0np0", ext_state=5, ext_substate=1)
        agent.poll_once(event=True)
        reasons = wait_for(lambda: _reasons(watch), timeout=5, what="the reason series after the port-down event")
        assert reasons == {"ens1f0np0": "cable_issue"}
        host.set_port_up("mlx5_0", True)
        wire.link_up("ens1f0np0")
        agent.poll_once(event=True)
        wait_for(lambda: not _reasons(watch), timeout=5, what="no reason series after the port-up event")
        assert reader.requests_by_netdev["ens2f0np0"]["link_state"] == 1  # no event named it
    finally:
        watch.close()
        agent.close()


def test_the_cycles_its_requests_leave_are_collected_every_poll(tmp_path: Path) -> None:
    """pyroute2's netlink messages are reference cycles (26 to 80 objects per request). Under the
    daemon's young-generation threshold they waited minutes for a collection, and the soak's memory
    rose ~2 MB a minute with the wire on: polls over netdevs that vanish and return (each return
    re-reads every source) leave the youngest generation no bigger than one poll's objects."""
    host = SimHost.build(tmp_path / "sys", roce=4)
    wire = SimWire()
    for n in range(4):
        wire.add(f"ens{n + 1}f0np0")
    full = _snapshot(host, tmp_path)
    host.remove_device("mlx5_3")
    without = _snapshot(host, tmp_path)
    current = [full]
    clock = [0.0]
    # many requests
    busy = WireSettings(fec_interval=30, pause_interval=30, link_state_interval=10, link_state_up_interval=10)
    reader = WireReader(SimEthtool(wire), busy, gstats=wire.gstats, clock=lambda: clock[0])
    watch = WireWatch(reader, lambda: current[0])
    young: list[int] = []
    older: list[int] = []  # young collections since the last collection of the middle generation
    threshold = gc.get_threshold()
    gc.collect()
    gc.set_threshold(GC_GEN0_THRESHOLD, *threshold[1:])
    try:
        for i in range(60):
            current[0] = without if i % 6 == 3 else full  # mlx5_3's netdev goes and comes back
            watch.poll_once(now=clock[0])
            clock[0] += 10.0
            young.append(gc.get_count()[0])
            older.append(gc.get_count()[1])
    finally:
        gc.set_threshold(*threshold)
    assert sum(reader.requests.values()) > 400, reader.requests  # not vacuous: it asked, and often
    assert max(young) < 1_000, young
    assert max(older) <= threshold[1] + 1, older  # and the older generations are collected in turn


def test_otlp_exports_the_wire_too(tmp_path: Path) -> None:
    """The wire's families reach the OTLP sink through the registry: decoded from the export's bytes."""
    from dataclasses import replace

    from rnic_exporter.config.otlp import resolve
    from tests.support.otlp import HttpReceiver

    host = SimHost.build(tmp_path / "sys", roce=1)
    wire = SimWire()
    wire.add("ens1f0np0")
    with HttpReceiver() as rcv:
        otlp = resolve({"otlp_endpoint": rcv.url}, {})
        assert otlp is not None
        config = sim_serve_config(host.root, free_port(), otlp=replace(otlp, interval_s=0.5))
        with serving(config, wire=WireReader(SimEthtool(wire), gstats=wire.gstats)):
            point = wait_for(
                lambda: next((p for p in rcv.received.latest_points() if p.metric == "rnic.module.rx_power"), None),
                timeout=30,
                what="rnic.module.rx_power in an OTLP export",
            )
    assert point.unit == "W" and point.attrs["netdev"] == "ens1f0np0" and point.value == pytest.approx(0.9e-3)


def test_the_config_file_sets_the_intervals(tmp_path: Path) -> None:
    from rnic_exporter.config.file import apply_file
    from rnic_exporter.daemon.wire_watch import wire_settings
    from rnic_exporter.errors import ConfigError

    good = tmp_path / "good.toml"
    good.write_text(
        '[collector.wire]\nmodule_interval_seconds = "2m"\nfec_interval_seconds = 15\n'
        'link_state_up_interval_seconds = "1h"\n'
    )
    config = apply_file(ServeConfig(config_file=good, state_dir=None), set())
    settings = wire_settings(config.wire_intervals)
    assert (settings.module_interval, settings.fec_interval, settings.pause_interval) == (120.0, 15.0, 60.0)
    assert (settings.link_state_interval, settings.link_state_up_interval) == (60.0, 3600.0)
    fast = tmp_path / "fast.toml"
    fast.write_text("[collector.wire]\nmodule_interval_seconds = 10\n")
    with pytest.raises(ConfigError, match=r"collector\.wire\.module_interval_seconds"):
        apply_file(ServeConfig(config_file=fast, state_dir=None), set())


class _CountingBuilds(WireWatch):
    builds = 0

    def _build(self, netdevs: Mapping[str, Netdev], wire: Mapping[str, NetdevWire]) -> list[Family]:
        self.builds += 1
        return super()._build(netdevs, wire)


def test_a_watch_started_before_the_first_snapshot_reads_soon_after_it(tmp_path: Path) -> None:
    """The loop looks for new netdevs every RESCAN_S (30 s); before the agent's first snapshot it
    looks every second, so the wire is read soon after start, not a rescan later."""
    host = SimHost.build(tmp_path / "sys", roce=2)
    snap = _snapshot(host, tmp_path)
    wire = SimWire()
    wire.add("ens1f0np0")
    wire.add("ens2f0np0")
    current: list[Snapshot | None] = [None]
    reader = WireReader(SimEthtool(wire), gstats=wire.gstats)
    watch = WireWatch(reader, lambda: current[0])
    watch.start()
    try:
        wait_for(lambda: watch.polls >= 1, timeout=10, what="the watch's first poll, before any snapshot")
        assert reader.requests_by_netdev == {}
        current[0] = snap
        wait_for(
            lambda: set(reader.requests_by_netdev) == {"ens1f0np0", "ens2f0np0"},
            timeout=5,
            what="the wire read within seconds of the first snapshot",
        )
        assert watch.next_wait_s() == RESCAN_S  # every source read, none due within the rescan: asleep 30 s
    finally:
        watch.close()


def test_a_wake_up_with_nothing_read_leaves_the_families_as_they_are(tmp_path: Path) -> None:
    """The loop looks for new netdevs every RESCAN_S; its sources fall due once a minute: between,
    nothing is rebuilt. A read, or a netdev come or gone, rebuilds."""
    host = SimHost.build(tmp_path / "sys", roce=2)
    snap = _snapshot(host, tmp_path)
    wire = SimWire()
    wire.add("ens1f0np0")
    wire.add("ens2f0np0")
    clock = [1000.0]
    reader = WireReader(SimEthtool(wire), gstats=wire.gstats, clock=lambda: clock[0])
    watch = _CountingBuilds(reader, lambda: snap)
    try:
        watch.poll_once()
        built = watch.builds
        for _ in range(5):
            clock[0] += 10  # a rescan's wake-up: nothing is due within the minute
            watch.poll_once()
        assert watch.builds == built and watch.polls == 6
        clock[0] += 60
        watch.poll_once()
        assert watch.builds == built + 1
    finally:
        watch.close()
