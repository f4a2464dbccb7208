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
    open_now = len(os.listdir("/proc/self/fd")) - 1  # less listdir's own
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + spare, hard))
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
