"""Benchmark: how fast netlink address changes reach a NetlinkWatcher and the simulated sysfs tree.

    .venv/bin/python bench/netlink_latency.py [--runs 50] [--delay 0.03]     (as root)

In a fresh network namespace with a veth named like the simulated RNIC's netdev, `--runs` times:
delete 10.0.0.1/24 over rtnetlink, then add it back (pyroute2 in this process, so the clock starts
at the request, not at an `ip` process start). Prints p50/p99 of
- request -> `on_change` of a NetlinkWatcher (the lead's wake-up path), deletes and adds together;
- request -> the simulated tree showing it (`gids/3` zero after the delete, the GID back after the
  add) with a NetlinkFollower at `--delay` seconds (the kernel's work-queue hop it imitates).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rnic_exporter.sim import SimHost  # noqa: E402
from rnic_exporter.sim.follow import NetlinkFollower  # noqa: E402
from rnic_exporter.sim.gid_table import address_gid  # noqa: E402
from rnic_exporter.sources.netlink import NetlinkEvent, NetlinkWatcher  # noqa: E402
from tests.support.netns import network_namespace  # noqa: E402

ADDRESS, PREFIX = "10.0.0.1", 24


def percentiles(samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p99 = statistics.quantiles(ms, n=100, method="inclusive")[98]
    return f"p50 {statistics.median(ms):7.3f} ms   p99 {p99:7.3f} ms   max {ms[-1]:7.3f} ms   (n={len(ms)})"


def wait_file(fd: int, want_zero: bool, deadline_s: float = 5.0) -> float:
    """Spin on the held descriptor (the simulator rewrites in place) until the slot matches."""
    zero = b"0000:0000:0000:0000:0000:0000:0000:0000"
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if (os.pread(fd, 64, 0).strip() == zero) == want_zero:
            return time.monotonic()
        time.sleep(0.0002)
    raise TimeoutError("the simulated tree did not follow within 5 s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--delay", type=float, default=0.03, help="follower delay, seconds")
    args = parser.parse_args()

    from pyroute2 import IPRoute

    with tempfile.TemporaryDirectory() as tmp:
        host = SimHost.build(Path(tmp) / "sys", roce=1, infiniband=0)
        dev = host.device("mlx5_0")
        with network_namespace({dev.netdev: dev.mac}) as ns:
            ns.ip("addr", "add", f"{ADDRESS}/{PREFIX}", "dev", dev.netdev)
            callbacks: dict[tuple[str, str], float] = {}
            got = threading.Condition()

            def on_event(event: NetlinkEvent) -> None:
                if event.address is not None and event.address.address == ADDRESS:
                    with got:
                        callbacks[(event.kind, event.address.address)] = time.monotonic()
                        got.notify_all()

            with ns.entered():  # the watcher, follower and our rtnetlink socket all live in the namespace
                watcher = NetlinkWatcher(lambda ifname, kind: None, on_event=on_event)
                watcher.start()
                follower = NetlinkFollower(host, delay_s=args.delay)
                follower.start()
                ipr = IPRoute()
            index = ipr.link_lookup(ifname=dev.netdev)[0]
            fd = os.open(host.root / "class/infiniband/mlx5_0/ports/1/gids/3", os.O_RDONLY)
            assert os.pread(fd, 64, 0).decode().strip() == address_gid(ADDRESS)
            to_callback: list[float] = []
            to_tree: dict[str, list[float]] = {"del": [], "add": []}
            try:
                for _ in range(args.runs):
                    for op in ("del", "add"):
                        kind = "address_removed" if op == "del" else "address_added"
                        with got:
                            callbacks.pop((kind, ADDRESS), None)
                        started = time.monotonic()
                        ipr.addr(op, index=index, address=ADDRESS, prefixlen=PREFIX)
                        tree_at = wait_file(fd, want_zero=op == "del")
                        with got:
                            got.wait_for(partial(callbacks.__contains__, (kind, ADDRESS)), timeout=5)
                            to_callback.append(callbacks[(kind, ADDRESS)] - started)
                        to_tree[op].append(tree_at - started)
            finally:
                os.close(fd)
                ipr.close()
                follower.close()
                watcher.close()
    print(f"netlink latency, {args.runs} delete+add cycles, follower delay {args.delay * 1000:g} ms")
    print(f"  request -> NetlinkWatcher on_change        {percentiles(to_callback)}")
    print(f"  ip addr del -> sim tree gids/3 zero        {percentiles(to_tree['del'])}")
    print(f"  ip addr add -> sim tree gids/3 back        {percentiles(to_tree['add'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
