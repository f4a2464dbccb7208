"""The consumer scan's cadence: every `interval_s` on its own thread, and right after any detection
event, so that the series an alert joins name who the event hits.

Off by default (`--collector.consumers`); disabled, nothing here is constructed or imported. A
scan that raises or overruns its deadline is counted (`rnic_exporter_consumer_scan_errors_total`)
and logged once until a scan succeeds again; the last good scan keeps being served, with its age
on every event (`consumer_fields`). A hung scan is abandoned on its daemon thread and no second
one is started beside it.

`Scan` is the one seam to the scan itself (`sources/consumers.py`): any callable returning a
`ConsumerScan`. `scanner()` binds the real one to the host's paths.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.catalog.events import Event
from rnic_exporter.config.file import ConsumerSettings
from rnic_exporter.model.consumers import ConsumerScan, DeviceConsumers
from rnic_exporter.sinks.consumer_fields import device_series, series_key
from rnic_exporter.sinks.samples import Family, Published
from rnic_exporter.sources.live_tree import is_live_sysfs, is_own_procfs

log = logging.getLogger("rnic_exporter.consumers")

Scan = Callable[[], ConsumerScan]


def scanner(sysfs: Path, procfs: Path, rootfs: Path, *, rdma_netlink: bool = True) -> Scan:
    """The real scan bound to the host's trees (--path.sysfs, --path.procfs, --path.rootfs).

    Where the exporter reads a sysfs mount and a proc mount of its own PID namespace (the
    numbering its netlink socket's pids use: `/proc`, or the host's with `hostPID`), the holders
    come from RDMA netlink's context list, one dump per device, instead of a walk of every
    descriptor of every process (0.4 s of CPU on a 10,000-process host); a kernel or policy that
    refuses it, or `rdma_netlink` False (--no-collector.rdma-netlink), keeps the walk. The reason
    is logged once per change."""
    live = rdma_netlink and is_live_sysfs(Path(sysfs)) and is_own_procfs(Path(procfs))
    said: list[str | None] = [None]

    def holders() -> list[tuple[int, str]] | None:
        from rnic_exporter.sources.nldev import RdmaNetlink, Unavailable

        with RdmaNetlink() as client:
            got = client.context_owners()
        if isinstance(got, Unavailable):
            if said[0] != got.reason:
                said[0] = got.reason
                log.info(
                    "consumer scan walks /proc: RDMA netlink does not list the verbs contexts",
                    extra={"fields": {"reason": got.reason, "err": got.detail}},
                )
            return None
        if said[0] is not None:
            said[0] = None
            log.info("consumer scan reads the verbs contexts from RDMA netlink again")
        return [(ctx.pid, ctx.device) for ctx in got if ctx.pid is not None]

    def scan() -> ConsumerScan:
        # Imported on the first scan: a broken or missing source is a counted scan error, not a
        # daemon that will not start.
        from rnic_exporter.sources import consumers

        listed = holders() if live else None
        result: ConsumerScan = consumers.scan(procfs=procfs, sysfs=sysfs, rootfs=rootfs, holders=listed)
        return result

    return scan


class ConsumerWatch:
    """An `agent.EventSink`: scans on its clock and on events, serves the last scan's families,
    and names each event's consumers (`annotate`)."""

    def __init__(self, scan: Scan, settings: ConsumerSettings | None = None) -> None:
        self._scan = scan
        self.settings = settings or ConsumerSettings()
        self.last: ConsumerScan | None = None
        self.errors: Counter[str] = Counter()
        self._failing: str | None = None  # the reason already logged, until a scan succeeds
        self._devices: tuple[str, ...] = ()  # the last published snapshot's, for zero counts
        self._inflight: threading.Event | None = None  # set when the running scan has returned
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._families: tuple[ConsumerScan, tuple[str, ...], list[Family]] | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="consumer-watch", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.scan_now()
            self._wake.wait(self.settings.interval_s)
            self._wake.clear()

    def scan_now(self) -> ConsumerScan | None:
        """One scan, at most `timeout_s`; the new scan, or None when it failed or overran."""
        with self._lock:
            stuck = self._inflight is not None and not self._inflight.is_set()
            if not stuck:
                done = self._inflight = threading.Event()
        if stuck:
            self._fail("timeout", "the previous consumer scan has still not returned")
            return None
        box: list[ConsumerScan | BaseException] = []

        def work() -> None:
            try:
                box.append(self._scan())
            except Exception as exc:  # a scan must never take the daemon down
                box.append(exc)
            finally:
                done.set()

        threading.Thread(target=work, name="consumer-scan", daemon=True).start()
        if not done.wait(self.settings.timeout_s):
            self._fail("timeout", f"the consumer scan did not finish within {self.settings.timeout_s:g}s")
            return None
        result = box[0]
        if isinstance(result, BaseException):
            self._fail("error", f"{type(result).__name__}: {result}")
            return None
        with self._lock:
            self.last = result
            if self._failing is not None:
                log.info("consumer scan works again", extra={"fields": {"processes": result.processes_scanned}})
            self._failing = None
        return result

    def _fail(self, reason: str, detail: str) -> None:
        with self._lock:
            self.errors[reason] += 1
            if self._failing == reason:
                return
            self._failing = reason
        log.warning(
            "consumer scan failed; events and metrics keep the last scan's consumers",
            extra={"fields": {"reason": reason, "err": detail}},
        )

    def annotate(self, events: Sequence[Event], now: float | None = None) -> list[Event]:
        """Each event with its device's consumers as of the last scan (and that scan's age)."""
        scan = self.last
        if scan is None or not events:
            return list(events)
        at = time.time() if now is None else now
        return [replace(e, consumers=DeviceConsumers.of(scan, e.device, e.time or at)) for e in events]

    # -- EventSink ---------------------------------------------------------------------------

    def publish(self, record: Published) -> None:
        self._devices = tuple(d.name for d in record.snapshot.devices)
        if record.events:
            self._wake.set()  # rescan now: the next scrape's info series show who is on it now

    def families(self) -> Iterable[Family]:
        """Built once per scan (and device list), not per scrape: only the error counts move between."""
        scan = self.last
        errors = Family(catalog.CONSUMER_SCAN_ERRORS, [((r,), float(self.errors[r])) for r in ("error", "timeout")])
        if scan is None:
            return [errors]
        devices = self._devices
        cached = self._families
        if cached is None or cached[0] is not scan or cached[1] != devices:
            cached = self._families = (scan, devices, _scan_families(scan, devices))
        return [*cached[2], errors]

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(1.0)  # a hung scan is on its own daemon thread; this one returns


def _scan_families(scan: ConsumerScan, devices: Sequence[str]) -> list[Family]:
    processes, workloads, info = (
        Family(catalog.DEVICE_CONSUMER_PROCESSES),
        Family(catalog.DEVICE_WORKLOADS),
        Family(catalog.DEVICE_WORKLOAD_INFO),
    )
    for device in sorted({*devices, *scan.by_device}):
        used = scan.by_device.get(device, ())
        if not used and not scan.complete:
            continue  # a partial scan cannot say "unused"
        processes.samples.append(((device,), float(len({c.pid for c in used}))))
        workloads.samples.append(((device,), float(len({series_key(c.workload) for c in used}))))
        info.samples.extend((labels, 1.0) for labels in device_series(scan, device))
    own = [
        Family(catalog.CONSUMER_SCAN_DURATION, [((), scan.duration_s)]),
        Family(catalog.CONSUMER_SCAN_TIMESTAMP, [((), scan.at)]),
        Family(catalog.CONSUMER_SCAN_COMPLETE, [((), 1.0 if scan.complete else 0.0)]),
        Family(catalog.CONSUMER_SCAN_SKIPPED, [((), float(scan.skipped))]),
    ]
    return [f for f in (processes, workloads, info) if f.samples] + own
