"""The floor of a scrape in this runtime: a bare Python HTTP server that, for each scrape, reads
every counter file ours reads, writes a line per counter and gzips the page, and nothing else.
`bench/bench.py` scrapes it beside ours and node_exporter, in the same window and alike (keep-alive,
OpenMetrics first, gzip), so ours less it is what our code adds to what a scrape must cost.

    .venv/bin/python bench/scrape_floor.py SYSFS --port PORT

Each scrape `pread`s every file of the reader's counter plans (what our counter passes read, taken
from `HostReader`) over descriptors held from the start (a plain sysfs read each, as ours makes on
a tree with no RDMA netlink behind it), formats one series line per file, compresses the page at
our gzip level (`sinks/prometheus.GZIP_LEVEL`) and answers on one thread. It serves no state
series (GID tables, links, netdevs, detection), no exporter self-metrics and no OpenMetrics
negotiation: its page is a fraction of ours, so the floor is a lower bound.
"""

from __future__ import annotations

import argparse
import gzip
import http.server
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rnic_exporter.sinks.prometheus import GZIP_LEVEL
from rnic_exporter.sources.reader import HostReader
from rnic_exporter.sources.sysfs import SysfsRoot


def counter_files(sysfs: Path) -> list[tuple[str, Path]]:
    """(the series' labels, its file) for every file of every device's counter plan: what the
    reader's counter passes read, taken from the reader itself."""
    reader = HostReader(SysfsRoot(sysfs))
    reader.state_pass()
    out = []
    for device, plan in reader.counter_plans():
        if plan is None:
            continue
        for i, rel in enumerate(plan.rels):
            port, name = plan.slot_label(i)
            out.append((f'device="{device}",port="{port or ""}",counter="{name}"', sysfs / rel))
    reader.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sysfs", type=Path)
    parser.add_argument("--port", type=int, required=True)
    opts = parser.parse_args()
    files = counter_files(opts.sysfs)
    prefixes = [f"rnic_counter{{{labels}}} " for labels, _ in files]
    fds = [os.open(path, os.O_RDONLY | os.O_CLOEXEC) for _, path in files]

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as Prometheus scrapes

        def do_GET(self) -> None:
            lines = ["# TYPE rnic_counter counter\n"]
            for prefix, fd in zip(prefixes, fds, strict=True):
                raw = os.pread(fd, 64, 0).strip()
                lines.append(prefix + (raw.decode() if raw.isdigit() else "NaN") + "\n")
            body = "".join(lines).encode()
            gz = "gzip" in self.headers.get("Accept-Encoding", "")
            if gz:
                body = gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            if gz:
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", opts.port), Handler)
    while True:
        server.handle_request()  # blocks until a connection comes: no timer of its own


if __name__ == "__main__":
    main()
