"""The alert rules as committed, and the dashboards' panels and queries as Grafana runs them: for the tests of
the alerts, the dashboards and the fleet."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "alerts" / "rnic-exporter.rules.yml"
# What Grafana puts in for the variables when a query runs; "All" is the allValue `.*`.
VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "1h",
    "$instance": ".*",
    "$device": ".*",
    "$port": ".*",
}


def rules() -> list[dict[str, Any]]:
    """Every rule of every group of the committed alert rules file."""
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


ALERT_RULES = [rule for rule in rules() if "alert" in rule]


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside rows too."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def substitute(expr: str) -> str:
    """`expr` with Grafana's variables replaced as Grafana does when the query runs."""
    for variable, value in sorted(VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"unknown variable in {expr}"
    return expr
