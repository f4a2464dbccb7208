"""Node health checkers that run `check`: LBNL NHC (packaging/slurm/nhc/rnic.nhc) and Kubernetes'
node-problem-detector (packaging/kubernetes/node-problem-detector/rnic-check.json), whose custom-plugin
contract, exit 0/1/2 = OK/NonOK/Unknown, is check's own; and the DaemonSet's scrape annotations."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from rnic_exporter.cli import Exit, main
from rnic_exporter.commands import check as check_module
from rnic_exporter.sim import SimHost
from tests.support.processes import require_binary

REPO = Path(__file__).resolve().parents[2]
NHC = REPO / "packaging" / "slurm" / "nhc" / "rnic.nhc"
NPD = REPO / "packaging" / "kubernetes" / "node-problem-detector" / "rnic-check.json"
DAEMONSET = REPO / "packaging" / "kubernetes" / "daemonset.yaml"
# node-problem-detector's custom plugin: the exit status of the command (pkg/custompluginmonitor/types).
NPD_STATUS = {0: "OK", 1: "NonOK"}  # anything else, a timeout included, is Unknown


def nhc(tmp_path: Path, check_body: str) -> tuple[int, list[str]]:
    """check_rnic in bash with NHC's `die` and `log` as recorders, against a stand-in rnic-exporter."""
    binary = tmp_path / "rnic-exporter"
    binary.write_text(f"#!/bin/sh\n{check_body}\n")
    binary.chmod(0o755)
    script = f"""
        die() {{ echo "die $*"; }}
        log() {{ echo "log $*"; }}
        source {NHC}
        RNIC_CHECK_BIN={binary} RNIC_CHECK_CONFIG={tmp_path / "none.toml"} check_rnic
        echo "rc $?"
    """
    proc = subprocess.run([require_binary("bash"), "-c", script], capture_output=True, text=True, timeout=30)
    lines = proc.stdout.splitlines()
    return int(lines[-1].split()[1]), lines[:-1]


def test_nhc_drains_only_on_a_critical_problem_with_checks_line_as_the_reason(tmp_path: Path) -> None:
    critical = "[CRITICAL] mlx5_0 port 1 (ens1f0np0): expected address 10.0.0.1 is missing"
    rc, calls = nhc(tmp_path, f"echo 'PROBLEMS: 1 (1 critical)'; echo; echo '{critical}'; exit 1")
    assert rc == 1 and calls == [f"die 1 check_rnic: {critical}"]
    assert nhc(tmp_path, "echo 'OK: 8 RDMA device(s)'; exit 0") == (0, [])
    rc, calls = nhc(tmp_path, "echo 'rnic-exporter: error: config file x: bad' >&2; exit 2")
    assert rc == 0 and len(calls) == 1 and calls[0].startswith("log check_rnic: ") and "exit 2" in calls[0]


def test_nhc_passes_the_arguments_the_prologue_does(tmp_path: Path) -> None:
    rc, calls = nhc(tmp_path, 'echo "args: $*"; exit 0')
    assert rc == 0 and calls == []
    rc, calls = nhc(tmp_path, 'echo "[CRITICAL] args: $*"; exit 1')
    assert calls == ["die 1 check_rnic: [CRITICAL] args: check --fail-on critical"]


def npd_config() -> dict[str, Any]:
    config: dict[str, Any] = json.loads(NPD.read_text())
    return config


def test_npd_plugin_config_runs_check_as_a_permanent_condition_within_its_interval() -> None:
    config = npd_config()
    assert config["plugin"] == "custom"
    [condition] = config["conditions"]
    [rule] = config["rules"]
    assert rule["type"] == "permanent" and rule["condition"] == condition["type"]
    assert rule["path"] == "/opt/rnic-exporter/bin/rnic-exporter" and rule["args"][:3] == [
        "check",
        "--fail-on",
        "critical",
    ]

    def seconds(text: str) -> int:
        assert text.endswith("s"), text
        return int(text[:-1])

    plugin = config["pluginConfig"]
    assert seconds(rule["timeout"]) <= seconds(plugin["timeout"]) < seconds(plugin["invoke_interval"])


def run_rule(host: SimHost, monkeypatch: pytest.MonkeyPatch | None = None) -> int:
    """The plugin's command line as node-problem-detector runs it, on `host` instead of /host/sys."""
    [rule] = npd_config()["rules"]
    args = [str(host.root) if arg == "/host/sys" else arg for arg in rule["args"]]
    return CliRunner().invoke(main, args).exit_code


@pytest.fixture
def host(tmp_path: Path) -> SimHost:
    return SimHost.build(tmp_path / "sys", roce=2, infiniband=1, gid_table_size=16)


def test_checks_exit_codes_are_the_npd_plugin_contract(host: SimHost, monkeypatch: pytest.MonkeyPatch) -> None:
    assert NPD_STATUS.get(run_rule(host), "Unknown") == "OK"
    host.set_port_up("mlx5_2", False)  # a warning: not a node problem at --fail-on critical
    assert NPD_STATUS.get(run_rule(host), "Unknown") == "OK"
    host.ipv6_only("mlx5_0")  # NCCL's GID is link-local: critical
    assert NPD_STATUS.get(run_rule(host), "Unknown") == "NonOK"
    broken = CliRunner().invoke(main, ["check", "--path.sysfs", str(host.root / "missing"), "--no-netlink"])
    assert broken.exit_code == Exit.USAGE and NPD_STATUS.get(broken.exit_code, "Unknown") == "Unknown"


def test_a_crash_in_check_is_unknown_not_a_node_problem(host: SimHost, monkeypatch: pytest.MonkeyPatch) -> None:
    """Python exits 1 on an uncaught exception: read as NonOK (NPD) or a critical (Slurm), a bug in
    check would mark every node sick."""

    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(check_module, "run_check", crash)
    result = CliRunner().invoke(main, ["check", "--path.sysfs", str(host.root), "--no-netlink", "--state.dir", ""])
    assert result.exit_code == Exit.USAGE, result.output
    assert "check could not judge the node: RuntimeError: a bug" in result.stderr


def test_daemonset_pods_carry_scrape_annotations_for_prometheus_without_the_operator() -> None:
    daemonset = yaml.safe_load(DAEMONSET.read_text())
    template = daemonset["spec"]["template"]
    annotations = template["metadata"]["annotations"]
    [port] = template["spec"]["containers"][0]["ports"]
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(port["containerPort"]),
        "prometheus.io/path": "/metrics",
    }
