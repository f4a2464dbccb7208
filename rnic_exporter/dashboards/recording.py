"""The recording rules the fleet dashboard reads, built from the catalogue and written to alerts/.

A fleet dashboard refreshed over 10,000 nodes must not scan every raw series: each rule here turns
the per-port series of a node into one series per node (`instance:`), or keeps per-port detail
only where something is wrong (`port:`, `address:`, `port_counter:` rules end in a filter, so a
healthy fleet records nothing for them). Names follow Prometheus' `level:metric:operations`.

No group `interval`: the rules run at Prometheus' evaluation_interval. Their windows (5m, 15m) are
fixed, so the recorded values do not depend on it, as long as it is at most 5 minutes.

`python -m rnic_exporter.dashboards.recording` rewrites the committed file; a test fails when it
differs from a fresh rendering. This module needs no grafanalib.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from rnic_exporter.catalog import metrics as c

FILENAME = "rnic-recording.rules.yml"  # sorts after rnic-exporter.rules.yml, so the alert group stays first
GROUP = "rnic-exporter-fleet"
BY_NODE = "instance, job"
BY_PORT = "instance, job, device, port"

# PMA counters that mean a damaged link or a dropped packet (IBTA PortCounters), as the kernel names them:
# the ones OTLP exports as hw.errors.
ERROR_COUNTERS = "|".join(c.PMA_ERROR_COUNTER_NAMES)
# mlx5 hw_counters that count RoCE retransmissions and their causes.
RETRANSMISSION_COUNTERS = (
    "out_of_sequence|packet_seq_err|implied_nak_seq_err|local_ack_timeout_err|"
    "rnr_nak_retry_err|duplicate_request|roce_adp_retrans|roce_slow_restart"
)


@dataclass(frozen=True, slots=True)
class Rule:
    record: str
    expr: str
    why: str  # the comment above the rule in the file
    sparse: bool = False  # recorded only while something is wrong: absent means healthy

    def __str__(self) -> str:
        return self.record


# --- one series per node ---------------------------------------------------------------------------

DEVICES_KNOWN = Rule(
    f"instance:{c.DEVICE_PRESENT.name}:count",
    f"count by ({BY_NODE}) ({c.DEVICE_PRESENT.name})",
    "Devices the persisted inventory knows, per node.",
)
DEVICES_PRESENT = Rule(
    f"instance:{c.DEVICE_PRESENT.name}:sum",
    f"sum by ({BY_NODE}) ({c.DEVICE_PRESENT.name})",
    "Known devices present, per node; known minus present is the missing NICs.",
)
PORTS = Rule(
    f"instance:{c.PORT_UP.name}:count",
    f"count by ({BY_NODE}) ({c.PORT_UP.name})",
    "RDMA ports read, per node (a missing device's ports are not read, so they are not counted).",
)
PORTS_UP = Rule(
    f"instance:{c.PORT_UP.name}:sum",
    f"sum by ({BY_NODE}) ({c.PORT_UP.name})",
    "Ports ACTIVE/LinkUp, per node; ports minus ports up is the ports not up.",
)
PORTS_NOT_UP = Rule(
    f"instance:{c.PORT_UP.name.replace('_up', '_not_up')}:count",
    f"count by ({BY_NODE}) ({c.PORT_UP.name} == 0)",
    "Ports not ACTIVE/LinkUp, per node; only nodes with one, so the time series of ports down reads a few "
    "series, not one per node.",
    sparse=True,
)
LINKS_BELOW_RATED = Rule(
    f"instance_link:{c.LINK_BELOW_RATED.name}:sum",
    f'sum by ({BY_NODE}, link) (max by ({BY_PORT}, link) ({c.LINK_BELOW_RATED.name}{{link=~"port|netdev"}}))\n'
    f"or\n"
    f'sum by ({BY_NODE}, link) (max by ({BY_NODE}, device, link) ({c.LINK_BELOW_RATED.name}{{link="pcie"}}))',
    "Links below rated per node and link kind; PCIe is repeated on every port of a device, so it counts "
    "once per device.",
)
PORTS_FLAPPING = Rule(
    f"instance:{c.PORT_FLAPPING.name}:sum",
    f"sum by ({BY_NODE}) ({c.PORT_FLAPPING.name})",
    "Flapping ports, per node.",
)
ADDRESS_LOSS_RISK = Rule(
    f"instance_reason:{c.NETDEV_ADDRESS_LOSS_RISK.name}:sum",
    f"sum by ({BY_NODE}, reason) ({c.NETDEV_ADDRESS_LOSS_RISK.name})",
    "Netdevs that may lose their addresses on a port flap, per node and reason (incident 1).",
)
RECEIVED = Rule(
    f"instance:{c.PORT_DATA_RECEIVED.name.removesuffix('_total')}:rate5m",
    f"sum by ({BY_NODE}) (rate({c.PORT_DATA_RECEIVED.name}[5m]))",
    "RDMA bytes received per second over all ports of a node.",
)
TRANSMITTED = Rule(
    f"instance:{c.PORT_DATA_TRANSMITTED.name.removesuffix('_total')}:rate5m",
    f"sum by ({BY_NODE}) (rate({c.PORT_DATA_TRANSMITTED.name}[5m]))",
    "RDMA bytes transmitted per second over all ports of a node.",
)

# --- per port or address, only while something is wrong -------------------------------------------

GID_TABLE_CHANGED = Rule(
    f"port:{c.GID_TABLE_HASH.name}:changes15m",
    f"changes({c.GID_TABLE_HASH.name}[15m]) > 0",
    "Ports whose GID table changed in the last 15 minutes (the window of RnicGidTableChanged), with the "
    "number of changes. The hash is a gauge, so restarts and scrape gaps count no change.",
    sparse=True,
)
GID_INDEX_MOVED = Rule(
    f"address:{c.GID_V2_IPV4_INDEX.name}:changes15m",
    f"changes({c.GID_V2_IPV4_INDEX.name}[15m]) > 0",
    "Addresses whose RoCE v2 GID index moved in the last 15 minutes (incident 1, the window of RnicGidIndexMoved).",
    sparse=True,
)
NCCL_INDEX_MOVED = Rule(
    f"port:{c.NCCL_GID_INDEX.name}:changes15m",
    f"changes({c.NCCL_GID_INDEX.name}[15m]) > 0",
    "Ports where the GID index NCCL would auto-select changed in the last 15 minutes.",
    sparse=True,
)
ADDRESS_MISSING = Rule(
    f"address:{c.NETDEV_ADDRESS_PRESENT.name}:min5m",
    f"min_over_time({c.NETDEV_ADDRESS_PRESENT.name}[5m]) == 0",
    "Expected addresses missing at some scrape of the last 5 minutes (value 0). The window is at least "
    "the evaluation interval, so no missing scrape falls between two evaluations.",
    sparse=True,
)
ERRORS_PER_COUNTER = Rule(
    f"port_counter:{c.PORT_PMA.name.removesuffix('_total')}_errors:rate5m",
    f'sum by ({BY_PORT}, counter) (rate({c.PORT_PMA.name}{{counter=~"{ERROR_COUNTERS}"}}[5m])) > 0',
    "PMA error counters (symbol errors, link downed, receive errors, discards...) that are growing, per second. "
    "No per-node rule sums these: promtool cannot backfill a rule that reads another one, and summing the "
    "few growing counters at query time is cheap.",
    sparse=True,
)
RETRANSMISSIONS_PER_COUNTER = Rule(
    f"port_counter:{c.PORT_HW_STAT.name.removesuffix('_total')}_retransmissions:rate5m",
    f'sum by ({BY_PORT}, counter) (rate({c.PORT_HW_STAT.name}{{counter=~"{RETRANSMISSION_COUNTERS}"}}[5m])) > 0',
    "RoCE retransmission counters (out of sequence, ACK timeouts, sequence errors...) that are growing, per second.",
    sparse=True,
)
RULES: tuple[Rule, ...] = (
    DEVICES_KNOWN,
    DEVICES_PRESENT,
    PORTS,
    PORTS_UP,
    PORTS_NOT_UP,
    LINKS_BELOW_RATED,
    PORTS_FLAPPING,
    ADDRESS_LOSS_RISK,
    RECEIVED,
    TRANSMITTED,
    GID_TABLE_CHANGED,
    GID_INDEX_MOVED,
    NCCL_INDEX_MOVED,
    ADDRESS_MISSING,
    ERRORS_PER_COUNTER,
    RETRANSMISSIONS_PER_COUNTER,
)
BY_RECORD = {rule.record: rule for rule in RULES}

_HEADER = """\
# Recording rules for the rnic-exporter fleet dashboard. Generated from the catalogue by
# rnic_exporter/dashboards/recording.py; regenerate with `python -m rnic_exporter.dashboards.recording`.
#
# One series per node (instance:...) instead of one per port, and per-port series only while something
# is wrong (rules ending in a filter: absent means healthy), so a dashboard refresh over 10,000 nodes
# reads about 10,000 series, not every raw one. No group interval: they run at the evaluation_interval
# (at most 5m; the windows are fixed). The alerts in rnic-exporter.rules.yml read the raw series.
"""


def _indent(text: str, by: int) -> str:
    pad = " " * by
    return "\n".join(pad + line for line in text.splitlines())


def _comment(text: str, by: int, width: int = 100) -> str:
    lines: list[str] = []
    line = ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    return "\n".join(" " * by + "# " + part for part in lines)


def render() -> str:
    """The text of alerts/rnic-recording.rules.yml."""
    parts = [_HEADER, f"groups:\n  - name: {GROUP}\n    rules:\n"]
    for rule in RULES:
        parts.append(_comment(rule.why, 6) + "\n")
        parts.append(f"      - record: {rule.record}\n")
        if "\n" in rule.expr:
            parts.append("        expr: |\n" + _indent(rule.expr, 10) + "\n")
        else:
            parts.append(f"        expr: '{rule.expr}'\n")
    return "".join(parts)


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else Path("alerts") / FILENAME
    out.write_text(render())
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
