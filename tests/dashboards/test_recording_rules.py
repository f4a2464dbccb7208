"""The fleet recording rules: the committed file is a fresh rendering, promtool checks and unit tests pass,
every rule is unit-tested and reads only catalogue metrics, a broken rule fails its unit tests, and the
Kubernetes PrometheusRule carries them."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.commands import bundle
from rnic_exporter.dashboards import recording
from tests.support.processes import require_binary
from tests.support.promql import metric_names

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "alerts"
RULES = ALERTS / recording.FILENAME
UNIT_TESTS = sorted((ALERTS / "tests" / "recording").glob("*.yml"))


def _promtool(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require_binary("promtool"), *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_committed_file_is_a_fresh_rendering() -> None:
    assert RULES.read_text() == recording.render(), (
        f"alerts/{RULES.name} is stale: run `python -m rnic_exporter.dashboards.recording`"
    )
    doc = yaml.safe_load(RULES.read_text())
    (group,) = doc["groups"]
    assert [(r["record"], r["expr"].strip()) for r in group["rules"]] == [(r.record, r.expr) for r in recording.RULES]


def test_promtool_check_rules_passes() -> None:
    result = _promtool("check", "rules", "--lint=all", "--lint-fatal", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(recording.RULES)} rules found" in result.stdout


def test_rule_names_follow_level_metric_operations() -> None:
    for rule in recording.RULES:
        level, metric, operations = rule.record.split(":")
        assert level in {"instance", "instance_link", "instance_reason", "port", "address", "port_counter"}, rule
        assert metric.startswith("rnic_") and not metric.endswith("_total"), rule
        assert operations, rule
        # A sparse rule filters (a comparison without bool), so a healthy port or node records nothing.
        filters = re.search(r"(?<!bool )(==|>) 0\b", rule.expr.replace("== bool", "==bool")) is not None
        assert filters == rule.sparse, rule


def test_every_rule_reads_only_catalogue_metrics() -> None:
    """Raw metrics only: `promtool tsdb create-blocks-from rules` cannot backfill a rule reading another one."""
    for rule in recording.RULES:
        names = metric_names(rule.expr)
        assert names, rule
        unknown = names - set(catalog.BY_NAME)
        assert not unknown, f"{rule.record} reads {sorted(unknown)}, which rnic_exporter/catalog/metrics.py lacks"


def test_promtool_unit_tests_pass_and_cover_every_rule() -> None:
    assert UNIT_TESTS, "no unit tests in alerts/tests/recording/"
    result = _promtool("test", "rules", *map(str, UNIT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(UNIT_TESTS)
    tested: set[str] = set()
    for path in UNIT_TESTS:
        doc = yaml.safe_load(path.read_text())
        assert doc["rule_files"] == [f"../../{RULES.name}"], f"{path.name} must test the shipped rules"
        for test in doc["tests"]:
            for case in test.get("promql_expr_test", []):
                tested |= metric_names(case["expr"]) & set(recording.BY_RECORD)
    assert tested == set(recording.BY_RECORD), f"rules without a unit test: {sorted(set(recording.BY_RECORD) - tested)}"


def _broken_copy(tmp_path: Path, record: str) -> Path:
    """A copy of alerts/ where `record` records nothing."""
    copy = tmp_path / "alerts"
    shutil.copytree(ALERTS, copy)
    doc = yaml.safe_load(RULES.read_text())
    for rule in doc["groups"][0]["rules"]:
        if rule["record"] == record:
            rule["expr"] = f"({rule['expr']}) unless on () vector(1)"
    (copy / RULES.name).write_text(yaml.safe_dump(doc, sort_keys=False))
    return copy


@pytest.mark.parametrize("rule", recording.RULES, ids=str)
def test_unit_tests_catch_a_rule_that_records_nothing(tmp_path: Path, rule: recording.Rule) -> None:
    copy = _broken_copy(tmp_path, rule.record)
    result = _promtool("test", "rules", *(str(copy / p.relative_to(ALERTS)) for p in UNIT_TESTS), cwd=copy)
    output = result.stdout + result.stderr
    assert result.returncode == 1 and "FAILED" in output, output


def test_the_prometheus_rule_ships_the_recording_rules() -> None:
    committed = yaml.safe_load((REPO / "packaging/kubernetes/prometheusrule.yaml").read_text())
    groups: list[dict[str, Any]] = committed["spec"]["groups"]
    (fleet,) = [g for g in groups if g["name"] == recording.GROUP]
    assert [r["record"] for r in fleet["rules"]] == [r.record for r in recording.RULES]
    assert RULES in bundle.rule_files(REPO)
    # The alert group stays first (tests/packaging/test_packaging_kubernetes.py breaks its first rule on purpose).
    assert "alert" in groups[0]["rules"][0]
