"""A lossy RoCE path on the real kernel (issue 31): one packet in 30 arriving on rxe1's veth is dropped
(a `gact` action on its ingress) while `ib_send_bw` (RC) runs between rxe0 and rxe1, and a `serve` is
scraped every few seconds.

netem on rxe0's veth (`delay 1ms reorder 10% 50% loss 3%` on va's root qdisc) was tried first: on
Debian 6.1 under TCG rxe1 then received nothing at all (rxe0 sent 56,192 packets, rxe1 counted 0 and
ib_send_bw's server timed out), so the loss is injected where it leaves the transmit path alone.

Records rxe's own hw_counters before and after (what the kernel counted), every scrape with its time
(what the exporter exported; tests/kernel/test_lossy_roce.py evaluates the RnicRoceRetransmissions
expression on them with promtool), and `check --json` run while the traffic flows (its two counter
reads 3 s apart should call the path degrading).
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

from tests.kernel.lab import NETNS, SYS_IB, VB_ADDR, Lab, measured, read_attr

TRAFFIC_S = 60  # ib_send_bw -D: long enough for several scrapes and a check under emulation
SCRAPE_EVERY_S = 3.0
PORT = 18515
VB = "vb"
# gact: pass, except at random one packet in 30 (act_gact's netrand: probability 1/VAL).
LOSS = "matchall action gact ok random netrand drop 30"
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


def run(lab: Lab) -> dict[str, Any]:
    result: dict[str, Any] = {}
    return measured(result, lambda: _run(lab, result))


def _run(lab: Lab, result: dict[str, Any]) -> None:
    lab.rxe_pair()
    serve = lab.serve("--path.sysfs", "/sys", "--poll.interval", "1")
    lab.wait_until(lambda: 'device="rxe1"' in serve.scrape(), 60, "a scrape that shows rxe1", poll_s=0.5)
    lab.sh(f"tc qdisc add dev {VB} ingress && tc filter add dev {VB} parent ffff: {LOSS}", netns=NETNS)
    result["netem"] = lab.sh(f"tc filter show dev {VB} parent ffff:", netns=NETNS).stdout
    result["before"] = {d: counters(d) for d in ("rxe0", "rxe1")}
    common = f"stdbuf -oL -eL timeout {TRAFFIC_S + 30} ib_send_bw -x 1 -D {TRAFFIC_S} -s 4096 -p {PORT}"
    server = subprocess.Popen(
        ["ip", "netns", "exec", NETNS, "sh", "-c", f"{common} -d rxe1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    client: subprocess.Popen[str] | None = None
    scrapes: list[dict[str, Any]] = []
    try:
        lab.wait_until(
            lambda: server.poll() is not None or f":{PORT}" in lab.sh("ss -Hltn", netns=NETNS, check=False).stdout,
            30,
            f"ib_send_bw server listening on {PORT} (or exited)",
            poll_s=0.1,
        )
        client = subprocess.Popen(
            ["sh", "-c", f"{common} -d rxe0 {VB_ADDR}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
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
        lab.sh(f"tc qdisc del dev {VB} ingress", netns=NETNS, check=False)
    result["after"] = {d: counters(d) for d in ("rxe0", "rxe1")}
    result["client"] = {"code": client.returncode if client else None, "out": client_out[-3000:]}
    result["server"] = {"code": server.returncode, "out": server_out[-3000:]}
    result["scrapes"] = scrapes
    result["serve_exit"] = serve.stop()
