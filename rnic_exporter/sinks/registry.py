"""The exporter's own health families, in one list every sink collects from (client_python's
`CollectorRegistry`).

Whatever has health to show (the agent's own counters, the process, the HTTP front, the OTLP
exporter, the consumer scan) registers once at startup; each sink collects at its own pace, a scrape
or an export. So a scrape started by the web front reads the front's counters from here, not
through the daemon.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Protocol

from rnic_exporter.sinks.samples import ExporterStats, Family

FamilyProvider = Callable[[], Iterable[Family]]


class Reloads(Protocol):
    """A part with a config file of its own that it reloads (the web server's --web.config.file)."""

    @property
    def config_reload_ok(self) -> bool: ...


class SelfMetrics:
    """Providers of the exporter's own families, and of its config reload verdicts."""

    def __init__(self, *providers: FamilyProvider) -> None:
        self._lock = threading.Lock()  # registration at startup, collection on scrape threads
        self._providers: tuple[FamilyProvider, ...] = providers
        self._reloads: tuple[Reloads, ...] = ()

    def register(self, families: FamilyProvider, reloads: Reloads | None = None, *, first: bool = False) -> None:
        """`reloads`: the part whose own config file's last reload counts too (the web server).
        `first`: ahead of the providers so far (the agent's bookkeeping: an exposition lists it
        right after detection's families, before the process's)."""
        with self._lock:
            self._providers = (families, *self._providers) if first else (*self._providers, families)
            if reloads is not None:
                self._reloads += (reloads,)

    def collect(self) -> tuple[Family, ...]:
        return tuple(family for provider in self._providers for family in provider())

    def stats(self, stats: ExporterStats) -> ExporterStats:
        """`stats` with every registered reload verdict: one gauge says whether all files reloaded."""
        if not stats.config_reload_ok or all(part.config_reload_ok for part in self._reloads):
            return stats
        return replace(stats, config_reload_ok=False)
