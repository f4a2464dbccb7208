"""Which counter files are read at all: node_exporter-style collector filters.

`--[no-]collector.hw_counters` and `--collector.hw_counters.include` / `.exclude` (or the config
file's `[collector.hw_counters]` table) pick the driver counters of `hw_counters/` by name. The
regular expressions are anchored as node_exporter anchors its include/exclude filters
(`^(?:REGEX)$`): `np_cnp_sent` names that counter only, `np_.*` all of its family. A counter left
out is never read (it is dropped from the device's counter plan, `sources/counters.py`), so it costs
neither a firmware command nor a series. `counters/` (PMA PortCounters) are read whatever the filter
says: the traffic and error panels and the saturation gauge are built on them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rnic_exporter.errors import ConfigError

HW = "hw"  # CounterPlan's group kind for hw_counters/ (port and device alike)


@dataclass(frozen=True, slots=True)
class CounterFilter:
    hw_counters: bool = True  # --[no-]collector.hw_counters
    hw_include: re.Pattern[str] | None = None
    hw_exclude: re.Pattern[str] | None = None

    @classmethod
    def build(
        cls, hw_counters: bool = True, hw_include: str | None = None, hw_exclude: str | None = None
    ) -> CounterFilter:
        return cls(
            hw_counters,
            anchored("--collector.hw_counters.include", hw_include),
            anchored("--collector.hw_counters.exclude", hw_exclude),
        )

    def wants(self, kind: str, name: str) -> bool:
        """Whether the counter file `name` of a `kind` group ("counters" or "hw") is read."""
        if kind != HW:
            return True
        if not self.hw_counters:
            return False
        if self.hw_include is not None and self.hw_include.fullmatch(name) is None:
            return False
        return self.hw_exclude is None or self.hw_exclude.fullmatch(name) is None

    @property
    def everything(self) -> bool:
        """Nothing is filtered (the default): the counter plan needs no predicate."""
        return self.hw_counters and self.hw_include is None and self.hw_exclude is None


def anchored(where: str, pattern: str | None) -> re.Pattern[str] | None:
    """`pattern` compiled for `fullmatch` (node_exporter's `^(?:...)$`); ConfigError naming `where`."""
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise ConfigError(f"{where} {pattern!r} is not a valid regular expression: {exc}") from None
