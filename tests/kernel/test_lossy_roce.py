"""A lossy RoCE path on the real kernel: rxe's retransmission and sequence-error counters rise under
netem loss and reordering on rxe0's veth, `check` calls the path degrading, and the RnicRoceRetransmissions
expression is true on what the exporter exported (evaluated by promtool, Prometheus' rule engine)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kernel.conftest import scenario_result
from tests.kernel.vm import RunReport
from tests.support.dashboards import ALERT_RULES
from tests.support.exposition import samples
from tests.support.processes import require_binary

pytestmark = pytest.mark.kernel

# rxe's names for the signals of detect/link_health.py: the receiver's PSN gaps, the requester's
# NAKs and retries, and a QP that gave up.
RETRANSMISSION_SIGNALS = ("out_of_seq_request", "rcvd_seq_err", "comp_retry", "duplicate_request")


@pytest.fixture(scope="module")
def lossy(kernel_lab: RunReport) -> dict[str, Any]:
    result: dict[str, Any] = scenario_result(kernel_lab, "lossy_roce")
    return result


def _rise(lossy: dict[str, Any], dev: str) -> dict[str, int]:
    return {k: lossy["after"][dev][k] - v for k, v in lossy["before"][dev].items() if v >= 0}


def test_traffic_ran_through_the_lossy_path(lossy: dict[str, Any]) -> None:
    assert "netem" in lossy["netem"] and "loss 3%" in lossy["netem"], lossy["netem"]
    assert _rise(lossy, "rxe0")["sent_pkts"] > 1000, (lossy["client"], lossy["server"])
    assert _rise(lossy, "rxe1")["rcvd_pkts"] > 1000, (lossy["client"], lossy["server"])


def test_the_kernel_counts_retransmissions_and_sequence_errors(lossy: dict[str, Any]) -> None:
    rises = {d: _rise(lossy, d) for d in ("rxe0", "rxe1")}
    total = sum(rises[d].get(k, 0) for d in rises for k in RETRANSMISSION_SIGNALS)
    assert total >= 10, rises
    print(f"lossy_roce counter rises: {json.dumps(rises)}")


def test_check_calls_the_path_degrading(lossy: dict[str, Any]) -> None:
    run = lossy["check"]
    data = json.loads(run["stdout"])
    degrading = [p for p in data["problems"] if p["code"] in ("link_degrading", "transport_retries_exceeded")]
    assert degrading and all(p["where"].startswith(("rxe0", "rxe1")) for p in degrading), data
    assert any("counters read twice, 3 s apart" in n for n in data["notes"])


def test_the_alert_expression_is_true_on_what_the_exporter_exported(lossy: dict[str, Any], tmp_path: Path) -> None:
    (rule,) = [r for r in ALERT_RULES if r["alert"] == "RnicRoceRetransmissions"]
    wanted = {"rnic_port_hw_stat_total", "rnic_port_packets_received_total", "rnic_port_packets_transmitted_total"}
    # Each scrape at its second (the scrapes are a few seconds apart; a check in between delays one).
    end = int(lossy["scrapes"][-1]["t"]) + 1
    series: dict[str, list[str]] = {}
    for scrape in lossy["scrapes"]:
        at = round(scrape["t"])
        for (name, labels), value in samples(scrape["text"]).items():
            if name in wanted:
                key = name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels)) + "}"
                series.setdefault(key, ["_"] * (end + 1))[at] = repr(float(value))
    during = round(lossy["scrapes"][-3]["t"])  # the last scrape while the traffic still ran
    doc = {
        "rule_files": [],
        "evaluation_interval": "1s",
        "tests": [
            {
                "interval": "1s",
                "input_series": [{"series": k, "values": " ".join(v)} for k, v in sorted(series.items())],
                "promql_expr_test": [
                    {
                        "expr": f"vector(1) and on () count({rule['expr']})",
                        "eval_time": f"{during}s",
                        "exp_samples": [{"labels": "{}", "value": 1}],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "lossy.test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=1000))
    result = subprocess.run(
        [require_binary("promtool"), "test", "rules", str(path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
