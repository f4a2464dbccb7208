"""Incident 3 (NCCL RoCE v2 GID index mismatch) on the real kernel: `check`'s verdict on a configured
NCCL_IB_GID_INDEX against whether RDMA traffic actually runs with that index.

For each index (the link-local slot 0, the IPv4 slot, an empty slot, one beyond the 1024-slot table)
`check --json` runs with NCCL_IB_GID_INDEX set as a job prologue would see it, and `ib_send_bw` (RC,
both sides on the same index, as NCCL jobs configured alike are) runs between rxe0 and rxe1 on the
flat veth pair (one L2 segment). The link-local and IPv4 indexes are measured again across a router
(netns r forwarding between 10.79.1.0/24 and 10.79.2.0/24), which is what a routed RoCE fabric is.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

from tests.kernel.lab import NETNS, SYS_IB, VB_ADDR, Lab, LabError, ipv4_gid, measured, read_attr

ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"
ROUTER, FAR = "r", "c"
NEAR_ADDR, FAR_ADDR = "10.79.1.1", "10.79.2.2"
TRAFFIC_TIMEOUT_S = 20
COUNTERS = ("sent_pkts", "rcvd_pkts", "rdma_sends", "rdma_recvs", "retry_exceeded_err", "send_err")


def _attr(path: str) -> str:
    try:
        return read_attr(SYS_IB / path).strip()
    except OSError as exc:
        return f"errno {exc.errno}"


def table(dev: str, n: int = 6) -> dict[str, str]:
    return {
        str(i): f"{_attr(f'{dev}/ports/1/gids/{i}')} {_attr(f'{dev}/ports/1/gid_attrs/types/{i}')}" for i in range(n)
    }


def counters(dev: str) -> dict[str, int]:
    """rxe's hw_counters of port 1 (what moved, even when a run hangs and is killed)."""
    out = {}
    for name in COUNTERS:
        try:
            out[name] = int(read_attr(SYS_IB / dev / "ports/1/hw_counters" / name))
        except (OSError, ValueError):
            out[name] = -1
    return out


def check(lab: Lab, index: int) -> dict[str, Any]:
    """`check --json` with NCCL_IB_GID_INDEX in the environment (how a job prologue gets it)."""
    old = os.environ.get("NCCL_IB_GID_INDEX")
    os.environ["NCCL_IB_GID_INDEX"] = str(index)
    try:
        r = lab.cli_result("check", "--json", "--no-netlink")
    finally:
        if old is None:
            os.environ.pop("NCCL_IB_GID_INDEX", None)
        else:
            os.environ["NCCL_IB_GID_INDEX"] = old
    out: dict[str, Any] = {"code": r.code, "seconds": round(r.seconds, 2), "stderr": r.stderr[-2000:]}
    try:
        data = json.loads(r.stdout)
        out["problems"] = data["problems"]
        out["notes"] = data["notes"]
    except ValueError:
        out["stdout"] = r.stdout[-4000:]
    return out


