"""Which path reads a device's hw counters: RDMA netlink where it answers for the device, else sysfs.

Pure: the caller probes (one `RdmaNetlink.port_counters` per port of the device, the sysfs
`hw_counters/` listings it has anyway) and this decides, with the reason, for the metric that says
which path each device uses (`rnic_exporter_read_path_info`) and for the log. Decided per device
registration, and again after a netlink failure: a device is never read half one way, half the
other (one port through netlink and one through sysfs would mix two clocks in one scrape).

netlink wins only when it gives at least what sysfs gives: every hw counter file of every port is
also in the STAT_GET reply (netlink may have more: the optional counters, `cc_*`, sysfs never
shows). A device whose reply lacks a counter sysfs has stays on sysfs, with the names missing in
the reason, instead of silently losing a series.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from rnic_exporter.sources.nldev import PortCounters, Unavailable

Path = Literal["netlink", "sysfs"]
NO_HW_COUNTERS = "no hw_counters: nothing to read either way"


@dataclass(frozen=True, slots=True)
class ReadPath:
    device: str
    path: Path
    reason: str  # a short sentence for the log: why this path
    code: str  # the same as a stable label value (rnic_exporter_read_path_info{reason})


def choose_read_path(
    device: str,
    sysfs_hw_names: Mapping[int, frozenset[str]],
    probes: Mapping[int, PortCounters | Unavailable],
) -> ReadPath:
    """`sysfs_hw_names`: port -> the names in its `hw_counters/` (without `lifespan`); `probes`:
    port -> what STAT_GET answered for it (a port not probed counts as not answered).

    A device-wide `hw_counters/` (port 0 here, some drivers') has no netlink request of its own:
    such a device stays on sysfs."""
    if not any(sysfs_hw_names.values()):
        return ReadPath(device, "sysfs", NO_HW_COUNTERS, "no_hw_counters")
    if sysfs_hw_names.get(0):
        return ReadPath(device, "sysfs", "device-wide hw_counters/ has no netlink request", "device_wide")
    for port in sorted(sysfs_hw_names):
        probe = probes.get(port)
        if probe is None:
            return ReadPath(device, "sysfs", f"port {port}: netlink not asked yet", "not_asked")
        if isinstance(probe, Unavailable):
            reason = f"port {port}: netlink {probe.reason} ({probe.detail})"
            return ReadPath(device, "sysfs", reason, f"netlink_{probe.reason}")
        missing = sorted(sysfs_hw_names[port] - probe.values.keys())
        if missing:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            return ReadPath(device, "sysfs", f"port {port}: netlink lacks {shown}", "netlink_lacks_counters")
    reason = f"STAT_GET answers every hw counter of {len(sysfs_hw_names)} port(s)"
    return ReadPath(device, "netlink", reason, "netlink_answers")


__all__ = ["NO_HW_COUNTERS", "ReadPath", "choose_read_path"]
