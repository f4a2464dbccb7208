"""RNIC fleet overview: which nodes have a sick RNIC right now, and what kind of sick."""

from __future__ import annotations

import attr
from grafanalib.core import Dashboard, Target

from rnic_exporter.catalog import metrics as c
from rnic_exporter.dashboards import recording as r
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
# Every panel reads the recorded series of alerts/rnic-recording.rules.yml (one per node, or per port only
# while something is wrong), so a refresh over 10,000 nodes never scans every raw series. Raw metrics only
# where they are one series per node already (build_info for the variable, rnic_devices).
# host.py takes the counter sets from here; their one home is the recording rules.
ERROR_COUNTERS = r.ERROR_COUNTERS
# The PMA counters of a failing link (detect/link_health.py: symbol errors, retraining, integrity).
LINK_ERROR_COUNTERS = (
    "symbol_error|link_error_recovery|link_downed|local_link_integrity_errors|excessive_buffer_overrun_errors"
)
RETRANSMISSION_COUNTERS = r.RETRANSMISSION_COUNTERS
BUSIEST = 20
# Recorded series have one point per evaluation (1 minute by default): a finer step redraws the same points
# and costs Grafana's 1,000 points per panel in query time.
MIN_STEP = "1m"


def _minutely(queries: list[Target]) -> list[Target]:
    return [attr.evolve(t, interval=MIN_STEP) for t in queries]


NETWORKMANAGER = 'reason="networkmanager", '


def _s(rule: r.Rule, extra: str = "") -> str:
    """The recorded series of `rule` for the selected nodes."""
    return f"{rule.record}{{{extra}{SEL}}}"


def _not(total: r.Rule, part: r.Rule) -> str:
    """total - part per node: known minus present devices, ports minus ports up."""
    return f"({_s(total)} - {_s(part)})"


def _count_in_range(rule: r.Rule) -> str:
    """How many ports/addresses a sparse rule recorded at some point of the time range (0 when none)."""
    return f"count(max_over_time({_s(rule)}[$__range])) or vector(0)"


