"""Agents and sinks for tests, fed as `daemon/serve.py` feeds them: collaborators stood in for
without netlink, a Prometheus sink published to and fed counter passes the agent's way."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping

from rnic_exporter.detect.conditions import AddressLike
from rnic_exporter.model.host import Snapshot
from rnic_exporter.sinks.prometheus import CounterView, PrometheusSink
from rnic_exporter.sinks.samples import ExporterStats, Family, Published
from rnic_exporter.sources.reader import HostReader, run_here


class Announcements:
    """An `agent.Announcer` whose verdict the test sets: `trust` True trusts every device's
    announcements (a healthy netlink), False none; `addresses` None is netlink off."""

    def __init__(
        self, trusted: bool | Collection[str] = False, addresses: Mapping[str, tuple[AddressLike, ...]] | None = None
    ) -> None:
        self.trust = trusted
        self._addresses = addresses

    def addresses(self) -> Mapping[str, tuple[AddressLike, ...]] | None:
        return self._addresses

    def trusted(self, rnic_netdevs: Mapping[str, str], devices: Callable[[], Iterable[str]]) -> bool | Collection[str]:
        return self.trust


def publish(sink: PrometheusSink, snap: Snapshot, stats: ExporterStats, extra: Iterable[Family] = ()) -> None:
    """Hand `sink` a poll's record the way the agent does (no events)."""
    sink.publish(Published(snap, (), stats, tuple(extra)))


class ReaderCounters:
    """A `CounterFeed` over a reader on the calling thread: each call is one counter pass, as the
    agent's `counter_view` runs on its counter threads. `stats` is what the view says of the exporter."""

    def __init__(self, reader: HostReader, stats: ExporterStats | None = None) -> None:
        self.reader = reader
        self.stats = stats or ExporterStats()
        self.passes = 0
        self.due = True  # the next call reads; else it hands back the last pass (the agent reuses a young one)

    def __call__(self, wait_s: float | None) -> CounterView:
        if self.due:
            run_here(self.reader.counter_jobs())
            self.passes += 1
            self.due = False
        groups = {
            (device, group.kind, group.port): group
            for device, plan in self.reader.counter_plans()
            if plan is not None
            for group in plan.groups
        }
        return CounterView(groups, self.stats, self.passes)


class CarriedCounters:
    """A `CounterFeed` for records whose snapshot carries its counters itself (a one-shot
    `HostReader.read`) or that have no device: each pass hands back no groups, as the agent's
    `counter_view` does on a host without RDMA devices, and `stats` as the exporter's own."""

    def __init__(self, stats: ExporterStats | None = None) -> None:
        self.stats = stats or ExporterStats()

    def __call__(self, wait_s: float | None) -> CounterView:
        return CounterView({}, self.stats, 0)


class FedSink:
    """A PrometheusSink fed as the agent feeds it: each `publish` a poll's record, each scrape a
    counter pass over the same reader."""

    def __init__(self, reader: HostReader) -> None:
        self.counters = ReaderCounters(reader)
        self.sink = PrometheusSink(self.counters)

    def publish(self, snap: Snapshot, stats: ExporterStats, extra: Iterable[Family] = ()) -> None:
        self.counters.stats, self.counters.due = stats, True
        publish(self.sink, snap, stats, extra)

    def render(self, accept: str | None, encoding: str | None) -> tuple[bytes, dict[str, str]]:
        return self.sink.render(accept, encoding)
