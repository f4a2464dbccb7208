"""RDMA netlink (nldev) against sysfs on the real kernel: STAT_GET's counters, the device and port dumps,
and the sysfs fallback where netlink cannot see the device.

1. rxe0 on va, rxe1 on vb (netns b); both dumps are recorded beside what sysfs says.
2. ib_send_bw RC traffic in loopback on rxe0 (server and client on rxe0, 10.77.0.1: rxe in the root
   namespace loops it back, and only the root namespace's rxe receives RoCE on this kernel). While
   it runs, rounds of: every hw_counters file of rxe0 port 1 (sysfs, "before"), one STAT_GET, every
   file again ("after"). The hw_counters cache (`lifespan`) serves a file read within `lifespan` of
   the last refresh from that refresh, and STAT_GET writes the same value array; so each phase
   waits out twice the lifespan before the next: then before <= netlink <= after holds for every
   counter exactly, whatever traffic does in between. After traffic stops, the values stand still:
   netlink must equal sysfs exactly.
3. CPU and wall time of one port's counters: all sysfs files vs one STAT_GET, 100 times each, alternating;
   and node_exporter's infiniband collector scraping the same sysfs (its CPU per scrape).
   While it runs, the QP table (RES_QP_GET) must name both perftest processes on rxe0, and the
   consumers scan must find them both ways: from the verbs contexts (RES_CTX_GET) and by the walk.
4. The fallback: the RDMA subsystem in exclusive netns mode, rxe0 in the root namespace, a client
   whose socket lives in a new netns c (the process keeps the root's /sys, as a container with the
   host's /sys in its own network namespace): the dump is empty, STAT_GET for rxe0 is refused, the
   read-path decision says sysfs with the reason, and sysfs still reads.
The raw replies (hex) are kept: the unit suite parses them (tests/fixtures/kernel-rxe-*/nldev/).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rnic_exporter.daemon.consumer_watch import scanner
from rnic_exporter.sources.live_tree import LIVE_PROCFS, LIVE_SYSFS
from rnic_exporter.sources.nldev import RdmaNetlink, Unavailable, in_network_namespace
from rnic_exporter.sources.qp_owners import consumers_by_device
from rnic_exporter.sources.read_path import choose_read_path
from tests.kernel.lab import SYS_IB, Lab, LabError, free_port, measured, read_attr

ROUNDS = 12
TIMING_REPEATS = 100
HW = SYS_IB / "rxe0/ports/1/hw_counters"


def hw_sysfs(dev: str = "rxe0", port: int = 1) -> dict[str, int]:
    """Every hw_counters file of the port, in name order, in one quick pass."""
    base = SYS_IB / dev / "ports" / str(port) / "hw_counters"
    return {n: int(read_attr(base / n)) for n in sorted(os.listdir(base)) if n != "lifespan"}


def lifespan_s() -> float:
    # printed in ms (converted from jiffies: 12 on HZ=250 for the default 10 ms)
    return int(read_attr(HW / "lifespan")) / 1000.0


def sysfs_ports() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for dev in sorted(os.listdir(SYS_IB)):
        for port in sorted(os.listdir(SYS_IB / dev / "ports"), key=int):
            base = SYS_IB / dev / "ports" / port
            out[f"{dev}/{port}"] = {
                "state": int(read_attr(base / "state").split(":")[0]),
                "phys_state": int(read_attr(base / "phys_state").split(":")[0]),
                "parent": read_attr(SYS_IB / dev / "parent").strip() if (SYS_IB / dev / "parent").exists() else None,
            }
    return out


def sysfs_devices() -> dict[str, dict[str, str]]:
    return {
        dev: {
            "node_guid": read_attr(SYS_IB / dev / "node_guid").strip(),
            "sys_image_guid": read_attr(SYS_IB / dev / "sys_image_guid").strip(),
            "fw_ver": read_attr(SYS_IB / dev / "fw_ver").strip(),
            "ports": str(len(os.listdir(SYS_IB / dev / "ports"))),
        }
        for dev in sorted(os.listdir(SYS_IB))
    }


def as_json(value: object) -> Any:
    if isinstance(value, Unavailable):
        return {"unavailable": value.reason, "detail": value.detail, "errno": value.errno}
    if isinstance(value, list):
        return [as_json(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        out = {k: getattr(value, k) for k in value.__dataclass_fields__}
        if "values" in out:
            out["values"] = dict(out["values"])
        if out.get("disabled") is not None:
            out["disabled"] = sorted(out["disabled"])
        return out
    return value


def run(lab: Lab) -> dict[str, Any]:
    result: dict[str, Any] = {"kernel": os.uname().release}
    return measured(result, lambda: _run(lab, result))


def _run(lab: Lab, result: dict[str, Any]) -> None:
    lab.rxe_pair()
    record: list[bytes] = []
    with RdmaNetlink(record=record) as nl:
        devices = nl.devices()
        ports = nl.ports()
        result["dumps"] = {"devices": as_json(devices), "ports": as_json(ports)}
        result["sysfs"] = {"devices": sysfs_devices(), "ports": sysfs_ports()}
        result["netdev_ifindex"] = {"va": int(read_attr("/sys/class/net/va/ifindex"))}
        if isinstance(devices, Unavailable):
            raise LabError(f"device dump refused on a root namespace with rxe: {devices}")
        index = {d.name: d.index for d in devices}["rxe0"]
        quiet = nl.port_counters(index, 1, with_status=True)
        result["first_stat"] = as_json(quiet)
        result["raw_dumps_hex"] = [b.hex() for b in record]
        record.clear()
        result["traffic"] = _under_traffic(lab, nl, index)
        result["raw_stat_hex"] = [b.hex() for b in record[:2]]
        record.clear()
        nl.record = None
        result["timing"] = _timing(nl, index)
        result["node_exporter"] = _node_exporter(lab)
        names = {1: frozenset(hw_sysfs())}
        probe = nl.port_counters(index, 1)
        result["decision_root"] = as_json(choose_read_path("rxe0", names, {1: probe}))
    result["fallback"] = _fallback(lab)
    result["figures"] = figures(result)


def figures(result: dict[str, Any]) -> dict[str, Any]:
    """What the report quotes: per round, how far the counters moved between the two sysfs reads
    around the STAT_GET (the bound's width) and whether netlink fell inside; equality at rest."""
    rounds = result["traffic"]["rounds"]
    inside = sum(all(r["before"][n] <= r["netlink"][n] <= r["after"][n] for n in r["before"]) for r in rounds)
    spread = [r["after"]["sent_pkts"] - r["before"]["sent_pkts"] for r in rounds]
    still = result["traffic"]["still_netlink"]
    return {
        "kernel": result["kernel"],
        "rounds_within_bounds": f"{inside}/{len(rounds)}",
        "sent_pkts_moved_between_sysfs_reads": [min(spread, default=0), max(spread, default=0)],
        "equal_at_rest": isinstance(still, dict) and still.get("values") == result["traffic"]["still_sysfs"],
        "counters": len(result["traffic"]["still_sysfs"]),
        **result["timing"],
        "node_exporter_cpu_ms_per_scrape": result["node_exporter"]["cpu_ms_per_scrape"],
    }


def _under_traffic(lab: Lab, nl: RdmaNetlink, index: int) -> dict[str, Any]:
    wait = 2 * lifespan_s() + 0.005
    rounds: list[dict[str, Any]] = []
    qps: dict[str, Any] = {}
    with lab.send_bw_loopback("rxe0", seconds=20) as (server, client):
        start = hw_sysfs()["sent_pkts"]
        lab.wait_until(lambda: hw_sysfs()["sent_pkts"] > start + 1000, 60, "rxe0 sent_pkts moving (traffic)")
        for _ in range(ROUNDS):
            before = hw_sysfs()
            time.sleep(wait)  # the cache's defined window (lifespan), not a hope: see the module doc
            got = nl.port_counters(index, 1)
            time.sleep(wait)
            after = hw_sysfs()
            time.sleep(wait)
            if isinstance(got, Unavailable):
                raise LabError(f"STAT_GET under traffic: {got}")
            rounds.append(
                {"before": before, "netlink": dict(got.values), "after": after, "stat_s": round(got.seconds, 6)}
            )
        # Who holds QPs, while both perftest processes do (RES_QP_GET), and what the consumers step makes of it.
        owners = nl.qp_owners()
        qps = {"owners": as_json(owners), "pids": {"server": server.pid, "client": client.pid}}
        if not isinstance(owners, Unavailable):
            qps["consumers"] = {dev: [as_json(c) for c in found] for dev, found in consumers_by_device(owners).items()}
        # The consumers scan both ways while they run: the kernel's verbs contexts (RES_CTX_GET) and the walk
        # of every process's descriptors must name the same processes.
        with RdmaNetlink() as ctx_client:
            qps["contexts"] = as_json(ctx_client.context_owners())
        for way, netlink in (("netlink", True), ("walk", False)):
            found = scanner(LIVE_SYSFS, LIVE_PROCFS, Path("/"), rdma_netlink=netlink)()
            qps[f"scan_{way}"] = {
                "source": found.source,
                "by_device": {dev: sorted({c.pid for c in cs}) for dev, cs in found.by_device.items()},
                "complete": found.complete,
            }
    # Traffic over (both killed): nothing moves any more, so one read of each must agree exactly.
    lab.wait_until(lambda: hw_sysfs() == hw_sysfs(), 10, "counters standing still")
    time.sleep(wait)
    still_sysfs = hw_sysfs()
    time.sleep(wait)
    still = nl.port_counters(index, 1)
    return {
        "qps": qps,
        "rounds": rounds,
        "lifespan_s": lifespan_s(),
        "still_sysfs": still_sysfs,
        "still_netlink": as_json(still),
        "client_log": (lab.out / "send_bw_client.log").read_text()[-2000:],
        "server_log": (lab.out / "send_bw_server.log").read_text()[-2000:],
    }


def _timing(nl: RdmaNetlink, index: int) -> dict[str, float]:
    """CPU and wall time of one port's hw counters both ways, in alternating batches (a change of the
    host's load hits both alike), each read with the lifespan cache expired, as a scrape finds it."""
    wait = 2 * lifespan_s() + 0.005
    ways: dict[str, Callable[[], object]] = {
        "sysfs_all_files": hw_sysfs,
        "netlink_stat_get": lambda: nl.port_counters(index, 1),
    }
    cpu = dict.fromkeys(ways, 0.0)
    wall = dict.fromkeys(ways, 0.0)
    for _ in range(TIMING_REPEATS):
        for what, fn in ways.items():
            time.sleep(wait)  # the cache's window passes: this read is a refresh
            c0, w0 = time.process_time(), time.perf_counter()
            fn()
            cpu[what] += time.process_time() - c0
            wall[what] += time.perf_counter() - w0
    out: dict[str, float] = {}
    for what in ways:
        out[f"{what}_cpu_ms"] = round(cpu[what] / TIMING_REPEATS * 1000, 4)
        out[f"{what}_wall_ms"] = round(wall[what] / TIMING_REPEATS * 1000, 4)
    return out


def _proc_cpu_s(pid: int) -> float:
    fields = read_attr(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _node_exporter(lab: Lab, scrapes: int = 50) -> dict[str, Any]:
    """node_exporter's infiniband collector (the host's Debian package, through the shared root file
    system) scraping the same real sysfs: its CPU per scrape, from its /proc stat (10 ms ticks, so
    over many scrapes)."""
    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if binary is None:
        raise LabError("no node_exporter on the host: install prometheus-node-exporter")
    port = free_port()
    log = open(lab.out / "node_exporter.log", "w")  # noqa: SIM115 (lives as long as the process)
    argv = [binary, "--collector.disable-defaults", "--collector.infiniband", f"--web.listen-address=127.0.0.1:{port}"]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        lab.wait_until(lambda: urllib.request.urlopen(url, timeout=5).status == 200, 60, "node_exporter answers")
        cpu0, wall0 = _proc_cpu_s(proc.pid), time.perf_counter()
        for _ in range(scrapes):
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = resp.read().decode()
        cpu = _proc_cpu_s(proc.pid) - cpu0
        wall = time.perf_counter() - wall0
    finally:
        proc.kill()
        proc.wait()
        log.close()
    lines = [ln for ln in body.splitlines() if ln.startswith(("node_infiniband_", "node_scrape_collector_success"))]
    return {
        "version": subprocess.run([binary, "--version"], capture_output=True, text=True).stderr.splitlines()[:1],
        "scrapes": scrapes,
        "cpu_ms_per_scrape": round(cpu / scrapes * 1000, 3),
        "wall_ms_per_scrape": round(wall / scrapes * 1000, 3),
        "infiniband_lines": lines[:60],
    }


def _fallback(lab: Lab) -> dict[str, Any]:
    """Exclusive netns mode: a socket in netns c sees no RDMA device; sysfs (the root's) still does."""
    out: dict[str, Any] = {}
    lab.reset()
    try:
        mode = lab.sh("rdma system set netns exclusive", check=False)
        out["set_exclusive"] = {"code": mode.returncode, "out": mode.stdout + mode.stderr}
        lab.modprobe_rxe()
        lab.sh("ip link add va type veth peer name vb && ip link set va up && ip link set vb up")
        lab.made.append("link va")
        lab.rdma_link_add("rxe0", "va")
        lab.sh("ip netns add c")
        root = RdmaNetlink()
        root_devs = root.devices()
        index = next(d.index for d in root_devs if d.name == "rxe0") if isinstance(root_devs, list) else 1
        root.close()
        client = in_network_namespace("/run/netns/c", RdmaNetlink)
        with client:
            devices = client.devices()
            stat = client.port_counters(index, 1)
        out["in_c"] = {"devices": as_json(devices), "stat": as_json(stat), "index": index}
        out["mode"] = lab.sh("rdma system show", check=False).stdout.strip()
        sysfs = hw_sysfs()
        out["sysfs_values"] = sysfs
        out["decision"] = as_json(choose_read_path("rxe0", {1: frozenset(sysfs)}, {1: stat}))
    finally:
        lab.sh("ip netns delete c 2>/dev/null; true", check=False)
        lab.reset()
        out["restore_shared"] = lab.sh("rdma system set netns shared", check=False).returncode
        out["mode_after"] = lab.sh("rdma system show", check=False).stdout.strip()
    return out
