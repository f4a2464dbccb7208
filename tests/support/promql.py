"""The metric names a PromQL expression reads, so dashboards and rules can be checked against the catalogue.

Not a PromQL parser: it removes what cannot be a metric name (strings, label matchers, grouping label
lists, ranges, numbers, template variables) and keeps the identifiers that are not functions or
keywords. Prometheus itself checks the syntax (promtool, and a real server in the tests).
"""

from __future__ import annotations

import re

FUNCTIONS = frozenset(
    {
        "abs",
        "absent",
        "absent_over_time",
        "avg_over_time",
        "ceil",
        "changes",
        "clamp",
        "clamp_max",
        "clamp_min",
        "count_over_time",
        "day_of_month",
        "day_of_week",
        "day_of_year",
        "days_in_month",
        "delta",
        "deriv",
        "exp",
        "floor",
        "histogram_quantile",
        "holt_winters",
        "hour",
        "idelta",
        "increase",
        "irate",
        "label_join",
        "label_replace",
        "last_over_time",
        "ln",
        "log10",
        "log2",
        "max_over_time",
        "min_over_time",
        "minute",
        "month",
        "predict_linear",
        "present_over_time",
        "quantile_over_time",
        "rate",
        "resets",
        "round",
        "scalar",
        "sgn",
        "sort",
        "sort_desc",
        "sqrt",
        "stddev_over_time",
        "stdvar_over_time",
        "sum_over_time",
        "time",
        "timestamp",
        "vector",
        "year",
    }
)
AGGREGATIONS = frozenset(
    {
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
    }
)
KEYWORDS = frozenset(
    {
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "and",
        "or",
        "unless",
        "offset",
        "bool",
        "inf",
        "nan",
    }
)

_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NUMBER = re.compile(r"\b\d[\w.]*")
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """Every metric name `expr` selects, e.g. {'rnic_port_up'} for `sum by (device) (rnic_port_up == 0)`."""
    text = _VARIABLE.sub("x", expr)  # a variable stands in for a label value or a duration, never a metric
    text = _STRING.sub("", text)
    text = _MATCHERS.sub("", text)
    text = _RANGE.sub("", text)
    text = _LABEL_LIST.sub("", text)
    text = _NUMBER.sub("", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        word = match.group()
        if word in KEYWORDS:
            continue
        rest = text[match.end() :].lstrip()
        if rest.startswith("(") and (word in FUNCTIONS or word in AGGREGATIONS):
            continue
        names.add(word)
    return names
