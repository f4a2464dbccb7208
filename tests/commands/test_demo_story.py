"""The demo's story holds together: its heal leaves a healthy host, every failure lasts long enough
for the alert it stands for to fire on a real Prometheus, and its hints run as printed."""

from __future__ import annotations

import logging
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rnic_exporter.catalog import events as ev
from rnic_exporter.commands import demo
from rnic_exporter.commands.check import run_check
from rnic_exporter.detect.settings import DetectionSettings
from rnic_exporter.sim import SimHost
from rnic_exporter.sources.address_risks import HostPaths
from rnic_exporter.sources.reader import ReaderSettings
from tests.support.agent import make_agent
from tests.support.processes import free_port
from tests.support.sim import refresh_overlay
from tests.support.wait import wait_for

REPO = Path(__file__).resolve().parents[2]
# The alert each step's failure stands for (the ones the demo's output names).
ALERTS = {
    "_gid_shift": ["RnicGidIndexMoved", "RnicGidTableChanged"],
    "_cable_going_bad": ["RnicLinkSymbolErrors", "RnicLinkRetrained", "RnicRoceRetransmissions"],
    "_optic_fade": ["RnicOpticRxPowerLow"],
    "_speed_drop": ["RnicLinkBelowRated", "RnicLinkFarBelowRated"],
    "_pcie_downtrain": ["RnicPcieLinkDowntrained"],
    "_nic_gone": ["RnicDeviceDisappeared"],
    "_ipv6_only": ["RnicNcclGidUnusable"],
}


def _seconds(duration: str) -> float:
    m = re.fullmatch(r"(\d+)([smh])", duration)
    assert m, duration
    return int(m[1]) * {"s": 1, "m": 60, "h": 3600}[m[2]]


def test_every_failure_outlasts_its_alerts_for(tmp_path: Path) -> None:
    rules = {
        r["alert"]: r
        for g in yaml.safe_load((REPO / "alerts/rnic-exporter.rules.yml").read_text())["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    steps = [s.act.__name__ for s in demo.STEPS]
    heal = steps.index("_heal")
    for step_seconds in (20.0, 1.0):  # the CLI's default, and the tests' fast demo
        for i, name in enumerate(steps[:heal]):
            lasts = sum(demo.wait_before(j, step_seconds) for j in range(i + 1, heal + 1))
            for alert in ALERTS[name]:
                needed = _seconds(rules[alert].get("for", "0s")) + 60  # a scrape and an evaluation
                assert lasts >= needed, (name, alert, lasts, needed)


def test_the_heal_leaves_a_host_check_calls_healthy(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=6, infiniband=2)
    state = tmp_path / "state"
    agent = make_agent(host, state)
    try:
        agent.poll_once(full_gid_tables=True)
        for _ in range(2):  # a second cycle: the steps can be played again
            for step in demo.STEPS:
                step.act(host)
                agent.poll_once(full_gid_tables=True)
    finally:
        agent.close()
    report = run_check(
        host.root,
        state,
        DetectionSettings(),
        ReaderSettings(),
        HostPaths(procfs=tmp_path / "proc", rootfs=tmp_path / "root"),
        use_netlink=False,
    )
    assert [p for p in report.problems if p.severity == "critical"] == [], report.problems


def test_the_check_hint_runs_as_printed(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=6, infiniband=2)
    # Prints the hint; run_demo fills in the real paths.
    next(s for s in demo.STEPS if s.act is demo._ipv6_only).act(host)
    hint = demo._HINTS["check"]
    assert "--state.dir" in hint and "--no-netlink" in hint
    command = hint.replace("<the tree above>", str(host.root)).replace("<its state>", str(tmp_path / "state"))
    argv = shlex.split(command)
    argv = [sys.executable, "-m", "rnic_exporter", *argv[1:]] if argv[0] == "rnic-exporter" else argv
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "nccl_gid_unusable" not in proc.stderr, proc.stderr
    assert "NCCL's auto-selection uses a link-local GID" in proc.stdout, proc.stdout


def test_after_the_heal_no_address_has_moved(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """ "Everything healed" must not be followed by a critical rnic.gid.address_moved: the only moves
    the story plays are the GID shifts it announces (mlx5_1), in every cycle."""
    host = SimHost.build(tmp_path / "sys", roce=6, infiniband=2)
    agent = make_agent(host, tmp_path / "state")
    moved: list[tuple[str, str]] = []
    try:
        agent.poll_once(full_gid_tables=True)
        for _ in range(2):
            for step in demo.STEPS:
                caplog.clear()
                with caplog.at_level(logging.INFO, logger="rnic_exporter.events"):
                    step.act(host)
                    refresh_overlay(agent.reader.root, host.errno_overlay)
                    agent.poll_once(full_gid_tables=True)
                    agent.poll_once(full_gid_tables=True)
                moved += [
                    (step.act.__name__, r.fields["device"])  # type: ignore[attr-defined]
                    for r in caplog.records
                    if getattr(r, "fields", {}).get("event") == ev.GID_ADDRESS_MOVED.name
                ]
    finally:
        agent.close()
    assert moved == [("_gid_shift", "mlx5_1")] * 2, moved


def test_sigterm_in_the_first_seconds_cleans_up_and_exits_0(tmp_path: Path) -> None:
    """systemd or a harness stopping the demo while it builds its tree: a normal stop, not 143 with
    the tree left in the temporary directory."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    argv = [sys.executable, "-m", "rnic_exporter", "demo", "--devices", "24", "--web.listen-address"]
    proc = subprocess.Popen(
        [*argv, f"127.0.0.1:{free_port()}"],
        env={**os.environ, "TMPDIR": str(tmp)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: any(tmp.iterdir()), timeout=60, what="the demo's tree", interval=0.005)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, (proc.returncode, out, err)
    assert list(tmp.iterdir()) == [] and "Removed " in out, out
