"""RNIC host detail: one node's devices and ports, with detection events as annotations."""

from __future__ import annotations

from collections.abc import Sequence

from grafanalib.core import Dashboard

from rnic_exporter.catalog import events as e
from rnic_exporter.catalog import metrics as c
from rnic_exporter.catalog.link_health import SIGNALS, LinkHealthThresholds
from rnic_exporter.dashboards.fleet import (
    ERROR_COUNTERS,
    HOST_DASHBOARD_UID,
    LINK_ERROR_COUNTERS,
    RETRANSMISSION_COUNTERS,
)
from rnic_exporter.dashboards.panels import (
    BAD_OK,
    NEUTRAL,
    OK_BAD,
    OK_WARN,
    PRESENT_MISSING_MAPPINGS,
    UP_DOWN_MAPPINGS,
    YES_NO_MAPPINGS,
    Layout,
    annotation,
    dashboard,
    datasource_variable,
    name,
    query_variable,
    stat,
    state_timeline,
    table,
    target,
    targets,
    timeseries,
)

UID = HOST_DASHBOARD_UID
PORT_SEL = 'instance=~"$instance", device=~"$device", port=~"$port"'
DEVICE_SEL = 'instance=~"$instance", device=~"$device"'
CONGESTION_COUNTERS = "np_cnp_sent|rp_cnp_handled|rp_cnp_ignored|np_ecn_marked_roce_packets"
ANNOTATIONS: tuple[tuple[str, str, tuple[e.EventSpec, ...]], ...] = (
    (
        "GID change",
        "red",
        (e.GID_TABLE_CHANGED, e.GID_ADDRESS_MOVED, e.NCCL_GID_INDEX_CHANGED, e.NCCL_GID_INDEX_INVALID),
    ),
    ("Port flap", "orange", (e.PORT_DOWN, e.PORT_FLAPPING)),
    ("Address loss", "purple", (e.ADDRESS_LOST, e.ADDRESS_RESTORED)),
    ("Device and link", "yellow", (e.DEVICE_DISAPPEARED, e.DEVICE_REAPPEARED, e.LINK_BELOW_RATED)),
    ("Link degrading", "blue", (e.PORT_DEGRADING,)),  # daemon/link_watch.py: minutes before the alerts' rates
)
# The link-health row draws the limits `check`, the events and the alerts judge with.
LIMITS = LinkHealthThresholds()
# RoCE retransmissions and sequence errors (mlx5 and rxe names), and receive drops: detect/link_health.py.
TRANSPORT_COUNTERS = "|".join(c for s in SIGNALS if s.kind == "transport" for c in s.counters)
DROP_COUNTERS = "|".join(c for s in SIGNALS if s.kind == "drops" for c in s.counters)


def _limit(value: float) -> list[dict[str, object]]:
    return [{"color": "green", "value": None}, {"color": "red", "value": value}]


def event_matcher(specs: Sequence[e.EventSpec]) -> str:
    """`event=~"..."` for the catalogue events, dots escaped (PromQL strings need the backslash doubled)."""
    return 'event=~"' + "|".join(spec.name.replace(".", "\\\\.") for spec in specs) + '"'


def event_expr(specs: Sequence[e.EventSpec]) -> str:
    """Steps where an event counter rose. The `unless ... offset` arm catches an event's first occurrence:
    its series appears at 1, which `changes()` cannot see."""
    sel = f'{event_matcher(specs)}, instance=~"$instance", device=~"$device"'
    counter = name(c.EVENTS)
    return (
        f"sum by (event, device, port) (changes({counter}{{{sel}}}[1m]) > 0 "
        f"or ({counter}{{{sel}}} > 0 unless {counter}{{{sel}}} offset 1m))"
    )


def build() -> Dashboard:
    lay = Layout()
    _workloads(lay)
    _link(lay)
    _traffic(lay)
    _link_health(lay)
    _errors(lay)
    _wire(lay)
    _gids(lay)
    return dashboard(
        "RNIC host detail",
        UID,
        "One node's RDMA NICs per device and port: link state and speed against rated, PCIe, "
        "traffic, errors, RoCE congestion and retransmissions, the GID table and NCCL's index, "
        "with detection events as annotations (rnic-exporter).",
        time_from="now-3h",
        refresh="30s",
        include_vars=True,
        annotations=[annotation(title, event_expr(specs), color) for title, color, specs in ANNOTATIONS],
        variables=[
            datasource_variable(),
            query_variable(
                "instance", "Node", f"label_values({name(c.BUILD_INFO)}, instance)", multi=False, include_all=False
            ),
            query_variable(
                "device",
                "Device",
                f'label_values({name(c.DEVICE_INFO)}{{instance=~"$instance"}}, device)',
                multi=True,
                include_all=True,
            ),
            query_variable(
                "port", "Port", f"label_values({name(c.PORT_INFO)}{{{DEVICE_SEL}}}, port)", multi=True, include_all=True
            ),
        ],
        panels=lay.panels,
    )


