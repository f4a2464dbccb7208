"""Detection latency of each failure of the field reports: the failure made -> its event logged.

Runs as root. A network namespace holds veths named like the simulated RNICs' netdevs (RoCE, with
their addresses, and IPoIB); an in-process simulator follows the RoCE netdevs' addresses and
carrier as the kernel does (work-queue delay, lowest free slot, held slots); `rnic-exporter serve`
runs inside the namespace at its defaults (5 s polls, netlink, udev, ethtool), with
NCCL_IB_GID_INDEX=3 (the RoCE v2 IPv4 GID of every simulated RoCE port). Each trial waits a random
part of a poll interval (so failures land anywhere in the poll cycle), makes the failure, and reads
the event's timestamp from the daemon's JSON log; then undoes it and waits for the undoing event.

What rtnetlink announces (the daemon re-reads at once, in a burst) should be seen within 1 s of
the announcement's arrival (timed by a listener in the namespace: the kernel's linkwatch alone may
hold a carrier change back up to a second, for every listener alike); what nothing announces within
its budget (docs/detection.md): an InfiniBand port or NIC within one 5 s poll, a PCIe link within
30 s (each trial of it waits a random part of 30 s):

| failure (incidents.md)                 | made by                               | announced by |
|----------------------------------------|---------------------------------------|--------------|
| address lost (1)                       | `ip addr del`                         | rtnetlink    |
| GID index shift (1)                    | a job holds the GID, `ip addr del/add`| rtnetlink    |
| NCCL_IB_GID_INDEX no longer valid (3)  | `ip addr del`                         | rtnetlink    |
| RoCE port down (2)                     | the veth's peer down (carrier loss)   | rtnetlink    |
| RoCE link below rated (2)              | carrier loss, renegotiated at 100G    | rtnetlink    |
| RoCE NIC lost (2)                      | the device's sysfs gone, `ip link del`| rtnetlink    |
| PCIe link downtrained (2)              | sysfs current speed and width         | nothing      |
| InfiniBand port below rated (2)        | sysfs rate (HDR instead of NDR)       | nothing      |
| InfiniBand port down (2)               | sysfs state                           | nothing      |
| InfiniBand NIC lost, no netdev event (2)| the device's sysfs gone              | nothing      |

`--src DIR` runs the rnic-exporter of another checkout (PYTHONPATH and working directory), so one
script measures two branches; `--fallback` runs the same failures against a daemon with netlink off
(`--no-watch.netlink`: everything polled every interval).

    sudo .venv/bin/python bench/detection_latency.py [--src DIR] [--trials 4]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rnic_exporter.model.host import ROCE_V2
from rnic_exporter.sim.follow import NetlinkFollower
from rnic_exporter.sim.host import SimHost
from rnic_exporter.sources.netlink import NetlinkEvent
from tests.support.netns import Netns, network_namespace
from tests.support.processes import http_get
from tests.support.serve import python_serve_args
from tests.support.wait import wait_for

PORT = 19879
ROCE, IB = 16, 4
NCCL_INDEX = "3"  # the simulated RoCE ports' RoCE v2 IPv4 GID


def roce_netdev(n: int) -> str:
    return f"ens{n + 1}f0np0"


def address(n: int) -> str:
    return f"10.0.{n}.1"


def _records(log: Path) -> list[dict[str, str]]:
    out = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if "event" in record:
                out.append(record)
    return out


def _timestamp(record: dict[str, str]) -> float:
    return datetime.fromisoformat(record["ts"].replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True, slots=True)
class Failure:
    name: str
    announced: str  # "rtnetlink" or "nothing"
    devices: tuple[int, ...]  # simulated device numbers, used in turn
    event: str
    make: Callable[[int], None]
    undo: Callable[[int], None] | None
    undone: str | None  # the event that says it is undone
    link: str | None = None  # for rnic.link.*: which link (port, netdev, pcie)
    budget: float = 1.0  # seconds (docs/detection.md#detection-latency-budget); announced: from the announcement


class Bench:
    def __init__(self, ns: Netns, host: SimHost, log: Path, arrivals: dict[str, list[float]]) -> None:
        self.ns, self.host, self.log = ns, host, log
        self.arrivals = arrivals  # netdev -> when rtnetlink messages about it arrived (the announcements)
        self.mark = 0.0  # just before the failure's last step (the one its announcement follows)

    def announced_at(self, n: int) -> float | None:
        """When the first announcement about the device's netdev after `mark` arrived."""
        return next((t for t in self.arrivals.get(roce_netdev(n), ()) if t >= self.mark), None)

    def name(self, n: int) -> str:
        return f"mlx5_{n}"

    def count(self, event: str, n: int, link: str | None) -> list[dict[str, str]]:
        return [
            r
            for r in _records(self.log)
            if r["event"] == event and r.get("device") == self.name(n) and (link is None or r.get("link") == link)
        ]

    def wait_event(self, event: str, n: int, seen: int, link: str | None, timeout: float = 40) -> dict[str, str]:
        try:
            wait_for(lambda: len(self.count(event, n, link)) > seen, timeout=timeout, what=f"{event} on {self.name(n)}")
        except AssertionError:
            for record in _records(self.log):
                if record.get("device") == self.name(n):
                    print(
                        f"  {self.name(n)}: {record['ts']} {record['event']} {record.get('msg', '')}", file=sys.stderr
                    )
            raise
        return self.count(event, n, link)[seen]

    # -- failures, made and undone ---------------------------------------------------------------

    def addr_del(self, n: int) -> None:
        self.ns.ip("addr", "del", f"{address(n)}/24", "dev", roce_netdev(n))

    def addr_add(self, n: int) -> None:
        self.ns.ip("addr", "add", f"{address(n)}/24", "dev", roce_netdev(n))

    def gid_shift(self, n: int) -> None:
        """A job holds the RoCE v2 GID; NetworkManager drops the address and puts it back (the clock
        starts at the re-add: the shift exists from then on)."""
        with self.host.lock:
            self.host.hold_gid(self.name(n), address(n))
        self.addr_del(n)
        wait_for(
            lambda: self.host.device(self.name(n)).gid_table.index_of(address(n), ROCE_V2) is None,
            timeout=5,
            what="GID removed",
        )
        time.sleep(random.uniform(0, 0.5))  # a short flap; a burst of the removal may still run
        self.mark = time.time()
        self.addr_add(n)

    def carrier(self, up: bool) -> Callable[[int], None]:
        return lambda n: self.ns.set_carrier(roce_netdev(n), up)

    def renegotiate(self, gbps: int) -> Callable[[int], None]:
        """Carrier lost, the link comes back at `gbps` (the clock starts at the return)."""

        def make(n: int) -> None:
            seen = len(self.count("rnic.port.down", n, None))
            self.ns.set_carrier(roce_netdev(n), False)
            self.wait_event("rnic.port.down", n, seen, None)
            with self.host.lock:
                self.host.set_speed(self.name(n), gbps)
            self.mark = time.time()
            self.ns.set_carrier(roce_netdev(n), True)

        return make

    def roce_lost(self, n: int) -> None:
        with self.host.lock:
            self.host.remove_device(self.name(n))
        self.ns.ip("link", "del", roce_netdev(n))

    def pcie(self, speed: float, width: int) -> Callable[[int], None]:
        def make(n: int) -> None:
            with self.host.lock:
                self.host.set_pcie(self.name(n), speed, width)

        return make

    def ib_speed(self, speed: str) -> Callable[[int], None]:
        def make(n: int) -> None:
            with self.host.lock:
                self.host.set_speed(self.name(n), 0, ib_speed=speed)

        return make

    def ib_up(self, up: bool) -> Callable[[int], None]:
        def make(n: int) -> None:
            with self.host.lock:
                self.host.set_port_up(self.name(n), up)

        return make

    def ib_lost(self, n: int) -> None:
        with self.host.lock:
            self.host.remove_device(self.name(n))

    def failures(self) -> list[Failure]:
        return [
            Failure("address lost", "rtnetlink", (0, 1), "rnic.address.lost", self.addr_del, self.addr_add,
                    "rnic.address.restored"),
            Failure("GID index shift", "rtnetlink", (2, 3, 4), "rnic.gid.address_moved", self.gid_shift, None, None),
            Failure("NCCL_IB_GID_INDEX invalid", "rtnetlink", (5, 6), "rnic.nccl.gid_index_invalid", self.addr_del,
                    self.addr_add, "rnic.nccl.gid_index_valid"),
            Failure("RoCE port down", "rtnetlink", (7, 8), "rnic.port.down", self.carrier(False), self.carrier(True),
                    "rnic.port.up"),
            Failure("RoCE link below rated", "rtnetlink", (9, 10, 11), "rnic.link.below_rated", self.renegotiate(100),
                    self.renegotiate(400), "rnic.port.up", "port"),
            Failure("RoCE NIC lost", "rtnetlink", (12, 13, 14, 15), "rnic.device.disappeared", self.roce_lost, None,
                    None),
            Failure("PCIe link downtrained", "nothing", (0, 1, 2, 3), "rnic.link.below_rated", self.pcie(16.0, 8),
                    self.pcie(32.0, 16), "rnic.link.restored", "pcie", budget=30.0),
            Failure("InfiniBand port below rated", "nothing", (ROCE, ROCE + 1), "rnic.link.below_rated",
                    self.ib_speed("HDR"), self.ib_speed("NDR"), "rnic.link.restored", "port", budget=5.0),
            Failure("InfiniBand port down", "nothing", (ROCE + 2,), "rnic.port.down", self.ib_up(False),
                    self.ib_up(True), "rnic.port.up", budget=5.0),
            Failure("InfiniBand NIC lost, no event", "nothing", (ROCE + 3,), "rnic.device.disappeared", self.ib_lost,
                    None, None, budget=5.0),
        ]  # fmt: skip

    def trials(
        self, failure: Failure, trials: int, jitter: float, rng: random.Random
    ) -> tuple[list[float], list[float]]:
        """Latencies from the failure made, and (announced ones) from the announcement's arrival."""
        latencies, after_announcement = [], []
        for trial in range(trials if failure.undo is not None else min(trials, len(failure.devices))):
            n = failure.devices[trial % len(failure.devices)]
            time.sleep(rng.uniform(0, max(jitter, failure.budget)))  # anywhere in the failure's period
            seen = len(self.count(failure.event, n, failure.link))
            self.mark = time.time()
            failure.make(n)
            start = time.time()
            record = self.wait_event(failure.event, n, seen, failure.link)
            latencies.append(_timestamp(record) - start)
            announced = self.announced_at(n) if failure.announced == "rtnetlink" else None
            if announced is not None:
                after_announcement.append(_timestamp(record) - announced)
            if failure.undo is not None and failure.undone is not None:
                link = failure.link if failure.undone.startswith("rnic.link.") else None
                seen = len(self.count(failure.undone, n, link))
                failure.undo(n)
                self.wait_event(failure.undone, n, seen, link)
        return latencies, after_announcement


