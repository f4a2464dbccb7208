"""The OpenTelemetry table of docs/opentelemetry.md, generated from the mapping in sinks/otel_metrics.py.

Regenerate the table with `python -m tests.support.otel_table`.
"""

from __future__ import annotations

from rnic_exporter.catalog import metrics as c
from rnic_exporter.sinks import otel_metrics as om


def attribute_note(mapping: om.MetricMapping, route: om.Route) -> str:
    parts = [f"`{k}={v}`" for k, v in route.constant]
    parts += [f"`{label}` as `{attr}`" for label, attr in route.rename]
    if route.hw_id:
        parts.append("`hw.id`")
    if route.only is not None:
        parts.append(f"{route.only[0]} in {', '.join(sorted(route.only[1]))}")
    elif len(mapping.routes) > 1:
        parts.append("the other counters")
    return "; ".join(parts)


def readme_table() -> str:
    """docs/opentelemetry.md's Prometheus -> OpenTelemetry table (tests/sinks/test_otel.py keeps the file equal)."""
    rows = [
        "| Prometheus | OpenTelemetry | instrument | unit | attributes besides the labels |",
        "|---|---|---|---|---|",
    ]
    for spec in c.METRICS:
        mapping = om.BY_SPEC.get(spec.name)
        if mapping is None:
            rows.append(f"| `{spec.name}` | not exported | | | {om.EXCLUDED[spec.name]} |")
            continue
        for route in mapping.routes:
            inst = route.instrument
            rows.append(
                f"| `{spec.name}` | `{inst.name}` | {inst.kind} | `{inst.unit}` | {attribute_note(mapping, route)} |"
            )
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(readme_table(), end="")
