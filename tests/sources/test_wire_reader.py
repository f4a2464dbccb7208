"""WireReader: each source on its own interval, Unsupported asked once, static module pages reused
and refreshed, netdevs forgotten when they go; the simulated wire behind the real parsers, and
`ethtool -S` over the real ioctl on a veth of our own."""

from __future__ import annotations

import math

import pytest

from rnic_exporter.catalog import metrics as c
from rnic_exporter.daemon.wire_watch import device_reads
from rnic_exporter.model.optics import ModuleReading
from rnic_exporter.model.wire import Gone, LinkState, Unsupported
from rnic_exporter.sim.wire import SimEthtool, SimPort, SimWire
from rnic_exporter.sinks.wire_samples import wire_samples
from rnic_exporter.sources.wire import WireReader, WireSettings, read_gstats
from tests.support.netns import network_namespace


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# Sources more often than the defaults, an up link's state as often as a down one's
BUSY = WireSettings(fec_interval=30, pause_interval=30, link_state_interval=10, link_state_up_interval=10)


def _reader(clock: Clock, settings: WireSettings | None = None) -> tuple[SimWire, WireReader]:
    wire = SimWire()
    wire.add("ens1f0np0")
    wire.add("ib0", SimPort(supported=False, module=None))
    return wire, WireReader(SimEthtool(wire), settings or WireSettings(), gstats=wire.gstats, clock=clock)


def test_by_default_every_source_is_read_once_a_minute() -> None:
    """~0.5 ms of the exporter's CPU a request (docs/wire.md): a minute apart, what the alerts'
    5-minute rates need; a port-down event asks the link state at once (WireWatch.annotate)."""
    clock = Clock()
    _, reader = _reader(clock)
    for _ in range(10):
        reader.poll(["ens1f0np0"])
        clock.now += 6
    assert {op: n for op, n in reader.requests.items() if op != "module_eeprom"} == dict.fromkeys(
        ("link_state", "fec", "pause", "gstats"), 1
    )
    assert reader.requests["module_eeprom"] == 3  # lower, 00h, 03h; the next minute the lower page only


def test_sources_are_read_on_their_own_intervals() -> None:
    clock = Clock()
    _, reader = _reader(clock, BUSY)
    first = reader.poll(["ens1f0np0"])["ens1f0np0"]
    assert isinstance(first.module, ModuleReading) and isinstance(first.link_state, LinkState)
    assert dict(reader.requests) == {"link_state": 1, "fec": 1, "pause": 1, "gstats": 1, "module_eeprom": 3}
    clock.now += 10
    reader.poll(["ens1f0np0"])
    assert reader.requests["link_state"] == 2 and reader.requests["fec"] == 1
    clock.now += 20
    reader.poll(["ens1f0np0"])
    assert reader.requests["fec"] == 2 and reader.requests["module_eeprom"] == 3
    clock.now += 30  # a minute after the first: the module's lower page only
    reader.poll(["ens1f0np0"])
    assert reader.requests["module_eeprom"] == 4 and reader.requests["gstats"] == 2
    clock.now += 600  # static pages are re-read every 10 minutes
    reader.poll(["ens1f0np0"])
    assert reader.requests["module_eeprom"] == 7
    assert 0 < reader.next_due() <= 10


def test_an_up_links_state_is_read_every_ten_minutes_a_down_ones_every_minute() -> None:
    """Nothing in an up link's state changes until it drops, and a drop is announced: 60 s while
    down (its reason), 600 s while up (the down count after a flap too short for the carrier)."""
    clock = Clock()
    wire, reader = _reader(clock)
    reads = []
    for _ in range(20):  # 20 minutes up
        reader.poll(["ens1f0np0"])
        reads.append(reader.requests["link_state"])
        clock.now += 60
    assert reads[0] == 1 and reads[9] == 1 and reads[10] == 2 and reads[-1] == 2
    wire.link_down("ens1f0np0")  # not announced: found at the up link's next read, minute 20
    reader.poll(["ens1f0np0"])
    assert reader.requests["link_state"] == 3
    for _ in range(3):
        clock.now += 60
        state = reader.poll(["ens1f0np0"])["ens1f0np0"].link_state
    assert reader.requests["link_state"] == 6  # down: every minute, its reason with it
    assert isinstance(state, LinkState) and state.link_up is False and state.ext_state is not None
    assert reader.next_due() == 60


