"""packaging/slurm/50-rnic-check.sh: safe to paste on a fleet. Only a critical finding (check exit 1)
fails the Prolog (Slurm drains the node); a config error pushed everywhere, a missing binary, a
crash or a hang logs loudly and lets the job run. Every log line carries time, host and job."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from rnic_exporter.commands import bundle

SCRIPT = bundle.bundle_root() / "packaging" / "slurm" / "50-rnic-check.sh"
LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ host=\S+ job=4242 .+$")


def fake_check(tmp_path: Path, body: str) -> Path:
    binary = tmp_path / "bin" / "rnic-exporter"
    binary.parent.mkdir(exist_ok=True)
    binary.write_text(f'#!/bin/sh\necho "args: $*"\n{body}\n')
    binary.chmod(0o755)
    return binary


def run(
    tmp_path: Path, binary: Path, timeout_s: str = "20", config: bool = True, **extra: str
) -> tuple[int, list[str]]:
    cfg = tmp_path / "config.toml"
    if config:
        cfg.write_text("")
    else:
        cfg.unlink(missing_ok=True)
    log = tmp_path / "rnic-check.log"
    env = {
        "PATH": os.environ["PATH"],
        "SLURM_JOB_ID": "4242",
        "RNIC_EXPORTER_BIN": str(binary),
        "RNIC_CHECK_CONFIG": str(cfg),
        "RNIC_CHECK_LOG": str(log),
        "RNIC_CHECK_TIMEOUT": timeout_s,
        "RNIC_CHECK_SCONTROL": str(tmp_path / "no-scontrol"),
        **extra,
    }
    proc = subprocess.run(["sh", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    lines = log.read_text().splitlines() if log.exists() else []
    assert lines and all(LINE.match(line) for line in lines), lines
    return proc.returncode, lines


def test_the_script_is_executable_and_calls_the_installed_binary() -> None:
    assert SCRIPT.stat().st_mode & stat.S_IXUSR
    assert "BIN=${RNIC_EXPORTER_BIN:-/opt/rnic-exporter/bin/rnic-exporter}" in SCRIPT.read_text()


@pytest.mark.parametrize(
    ("body", "code", "said"),
    [
        ("echo 'OK: 8 RDMA device(s)'; exit 0", 0, "node healthy"),
        ("echo '[CRITICAL] mlx5_0 port 1: address lost'; exit 1", 1, "critical RNIC problem"),
        ("echo 'rnic-exporter: error: config file x: bad' >&2; exit 2", 0, "node not checked, job allowed"),
        ("exit 3", 0, "check failed to run"),
    ],
)
def test_only_a_critical_finding_fails_the_prolog(tmp_path: Path, body: str, code: int, said: str) -> None:
    rc, lines = run(tmp_path, fake_check(tmp_path, body))
    assert rc == code and any(said in line for line in lines), lines
    assert any("args: check --fail-on critical --config" in line for line in lines), lines


def test_a_missing_binary_or_config_does_not_drain(tmp_path: Path) -> None:
    rc, lines = run(tmp_path, tmp_path / "nowhere" / "rnic-exporter")
    assert rc == 0 and "not found" in lines[-1]
    rc, lines = run(tmp_path, fake_check(tmp_path, "exit 0"), config=False)
    assert rc == 0 and not any("--config" in line for line in lines)


def test_a_hung_check_does_not_hold_or_drain_the_node(tmp_path: Path) -> None:
    rc, lines = run(tmp_path, fake_check(tmp_path, "exec sleep 30"), timeout_s="1")
    assert rc == 0 and "did not finish in 1s" in lines[-1], lines


def fake_scontrol(tmp_path: Path, rc: int = 0) -> Path:
    """Records its arguments, one per line, as scontrol would receive them."""
    binary = tmp_path / "bin" / "scontrol"
    binary.parent.mkdir(exist_ok=True)
    binary.write_text(
        f'#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > {tmp_path / "scontrol.args"}\nexit {rc}\n'
    )
    binary.chmod(0o755)
    return binary


CRITICAL = "[CRITICAL] mlx5_0 port 1 (ens1f0np0): expected address 10.0.0.1 is missing"


def test_a_drain_carries_checks_first_critical_problem_as_its_reason(tmp_path: Path) -> None:
    body = (
        f"echo 'PROBLEMS: 2 (2 critical)'; echo ''; echo '{CRITICAL}'; echo '[CRITICAL] mlx5_1 port 1: other'; exit 1"
    )
    scontrol = fake_scontrol(tmp_path)
    rc, lines = run(tmp_path, fake_check(tmp_path, body), RNIC_CHECK_SCONTROL=str(scontrol), SLURMD_NODENAME="gpu017")
    assert rc == 1
    args = (tmp_path / "scontrol.args").read_text().splitlines()
    assert args == ["update", "nodename=gpu017", "state=drain", f"reason=rnic-check: {CRITICAL}"]
    assert "node drained" in lines[-1] and CRITICAL in lines[-1]


def test_a_failed_scontrol_still_fails_the_prolog(tmp_path: Path) -> None:
    rc, lines = run(
        tmp_path,
        fake_check(tmp_path, f"echo '{CRITICAL}'; exit 1"),
        RNIC_CHECK_SCONTROL=str(fake_scontrol(tmp_path, 1)),
    )
    assert rc == 1 and "Prolog error" in lines[-1]


def test_no_drain_for_what_does_not_fail_the_prolog(tmp_path: Path) -> None:
    scontrol = fake_scontrol(tmp_path)
    for body in ("exit 0", "exit 2", "exit 3"):
        assert run(tmp_path, fake_check(tmp_path, body), RNIC_CHECK_SCONTROL=str(scontrol))[0] == 0
    assert not (tmp_path / "scontrol.args").exists()


def test_the_log_keeps_one_older_generation_past_its_cap(tmp_path: Path) -> None:
    log = tmp_path / "rnic-check.log"
    old = "2026-01-01T00:00:00Z host=x job=4242 old line\n" * 100
    log.write_text(old)
    rc, lines = run(tmp_path, fake_check(tmp_path, "exit 0"), RNIC_CHECK_LOG_MAX_BYTES=str(len(old)))
    assert rc == 0 and (tmp_path / "rnic-check.log.1").read_text() == old
    assert not any("old line" in line for line in lines) and "node healthy" in lines[-1]
    rc, lines = run(tmp_path, fake_check(tmp_path, "exit 0"), RNIC_CHECK_LOG_MAX_BYTES=str(len(old)))
    assert (tmp_path / "rnic-check.log.1").read_text() == old and len(lines) == 4  # under the cap: appended
