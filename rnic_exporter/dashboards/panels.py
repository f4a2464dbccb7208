"""Panel, variable and annotation builders shared by the dashboards.

Every panel, target, variable and annotation takes its data source from the `$datasource` variable,
so the JSON works both when imported in the UI and when provisioned from files (Grafana resolves
`${DS_...}` inputs only on UI import). Metric names come from `rnic_exporter.catalog.metrics`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from grafanalib.core import (
    Annotations,
    Dashboard,
    GridPos,
    RowPanel,
    Stat,
    StateTimeline,
    Table,
    Target,
    Templating,
    Time,
    TimeSeries,
)

from rnic_exporter.catalog.metrics import MetricSpec

DATASOURCE: Mapping[str, str] = {"type": "prometheus", "uid": "${datasource}"}
GRID_WIDTH = 24
# Grafana's default of 100 points draws a day-long range with 15-minute steps; flaps vanish in that.
MAX_DATA_POINTS = 1000

Json = dict[str, Any]

# Threshold steps: the base step has value None (Grafana's "base"); grafanalib's Threshold would
# write the string "null" there.
OK_BAD: list[Json] = [{"color": "green", "value": None}, {"color": "red", "value": 1}]
OK_WARN: list[Json] = [{"color": "green", "value": None}, {"color": "orange", "value": 1}]
NEUTRAL: list[Json] = [{"color": "text", "value": None}]
BAD_OK: list[Json] = [{"color": "red", "value": None}, {"color": "green", "value": 1}]
UP_DOWN_MAPPINGS: list[Json] = [
    {
        "type": "value",
        "options": {
            "0": {"text": "down", "color": "red", "index": 0},
            "1": {"text": "up", "color": "green", "index": 1},
        },
    }
]
PRESENT_MISSING_MAPPINGS: list[Json] = [
    {
        "type": "value",
        "options": {
            "0": {"text": "missing", "color": "red", "index": 0},
            "1": {"text": "present", "color": "green", "index": 1},
        },
    }
]
YES_NO_MAPPINGS: list[Json] = [
    {
        "type": "value",
        "options": {
            "0": {"text": "no", "color": "green", "index": 0},
            "1": {"text": "yes", "color": "red", "index": 1},
        },
    }
]


def name(spec: MetricSpec) -> str:
    return spec.name


def dashboard(
    title: str,
    uid: str,
    description: str,
    *,
    time_from: str,
    refresh: str,
    include_vars: bool,
    variables: list[Json],
    panels: list[Any],
    annotations: list[Json] | None = None,
) -> Dashboard:
    """A dashboard tagged `rnic`, with a dropdown of the other `rnic` dashboards."""
    return Dashboard(
        title=title,
        uid=uid,
        tags=["rnic", "rdma"],
        timezone="browser",
        schemaVersion=39,
        description=description,
        time=Time(time_from, "now"),
        refresh=refresh,
        graphTooltip=1,
        editable=True,
        links=[
            {
                "title": "RNIC dashboards",
                "type": "dashboards",
                "tags": ["rnic"],
                "asDropdown": False,
                "includeVars": include_vars,
                "keepTime": True,
                "targetBlank": False,
                "icon": "external link",
            }
        ],
        annotations=Annotations(list=annotations or []),
        templating=Templating(list=variables),
        panels=panels,
    ).auto_panel_ids()


def target(expr: str, legend: str = "", ref: str = "A", *, instant: bool = False, table: bool = False) -> Target:
    # intervalFactor=1: grafanalib's default of 2 halves the resolution of every query.
    return Target(
        expr=expr,
        legendFormat=legend,
        refId=ref,
        instant=instant,
        intervalFactor=1,
        format="table" if table else "time_series",
        datasource=dict(DATASOURCE),
    )


def targets(*queries: tuple[str, str]) -> list[Target]:
    """(expr, legend) pairs as targets A, B, C..."""
    return [target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(queries)]


class Layout:
    """Places panels left to right on Grafana's 24-column grid, wrapping to a new line when full."""

    def __init__(self) -> None:
        self.panels: list[Any] = []
        self._x = 0
        self._y = 0
        self._line_height = 0

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(RowPanel(title=title, gridPos=GridPos(h=1, w=GRID_WIDTH, x=0, y=self._y)))
        self._y += 1

    def add(self, panel: Any, w: int, h: int) -> None:
        if self._x + w > GRID_WIDTH:
            self._newline()
        panel.gridPos = GridPos(h=h, w=w, x=self._x, y=self._y)
        self.panels.append(panel)
        self._x += w
        self._line_height = max(self._line_height, h)

    def _newline(self) -> None:
        self._y += self._line_height
        self._x = 0
        self._line_height = 0