def test_an_announced_link_change_is_read_at_the_next_poll() -> None:
    clock = Clock()
    wire, reader = _reader(clock)
    reader.poll(["ens1f0np0", "ib0"])
    clock.now += 30
    wire.link_down("ens1f0np0", ext_state=1)
    reader.poll(["ens1f0np0"])
    assert reader.requests["link_state"] == 2  # ens1f0np0 and ib0, once each: not due
    reader.expedite("ens1f0np0", "link_state")
    reader.expedite("ens1f0np0", "fec")  # already due in 30 s: now
    reader.expedite("never-polled", "link_state")  # read in full at its first poll anyway
    got = reader.poll(["ens1f0np0"])["ens1f0np0"].link_state
    assert isinstance(got, LinkState) and got.link_up is False and got.ext_state == "link_training_failure"
    assert reader.requests["link_state"] == 3 and reader.requests["fec"] == 3  # ib0 lacks FEC: asked once
    clock.now += 30
    reader.poll(["ens1f0np0"])
    assert reader.requests["link_state"] == 3  # down: its minute, not yet
    clock.now += 30
    reader.poll(["ens1f0np0"])
    assert reader.requests["link_state"] == 4
    wire.link_up("ens1f0np0")
    reader.expedite("ens1f0np0", "link_state")
    got = reader.poll(["ens1f0np0"])["ens1f0np0"].link_state
    assert isinstance(got, LinkState) and got.link_up is True and got.ext_state is None


def test_a_fading_optic_shows_on_the_next_module_read() -> None:
    clock = Clock()
    wire, reader = _reader(clock)
    reader.poll(["ens1f0np0"])
    wire.fade_rx_power("ens1f0np0", lane=1, watts=0.05e-3)
    clock.now += 30
    assert reader.poll(["ens1f0np0"])["ens1f0np0"].module == reader.poll(["ens1f0np0"])["ens1f0np0"].module
    clock.now += 30
    module = reader.poll(["ens1f0np0"])["ens1f0np0"].module
    assert isinstance(module, ModuleReading)
    rx = module.lanes[0].rx_power_watts
    assert rx is not None and rx.value == pytest.approx(0.05e-3)


def test_unsupported_is_asked_once_and_forgotten_with_the_netdev() -> None:
    clock = Clock()
    _, reader = _reader(clock)
    got = reader.poll(["ib0"])["ib0"]
    assert got.fec == Unsupported("fec", "EOPNOTSUPP") and got.module == Unsupported("module_eeprom", "EOPNOTSUPP")
    for _ in range(3):
        clock.now += 60
        reader.poll(["ib0"])
    assert reader.requests["fec"] == 1 and reader.requests["module_eeprom"] == 1 and reader.requests["pause"] == 1
    assert reader.requests["link_state"] == 1  # link state works on any netdev; up: every 10 minutes
    assert reader.requests["gstats"] == 1  # no pause strings in its ethtool -S: asked once
    assert reader.next_due() == 600 - 180  # the up link's 10 minutes: the sources it lacks wake nothing
    reader.poll([])
    assert reader.next_due() == math.inf  # no netdev: nothing scheduled (the watch's rescan decides)
    reader.poll(["ib0"])  # came back: asked again
    assert reader.requests["fec"] == 2


