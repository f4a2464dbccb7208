"""The floor of an idle daemon in this runtime: a bare Python process that keeps the idle daemon's
timers and reads, and nothing else. `bench/bench.py` runs it beside the idle daemon, in the same
window, so the difference between the two is what our code adds to what the budgets cost.

    .venv/bin/python bench/wake_floor.py SYSFS [--poll 5] [--pcie 30]

What it does is what the detection budgets make the idle daemon do (docs/detection.md): every
`--poll` s, only where an InfiniBand port exists (nothing announces its state), list
`class/infiniband` and `pread` each InfiniBand port's `state`, `phys_state` and `rate` over held
descriptors, comparing the bytes with the last read; every `--pcie` s the same for each RNIC's PCIe
link (`current_link_speed`, `current_link_width`) and AER counts, on one thread, woken by a
timed wait as the daemon's loop is. No detection, no hand-off to a reader thread, no sinks: what
the daemon adds on top (safety sweeps, the wire's minute, link health) is not here either.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rnic_exporter.sources.infiniband import PORT_WATCHED
from rnic_exporter.sources.pci import AER_POLLED, LINK_WATCHED

# The files the daemon's port and PCIe tiers watch (sources/watch_tiers.py), taken from the reader.
PORT_FILES = tuple(a.file for a in PORT_WATCHED)
PCIE_FILES = tuple(a.file for a in (*LINK_WATCHED, *AER_POLLED))


def held(paths: list[Path]) -> list[int]:
    return [os.open(p, os.O_RDONLY | os.O_CLOEXEC) for p in paths if p.exists()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sysfs", type=Path)
    parser.add_argument("--poll", type=float, default=5.0)
    parser.add_argument("--pcie", type=float, default=30.0)
    opts = parser.parse_args()
    devices = opts.sysfs / "class" / "infiniband"
    ports: list[Path] = []
    pcie: list[Path] = []
    for dev in sorted(devices.iterdir()):
        for port in sorted((dev / "ports").iterdir()):
            if (port / "link_layer").read_text().strip() == "InfiniBand":
                ports += [port / name for name in PORT_FILES]
        pcie += [dev / "device" / name for name in PCIE_FILES]
    port_fds, pcie_fds = held(ports), held(pcie)
    last: dict[str, list[bytes]] = {}
    stop = threading.Event()
    now = time.monotonic()
    next_port = now + opts.poll if port_fds else float("inf")
    next_pcie = now + opts.pcie
    while not stop.wait(max(0.0, min(next_port, next_pcie) - time.monotonic())):
        now = time.monotonic()
        due = []
        if now >= next_port:
            os.listdir(devices)
            due.append(("port", port_fds))
            next_port += opts.poll
        if now >= next_pcie:
            due.append(("pcie", pcie_fds))
            next_pcie += opts.pcie
        for kind, fds in due:
            data = [os.pread(fd, 4096, 0) for fd in fds]
            if data != last.get(kind):  # the daemon's test of a quiet pass: the bytes as last read
                last[kind] = data


if __name__ == "__main__":
    main()