def _workloads(lay: Layout) -> None:
    """Who an event hits (--collector.consumers): beside the annotations, at the top."""
    lay.row("Workloads on the RNICs")
    lay.add(
        table(
            "Jobs and pods per device",
            "The Slurm jobs, Kubernetes pods and bare commands holding each RNIC's verbs device open at any "
            "time in the shown range (rnic_device_workload_info; needs --collector.consumers). A job that "
            "died with an event is still listed.",
            [
                target(
                    f"max by (device, kind, slurm_job_id, k8s_namespace_name, k8s_pod_name, k8s_pod_uid, command) "
                    f"(max_over_time({name(c.DEVICE_WORKLOAD_INFO)}{{{DEVICE_SEL}}}[$__range]))",
                    instant=True,
                    table=True,
                )
            ],
            hide=("Value",),
            rename={
                "slurm_job_id": "Slurm job",
                "k8s_namespace_name": "namespace",
                "k8s_pod_name": "pod",
                "k8s_pod_uid": "pod uid",
            },
        ),
        w=16,
        h=7,
    )
    lay.add(
        timeseries(
            "Verbs processes per device",
            "Processes holding each RNIC's /dev/infiniband/uverbsN open, from the last consumer scan; "
            "the event annotations show when a job lost its NIC.",
            [target(f"{name(c.DEVICE_CONSUMER_PROCESSES)}{{{DEVICE_SEL}}}", "{{device}}")],
            "none",
            step=True,
        ),
        w=8,
        h=7,
    )


def _link(lay: Layout) -> None:
    lay.row("Link")
    lay.add(
        state_timeline(
            "Port up",
            "ACTIVE and LinkUp (rnic_port_up) per port.",
            [target(f"{name(c.PORT_UP)}{{{PORT_SEL}}}", "{{device}}/{{port}}")],
            UP_DOWN_MAPPINGS,
            thresholds=BAD_OK,
        ),
        w=12,
        h=6,
    )
    lay.add(
        state_timeline(
            "Below rated",
            "1 while the IB port, the netdev or the PCIe link runs below its rated speed or width.",
            [target(f"{name(c.LINK_BELOW_RATED)}{{{PORT_SEL}}}", "{{device}}/{{port}} {{link}}")],
            YES_NO_MAPPINGS,
        ),
        w=12,
        h=6,
    )
    lay.add(
        timeseries(
            "Active vs rated rate",
            "Active IB port rate and netdev speed against the rated rate by "
            "source (config, ethtool, baseline). A 400G port at 200G halves every collective over it.",
            targets(
                (f"{name(c.PORT_ACTIVE_RATE)}{{{PORT_SEL}}}", "{{device}}/{{port}} active"),
                (f"{name(c.NETDEV_SPEED)}{{{PORT_SEL}}}", "{{device}}/{{port}} {{netdev}}"),
                (f"{name(c.PORT_RATED_RATE)}{{{PORT_SEL}}}", "{{device}}/{{port}} rated {{source}}"),
            ),
            "Bps",
            step=True,
        ),
        w=12,
        h=8,
    )
    lay.add(
        timeseries(
            "Active vs rated width",
            "Active lane count of the port against the rated one.",
            targets(
                (f"{name(c.PORT_ACTIVE_WIDTH)}{{{PORT_SEL}}}", "{{device}}/{{port}} active"),
                (f"{name(c.PORT_RATED_WIDTH)}{{{PORT_SEL}}}", "{{device}}/{{port}} rated {{source}}"),
            ),
            "none",
            step=True,
        ),
        w=12,
        h=8,
    )
    lay.add(
        timeseries(
            "PCIe speed: current vs max",
            "PCIe link speed of the device (GT/s): current, the "
            "card's max and the slot's max. Current below both is a downtrained link.",
            [target(f"{name(c.PCIE_LINK_SPEED)}{{{DEVICE_SEL}}} / 1e9", "{{device}} {{link}}")],
            "suffix: GT/s",
            step=True,
        ),
        w=12,
        h=8,
    )
    lay.add(
        timeseries(
            "PCIe width: current vs max",
            "PCIe link width of the device (lanes): current, the card's max and the slot's max.",
            [target(f"{name(c.PCIE_LINK_WIDTH)}{{{DEVICE_SEL}}}", "{{device}} {{link}}")],
            "none",
            step=True,
        ),
        w=12,
        h=8,
    )
    lay.add(
        timeseries(
            "PCIe AER errors",
            "PCIe errors the device's PCI function reported (AER), per interval, by severity: any fatal "
            "or non-fatal one is a fault (RnicPcieAerFatalErrors, RnicPcieAerNonFatalErrors); correctable "
            "ones are link retries, a steady stream is a marginal link. No data: AER is off on this host.",
            [
                target(
                    f"increase({name(c.PCIE_AER_ERRORS)}{{{DEVICE_SEL}}}[$__rate_interval])",
                    "{{device}} {{severity}}",
                )
            ],
            "none",
        ),
        w=24,
        h=8,
    )


