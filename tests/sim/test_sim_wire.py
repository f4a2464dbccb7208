"""The simulated wire, read through the real ethtool netlink reply parsers and decoders, then as
catalogue samples: what the daemon will do once these sources are wired, end to end but the socket."""

from __future__ import annotations

import pytest

from rnic_exporter.catalog import metrics as c
from rnic_exporter.model.optics import Level, ModuleReading
from rnic_exporter.model.wire import FecStats, Gone, LinkState, PauseStats, ReadFailure, Unsupported
from rnic_exporter.sim.wire import SimEthtool, SimModule, SimPort, SimWire
from rnic_exporter.sinks.wire_samples import (
    fec_samples,
    link_state_samples,
    module_samples,
    pause_samples,
    request_samples,
)
from rnic_exporter.sources.optics.memory import ModuleMemory
from rnic_exporter.sources.pause_stats import parse as parse_pause

ND = ("mlx5_0", "1", "ens1f0np0")


def _wire() -> SimWire:
    wire = SimWire()
    wire.add("ens1f0np0")
    wire.add("ens2f0np0", SimPort(module=SimModule(memory_map="cmis", vendor="NVIDIA", part_number="MMA4Z00-NS")))
    wire.add("ib0", SimPort(supported=False, module=None))
    return wire


@pytest.mark.parametrize("netdev, memory_map, requests", [("ens1f0np0", "sff8636", 3), ("ens2f0np0", "cmis", 6)])
def test_sim_module_reads_and_decodes_like_a_real_one(netdev: str, memory_map: str, requests: int) -> None:
    reader = SimEthtool(_wire())
    read = reader.module(netdev)
    assert isinstance(read.result, ModuleReading) and read.requests == requests
    reading = read.result
    assert reading.identity.memory_map == memory_map and reading.thresholds_published
    assert reading.worst is Level.NORMAL and len(reading.lanes) == 4
    again = reader.module(netdev, static=read.memory)
    assert again.requests == (1 if memory_map == "sff8636" else 3) and again.result == reading  # 10h, 11h live
    if memory_map == "cmis":  # the simulated host has every lane's data path activated
        assert [lane.data_path_active for lane in reading.lanes] == [True] * 4


def test_dark_cmis_lanes_are_sampled_without_a_level() -> None:
    """The host deactivates lanes 3-4 (the unused half of a breakout): 0 W is exported, not judged."""
    wire = _wire()
    wire.dark_lanes("ens2f0np0", [3, 4])
    read = SimEthtool(wire).module("ens2f0np0")
    assert isinstance(read.result, ModuleReading) and read.result.worst is Level.NORMAL
    assert [lane.data_path_active for lane in read.result.lanes] == [True, True, False, False]
    samples = {(s.name, labels): v for s, labels, v in module_samples(ND, read.result)}
    assert samples[(c.MODULE_RX_POWER.name, (*ND, "3"))] == 0.0
    levels = {labels[-2:]: v for (name, labels), v in samples.items() if name == c.MODULE_MONITOR_LEVEL.name}
    assert {lane for _, lane in levels if lane} == {"1", "2"} and set(levels.values()) == {0.0}
    active = {labels[-1]: v for (name, labels), v in samples.items() if name == c.MODULE_LANE_ACTIVE.name}
    assert active == {"1": 1.0, "2": 1.0, "3": 0.0, "4": 0.0}  # what keeps RnicOpticRxPowerDrifting quiet
    sff = SimEthtool(wire).module("ens1f0np0").result  # SFF-8636 does not say: no series
    assert isinstance(sff, ModuleReading)
    assert not [s for s, _, _ in module_samples(ND, sff) if s is c.MODULE_LANE_ACTIVE]


class _WithoutPage(SimModule):
    """A CMIS module that refuses one upper page (EINVAL from the sim, as a real one would)."""

    def __init__(self, missing: int) -> None:
        super().__init__(memory_map="cmis")
        self.missing = missing

    def memory(self) -> ModuleMemory:
        full = super().memory()
        return ModuleMemory(full.lower, {key: page for key, page in full.upper.items() if key[0] != self.missing})


def test_a_module_refusing_page_10h_still_has_its_optics_read_and_11h_is_an_error() -> None:
    wire = SimWire()
    wire.add("ens1f0np0", SimPort(module=_WithoutPage(0x10)))  # Tx disable unknown: every lane's Tx judged
    wire.add("ens2f0np0", SimPort(module=_WithoutPage(0x11)))  # the lane monitors themselves: a failure
    reader = SimEthtool(wire)
    read = reader.module("ens1f0np0")
    assert isinstance(read.result, ModuleReading) and read.result.worst is Level.NORMAL
    assert len(read.result.lanes) == 4 and all(lane.tx_disabled is None for lane in read.result.lanes)
    assert reader.errors == {}
    failed = reader.module("ens2f0np0").result
    assert isinstance(failed, ReadFailure) and reader.errors == {"module_eeprom": 1}


