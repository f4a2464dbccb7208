"""The in-VM driver: runs every selected scenario of one boot, in one Python process.

    python -m tests.kernel.driver --out DIR --deadline SECONDS NAME...

Writes `DIR/<name>/result.json` (what `run(lab)` returned, or {"error": traceback}) and appends
progress events to `DIR/progress.jsonl` (the host watches them to enforce its deadlines and to
report the boot, import and per-scenario times). Each scenario gets SIGALRM at its deadline.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import Any

PROGRESS = "progress.jsonl"


class ScenarioTimeoutError(Exception):
    pass


def _progress(out: Path, event: str, **fields: Any) -> None:
    with open("/proc/uptime") as f:
        up = float(f.read().split()[0])
    record = {"event": event, "uptime": up, "wall": time.time(), **fields}
    with open(out / PROGRESS, "a") as f:
        f.write(json.dumps(record) + "\n")


def _alarm(_signum: int, _frame: FrameType | None) -> None:
    raise ScenarioTimeoutError("scenario deadline reached")


def _own_machine(state_dir: Path) -> None:
    """The guest shares the host's root file system read-only, and inherits its environment: give
    it what a freshly installed host has. The daemon's default state directory is the host's
    /var/lib/rnic-exporter there (an inventory of some other machine's NICs made a healthy rxe host
    fail `check` with 16 'not present'), so every command's goes to a directory of the scenario's; and no
    variable of the developer's shell (NCCL_*, RNIC_EXPORTER_*) reaches the CLI."""
    for name in [n for n in os.environ if n.startswith(("NCCL_", "RNIC_EXPORTER_"))]:
        del os.environ[name]
    state_dir.mkdir(parents=True, exist_ok=True)
    for command in ("SERVE", "CHECK"):
        os.environ[f"RNIC_EXPORTER_{command}_STATE_DIR"] = str(state_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--deadline", type=float, default=300.0)
    parser.add_argument("names", nargs="*")
    args = parser.parse_args(argv)
    out: Path = args.out
    start = time.monotonic()
    # The expensive part of a lab run under emulation: click, the CLI and the package, once per boot.
    from tests.kernel.lab import Lab, call_cli

    import_s = time.monotonic() - start
    start = time.monotonic()
    importlib.import_module("rnic_exporter.cli")
    cli_import_s = time.monotonic() - start
    warm = call_cli(("--version",))
    _progress(
        out,
        "driver_ready",
        import_s=round(import_s, 3),
        cli_import_s=round(cli_import_s, 3),
        version=warm.stdout.strip(),
        first_cli_s=round(warm.seconds, 3),
        python=sys.version,
    )
    signal.signal(signal.SIGALRM, _alarm)
    failures = 0
    for name in args.names:
        sdir = out / name
        sdir.mkdir(parents=True, exist_ok=True)
        lab = Lab(out=sdir)
        _own_machine(sdir / "default-state")  # each scenario a fresh install's empty inventory
        _progress(out, "scenario_start", name=name, deadline=args.deadline)
        t0 = time.monotonic()
        result: Any
        try:
            signal.setitimer(signal.ITIMER_REAL, args.deadline)
            lab.reset()
            module = importlib.import_module(f"tests.kernel.scenarios.{name}")
            result = module.run(lab)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            result = {"error": traceback.format_exc()}
            failures += 1
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        seconds = time.monotonic() - t0
        try:
            cleaned = lab.reset()
        except Exception:
            cleaned = ["reset failed: " + traceback.format_exc()]
        (sdir / "result.json").write_text(json.dumps(result, indent=1, sort_keys=True, default=str))
        _progress(
            out,
            "scenario_end",
            name=name,
            seconds=round(seconds, 3),
            error=isinstance(result, dict) and "error" in result,
            cleaned=cleaned,
        )
    _progress(out, "driver_done", failures=failures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
