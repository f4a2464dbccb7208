"""The alert rules: promtool checks and unit tests pass, every alert is unit-tested firing and silent, has its
runbook, names only catalogue metrics, and the unit tests notice when an alert or its `for:` is broken."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from rnic_exporter.catalog import metrics as catalog
from tests.support.dashboards import ALERT_RULES, RULES, rules
from tests.support.processes import require_binary
from tests.support.promql import metric_names

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "alerts"
UNIT_TESTS = sorted((ALERTS / "tests").glob("*.yml"))
RUNBOOKS = REPO / "docs/runbooks"
RUNBOOK_BASE = "https://github.com/rnic-exporter/rnic-exporter/blob/main/docs/runbooks/"
PROMETHEUS_METRICS = {"up"}  # written by Prometheus itself, not by the exporter


def _promtool(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require_binary("promtool"), *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_promtool_check_rules_passes() -> None:
    result = _promtool("check", "rules", "--lint=all", "--lint-fatal", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    assert UNIT_TESTS, "no unit tests in alerts/tests/"
    result = _promtool("test", "rules", *map(str, UNIT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(UNIT_TESTS)


def _alert_cases() -> dict[str, dict[str, set[Path]]]:
    """alertname -> {"fires": test files, "silent": test files} over every alert_rule_test."""
    cases: dict[str, dict[str, set[Path]]] = {}
    for path in UNIT_TESTS:
        doc = yaml.safe_load(path.read_text())
        assert doc["rule_files"] == ["../rnic-exporter.rules.yml"], f"{path.name} must test the shipped rules"
        for test in doc["tests"]:
            for case in test.get("alert_rule_test", []):
                kind = "fires" if case.get("exp_alerts") else "silent"
                cases.setdefault(case["alertname"], {"fires": set(), "silent": set()})[kind].add(path)
    return cases


@pytest.mark.parametrize("rule", ALERT_RULES, ids=lambda rule: str(rule["alert"]))
def test_alert_is_complete(rule: dict[str, Any]) -> None:
    name = rule["alert"]
    assert re.fullmatch(r"Rnic[A-Z][A-Za-z]+", name), name
    assert rule["labels"]["severity"] in {"critical", "warning", "info"}
    annotations = rule["annotations"]
    assert set(annotations) == {"summary", "description", "runbook_url"}
    assert annotations["summary"].endswith("."), "summary is a sentence"
    assert "$labels.instance" in annotations["description"]
    cases = _alert_cases().get(name)
    assert cases and cases["fires"] and cases["silent"], f"{name} needs a firing and a silent unit test"
    assert annotations["runbook_url"] == f"{RUNBOOK_BASE}{name}.md"
    runbook = RUNBOOKS / f"{name}.md"
    assert runbook.is_file(), f"{runbook.relative_to(REPO)} is missing"
    text = runbook.read_text()
    # The runbook explains the rule's `for:` (or why it has none), and shows how to confirm the fault.
    heading = f"## Why `for: {rule['for']}`" if "for" in rule else "## Why no `for:`"
    assert heading in text, f"{runbook.name} lacks the heading {heading!r}"
    assert text.startswith(f"# {name}\n")


def test_every_runbook_belongs_to_an_alert() -> None:
    assert {p.stem for p in RUNBOOKS.glob("*.md")} == {rule["alert"] for rule in ALERT_RULES}


def test_every_metric_in_a_rule_is_in_the_catalogue() -> None:
    for rule in rules():
        # The expression, and the queries the description templates run (`...` | query) to show values.
        queries = [
            rule["expr"],
            *(q for text in rule.get("annotations", {}).values() for q in re.findall(r"`([^`]*)`\s+\$labels", text)),
        ]
        for query in queries:
            names = metric_names(query)
            assert names, query
            unknown = names - set(catalog.BY_NAME) - PROMETHEUS_METRICS
            assert not unknown, (
                f"{rule.get('alert')} names {sorted(unknown)}, which rnic_exporter/catalog/metrics.py lacks"
            )


def test_the_issue_alerts_are_all_there() -> None:
    severities = {rule["alert"]: rule["labels"]["severity"] for rule in ALERT_RULES}
    assert severities == {
        "RnicGidIndexMoved": "critical",
        "RnicGidTableChanged": "warning",
        "RnicNcclGidIndexInvalid": "critical",
        "RnicLinkBelowRated": "warning",
        "RnicLinkFarBelowRated": "critical",
        "RnicPcieLinkDowntrained": "warning",
        "RnicDeviceDisappeared": "critical",
        "RnicPortDown": "warning",
        "RnicPortFlapping": "warning",
        "RnicAddressLost": "critical",
        "RnicAddressLossRisk": "info",
        "RnicExporterDown": "warning",
        "RnicExporterPollStalled": "warning",
        "RnicAttributeUnreadable": "warning",
        "RnicNcclGidUnusable": "critical",
        "RnicDeviceReadStuck": "critical",
        "RnicExporterNeverPolled": "warning",
        "RnicPcieAerFatalErrors": "critical",
        "RnicPcieAerNonFatalErrors": "warning",
        "RnicPcieAerCorrectableRising": "warning",
        "RnicExporterConfigReloadFailed": "warning",
        "RnicExporterStateUnwritable": "warning",
        "RnicExporterEventSourceFailing": "warning",
        "RnicLinkSymbolErrors": "warning",
        "RnicLinkRetrained": "warning",
        "RnicPortReceiveErrors": "warning",
        "RnicRoceRetransmissions": "warning",
        "RnicRoceRetriesExceeded": "critical",
        "RnicReceiveDrops": "warning",
        "RnicOpticRxPowerLow": "warning",
        "RnicOpticRxPowerDrifting": "warning",
        "RnicFecUncorrectableRising": "warning",
        "RnicPauseStorm": "critical",
    }


def _mutated(tmp_path: Path, alert: str, change: str) -> Path:
    """A copy of alerts/ where `alert` is broken: `never` never fires, `no-for` drops its `for:`."""
    copy = tmp_path / "alerts"
    shutil.copytree(ALERTS, copy)
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                if change == "never":
                    rule["expr"] = f"({rule['expr']}) unless on () vector(1)"
                else:
                    del rule["for"]
    (copy / RULES.name).write_text(yaml.safe_dump(doc, sort_keys=False))
    return copy


@pytest.mark.parametrize("rule", ALERT_RULES, ids=lambda rule: str(rule["alert"]))
def test_unit_tests_catch_a_broken_alert(tmp_path: Path, rule: dict[str, Any]) -> None:
    """An alert that never fires fails its unit tests; so does one without its `for:` (the blip case)."""
    cases = _alert_cases()[rule["alert"]]
    files = sorted(cases["fires"] | cases["silent"])
    for change in ("never", "no-for") if "for" in rule else ("never",):
        copy = _mutated(tmp_path / change, rule["alert"], change)
        result = _promtool("test", "rules", *(str(copy / "tests" / f.name) for f in files), cwd=copy)
        output = result.stdout + result.stderr  # promtool prints the failures on stderr
        assert result.returncode == 1 and "FAILED" in output, f"{change}: {output}"
        assert f"alertname: {rule['alert']}" in output, output


def test_readme_alert_table_matches_the_rules() -> None:
    readme = (REPO / "README.md").read_text()
    rows = {m[0]: (m[1], m[2]) for m in re.findall(r"^\| `(Rnic\w+)` \| (\w+) \| ([^|]+?) \|", readme, flags=re.M)}
    assert rows == {rule["alert"]: (rule["labels"]["severity"], rule.get("for", "–")) for rule in ALERT_RULES}
