"""Series per RoCE netdev that --collector.wire adds, and the requests of one full read, on the
simulated mlx5 wire (a 4-lane SFF-8636 or CMIS module, mlx5e's `ethtool -S` strings), by group.

    python bench/wire_series.py
"""

from __future__ import annotations

from collections import Counter

from rnic_exporter.sim.wire import SimEthtool, SimModule, SimPort, SimWire
from rnic_exporter.sinks.wire_samples import wire_samples
from rnic_exporter.sources.wire import WireReader

NETDEV = ("mlx5_0", "1", "ens1f0np0")


def _group(name: str) -> str:
    for word, group in (("module", "module"), ("fec", "fec"), ("pause", "pause/pfc"), ("priority", "pause/pfc")):
        if word in name:
            return group
    return "link state"


def main() -> None:
    for memory_map in ("sff8636", "cmis"):
        wire = SimWire()
        wire.add(NETDEV[2], SimPort(module=SimModule(memory_map=memory_map)))
        reader = WireReader(SimEthtool(wire), gstats=wire.gstats)
        read = reader.poll([NETDEV[2]])
        groups = Counter(_group(spec.name) for spec, _, _ in wire_samples({NETDEV[2]: NETDEV}, read, {}))
        print(
            f"{memory_map}: {sum(groups.values())} series per RoCE netdev {dict(groups)}; "
            f"first read {dict(reader.requests)}"
        )


if __name__ == "__main__":
    main()
