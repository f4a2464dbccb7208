"""The daemon: owns time. Passes over sysfs state on its clock, publishes each change, serves HTTP.

Each poll is a state pass (`sources/reader.py`): when no device changed, it ends there, with no
detection and no rendering. A change runs detection and hands every sink the same frozen record
(`samples.Published`). Counters are read per consumer: a scrape or an OTLP export asks for a
counter pass (`counter_view`). Reads run on sacrificial threads (`sources/read_thread.py`), so a
hung read stalls only its own device, never the loop, the scrapes or a stop.

Startup, loop and shutdown are separate steps; a signal only sets a flag. SIGTERM/SIGINT stop,
SIGHUP re-reads the config file (a broken file keeps the running config and says why).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType, MappingProxyType
from typing import Protocol

from rnic_exporter import __version__
from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.catalog.events import Event
from rnic_exporter.config.file import (
    ConsumerSettings,
    apply_file,  # one resolver: check uses it too
)
from rnic_exporter.daemon.consumer_watch import ConsumerWatch, Scan
from rnic_exporter.daemon.runtime import settle_garbage_collector, tune_process
from rnic_exporter.daemon.schedule import PollSchedule
from rnic_exporter.detect.conditions import AddressLike
from rnic_exporter.detect.detector import Detector
from rnic_exporter.detect.inputs import Inputs, gather_inputs
from rnic_exporter.detect.settings import DetectionSettings
from rnic_exporter.detect.state import DEFAULT_STATE_DIR, StateLock, StateStore
from rnic_exporter.errors import ConfigError
from rnic_exporter.model.host import AdvertisedLink, ReadError, Snapshot
from rnic_exporter.sinks.consumer_fields import log_fields as consumer_log_fields
from rnic_exporter.sinks.detection import detection_families
from rnic_exporter.sinks.otel_settings import OtlpSettings
from rnic_exporter.sinks.process import ProcessFamilies
from rnic_exporter.sinks.prometheus import DEFAULT_COUNTER_WAIT_S, CounterView, PrometheusSink
from rnic_exporter.sinks.samples import ExporterStats, Family, Published
from rnic_exporter.sources.address_risks import HostPaths, address_loss_risks
from rnic_exporter.sources.availability import summarize
from rnic_exporter.sources.counters import CounterPlan
from rnic_exporter.sources.ethtool import EthtoolReader
from rnic_exporter.sources.read_thread import DEFAULT_DEADLINE_S, ReadRunner, SingleFlight
from rnic_exporter.sources.reader import SAFETY_S, HostReader, Job, ReaderSettings
from rnic_exporter.sources.sysfs import SysfsRoot

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


# Prometheus' exporter port range 9100-9999 is fully allocated and its guide asks unlisted
# exporters to stay out of it; 19879 is outside it, below the ephemeral range, and no well-known
# service's, so we run beside node_exporter (9100) and dcgm-exporter (9400).
DEFAULT_PORT = 19879
DEFAULT_LISTEN = f":{DEFAULT_PORT}"


@dataclass(frozen=True, slots=True)
class ServeConfig:
    sysfs: Path = Path("/sys")
    listen: tuple[str, ...] = (DEFAULT_LISTEN,)
    telemetry_path: str = "/metrics"
    web_config_file: Path | None = None
    web_max_connections: int = 512
    web_max_requests: int = 40
    poll_interval_s: float = 5.0
    # While netlink works, what an event announces is re-read on the event and this often anyway
    # (--poll.safety-interval); each poll reads only what nothing announces (sources/reader.py).
    safety_interval_s: float = SAFETY_S
    reader: ReaderSettings = field(default_factory=ReaderSettings)
    config_file: Path | None = None
    state_dir: Path | None = DEFAULT_STATE_DIR  # None keeps the inventory in memory only
    host_paths: HostPaths = field(default_factory=HostPaths)
    detection: DetectionSettings = field(default_factory=DetectionSettings)
    watch_netlink: bool = True
    watch_udev: bool = True
    ethtool: bool = True  # advertised link modes as a rated source (loads pyroute2's ethtool module)
    otlp: OtlpSettings | None = None  # None: OTLP off, OpenTelemetry never imported
    counter_wait_s: float = DEFAULT_COUNTER_WAIT_S  # --web.counter-wait
    read_deadline_s: float = DEFAULT_DEADLINE_S
    consumers: ConsumerSettings = field(default_factory=ConsumerSettings)  # --collector.consumers

    @property
    def detection_settings(self) -> DetectionSettings:
        """Detection judges NCCL's pick with the NCCL settings the reader selects with."""
        return replace(self.detection, nccl=self.reader.nccl)


