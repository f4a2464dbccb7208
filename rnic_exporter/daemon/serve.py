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
from typing import Protocol

from rnic_exporter import __version__
from rnic_exporter.config.file import apply_file
from rnic_exporter.daemon.agent import Agent, ServeConfig
from rnic_exporter.daemon.consumer_watch import ConsumerWatch, Scan
from rnic_exporter.daemon.runtime import settle_garbage_collector, tune_process
from rnic_exporter.daemon.schedule import PollSchedule
from rnic_exporter.detect.state import StateLock
from rnic_exporter.errors import ConfigError

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
) -> int:
    """Run until stopped. Returns the process exit code; raises ConfigError before serving."""
    from rnic_exporter.web.server import LandingPage, WebServer

    wake, reload = threading.Event(), threading.Event()
    base = config  # flags and defaults: every (re)load of the file starts from these
    config = apply_file(base, set(explicit))
    state_lock = StateLock.acquire(config.state_dir)  # a second daemon on the directory: exit 2 here
    stop = stop or threading.Event()
    agent = Agent(config, stop=stop)
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
