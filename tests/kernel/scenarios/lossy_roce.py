"""A lossy RoCE path on the real kernel (issue 31): netem drops and reorders rxe0's packets on its veth
while `ib_send_bw` (RC) runs from rxe0 to rxe1, and a `serve` is scraped every few seconds.

6.1's rxe receives only in the initial network namespace (docs/kernel-lab.md), so both devices live
there: rxe0 on va (10.77.0.1), rxe1 on va2 (10.77.1.1), their peers vb and vb2 bridged in netns b.
Policy routing sends what each address sends to the other out of its own veth (the local table moved
after two rules for locally generated packets; accept_local so the bridge's return is not a martian),
so every packet crosses va's qdisc, where netem is. The first try, rxe1 on vb inside netns b, showed
the namespace limit again: rxe0 sent 56,192 packets and rxe1 received none.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

from tests.kernel.lab import NETNS, SYS_IB, Lab, ipv4_gid, measured, read_attr

TRAFFIC_S = 60  # ib_send_bw -D: long enough for several scrapes and a check under emulation
SCRAPE_EVERY_S = 3.0
PORT = 18515
NETEM = "delay 1ms reorder 10% 50% loss 3%"
NEAR, FAR = "10.77.0.1", "10.77.1.1"
WATCHED = (
    "sent_pkts",
    "rcvd_pkts",
    "out_of_seq_request",
    "rcvd_seq_err",
    "duplicate_request",
    "comp_retry",
    "retry_exceeded_err",
    "ack_deferred",
)


def counters(dev: str) -> dict[str, int]:
    out = {}
    for name in WATCHED:
        try:
            out[name] = int(read_attr(SYS_IB / dev / "ports/1/hw_counters" / name))
        except (OSError, ValueError):
            out[name] = -1  # not this kernel's: the host test says which
    return out


def _until(lab: Lab, due: float) -> None:
    """Wait for the next scrape's time (at once when a slow check already passed it)."""
    lab.wait_until(lambda: time.monotonic() >= due, max(0.0, due - time.monotonic()) + 30, "the next scrape's time")


def looped_pair(lab: Lab) -> None:
    """rxe0 on va and rxe1 on va2, both in the initial namespace, talking over a bridge in netns b."""
    lab.modprobe_rxe()
    lab.sh(f"ip netns add {NETNS}")
    lab.made.append(f"netns {NETNS}")
    lab.sh("ip link add va type veth peer name vb && ip link add va2 type veth peer name vb2")
    lab.sh(f"ip link set vb netns {NETNS} && ip link set vb2 netns {NETNS}")
    lab.sh(
        "ip link add br0 type bridge && ip link set vb master br0 && ip link set vb2 master br0"
        " && ip link set vb up && ip link set vb2 up && ip link set br0 up",
        netns=NETNS,
    )
    lab.sh(f"ip addr add {NEAR}/32 dev va && ip addr add {FAR}/32 dev va2 && ip link set va up && ip link set va2 up")
    keys = [f"net.ipv4.conf.{i}.{k}" for i in ("all", "va", "va2") for k in ("accept_local", "rp_filter")]
    lab.sh("sysctl -qw " + " ".join(f"{k}={1 if k.endswith('accept_local') else 0}" for k in keys))
    mac = {d: read_attr(f"/sys/class/net/{d}/address").strip() for d in ("va", "va2")}
    lab.sh(f"ip neigh replace {FAR} lladdr {mac['va2']} dev va nud permanent")
    lab.sh(f"ip neigh replace {NEAR} lladdr {mac['va']} dev va2 nud permanent")
    lab.sh(f"ip route add {FAR} dev va table 100 && ip route add {NEAR} dev va2 table 101")
    lab.sh(
        f"ip rule add pref 10 to {FAR} iif lo lookup 100 && ip rule add pref 11 to {NEAR} iif lo lookup 101"
        " && ip rule add pref 1000 lookup local && ip rule del pref 0"
    )
    lab.rdma_link_add("rxe0", "va")
    lab.rdma_link_add("rxe1", "va2")
    for dev, addr in (("rxe0", NEAR), ("rxe1", FAR)):
        _ready(lab, dev, addr)


def _ready(lab: Lab, dev: str, addr: str) -> None:
    lab.wait_until(lambda: read_attr(SYS_IB / dev / "ports/1/state").strip() == "4: ACTIVE", 30, f"{dev} ACTIVE")
    lab.wait_until(lambda: lab.gid_of(dev, ipv4_gid(addr)) is not None, 30, f"{dev} has the GID of {addr}")


def unloop(lab: Lab) -> None:
    lab.sh(
        "ip rule add pref 0 lookup local; ip rule del pref 1000; ip rule del pref 10; ip rule del pref 11", check=False
    )
    lab.sh("sysctl -qw net.ipv4.conf.all.accept_local=0", check=False)


def run(lab: Lab) -> dict[str, Any]:
    result: dict[str, Any] = {}
    try:
        return measured(result, lambda: _run(lab, result))
    finally:
        unloop(lab)


def _run(lab: Lab, result: dict[str, Any]) -> None:
    looped_pair(lab)
    serve = lab.serve("--path.sysfs", "/sys", "--poll.interval", "1")
    lab.wait_until(lambda: 'device="rxe1"' in serve.scrape(), 60, "a scrape that shows rxe1", poll_s=0.5)
    lab.sh(f"modprobe sch_netem && tc qdisc add dev va root netem {NETEM}")
    result["netem"] = lab.sh("tc qdisc show dev va").stdout
    result["before"] = {d: counters(d) for d in ("rxe0", "rxe1")}
    common = f"stdbuf -oL -eL timeout {TRAFFIC_S + 30} ib_send_bw -x 1 -D {TRAFFIC_S} -s 4096 -p {PORT}"
    server = subprocess.Popen(
        ["sh", "-c", f"{common} -d rxe1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    client: subprocess.Popen[str] | None = None
    scrapes: list[dict[str, Any]] = []
    try:
        lab.wait_until(
            lambda: server.poll() is not None or f":{PORT}" in lab.sh("ss -Hltn", check=False).stdout,
            30,
            f"ib_send_bw server listening on {PORT} (or exited)",
            poll_s=0.1,
        )
        client = subprocess.Popen(
            ["sh", "-c", f"{common} -d rxe0 {FAR}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        start = time.monotonic()
        check_done = False
        while client.poll() is None and time.monotonic() - start < TRAFFIC_S + 40:
            due = start + len(scrapes) * SCRAPE_EVERY_S
            _until(lab, due)
            scrapes.append({"t": round(time.monotonic() - start, 3), "text": serve.scrape()})
            if not check_done and time.monotonic() - start > TRAFFIC_S / 4:
                result["check"] = lab.cli_result("check", "--json").as_dict()
                check_done = True
        for _ in range(2):  # after the traffic: the counters as they stay
            due = start + len(scrapes) * SCRAPE_EVERY_S
            _until(lab, due)
            scrapes.append({"t": round(time.monotonic() - start, 3), "text": serve.scrape()})
        client_out, _ = client.communicate(timeout=60)
        server_out, _ = server.communicate(timeout=60)
    finally:
        for proc in (client, server):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        lab.sh("tc qdisc del dev va root", check=False)
    result["after"] = {d: counters(d) for d in ("rxe0", "rxe1")}
    result["client"] = {"code": client.returncode if client else None, "out": client_out[-3000:]}
    result["server"] = {"code": server.returncode, "out": server_out[-3000:]}
    result["scrapes"] = scrapes
    result["serve_exit"] = serve.stop()