class Agent:
    """Polls, keeps the last snapshot, and feeds the sinks. Usable without a loop in tests."""

    def __init__(self, config: ServeConfig, root: SysfsRoot | None = None, stop: threading.Event | None = None) -> None:
        self.config = config
        self.reader = HostReader(root or SysfsRoot(config.sysfs, hold_fds=True), config.reader)
        self.reader.safety_s = config.safety_interval_s
        self.stop = stop or threading.Event()  # set: every wait on a read gives up
        self._state_runner = ReadRunner("state", config.read_deadline_s)
        self._counter_runner = ReadRunner("counters", config.read_deadline_s)
        self._counter_pass = SingleFlight(
            self._counter_runner, self._counter_jobs, COUNTER_PASS_REUSE_S, scope=self._counter_scope
        )
        self.prometheus = PrometheusSink(self.counter_view, config.counter_wait_s)
        self.process = ProcessFamilies()
        self.last: Snapshot | None = None
        self.last_poll: float | None = None  # wall clock: the loop's heartbeat, whatever a device does
        self.polls = 0
        self._stats_lock = threading.Lock()
        self.read_errors: Counter[str] = Counter()
        self._announced_empty = False
        self.config_reload_ok = True
        self.web_config_reload_ok: Callable[[], bool] = lambda: True  # the web server's, wired by run()
        self.web_families: Callable[[], Iterable[Family]] = tuple  # its rnic_exporter_http_*, wired by run()
        self.sinks: list[EventSink] = []
        self.consumers: ConsumerWatch | None = None  # --collector.consumers: names each event's users
        self.detection_families: tuple[Family, ...] = ()  # the last detection's, shared by every sink
        self.detector = Detector(config.detection_settings, StateStore(config.state_dir))
        self.ethtool = EthtoolReader()
        self._advertised: dict[str, AdvertisedLink | None] = {}  # netdev -> best advertised mode, cached
        self._risk_cache: dict[tuple[str, int | None, bool], tuple[float, frozenset[str]]] = {}
        self.source_errors: Counter[str] = Counter()
        self.wakeups: Counter[str] = Counter(dict.fromkeys(WAKEUP_SOURCES, 0))  # 0 on a quiet host, not absent
        self.addresses: Callable[[], Mapping[str, tuple[AddressLike, ...]]] | None = None  # set with netlink
        # The RDMA devices for which announcements are trusted (netlink healthy, no overrun, all their
        # netdevs known to it), or True for all: set with netlink. The others are polled in full.
        self.trust_events: Callable[[], bool | Collection[str]] = lambda: False
        # netdev -> its RDMA device; read by watcher threads: replaced each poll, never mutated
        self.rnic_netdevs: Mapping[str, str] = MappingProxyType({})
        self._detected_at = float("-inf")
        # (device, port, attribute) already logged as failed, and as unsupported: each is said once
        self._state_logged: tuple[frozenset[tuple[str, int | None, str]], ...] = (frozenset(), frozenset())
        self._counters_logged: tuple[frozenset[tuple[str, int | None, str]], ...] = (frozenset(), frozenset())

    def poll_once(self, full_gid_tables: bool | Collection[str] = False, *, event: bool = False) -> Snapshot:
        """One state pass; detection and publishing only when something changed (or `event`: an
        announcement may have changed what detection sees besides sysfs)."""
        trusted = self.trust_events()
        result = self.reader.state_pass(full_gid_tables=full_gid_tables, trust_events=trusted, runner=self._run_state)
        now = time.time()
        self.polls += 1
        self._count(result.read_errors)
        snap = result.snapshot
        due = (
            result.changed
            or event
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
        if self.consumers is not None:
            events = self.consumers.annotate(events)
        for event_ in events:
            fields = event_.fields()
            if event_.consumers is not None:
                fields.update(consumer_log_fields(event_.consumers))
            event_log.log(_EVENT_LEVEL[event_.severity], event_.message, extra={"fields": fields})
        if self.ethtool.errors:
            self.source_errors["ethtool"] = self.ethtool.errors
        detector = self.detector
        self.detection_families = tuple(
            detection_families(
                detector.last,
                detector.gid_changes,
                detector.events,
                {
                    catalog.STATE_ERRORS: detector.state_errors,
                    catalog.EVENT_SOURCE_ERRORS: self.source_errors,
                    catalog.WAKEUPS: self.wakeups,
                },
            )
        )
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

    def counter_view(self, wait_s: float | None) -> CounterView:
        """A counter pass for one consumer (a scrape, an OTLP export): joins the pass in flight or
        starts one, waits at most `wait_s`, and says whether what it hands back is stale."""
        fresh = self._counter_pass.refresh(wait_s)
        self._count(self.reader.take_counter_errors())
        freshness = self.reader.freshness()
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
        health = (
            *self.process.families(),
            *(family for sink in self.sinks for family in sink.families()),
            *self.web_families(),
        )
        return CounterView(groups, stats, self._counter_pass.passes * 2 + (1 if stale else 0), health)

    def stats(self, **scrape: object) -> ExporterStats:
        """The exporter's own bookkeeping; `scrape` adds what a counter pass knows."""
        with self._stats_lock:
            errors = dict(self.read_errors)
        base = ExporterStats(
            polls=self.polls,
            read_errors_by_reason=errors,
            config_reload_ok=self.config_reload_ok and self.web_config_reload_ok(),
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
        addresses = self.addresses() if self.addresses is not None else None
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
        if age > max(3 * self.config.poll_interval_s, 30.0):
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


@contextlib.contextmanager
def capture_signals(stop: threading.Event, wake: threading.Event, reload: threading.Event) -> Iterator[None]:
    """SIGTERM/SIGINT set stop; SIGHUP sets reload. Old handlers come back on exit."""

    def on_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()
        wake.set()

    def on_hup(signum: int, frame: FrameType | None) -> None:
        reload.set()
        wake.set()

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGHUP, on_hup)
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def run(
    config: ServeConfig,
    explicit: frozenset[str] = frozenset(),
    stop: threading.Event | None = None,
    scan: Scan | None = None,
) -> int:
    """Run until stopped. Returns the process exit code; raises ConfigError before serving."""
    from rnic_exporter.web.server import LandingPage, WebServer

    wake, reload = threading.Event(), threading.Event()
    base = config  # flags and defaults: every (re)load of the file starts from these
    config = apply_file(base, set(explicit))
    state_lock = StateLock.acquire(config.state_dir)  # a second daemon on the directory: exit 2 here
    stop = stop or threading.Event()
    agent = Agent(config, stop=stop)
    if state_lock.problem is not None:  # held, but its file not written (a full disk): counted
        agent.detector.state_errors["unwritable"] += 1
    if config.otlp is not None:  # before serving: a missing extra is a one-line error, exit 2
        from rnic_exporter.sinks.otel import OtelSink

        agent.sinks.append(OtelSink(config.otlp, counters=agent.counter_view))
    if config.consumers.enabled:
        agent.consumers = start_consumer_watch(config, scan)
        agent.sinks.append(agent.consumers)
    schedule = PollSchedule(config.poll_interval_s, wake)
    web = WebServer(
        listen_addresses=config.listen,
        telemetry_path=config.telemetry_path,
        provider=agent.prometheus,
        landing=LandingPage(
            name="rnic-exporter",
            description="RDMA NIC exporter: GID tables, link speeds, PCIe links and counters of RoCE "
            "and InfiniBand ports.",
            version=__version__,
            links=(("/-/healthy", "Health"),),
        ),
        web_config_file=config.web_config_file,
        health=agent.healthy,
        max_connections=config.web_max_connections,
        max_requests=config.web_max_requests,
    )
    agent.web_config_reload_ok = lambda: web.config_reload_ok
    agent.web_families = web.families
    tune_process()
    with capture_signals(stop, wake, reload), contextlib.ExitStack() as cleanup:
        web.start()  # a bind error surfaces here, before the first poll
        cleanup.callback(agent.close)
        cleanup.callback(web.shutdown)
        watchers = start_watchers(config, agent, schedule, cleanup)
        agent.poll_once(full_gid_tables=True)
        settle_garbage_collector()
        log.info(
            "listening",
            extra={
                "fields": {
                    "address": ",".join(f"{h}:{p}" for h, p in web.bound),
                    "telemetry_path": config.telemetry_path,
                    "sysfs": str(config.sysfs),
                    "poll_interval_s": config.poll_interval_s,
                    "version": __version__,
                    "state_dir": str(config.state_dir or ""),
                    "watching": ",".join(sorted(watchers)) or "none",
                }
            },
        )
        while (due := schedule.wait(stop, reload)) is not None:
            if reload.is_set():
                reload.clear()
                config = _reload(agent, base, config, explicit)
                schedule.interval_s = config.poll_interval_s
            for source, watcher in watchers.items():
                agent.source_errors[source] = watcher.errors
            agent.wakeups.update(due.sources)
            started = time.monotonic()
            agent.poll_once(full_gid_tables=due.full_gid_tables, event=due.reason == "event")
            log.debug("poll", extra={"fields": {"seconds": round(time.monotonic() - started, 6), "reason": due.reason}})
    state_lock.release()
    log.info("stopped")
    return 0


def start_consumer_watch(config: ServeConfig, scan: Scan | None = None) -> ConsumerWatch:
    """The consumer scan on its own thread; `scan` replaces the real one (the simulator's)."""
    from rnic_exporter.daemon.consumer_watch import scanner

    paths = config.host_paths
    watch = ConsumerWatch(scan or scanner(config.sysfs, paths.procfs, paths.rootfs), config.consumers)
    watch.start()
    return watch


class Watcher(Protocol):
    errors: int

    def close(self) -> None: ...


def start_watchers(
    config: ServeConfig, agent: Agent, schedule: PollSchedule, cleanup: contextlib.ExitStack
) -> dict[str, Watcher]:
    """Start netlink and udev listeners that wake the poller; a failure leaves polling alone."""
    watchers: dict[str, Watcher] = {}
    if config.watch_netlink:
        from rnic_exporter.sources.netlink import NetlinkWatcher

        def on_netlink(ifname: str, kind: str) -> None:
            device = agent.rnic_netdevs.get(ifname)
            if device is not None:
                if kind == "link":
                    agent.link_changed(ifname)
                schedule.announce("netlink", (device,))

        netlink = NetlinkWatcher(on_netlink)
        netlink.start()
        cleanup.callback(netlink.close)
        agent.addresses = netlink.addresses
        overruns = [netlink.overruns]

        def trusted() -> frozenset[str]:
            """Healthy, nothing dropped since the last pass (an overrun loses announcements), and only
            devices all of whose netdevs netlink knows (it announces nothing about the others)."""
            seen, overruns[0] = overruns[0], netlink.overruns
            if not netlink.healthy or seen != netlink.overruns:
                return frozenset()
            links = netlink.links()
            unknown = {device for netdev, device in agent.rnic_netdevs.items() if netdev not in links}
            # A device without netdevs (InfiniBand without IPoIB) has nothing netlink could announce:
            # trusted, its fast pass reads what nothing announces (its ports' state, rate, GIDs).
            return frozenset(name for name in agent.reader.device_names() if name not in unknown)

        agent.trust_events = trusted
        watchers["netlink"] = netlink
    if config.watch_udev:
        from rnic_exporter.sources.udev import UdevWatcher

        def on_udev(subsystem: str, action: str, sys_name: str) -> None:
            if subsystem != "net" or sys_name in agent.rnic_netdevs:
                schedule.announce("udev")

        udev = UdevWatcher(on_udev)
        udev.start()
        cleanup.callback(udev.close)
        watchers["udev"] = udev
    return watchers


def _reload(agent: Agent, base: ServeConfig, config: ServeConfig, explicit: frozenset[str]) -> ServeConfig:
    try:
        new = apply_file(base, set(explicit))
    except ConfigError as exc:
        log.error("config reload failed; keeping the running config", extra={"fields": {"err": str(exc)}})
        agent.config_reload_ok = False
        return config
    agent.config_reload_ok = True
    agent.config = new
    agent.reader.settings = new.reader
    agent.reader.safety_s = new.safety_interval_s
    agent.detector.reconfigure(new.detection_settings)
    log.info("config reloaded", extra={"fields": {"file": str(config.config_file)}})
    return new
