"""Every detection event rnic-exporter emits, defined once.

Detection (`rnic_exporter/detect/`) produces `Event`s; the log sink, the Prometheus counter
`rnic_events_total{event}`, the OpenTelemetry log records (`event_name`) and the dashboards'
annotations all take their names from this catalogue.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from rnic_exporter.model.consumers import DeviceConsumers

Severity = Literal["info", "warning", "critical"]

# OpenTelemetry SeverityNumber (logs data model): INFO=9, WARN=13, ERROR=17.
OTEL_SEVERITY_NUMBER: Mapping[str, int] = MappingProxyType({"info": 9, "warning": 13, "critical": 17})
OTEL_SEVERITY_TEXT: Mapping[str, str] = MappingProxyType({"info": "INFO", "warning": "WARN", "critical": "ERROR"})


@dataclass(frozen=True, slots=True)
class EventSpec:
    name: str  # dotted, e.g. rnic.gid.address_moved
    severity: Severity  # the usual severity; an event may raise or lower it (see Event.severity)
    meaning: str  # what it means for a training job, one sentence


def _e(name: str, severity: Severity, meaning: str) -> EventSpec:
    return EventSpec(name=name, severity=severity, meaning=meaning)


GID_TABLE_CHANGED = _e(
    "rnic.gid.table_changed",
    "warning",
    "The port's GID table changed; jobs that cached a GID index may now use a wrong one.",
)
GID_ADDRESS_MOVED = _e(
    "rnic.gid.address_moved",
    "critical",
    "The RoCE v2 IPv4 GID of an address moved to another index; NCCL jobs using the old index lose their connections.",
)
NCCL_GID_INDEX_CHANGED = _e(
    "rnic.nccl.gid_index_changed",
    "warning",
    "The GID index NCCL would auto-select changed; running jobs keep the old one.",
)
NCCL_GID_INDEX_INVALID = _e(
    "rnic.nccl.gid_index_invalid",
    "critical",
    "The configured NCCL_IB_GID_INDEX does not point at the GID NCCL's settings need (a RoCE v2 IPv4 GID "
    "at the defaults); NCCL init hangs or fails with 'Got completion with error 4'.",
)
NCCL_GID_INDEX_VALID = _e(
    "rnic.nccl.gid_index_valid", "info", "The configured NCCL_IB_GID_INDEX points at a RoCE v2 IPv4 GID again."
)
ADDRESS_LOST = _e(
    "rnic.address.lost",
    "critical",
    "An address left the RNIC's netdev; its GIDs are gone and may come back at other indices.",
)
ADDRESS_RESTORED = _e("rnic.address.restored", "info", "An address the RNIC's netdev had lost is back.")
PORT_DOWN = _e("rnic.port.down", "warning", "The RDMA port left ACTIVE/LinkUp; traffic over it stops.")
PORT_UP = _e("rnic.port.up", "info", "The RDMA port is ACTIVE and LinkUp again.")
PORT_FLAPPING = _e(
    "rnic.port.flapping",
    "warning",
    "The port went down and up repeatedly within the window; expect collective timeouts.",
)
PORT_STABLE = _e("rnic.port.stable", "info", "The port has stopped flapping.")
PORT_DEGRADING = _e(
    "rnic.port.degrading",
    "warning",
    "The port's error counters rise too fast (symbol errors, retraining, RoCE retransmissions, drops): the cable, "
    "transceiver or path is failing and jobs slow down, then hang; critical once a queue pair exhausted its retries.",
)
PORT_RECOVERED = _e(
    "rnic.port.recovered", "info", "The port's error counters have stayed within their limits for a while again."
)
LINK_BELOW_RATED = _e(
    "rnic.link.below_rated",
    "warning",
    "A link (IB port, netdev or PCIe) runs below its rated speed or width; collectives slow down to the slowest link.",
)
LINK_RESTORED = _e("rnic.link.restored", "info", "The link runs at its rated speed and width again.")
DEVICE_DISAPPEARED = _e(
    "rnic.device.disappeared",
    "critical",
    "A known RDMA device is gone (PCIe fault, driver reset, firmware crash); jobs on it fail.",
)
DEVICE_REAPPEARED = _e("rnic.device.reappeared", "info", "A device that had disappeared is back.")
DEVICE_DISCOVERED = _e(
    "rnic.device.discovered", "info", "A device was seen for the first time and added to the inventory."
)
RISK_ADDRESS_LOSS = _e(
    "rnic.risk.address_loss",
    "warning",
    "The netdev's addresses can vanish on a port flap (NetworkManager manages it, or IPv6 "
    "keep_addr_on_down is off): a flap may shift GID indices.",
)

NCCL_GID_UNUSABLE = _e(
    "rnic.nccl.gid_unusable",
    "critical",
    "The GID NCCL would use on a RoCE port is link-local, of the wrong RoCE version, outside "
    "NCCL_IB_ADDR_RANGE, or missing; NCCL connections across nodes over it fail.",
)
NCCL_GID_USABLE = _e("rnic.nccl.gid_usable", "info", "The GID NCCL would use on the RoCE port can carry traffic again.")

EVENT_SPECS: tuple[EventSpec, ...] = (
    GID_TABLE_CHANGED,
    GID_ADDRESS_MOVED,
    NCCL_GID_INDEX_CHANGED,
    NCCL_GID_INDEX_INVALID,
    NCCL_GID_INDEX_VALID,
    ADDRESS_LOST,
    ADDRESS_RESTORED,
    PORT_DOWN,
    PORT_UP,
    PORT_FLAPPING,
    PORT_STABLE,
    PORT_DEGRADING,
    PORT_RECOVERED,
    LINK_BELOW_RATED,
    LINK_RESTORED,
    DEVICE_DISAPPEARED,
    DEVICE_REAPPEARED,
    DEVICE_DISCOVERED,
    RISK_ADDRESS_LOSS,
    NCCL_GID_UNUSABLE,
    NCCL_GID_USABLE,
)

BY_NAME: Mapping[str, EventSpec] = MappingProxyType({e.name: e for e in EVENT_SPECS})


@dataclass(frozen=True, slots=True)
class Event:
    """One detected change. `before`/`after` carry the old and new value as text where one applies."""

    spec: EventSpec
    message: str  # human body, one line, names the device, port and values
    device: str
    port: int | None = None
    netdev: str | None = None
    pci_address: str | None = None
    before: str | None = None
    after: str | None = None
    attributes: Mapping[str, str] = field(default_factory=dict)  # event-specific extras (address, link...)
    severity_override: Severity | None = None
    time: float = 0.0  # wall clock of the snapshot that showed it
    consumers: DeviceConsumers | None = None  # who used the device at the last scan (--collector.consumers)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def severity(self) -> Severity:
        return self.severity_override or self.spec.severity

    def fields(self) -> dict[str, str]:
        """Flat attributes for log lines and OTel records; absent values are left out (the consumers
        are spelled by the sinks: `sinks/consumer_fields.py`)."""
        out = {"event": self.name, "severity": self.severity, "device": self.device}
        optional = {
            "port": None if self.port is None else str(self.port),
            "netdev": self.netdev,
            "pci_address": self.pci_address,
            "before": self.before,
            "after": self.after,
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        out.update(self.attributes)
        return out
