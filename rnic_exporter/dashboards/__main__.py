"""`python -m rnic_exporter.dashboards --out DIR`: write the dashboards' JSON into DIR."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rnic_exporter.dashboards import write


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m rnic_exporter.dashboards", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("dashboards"), help="output directory (default: %(default)s)")
    args = parser.parse_args()
    try:
        written = write(args.out)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "grafanalib":
            raise
        from rnic_exporter.errors import extra_hint

        print(f"grafanalib is missing: {extra_hint('dashboards')}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