def timeseries(
    title: str,
    description: str,
    queries: Sequence[Target],
    unit: str,
    *,
    thresholds: list[Json] | None = None,
    step: bool = False,
    min_zero: bool = True,
) -> TimeSeries:
    return TimeSeries(
        title=title,
        description=description,
        dataSource=dict(DATASOURCE),
        targets=list(queries),
        unit=unit,
        maxDataPoints=MAX_DATA_POINTS,
        thresholds=thresholds or NEUTRAL,
        legendDisplayMode="table",
        legendPlacement="bottom",
        legendCalcs=["lastNotNull", "max"],
        tooltipMode="multi",
        tooltipSort="desc",
        # Indices and states jump; interpolating between 3 and 5 would draw an index 4 that never was.
        lineInterpolation="stepAfter" if step else "linear",
        valueMin=0 if min_zero else None,
    )


def stat(
    title: str,
    description: str,
    queries: Sequence[Target],
    unit: str = "none",
    *,
    thresholds: list[Json] | None = None,
    mappings: list[Json] | None = None,
) -> Stat:
    for query in queries:
        query.instant = True  # a stat shows one value: evaluate it once, at the end of the range
    return Stat(
        title=title,
        description=description,
        dataSource=dict(DATASOURCE),
        targets=list(queries),
        format=unit,
        thresholds=thresholds or OK_BAD,
        color={"mode": "thresholds"},
        colorMode="background",
        graphMode="none",
        reduceCalc="lastNotNull",
        textMode="value_and_name",
        noValue="0",
        mappings=mappings or [],
        maxDataPoints=MAX_DATA_POINTS,
    )


def table(
    title: str,
    description: str,
    queries: Sequence[Target],
    *,
    hide: Sequence[str] = (),
    rename: Mapping[str, str] | None = None,
    merge: bool = False,
    overrides: list[Json] | None = None,
) -> Table:
    transformations: list[Json] = []
    if merge:
        transformations.append({"id": "merge", "options": {}})
    transformations.append(
        {
            "id": "organize",
            "options": {
                "excludeByName": {column: True for column in ("Time", "__name__", "job", *hide)},
                "renameByName": dict(rename or {}),
                "indexByName": {},
            },
        }
    )
    return Table(
        title=title,
        description=description,
        dataSource=dict(DATASOURCE),
        targets=list(queries),
        transformations=transformations,
        filterable=True,
        overrides=overrides or [],
        maxDataPoints=MAX_DATA_POINTS,
    )


def state_timeline(
    title: str,
    description: str,
    queries: Sequence[Target],
    mappings: list[Json],
    *,
    thresholds: list[Json] | None = None,
) -> StateTimeline:
    return StateTimeline(
        title=title,
        description=description,
        dataSource=dict(DATASOURCE),
        targets=list(queries),
        mappings=mappings,
        thresholds=thresholds or OK_BAD,
        mergeValues=True,
        showValue="never",
        maxDataPoints=MAX_DATA_POINTS,
    )


def datasource_variable() -> Json:
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "includeAll": False,
        "multi": False,
        "options": [],
        "refresh": 1,
        "regex": "",
        "skipUrlSync": False,
    }


def query_variable(var: str, label: str, query: str, *, multi: bool, include_all: bool) -> Json:
    """A label_values variable, refreshed when the time range changes (NICs come and go)."""
    return {
        "name": var,
        "label": label,
        "type": "query",
        "datasource": dict(DATASOURCE),
        "definition": query,
        "query": {"query": query, "refId": f"{var}-variable"},
        "current": {},
        "hide": 0,
        "includeAll": include_all,
        "multi": multi,
        "allValue": ".*" if include_all else None,
        "options": [],
        "refresh": 2,
        "regex": "",
        "sort": 1,
        "skipUrlSync": False,
    }


def annotation(title: str, expr: str, color: str) -> Json:
    """Prometheus annotation: one mark per series and step where `expr` has a value."""
    return {
        "name": title,
        "datasource": dict(DATASOURCE),
        "enable": True,
        "hide": False,
        "iconColor": color,
        "expr": expr,
        "step": "1m",
        "titleFormat": "{{event}}",
        "textFormat": "{{device}} port {{port}}",
        "tagKeys": "event,device,port",
        "useValueForTime": False,
    }
