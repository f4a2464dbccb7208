"""For the benchmarks only: each Python thread's name given to its OS thread, so the bench can say
where a daemon's CPU goes by thread (/proc/<pid>/task/<tid>/comm and schedstat).

`with_thread_names` (tests/support/threads.py) puts this directory first on the PYTHONPATH of the
rnic-exporters the bench runs, and Python imports `sitecustomize` at start-up. The name is set once,
as the thread starts (one prctl): nothing the daemon does afterwards changes. Python 3.14 names its
threads itself; the exporter does not.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable

_PR_SET_NAME = 15  # linux/prctl.h
_COMM_LEN = 15  # TASK_COMM_LEN less its NUL

_prctl: Callable[..., int] | None
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: nothing to name
    _prctl = None

_bootstrap_inner = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]


def _named_bootstrap_inner(self: threading.Thread) -> None:
    if _prctl is not None:
        _prctl(_PR_SET_NAME, self.name.encode(errors="replace")[:_COMM_LEN], 0, 0, 0)
    _bootstrap_inner(self)


threading.Thread._bootstrap_inner = _named_bootstrap_inner  # type: ignore[attr-defined]
