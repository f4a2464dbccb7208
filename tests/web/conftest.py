"""The web front runs in the daemon's process, which `run()` tunes once (daemon/runtime.py): these tests
start the front alone, so they tune the test process the same way."""

from __future__ import annotations

import pytest

from rnic_exporter.daemon.runtime import tune_process


@pytest.fixture(autouse=True, scope="session")
def _daemon_process_tuning() -> None:
    tune_process()
