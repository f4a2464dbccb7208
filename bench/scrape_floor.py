"""The floor of a scrape in this runtime: a bare Python HTTP server that, for each scrape, reads
every counter file of the tree, writes a line per counter and gzips the page, and nothing else.
`bench/bench.py` scrapes it beside ours and node_exporter, in the same window and alike (keep-alive,
OpenMetrics first, gzip), so ours less it is what our code adds to what a scrape must cost.

    .venv/bin/python bench/scrape_floor.py SYSFS --port PORT

Each scrape `pread`s every file under each device's `ports/*/counters/`, `ports/*/hw_counters/`
and `hw_counters/` over descriptors held from the start (a plain sysfs read each, as ours makes on
a tree with no RDMA netlink behind it), formats one series line per file, compresses the page at
gzip level 1 (ours does too) and answers on one thread. It serves no state series (GID tables,
links, netdevs, detection), no exporter self-metrics and no OpenMetrics negotiation: its page is
a fraction of ours, so the floor is a lower bound.
"""

from __future__ import annotations

import argparse
import gzip
import http.server
import os
from pathlib import Path

_GZIP_LEVEL = 1


def counter_files(sysfs: Path) -> list[tuple[str, Path]]:
    """(the series' labels, its file) for every counter file of every RDMA device of the tree."""
    out = []
    for dev in sorted((sysfs / "class" / "infiniband").iterdir()):
        groups = [("", dev / "hw_counters")]
        for port_dir in sorted((dev / "ports").iterdir()):
            groups += [(port_dir.name, port_dir / "counters"), (port_dir.name, port_dir / "hw_counters")]
        for number, folder in groups:
            if not folder.is_dir():
                continue
            for f in sorted(folder.iterdir()):
                if f.is_file() and f.name != "lifespan":
                    out.append((f'device="{dev.name}",port="{number}",counter="{f.name}"', f))
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
                body = gzip.compress(body, compresslevel=_GZIP_LEVEL, mtime=0)
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
