"""The benchmarks' per-thread figures (tests/support/threads.py) on a real serve process: the
daemon's threads carry their Python names to the OS, and the CPU each runs is read by name."""

from __future__ import annotations

import os
import time
from pathlib import Path

from rnic_exporter.daemon.agent import COUNTER_PASS_REUSE_S
from rnic_exporter.sim import SimHost
from tests.support.processes import free_port
from tests.support.serve import get, python_serve_args, running
from tests.support.threads import MAIN_THREAD, per_thread_ms, thread_cpu_ns, with_thread_names
from tests.support.wait import wait_for


def test_a_serving_daemons_cpu_is_read_by_thread_name(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=1, infiniband=1, gid_table_size=8)
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    args = python_serve_args(host.root, port, "--no-watch.netlink", "--no-watch.udev", state_dir=tmp_path / "state")
    with running(args, url, env=with_thread_names(os.environ)) as proc:
        ready_at = time.monotonic()  # `running` scraped once: its counter pass is reused for a second
        before = thread_cpu_ns(proc.pid)
        names = {name for name, _ in before.values()}
        # The loop, the state reads' worker (the first poll ran on it) and the web server's threads.
        assert {MAIN_THREAD, "state-reads", "rnic-web-io"} <= names, names
        wait_for(lambda: time.monotonic() > ready_at + COUNTER_PASS_REUSE_S, timeout=5, what="a pass not reused")
        get(url)  # a scrape: a counter pass on the counter reads' worker, an answer on a web worker

        def counted() -> dict[int, tuple[str, int]] | None:
            now = thread_cpu_ns(proc.pid)
            return now if "counters-reads" in {name for name, _ in now.values()} else None

        after = wait_for(counted, timeout=10, what="the counter reads' worker")
    ms = per_thread_ms(before, after, 1.0)
    answered = sum(v for name, v in ms.items() if name.startswith("rnic-web-") and name != "rnic-web-io")
    assert ms["counters-reads"] > 0 and answered > 0, ms
    assert all(v >= 0 for v in ms.values()), ms
