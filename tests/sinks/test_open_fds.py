"""`process_open_fds` from one stat of /proc/self/fd (Linux 6.2+), the rest as prometheus-client has it."""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, ProcessCollector

from rnic_exporter.sinks.process import OpenFdsCollector


def _values(collector: ProcessCollector) -> dict[str, float]:
    return {m.name: m.samples[0].value for m in collector.collect()}


def test_the_same_families_and_the_same_count_without_a_listing() -> None:
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(200)]
    try:
        theirs = _values(ProcessCollector(registry=CollectorRegistry()))
        ours = _values(OpenFdsCollector(registry=CollectorRegistry()))
    finally:
        for fd in held:
            os.close(fd)
    assert sorted(ours) == sorted(theirs)
    assert abs(ours["process_open_fds"] - theirs["process_open_fds"]) <= 1  # the listing holds one itself
    assert ours["process_max_fds"] == theirs["process_max_fds"]
    assert ours["process_start_time_seconds"] == theirs["process_start_time_seconds"]
