"""The daemon: owns time. Polls sysfs on its clock, publishes each snapshot, serves HTTP.

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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Protocol

from rnic_exporter import __version__
from rnic_exporter import config as config_file
from rnic_exporter.errors import ConfigError
from rnic_exporter.events import Event
from rnic_exporter.model import Snapshot
from rnic_exporter.sinks.prometheus import ExporterStats, PrometheusSink
from rnic_exporter.sources.snapshot import HostReader, ReaderSettings
from rnic_exporter.sources.sysfs import SysfsRoot

log = logging.getLogger("rnic_exporter.agent")


class EventSink(Protocol):
    """A consumer of every poll's snapshot and events (OTLP). Must return quickly: queue, never block."""

    def publish(self, snap: Snapshot, events: Sequence[Event]) -> None: ...

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
    poll_interval_s: float = 5.0
    reader: ReaderSettings = field(default_factory=ReaderSettings)
    config_file: Path | None = None


class Agent:
    """Polls, keeps the last snapshot, and feeds the sinks. Usable without threads in tests."""

    def __init__(self, config: ServeConfig, root: SysfsRoot | None = None) -> None:
        self.config = config
        self.reader = HostReader(root or SysfsRoot(config.sysfs, hold_fds=True), config.reader)
        self.prometheus = PrometheusSink()
        self.last: Snapshot | None = None
        self.polls = 0
        self.read_errors: Counter[str] = Counter()
        self._announced_empty = False
        self.config_reload_ok = True
        self.sinks: list[EventSink] = []

    def poll_once(self) -> Snapshot:
        snap = self.reader.read()
        self.polls += 1
        for err in snap.errors:
            self.read_errors[err.kind] += 1
        self._log_changes(snap)
        self.last = snap
        self.prometheus.update(snap, ExporterStats(polls=self.polls, read_errors_by_reason=dict(self.read_errors),
                                                   config_reload_ok=self.config_reload_ok))
        events: Sequence[Event] = ()
        for sink in self.sinks:
            sink.publish(snap, events)
        return snap

    def _log_changes(self, snap: Snapshot) -> None:
        if not snap.devices and not self._announced_empty:
            log.info("no RDMA devices found; serving the exporter's own metrics only",
                     extra={"fields": {"sysfs": str(self.config.sysfs)}})
            self._announced_empty = True
        elif snap.devices:
            self._announced_empty = False
        before = {(e.device, e.port, e.attribute) for e in self.last.errors} if self.last else set()
        for err in snap.errors:
            if (err.device, err.port, err.attribute) not in before:
                log.warning("attribute unreadable", extra={"fields": {
                    "device": err.device, "port": err.port if err.port is not None else "",
                    "attribute": err.attribute, "reason": err.reason}})

    def healthy(self) -> tuple[bool, str]:
        last = self.last
        if last is None:
            return False, "no poll has completed yet"
        age = time.time() - last.taken_at
        if age > max(3 * self.config.poll_interval_s, 30.0):
            return False, f"last poll finished {age:.0f}s ago"
        return True, "OK"

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        self.reader.close()


def apply_file(config: ServeConfig, explicit: set[str]) -> ServeConfig:
    """Overlay the config file on `config`, except for settings given explicitly as flags."""
    if config.config_file is None:
        return config
    loaded = config_file.load(config.config_file)
    interval = config.poll_interval_s
    if "poll_interval" not in explicit and loaded.poll_interval_seconds is not None:
        interval = loaded.poll_interval_seconds
    include = config.reader.device_include.pattern if config.reader.device_include else None
    exclude = config.reader.device_exclude.pattern if config.reader.device_exclude else None
    if "device_include" not in explicit and loaded.device_include is not None:
        include = loaded.device_include
    if "device_exclude" not in explicit and loaded.device_exclude is not None:
        exclude = loaded.device_exclude
    return replace(config, poll_interval_s=interval,
                   reader=ReaderSettings.build(include, exclude, loaded.nccl_env))


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


def run(config: ServeConfig, explicit: frozenset[str] = frozenset(),
        stop: threading.Event | None = None) -> int:
    """Run until stopped. Returns the process exit code; raises ConfigError before serving."""
    from rnic_exporter.web.server import LandingPage, WebServer

    stop = stop or threading.Event()
    wake, reload = threading.Event(), threading.Event()
    config = apply_file(config, set(explicit))
    agent = Agent(config)
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
    )
    with capture_signals(stop, wake, reload):
        web.start()  # a bind error surfaces here, before the first poll
        agent.poll_once()
        log.info("listening", extra={"fields": {
            "address": ",".join(f"{h}:{p}" for h, p in web.bound), "telemetry_path": config.telemetry_path,
            "sysfs": str(config.sysfs), "poll_interval_s": config.poll_interval_s, "version": __version__}})
        try:
            while not stop.is_set():
                wake.wait(config.poll_interval_s)
                wake.clear()
                if stop.is_set():
                    break
                if reload.is_set():
                    reload.clear()
                    config = _reload(agent, config, explicit)
                started = time.monotonic()
                agent.poll_once()
                log.debug("poll", extra={"fields": {"seconds": round(time.monotonic() - started, 6)}})
        finally:
            web.shutdown()
            agent.close()
    log.info("stopped")
    return 0


def _reload(agent: Agent, config: ServeConfig, explicit: frozenset[str]) -> ServeConfig:
    try:
        new = apply_file(config, set(explicit))
    except ConfigError as exc:
        log.error("config reload failed; keeping the running config", extra={"fields": {"err": str(exc)}})
        agent.config_reload_ok = False
        return config
    agent.config_reload_ok = True
    agent.config = new
    agent.reader.settings = new.reader
    log.info("config reloaded", extra={"fields": {"file": str(config.config_file)}})
    return new
