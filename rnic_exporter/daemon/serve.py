"""Serving: builds the agent from its parts, then startup, the poll loop, signals, reload, shutdown.

Startup, loop and shutdown are separate steps; a signal only sets a flag. SIGTERM/SIGINT stop,
SIGHUP re-reads the config file (a broken file keeps the running config and says why).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import TYPE_CHECKING

from rnic_exporter import __version__
from rnic_exporter.catalog.events import Event
from rnic_exporter.config.file import apply_file
from rnic_exporter.config.serve import ServeConfig
from rnic_exporter.daemon.agent import Agent, SinkFactory
from rnic_exporter.daemon.consumer_watch import ConsumerWatch, Scan
from rnic_exporter.daemon.link_watch import NUDGE, LinkWatch
from rnic_exporter.daemon.runtime import settle_garbage_collector, tune_process
from rnic_exporter.daemon.schedule import PollSchedule
from rnic_exporter.daemon.watch import NetlinkAnnouncer, start_watchers
from rnic_exporter.detect.state import StateLock
from rnic_exporter.sinks.consumer_fields import workloads_by_device
from rnic_exporter.sinks.process import ProcessFamilies
from rnic_exporter.sinks.prometheus import CounterFeed
from rnic_exporter.sinks.registry import SelfMetrics

if TYPE_CHECKING:
    from rnic_exporter.daemon.wire_watch import Snapshots, WireWatch
    from rnic_exporter.sources.wire import WireReader, WireSettings
    from rnic_exporter.web.server import WebServer

log = logging.getLogger("rnic_exporter.agent")


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
    wire: WireReader | None = None,
) -> int:
    """Run until stopped. Returns the process exit code; raises ConfigError before serving.

    `scan` and `wire` replace the real consumer scan and wire reader (the simulator's)."""
    wake, reload = threading.Event(), threading.Event()
    base = config  # flags and defaults: every (re)load of the file starts from these
    config = apply_file(base, set(explicit))
    state_lock = StateLock.acquire(config.state_dir)  # a second daemon on the directory: exit 2 here
    stop = stop or threading.Event()
    schedule = PollSchedule(config.poll_interval_s, wake)
    health = SelfMetrics(ProcessFamilies().families)
    netlink = NetlinkAnnouncer(schedule) if config.watch_netlink else None
    # Built before the agent (its port-down events carry the wire's link-down reason); it reads the
    # agent's last snapshot only once started, after the first poll.
    wire_watch = wire_watch_for(config, lambda: agent.last, wire) if config.wire else None
    agent = Agent(
        config,
        stop=stop,
        sinks=otlp_sinks(config, health),  # before serving: a missing extra is a one-line error, exit 2
        consumers=start_consumer_watch(config, scan) if config.consumers.enabled else None,
        announcer=netlink,
        health=health,
        state_lock_unwritten=state_lock.problem is not None,
        annotate=wire_watch.annotate if wire_watch is not None else None,
        more_reads=wire_watch.reads_by_device if wire_watch is not None else None,
    )
    link_watch = link_watch_for(agent, schedule)
    web = web_server(config, agent)
    health.register(web.families, reloads=web)
    if wire_watch is not None:
        health.register(wire_watch.families)
    tune_process()
    with capture_signals(stop, wake, reload), contextlib.ExitStack() as cleanup:
        web.start()  # a bind error surfaces here, before the first poll
        cleanup.callback(agent.close)
        cleanup.callback(web.shutdown)
        if wire_watch is not None:
            cleanup.callback(wire_watch.close)
        watchers = start_watchers(
            netlink, config.watch_udev, agent.netlink_event, lambda: agent.rnic_netdevs, schedule, cleanup
        )
        agent.poll_once(full_gid_tables=True)
        schedule.next_read(agent.next_read_at)
        cleanup.callback(link_watch.close)
        link_watch.start()  # after the first poll: it merges counters into that poll's snapshot
        if wire_watch is not None:
            wire_watch.start()  # after the first poll: it reads the netdevs that poll found
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
                config = agent.reload(lambda: apply_file(base, set(explicit)))
                schedule.interval_s = config.poll_interval_s
                link_watch.reconfigure(config.detection.link_health)
                if wire_watch is not None and wire is None:  # the simulator's reader keeps its own
                    wire_watch.reader.settings = wire_settings_for(config, wire_watch.reader.settings)
            agent.woken(due.sources, {source: watcher.errors for source, watcher in watchers.items()})
            started = time.monotonic()
            agent.poll_once(full_gid_tables=due.full_gid_tables, event=due.reason == "event")
            schedule.next_read(agent.next_read_at)
            log.debug("poll", extra={"fields": {"seconds": round(time.monotonic() - started, 6), "reason": due.reason}})
    state_lock.release()
    log.info("stopped")
    return 0


def link_watch_for(agent: Agent, schedule: PollSchedule) -> LinkWatch:
    """Link health judged on its own timer, its events published by the poll loop it wakes."""

    def hand_off(events: list[Event]) -> None:
        agent.hand_off(events)
        schedule.nudge(NUDGE)

    def consumers() -> dict[str, tuple[str, ...]] | None:
        return None if agent.consumers is None else workloads_by_device(agent.consumers.last)

    def failed() -> None:
        agent.source_errors["detection"] += 1

    return LinkWatch(
        lambda: agent.counter_snapshot(agent.config.counter_wait_s),
        hand_off,
        agent.config.detection.link_health,
        conditions=lambda: agent.detector.last,
        consumers=consumers,
        failed=failed,
        recent=lambda max_age_s: agent.recent_counter_snapshot(agent.config.counter_wait_s, max_age_s),
        last_pass_at=agent.counter_pass_at,
    )


def otlp_sinks(config: ServeConfig, health: SelfMetrics) -> tuple[SinkFactory, ...]:
    """The OTLP sink, built on the agent's counter feed; `health` is what it exports of the exporter's own."""
    settings = config.otlp
    if settings is None:
        return ()
    from rnic_exporter.sinks.otel import OtelSink

    def build(counters: CounterFeed) -> OtelSink:
        return OtelSink(settings, counters=counters, health=health)

    return (build,)


def web_server(config: ServeConfig, agent: Agent) -> WebServer:
    from rnic_exporter.web.server import LandingPage, WebServer

    return WebServer(
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


def start_consumer_watch(config: ServeConfig, scan: Scan | None = None) -> ConsumerWatch:
    """The consumer scan on its own thread; `scan` replaces the real one (the simulator's)."""
    from rnic_exporter.daemon.consumer_watch import scanner

    paths = config.host_paths
    netlink = config.reader.rdma_netlink
    watch = ConsumerWatch(
        scan or scanner(config.sysfs, paths.procfs, paths.rootfs, rdma_netlink=netlink), config.consumers
    )
    watch.start()
    return watch


def wire_watch_for(config: ServeConfig, snapshots: Snapshots, reader: WireReader | None) -> WireWatch:
    """The wire reader over the RoCE netdevs of `snapshots` (--collector.wire); `reader` replaces the
    real one (the simulator's). Its families go into the registry every sink reads; started after the
    first poll."""
    from rnic_exporter.daemon.wire_watch import WireWatch, wire_settings

    if reader is None:
        from rnic_exporter.sources.ethtool_netlink import EthtoolNetlink
        from rnic_exporter.sources.wire import WireReader

        reader = WireReader(EthtoolNetlink(), wire_settings(config.wire_intervals))
    return WireWatch(reader, snapshots, sysfs=config.sysfs)


def wire_settings_for(config: ServeConfig, current: WireSettings) -> WireSettings:
    """The wire reader's settings after a reload: the config file's `[collector.wire]` intervals."""
    from rnic_exporter.daemon.wire_watch import wire_settings

    return wire_settings(config.wire_intervals, current)
