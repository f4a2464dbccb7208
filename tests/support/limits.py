"""Starving a watcher of file descriptors, and checking it complained once and recovered."""

from __future__ import annotations

import logging
import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


@contextmanager
def descriptors_exhausted(spare: int = 0) -> Iterator[None]:
    """Within the block this process can open only `spare` more descriptors (EMFILE after that)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # The limit caps descriptor *numbers*, and a new descriptor takes the lowest free number: with holes
    # below the highest open one (a pytest-xdist worker has some), a limit of "how many are open" still
    # leaves room. The limit is the number of the free slot after the `spare` lowest ones.
    listing = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY)
    try:
        held = {int(name) for name in os.listdir(listing)} - {listing}
    finally:
        os.close(listing)
    free = (n for n in range(soft + len(held) + spare + 1) if n not in held)
    limit = next(n for i, n in enumerate(free) if i == spare)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def assert_failed_once_then_recovered(caplog: pytest.LogCaptureFixture, failure_text: str) -> None:
    """One warning for a run of identical failures (EMFILE), and a 'recovered' line after it."""
    failures = [r for r in caplog.records if r.levelno == logging.WARNING and failure_text in r.getMessage()]
    assert len(failures) == 1, [r.getMessage() for r in failures]
    assert "Too many open files" in failures[0].getMessage()
    assert any("recovered" in r.getMessage() for r in caplog.records)
