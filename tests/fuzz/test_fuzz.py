"""Property-based fuzzing (issue 14): every parser, the model, both renderings, OTLP encoding, the
state loader and both config loaders give a value or a reason - nothing else escapes.

A bounded, derandomized run (the same examples every time, so CI is reproducible); the long run of
at least 10^5 examples per target is `bench/fuzz.py`.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from tests.support.fuzzing import Target, targets

BOUNDED = settings(
    max_examples=50, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)
TARGETS = targets()


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
def test_nothing_escapes(target: Target) -> None:
    @BOUNDED
    @given(target.strategy)
    def run(value: object) -> None:
        target.check(value)

    run()
