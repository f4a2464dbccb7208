"""RNIC fleet overview: which nodes have a sick RNIC right now, and what kind of sick."""

from __future__ import annotations

from grafanalib.core import Dashboard

from rnic_exporter import catalog as c
from rnic_exporter.dashboards.panels import (
    NEUTRAL,
    OK_BAD,
    OK_WARN,
    Layout,
    dashboard,
    datasource_variable,
    name,
    query_variable,
    stat,
    table,
    target,
    targets,
    timeseries,
)

UID = "rnic-fleet-overview"
HOST_DASHBOARD_UID = "rnic-host-detail"
SEL = 'instance=~"$instance"'

# PMA counters that mean a damaged link or a dropped packet (IBTA PortCounters), as the kernel names them:
# the ones OTLP exports as hw.errors.
ERROR_COUNTERS = "|".join(c.PMA_ERROR_COUNTER_NAMES)
# mlx5 hw_counters that count RoCE retransmissions and their causes.
RETRANSMISSION_COUNTERS = (
    "out_of_sequence|packet_seq_err|implied_nak_seq_err|local_ack_timeout_err|"
    "rnr_nak_retry_err|duplicate_request|roce_adp_retrans|roce_slow_restart"
)


def build() -> Dashboard:
    lay = Layout()
    _health(lay)
    _gids_and_addresses(lay)
    _counters(lay)
    return dashboard(
        "RNIC fleet overview",
        UID,
        "Every node's RDMA NICs at a glance: missing NICs, ports down, links below rated, GID "
        "index moves, address losses, flapping ports, errors and throughput (rnic-exporter).",
        time_from="now-6h",
        refresh="1m",
        include_vars=False,
        variables=[
            datasource_variable(),
            query_variable(
                "instance", "Node", f"label_values({name(c.BUILD_INFO)}, instance)", multi=True, include_all=True
            ),
        ],
        panels=lay.panels,
    )


def _health(lay: Layout) -> None:
    lay.row("Health now")
    lay.add(
        stat(
            "RNICs missing",
            "Devices of the persisted inventory that are gone (rnic_device_present == 0): "
            "a NIC that fell off the PCIe bus, a driver reset or a firmware crash.",
            [target(f"sum({name(c.DEVICE_PRESENT)}{{{SEL}}} == bool 0)", "missing")],
        ),
        w=4,
        h=4,
    )
    lay.add(
        stat(
            "Ports not up",
            "RDMA ports that are not ACTIVE/LinkUp, including never-cabled ones.",
            [target(f"sum({name(c.PORT_UP)}{{{SEL}}} == bool 0)", "not up")],
            thresholds=OK_WARN,
        ),
        w=4,
        h=4,
    )
    lay.add(
        stat(
            "Links below rated",
            "Ports whose IB port rate, netdev speed or PCIe link runs below its rated "
            "speed or width; PCIe counted once per device.",
            [
                target(
                    f"sum by (link) (max by (instance, device, port, link) "
                    f'({name(c.LINK_BELOW_RATED)}{{link=~"port|netdev", {SEL}}}))',
                    "{{link}}",
                    "A",
                ),
                target(
                    f"sum by (link) (max by (instance, device, link) "
                    f'({name(c.LINK_BELOW_RATED)}{{link="pcie", {SEL}}}))',
                    "{{link}}",
                    "B",
                ),
            ],
            thresholds=OK_WARN,
        ),
        w=6,
        h=4,
    )
    lay.add(
        stat(
            "Flapping ports",
            "Ports the exporter sees going down and up repeatedly.",
            [target(f"sum({name(c.PORT_FLAPPING)}{{{SEL}}})", "flapping")],
            thresholds=OK_WARN,
        ),
        w=4,
        h=4,
    )
    lay.add(
        stat(
            "NetworkManager risk",
            "RNIC netdevs managed by NetworkManager: a port flap removes their "
            "addresses and may move GID indices (incident 1). Configure them with ifupdown or "
            "systemd-networkd KeepConfiguration= instead.",
            [target(f'sum({name(c.NETDEV_ADDRESS_LOSS_RISK)}{{reason="networkmanager", {SEL}}})', "netdevs")],
            thresholds=OK_WARN,
        ),
        w=6,
        h=4,
    )
    node_link = [
        {
            "title": "Host detail",
            "url": f"/d/{HOST_DASHBOARD_UID}?var-datasource=${{datasource}}"
            "&var-instance=${__data.fields.instance}&${__url_time_range}",
        }
    ]
    lay.add(
        table(
            "RNICs present vs known per node",
            "Per node: RDMA devices read in the last poll, devices the inventory knows, and how many of "
            "those are present. Click a node for its detail.",
            # Every column aggregated by instance alone, so the merge joins them into one row per node.
            [
                target(f"sum by (instance) ({name(c.DEVICES)}{{{SEL}}})", ref="A", instant=True, table=True),
                target(f"count by (instance) ({name(c.DEVICE_PRESENT)}{{{SEL}}})", ref="B", instant=True, table=True),
                target(f"sum by (instance) ({name(c.DEVICE_PRESENT)}{{{SEL}}})", ref="C", instant=True, table=True),
                target(f"sum by (instance) ({name(c.PORT_UP)}{{{SEL}}} == bool 0)", ref="D", instant=True, table=True),
            ],
            merge=True,
            rename={
                "instance": "node",
                "Value #A": "read",
                "Value #B": "known",
                "Value #C": "present",
                "Value #D": "ports not up",
            },
            overrides=[
                {"matcher": {"id": "byName", "options": "node"}, "properties": [{"id": "links", "value": node_link}]}
            ],
        ),
        w=12,
        h=8,
    )
    lay.add(
        timeseries(
            "Ports not up per node",
            "RDMA ports not ACTIVE/LinkUp, per node.",
            [target(f"sum by (instance) ({name(c.PORT_UP)}{{{SEL}}} == bool 0)", "{{instance}}")],
            "none",
            thresholds=OK_WARN,
            step=True,
        ),
        w=12,
        h=8,
    )