def _traffic(lay: Layout) -> None:
    lay.row("Traffic")
    lay.add(
        timeseries(
            "Throughput in and out",
            "RDMA bytes per second per port (on mlx5 RoCE: RDMA traffic only; the netdev counts the rest).",
            targets(
                (f"rate({name(c.PORT_DATA_RECEIVED)}{{{PORT_SEL}}}[$__rate_interval])", "{{device}}/{{port}} in"),
                (f"rate({name(c.PORT_DATA_TRANSMITTED)}{{{PORT_SEL}}}[$__rate_interval])", "{{device}}/{{port}} out"),
            ),
            "Bps",
            thresholds=NEUTRAL,
        ),
        w=12,
        h=8,
    )
    lay.add(
        timeseries(
            "Packets in and out",
            "Packets per second per port.",
            targets(
                (f"rate({name(c.PORT_PACKETS_RECEIVED)}{{{PORT_SEL}}}[$__rate_interval])", "{{device}}/{{port}} in"),
                (
                    f"rate({name(c.PORT_PACKETS_TRANSMITTED)}{{{PORT_SEL}}}[$__rate_interval])",
                    "{{device}}/{{port}} out",
                ),
            ),
            "pps",
            thresholds=NEUTRAL,
        ),
        w=12,
        h=8,
    )


def _link_health(lay: Layout) -> None:
    """Issue 31: the counters that rise before a job dies, as the alerts judge them."""
    lay.row("Link health")
    by_port = "on (instance, job, device, port) group_left ()"
    pma, hw = name(c.PORT_PMA), name(c.PORT_HW_STAT)
    packets = (
        f"(rate({name(c.PORT_PACKETS_RECEIVED)}{{{PORT_SEL}}}[5m]) + on (instance, job, device, port) "
        f"rate({name(c.PORT_PACKETS_TRANSMITTED)}{{{PORT_SEL}}}[5m]))"
    )
    lay.add(
        timeseries(
            "Symbol-error bit-error rate",
            "Symbol errors per bit carried (5-minute rate over the active rate, lanes x per-lane speed); the red "
            f"line is the IBTA limit {LIMITS.symbol_error_ber:g} (RnicLinkSymbolErrors).",
            [
                target(
                    f'rate({pma}{{counter="symbol_error", {PORT_SEL}}}[5m]) / {by_port} '
                    f"({name(c.PORT_ACTIVE_RATE)}{{{PORT_SEL}}} > 0) / 8",
                    "{{device}}/{{port}} BER",
                )
            ],
            "sci",
            thresholds=_limit(LIMITS.symbol_error_ber),
        ),
        w=6,
        h=8,
    )
    lay.add(
        timeseries(
            "Link retraining and integrity",
            "Link retrains (link_error_recovery), drops (link_downed) and link-integrity threshold "
            "crossings per 5 minutes: a healthy link shows none (RnicLinkRetrained).",
            [
                target(
                    f'increase({pma}{{counter=~"{LINK_ERROR_COUNTERS.replace("symbol_error|", "")}", {PORT_SEL}}}[5m])',
                    "{{device}}/{{port}} {{counter}}",
                )
            ],
            "short",
            thresholds=OK_BAD,
        ),
        w=6,
        h=8,
    )
    lay.add(
        timeseries(
            "Retransmissions per packet",
            "RoCE retransmission and sequence-error counters per packet the port carried, both directions "
            f"(5-minute rates); the red line is {LIMITS.retransmission_ratio:g} (RnicRoceRetransmissions). "
            "Ports without PMA packet counters (rxe) show in the Retransmissions panel below.",
            [
                target(
                    f'rate({hw}{{counter=~"{TRANSPORT_COUNTERS}", {PORT_SEL}}}[5m]) / {by_port} {packets}',
                    "{{device}}/{{port}} {{counter}}",
                )
            ],
            "sci",
            thresholds=_limit(LIMITS.retransmission_ratio),
        ),
        w=6,
        h=8,
    )
    lay.add(
        timeseries(
            "Receive drops per received packet",
            f"out_of_buffer (and rx_discards_phy where present) per received packet; the red line is "
            f"{LIMITS.drop_ratio:g} (RnicReceiveDrops).",
            [
                target(
                    f'rate({hw}{{counter=~"{DROP_COUNTERS}", {PORT_SEL}}}[5m]) / {by_port} '
                    f"rate({name(c.PORT_PACKETS_RECEIVED)}{{{PORT_SEL}}}[5m])",
                    "{{device}}/{{port}} {{counter}}",
                ),
            ],
            "sci",
            thresholds=_limit(LIMITS.drop_ratio),
        ),
        w=6,
        h=8,
    )


