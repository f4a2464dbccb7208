"""The demo's wire story on a real Prometheus (issue 32): mlx5_2's optic fades under its own low warning
threshold, then its link renegotiates to half speed; the shipped rules (their `for:` scaled from minutes to
seconds, the order they fire in unchanged) raise RnicOpticRxPowerLow before RnicLinkBelowRated.

The daemon is `serve` in-process with the demo's simulated wire under the RoCE netdevs (demo.wire_reader,
the one seam `serve.run(wire=...)`); the faults are the demo's own steps."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from rnic_exporter.commands import demo
from rnic_exporter.sim import SimHost
from tests.support.processes import Prometheus, free_port, http_get
from tests.support.serve import serving, sim_serve_config
from tests.support.wait import wait_for

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "alerts/rnic-exporter.rules.yml"
OPTIC, SPEED = "RnicOpticRxPowerLow", "RnicLinkBelowRated"


def _scaled_rules(path: Path) -> Path:
    """The shipped rules with each `for:` read in seconds instead of minutes (5m -> 5s)."""
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                m = re.fullmatch(r"(\d+)([smh])", rule["for"])
                assert m, rule["for"]
                seconds = int(m[1]) * {"s": 1, "m": 60, "h": 3600}[m[2]]
                rule["for"] = f"{max(1, seconds // 60)}s"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _firing(prom: Prometheus) -> dict[str, dict[str, Any]]:
    """alertname -> the alert on mlx5_2, for the alerts firing now."""
    status, _, body = http_get(prom.url + "/api/v1/alerts")
    alerts = json.loads(body)["data"]["alerts"] if status == 200 else []
    return {
        a["labels"]["alertname"]: a
        for a in alerts
        if a["state"] == "firing" and a["labels"].get("device") == demo.FADING[0]
    }


@pytest.mark.e2e
def test_the_optic_alert_fires_before_the_speed_alert(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=5, infiniband=1)  # the demo's 6 RNICs
    port = free_port()
    config = sim_serve_config(host.root, port, poll_interval_s=0.2, state_dir=tmp_path / "state")
    reader = demo.wire_reader(demo.attach_wire(host), step_seconds=1.0)  # the module read every second
    prom_config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "rnic-exporter", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}],
    }
    device = demo.FADING[0]
    rules = [_scaled_rules(tmp_path / "rules.yml")]
    with serving(config, wire=reader), Prometheus(tmp_path / "prom", prom_config, rules) as prom:
        # Healthy first: the optic and the rated speed scraped, nothing firing on the device.
        prom.wait_value(f'count(rnic_module_monitor_level{{monitor="rx_power", device="{device}"}} == 0)', 30)
        prom.wait_value(f'count(rnic_port_rated_rate_bytes_per_second{{device="{device}"}})', 30)
        assert _firing(prom) == {}
        print(demo._optic_fade(host))
        wait_for(
            lambda: prom.value(f'rnic_module_monitor_level{{monitor="rx_power", device="{device}", lane="2"}}') == -1.0,
            timeout=20,
            what="the faded lane at -1 (below low warning) in Prometheus",
        )
        print(demo._speed_drop(host))
        first_seen: dict[str, float] = {}

        def both() -> bool:
            for name in _firing(prom):
                first_seen.setdefault(name, time.monotonic())
            return {OPTIC, SPEED} <= set(first_seen)

        wait_for(both, timeout=60, what=f"{OPTIC} and {SPEED} firing on {device}", interval=0.1)
        alerts = _firing(prom)
    assert first_seen[OPTIC] < first_seen[SPEED], first_seen
    assert alerts[OPTIC]["activeAt"] < alerts[SPEED]["activeAt"], alerts
    assert alerts[OPTIC]["labels"]["netdev"] == demo.FADING[1] and alerts[OPTIC]["labels"]["lane"] == "2"