def _gids_and_addresses(lay: Layout) -> None:
    lay.row("GIDs and addresses in the time range")
    lay.add(
        stat(
            "GID table changes",
            "Times a GID table changed (its hash) in the time range. Jobs that cached "
            "a GID index may use a wrong one afterwards.",
            [target(f"sum(changes({name(c.GID_TABLE_HASH)}{{{SEL}}}[$__range]))", "changes")],
            thresholds=OK_WARN,
        ),
        w=6,
        h=4,
    )
    lay.add(
        stat(
            "RoCE v2 address index moves",
            "Times the RoCE v2 GID index of an IPv4 address moved in the "
            "time range (incident 1): NCCL jobs started before the move break.",
            [target(f"sum(changes({name(c.GID_V2_IPV4_INDEX)}{{{SEL}}}[$__range]))", "moves")],
        ),
        w=6,
        h=4,
    )
    lay.add(
        stat(
            "NCCL GID index moves",
            "Times the GID index NCCL would auto-select changed in the time range; "
            "running jobs keep the index they started with.",
            [target(f"sum(changes({name(c.NCCL_GID_INDEX)}{{{SEL}}}[$__range]))", "moves")],
            thresholds=OK_WARN,
        ),
        w=6,
        h=4,
    )
    lay.add(
        stat(
            "Address losses",
            "RNIC addresses that were missing at some point in the time range "
            "(rtnetlink). A loss with NetworkManager is how GID indices move.",
            [target(f"sum(min_over_time({name(c.NETDEV_ADDRESS_PRESENT)}{{{SEL}}}[$__range]) == bool 0)", "addresses")],
        ),
        w=6,
        h=4,
    )
    lay.add(
        table(
            "Ports with GID or address changes",
            "Ports whose GID table, RoCE v2 address indices, NCCL index or addresses changed in the time range.",
            [
                target(
                    f"sum by (instance, device, port) (changes({name(c.GID_TABLE_HASH)}{{{SEL}}}[$__range])) > 0",
                    ref="A",
                    instant=True,
                    table=True,
                ),
                target(
                    f"sum by (instance, device, port) (changes({name(c.GID_V2_IPV4_INDEX)}{{{SEL}}}[$__range])) > 0",
                    ref="B",
                    instant=True,
                    table=True,
                ),
                target(
                    f"sum by (instance, device, port) (changes({name(c.NCCL_GID_INDEX)}{{{SEL}}}[$__range])) > 0",
                    ref="C",
                    instant=True,
                    table=True,
                ),
            ],
            merge=True,
            rename={"Value #A": "GID table changes", "Value #B": "address index moves", "Value #C": "NCCL index moves"},
        ),
        w=24,
        h=6,
    )


def _counters(lay: Layout) -> None:
    lay.row("Errors and throughput")
    lay.add(
        table(
            "Top error counters",
            "PMA error counters (symbol errors, link downed, receive errors, "
            "discards...) that grew most in the time range.",
            [
                target(
                    f"topk(10, sum by (instance, device, port, counter) "
                    f'(increase({name(c.PORT_PMA)}{{counter=~"{ERROR_COUNTERS}", {SEL}}}[$__range])))',
                    instant=True,
                    table=True,
                )
            ],
            rename={"Value": "increase"},
        ),
        w=12,
        h=8,
    )
    lay.add(
        table(
            "Top retransmission counters",
            "RoCE retransmission counters (out of sequence, ACK timeouts, "
            "sequence errors...) that grew most in the time range.",
            [
                target(
                    f"topk(10, sum by (instance, device, port, counter) "
                    f'(increase({name(c.PORT_HW_STAT)}{{counter=~"{RETRANSMISSION_COUNTERS}", {SEL}}}'
                    "[$__range])))",
                    instant=True,
                    table=True,
                )
            ],
            rename={"Value": "increase"},
        ),
        w=12,
        h=8,
    )
    lay.add(
        timeseries(
            "RDMA throughput per node",
            "Bytes per second over all RDMA ports of the node (on mlx5 RoCE: RDMA traffic only).",
            targets(
                (
                    f"sum by (instance) (rate({name(c.PORT_DATA_TRANSMITTED)}{{{SEL}}}[$__rate_interval]))",
                    "{{instance}} out",
                ),
                (
                    f"sum by (instance) (rate({name(c.PORT_DATA_RECEIVED)}{{{SEL}}}[$__rate_interval]))",
                    "{{instance}} in",
                ),
            ),
            "Bps",
            thresholds=NEUTRAL,
        ),
        w=24,
        h=8,
    )
    lay.add(
        timeseries(
            "Error counter rate per node",
            "PMA error counters per second, summed per node.",
            [
                target(
                    f'sum by (instance) (rate({name(c.PORT_PMA)}{{counter=~"{ERROR_COUNTERS}", {SEL}}}'
                    "[$__rate_interval]))",
                    "{{instance}}",
                )
            ],
            "cps",
            thresholds=OK_BAD,
        ),
        w=12,
        h=8,
    )
    lay.add(
        timeseries(
            "Retransmission rate per node",
            "RoCE retransmission counters per second, summed per node.",
            [
                target(
                    f"sum by (instance) (rate({name(c.PORT_HW_STAT)}"
                    f'{{counter=~"{RETRANSMISSION_COUNTERS}", {SEL}}}[$__rate_interval]))',
                    "{{instance}}",
                )
            ],
            "cps",
            thresholds=OK_BAD,
        ),
        w=12,
        h=8,
    )
