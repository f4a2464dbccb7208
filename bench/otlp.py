"""Benchmark: `rnic-exporter serve` with OTLP export on vs off, on a simulated 16-RNIC host. Prints figures.

    .venv/bin/python bench/otlp.py [--devices 16] [--seconds 20] [--poll-interval 0.5] [--otlp-interval 5]

Both runs poll the same tree at the same interval while one scraper reads /metrics every poll;
the OTLP run also exports to a local OTLP/HTTP sink that answers 200 to everything. Reports, per run:
CPU ms per poll (utime+stime of the daemon over the window / polls done), resident memory (VmRSS)
at the end, and for OTLP the metric exports received and their size. Needs the otel extra.
"""

from __future__ import annotations

import argparse
import http.server
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from harness import cpu_seconds, rss_mb  # noqa: E402

from rnic_exporter.sim import SimHost  # noqa: E402
from tests.support.processes import free_port  # noqa: E402
from tests.support.serve import get, polls, python_serve_args, running  # noqa: E402


class Sink:
    """Counts OTLP/HTTP requests and bytes; answers an empty 200 (a valid empty Export*ServiceResponse)."""

    def __init__(self) -> None:
        self.requests: dict[str, int] = {"/v1/metrics": 0, "/v1/logs": 0}
        self.bytes: dict[str, int] = {"/v1/metrics": 0, "/v1/logs": 0}
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length", "0"))
                self.rfile.read(size)
                sink.requests[self.path] = sink.requests.get(self.path, 0) + 1
                sink.bytes[self.path] = sink.bytes.get(self.path, 0) + size
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


# The sinks alone: the netlink/udev watchers and ethtool (pyroute2, ~10 MB) are measured by bench.py.
SINKS_ONLY = ["--no-watch.netlink", "--no-watch.udev", "--no-collector.ethtool"]


def measure(sysfs: Path, state: Path, seconds: float, interval: float, otlp: list[str]) -> tuple[float, float, int]:
    """(CPU ms per poll, RSS MB at the end, polls in the window)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    args = python_serve_args(sysfs, port, *SINKS_ONLY, "--log.level", "warn", *otlp, poll=interval, state_dir=state)
    with running(args, url) as proc:
        time.sleep(3 * interval)  # warm up: formats rendered once, fds held, first export done
        before_polls, before_cpu = polls(url), cpu_seconds(proc.pid)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            get(url)
            time.sleep(interval)  # paced: one scrape per poll
        cpu = cpu_seconds(proc.pid) - before_cpu
        done = polls(url) - before_polls
        return cpu * 1000 / done, rss_mb(proc.pid), done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=16)
    parser.add_argument("--gid-slots", type=int, default=255)
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each measurement window")
    parser.add_argument("--poll-interval", type=float, default=0.5)
    parser.add_argument("--otlp-interval", type=float, default=5.0, help="seconds between metric exports")
    opts = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="rnic-bench-otlp-") as tmp:
        work = Path(tmp)
        host = SimHost.build(work / "sys", roce=opts.devices, gid_table_size=opts.gid_slots)
        print(
            f"# simulated host: {opts.devices} RNICs, {opts.gid_slots}-slot GID tables; {os.cpu_count()} CPUs; "
            f"Python {sys.version.split()[0]}; poll every {opts.poll_interval}s, one scrape per poll, "
            f"{opts.seconds:g}s window"
        )
        off = measure(host.root, work / "state-off", opts.seconds, opts.poll_interval, [])
        sink = Sink()
        on = measure(
            host.root,
            work / "state-on",
            opts.seconds,
            opts.poll_interval,
            ["--otlp.endpoint", sink.url, "--otlp.interval", str(opts.otlp_interval)],
        )
        print(f"\n{'':>28}{'OTLP off':>12}{'OTLP on':>12}")
        print(f"{'CPU ms per poll':>28}{off[0]:>12.2f}{on[0]:>12.2f}")
        print(f"{'RSS MB':>28}{off[1]:>12.1f}{on[1]:>12.1f}")
        print(f"{'polls in window':>28}{off[2]:>12d}{on[2]:>12d}")
        exports = sink.requests["/v1/metrics"]
        size = sink.bytes["/v1/metrics"] / exports if exports else 0.0
        print(
            f"\nOTLP: {exports} metric exports every {opts.otlp_interval:g}s, {size / 1024:.1f} KiB each "
            f"(uncompressed protobuf); {sink.requests['/v1/logs']} log exports"
        )
        # The extra CPU is almost all in the export (SDK collection + protobuf encoding), not in the poll.
        per_export = (on[0] - off[0]) * opts.otlp_interval / opts.poll_interval
        print(
            f"extra CPU per metric export ~{per_export:.0f} ms; at the defaults (poll 5 s, export 60 s) "
            f"~{per_export / 60:.1f} ms of CPU per second"
        )


if __name__ == "__main__":
    main()