@contextmanager
def _daemon(ns: Netns, sysfs: Path, workdir: Path, src: Path | None, extra: list[str]) -> Iterator[Path]:
    log = workdir / f"serve-{len(list(workdir.glob('serve-*')))}.log"
    env = dict(os.environ, NCCL_IB_GID_INDEX=NCCL_INDEX)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), env.get("PYTHONPATH")]))
    with open(log, "wb") as out:
        proc = ns.popen(
            [
                *python_serve_args(sysfs, f"{ns.address}:{PORT}", state_dir=workdir / f"state-{log.stem}"),
                "--log.format",
                "json",
                *extra,
            ],
            stdout=out,
            stderr=out,
            env=env,
            cwd=src or Path.cwd(),
        )

        def ready() -> bool:
            return http_get(ns.url(PORT, "/-/ready"), timeout=1)[0] == 200  # wait_for retries while it raises

        wait_for(ready, timeout=60, what="daemon ready")
        time.sleep(6)  # the first polls' baselines (rated speeds) are learned
        try:
            yield log
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def _line(failure: Failure, latencies: tuple[list[float], list[float]], limit: float) -> str:
    made, announced = sorted(latencies[0]), sorted(latencies[1])
    worst = announced[-1] if announced else made[-1]
    verdict = "ok" if worst <= limit else f"SLOWER than {limit:g} s"
    since = f"{statistics.median(announced) * 1000:>8.0f} {announced[-1] * 1000:>8.0f}" if announced else f"{'-':>17}"
    return (
        f"{failure.name:<32}{failure.announced:<11}{len(made):>3}  "
        f"{statistics.median(made) * 1000:>8.0f} {made[-1] * 1000:>8.0f}  {since}  {verdict}"
    )


