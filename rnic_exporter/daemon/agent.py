"""The agent: owns time. Passes over sysfs state on its clock and publishes each change to its sinks.

Each poll is a state pass (`sources/reader.py`): when no device changed, it ends there, with no
detection and no rendering. A change runs detection and hands every sink the same frozen record
(`samples.Published`). Counters are read per consumer: a scrape or an OTLP export asks for a
counter pass (`counter_view`). Reads run on sacrificial threads (`sources/read_thread.py`), so a
hung read stalls only its own device, never the loop, the scrapes or a stop.

It is built from its parts (sinks, the consumer watch, netlink's announcer, the registry of the
exporter's own families) and nothing is set on it afterwards; `daemon/serve.py` builds it, serves
HTTP, and runs startup, the loop, signals and reload.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import Protocol

from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.catalog.events import Event
from rnic_exporter.config.serve import DEFAULT_LISTEN, DEFAULT_PORT, ServeConfig
from rnic_exporter.daemon.consumer_watch import ConsumerWatch
from rnic_exporter.detect.conditions import AddressLike
from rnic_exporter.detect.detector import Detector
from rnic_exporter.detect.inputs import Inputs, gather_inputs
from rnic_exporter.detect.state import StateStore
from rnic_exporter.errors import ConfigError
from rnic_exporter.model.host import AdvertisedLink, DeviceFreshness, ReadError, Snapshot
from rnic_exporter.sinks.consumer_fields import log_fields as consumer_log_fields
from rnic_exporter.sinks.detection import detection_families
from rnic_exporter.sinks.process import ProcessFamilies
from rnic_exporter.sinks.prometheus import CounterFeed, CounterView, PrometheusSink
from rnic_exporter.sinks.registry import SelfMetrics
from rnic_exporter.sinks.samples import ExporterStats, Family, Published, Sample
from rnic_exporter.sources.address_risks import address_loss_risks
from rnic_exporter.sources.availability import summarize
from rnic_exporter.sources.counters import CounterPlan
from rnic_exporter.sources.ethtool import EthtoolReader
from rnic_exporter.sources.read_thread import ReadRunner, SingleFlight
from rnic_exporter.sources.reader import HostReader, Job
from rnic_exporter.sources.sysfs import SysfsRoot

__all__ = ["DEFAULT_LISTEN", "DEFAULT_PORT", "Agent", "Announcer", "EventSink", "ServeConfig", "SinkFactory"]

log = logging.getLogger("rnic_exporter.agent")
event_log = logging.getLogger("rnic_exporter.events")
# A NIC event is news about the hardware, not a failure of the exporter: even a critical one logs at
# warning (its `severity=critical` field says how bad), so log alerting on level=error keeps meaning
# "the exporter is failing".
_EVENT_LEVEL = {"info": logging.INFO, "warning": logging.WARNING, "critical": logging.WARNING}
RISK_TTL_S = 60.0
WAKEUP_SOURCES = ("netlink", "udev")  # what can start a poll early (schedule.announce)
# A pass under this old is reused by the next consumer (concurrent scrapers, Prometheus HA pairs).
COUNTER_PASS_REUSE_S = 1.0
# With nothing changed, detection still runs this often: time-based judgements (flap windows,
# last-seen refreshes, risk re-reads) move without any byte moving.
DETECTION_REFRESH_S = 60.0


class EventSink(Protocol):
    """A consumer of every poll's record (OTLP). Must return quickly: queue, never block."""

    def publish(self, record: Published) -> None: ...

    def families(self) -> Iterable[Family]:
        """The sink's own health metrics for /metrics (export failures, drops)."""
        ...

    def close(self) -> None: ...


# A sink that reads counters for each export (OTLP): built on the agent's counter feed.
SinkFactory = Callable[[CounterFeed], EventSink]


class Announcer(Protocol):
    """What rtnetlink tells the agent besides wake-ups (`daemon/serve.py` wires the watcher)."""

    def addresses(self) -> Mapping[str, tuple[AddressLike, ...]] | None:
        """Each netdev's addresses, or None while nothing is known."""
        ...

    def trusted(self, rnic_netdevs: Mapping[str, str], devices: Callable[[], Iterable[str]]) -> bool | Collection[str]:
        """The RDMA devices whose announcements are trusted (True: all); the others are polled in full."""
        ...


