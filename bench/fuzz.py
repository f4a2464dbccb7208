"""The long fuzz run (issue 14): at least 10^5 Hypothesis examples per target, escapes counted.

    .venv/bin/python bench/fuzz.py                    # 100,000 examples per target, random seed
    .venv/bin/python bench/fuzz.py --examples 2000 --seed 7 --only parsers,state
    .venv/bin/python bench/fuzz.py --seconds 600     # at most ten minutes per target

Targets and the invariant are in tests/support/fuzzing.py (the bounded run in tests/fuzz/test_fuzz.py
uses the same ones): every input gives a value or a reason it is unavailable; any other exception
is an escape. Escapes are counted, not raised, so one run covers every example; the first few of
each target are printed with their input. Exit status 1 when anything escaped.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import HealthCheck, Phase, given, seed, settings

from tests.support.fuzzing import Target, targets


class OutOfTimeError(Exception):
    """Raised by an example once the target's time budget is spent: ends the run, never counted."""


def run(
    target: Target, examples: int, at_seed: int, budget_s: float, every: int = 0
) -> tuple[int, Counter[str], list[str]]:
    ran = 0
    started = time.monotonic()
    escapes: Counter[str] = Counter()
    first: list[str] = []
    deadline = time.monotonic() + budget_s

    @seed(at_seed)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(target.strategy)
    def each(value: Any) -> None:
        nonlocal ran
        if time.monotonic() > deadline:
            raise OutOfTimeError
        ran += 1
        if every and ran % every == 0:  # a long run says how far it got, should it be stopped
            escaped, elapsed = sum(escapes.values()), time.monotonic() - started
            print(f"    {ran} examples, {escaped} escaped, {elapsed:.0f} s", flush=True)
        try:
            target.check(value)
        except Exception as exc:  # an escape: counted, never raised, so every example runs
            kind = f"{type(exc).__name__}: {str(exc)[:80]}"
            escapes[type(exc).__name__] += 1
            if len(first) < 3:
                first.append(f"{kind} <- {repr(value)[:160]}")

    with contextlib.suppress(OutOfTimeError):
        each()
    return ran, escapes, first


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=100_000, help="examples per target (default 100000)")
    parser.add_argument("--seed", type=int, default=int(time.time()), help="Hypothesis seed (default: the time)")
    parser.add_argument(
        "--seconds",
        type=float,
        default=float("inf"),
        help="time budget per target: stop earlier and print how many examples ran",
    )
    parser.add_argument("--progress", type=int, default=10_000, help="print a line every N examples (0: never)")
    parser.add_argument("--only", default="", help="comma-separated name prefixes of the targets to run")
    args = parser.parse_args()
    print(f"fuzz: {args.examples} examples per target, seed {args.seed}")
    print(f"{'target':40} {'examples':>9} {'escaped':>8} {'seconds':>8}")
    total = 0
    for target in targets():
        if not any(target.name.startswith(prefix) for prefix in args.only.split(",")):
            continue
        started = time.monotonic()
        ran, escapes, first = run(target, args.examples, args.seed, args.seconds, args.progress)
        escaped = sum(escapes.values())
        total += escaped
        print(f"{target.name:40} {ran:9d} {escaped:8d} {time.monotonic() - started:8.1f}", flush=True)
        for kind, count in escapes.most_common():
            print(f"    {count} x {kind}")
        for line in first:
            print(f"    e.g. {line}")
    print(f"escaped exceptions in all: {total}")
    return 1 if total else 0


if __name__ == "__main__":
    raise SystemExit(main())