def test_rx_power_fading_through_the_warning_threshold_is_judged_and_sampled() -> None:
    wire = _wire()
    reader = SimEthtool(wire)
    wire.fade_rx_power("ens1f0np0", lane=2, watts=0.12e-3)  # below the 0.1445 mW low warning
    read = reader.module("ens1f0np0")
    assert isinstance(read.result, ModuleReading)
    lane2 = read.result.lanes[1].rx_power_watts
    assert lane2 is not None and lane2.level is Level.WARNING_LOW
    samples = {(s.name, labels): v for s, labels, v in module_samples(ND, read.result)}
    assert samples[(c.MODULE_RX_POWER.name, (*ND, "2"))] == pytest.approx(0.12e-3)
    assert samples[(c.MODULE_MONITOR_LEVEL.name, (*ND, "rx_power", "2"))] == -1
    assert samples[(c.MODULE_MONITOR_LEVEL.name, (*ND, "rx_power", "1"))] == 0
    assert samples[(c.MODULE_RX_POWER_THRESHOLD.name, (*ND, "low_warning"))] == pytest.approx(0.1445e-3)
    assert samples[(c.MODULE_TEMPERATURE.name, ND)] == pytest.approx(45.0)
    info = [labels for s, labels, _ in module_samples(ND, read.result) if s is c.MODULE_INFO]
    assert info == [(*ND, "QSFP28", "sff8636", "Mellanox", "MMA1B00-C100D", "MT2118FT01234", "A2", "00:02:c9")]
    assert all(len(labels) == len(s.labels) for s, labels, _ in module_samples(ND, read.result))


def test_fec_link_state_and_pause_through_the_netlink_parsers() -> None:
    wire = _wire()
    reader = SimEthtool(wire)
    wire.fec_errors("ens1f0np0", corrected=500, uncorrectable=2, lane=3)
    fec = reader.fec("ens1f0np0")
    assert fec == FecStats("rs", 500, 2, None, (0, 0, 500, 0), (0, 0, 2, 0))
    wire.link_down("ens1f0np0", ext_state=3, ext_substate=4)
    state = reader.link_state("ens1f0np0")
    assert state == LinkState(False, "bad_signal_integrity", "serdes_alos", 1)
    assert list(link_state_samples(ND, state)) == [
        (c.LINK_DOWN_REASON_INFO, (*ND, "bad_signal_integrity", "serdes_alos"), 1.0),
        (c.LINK_DOWN_EVENTS, ND, 1.0),
    ]
    wire.link_up("ens1f0np0")
    up = reader.link_state("ens1f0np0")
    assert isinstance(up, LinkState)
    assert [s for s, _, _ in link_state_samples(ND, up)] == [c.LINK_DOWN_EVENTS]
    assert isinstance(fec, FecStats)
    names = {(s.name, labels) for s, labels, _ in fec_samples(ND, fec)}
    assert (c.FEC_LANE_UNCORRECTABLE_BLOCKS.name, (*ND, "2")) in names
    assert isinstance(reader.pause("ens1f0np0"), PauseStats)


def test_fec_histogram_of_a_618_kernel_through_the_parsers_to_samples() -> None:
    wire = _wire()
    wire.ports["ens1f0np0"].fec_histogram = {(0, 0): 0, (1, 3): 0, (4, 7): 0}
    reader = SimEthtool(wire)
    wire.fec_errors("ens1f0np0", corrected=900, bit_errors=2)
    wire.fec_errors("ens1f0np0", corrected=40, bit_errors=6)
    fec = reader.fec("ens1f0np0")
    assert isinstance(fec, FecStats) and fec.corrected_blocks == 940
    samples = {labels[-1]: v for s, labels, v in fec_samples(ND, fec) if s is c.FEC_HISTOGRAM_CODEWORDS}
    assert samples == {"0": 0, "1-3": 900, "4-7": 40}
    older = reader.fec("ens2f0np0")  # no histogram on its kernel: no series, no error
    assert isinstance(older, FecStats) and older.histogram == ()
    assert not [s for s, _, _ in fec_samples(ND, older) if s is c.FEC_HISTOGRAM_CODEWORDS]
    assert reader.errors == {}


def test_pause_storm_from_the_driver_strings() -> None:
    wire = _wire()
    reader = SimEthtool(wire)
    wire.pause_storm("ens1f0np0", priority=3, frames=10_000, duration_us=2_500_000, storm=True)
    pause = reader.pause("ens1f0np0")
    driver = parse_pause(wire.gstats("ens1f0np0"))
    assert isinstance(pause, PauseStats) and driver is not None
    samples = {(s.name, labels): v for s, labels, v in pause_samples(ND, pause, driver)}
    assert samples[(c.PRIORITY_PAUSE_FRAMES.name, (*ND, "sent", "3"))] == 10_000
    assert samples[(c.PRIORITY_PAUSE_DURATION.name, (*ND, "sent", "3"))] == pytest.approx(2.5)
    assert samples[(c.PAUSE_STORM_EVENTS.name, (*ND, "warning"))] == 1
    assert samples[(c.PAUSE_FRAMES.name, (*ND, "sent"))] == 0


def test_ipoib_like_netdev_is_unsupported_and_costs_one_request_each() -> None:
    reader = SimEthtool(_wire())
    assert reader.fec("ib0") == Unsupported("fec", "EOPNOTSUPP")
    assert reader.pause("ib0") == Unsupported("pause", "EOPNOTSUPP")
    assert reader.module("ib0").result == Unsupported("module_eeprom", "EOPNOTSUPP")
    assert isinstance(reader.link_state("ib0"), LinkState)
    assert reader.errors == {}
    assert reader.fec("nosuch0") == Gone("fec") and reader.errors == {}  # no such netdev: gone, no error
    counted = dict((labels[0], v) for _, labels, v in request_samples(reader.requests))
    assert counted == {"fec": 2.0, "pause": 1.0, "module_eeprom": 1.0, "link_state": 1.0}
