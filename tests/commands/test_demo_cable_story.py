"""The demo's "cable going bad" story on the Prometheus rule engine: what the exporter exports while the
story plays (the real agent polling the simulated host every 15 s, as a scrape would find it) is fed to
`promtool test rules`, which evaluates the shipped alert rules with their `for:`. The degrading alerts
must fire before the speed alert: the point of judging the error counters."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from rnic_exporter.commands import demo
from rnic_exporter.sim import SimHost
from rnic_exporter.sources.reader import ReaderSettings
from tests.support.agent import make_agent
from tests.support.agent import metrics as scrape
from tests.support.dashboards import ALERT_RULES, RULES
from tests.support.processes import require_binary
from tests.support.promql import metric_names

SCRAPE_S = 15
STEP_S = 20.0  # the demo's default --demo.step


def _story_times() -> dict[str, float]:
    """When each step of the demo happens (seconds from the start), up to the speed drop."""
    at, out = 0.0, {}
    for i, step in enumerate(demo.STEPS):
        at += demo.wait_before(i, STEP_S)
        out[step.act.__name__] = at
        if step.act is demo._speed_drop:
            return out
    raise AssertionError("the demo has no speed drop")


def _needed_metrics() -> set[str]:
    names: set[str] = set()
    for rule in ALERT_RULES:
        names |= metric_names(rule["expr"])
    # The descriptions' queries (below rated, AER, workloads) read these too.
    return names | {"rnic_link_below_rated", "rnic_pcie_aer_errors_total", "rnic_device_workload_info"}


def test_the_degrading_alerts_fire_before_the_speed_alert(tmp_path: Path) -> None:
    times = _story_times()
    cable, speed = times["_cable_going_bad"], times["_speed_drop"]
    assert speed - cable == 150.0  # at the default 20 s steps
    end = speed + 8 * 60
    host = SimHost.build(tmp_path / "sys", roce=5, infiniband=1)  # the demo's 6 RNICs
    host.without_pma("mlx5_4")
    # The story's minutes pass in a moment here: every scrape reads the error counters, as the
    # 1-minute PMA timer (--collector.pma.slow-interval) does at the story's real pace.
    agent = make_agent(host, tmp_path / "state", reader=ReaderSettings(pma_slow_s=0))
    agent._counter_pass.max_age_s = 0.0  # each scrape reads counters (Prometheus' come 15 s apart)
    wanted = _needed_metrics()
    series: dict[str, list[str]] = {}
    pending = sorted((at, name) for name, at in times.items())
    scrapes = int(end // SCRAPE_S) + 1
    try:
        for i in range(scrapes):
            now = i * SCRAPE_S
            if i:
                host.add_traffic(SCRAPE_S)  # as the demo's player does between its polls
            while pending and pending[0][0] <= now:
                _, name = pending.pop(0)
                next(s for s in demo.STEPS if s.act.__name__ == name).act(host)
            agent.poll_once(full_gid_tables=True)
            for (metric, labels), value in scrape(agent).items():
                if metric not in wanted:
                    continue
                key = metric + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels)) + "}"
                series.setdefault(key, ["_"] * i).append(repr(float(value)))
            for values in series.values():
                if len(values) <= i:
                    values.append("_")
    finally:
        agent.close()
    inputs = [{"series": key, "values": " ".join(values)} for key, values in sorted(series.items())]
    assert any('counter="symbol_error",device="mlx5_2"' in i["series"] for i in inputs)

    watched = "RnicLinkSymbolErrors|RnicRoceRetransmissions|RnicLinkBelowRated|RnicLinkFarBelowRated"
    firing = f'count by (alertname) (ALERTS{{alertstate="firing", alertname=~"{watched}"}})'

    def case(at: float, alerts: dict[str, int]) -> dict[str, object]:
        return {
            "expr": firing,
            "eval_time": f"{int(at)}s",
            "exp_samples": [{"labels": f'{{alertname="{a}"}}', "value": n} for a, n in alerts.items()],
        }

    doc = {
        "rule_files": [str(RULES)],
        "evaluation_interval": f"{SCRAPE_S}s",
        "tests": [
            {
                "name": "cable going bad, then the link renegotiates at 200G",
                "interval": f"{SCRAPE_S}s",
                "input_series": inputs,
                "promql_expr_test": [
                    case(cable + 60, {}),  # errors counted, every alert still pending
                    # The speed dropped 2.5 minutes after the errors began, and its alerts are pending;
                    # the degrading ones (for: 5m) fire first.
                    case(speed + 4 * 60, {"RnicLinkSymbolErrors": 1, "RnicRoceRetransmissions": 1}),
                    # Then the speed alerts: the port's rate and the netdev's speed are both below rated.
                    case(
                        speed + 6 * 60,
                        {
                            "RnicLinkBelowRated": 2,
                            "RnicLinkFarBelowRated": 1,
                            "RnicLinkSymbolErrors": 1,
                            "RnicRoceRetransmissions": 1,
                        },
                    ),
                ],
            }
        ],
    }
    path = tmp_path / "story.test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=1000))
    result = subprocess.run(
        [require_binary("promtool"), "test", "rules", str(path)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
