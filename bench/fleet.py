"""Fleet benchmark (not a test): load a fleet into a real Prometheus and time every fleet panel query.

    python bench/fleet.py                      # 1,000 hosts x 8 RNICs, 6 h at 15 s, every counter
    python bench/fleet.py --hours 1 --step 60  # what fits a loaded 2-core machine in minutes

Builds the fleet of tests/support/fleet.py (the incidents' faults and PCIe AER errors on a few hosts),
backfills it with `promtool tsdb create-blocks-from openmetrics`, evaluates the recording rules into
blocks with `promtool tsdb create-blocks-from rules`, starts Prometheus on both, and runs every target
of the fleet dashboard the way Grafana does over its default range (now-6h): instant queries for stat
and table panels, range queries at range/1000 (the dashboards' max data points) for time series. Prints each
query's best time of `--repeat` runs, the slowest, and what loading cost. Everything lives in a
temporary directory removed at the end; the OpenMetrics text is deleted as soon as promtool has read it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tempfile
import urllib.request

from rnic_exporter.dashboards import generate
from rnic_exporter.dashboards.panels import MAX_DATA_POINTS
from rnic_exporter.sim import SimHost
from tests.support.fleet import Fleet, loaded, query, query_range
from tests.support.processes import exporter, free_port
from tests.support.serve import serve_args
from tests.support.wait import wait_for

DASHBOARD_RANGE_S = 6 * 3600  # the fleet dashboard's time_from="now-6h"
BLOCK_S = 2 * 3600  # promtool parses the whole file once per 2 h block: keep a short fleet in one


def _targets() -> list[tuple[str, str, bool, float]]:
    """(where, expr, instant, minimum step in seconds) for every fleet panel target."""
    dashboard = json.loads(generate()["rnic-fleet-overview.json"])
    out = []
    units = {"s": 1, "m": 60, "h": 3600}
    for panel in dashboard["panels"]:
        for t in panel.get("targets", []):
            interval = t.get("interval") or "0s"
            min_step = float(interval[:-1]) * units[interval[-1]]
            out.append((f"{panel['title']} {t['refId']}", t["expr"], bool(t.get("instant")), min_step))
    return out


class _SettledScrape:
    """The scrape once every device's counters are in and the series count has held for `hold` seconds
    (detection adds its families after the first polls)."""

    def __init__(self, url: str, rnics: int, hold: float = 3.0) -> None:
        self.url, self.rnics, self.hold = url, rnics, hold
        self.since: tuple[float, int] | None = None

    def __call__(self) -> list[str] | None:
        text = urllib.request.urlopen(f"{self.url}/metrics", timeout=5).read().decode()
        lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
        if sum("rnic_port_data_received_bytes_total" in ln for ln in lines) != self.rnics:
            return None
        now = time.monotonic()
        if self.since is None or self.since[1] != len(lines):
            self.since = (now, len(lines))
        return lines if now - self.since[0] >= self.hold else None


def scrape_counts(rnics: int) -> None:
    """Series in one real scrape of `serve` over a simulated host of `rnics` RoCE RNICs, and of as many
    InfiniBand ones: per RNIC (series with a device label) and per node (the rest)."""
    for kind in ("RoCE", "InfiniBand"):
        with tempfile.TemporaryDirectory(prefix="rnic-scrape-") as tmp:
            root = Path(tmp)
            host = SimHost.build(
                root / "sys", roce=rnics if kind == "RoCE" else 0, infiniband=0 if kind == "RoCE" else rnics
            )
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            # --poll.interval 1 settles in seconds; the families are those of the default 5 s
            args = serve_args(host.root, port, poll=1, state_dir=root / "state")
            with exporter(args, ready_url=f"{url}/-/ready"):
                series = wait_for(_SettledScrape(url, rnics), timeout=60, what="a settled scrape", interval=0.5)
        per_rnic = sum('device="' in ln for ln in series)
        print(
            f"one scrape, {rnics} {kind} RNICs: {len(series)} series, {per_rnic / rnics:.1f} per RNIC, "
            f"{len(series) - per_rnic} per node",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--rnics", type=int, default=8)
    parser.add_argument("--hours", type=float, default=6.0)
    parser.add_argument("--step", type=int, default=15, help="seconds between samples (the scrape interval)")
    parser.add_argument("--few-counters", action="store_true", help="3 error and 2 retransmission counters only")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None, help="parent of the temporary directory")
    args = parser.parse_args()

    duration = int(args.hours * 3600)
    now = int(time.time())
    # The fleet ends at least 5 minutes ago; a fleet shorter than a block starts on a block boundary.
    start = (now - 300 - duration) // 60 * 60
    if duration <= BLOCK_S:
        start = (now - 300 - duration) // BLOCK_S * BLOCK_S
    fleet = Fleet(
        hosts=args.hosts,
        rnics=args.rnics,
        start=start,
        duration=duration,
        step=args.step,
        all_counters=not args.few_counters,
    )
    print(f"fleet: {args.hosts} hosts x {args.rnics} RNICs, {args.hours} h at {args.step} s", flush=True)
    print(f"load before: {Path('/proc/loadavg').read_text().split()[:3]}", flush=True)
    scrape_counts(args.rnics)
    began = time.monotonic()
    with loaded(fleet, timeout=6 * 3600, workdir=args.workdir) as (prom, t):
        print(
            f"samples {t.samples:,}; OpenMetrics {t.openmetrics_bytes / 1e9:.2f} GB written in {t.generate_s:.1f} s; "
            f"promtool openmetrics {t.promtool_openmetrics_s:.1f} s "
            f"({t.samples / t.promtool_openmetrics_s:,.0f} samples/s); "
            f"promtool rules {t.promtool_rules_s:.1f} s; Prometheus start {t.prometheus_start_s:.1f} s",
            flush=True,
        )
        raw = query(prom, 'count({__name__=~"rnic_.+|up"})', fleet.end)
        recorded = query(prom, 'count({__name__=~".+:.+:.+"})', fleet.end)
        print(f"series at the end: raw {raw[0]['value'][1]}, recorded {recorded[0]['value'][1]}")
        end = fleet.end
        range_s = DASHBOARD_RANGE_S
        timings: list[tuple[float, str, int]] = []
        for where, expr, instant, min_step in _targets():
            # Grafana's step: the range over the panel's max data points, at least the target's interval.
            step = max(args.step, range_s / MAX_DATA_POINTS, min_step)
            promql = expr.replace("$__range", f"{range_s}s").replace("$instance", ".*")
            best = float("inf")
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                result = query(prom, promql, end) if instant else query_range(prom, promql, end - range_s, end, step)
                best = min(best, time.perf_counter() - t0)
            timings.append((best, where, len(result)))
            kind = "instant" if instant else f"range step {step:g}s"
            print(f"{best * 1000:8.1f} ms  {len(result):5d} series  {kind:16s} {where}", flush=True)
        slowest = max(timings)
        print(f"slowest: {slowest[1]} {slowest[0] * 1000:.1f} ms (over {range_s // 3600} h, best of {args.repeat})")
    print(f"total {time.monotonic() - began:.0f} s; load after: {Path('/proc/loadavg').read_text().split()[:3]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