def _errors(lay: Layout) -> None:
    lay.row("Errors, congestion and retransmissions")
    lay.add(
        timeseries(
            "Error counters",
            "PMA error counters per second: symbol errors and link error "
            "recovery point at the cable or transceiver, discards at congestion.",
            [
                target(
                    f'rate({name(c.PORT_PMA)}{{counter=~"{ERROR_COUNTERS}", {PORT_SEL}}}[$__rate_interval])',
                    "{{device}}/{{port}} {{counter}}",
                )
            ],
            "cps",
            thresholds=OK_BAD,
        ),
        w=8,
        h=8,
    )
    lay.add(
        timeseries(
            "RoCE congestion (CNP, ECN)",
            "Congestion notification packets sent and handled and "
            "ECN-marked packets per second: DCQCN at work. Sustained CNPs mean a congested fabric.",
            [
                target(
                    f'rate({name(c.PORT_HW_STAT)}{{counter=~"{CONGESTION_COUNTERS}", {PORT_SEL}}}[$__rate_interval])',
                    "{{device}}/{{port}} {{counter}}",
                )
            ],
            "cps",
            thresholds=NEUTRAL,
        ),
        w=8,
        h=8,
    )
    lay.add(
        timeseries(
            "Retransmissions (out of sequence, ACK timeouts)",
            "RoCE retransmission counters per "
            "second. Out-of-sequence and ACK timeouts mean lost packets: a lossy fabric or a bad link.",
            [
                target(
                    f'rate({name(c.PORT_HW_STAT)}{{counter=~"{RETRANSMISSION_COUNTERS}", '
                    f"{PORT_SEL}}}[$__rate_interval])",
                    "{{device}}/{{port}} {{counter}}",
                )
            ],
            "cps",
            thresholds=OK_BAD,
        ),
        w=8,
        h=8,
    )


def _wire(lay: Layout) -> None:
    """The wire below RoCE netdevs (--collector.wire): what degrades before the link does."""
    lay.row("Optics, FEC and pause (RoCE)")
    lay.add(
        timeseries(
            "Module temperature",
            "The pluggable module's own temperature, and its high warning threshold (read every minute).",
            targets(
                (f"{name(c.MODULE_TEMPERATURE)}{{{PORT_SEL}}}", "{{device}}/{{port}} {{netdev}}"),
                (
                    f'{name(c.MODULE_TEMPERATURE_THRESHOLD)}{{limit="high_warning", {PORT_SEL}}}',
                    "{{device}}/{{port}} high warning",
                ),
            ),
            "celsius",
            thresholds=NEUTRAL,
        ),
        w=6,
        h=8,
    )
    lay.add(
        timeseries(
            "Rx power vs its warning threshold",
            "Received optical power per lane against the module's own low warning threshold: a lane "
            "falling towards it is a dirty connector, a bent fibre or a failing optic, before the link "
            "renegotiates or drops.",
            targets(
                (f"{name(c.MODULE_RX_POWER)}{{{PORT_SEL}}}", "{{device}}/{{port}} lane {{lane}}"),
                (
                    f'{name(c.MODULE_RX_POWER_THRESHOLD)}{{limit="low_warning", {PORT_SEL}}}',
                    "{{device}}/{{port}} low warning",
                ),
            ),
            "watt",
            thresholds=NEUTRAL,
        ),
        w=6,
        h=8,
    )
    lay.add(
        timeseries(
            "FEC corrected and uncorrectable blocks",
            "FEC blocks per second: corrected blocks rising is the early sign; uncorrectable ones are "
            "corrupted frames that RoCE must retransmit. Kernels 6.18+ also split the corrected ones by "
            "how many errors each held: weight moving to the high bins comes first.",
            targets(
                (
                    f"rate({name(c.FEC_CORRECTED_BLOCKS)}{{{PORT_SEL}}}[$__rate_interval])",
                    "{{device}}/{{port}} corrected",
                ),
                (
                    f"rate({name(c.FEC_UNCORRECTABLE_BLOCKS)}{{{PORT_SEL}}}[$__rate_interval])",
                    "{{device}}/{{port}} uncorrectable",
                ),
                (  # 6.18+ kernels: the corrected ones by errors each; bin 0 (clean codewords) would drown them
                    f'rate({name(c.FEC_HISTOGRAM_CODEWORDS)}{{bit_errors!="0", {PORT_SEL}}}[$__rate_interval])',
                    "{{device}}/{{port}} corrected with {{bit_errors}} errors",
                ),
            ),
            "cps",
            thresholds=OK_BAD,
        ),
        w=6,
        h=8,
    )
    lay.add(
        timeseries(
            "Time paused per priority",
            "Share of time each priority was paused (PFC): received = the peer throttles this host, sent "
            "= this host's receive side is behind. Near 100% is a pause storm.",
            targets(
                (
                    f"rate({name(c.PRIORITY_PAUSE_DURATION)}{{{PORT_SEL}}}[$__rate_interval])",
                    "{{device}}/{{port}} prio {{priority}} {{direction}}",
                ),
            ),
            "percentunit",
            thresholds=OK_BAD,
        ),
        w=6,
        h=8,
    )


