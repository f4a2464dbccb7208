"""The curated pause, PFC and discard counters out of a driver's `ethtool -S` strings.

GSTATS returns every string the driver has (over 2,000 on a ConnectX-5) and costs mlx5 one pass
over every stats group (rnic-linux-facts §7): callers read it on a slow timer and hand the
name -> value mapping here, which keeps only the names below and ignores the rest.

Names (mlx5e, `Documentation/networking/device_drivers/ethernet/mellanox/mlx5/counters.rst`):

| name | meaning |
|---|---|
| `rx_prioN_pause`, `tx_prioN_pause` | PFC frames on priority N received (peer throttles us) / sent (we are behind) |
| `rx_prioN_pause_duration`, `tx_prioN_pause_duration` | time paused on priority N, microseconds |
| `rx_prioN_pause_transition`, `tx_prioN_pause_transition` | XOFF -> XON transitions on priority N |
| `rx_prioN_buf_discard` | packets dropped on priority N for lack of receive buffer |
| `rx_prioN_cong_discard` | packets dropped on priority N by congestion control (shared buffer) |
| `rx_pause_ctrl_phy`, `tx_pause_ctrl_phy` | global (802.3x) pause frames at the port |
| `tx_pause_storm_warning_events` | the port sent pause continuously for longer than the warning time |
| `tx_pause_storm_error_events` | ... past the error time: the device stopped sending pause |
| `rx_discards_phy`, `rx_out_of_buffer` | receive drops at the port / for lack of receive WQEs |
| `module_unplug`, `module_bus_stuck`, `module_high_temp`, `module_bad_shorted` | module events |

Other drivers name these differently or not at all: an empty result is "not exposed", not 0.
Intel's e1000e, igb and ixgbe count 802.3x pause as `{rx,tx}_flow_control_{xon,xoff}`; those are
deliberately not in the set: those drivers carry no RDMA, so no RoCE netdev has them (the kernel
lab's emulated e1000e reads as not exposed, tests/kernel/test_wire_ethtool.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

from rnic_exporter.model.wire import DriverPauseStats, PriorityPause

_PER_PRIORITY = re.compile(r"^(rx|tx)_prio([0-7])_(pause|pause_duration|pause_transition|buf_discard|cong_discard)$")
PORT_COUNTERS = (
    "rx_discards_phy",
    "rx_out_of_buffer",
    "tx_pause_storm_warning_events",
    "tx_pause_storm_error_events",
    "module_unplug",
    "module_bus_stuck",
    "module_high_temp",
    "module_bad_shorted",
)


def parse(stats: Mapping[str, int]) -> DriverPauseStats | None:
    """The curated counters in `stats` (`ethtool -S` name -> value); None when it has none."""
    per: dict[tuple[str, str], dict[int, int]] = {}
    for name, value in stats.items():
        match = _PER_PRIORITY.match(name)
        if match is None or not isinstance(value, int) or value < 0:
            continue
        per.setdefault((match[1], match[3]), {})[int(match[2])] = value
    counters = {name: stats[name] for name in PORT_COUNTERS if isinstance(stats.get(name), int)}
    received_global = stats.get("rx_pause_ctrl_phy")
    sent_global = stats.get("tx_pause_ctrl_phy")
    if not per and not counters and received_global is None and sent_global is None:
        return None

    def direction(way: str, global_frames: int | None) -> PriorityPause:
        return PriorityPause(
            frames=_frozen(per.get((way, "pause"), {})),
            duration_microseconds=_frozen(per.get((way, "pause_duration"), {})),
            transitions=_frozen(per.get((way, "pause_transition"), {})),
            global_frames=global_frames,
        )

    return DriverPauseStats(
        received=direction("rx", received_global),
        sent=direction("tx", sent_global),
        buffer_discards=_frozen(per.get(("rx", "buf_discard"), {})),
        congestion_discards=_frozen(per.get(("rx", "cong_discard"), {})),
        counters=MappingProxyType(counters),
    )


def _frozen(values: dict[int, int]) -> Mapping[int, int]:
    return MappingProxyType(dict(sorted(values.items())))
