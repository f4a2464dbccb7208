"""The catalogue's metrics as OpenTelemetry instruments: one table, read by the OTLP sink and
docs/opentelemetry.md.

`hw.network.*` / `hw.errors` (semantic conventions, hardware/network.md) where they fit, `rnic.*`
elsewhere. Attributes keep the catalogue's label names (`device`, `port`, `netdev`...), the same
names the Prometheus series and the event log records carry, plus what a convention requires
(`hw.id`, `network.io.direction`, `hw.type`, `error.type`). Units are UCUM. Pure data: importing it
loads nothing of OpenTelemetry.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from rnic_exporter.catalog import metrics as c
from rnic_exporter.catalog.metrics import MetricSpec
from rnic_exporter.sinks.labels import label_value

InstrumentKind = Literal["counter", "gauge", "updowncounter"]

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def otlp_number(value: float) -> float:
    """A sample value as an OTLP data point carries it: an int inside int64 stays an exact `as_int`;
    beyond it (a PMA counter at its 64-bit saturation value 18446744073709551615, a 64-bit data
    counter past 2^61 multiplied by 4 into bytes) it becomes a double, as Prometheus carries every
    value. Clamping to 2^63-1 would freeze a moving counter and make its rate 0; a double keeps it
    monotonic and within 2^-53 of the truth. Without this, protobuf refuses the value and the whole
    batch - every metric of the host - fails to encode.
    """
    if isinstance(value, int) and not _INT64_MIN <= value <= _INT64_MAX:
        try:
            return float(value)
        except OverflowError:  # beyond float range (no parser gives one): what a double would hold
            return math.inf if value > 0 else -math.inf
    return value


@dataclass(frozen=True, slots=True)
class Instrument:
    name: str
    kind: InstrumentKind  # observable counter / gauge / up-down counter
    unit: str  # UCUM
    description: str


@dataclass(frozen=True, slots=True)
class Route:
    """Where a catalogue metric's samples go; `only` restricts it to samples whose label has one of the values."""

    instrument: Instrument
    constant: tuple[tuple[str, str], ...] = ()  # fixed attributes the convention asks for
    rename: tuple[tuple[str, str], ...] = ()  # catalogue label -> attribute name
    hw_id: bool = False  # add the required hw.id = "<device>/<port>"
    only: tuple[str, frozenset[str]] | None = None


@dataclass(frozen=True, slots=True)
class MetricMapping:
    spec: MetricSpec
    routes: tuple[Route, ...]  # the first route whose `only` matches takes the sample

    def route(self, labels: tuple[str, ...]) -> Route:
        for route in self.routes:
            if route.only is None or labels[self.spec.labels.index(route.only[0])] in route.only[1]:
                return route
        raise LookupError(f"{self.spec.name}: no route for {labels}")  # the table test rules this out

    def attributes(self, route: Route, labels: tuple[str, ...]) -> dict[str, str]:
        """OTel attributes of one sample; empty label values stay absent, as Prometheus treats them."""
        names = dict(route.rename)
        attrs = {names.get(k, k): label_value(v) for k, v in zip(self.spec.labels, labels, strict=True) if v != ""}
        if route.hw_id:  # from the labels themselves: an empty one is left out of `attrs` above
            given = dict(zip(self.spec.labels, labels, strict=True))
            attrs["hw.id"] = label_value(f"{given.get('device', '')}/{given.get('port', '')}")
        attrs.update(route.constant)
        return attrs


def _i(name: str, kind: InstrumentKind, unit: str, spec: MetricSpec | None = None, description: str = "") -> Instrument:
    return Instrument(name=name, kind=kind, unit=unit, description=description or (spec.help if spec else ""))


def _one(spec: MetricSpec, name: str, kind: InstrumentKind, unit: str) -> MetricMapping:
    return MetricMapping(spec, (Route(_i(name, kind, unit, spec)),))


# Shared by two catalogue metrics each (receive/transmit), told apart by network.io.direction.
HW_NETWORK_IO = _i(
    "hw.network.io",
    "counter",
    "By",
    description="Bytes received and transmitted by the RDMA port (port_rcv_data/port_xmit_data x 4).",
)
HW_NETWORK_PACKETS = _i(
    "hw.network.packets", "counter", "{packet}", description="Packets received and transmitted by the RDMA port."
)
HW_ERRORS = _i(
    "hw.errors",
    "counter",
    "{error}",
    description="Error counters of the port's PMA PortCounters; error.type is the kernel file name.",
)
_RECEIVE = (("network.io.direction", "receive"),)
_TRANSMIT = (("network.io.direction", "transmit"),)

PMA_ERROR_COUNTERS = frozenset(c.PMA_ERROR_COUNTER_NAMES)  # to hw.errors, the rest to rnic.port.pma

