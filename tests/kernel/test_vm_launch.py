"""The lab's VM launch (tests/kernel/vm.py `_launch`), with a stand-in launcher: no VM, runs in the
unit suite. A launcher that exits before the guest's first word is launched once more; a guest that
came up and then failed is a result, never launched again.

Not kernel-marked on purpose: it needs no kernel, only a process that behaves like vng.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tests.kernel import vm

# The stand-in: each launch takes the next behaviour from `plan`, counts itself in `launches`.
LAUNCHER = r"""
import json, pathlib, sys, time
out, plan = pathlib.Path(sys.argv[1]), sys.argv[2].split(",")
count = out / "launches"
n = int(count.read_text()) if count.exists() else 0
count.write_text(str(n + 1))
step = plan[min(n, len(plan) - 1)]
print(f"launch {n + 1}: {step}", flush=True)
def say(event):
    with open(out / "progress.jsonl", "a") as f:
        f.write(json.dumps({"event": event, "uptime": 1.0, "wall": time.time()}) + "\n")
if step == "unborn":
    sys.exit(255)
say("guest_up")
if step == "up-then-dies":
    sys.exit(1)
say("driver_ready")
say("driver_done")
"""


def launch(tmp_path: Path, plan: str) -> tuple[vm.RunReport, int]:
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    out = tmp_path / "out"
    out.mkdir()
    report = vm.RunReport(out, "tcg", [])
    argv = [sys.executable, str(script), str(out), plan]
    vm._launch(report, argv, 30.0, 30.0, 60.0, time.monotonic(), False)
    return report, int((out / "launches").read_text())


def test_a_launcher_that_dies_before_the_guest_speaks_is_launched_once_more(tmp_path: Path) -> None:
    report, launches = launch(tmp_path, "unborn,done")
    assert launches == 2
    assert report.failure is None
    assert report.figures["vm_launches"] == 2
    assert any("launch 1: the VM exited (255)" in line for line in report.log), report.log
    # The first launch's console is kept beside the second's.
    assert (report.outdir / "console-launch-1.log").read_text() == "launch 1: unborn\n"
    assert (report.outdir / "console.log").read_text() == "launch 2: done\n"


def test_a_launcher_that_dies_twice_fails_with_its_reason(tmp_path: Path) -> None:
    report, launches = launch(tmp_path, "unborn,unborn,done")
    assert launches == vm.LAUNCH_ATTEMPTS == 2
    assert report.failure is not None and report.failure.startswith("the VM exited (255)")


def test_a_guest_that_came_up_and_died_is_a_result_not_launched_again(tmp_path: Path) -> None:
    report, launches = launch(tmp_path, "up-then-dies,done")
    assert launches == 1
    assert report.failure is not None and report.failure.startswith("the VM exited (1)")
    assert "vm_launches" not in report.figures
    events = [json.loads(line)["event"] for line in (report.outdir / "progress.jsonl").read_text().splitlines()]
    assert events == ["guest_up"]


def test_a_healthy_launch_is_launched_once(tmp_path: Path) -> None:
    report, launches = launch(tmp_path, "done")
    assert launches == 1
    assert report.failure is None
