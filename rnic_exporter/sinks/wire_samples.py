"""Wire readings (module, FEC, link state, pause) as catalogue samples: pure, no I/O.

`wire_samples` turns one netdev's readings into (spec, labels, value) triples for any sink's
`FamilyBuilder`; an `Unsupported` or failed read yields nothing (absent, never 0). Labels are the
netdev's (device, port, netdev) plus each metric's own, in the catalogue's order.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from rnic_exporter.catalog import metrics as c
from rnic_exporter.catalog.metrics import MetricSpec
from rnic_exporter.model.optics import Level, ModuleReading, Monitor
from rnic_exporter.model.wire import DeviceTemperatures, DriverPauseStats, FecStats, LinkState, NetdevWire, PauseStats

WireSample = tuple[MetricSpec, tuple[str, ...], float]
Netdev = tuple[str, str, str]  # device, port, netdev

LEVEL_VALUE: Mapping[Level, int] = {
    Level.ALARM_LOW: -2,
    Level.WARNING_LOW: -1,
    Level.NORMAL: 0,
    Level.WARNING_HIGH: 1,
    Level.ALARM_HIGH: 2,
}
_THRESHOLD_SPECS = {
    "temperature": c.MODULE_TEMPERATURE_THRESHOLD,
    "supply_voltage": c.MODULE_SUPPLY_VOLTAGE_THRESHOLD,
    "rx_power": c.MODULE_RX_POWER_THRESHOLD,
    "tx_power": c.MODULE_TX_POWER_THRESHOLD,
    "tx_bias": c.MODULE_TX_BIAS_THRESHOLD,
}
_LANE_SPECS = {"rx_power": c.MODULE_RX_POWER, "tx_power": c.MODULE_TX_POWER, "tx_bias": c.MODULE_TX_BIAS}
_LIMITS = ("high_alarm", "low_alarm", "high_warning", "low_warning")


def module_samples(nd: Netdev, reading: ModuleReading) -> Iterator[WireSample]:
    ident = reading.identity
    yield (
        c.MODULE_INFO,
        (
            *nd,
            ident.type,
            ident.memory_map,
            ident.vendor,
            ident.part_number,
            ident.serial_number,
            ident.revision,
            ident.oui,
        ),
        1.0,
    )
    for lane_reading in reading.lanes:
        if lane_reading.data_path_active is not None:
            active = float(lane_reading.data_path_active)
            yield c.MODULE_LANE_ACTIVE, (*nd, str(lane_reading.number)), active
    thresholds_done: set[str] = set()
    for name, lane, mon in reading.monitors():
        if lane is None:
            spec = c.MODULE_TEMPERATURE if name == "temperature" else c.MODULE_SUPPLY_VOLTAGE
            yield spec, nd, mon.value
        else:
            yield _LANE_SPECS[name], (*nd, str(lane)), mon.value
        if mon.level in LEVEL_VALUE:
            yield c.MODULE_MONITOR_LEVEL, (*nd, name, "" if lane is None else str(lane)), float(LEVEL_VALUE[mon.level])
        if name not in thresholds_done:  # limits are per module, the same for every lane
            thresholds_done.add(name)
            yield from _thresholds(nd, name, mon)


def _thresholds(nd: Netdev, name: str, mon: Monitor) -> Iterator[WireSample]:
    if mon.thresholds is None:
        return
    for limit in _LIMITS:
        yield _THRESHOLD_SPECS[name], (*nd, limit), getattr(mon.thresholds, limit)


def fec_samples(nd: Netdev, fec: FecStats) -> Iterator[WireSample]:
    if fec.active_mode is not None:
        yield c.FEC_MODE_INFO, (*nd, fec.active_mode), 1.0
    if fec.corrected_blocks is not None:
        yield c.FEC_CORRECTED_BLOCKS, nd, float(fec.corrected_blocks)
    if fec.uncorrectable_blocks is not None:
        yield c.FEC_UNCORRECTABLE_BLOCKS, nd, float(fec.uncorrectable_blocks)
    for i, value in enumerate(fec.corrected_blocks_per_lane):
        yield c.FEC_LANE_CORRECTED_BLOCKS, (*nd, str(i)), float(value)
    for i, value in enumerate(fec.uncorrectable_blocks_per_lane):
        yield c.FEC_LANE_UNCORRECTABLE_BLOCKS, (*nd, str(i)), float(value)
    for fec_bin in fec.histogram:
        yield c.FEC_HISTOGRAM_CODEWORDS, (*nd, fec_bin.label), float(fec_bin.codewords)


def link_state_samples(nd: Netdev, state: LinkState) -> Iterator[WireSample]:
    if state.link_up is False and state.ext_state is not None:
        yield c.LINK_DOWN_REASON_INFO, (*nd, state.ext_state, state.ext_substate or ""), 1.0
    if state.down_count is not None:
        yield c.LINK_DOWN_EVENTS, nd, float(state.down_count)


def pause_samples(nd: Netdev, pause: PauseStats | None, driver: DriverPauseStats | None) -> Iterator[WireSample]:
    """802.3x frames from PAUSE_GET where the driver fills them, else from its ethtool -S strings."""
    received = pause.rx_frames if pause is not None else None
    sent = pause.tx_frames if pause is not None else None
    if driver is not None:
        received = received if received is not None else driver.received.global_frames
        sent = sent if sent is not None else driver.sent.global_frames
    for direction, frames in (("received", received), ("sent", sent)):
        if frames is not None:
            yield c.PAUSE_FRAMES, (*nd, direction), float(frames)
    if driver is None:
        return
    for direction, way in (("received", driver.received), ("sent", driver.sent)):
        for prio, value in way.frames.items():
            yield c.PRIORITY_PAUSE_FRAMES, (*nd, direction, str(prio)), float(value)
        for prio, value in way.duration_microseconds.items():
            yield c.PRIORITY_PAUSE_DURATION, (*nd, direction, str(prio)), value * 1e-6
        for prio, value in way.transitions.items():
            yield c.PRIORITY_PAUSE_TRANSITIONS, (*nd, direction, str(prio)), float(value)
    for reason, values in (("buffer", driver.buffer_discards), ("congestion", driver.congestion_discards)):
        for prio, value in values.items():
            yield c.PRIORITY_DISCARDS, (*nd, str(prio), reason), float(value)
    for stage in ("warning", "error"):  # not `severity`: alert rules own that label
        storms = driver.counters.get(f"tx_pause_storm_{stage}_events")
        if storms is not None:
            yield c.PAUSE_STORM_EVENTS, (*nd, stage), float(storms)
    for event in ("unplug", "bus_stuck", "high_temp", "bad_shorted"):
        events = driver.counters.get(f"module_{event}")
        if events is not None:
            yield c.MODULE_EVENTS, (*nd, event), float(events)


def hwmon_samples(device: str, pci_address: str, temps: DeviceTemperatures) -> Iterator[WireSample]:
    sensors = [("asic", t) for t in temps.asic] + ([("module", temps.module)] if temps.module else [])
    for sensor, temp in sensors:
        labels = (device, pci_address, sensor, temp.label)
        yield c.DEVICE_TEMPERATURE, labels, temp.celsius
        if temp.critical_celsius is not None:
            yield c.DEVICE_TEMPERATURE_CRITICAL, labels, temp.critical_celsius


def request_samples(requests: Mapping[str, int]) -> Iterator[WireSample]:
    for operation, count in sorted(requests.items()):
        yield c.ETHTOOL_REQUESTS, (operation,), float(count)


def wire_samples(
    netdevs: Mapping[str, Netdev], wire: Mapping[str, NetdevWire], requests: Mapping[str, int]
) -> Iterator[WireSample]:
    """Every catalogue sample of the latest readings; `netdevs` maps a netdev to its labels."""
    for name, reading in wire.items():
        labels = netdevs.get(name)
        if labels is None:
            continue
        if isinstance(reading.module, ModuleReading):
            yield from module_samples(labels, reading.module)
        if isinstance(reading.fec, FecStats):
            yield from fec_samples(labels, reading.fec)
        if isinstance(reading.link_state, LinkState):
            yield from link_state_samples(labels, reading.link_state)
        pause = reading.pause if isinstance(reading.pause, PauseStats) else None
        driver = reading.driver_pause if isinstance(reading.driver_pause, DriverPauseStats) else None
        if pause is not None or driver is not None:
            yield from pause_samples(labels, pause, driver)
    yield from request_samples(requests)