def traffic(
    lab: Lab, server_dev: str, server_ns: str, client_dev: str, peer: str, index: int, port: int
) -> dict[str, Any]:
    """ib_send_bw RC, 100 iterations, both sides with -x INDEX: did it run?"""
    # line-buffered: `timeout` kills a hung run, and a block-buffered stdout would die with it
    common = f"stdbuf -oL -eL timeout {TRAFFIC_TIMEOUT_S} ib_send_bw -x {index} -n 100 -s 1024 -p {port}"
    before = {d: counters(d) for d in (client_dev, server_dev)}
    server = subprocess.Popen(
        ["ip", "netns", "exec", server_ns, "sh", "-c", f"{common} -d {server_dev}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    start = time.monotonic()
    try:
        lab.wait_until(
            lambda: server.poll() is not None or f":{port}" in lab.sh("ss -Hltn", netns=server_ns, check=False).stdout,
            30,
            f"ib_send_bw server on {server_dev} listening on {port} (or exited)",
            poll_s=0.1,
        )
        client = lab.sh(f"{common} -d {client_dev} {peer}", check=False, timeout=TRAFFIC_TIMEOUT_S + 10)
        try:
            server_out, _ = server.communicate(timeout=TRAFFIC_TIMEOUT_S + 10)
        except subprocess.TimeoutExpired:
            server.kill()
            server_out, _ = server.communicate()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    client_out = client.stdout + client.stderr
    return {
        "index": index,
        "client_code": client.returncode,
        "server_code": server.returncode,
        "passed": client.returncode == 0 and server.returncode == 0 and "BW average" in client_out,
        "seconds": round(time.monotonic() - start, 2),
        "counters": {d: {k: counters(d)[k] - v for k, v in c.items()} for d, c in before.items()},
        "client": client_out[-3000:],
        "server": server_out[-3000:],
    }


def wait_port(lab: Lab, dev: str, addr: str) -> None:
    lab.wait_until(lambda: _attr(f"{dev}/ports/1/state") == "4: ACTIVE", 30, f"{dev} ACTIVE")
    lab.wait_until(lambda: lab.gid_of(dev, ipv4_gid(addr)) == 1, 30, f"{dev} GID 1 is {addr}")


def routed(lab: Lab) -> None:
    """rxe3 on veth1 (10.79.1.1, root) -- netns r forwards -- rxe4 on veth4 (10.79.2.2, netns c)."""
    for ns in (ROUTER, FAR):
        lab.sh(f"ip netns add {ns}")
    lab.sh(f"ip link add veth1 type veth peer name veth2 && ip link set veth2 netns {ROUTER}")
    lab.sh(
        f"ip link add veth3 type veth peer name veth4 && ip link set veth3 netns {ROUTER}"
        f" && ip link set veth4 netns {FAR}"
    )
    lab.sh(f"ip addr add {NEAR_ADDR}/24 dev veth1 && ip link set veth1 up")
    lab.sh(
        "sysctl -qw net.ipv4.ip_forward=1 && ip addr add 10.79.1.254/24 dev veth2"
        " && ip addr add 10.79.2.254/24 dev veth3 && ip link set veth2 up && ip link set veth3 up && ip link set lo up",
        netns=ROUTER,
    )
    lab.sh(f"ip addr add {FAR_ADDR}/24 dev veth4 && ip link set veth4 up && ip link set lo up", netns=FAR)
    lab.sh("ip route add 10.79.2.0/24 via 10.79.1.254")
    lab.sh("ip route add 10.79.1.0/24 via 10.79.2.254", netns=FAR)
    lab.rdma_link_add("rxe3", "veth1")
    lab.rdma_link_add("rxe4", "veth4", netns=FAR)
    for dev, addr in (("rxe3", NEAR_ADDR), ("rxe4", FAR_ADDR)):
        wait_port(lab, dev, addr)


def run(lab: Lab) -> dict[str, Any]:
    result: dict[str, Any] = {"flat": {}, "routed": {}, "check": {}}
    return measured(result, lambda: _run(lab, result))


def _run(lab: Lab, result: dict[str, Any]) -> None:
    lab.rxe_pair()
    empty = next(
        i for i in range(2, 16) if _attr(f"rxe0/ports/1/gids/{i}") == ZERO and _attr(f"rxe1/ports/1/gids/{i}") == ZERO
    )
    indexes = {"link_local": 0, "ipv4": lab.gid_of("rxe0", ipv4_gid("10.77.0.1")), "empty": empty, "beyond": 2000}
    if indexes["ipv4"] != lab.gid_of("rxe1", ipv4_gid(VB_ADDR)):
        raise LabError(f"rxe0 and rxe1 hold their IPv4 GIDs at different indexes: {table('rxe0')} {table('rxe1')}")
    result["indexes"] = indexes
    result["table_size"] = len(os.listdir(SYS_IB / "rxe0/ports/1/gids"))
    result["tables"] = {d: table(d) for d in ("rxe0", "rxe1")}
    for n, (case, index) in enumerate(indexes.items()):
        assert index is not None
        result["flat"][case] = traffic(lab, "rxe1", NETNS, "rxe0", VB_ADDR, index, 18600 + n)
    routed(lab)
    result["tables"].update({d: table(d) for d in ("rxe3", "rxe4")})
    for n, case in enumerate(("link_local", "ipv4")):
        index = indexes[case]
        assert index is not None
        result["routed"][case] = traffic(lab, "rxe4", FAR, "rxe3", FAR_ADDR, index, 18700 + n)
    for case, index in indexes.items():
        assert index is not None
        result["check"][case] = check(lab, index)