def run(src: Path | None, trials: int, poll: float, extra: list[str], label: str) -> None:
    host_netdevs: dict[str, str | None] = {roce_netdev(n): f"0c:42:a1:41:{n:02x}:36" for n in range(ROCE)}
    # The IPoIB netdevs exist too, as on a real host (their names as rnic_exporter.sim makes them).
    host_netdevs.update({f"ibp{0x10 + n * 0x10}s0": None for n in range(ROCE, ROCE + IB)})
    with tempfile.TemporaryDirectory() as tmp, network_namespace(host_netdevs, prefix="rnd") as ns:
        workdir = Path(tmp)
        for n in range(ROCE):
            ns.ip("addr", "add", f"{address(n)}/24", "dev", roce_netdev(n))
        host = SimHost.build(workdir / "sys", roce=ROCE, infiniband=IB, gid_table_size=255)
        arrivals: dict[str, list[float]] = {}
        with ns.entered():

            def arrived(event: NetlinkEvent) -> None:  # when each announcement reached a listener
                arrivals.setdefault(event.ifname, []).append(time.time())

            follower = NetlinkFollower(host, on_arrival=arrived)
            follower.start()
        try:
            with _daemon(ns, host.root, workdir, src, extra) as log:
                bench = Bench(ns, host, log, arrivals)
                print(f"\n{label}: {ROCE} RoCE + {IB} InfiniBand simulated RNICs, up to {trials} trials each")
                print(f"{'':<46}{'from the failure':>17}  {'from its announcement':>21}")
                columns = f"{'p50 ms':>8} {'max ms':>8}"
                print(f"{'failure':<32}{'announced':<11}{'n':>3}  {columns}  {columns}  within")
                rng = random.Random(1)
                for failure in bench.failures():
                    limit = failure.budget
                    print(_line(failure, bench.trials(failure, trials, poll, rng), limit), flush=True)
        finally:
            follower.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", type=Path, default=None, help="source tree of the rnic-exporter to run")
    parser.add_argument("--trials", type=int, default=4, help="trials per failure (NIC lost: one per device)")
    parser.add_argument("--fallback", action="store_true", help="also a daemon with netlink off")
    args = parser.parse_args()
    src = args.src.resolve() if args.src else None
    poll = 5.0
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    print(f"# {when} UTC; loadavg {Path('/proc/loadavg').read_text().strip()}")
    print(f"# rnic-exporter from {src or 'this checkout'}; latency: the failure made -> its event's log timestamp")
    run(src, args.trials, poll, [], "defaults (5 s polls, netlink and udev on)")
    if args.fallback:
        run(src, args.trials, poll, ["--no-watch.netlink"], "netlink off (the fallback: everything polled every 5 s)")


if __name__ == "__main__":
    main()
