"""Every metric rnic-exporter exposes, defined once.

The Prometheus collector, the OpenTelemetry instruments, the Grafana dashboards and the alert
rules take their names from here, and tests fail when a dashboard or rule names something that
is not in this catalogue.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

MetricKind = Literal["gauge", "counter", "info"]

DEVICE_LABELS = ("device",)
PORT_LABELS = ("device", "port")
NETDEV_LABELS = ("device", "port", "netdev")
PCIE_LABELS = ("device", "pci_address", "link")


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str  # full Prometheus name as scraped (with _total / _info)
    kind: MetricKind
    labels: tuple[str, ...]
    help: str
    unit: str = ""  # Prometheus base unit suffix, "" for none

    @property
    def family_name(self) -> str:
        """The name prometheus-client families take (they append _total / _info themselves)."""
        if self.kind == "counter":
            return self.name.removesuffix("_total")
        if self.kind == "info":
            return self.name.removesuffix("_info")
        return self.name


def _m(name: str, kind: MetricKind, labels: tuple[str, ...], help: str, unit: str = "") -> MetricSpec:
    return MetricSpec(name=name, kind=kind, labels=labels, help=help, unit=unit)


DEVICE_INFO = _m(
    "rnic_device_info",
    "info",
    ("device", "node_guid", "sys_image_guid", "fw_ver", "hca_type", "board_id", "pci_address"),
    "RDMA device identity from /sys/class/infiniband/<device>; always 1.",
)
PORT_INFO = _m(
    "rnic_port_info",
    "info",
    ("device", "port", "link_layer", "netdev"),
    "RDMA port identity: link layer and its netdev (from the default GID or device/net); always 1.",
)
PORT_STATE = _m(
    "rnic_port_state",
    "gauge",
    PORT_LABELS,
    "Logical port state number from ports/<n>/state (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE).",
)
PORT_PHYSICAL_STATE = _m(
    "rnic_port_physical_state",
    "gauge",
    PORT_LABELS,
    "Physical port state number from ports/<n>/phys_state (2 Polling, 3 Disabled, 5 LinkUp).",
)
PORT_UP = _m("rnic_port_up", "gauge", PORT_LABELS, "1 when the port is ACTIVE and LinkUp, else 0.")
PORT_ACTIVE_RATE = _m(
    "rnic_port_active_rate_bytes_per_second",
    "gauge",
    PORT_LABELS,
    "Active port rate (lanes x per-lane speed) from ports/<n>/rate; only meaningful while up.",
    "bytes_per_second",
)
PORT_ACTIVE_WIDTH = _m(
    "rnic_port_active_width_lanes", "gauge", PORT_LABELS, "Active lane count from ports/<n>/rate.", "lanes"
)
PORT_DATA_RECEIVED = _m(
    "rnic_port_data_received_bytes_total",
    "counter",
    PORT_LABELS,
    "Bytes received (counters/port_rcv_data x 4). On mlx5 RoCE: RDMA traffic only.",
    "bytes",
)
PORT_DATA_TRANSMITTED = _m(
    "rnic_port_data_transmitted_bytes_total",
    "counter",
    PORT_LABELS,
    "Bytes transmitted (counters/port_xmit_data x 4). On mlx5 RoCE: RDMA traffic only.",
    "bytes",
)
PORT_PACKETS_RECEIVED = _m(
    "rnic_port_packets_received_total", "counter", PORT_LABELS, "Packets received (counters/port_rcv_packets)."
)
PORT_PACKETS_TRANSMITTED = _m(
    "rnic_port_packets_transmitted_total", "counter", PORT_LABELS, "Packets transmitted (counters/port_xmit_packets)."
)
PORT_PMA = _m(
    "rnic_port_pma_total",
    "counter",
    (*PORT_LABELS, "counter"),
    "Every other file in ports/<n>/counters/ (PMA PortCounters), named by the kernel file.",
)
PORT_HW_STAT = _m(
    "rnic_port_hw_stat_total",
    "counter",
    (*PORT_LABELS, "counter"),
    "Every file in ports/<n>/hw_counters/ (driver counters such as out_of_sequence, "
    "local_ack_timeout_err, np_cnp_sent), named by the driver.",
)
DEVICE_HW_STAT = _m(
    "rnic_device_hw_stat_total",
    "counter",
    (*DEVICE_LABELS, "counter"),
    "Every file in <device>/hw_counters/ (device-wide driver counters).",
)
PORT_PMA_SATURATED = _m(
    "rnic_port_pma_counters_saturated",
    "gauge",
    PORT_LABELS,
    "How many of the port's PMA counters are stuck at their maximum (PMA counters saturate, not "
    "wrap); > 0: those counters stopped counting until they are reset (perfquery -R).",
)
PCIE_LINK_SPEED = _m(
    "rnic_pcie_link_speed_transfers_per_second",
    "gauge",
    PCIE_LABELS,
    "PCIe link speed of the RNIC's PCI function; link=current|max (device capability)|"
    "upstream_max (the slot's capability).",
    "transfers_per_second",
)
PCIE_LINK_WIDTH = _m(
    "rnic_pcie_link_width_lanes", "gauge", PCIE_LABELS, "PCIe link width; link=current|max|upstream_max.", "lanes"
)
PCIE_AER_ERRORS = _m(
    "rnic_pcie_aer_errors_total",
    "counter",
    ("device", "pci_address", "severity"),
    "PCIe AER errors the RNIC's PCI function reported since boot (aer_dev_correctable, aer_dev_nonfatal, "
    "aer_dev_fatal; kernel 4.17+); severity=correctable|nonfatal|fatal. Absent where AER is off.",
)
NETDEV_SPEED = _m(
    "rnic_netdev_speed_bytes_per_second",
    "gauge",
    NETDEV_LABELS,
    "Negotiated speed of the port's netdev (/sys/class/net/<netdev>/speed); absent while unknown.",
    "bytes_per_second",
)
NETDEV_UP = _m("rnic_netdev_up", "gauge", NETDEV_LABELS, "1 when the netdev's operstate is up, else 0.")
NETDEV_CARRIER_CHANGES = _m(
    "rnic_netdev_carrier_changes_total",
    "counter",
    NETDEV_LABELS,
    "Carrier up and down transitions of the netdev since it was created.",
)
NETDEV_MTU = _m("rnic_netdev_mtu_bytes", "gauge", NETDEV_LABELS, "MTU of the port's netdev.", "bytes")
GID_ENTRY_INFO = _m(
    "rnic_gid_entry_info",
    "info",
    ("device", "port", "index", "gid", "type", "netdev", "ipv4"),
    "One populated GID table slot, like a show_gids row; always 1.",
)
GID_TABLE_HASH = _m(
    "rnic_gid_table_hash",
    "gauge",
    PORT_LABELS,
    "Stable hash (below 2^53) of the populated GID entries (index, GID, type, netdev); "
    "changes whenever the table does.",
)
GID_ENTRIES = _m("rnic_gid_entries", "gauge", (*PORT_LABELS, "type"), "Populated GID slots per GID type.")
GID_TABLE_SIZE = _m("rnic_gid_table_size", "gauge", PORT_LABELS, "Number of GID table slots of the port.")
NCCL_GID_INDEX = _m(
    "rnic_nccl_gid_index",
    "gauge",
    PORT_LABELS,
    "GID index NCCL would auto-select now (NCCL_IB_GID_INDEX=-1 logic), -1 when none.",
)
ATTRIBUTE_UNAVAILABLE = _m(
    "rnic_attribute_unavailable",
    "gauge",
    ("device", "port", "attribute", "reason"),
    "1 while an attribute that was readable cannot be read or parsed; reason is the errno "
    "name, 'malformed', 'no_pma' or 'empty'. port is empty for device-level attributes.",
)
DEVICES = _m("rnic_devices", "gauge", (), "RDMA devices read in the last poll.")
POLL_DURATION = _m("rnic_exporter_poll_duration_seconds", "gauge", (), "Wall time the last sysfs poll took.", "seconds")
LAST_POLL = _m("rnic_exporter_last_poll_timestamp_seconds", "gauge", (), "Unix time the last poll finished.", "seconds")
POLLS = _m("rnic_exporter_polls_total", "counter", (), "Polls completed since the exporter started.")
READ_ERRORS = _m(
    "rnic_exporter_read_errors_total",
    "counter",
    ("reason",),
    "Attribute reads that failed or did not parse, by reason, since the exporter started.",
)
CONFIG_RELOAD_OK = _m(
    "rnic_exporter_config_last_reload_successful",
    "gauge",
    (),
    "1 when the last config file (re)load succeeded, 0 when it failed and the previous config is still running.",
)
BUILD_INFO = _m(
    "rnic_exporter_build_info", "info", ("version", "python_version"), "rnic-exporter build information; always 1."
)

# Detection and inventory (built from consecutive snapshots, the persisted state and the config).
PORT_RATED_RATE = _m(
    "rnic_port_rated_rate_bytes_per_second",
    "gauge",
    (*PORT_LABELS, "source"),
    "Rated port rate by source: config (configured expectation), ethtool (best link mode "
    "the netdev advertises) or baseline (best rate seen while ACTIVE, persisted).",
    "bytes_per_second",
)
PORT_RATED_WIDTH = _m(
    "rnic_port_rated_width_lanes",
    "gauge",
    (*PORT_LABELS, "source"),
    "Rated lane count by source (config or baseline).",
    "lanes",
)
LINK_BELOW_RATED = _m(
    "rnic_link_below_rated",
    "gauge",
    (*PORT_LABELS, "link"),
    "1 while the link runs below its rated speed or width: link=port (IB port rate), "
    "netdev (Ethernet speed) or pcie (the device's PCIe link, repeated on each port).",
)
DEVICE_PRESENT = _m(
    "rnic_device_present",
    "gauge",
    ("device", "pci_address"),
    "1 while a device of the persisted inventory is present, 0 once it is gone (kept across "
    "restarts and reboots until the inventory is reset).",
)
NETDEV_ADDRESS_PRESENT = _m(
    "rnic_netdev_address_present",
    "gauge",
    (*NETDEV_LABELS, "address"),
    "1 while an expected address (one the netdev has carried, persisted) is on the "
    "netdev, 0 while it is missing; from rtnetlink.",
)
NETDEV_ADDRESSES = _m(
    "rnic_netdev_addresses",
    "gauge",
    (*NETDEV_LABELS, "family"),
    "Addresses on the netdev by family (ipv4, ipv6); from rtnetlink.",
)
NETDEV_ADDRESS_LOSS_RISK = _m(
    "rnic_netdev_address_loss_risk",
    "gauge",
    (*NETDEV_LABELS, "reason"),
    "1 when the netdev's addresses may vanish on a port flap (the cause of GID index "
    "shifts): reason=networkmanager (NetworkManager manages the netdev) or "
    "ipv6_keep_addr_on_down_off.",
)
GID_V2_IPV4_INDEX = _m(
    "rnic_gid_roce_v2_ipv4_index",
    "gauge",
    (*PORT_LABELS, "address"),
    "GID index of the RoCE v2 GID of each IPv4 address on the port; a change means the "
    "address moved to another index (running NCCL jobs break).",
)
NCCL_CONFIGURED_GID_INDEX_VALID = _m(
    "rnic_nccl_configured_gid_index_valid",
    "gauge",
    PORT_LABELS,
    "1 when the GID at the configured NCCL_IB_GID_INDEX can carry NCCL's "
    "traffic (not empty, not link-local, of the RoCE version "
    "NCCL_IB_ROCE_VERSION_NUM asks for, inside NCCL_IB_ADDR_RANGE), 0 when not; "
    "the same judgement as rnic_nccl_gid_usable. Absent when no index is "
    "configured and on ports NCCL does not use (not ACTIVE, InfiniBand).",
)
PORT_FLAPPING = _m(
    "rnic_port_flapping",
    "gauge",
    PORT_LABELS,
    "1 while the port is flapping (N up/down transitions within a window, kept for a while).",
)
GID_TABLE_CHANGES = _m(
    "rnic_gid_table_changes_total",
    "counter",
    PORT_LABELS,
    "Times the port's GID table changed since the exporter started.",
)
EVENTS = _m(
    "rnic_events_total",
    "counter",
    ("event", "device", "port"),
    "Detection events emitted, by catalogue event name (see rnic_exporter/catalog/events.py).",
)
STATE_ERRORS = _m(
    "rnic_exporter_state_errors_total",
    "counter",
    ("reason",),
    "Failures to load or save the state directory, by reason: corrupt, foreign, unreadable, unwritable.",
)
EVENT_SOURCE_ERRORS = _m(
    "rnic_exporter_event_source_errors_total",
    "counter",
    ("source",),
    "Errors of the netlink, udev and ethtool sources and of detection itself; the periodic "
    "poll and the sysfs metrics keep working.",
)
WAKEUPS = _m(
    "rnic_exporter_wakeups_total",
    "counter",
    ("source",),
    "Polls started early because netlink or udev announced a change.",
)
OTLP_EXPORT_FAILURES = _m(
    "rnic_exporter_otlp_export_failures_total",
    "counter",
    ("signal",),
    "OTLP export attempts that failed (endpoint down, slow or refusing), by signal.",
)
OTLP_DROPPED = _m(
    "rnic_exporter_otlp_dropped_total",
    "counter",
    ("signal",),
    "OTLP items dropped because the bounded export queue was full, by signal.",
)
# -- the HTTP front (rnic_exporter/web): node_exporter has promhttp_metric_handler_requests_total{code}.
HTTP_REQUESTS = _m(
    "rnic_exporter_http_requests_total",
    "counter",
    ("code",),
    "HTTP responses the exporter's web server sent, by status code (401: failed basic auth, "
    "503: --web.max-requests reached or unhealthy, 431: request head over 64 KiB).",
)
HTTP_REQUESTS_LIMITED = _m(
    "rnic_exporter_http_requests_limited_total",
    "counter",
    (),
    "Scrapes answered 503 at once because --web.max-requests scrapes were already running.",
)
HTTP_CONNECTIONS_CLOSED_FOR_ROOM = _m(
    "rnic_exporter_http_connections_closed_for_room_total",
    "counter",
    ("stage",),
    "Connections closed at --web.max-connections to make room: stage=waiting, one waiting for a "
    "request; stage=accept, a newcomer closed as soon as it was accepted.",
)
NCCL_GID_USABLE = _m(
    "rnic_nccl_gid_usable",
    "gauge",
    PORT_LABELS,
    "1 when the GID NCCL would use on the RoCE port (NCCL_IB_GID_INDEX, else its auto-selection "
    "under NCCL_IB_ADDR_FAMILY/RANGE/ROCE_VERSION_NUM) can cross nodes, 0 when it is link-local, "
    "of the wrong RoCE version, out of range or missing; absent where NCCL does not use RoCE "
    "(InfiniBand, iWARP, ports not ACTIVE) or the GID table is unreadable.",
)
ATTRIBUTE_UNSUPPORTED = _m(
    "rnic_attribute_unsupported_info",
    "info",
    ("device", "port", "attribute", "reason"),
    "An attribute the driver does not provide (no value, not a fault): reason absent, "
    "no_pma, not_supported (EINVAL/EOPNOTSUPP since the first read) or empty (an empty line, "
    "as rxe's and EFA's fw_ver); always 1.",
)
# Hung reads and data age (a sick firmware blocks a counter read for tens of seconds).
DEVICE_READ_STUCK = _m(
    "rnic_device_read_stuck",
    "gauge",
    DEVICE_LABELS,
    "1 while a sysfs read of the device has been blocking longer than the read deadline "
    "(a hung firmware command); the device is skipped, its last values are served.",
)
POLL_FALLBACK = _m(
    "rnic_exporter_poll_fallback",
    "gauge",
    DEVICE_LABELS,
    "1 while every attribute of the device is polled at --poll.interval because announcements "
    "cannot be trusted for it (netlink off, failing or overrun, or a netdev of it netlink does not "
    "know); 0 while what rtnetlink and udev announce is re-read on the event and every "
    "--poll.safety-interval.",
)
DEVICE_DATA_TIMESTAMP = _m(
    "rnic_device_data_timestamp_seconds",
    "gauge",
    (*DEVICE_LABELS, "pass"),
    "Unix time the device's data was last read in full: pass=state (what detection "
    "judges) or counters (read per scrape and OTLP export).",
    "seconds",
)
ATTRIBUTE_BACKOFF = _m(
    "rnic_attribute_backoff_seconds",
    "gauge",
    ("device", "port", "attribute"),
    "Retry interval of a counter file the function does not support (EINVAL, "
    "EOPNOTSUPP: restricted functions), doubling up to an hour.",
    "seconds",
)
COUNTERS_STALE = _m(
    "rnic_exporter_counters_stale",
    "gauge",
    (),
    "1 when this scrape's counters are not all from a counter pass finished for it (the "
    "scrape stopped waiting, a device's read hangs, or a device was not read yet): they are "
    "the last values read, or missing.",
)
# What the exporter's reads cost the NIC (issue 30; rnic_exporter/sources/read_cost.py models the
# firmware commands behind each kind): counted by the counter pass (sources/device_counters.py) and
# the wire watch (daemon/wire_watch.py, its RoCE netdevs' ethtool requests).
READS = _m(
    "rnic_exporter_reads_total",
    "counter",
    ("device", "kind"),
    "Reads the exporter made of the device, by kind: pma_file (a counters/ file: one firmware "
    "command on mlx5, never cached), hw_counters_file (a hw_counters/ file: up to three on mlx5), "
    "netlink_stat (one RDMA netlink STAT_GET: a port's hw counters in one driver call); the wire of "
    "its RoCE netdevs: module_page (a 128-byte module page: one register access), ethtool_fec and "
    "ethtool_pause (one register read each), ethtool_gstats (ethtool -S: every statistics group), "
    "ethtool_link_state (no firmware access).",
)
READ_PATH = _m(
    "rnic_exporter_read_path_info",
    "info",
    ("device", "path", "reason"),
    "How the device's hw counters are read: path=netlink (one STAT_GET per port) or sysfs (a file "
    "per counter); reason is why (netlink_answers, no_hw_counters, device_wide, not_asked, "
    "netlink_lacks_counters, netlink_<reason it was refused>, disabled by --no-collector.rdma-netlink, "
    "or not_live_sysfs for a tree that is not a sysfs mount); always 1.",
)
# The exporter's own process, from prometheus-client's collectors (sinks/process.py): their names
# and help, the convention every Prometheus client library follows.
PROCESS_CPU = _m(
    "process_cpu_seconds_total", "counter", (), "Total user and system CPU time spent in seconds.", "seconds"
)
PROCESS_RSS = _m("process_resident_memory_bytes", "gauge", (), "Resident memory size in bytes.", "bytes")
PROCESS_VMS = _m("process_virtual_memory_bytes", "gauge", (), "Virtual memory size in bytes.", "bytes")
PROCESS_START = _m(
    "process_start_time_seconds", "gauge", (), "Start time of the process since unix epoch in seconds.", "seconds"
)
PROCESS_OPEN_FDS = _m("process_open_fds", "gauge", (), "Number of open file descriptors.")
PROCESS_MAX_FDS = _m("process_max_fds", "gauge", (), "Maximum number of open file descriptors.")
PYTHON_INFO = _m(
    "python_info", "gauge", ("implementation", "major", "minor", "patchlevel", "version"), "Python platform information"
)
PYTHON_GC_COLLECTED = _m("python_gc_objects_collected_total", "counter", ("generation",), "Objects collected during gc")
PYTHON_GC_UNCOLLECTABLE = _m(
    "python_gc_objects_uncollectable_total", "counter", ("generation",), "Uncollectable objects found during GC"
)
PYTHON_GC_COLLECTIONS = _m(
    "python_gc_collections_total", "counter", ("generation",), "Number of times this generation was collected"
)
PROCESS_METRICS: Mapping[str, MetricSpec] = MappingProxyType(
    {
        m.family_name: m
        for m in (
            PROCESS_CPU,
            PROCESS_RSS,
            PROCESS_VMS,
            PROCESS_START,
            PROCESS_OPEN_FDS,
            PROCESS_MAX_FDS,
            PYTHON_INFO,
            PYTHON_GC_COLLECTED,
            PYTHON_GC_UNCOLLECTABLE,
            PYTHON_GC_COLLECTIONS,
        )
    }
)

# -- consumers: who holds each RDMA device open. Processes are never series: a device's
# processes are counted, and its workloads (a Slurm job, a pod, else a bare command) each get one
# info series, at most CONSUMER_WORKLOADS_MAX per device (rnic_device_workloads stays exact).
CONSUMER_WORKLOAD_LABELS = (
    "device",
    "kind",
    "slurm_job_id",
    "k8s_namespace_name",
    "k8s_pod_name",
    "k8s_pod_uid",
    "command",
)
CONSUMER_WORKLOADS_MAX = 16
DEVICE_CONSUMER_PROCESSES = _m(
    "rnic_device_consumer_processes",
    "gauge",
    DEVICE_LABELS,
    "Processes holding the RDMA device's verbs device (/dev/infiniband/uverbsN) open, as of the last "
    "consumer scan; absent when an incomplete scan found none.",
)
DEVICE_WORKLOADS = _m(
    "rnic_device_workloads",
    "gauge",
    DEVICE_LABELS,
    "Distinct workloads (Slurm jobs, Kubernetes pods, bare commands) using the RDMA device, as of the last "
    "consumer scan.",
)
DEVICE_WORKLOAD_INFO = _m(
    "rnic_device_workload_info",
    "info",
    CONSUMER_WORKLOAD_LABELS,
    "A workload using the RDMA device (kind slurm, pod or process); always 1. Join on device and instance "
    "to name who a problem hits.",
)
CONSUMER_SCAN_DURATION = _m(
    "rnic_exporter_consumer_scan_duration_seconds",
    "gauge",
    (),
    "Wall time the last consumer scan of the process table took.",
    "seconds",
)
CONSUMER_SCAN_TIMESTAMP = _m(
    "rnic_exporter_consumer_scan_timestamp_seconds",
    "gauge",
    (),
    "Unix time the last consumer scan finished.",
    "seconds",
)
CONSUMER_SCAN_COMPLETE = _m(
    "rnic_exporter_consumer_scan_complete",
    "gauge",
    (),
    "1 when the last consumer scan saw the whole process table, 0 when it stopped at its budget.",
)
CONSUMER_SCAN_SKIPPED = _m(
    "rnic_exporter_consumer_scan_skipped_processes",
    "gauge",
    (),
    "Processes the last consumer scan could not inspect (permission denied, or gone mid-scan).",
)
CONSUMER_SCAN_ERRORS = _m(
    "rnic_exporter_consumer_scan_errors_total",
    "counter",
    ("reason",),
    "Consumer scans that failed (reason error) or did not finish within their deadline (reason timeout).",
)
CONSUMER_METRICS: tuple[MetricSpec, ...] = (
    DEVICE_CONSUMER_PROCESSES,
    DEVICE_WORKLOADS,
    DEVICE_WORKLOAD_INFO,
    CONSUMER_SCAN_DURATION,
    CONSUMER_SCAN_TIMESTAMP,
    CONSUMER_SCAN_COMPLETE,
    CONSUMER_SCAN_SKIPPED,
    CONSUMER_SCAN_ERRORS,
)

# The wire below a RoCE netdev: its pluggable module, FEC, why the link went down, pause and PFC.
# Read over ethtool netlink and `ethtool -S` on their own timers (sources/ethtool_netlink.py,
# sources/pause_stats.py) by daemon/wire_watch.py; WIRE_METRICS (part of METRICS) is what the wire
# alerts may name.
MODULE_LABELS = NETDEV_LABELS
LANE_LABELS = (*NETDEV_LABELS, "lane")
THRESHOLD_LABELS = (*NETDEV_LABELS, "limit")  # high_alarm, low_alarm, high_warning, low_warning
MODULE_INFO = _m(
    "rnic_module_info",
    "info",
    (*MODULE_LABELS, "type", "memory_map", "vendor", "part_number", "serial_number", "revision", "oui"),
    "The pluggable module in the netdev's cage (SFF-8636 or CMIS upper page 00h): type is the SFF-8024 "
    "identifier (QSFP28, QSFP-DD, ...), memory_map sff8636|cmis; always 1.",
)
MODULE_TEMPERATURE = _m(
    "rnic_module_temperature_celsius",
    "gauge",
    MODULE_LABELS,
    "Module temperature the module reports (SFF-8636/CMIS lower page); absent for modules without monitors.",
    "celsius",
)
MODULE_SUPPLY_VOLTAGE = _m(
    "rnic_module_supply_voltage_volts", "gauge", MODULE_LABELS, "Module supply voltage (3.3 V nominal).", "volts"
)
MODULE_RX_POWER = _m(
    "rnic_module_rx_power_watts",
    "gauge",
    LANE_LABELS,
    "Received optical power per media lane (average, or OMA where the module says so); 1 mW = 0 dBm.",
    "watts",
)
MODULE_TX_POWER = _m(
    "rnic_module_tx_power_watts", "gauge", LANE_LABELS, "Transmitted optical power per media lane.", "watts"
)
MODULE_TX_BIAS = _m(
    "rnic_module_tx_bias_amperes", "gauge", LANE_LABELS, "Laser bias current per media lane.", "amperes"
)
MODULE_LANE_ACTIVE = _m(
    "rnic_module_lane_active",
    "gauge",
    LANE_LABELS,
    "1 while the host has the media lane's data path activated (CMIS page 11h), 0 while it keeps the lane "
    "dark on purpose (deactivated or changing state: an unused port of a twin-port module; its values are "
    "exported, not judged); absent where the module does not say (SFF-8636, CMIS flat memory).",
)
MODULE_TEMPERATURE_THRESHOLD = _m(
    "rnic_module_temperature_threshold_celsius",
    "gauge",
    THRESHOLD_LABELS,
    "The module's own temperature limits (SFF-8636 page 03h, CMIS page 02h); absent when it publishes none.",
    "celsius",
)
MODULE_SUPPLY_VOLTAGE_THRESHOLD = _m(
    "rnic_module_supply_voltage_threshold_volts", "gauge", THRESHOLD_LABELS, "The module's own voltage limits.", "volts"
)
MODULE_RX_POWER_THRESHOLD = _m(
    "rnic_module_rx_power_threshold_watts", "gauge", THRESHOLD_LABELS, "The module's own Rx power limits.", "watts"
)
MODULE_TX_POWER_THRESHOLD = _m(
    "rnic_module_tx_power_threshold_watts", "gauge", THRESHOLD_LABELS, "The module's own Tx power limits.", "watts"
)
MODULE_TX_BIAS_THRESHOLD = _m(
    "rnic_module_tx_bias_threshold_amperes",
    "gauge",
    THRESHOLD_LABELS,
    "The module's own laser bias limits.",
    "amperes",
)
MODULE_MONITOR_LEVEL = _m(
    "rnic_module_monitor_level",
    "gauge",
    (*NETDEV_LABELS, "monitor", "lane"),
    "Each monitored value judged against the module's own thresholds: -2 below low alarm, -1 below low "
    "warning, 0 normal, 1 above high warning, 2 above high alarm; monitor=temperature|supply_voltage|"
    "rx_power|tx_power|tx_bias, lane empty for module-wide values; absent without thresholds and for a lane "
    "the host keeps dark (rnic_module_lane_active 0) or a transmitter it disabled.",
)
FEC_CORRECTED_BLOCKS = _m(
    "rnic_netdev_fec_corrected_blocks_total",
    "counter",
    NETDEV_LABELS,
    "FEC blocks the PHY corrected (ethtool FEC_GET statistics); rising counts precede symbol errors.",
)
FEC_UNCORRECTABLE_BLOCKS = _m(
    "rnic_netdev_fec_uncorrectable_blocks_total",
    "counter",
    NETDEV_LABELS,
    "FEC blocks the PHY could not correct: corrupted frames on the wire.",
)
FEC_LANE_CORRECTED_BLOCKS = _m(
    "rnic_netdev_fec_lane_corrected_blocks_total", "counter", LANE_LABELS, "Corrected FEC blocks per lane."
)
FEC_LANE_UNCORRECTABLE_BLOCKS = _m(
    "rnic_netdev_fec_lane_uncorrectable_blocks_total", "counter", LANE_LABELS, "Uncorrectable FEC blocks per lane."
)
FEC_HISTOGRAM_CODEWORDS = _m(
    "rnic_netdev_fec_histogram_codewords_total",
    "counter",
    (*NETDEV_LABELS, "bit_errors"),
    "RS-FEC codewords by how many errors the FEC corrected in each (bit_errors=0, 1-3, ...: the driver's "
    "bins, kernel 6.18+); weight moving to the high bins precedes uncorrectable blocks.",
)
FEC_MODE_INFO = _m(
    "rnic_netdev_fec_mode_info", "info", (*NETDEV_LABELS, "mode"), "Active FEC mode: rs, baser, llrs, none; always 1."
)
LINK_DOWN_REASON_INFO = _m(
    "rnic_netdev_link_down_reason_info",
    "info",
    (*NETDEV_LABELS, "state", "substate"),
    "While the link is down, why, as the driver tells (ethtool LINKSTATE_GET extended state and substate: "
    "cable_issue, bad_signal_integrity, eeprom_issue, ...); absent while up or when the driver does not say.",
)
LINK_DOWN_EVENTS = _m(
    "rnic_netdev_link_down_events_total",
    "counter",
    NETDEV_LABELS,
    "Link-down events the device counted (ethtool LINKSTATE_GET EXT_DOWN_CNT, 6.x kernels).",
)
PAUSE_FRAMES = _m(
    "rnic_netdev_pause_frames_total",
    "counter",
    (*NETDEV_LABELS, "direction"),
    "802.3x pause frames (ethtool PAUSE_GET statistics): direction=received (the peer throttles us) or "
    "sent (our receive side is behind).",
)
PRIORITY_PAUSE_FRAMES = _m(
    "rnic_netdev_priority_pause_frames_total",
    "counter",
    (*NETDEV_LABELS, "direction", "priority"),
    "PFC pause frames per priority and direction (driver ethtool -S rx/tx_prioN_pause).",
)
PRIORITY_PAUSE_DURATION = _m(
    "rnic_netdev_priority_pause_duration_seconds_total",
    "counter",
    (*NETDEV_LABELS, "direction", "priority"),
    "Time paused per priority and direction (rx/tx_prioN_pause_duration, microseconds in the driver).",
    "seconds",
)
PRIORITY_PAUSE_TRANSITIONS = _m(
    "rnic_netdev_priority_pause_transitions_total",
    "counter",
    (*NETDEV_LABELS, "direction", "priority"),
    "XOFF to XON transitions per priority and direction (rx/tx_prioN_pause_transition).",
)
PRIORITY_DISCARDS = _m(
    "rnic_netdev_priority_discards_total",
    "counter",
    (*NETDEV_LABELS, "priority", "reason"),
    "Received packets dropped per priority: reason=buffer (rx_prioN_buf_discard, no receive buffer) or "
    "congestion (rx_prioN_cong_discard, shared-buffer congestion control).",
)
PAUSE_STORM_EVENTS = _m(
    "rnic_netdev_pause_storm_events_total",
    "counter",
    (*NETDEV_LABELS, "stage"),
    "Pause storms the device detected: stage=warning (tx_pause_storm_warning_events) or error "
    "(tx_pause_storm_error_events), it sent pause continuously past that time; at error it stops sending pause.",
)
MODULE_EVENTS = _m(
    "rnic_module_events_total",
    "counter",
    (*NETDEV_LABELS, "event"),
    "Module events the driver counted (module_unplug, module_bus_stuck, module_high_temp, module_bad_shorted).",
)
DEVICE_TEMPERATURE = _m(
    "rnic_device_temperature_celsius",
    "gauge",
    ("device", "pci_address", "sensor", "label"),
    "mlx5 hwmon temperatures (Linux 6.6+): sensor=asic for the ASIC and platform sensors, sensor=module for "
    "the module in the cage; the only module reading InfiniBand ports have without vendor tools.",
    "celsius",
)
DEVICE_TEMPERATURE_CRITICAL = _m(
    "rnic_device_temperature_critical_celsius",
    "gauge",
    ("device", "pci_address", "sensor", "label"),
    "The critical temperature hwmon reports for the sensor (temp*_crit).",
    "celsius",
)
ETHTOOL_REQUESTS = _m(
    "rnic_exporter_ethtool_requests_total",
    "counter",
    ("operation",),
    "ethtool requests sent (operation=module_eeprom per 128-byte page, fec, pause, link_state, gstats): "
    "each costs the NIC firmware work (a register access per module page or statistics group on mlx5).",
)
WIRE_READ_ERRORS = _m(
    "rnic_exporter_wire_read_errors_total",
    "counter",
    ("operation",),
    "Wire reads that failed (operation=link_state, fec, pause, module_eeprom, gstats, hwmon, or poll for a "
    "pass that failed as a whole); an unsupported operation (veth, IPoIB) is not an error and not counted.",
)
WIRE_METRICS: tuple[MetricSpec, ...] = (
    MODULE_INFO,
    MODULE_TEMPERATURE,
    MODULE_SUPPLY_VOLTAGE,
    MODULE_RX_POWER,
    MODULE_TX_POWER,
    MODULE_TX_BIAS,
    MODULE_LANE_ACTIVE,
    MODULE_TEMPERATURE_THRESHOLD,
    MODULE_SUPPLY_VOLTAGE_THRESHOLD,
    MODULE_RX_POWER_THRESHOLD,
    MODULE_TX_POWER_THRESHOLD,
    MODULE_TX_BIAS_THRESHOLD,
    MODULE_MONITOR_LEVEL,
    FEC_CORRECTED_BLOCKS,
    FEC_UNCORRECTABLE_BLOCKS,
    FEC_LANE_CORRECTED_BLOCKS,
    FEC_LANE_UNCORRECTABLE_BLOCKS,
    FEC_HISTOGRAM_CODEWORDS,
    FEC_MODE_INFO,
    LINK_DOWN_REASON_INFO,
    LINK_DOWN_EVENTS,
    PAUSE_FRAMES,
    PRIORITY_PAUSE_FRAMES,
    PRIORITY_PAUSE_DURATION,
    PRIORITY_PAUSE_TRANSITIONS,
    PRIORITY_DISCARDS,
    PAUSE_STORM_EVENTS,
    MODULE_EVENTS,
    DEVICE_TEMPERATURE,
    DEVICE_TEMPERATURE_CRITICAL,
    ETHTOOL_REQUESTS,
    WIRE_READ_ERRORS,
)

METRICS: tuple[MetricSpec, ...] = (
    DEVICE_INFO,
    PORT_INFO,
    PORT_STATE,
    PORT_PHYSICAL_STATE,
    PORT_UP,
    PORT_ACTIVE_RATE,
    PORT_ACTIVE_WIDTH,
    PORT_DATA_RECEIVED,
    PORT_DATA_TRANSMITTED,
    PORT_PACKETS_RECEIVED,
    PORT_PACKETS_TRANSMITTED,
    PORT_PMA,
    PORT_HW_STAT,
    DEVICE_HW_STAT,
    PORT_PMA_SATURATED,
    PCIE_LINK_SPEED,
    PCIE_LINK_WIDTH,
    PCIE_AER_ERRORS,
    NETDEV_SPEED,
    NETDEV_UP,
    NETDEV_CARRIER_CHANGES,
    NETDEV_MTU,
    GID_ENTRY_INFO,
    GID_TABLE_HASH,
    GID_ENTRIES,
    GID_TABLE_SIZE,
    NCCL_GID_INDEX,
    ATTRIBUTE_UNAVAILABLE,
    DEVICES,
    POLL_DURATION,
    LAST_POLL,
    POLLS,
    READ_ERRORS,
    CONFIG_RELOAD_OK,
    BUILD_INFO,
    PORT_RATED_RATE,
    PORT_RATED_WIDTH,
    LINK_BELOW_RATED,
    DEVICE_PRESENT,
    NETDEV_ADDRESS_PRESENT,
    NETDEV_ADDRESSES,
    NETDEV_ADDRESS_LOSS_RISK,
    GID_V2_IPV4_INDEX,
    NCCL_CONFIGURED_GID_INDEX_VALID,
    PORT_FLAPPING,
    GID_TABLE_CHANGES,
    EVENTS,
    STATE_ERRORS,
    EVENT_SOURCE_ERRORS,
    WAKEUPS,
    OTLP_EXPORT_FAILURES,
    OTLP_DROPPED,
    ATTRIBUTE_UNSUPPORTED,
    NCCL_GID_USABLE,
    DEVICE_READ_STUCK,
    POLL_FALLBACK,
    DEVICE_DATA_TIMESTAMP,
    ATTRIBUTE_BACKOFF,
    READS,
    READ_PATH,
    COUNTERS_STALE,
    HTTP_REQUESTS,
    HTTP_REQUESTS_LIMITED,
    HTTP_CONNECTIONS_CLOSED_FOR_ROOM,
    *PROCESS_METRICS.values(),
    *CONSUMER_METRICS,
    *WIRE_METRICS,
)

BY_NAME: Mapping[str, MetricSpec] = MappingProxyType({m.name: m for m in METRICS})

# counters/ files that have their own named metric above, so rnic_port_pma_total skips them.
NAMED_PMA_COUNTERS: Mapping[str, MetricSpec] = MappingProxyType(
    {
        "port_rcv_data": PORT_DATA_RECEIVED,
        "port_xmit_data": PORT_DATA_TRANSMITTED,
        "port_rcv_packets": PORT_PACKETS_RECEIVED,
        "port_xmit_packets": PORT_PACKETS_TRANSMITTED,
    }
)

# PMA PortCounters that count errors (IBTA), in PortCounters order: the OTLP sink sends them to
# hw.errors (the rest to rnic.port.pma), and the dashboards' error panels select the same ones.
PMA_ERROR_COUNTER_NAMES: tuple[str, ...] = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
)
