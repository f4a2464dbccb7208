"""The exporter's own health families, in one list every sink collects from (client_python's
`CollectorRegistry`).

Whatever has health to show (the process, the HTTP front, the OTLP exporter, the consumer scan)
registers once at startup; each sink collects at its own pace, a scrape or an export. So a scrape
started by the web front reads the front's counters from here, not through the daemon.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import replace

from rnic_exporter.sinks.samples import ExporterStats, Family

FamilyProvider = Callable[[], Iterable[Family]]


class SelfMetrics:
    """Providers of the exporter's own families, and of its config reload verdicts."""

    def __init__(self, *providers: FamilyProvider) -> None:
        self._lock = threading.Lock()  # registration at startup, collection on scrape threads
        self._providers: tuple[FamilyProvider, ...] = providers
        self._reload_checks: tuple[Callable[[], bool], ...] = ()

    def register(self, families: FamilyProvider, reload_ok: Callable[[], bool] | None = None) -> None:
        """`reload_ok`: whether the provider's own config file last reloaded (the web config)."""
        with self._lock:
            self._providers += (families,)
            if reload_ok is not None:
                self._reload_checks += (reload_ok,)

    def collect(self) -> tuple[Family, ...]:
        return tuple(family for provider in self._providers for family in provider())

    def stats(self, stats: ExporterStats) -> ExporterStats:
        """`stats` with every registered reload verdict: one gauge says whether all files reloaded."""
        if not stats.config_reload_ok or all(check() for check in self._reload_checks):
            return stats
        return replace(stats, config_reload_ok=False)