def build() -> Dashboard:
    lay = Layout()
    _health(lay)
    _link_health(lay)
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
            [target(f"sum{_not(r.DEVICES_KNOWN, r.DEVICES_PRESENT)}", "missing")],
        ),
        w=4,
        h=4,
    )
    lay.add(
        stat(
            "Ports not up",
            "RDMA ports that are not ACTIVE/LinkUp, including never-cabled ones.",
            [target(f"sum({_s(r.PORTS_NOT_UP)}) or vector(0)", "not up")],
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
            [target(f"sum by (link) ({_s(r.LINKS_BELOW_RATED)})", "{{link}}")],
            thresholds=OK_WARN,
        ),
        w=6,
        h=4,
    )
    lay.add(
        stat(
            "Flapping ports",
            "Ports the exporter sees going down and up repeatedly.",
            [target(f"sum({_s(r.PORTS_FLAPPING)})", "flapping")],
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
            [target(f"sum({_s(r.ADDRESS_LOSS_RISK, NETWORKMANAGER)})", "netdevs")],
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
            "Per node: RDMA devices read in the last poll, devices the inventory knows, how many of those "
            "are present, and ports not up. Click a node for its detail.",
            # Every column aggregated by instance alone, so the merge joins them into one row per node.
            [
                target(f"sum by (instance) ({name(c.DEVICES)}{{{SEL}}})", ref="A", instant=True, table=True),
                target(f"sum by (instance) ({_s(r.DEVICES_KNOWN)})", ref="B", instant=True, table=True),
                target(f"sum by (instance) ({_s(r.DEVICES_PRESENT)})", ref="C", instant=True, table=True),
                target(f"sum by (instance) {_not(r.PORTS, r.PORTS_UP)}", ref="D", instant=True, table=True),
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
            "RDMA ports not ACTIVE/LinkUp, per node; only nodes with one (10,000 lines help nobody).",
            _minutely([target(f"sum by (instance) ({_s(r.PORTS_NOT_UP)})", "{{instance}}")]),
            "none",
            thresholds=OK_WARN,
            step=True,
        ),
        w=12,
        h=8,
    )


def _link_health(lay: Layout) -> None:
    """Issue 31: the error counters that rise before a job dies, from the sparse recorded series
    (a port appears only while a counter grows). The alerts judge the limits; these say where."""
    lay.row("Link health")
    link = _s(r.ERRORS_PER_COUNTER, f'counter=~"{LINK_ERROR_COUNTERS}", ')
    by_port = "instance, job, device, port"
    lay.add(
        stat(
            "Ports with link errors",
            "Ports whose symbol-error, link-retraining or link-integrity counters grow now (5-minute rate): "
            "a cable or transceiver going bad. RnicLinkSymbolErrors and RnicLinkRetrained judge the limits.",
            [target(f"count(count by ({by_port}) ({link})) or vector(0)", "ports")],
            thresholds=OK_WARN,
        ),
        w=6,
        h=4,
    )
    lay.add(
        stat(
            "Ports retransmitting",
            "Ports whose RoCE retransmission or sequence-error counters grow now (5-minute rate): packets "
            "lost or reordered on the path. RnicRoceRetransmissions judges them against the packets carried.",
            [target(f"count(count by ({by_port}) ({_s(r.RETRANSMISSIONS_PER_COUNTER)})) or vector(0)", "ports")],
            thresholds=OK_WARN,
        ),
        w=6,
        h=4,
    )
    lay.add(
        table(
            "Link errors by port",
            "The link-error counters (symbol errors, retraining, integrity) per port at their highest "
            "5-minute rate in the time range; the host dashboard's link-health row has the BER against the IBTA limit.",
            [target(f"topk({BUSIEST}, max_over_time({link}[$__range]))", instant=True, table=True)],
            rename={"Value": "peak per second"},
        ),
        w=12,
        h=4,
    )


def _gids_and_addresses(lay: Layout) -> None:
    lay.row("GIDs and addresses in the time range")
    lay.add(
        stat(
            "Ports with GID table changes",
            "Ports whose GID table changed (its hash) in the time range. Jobs that cached "
            "a GID index may use a wrong one afterwards.",
            [target(_count_in_range(r.GID_TABLE_CHANGED), "ports")],
            thresholds=OK_WARN,
        ),
        w=6,
        h=4,
    )
    lay.add(
        stat(
            "Addresses whose RoCE v2 index moved",
            "IPv4 addresses whose RoCE v2 GID index moved in the "
            "time range (incident 1): NCCL jobs started before the move break.",
            [target(_count_in_range(r.GID_INDEX_MOVED), "addresses")],
        ),
        w=6,
        h=4,
    )
    lay.add(
        stat(
            "Ports whose NCCL GID index moved",
            "Ports where the GID index NCCL would auto-select changed in the time range; "
            "running jobs keep the index they started with.",
            [target(_count_in_range(r.NCCL_INDEX_MOVED), "ports")],
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
            [target(_count_in_range(r.ADDRESS_MISSING), "addresses")],
        ),
        w=6,
        h=4,
    )
    lay.add(
        table(
            "Ports with GID or address changes",
            "Ports whose GID table, RoCE v2 address indices or NCCL index changed in the time range: the most "
            "changes seen within 15 minutes.",
            [
                target(
                    f"sum by (instance, device, port) (max_over_time({_s(rule)}[$__range]))",
                    ref=ref,
                    instant=True,
                    table=True,
                )
                for ref, rule in (("A", r.GID_TABLE_CHANGED), ("B", r.GID_INDEX_MOVED), ("C", r.NCCL_INDEX_MOVED))
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
            "discards...) with the highest rate (5-minute average) in the time range.",
            [target(f"topk(10, max_over_time({_s(r.ERRORS_PER_COUNTER)}[$__range]))", instant=True, table=True)],
            rename={"Value": "peak per second"},
        ),
        w=12,
        h=8,
    )
    lay.add(
        table(
            "Top retransmission counters",
            "RoCE retransmission counters (out of sequence, ACK timeouts, "
            "sequence errors...) with the highest rate (5-minute average) in the time range.",
            [
                target(
                    f"topk(10, max_over_time({_s(r.RETRANSMISSIONS_PER_COUNTER)}[$__range]))", instant=True, table=True
                )
            ],
            rename={"Value": "peak per second"},
        ),
        w=12,
        h=8,
    )
    lay.add(
        timeseries(
            "RDMA throughput, busiest nodes",
            f"Bytes per second over all RDMA ports of the {BUSIEST} busiest nodes at each point, 5-minute "
            "average (on mlx5 RoCE: RDMA traffic only); a line per node of 10,000 draws nothing readable. "
            "The host dashboard has every node.",
            _minutely(
                targets(
                    (f"topk({BUSIEST}, sum by (instance) ({_s(r.TRANSMITTED)}))", "{{instance}} out"),
                    (f"topk({BUSIEST}, sum by (instance) ({_s(r.RECEIVED)}))", "{{instance}} in"),
                )
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
            "PMA error counters per second, summed per node (5-minute average); only nodes with errors.",
            _minutely([target(f"sum by (instance) ({_s(r.ERRORS_PER_COUNTER)})", "{{instance}}")]),
            "cps",
            thresholds=OK_BAD,
        ),
        w=12,
        h=8,
    )
    lay.add(
        timeseries(
            "Retransmission rate per node",
            "RoCE retransmission counters per second, summed per node (5-minute average); only nodes that retransmit.",
            _minutely([target(f"sum by (instance) ({_s(r.RETRANSMISSIONS_PER_COUNTER)})", "{{instance}}")]),
            "cps",
            thresholds=OK_BAD,
        ),
        w=12,
        h=8,
    )
