"""Series per RNIC: what one scrape of rnic-exporter carries at its defaults, against node_exporter's
infiniband and netclass collectors on the same simulated tree (issue 16's series budget).

Both exporters run as users run them and are scraped over HTTP; the series are counted from the text
exposition, by family. A family's series are charged to the RNICs when they carry a `device` label,
to the host otherwise (the exporter's own health, process metrics). What only rnic-exporter exports
(GID tables, NCCL, rated speeds, address presence, inventory, events) is listed apart, so the budget
reads "node_exporter's count plus what only we export".

    python bench/series.py [--devices 16] [--extra '--collector.hw_counters.exclude=^rx_']
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import load_average, node_exporter_args

from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.sim import SimHost
from tests.support.processes import free_port
from tests.support.serve import get, ours_args, running

# The families node_exporter has no counterpart for: what the budget allows on top of its count.
ONLY_OURS = frozenset(
    m.name
    for m in (
        catalog.GID_ENTRY_INFO,
        catalog.GID_TABLE_HASH,
        catalog.GID_ENTRIES,
        catalog.GID_TABLE_SIZE,
        catalog.GID_TABLE_CHANGES,
        catalog.GID_V2_IPV4_INDEX,
        catalog.NCCL_GID_INDEX,
        catalog.NCCL_GID_USABLE,
        catalog.NCCL_CONFIGURED_GID_INDEX_VALID,
        catalog.PORT_RATED_RATE,
        catalog.PORT_RATED_WIDTH,
        catalog.LINK_BELOW_RATED,
        catalog.PCIE_LINK_SPEED,
        catalog.PCIE_LINK_WIDTH,
        catalog.DEVICE_PRESENT,
        catalog.NETDEV_ADDRESS_PRESENT,
        catalog.NETDEV_ADDRESSES,
        catalog.NETDEV_ADDRESS_LOSS_RISK,
        catalog.PORT_FLAPPING,
        catalog.EVENTS,
        catalog.DEVICE_READ_STUCK,
        catalog.DEVICE_DATA_TIMESTAMP,
        catalog.PORT_PMA_SATURATED,
    )
)

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s")
_DEVICE = re.compile(r'(?:^|[{,])device="')


@dataclass(frozen=True, slots=True)
class Count:
    per_device: Counter[str]  # family -> series carrying a device label
    host: Counter[str]  # family -> series without one

    @property
    def device_total(self) -> int:
        return sum(self.per_device.values())

    @property
    def total(self) -> int:
        return self.device_total + sum(self.host.values())


def count(body: bytes) -> Count:
    """Series by family in a text exposition (0.0.4), split by whether they carry a `device` label."""
    per_device: Counter[str] = Counter()
    host: Counter[str] = Counter()
    for line in body.decode().splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            raise SystemExit(f"cannot read the exposition line {line[:120]!r}")
        name, labels = m[1], m[2] or ""
        (per_device if _DEVICE.search(labels) else host)[name] += 1
    return Count(per_device, host)


def scrape_ours(sysfs: Path, state: Path, extra: list[str], devices: int) -> bytes:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    judged = f"\n{catalog.PORT_FLAPPING.name}{{".encode()
    fresh = f"\n{catalog.COUNTERS_STALE.name} 0".encode()
    counted = b'pass="counters"}'
    with running(ours_args(sysfs, port, state, *extra), url):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            body = get(url)
            # Detection has judged the host (its families follow the first poll), and every device's
            # counters are in, from a pass finished for this scrape (a first pass may leave groups out).
            if judged in body and fresh in body and body.count(counted) == devices:
                return body
            time.sleep(0.2)
        raise SystemExit("rnic-exporter did not serve judged, fresh counters of every device within 60 s")


def scrape_node_exporter(sysfs: Path) -> bytes:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    with running(node_exporter_args(sysfs, port), url, ready=lambda b: b"node_infiniband_" in b):
        return get(url)


# Driver counters: node_exporter 1.5.0's infiniband collector reads no hw_counters/ at all.
DRIVER = frozenset((catalog.PORT_HW_STAT.name, catalog.DEVICE_HW_STAT.name))


def report(shape: str, devices: int, ours: Count, node: Count) -> None:
    def per(names: frozenset[str] | None = None, *, exclude: frozenset[str] = frozenset()) -> float:
        picked = (n for k, n in ours.per_device.items() if (names is None or k in names) and k not in exclude)
        return sum(picked) / devices

    total, node_per, host = ours.total / devices, node.total / devices, sum(ours.host.values())
    only, driver = per(ONLY_OURS), per(DRIVER)
    shared = per(exclude=ONLY_OURS | DRIVER)
    budget = node_per + only + driver
    print(f"\n== {shape}: {devices} RNICs ==")
    print(f"rnic-exporter   {ours.total:5d} series  {total:6.1f} per RNIC")
    print(f"  {shared:6.1f}  with a node_exporter counterpart (port, PMA counters, netdev, identity)")
    print(f"  {only:6.1f}  only rnic-exporter: GID, NCCL, rated, PCIe, presence, events, saturation")
    print(f"  {driver:6.1f}  driver counters (hw_counters/), which node_exporter 1.5.0 does not read")
    print(f"  {host / devices:6.1f}  host-wide: exporter health, process ({host} in all)")
    print(f"node_exporter   {node.total:5d} series  {node_per:6.1f} per RNIC (infiniband + netclass)")
    print(f"ratio           {total / node_per:.2f} (counterparts only: {shared / node_per:.2f})")
    verdict = "within" if total <= budget else "OVER"
    print(
        f"budget          node_exporter {node_per:.1f} + only ours {only:.1f} + driver {driver:.1f} = "
        f"{budget:.1f} per RNIC: ours {total:.1f}, {verdict}"
    )
    print("rnic-exporter per RNIC, by family (* only rnic-exporter, d driver counters):")
    for name, n in ours.per_device.most_common():
        mark = "*" if name in ONLY_OURS else "d" if name in DRIVER else " "
        print(f"  {n / devices:6.2f}  {mark} {name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=16)
    ap.add_argument("--extra", default="", help="more `serve` flags for rnic-exporter, shell-quoted")
    args = ap.parse_args()
    extra = shlex.split(args.extra)
    print(f"load average {load_average():.2f}; rnic-exporter serve {' '.join(extra) or '(defaults)'}")
    for shape, roce, ib in (("RoCE", args.devices, 0), ("InfiniBand", 0, args.devices)):
        with tempfile.TemporaryDirectory(prefix="rnic-series-") as tmp:
            sysfs, state = Path(tmp, "sys"), Path(tmp, "state")
            SimHost.build(sysfs, roce=roce, infiniband=ib)
            ours = count(scrape_ours(sysfs, state, extra, args.devices))
            node = count(scrape_node_exporter(sysfs))
            report(shape, args.devices, ours, node)


if __name__ == "__main__":
    main()
