"""The link-health alerts judge with the same limits and counters as `check` and the events
(rnic_exporter/detect/link_health.py): a changed default that left the rules behind fails here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from rnic_exporter.catalog.link_health import SIGNALS, LinkHealthThresholds

RULES = Path(__file__).resolve().parents[2] / "alerts/rnic-exporter.rules.yml"
T = LinkHealthThresholds()


def _num(value: float) -> str:
    """How the rules spell a limit: 1e-4, not 0.0001."""
    text = f"{value:g}"
    return re.sub(r"^0\.(0+)(\d)$", lambda m: f"{m[2]}e-{len(m[1]) + 1}", text)


def _expr(alert: str) -> str:
    doc: dict[str, Any] = yaml.safe_load(RULES.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == alert]
    assert len(rules) == 1, alert
    return " ".join(str(rules[0]["expr"]).split())


def _counters(expr: str) -> set[str]:
    return {name for group in re.findall(r'counter=~?"([^"]+)"', expr) for name in group.split("|")}


def _signal_counters(kind: str) -> set[str]:
    return {c for s in SIGNALS if s.kind == kind for c in s.counters}


def test_symbol_errors() -> None:
    expr = _expr("RnicLinkSymbolErrors")
    assert f"> {T.symbol_error_ber:g}" in expr and f">= {T.min_errors}" in expr
    assert f"* 3600 > {T.errors_per_hour:g}" in expr
    assert _counters(expr) == _signal_counters("ber")


def test_link_events_and_receive_errors() -> None:
    assert _counters(_expr("RnicLinkRetrained")) == _signal_counters("event")
    expr = _expr("RnicPortReceiveErrors")
    assert _counters(expr) == _signal_counters("errors") and f"* 3600 > {T.errors_per_hour:g}" in expr


def test_retransmissions_and_drops() -> None:
    expr = _expr("RnicRoceRetransmissions")
    assert _counters(expr) == _signal_counters("transport")
    assert f"> {_num(T.retransmission_ratio)}" in expr and f">= {T.min_retransmissions}" in expr
    assert f"> {T.retransmissions_per_second:g} unless" in expr
    drops = _expr("RnicReceiveDrops")
    assert _counters(drops) == _signal_counters("drops")
    assert f"> {_num(T.drop_ratio)}" in drops and f">= {T.min_drops}" in drops


def test_retries_exceeded() -> None:
    assert _counters(_expr("RnicRoceRetriesExceeded")) == _signal_counters("fatal")
