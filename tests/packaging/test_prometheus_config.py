"""The bundle's Prometheus example (packaging/prometheus/prometheus.yml): the real promtool loads
it with both rule files where `rnic-exporter bundle` puts them, and the README says outside the
Operator path that the fleet dashboard needs the recording rules."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from rnic_exporter.commands import bundle
from rnic_exporter.daemon.agent import DEFAULT_PORT
from tests.support.processes import require_binary

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "packaging" / "prometheus" / "prometheus.yml"
README = REPO / "README.md"


def test_bundled_prometheus_config_loads_both_rule_files_in_promtool(tmp_path: Path) -> None:
    bundle.write_bundle(tmp_path)
    config = tmp_path / "prometheus" / "prometheus.yml"
    result = subprocess.run(
        [require_binary("promtool"), "check", "config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # promtool checks each rule file the config names and prints "Checking <file>  SUCCESS: N rules found".
    for rules in bundle.rule_files(bundle.bundle_root()):
        assert re.search(
            rf"Checking \S*alerts/{re.escape(rules.name)}\s+SUCCESS: [1-9]\d* rules found", result.stdout
        ), result.stdout


def test_prometheus_example_scrapes_the_exporter_as_the_alerts_expect() -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    [job] = data["scrape_configs"]
    # RnicExporterDown and RnicExporterNeverPolled select up{job=~".*rnic.*"}.
    assert re.fullmatch(".*rnic.*", job["job_name"])
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert targets and all(t.endswith(f":{DEFAULT_PORT}") for t in targets)
    assert sorted(Path(f).name for f in data["rule_files"]) == [p.name for p in bundle.rule_files(bundle.bundle_root())]


def test_readme_says_without_the_operator_that_the_fleet_dashboard_needs_the_recording_rules() -> None:
    text = README.read_text()
    without = text[text.index("Without the Prometheus Operator") :]
    without = without[: without.index("\n\n")]
    assert "alerts/rnic-recording.rules.yml" in without and "fleet dashboard" in without
    assert "prometheus/prometheus.yml" in without
