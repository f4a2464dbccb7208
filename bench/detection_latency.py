"""Detection latency of a GID shift: `ip addr add` returning -> `rnic.gid.address_moved` logged.

Runs as root. A network namespace holds veths named like the simulated RNICs' netdevs; an
in-process simulator follows their addresses as the kernel does (work-queue delay, lowest free
slot, held slots); `rnic-exporter serve` runs inside the namespace. Each trial holds the
address's current RoCE v2 GID (a running job), deletes and re-adds the address, and reads the
event's timestamp from the daemon's JSON log. Two modes, one daemon each:

- netlink: the default daemon (rtnetlink wakes a re-read burst), polling every 60 s;
- polling: `--no-watch.netlink --no-watch.udev`, polling every --poll-interval seconds.

    sudo .venv/bin/python bench/detection_latency.py --trials 30
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rnic_exporter.sim.follow import NetlinkFollower
from rnic_exporter.sim.host import SimHost
from tests.support.netns import Netns, network_namespace
from tests.support.processes import http_get
from tests.support.wait import wait_for

PORT = 19879
NETDEV, DEVICE, ADDRESS = "ens1f0np0", "mlx5_0", "10.0.0.1"


def _moved_events(log: Path) -> list[dict[str, str]]:
    out = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("event") == "rnic.gid.address_moved":
                out.append(record)
    return out


def _more_than(log: Path, seen: int) -> bool:
    return len(_moved_events(log)) > seen


def _timestamp(record: dict[str, str]) -> float:
    return datetime.fromisoformat(record["ts"].replace("Z", "+00:00")).timestamp()


@contextmanager
def _daemon(ns: Netns, sysfs: Path, workdir: Path, extra: list[str]) -> Iterator[Path]:
    log = workdir / f"serve-{len(list(workdir.glob('serve-*')))}.log"
    with open(log, "wb") as out:
        proc = ns.popen(
            [
                sys.executable,
                "-m",
                "rnic_exporter",
                "serve",
                "--path.sysfs",
                str(sysfs),
                "--web.listen-address",
                f"{ns.address}:{PORT}",
                "--state.dir",
                str(workdir / "state"),
                "--log.format",
                "json",
                *extra,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )

        def ready() -> bool:
            return http_get(ns.url(PORT, "/-/ready"), timeout=1)[0] == 200  # wait_for retries while it raises

        wait_for(ready, timeout=30, what="daemon ready")
        try:
            yield log
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def _trials(ns: Netns, host: SimHost, log: Path, trials: int, timeout: float, jitter: float) -> list[float]:
    """`jitter`: a random pause before each shift, so shifts land anywhere in the poll cycle
    (back-to-back trials would otherwise start right after the poll that saw the previous one)."""
    rng = random.Random(1)
    latencies = []
    for _ in range(trials):
        time.sleep(rng.uniform(0, jitter))
        with host.lock:
            host.hold_gid(DEVICE, ADDRESS)  # a job uses the current index
        seen = len(_moved_events(log))
        ns.ip("addr", "del", f"{ADDRESS}/24", "dev", NETDEV)
        wait_for(lambda: host.device(DEVICE).gid_table.index_of(ADDRESS) is None, timeout=5, what="GID removed")
        start = time.time()
        ns.ip("addr", "add", f"{ADDRESS}/24", "dev", NETDEV)
        wait_for(partial(_more_than, log, seen), timeout=timeout, what="address_moved logged")
        latencies.append(_timestamp(_moved_events(log)[-1]) - start)
    return latencies


def _report(mode: str, latencies: list[float]) -> None:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    print(
        f"{mode:>8}: n={len(ordered)} p50={statistics.median(ordered) * 1000:.0f} ms "
        f"p99={p99 * 1000:.0f} ms max={ordered[-1] * 1000:.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--poll-interval", type=float, default=5.0, help="polling-only mode's --poll.interval")
    parser.add_argument("--roce", type=int, default=16, help="simulated RoCE RNICs")
    args = parser.parse_args()
    netdevs = {f"ens{n + 1}f0np0": f"0c:42:a1:41:{n:02x}:36" for n in range(args.roce)}
    with tempfile.TemporaryDirectory() as tmp, network_namespace(netdevs) as ns:
        workdir = Path(tmp)
        for n in range(args.roce):
            ns.ip("addr", "add", f"10.0.{n}.1/24", "dev", f"ens{n + 1}f0np0")
        host = SimHost.build(workdir / "sys", roce=args.roce, gid_table_size=255)
        with ns.entered():
            follower = NetlinkFollower(host)
            follower.start()
        try:
            print(f"{args.roce} simulated RoCE RNICs, 255-slot GID tables, {args.trials} GID shifts per mode")
            with _daemon(ns, host.root, workdir, ["--poll.interval", "60"]) as log:
                _report("netlink", _trials(ns, host, log, args.trials, timeout=10, jitter=0.5))
            with _daemon(
                ns,
                host.root,
                workdir,
                ["--poll.interval", str(args.poll_interval), "--no-watch.netlink", "--no-watch.udev"],
            ) as log:
                _report(
                    f"poll {args.poll_interval:g}s",
                    _trials(ns, host, log, args.trials, timeout=3 * args.poll_interval + 5, jitter=args.poll_interval),
                )
        finally:
            follower.close()


if __name__ == "__main__":
    main()