def with_reads(
    devices: tuple[DeviceFreshness, ...], more: Mapping[str, Mapping[str, int]]
) -> tuple[DeviceFreshness, ...]:
    """Each device's read counts with another source's added (`rnic_exporter_reads_total`)."""
    if not more:
        return devices
    out = []
    for dev in devices:
        extra = more.get(dev.name)
        if not extra:
            out.append(dev)
            continue
        merged = dict(dev.reads)
        for kind, count in extra.items():
            merged[kind] = merged.get(kind, 0) + count
        out.append(replace(dev, reads=tuple(sorted(merged.items()))))
    return tuple(out)


class Agent:
    """Polls, keeps the last snapshot, and feeds the sinks. Usable without a loop in tests."""

    def __init__(
        self,
        config: ServeConfig,
        root: SysfsRoot | None = None,
        stop: threading.Event | None = None,
        *,
        sinks: Sequence[SinkFactory] = (),
        consumers: ConsumerWatch | None = None,
        announcer: Announcer | None = None,
        health: SelfMetrics | None = None,
        state_lock_unwritten: bool = False,
        annotate: Callable[[list[Event]], list[Event]] | None = None,
        more_reads: Callable[[], Mapping[str, Mapping[str, int]]] | None = None,
    ) -> None:
        """`root` rather than a built reader: the reader's settings are the config's, and a reload
        changes both. `sinks` are built on the agent's counter feed; `consumers` (--collector.consumers)
        names each event's users and is a sink too. `health` collects the exporter's own families for
        every sink; the agent adds its sinks' to it. `state_lock_unwritten`: the lock is held but its
        holder line could not be written (a full disk): counted as a state write error, not fatal."""
        self.config = config
        self.reader = HostReader(root or SysfsRoot(config.sysfs, hold_fds=True), config.reader)
        self.reader.safety_s = config.safety_interval_s
        self.reader.set_periods(pcie_s=config.pcie_interval_s, ib_gids_s=config.gid_interval_s)
        self.next_read_at: float | None = None  # (monotonic) the reader's next due read; None: every interval
        self.stop = stop or threading.Event()  # set: every wait on a read gives up
        self._state_runner = ReadRunner("state", config.read_deadline_s)
        self._counter_runner = ReadRunner("counters", config.read_deadline_s)
        self._counter_pass = SingleFlight(
            self._counter_runner, self._counter_jobs, COUNTER_PASS_REUSE_S, scope=self._counter_scope
        )
        self.health = health if health is not None else SelfMetrics(ProcessFamilies().families)
        self.prometheus = PrometheusSink(self.counter_view, config.counter_wait_s, self.health)
        self.consumers = consumers
        self._annotate = annotate  # adds what another source knows to each event (the wire's link-down reason)
        self._more_reads = more_reads  # reads another source made of each device, by kind (the wire's)
        self.sinks: tuple[EventSink, ...] = (
            *(build(self.counter_view) for build in sinks),
            *((consumers,) if consumers is not None else ()),
        )
        self.health.register(self.families, first=True)
        for sink in self.sinks:
            self.health.register(sink.families)
        self._announcer = announcer
        self.last: Snapshot | None = None
        self.last_poll: float | None = None  # wall clock: the loop's heartbeat, whatever a device does
        self.polls = 0
        self._stats_lock = threading.Lock()
        self.read_errors: Counter[str] = Counter()
        self._announced_empty = False
        self.config_reload_ok = True  # the config file's last reload (SIGHUP)
        self.detection_families: tuple[Family, ...] = ()  # the last detection's, shared by every sink
        self.detector = Detector(config.detection_settings, StateStore(config.state_dir))
        if state_lock_unwritten:
            self.detector.state_errors["unwritable"] += 1
        self.ethtool = EthtoolReader()
        self._advertised: dict[str, AdvertisedLink | None] = {}  # netdev -> best advertised mode, cached
        self._risk_cache: dict[tuple[str, int | None, bool], tuple[float, frozenset[str]]] = {}
        self.source_errors: Counter[str] = Counter()
        self.wakeups: Counter[str] = Counter(dict.fromkeys(WAKEUP_SOURCES, 0))  # 0 on a quiet host, not absent
        # netdev -> its RDMA device; read by watcher threads: replaced each poll, never mutated
        self.rnic_netdevs: Mapping[str, str] = MappingProxyType({})
        self._detected_at = float("-inf")
        # (device, port, attribute) already logged as failed, and as unsupported: each is said once
        self._state_logged: tuple[frozenset[tuple[str, int | None, str]], ...] = (frozenset(), frozenset())
        self._counters_logged: tuple[frozenset[tuple[str, int | None, str]], ...] = (frozenset(), frozenset())
        # Events judged off the loop (link health, `daemon/link_watch.py`), published by its next poll.
        self._handed: list[Event] = []
        self._handed_lock = threading.Lock()

    def poll_once(self, full_gid_tables: bool | Collection[str] = False, *, event: bool = False) -> Snapshot:
        """One state pass; detection and publishing only when something changed (or `event`: an
        announcement may have changed what detection sees besides sysfs)."""
        announcer = self._announcer
        trusted = False if announcer is None else announcer.trusted(self.rnic_netdevs, self.reader.device_names)
        result = self.reader.state_pass(full_gid_tables=full_gid_tables, trust_events=trusted, runner=self._run_state)
        self.next_read_at = self.reader.next_due()
        now = time.time()
        self.polls += 1
        self._count(result.read_errors)
        snap = result.snapshot
        with self._handed_lock:
            handed, self._handed = self._handed, []
        due = (
            result.changed
            or event
            or bool(handed)
            or self.last is None
            or now - self._detected_at >= DETECTION_REFRESH_S
            or self.detector.learned
            or self._flapping()
        )
        if not due:
            self.last_poll = now
            return snap
        if snap.taken_at != now:
            snap = replace(snap, taken_at=now)  # detection's clock (flap windows, last seen)
        self._detected_at = now
        self.rnic_netdevs = MappingProxyType({n: port.device for port in snap.ports for n in port.netdevs})
        self._log_changes(snap)
        events = self._detect(snap)
        if handed:
            self.detector.count(handed)
            events = [*events, *handed]
        if self.consumers is not None:
            events = self.consumers.annotate(events)
        if self._annotate is not None:
            events = self._annotate(events)
        for event_ in events:
            fields = event_.fields()
            if event_.consumers is not None:
                fields.update(consumer_log_fields(event_.consumers))
            event_log.log(_EVENT_LEVEL[event_.severity], event_.message, extra={"fields": fields})
        if self.ethtool.errors:
            self.source_errors["ethtool"] = self.ethtool.errors
        if self.reader.netlink_failures:
            self.source_errors["rdma_netlink"] = self.reader.netlink_failures
        detector = self.detector
        self.detection_families = tuple(detection_families(detector.last, detector.gid_changes, detector.events))
        record = Published(snap, tuple(events), replace(self.stats(), last_poll=now), self.detection_families)
        self.prometheus.publish(record)
        self.last = snap  # after the sink has it: readiness means "scrapes see a poll"
        self.last_poll = now
        for sink in self.sinks:
            sink.publish(record)
        return snap

    def _run_state(self, jobs: Sequence[Job]) -> None:
        self._state_runner.run(jobs, stop=self.stop)

    def _flapping(self) -> bool:
        """A port is flapping: its flag clears with time alone, so detection must keep looking."""
        last = self.detector.last
        return last is not None and any(view.flapping for view in last.ports.values())

    def _count(self, errors: Iterable[ReadError]) -> None:
        with self._stats_lock:
            for err in errors:
                self.read_errors[err.kind] += 1

    def _counter_jobs(self) -> list[Job]:
        return self.reader.counter_jobs()

    def _counter_scope(self) -> tuple[CounterPlan | None, ...]:
        """What a counter pass covers: the plans themselves (compared by identity), so a device
        listed or re-registered since the last pass gets a pass of its own."""
        return tuple(plan for _name, plan in self.reader.counter_plans())

    def counter_view(self, wait_s: float | None, max_age_s: float | None = None) -> CounterView:
        """A counter pass for one consumer (a scrape, an OTLP export): joins the pass in flight or
        starts one (or reuses one under `max_age_s` old, by default `COUNTER_PASS_REUSE_S`), waits
        at most `wait_s`, and says whether what it hands back is stale."""
        fresh = self._counter_pass.refresh(wait_s, max_age_s)
        self._count(self.reader.take_counter_errors())
        freshness = self.reader.freshness()
        if self._more_reads is not None:
            freshness = with_reads(freshness, self._more_reads())
        stale = not fresh or any(d.stuck for d in freshness)
        groups = {}
        failed: list[ReadError] = []
        unsupported: list[ReadError] = []
        for device, plan in self.reader.counter_plans():
            if plan is None:
                continue
            for group in plan.groups:
                groups[(device, group.kind, group.port)] = group
        for reader_failed, reader_unsupported in self.reader.counter_judgements():
            failed.extend(reader_failed)
            unsupported.extend(reader_unsupported)
        self._log_counter_changes(failed, unsupported)
        stats = self.stats(
            devices=freshness,
            counter_errors=tuple(failed),
            counter_unsupported=tuple(unsupported),
            counters_stale=stale,
        )
        return CounterView(groups, stats, self._counter_pass.passes * 2 + (1 if stale else 0))

    def hand_off(self, events: Sequence[Event]) -> None:
        """Events judged on another thread: the next poll publishes them with its own (thread-safe;
        the caller wakes the loop)."""
        with self._handed_lock:
            self._handed.extend(events)

    def counter_snapshot(self, wait_s: float | None) -> Snapshot | None:
        """A counter pass (shared with the scrapes', `counter_view`) merged into the last state
        snapshot: what link health judges. None before the first poll."""
        last = self.last
        if last is None:
            return None
        self.counter_view(wait_s)
        return self.reader.with_counters(last, self.config.read_deadline_s)

    def counter_pass_at(self) -> float | None:
        """(monotonic) When the last counter pass started, whoever asked for it; None before any."""
        return self._counter_pass.started

    def recent_counter_snapshot(self, wait_s: float | None, max_age_s: float) -> tuple[Snapshot, float] | None:
        """The last counter pass, when it started under `max_age_s` ago (a scrape's), merged into
        the last state snapshot, with when it started (monotonic): nothing is read for it. None
        when there is no pass that young, or no poll yet."""
        last, started = self.last, self._counter_pass.started
        if last is None or started is None or time.monotonic() - started > max_age_s:
            return None
        self.counter_view(wait_s, max_age_s)
        started = self._counter_pass.started
        assert started is not None
        return self.reader.with_counters(last, self.config.read_deadline_s), started

    def families(self) -> list[Family]:
        """The agent's own counters, as of now, for every sink (registered in `health`): state
        directory errors, event source errors, wake-ups. A counter with no label yet is absent."""
        out = []
        for spec, counts in (
            (catalog.STATE_ERRORS, self.detector.state_errors),
            (catalog.EVENT_SOURCE_ERRORS, self.source_errors),
            (catalog.WAKEUPS, self.wakeups),
        ):
            # dict() copies in one step: the loop thread counts while a scrape collects
            samples: list[Sample] = [((label,), count) for label, count in sorted(dict(counts).items())]
            if samples:
                out.append(Family(spec, samples))
        return out

    def stats(self, **scrape: object) -> ExporterStats:
        """The exporter's own bookkeeping; `scrape` adds what a counter pass knows."""
        with self._stats_lock:
            errors = dict(self.read_errors)
        base = ExporterStats(
            polls=self.polls,
            read_errors_by_reason=errors,
            config_reload_ok=self.config_reload_ok,
            last_poll=self.last_poll,
        )
        return replace(base, **scrape) if scrape else base  # type: ignore[arg-type]

    def _detect(self, snap: Snapshot) -> list[Event]:
        """Detection must never cost the metrics: a failure is logged with its traceback and counted."""
        try:
            return self.detector.observe(snap, self._inputs(snap))
        except Exception:
            self.source_errors["detection"] += 1
            log.exception("detection failed for this poll; sysfs metrics are still served")
            return []

    def _inputs(self, snap: Snapshot) -> Inputs:
        addresses = self._announcer.addresses() if self._announcer is not None else None
        return gather_inputs(snap, self._risks, addresses, self._advertised_mode)

    def _risks(self, netdev: str, ifindex: int | None, has_global_ipv6: bool) -> frozenset[str]:
        """Re-read at most every RISK_TTL_S per netdev (and after its link events): the files
        behind it change when an operator reconfigures, not between polls."""
        key = (netdev, ifindex, has_global_ipv6)
        now = time.monotonic()
        cached = self._risk_cache.get(key)
        if cached is None or now - cached[0] > RISK_TTL_S:
            cached = self._risk_cache[key] = (now, address_loss_risks(self.config.host_paths, *key))
        return cached[1]

    def _advertised_mode(self, netdev: str) -> AdvertisedLink | None:
        """Cached per netdev: an ethtool netlink round trip per poll would cost more than the poll."""
        if netdev not in self._advertised:
            self._advertised[netdev] = self.ethtool.advertised(netdev) if self.config.ethtool else None
        return self._advertised[netdev]

    def link_changed(self, ifname: str) -> None:
        """A link event: advertised modes (new module) and the address manager may differ now."""
        self._advertised.pop(ifname, None)
        for key in [k for k in self._risk_cache if k[0] == ifname]:
            del self._risk_cache[key]

    def netlink_event(self, ifname: str, kind: str) -> str | None:
        """An rtnetlink announcement: the RDMA device it concerns (None: not ours). A link event also
        drops what is cached about the netdev (`link_changed`)."""
        device = self.rnic_netdevs.get(ifname)
        if device is not None and kind == "link":
            self.link_changed(ifname)
        return device

    def woken(self, sources: Iterable[str], source_errors: Mapping[str, int]) -> None:
        """Before a poll: what woke it, and each watcher's error count so far."""
        for source, errors in source_errors.items():
            self.source_errors[source] = errors
        self.wakeups.update(sources)

    def reload(self, load: Callable[[], ServeConfig]) -> ServeConfig:
        """Re-read the config (SIGHUP): a broken file keeps the running config and says why."""
        try:
            new = load()
        except ConfigError as exc:
            log.error("config reload failed; keeping the running config", extra={"fields": {"err": str(exc)}})
            self.config_reload_ok = False
            return self.config
        self.config_reload_ok = True
        self.config = new
        self.reader.settings = new.reader
        self.reader.safety_s = new.safety_interval_s
        self.reader.set_periods(pcie_s=new.pcie_interval_s, ib_gids_s=new.gid_interval_s)
        self.detector.reconfigure(new.detection_settings)
        # Judge under the new settings at the next poll: a reload changes no sysfs file, so without
        # this the new NCCL index was judged only at the minute's refresh (seen up to 60 s late).
        self._detected_at = float("-inf")
        log.info("config reloaded", extra={"fields": {"file": str(new.config_file)}})
        return new

    def _log_changes(self, snap: Snapshot) -> None:
        if not snap.devices and not self._announced_empty:
            excluded = self.reader.settings.excludes_all(snap, self.config.sysfs)
            if excluded is not None:  # a misconfiguration, not a host without RDMA
                log.warning(excluded, extra={"fields": {"sysfs": str(self.config.sysfs)}})
            else:
                log.info(
                    "no RDMA devices found; serving the exporter's own metrics only",
                    extra={"fields": {"sysfs": str(self.config.sysfs)}},
                )
            self._announced_empty = True
        elif snap.devices:
            self._announced_empty = False
        self._state_logged = _log_unreadable(snap.errors, snap.unsupported, self._state_logged)

    def _log_counter_changes(self, failed: Sequence[ReadError], unsupported: Sequence[ReadError]) -> None:
        with self._stats_lock:
            self._counters_logged = _log_unreadable(failed, unsupported, self._counters_logged)

    def healthy(self) -> tuple[bool, str]:
        """The exporter's own health: its loop is alive. A device whose reads hang is skipped by the
        loop and shown by rnic_device_read_stuck; it must not get the exporter restarted."""
        last = self.last_poll
        if last is None:
            return False, "no poll has completed yet"
        age = time.time() - last
        # A host with nothing due every interval sleeps until its next due read (at most the
        # longest period of what nothing announces, or the safety sweep).
        config = self.config
        asleep = 0.0 if self.next_read_at is None else max(config.pcie_interval_s, config.safety_interval_s)
        if age > max(3 * config.poll_interval_s, 30.0, 2 * asleep):
            return False, f"last poll finished {age:.0f}s ago"
        return True, "OK"

    def close(self) -> None:
        self.stop.set()
        self._state_runner.close()
        self._counter_runner.close()
        for sink in self.sinks:
            sink.close()
        self.ethtool.close()
        self.reader.close()


def _log_unreadable(
    failed: Sequence[ReadError],
    unsupported: Sequence[ReadError],
    logged: tuple[frozenset[tuple[str, int | None, str]], ...],
) -> tuple[frozenset[tuple[str, int | None, str]], ...]:
    """A warning per attribute that started failing, one info line for what the driver lacks."""
    known_failed, known_unsupported = logged
    fresh = [e for e in unsupported if (e.device, e.port, e.attribute) not in known_unsupported]
    if fresh:  # once per device registration, at info: the driver simply does not have these
        log.info(
            "attributes not provided by the driver (not monitored, not a fault)",
            extra={"fields": {"attributes": "; ".join(summarize(fresh))}},
        )
    for err in failed:
        if (err.device, err.port, err.attribute) not in known_failed:
            log.warning(
                "attribute unreadable",
                extra={
                    "fields": {
                        "device": err.device,
                        "port": err.port if err.port is not None else "",
                        "attribute": err.attribute,
                        "reason": err.reason,
                    }
                },
            )
    return (
        frozenset((e.device, e.port, e.attribute) for e in failed),
        frozenset((e.device, e.port, e.attribute) for e in unsupported),
    )