MAPPINGS: tuple[MetricMapping, ...] = (
    _one(c.DEVICE_INFO, "rnic.device.info", "gauge", "1"),
    _one(c.PORT_INFO, "rnic.port.info", "gauge", "1"),
    _one(c.PORT_STATE, "rnic.port.state", "gauge", "1"),
    _one(c.PORT_PHYSICAL_STATE, "rnic.port.physical_state", "gauge", "1"),
    MetricMapping(c.PORT_UP, (Route(_i("hw.network.up", "updowncounter", "1", c.PORT_UP), hw_id=True),)),
    MetricMapping(
        c.PORT_ACTIVE_RATE,
        (Route(_i("hw.network.bandwidth.limit", "updowncounter", "By/s", c.PORT_ACTIVE_RATE), hw_id=True),),
    ),
    _one(c.PORT_ACTIVE_WIDTH, "rnic.port.width", "gauge", "{lane}"),
    MetricMapping(c.PORT_DATA_RECEIVED, (Route(HW_NETWORK_IO, _RECEIVE, hw_id=True),)),
    MetricMapping(c.PORT_DATA_TRANSMITTED, (Route(HW_NETWORK_IO, _TRANSMIT, hw_id=True),)),
    MetricMapping(c.PORT_PACKETS_RECEIVED, (Route(HW_NETWORK_PACKETS, _RECEIVE, hw_id=True),)),
    MetricMapping(c.PORT_PACKETS_TRANSMITTED, (Route(HW_NETWORK_PACKETS, _TRANSMIT, hw_id=True),)),
    MetricMapping(
        c.PORT_PMA,
        (
            Route(
                HW_ERRORS,
                (("hw.type", "network"),),
                (("counter", "error.type"),),
                hw_id=True,
                only=("counter", PMA_ERROR_COUNTERS),
            ),
            Route(_i("rnic.port.pma", "counter", "{count}", c.PORT_PMA)),
        ),
    ),
    _one(c.PORT_HW_STAT, "rnic.port.hw_stat", "counter", "{count}"),
    _one(c.DEVICE_HW_STAT, "rnic.device.hw_stat", "counter", "{count}"),
    _one(c.PORT_PMA_SATURATED, "rnic.port.pma.counters_saturated", "gauge", "{counter}"),
    _one(c.PCIE_LINK_SPEED, "rnic.pcie.link.speed", "gauge", "{transfer}/s"),
    _one(c.PCIE_LINK_WIDTH, "rnic.pcie.link.width", "gauge", "{lane}"),
    _one(c.PCIE_AER_ERRORS, "rnic.pcie.aer.errors", "counter", "{error}"),
    _one(c.NETDEV_SPEED, "rnic.netdev.speed", "gauge", "By/s"),
    _one(c.NETDEV_UP, "rnic.netdev.up", "gauge", "1"),
    _one(c.NETDEV_CARRIER_CHANGES, "rnic.netdev.carrier_changes", "counter", "{change}"),
    _one(c.NETDEV_MTU, "rnic.netdev.mtu", "gauge", "By"),
    _one(c.GID_ENTRY_INFO, "rnic.gid.entry.info", "gauge", "1"),
    _one(c.GID_TABLE_HASH, "rnic.gid.table.hash", "gauge", "1"),
    _one(c.GID_ENTRIES, "rnic.gid.entries", "gauge", "{entry}"),
    _one(c.GID_TABLE_SIZE, "rnic.gid.table.size", "gauge", "{entry}"),
    _one(c.NCCL_GID_INDEX, "rnic.nccl.gid_index", "gauge", "1"),
    _one(c.ATTRIBUTE_UNAVAILABLE, "rnic.attribute.unavailable", "gauge", "1"),
    _one(c.DEVICES, "rnic.devices", "gauge", "{device}"),
    _one(c.POLL_DURATION, "rnic.exporter.poll.duration", "gauge", "s"),
    _one(c.LAST_POLL, "rnic.exporter.poll.last_time", "gauge", "s"),
    _one(c.POLLS, "rnic.exporter.polls", "counter", "{poll}"),
    _one(c.READ_ERRORS, "rnic.exporter.read_errors", "counter", "{error}"),
    _one(c.CONFIG_RELOAD_OK, "rnic.exporter.config.reload_successful", "gauge", "1"),
    _one(c.DEVICE_READ_STUCK, "rnic.device.read.stuck", "gauge", "1"),
    _one(c.POLL_FALLBACK, "rnic.exporter.poll.fallback", "gauge", "1"),
    _one(c.DEVICE_DATA_TIMESTAMP, "rnic.device.data.time", "gauge", "s"),
    _one(c.ATTRIBUTE_BACKOFF, "rnic.attribute.backoff", "gauge", "s"),
    _one(c.READS, "rnic.exporter.reads", "counter", "{read}"),
    _one(c.READ_PATH, "rnic.device.read_path.info", "gauge", "1"),
    _one(c.PORT_RATED_RATE, "rnic.port.rated_rate", "gauge", "By/s"),
    _one(c.PORT_RATED_WIDTH, "rnic.port.rated_width", "gauge", "{lane}"),
    _one(c.LINK_BELOW_RATED, "rnic.link.below_rated", "gauge", "1"),
    _one(c.DEVICE_PRESENT, "rnic.device.present", "gauge", "1"),
    _one(c.NETDEV_ADDRESS_PRESENT, "rnic.netdev.address.present", "gauge", "1"),
    _one(c.NETDEV_ADDRESSES, "rnic.netdev.addresses", "gauge", "{address}"),
    _one(c.NETDEV_ADDRESS_LOSS_RISK, "rnic.netdev.address_loss_risk", "gauge", "1"),
    _one(c.GID_V2_IPV4_INDEX, "rnic.gid.roce_v2_ipv4_index", "gauge", "1"),
    _one(c.NCCL_CONFIGURED_GID_INDEX_VALID, "rnic.nccl.configured_gid_index.valid", "gauge", "1"),
    _one(c.PORT_FLAPPING, "rnic.port.flapping", "gauge", "1"),
    _one(c.GID_TABLE_CHANGES, "rnic.gid.table.changes", "counter", "{change}"),
    _one(c.EVENTS, "rnic.events", "counter", "{event}"),
    _one(c.STATE_ERRORS, "rnic.exporter.state.errors", "counter", "{error}"),
    _one(c.EVENT_SOURCE_ERRORS, "rnic.exporter.event_source.errors", "counter", "{error}"),
    _one(c.WAKEUPS, "rnic.exporter.wakeups", "counter", "{wakeup}"),
    _one(c.ATTRIBUTE_UNSUPPORTED, "rnic.attribute.unsupported.info", "gauge", "1"),
    _one(c.NCCL_GID_USABLE, "rnic.nccl.gid.usable", "gauge", "1"),
    _one(c.DEVICE_CONSUMER_PROCESSES, "rnic.device.consumer.processes", "gauge", "{process}"),
    _one(c.DEVICE_WORKLOADS, "rnic.device.workloads", "gauge", "{workload}"),
    MetricMapping(
        c.DEVICE_WORKLOAD_INFO,
        (
            Route(
                _i("rnic.device.workload.info", "gauge", "1", c.DEVICE_WORKLOAD_INFO),
                rename=(
                    ("kind", "rnic.workload.kind"),
                    ("slurm_job_id", "slurm.job.id"),
                    ("k8s_namespace_name", "k8s.namespace.name"),
                    ("k8s_pod_name", "k8s.pod.name"),
                    ("k8s_pod_uid", "k8s.pod.uid"),
                    ("command", "process.command"),
                ),
            ),
        ),
    ),
    _one(c.CONSUMER_SCAN_DURATION, "rnic.exporter.consumer_scan.duration", "gauge", "s"),
    _one(c.CONSUMER_SCAN_TIMESTAMP, "rnic.exporter.consumer_scan.last_time", "gauge", "s"),
    _one(c.CONSUMER_SCAN_COMPLETE, "rnic.exporter.consumer_scan.complete", "gauge", "1"),
    _one(c.CONSUMER_SCAN_SKIPPED, "rnic.exporter.consumer_scan.skipped", "gauge", "{process}"),
    _one(c.CONSUMER_SCAN_ERRORS, "rnic.exporter.consumer_scan.errors", "counter", "{error}"),
    # The wire (issue 32): UCUM units, the values in the catalogue's base units.
    _one(c.MODULE_INFO, "rnic.module.info", "gauge", "1"),
    _one(c.MODULE_TEMPERATURE, "rnic.module.temperature", "gauge", "Cel"),
    _one(c.MODULE_SUPPLY_VOLTAGE, "rnic.module.supply_voltage", "gauge", "V"),
    _one(c.MODULE_RX_POWER, "rnic.module.rx_power", "gauge", "W"),
    _one(c.MODULE_TX_POWER, "rnic.module.tx_power", "gauge", "W"),
    _one(c.MODULE_TX_BIAS, "rnic.module.tx_bias", "gauge", "A"),
    _one(c.MODULE_LANE_ACTIVE, "rnic.module.lane.active", "gauge", "1"),
    _one(c.MODULE_TEMPERATURE_THRESHOLD, "rnic.module.temperature.threshold", "gauge", "Cel"),
    _one(c.MODULE_SUPPLY_VOLTAGE_THRESHOLD, "rnic.module.supply_voltage.threshold", "gauge", "V"),
    _one(c.MODULE_RX_POWER_THRESHOLD, "rnic.module.rx_power.threshold", "gauge", "W"),
    _one(c.MODULE_TX_POWER_THRESHOLD, "rnic.module.tx_power.threshold", "gauge", "W"),
    _one(c.MODULE_TX_BIAS_THRESHOLD, "rnic.module.tx_bias.threshold", "gauge", "A"),
    _one(c.MODULE_MONITOR_LEVEL, "rnic.module.monitor.level", "gauge", "1"),
    _one(c.FEC_CORRECTED_BLOCKS, "rnic.netdev.fec.corrected_blocks", "counter", "{block}"),
    _one(c.FEC_UNCORRECTABLE_BLOCKS, "rnic.netdev.fec.uncorrectable_blocks", "counter", "{block}"),
    _one(c.FEC_LANE_CORRECTED_BLOCKS, "rnic.netdev.fec.lane.corrected_blocks", "counter", "{block}"),
    _one(c.FEC_LANE_UNCORRECTABLE_BLOCKS, "rnic.netdev.fec.lane.uncorrectable_blocks", "counter", "{block}"),
    _one(c.FEC_HISTOGRAM_CODEWORDS, "rnic.netdev.fec.histogram.codewords", "counter", "{codeword}"),
    _one(c.FEC_MODE_INFO, "rnic.netdev.fec.mode.info", "gauge", "1"),
    _one(c.LINK_DOWN_REASON_INFO, "rnic.netdev.link_down_reason.info", "gauge", "1"),
    _one(c.LINK_DOWN_EVENTS, "rnic.netdev.link_down.events", "counter", "{event}"),
    _one(c.PAUSE_FRAMES, "rnic.netdev.pause.frames", "counter", "{frame}"),
    _one(c.PRIORITY_PAUSE_FRAMES, "rnic.netdev.priority.pause.frames", "counter", "{frame}"),
    _one(c.PRIORITY_PAUSE_DURATION, "rnic.netdev.priority.pause.duration", "counter", "s"),
    _one(c.PRIORITY_PAUSE_TRANSITIONS, "rnic.netdev.priority.pause.transitions", "counter", "{transition}"),
    _one(c.PRIORITY_DISCARDS, "rnic.netdev.priority.discards", "counter", "{packet}"),
    _one(c.PAUSE_STORM_EVENTS, "rnic.netdev.pause_storm.events", "counter", "{event}"),
    _one(c.MODULE_EVENTS, "rnic.module.events", "counter", "{event}"),
    _one(c.DEVICE_TEMPERATURE, "rnic.device.temperature", "gauge", "Cel"),
    _one(c.DEVICE_TEMPERATURE_CRITICAL, "rnic.device.temperature.critical", "gauge", "Cel"),
    _one(c.ETHTOOL_REQUESTS, "rnic.exporter.ethtool.requests", "counter", "{request}"),
    _one(c.WIRE_READ_ERRORS, "rnic.exporter.wire.read_errors", "counter", "{error}"),
)

