"""The daemon's counter path over RDMA netlink on the real kernel (issue 30): `serve` on rxe.

1. rxe0 on va, rxe1 on vb (netns b); `serve` with its defaults (`--collector.rdma-netlink` on).
2. ib_send_bw RC traffic in loopback on rxe0. Rounds of: every hw_counters file of rxe0 port 1
   (sysfs, "before"), one scrape, every file again ("after"). A scrape gets a counter pass of its
   own when the last one is over a second old (docs/how-it-reads.md), and each phase waits out
   twice the hw_counters cache's lifespan (as the nldev scenario does), so before <= served <= after
   holds for every counter.
3. The same daemon's self-metrics: the read path of each device and its reads by kind.
4. `serve --no-collector.rdma-netlink`: the read path is sysfs, and the reads are files.
"""

from __future__ import annotations

import os
import time
from typing import Any

from tests.kernel.lab import Lab, LabError, measured, sample, samples
from tests.kernel.scenarios.nldev import hw_sysfs, lifespan_s

ROUNDS = 3
PASS_REUSE_S = 1.0  # a counter pass under this old is shared with the next scrape (docs/how-it-reads.md)
SELF_METRICS = ("rnic_exporter_read_path_info", "rnic_exporter_reads_total")


def run(lab: Lab) -> dict[str, Any]:
    result: dict[str, Any] = {"kernel": os.uname().release}
    return measured(result, lambda: _run(lab, result))


def _self_lines(scrape: str) -> list[str]:
    return [ln for ln in scrape.splitlines() if ln.startswith(SELF_METRICS)]


def _served(scrape: str) -> dict[str, float]:
    return {
        labels["counter"]: value
        for labels, value in samples(scrape, "rnic_port_hw_stat_total", device="rxe0", port="1")
    }


def _run(lab: Lab, result: dict[str, Any]) -> None:
    lab.rxe_pair()
    common = ("--path.sysfs", "/sys", "--poll.interval", "1")
    serve = lab.serve(*common)
    lab.wait_until(lambda: _served(serve.scrape()), 60, "a scrape with rxe0's hw counters", poll_s=0.5)
    wait = 2 * lifespan_s() + 0.005
    rounds: list[dict[str, Any]] = []
    with lab.send_bw_loopback("rxe0", seconds=30):
        start = hw_sysfs()["sent_pkts"]
        lab.wait_until(lambda: hw_sysfs()["sent_pkts"] > start + 1000, 60, "rxe0 sent_pkts moving (traffic)")
        for _ in range(ROUNDS):
            time.sleep(PASS_REUSE_S + wait)  # the last pass is too old to be shared: this scrape reads
            before = hw_sysfs()
            time.sleep(wait)  # the hw_counters cache's window (see the nldev scenario)
            scrape = serve.scrape()
            time.sleep(wait)
            after = hw_sysfs()
            rounds.append({"before": before, "served": _served(scrape), "after": after})
    result["rounds"] = rounds
    result["netlink"] = {"self": _self_lines(serve.scrape()), "log": serve.log_text()[-3000:]}
    serve.stop()
    sysfs = lab.serve(*common, "--no-collector.rdma-netlink")
    lab.wait_until(
        lambda: sample(sysfs.scrape(), "rnic_exporter_read_path_info", device="rxe0") is not None,
        60,
        "rxe0's read path in a scrape",
        poll_s=0.5,
    )
    body = sysfs.scrape()
    if not _served(body):
        raise LabError("serve --no-collector.rdma-netlink: no hw counters of rxe0 in a scrape")
    result["sysfs"] = {"self": _self_lines(body), "served": _served(body), "log": sysfs.log_text()[-3000:]}