def test_requests_are_charged_to_their_netdev_and_then_to_its_device() -> None:
    """What rnic_exporter_reads_total adds per device: each netdev's requests, by read kind."""
    clock = Clock()
    _, reader = _reader(clock, BUSY)
    for _ in range(3):
        reader.poll(["ens1f0np0", "ib0"])
        clock.now += 30
    mine, other = reader.requests_by_netdev["ens1f0np0"], reader.requests_by_netdev["ib0"]
    assert {op: mine.get(op, 0) + other.get(op, 0) for op in reader.requests} == dict(reader.requests)
    assert mine["module_eeprom"] == 4 and other == {
        "link_state": 3,
        "fec": 1,
        "pause": 1,
        "gstats": 1,
        "module_eeprom": 1,
    }
    netdevs = {"ens1f0np0": ("mlx5_0", "1", "ens1f0np0"), "ib0": ("mlx5_1", "1", "ib0")}
    by_device = device_reads(netdevs, reader.requests_by_netdev)
    assert by_device["mlx5_0"] == {
        "ethtool_link_state": 3,
        "ethtool_fec": 3,
        "ethtool_pause": 3,
        "ethtool_gstats": 2,
        "module_page": 4,
    }
    assert by_device["mlx5_1"]["module_page"] == 1  # asked once, refused: a request all the same
    reader.poll(["ens1f0np0"])
    assert "ib0" not in reader.requests_by_netdev  # forgotten with the netdev
    assert set(device_reads({}, reader.requests_by_netdev)) == set()  # a netdev no snapshot names: charged to none


def test_a_netdev_gone_from_the_namespace_is_no_error_and_is_asked_again() -> None:
    # Still listed by the RDMA device, but moved into a container's namespace (or removed since the
    # snapshot): nothing to read here now, nothing wrong either, and it may come back.
    clock = Clock()
    wire, reader = _reader(clock)
    got = reader.poll(["ens9f0np0"])["ens9f0np0"]
    gone = {"link_state", "fec", "pause", "module_eeprom", "gstats"}
    outcomes = (got.link_state, got.fec, got.pause, got.module, got.driver_pause)
    assert {o.operation for o in outcomes if isinstance(o, Gone)} == gone, got
    assert reader.ethtool.errors == {} and reader.gstats_errors == 0
    clock.now += 60
    wire.add("ens9f0np0")  # back in this namespace: read at the next interval, unlike Unsupported
    back = reader.poll(["ens9f0np0"])["ens9f0np0"]
    assert isinstance(back.link_state, LinkState) and isinstance(back.module, ModuleReading)
    assert reader.requests["fec"] == 2 and reader.requests["gstats"] == 2


def test_samples_of_a_poll_name_only_catalogue_metrics_with_their_labels() -> None:
    clock = Clock()
    wire, reader = _reader(clock)
    wire.pause_storm("ens1f0np0", priority=3, frames=5, duration_us=10, storm=True)
    got = reader.poll(["ens1f0np0", "ib0"])
    labels = {"ens1f0np0": ("mlx5_0", "1", "ens1f0np0"), "ib0": ("mlx5_1", "1", "ib0")}
    samples = list(wire_samples(labels, got, reader.requests))
    assert {s for s, _, _ in samples} <= set(c.WIRE_METRICS)
    assert all(len(lab) == len(s.labels) for s, lab, _ in samples)
    assert (c.PAUSE_STORM_EVENTS, ("mlx5_0", "1", "ens1f0np0", "warning"), 1.0) in samples
    assert {s for s, lab, _ in samples if "ib0" in lab} == {c.LINK_DOWN_EVENTS}


def test_module_interval_below_a_minute_is_refused() -> None:
    with pytest.raises(ValueError, match="every minute"):
        WireSettings(module_interval=5)
    assert WireSettings(module_interval=0).module_interval == 0  # off


def test_gstats_over_the_real_ioctl_on_veth() -> None:
    with network_namespace(["ens1f0np0"]) as ns, ns.entered():
        stats = read_gstats("ens1f0np0")
        assert "peer_ifindex" in stats  # veth's own ethtool -S string
        reader = WireReader(SimEthtool(SimWire()), WireSettings())  # the real read_gstats
        got = reader._driver_pause("ens1f0np0")
        assert got == Unsupported("gstats", "not_exposed")  # veth has no pause strings: not an error
        assert reader._driver_pause("gone0") == Gone("gstats") and reader.gstats_errors == 0  # no such netdev
