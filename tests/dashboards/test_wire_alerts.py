"""The wire alerts (alerts/wire/, for the metrics in catalog.metrics.WIRE_METRICS): promtool lint and unit
tests pass, every alert is tested firing and silent, has its runbook, names only wire metrics, and its unit
tests fail when the alert is broken (never fires, or loses its `for:`)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from rnic_exporter.catalog import metrics as catalog
from tests.support.processes import require_binary
from tests.support.promql import metric_names

REPO = Path(__file__).resolve().parents[2]
WIRE = REPO / "alerts" / "wire"
RULES = WIRE / "rnic-wire.rules.yml"
UNIT_TESTS = sorted((WIRE / "tests").glob("*.yml"))
RUNBOOKS = REPO / "docs" / "runbooks" / "wire"
RUNBOOK_BASE = "https://github.com/rnic-exporter/rnic-exporter/blob/main/docs/runbooks/wire/"
ALERTS = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]


def _promtool(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require_binary("promtool"), *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_lint_and_unit_tests_pass() -> None:
    lint = _promtool("check", "rules", "--lint=all", "--lint-fatal", str(RULES))
    assert lint.returncode == 0 and f"SUCCESS: {len(ALERTS)} rules found" in lint.stdout, lint.stdout + lint.stderr
    result = _promtool("test", "rules", *map(str, UNIT_TESTS))
    assert result.returncode == 0 and result.stdout.count("SUCCESS") == len(UNIT_TESTS), result.stdout + result.stderr


def _cases() -> dict[str, set[str]]:
    kinds: dict[str, set[str]] = {}
    for path in UNIT_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                kinds.setdefault(case["alertname"], set()).add("fires" if case.get("exp_alerts") else "silent")
    return kinds


@pytest.mark.parametrize("rule", ALERTS, ids=lambda rule: str(rule["alert"]))
def test_alert_is_complete(rule: dict[str, Any]) -> None:
    name = rule["alert"]
    assert re.fullmatch(r"Rnic[A-Z][A-Za-z]+", name) and rule["labels"]["severity"] in {"critical", "warning"}
    annotations = rule["annotations"]
    assert set(annotations) == {"summary", "description", "runbook_url"} and annotations["summary"].endswith(".")
    assert "$labels.instance" in annotations["description"]
    assert _cases().get(name) == {"fires", "silent"}, f"{name} needs a firing and a silent unit test"
    assert annotations["runbook_url"] == f"{RUNBOOK_BASE}{name}.md"
    text = (RUNBOOKS / f"{name}.md").read_text()
    assert text.startswith(f"# {name}\n")
    assert (f"## Why `for: {rule['for']}`" if "for" in rule else "## Why no `for:`") in text
    names = metric_names(rule["expr"])
    wire = {spec.name for spec in catalog.WIRE_METRICS}
    assert names and names <= wire, sorted(names - wire)


def test_every_runbook_belongs_to_an_alert() -> None:
    assert {p.stem for p in RUNBOOKS.glob("*.md")} == {rule["alert"] for rule in ALERTS}


@pytest.mark.parametrize("rule", ALERTS, ids=lambda rule: str(rule["alert"]))
def test_unit_tests_catch_a_broken_alert(tmp_path: Path, rule: dict[str, Any]) -> None:
    for change in ("never", "no-for") if "for" in rule else ("never",):
        copy = tmp_path / change
        shutil.copytree(WIRE, copy)
        doc = yaml.safe_load(RULES.read_text())
        for group in doc["groups"]:
            for other in group["rules"]:
                if other.get("alert") == rule["alert"]:
                    if change == "never":
                        other["expr"] = f"({other['expr']}) unless on () vector(1)"
                    else:
                        del other["for"]
        (copy / RULES.name).write_text(yaml.safe_dump(doc, sort_keys=False))
        result = _promtool("test", "rules", *(str(copy / "tests" / p.name) for p in UNIT_TESTS), cwd=copy)
        output = result.stdout + result.stderr
        assert result.returncode == 1 and f"alertname: {rule['alert']}" in output, f"{change}: {output}"