EXCLUDED: MappingProxyType[str, str] = MappingProxyType(
    {
        c.BUILD_INFO.name: "the resource carries it: service.version, process.runtime.name/version",
        c.OTLP_EXPORT_FAILURES.name: "describes the OTLP channel itself; on /metrics it stays readable while "
        "that channel is down",
        c.OTLP_DROPPED.name: "describes the OTLP channel itself; on /metrics it stays readable while that "
        "channel is down",
        c.COUNTERS_STALE.name: "describes one scrape's answer; rnic.device.data.time says the same per device",
        **{
            spec.name: "describes the exporter's HTTP server (its scrapers), which OTLP export does not go through"
            for spec in (c.HTTP_REQUESTS, c.HTTP_REQUESTS_LIMITED, c.HTTP_CONNECTIONS_CLOSED_FOR_ROOM)
        },
        **{
            spec.name: "the process's own series, for Prometheus; OTel describes a process with its resource and "
            "the process.* semantic conventions of an SDK's runtime instrumentation"
            for spec in c.PROCESS_METRICS.values()
        },
    }
)

BY_SPEC: MappingProxyType[str, MetricMapping] = MappingProxyType({m.spec.name: m for m in MAPPINGS})


def instruments() -> Iterator[Instrument]:
    """Every instrument once, in table order."""
    seen: set[str] = set()
    for mapping in MAPPINGS:
        for route in mapping.routes:
            if route.instrument.name not in seen:
                seen.add(route.instrument.name)
                yield route.instrument
