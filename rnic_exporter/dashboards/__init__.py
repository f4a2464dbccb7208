"""Grafana dashboards for rnic-exporter, written with grafanalib and generated to JSON.

`python -m rnic_exporter.dashboards --out dashboards` regenerates the committed files; a test fails
when they differ from a fresh generation. Only this package imports grafanalib (the `dashboards`
extra), and only when a dashboard is generated: importing the package, or running `serve`, never
loads it.
"""

from __future__ import annotations

import json
from pathlib import Path

FILENAMES = ("rnic-fleet-overview.json", "rnic-host-detail.json")


def generate() -> dict[str, str]:
    """File name -> JSON text of every dashboard: sorted keys and a final newline, so it is byte-stable."""
    from grafanalib._gen import DashboardEncoder

    from rnic_exporter.dashboards import fleet, host

    out = {}
    for filename, dashboard in zip(FILENAMES, (fleet.build(), host.build()), strict=True):
        data = json.loads(json.dumps(dashboard.to_json_data(), cls=DashboardEncoder))
        out[filename] = json.dumps(data, indent=2, sort_keys=True) + "\n"
    return out


def write(out: Path) -> list[Path]:
    dashboards = generate()
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for filename, text in dashboards.items():
        path = out / filename
        path.write_text(text)
        written.append(path)
    return written