def _gids(lay: Layout) -> None:
    lay.row("GIDs, NCCL and addresses")
    lay.add(
        table(
            "GID table",
            "Populated GID slots, like show_gids. NCCL wants the RoCE v2 IPv4 row.",
            [target(f"{name(c.GID_ENTRY_INFO)}{{{PORT_SEL}}}", instant=True, table=True)],
            hide=("Value", "instance"),
            rename={"ipv4": "IPv4", "gid": "GID"},
        ),
        w=24,
        h=8,
    )
    lay.add(
        timeseries(
            "NCCL auto-selected GID index",
            "The GID index NCCL's auto-selection would pick now "
            "(-1: none). A step is a move: jobs started before it use the old index.",
            [target(f"{name(c.NCCL_GID_INDEX)}{{{PORT_SEL}}}", "{{device}}/{{port}}")],
            "none",
            step=True,
            min_zero=False,
        ),
        w=8,
        h=8,
    )
    lay.add(
        timeseries(
            "RoCE v2 GID index per address",
            "GID index of each IPv4 address's RoCE v2 GID. A step is the GID shift of incident 1.",
            [target(f"{name(c.GID_V2_IPV4_INDEX)}{{{PORT_SEL}}}", "{{device}}/{{port}} {{address}}")],
            "none",
            step=True,
        ),
        w=8,
        h=8,
    )
    lay.add(
        stat(
            "Configured NCCL_IB_GID_INDEX",
            "Whether the configured NCCL_IB_GID_INDEX points at a RoCE v2 IPv4 GID on each port (absent without one).",
            [target(f"{name(c.NCCL_CONFIGURED_GID_INDEX_VALID)}{{{PORT_SEL}}}", "{{device}}/{{port}}")],
            thresholds=BAD_OK,
            mappings=[
                {
                    "type": "value",
                    "options": {
                        "0": {"text": "invalid", "color": "red", "index": 0},
                        "1": {"text": "valid", "color": "green", "index": 1},
                    },
                }
            ],
        ),
        w=8,
        h=8,
    )
    lay.add(
        state_timeline(
            "Address presence",
            "Expected addresses on each RNIC netdev (rtnetlink). A gap is an "
            "address loss; with NetworkManager it comes back at a new GID index.",
            [target(f"{name(c.NETDEV_ADDRESS_PRESENT)}{{{PORT_SEL}}}", "{{netdev}} {{address}}")],
            PRESENT_MISSING_MAPPINGS,
            thresholds=BAD_OK,
        ),
        w=12,
        h=6,
    )
    lay.add(
        state_timeline(
            "Flapping and address-loss risk",
            "Port flapping, and netdevs whose addresses a flap "
            "may remove (NetworkManager, IPv6 keep_addr_on_down off).",
            targets(
                (f"{name(c.PORT_FLAPPING)}{{{PORT_SEL}}}", "{{device}}/{{port}} flapping"),
                (f"{name(c.NETDEV_ADDRESS_LOSS_RISK)}{{{PORT_SEL}}}", "{{netdev}} risk {{reason}}"),
            ),
            YES_NO_MAPPINGS,
            thresholds=OK_WARN,
        ),
        w=12,
        h=6,
    )
