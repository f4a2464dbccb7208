"""The wire below the RoCE netdevs (issue 32) on a thread of its own, never on the scrape path.

`WireWatch` polls a `WireReader` over the RoCE ports' netdevs of the agent's last snapshot at the
reader's `next_due()`, and serves the latest readings as families through the registry every sink
collects from (`SelfMetrics.register`), so Prometheus and OTLP both see them. Module pages, FEC,
pause and `ethtool -S` cost firmware work on mlx5 (rnic-linux-facts §7); a scrape only reads what
the last poll left here.

Every failure is counted (`rnic_exporter_wire_read_errors_total`, by operation) and logged once
until that operation works again; nothing here raises into the daemon. A netdev whose driver lacks
an operation (veth, IPoIB) is `Unsupported` in the reader: asked once, no error, no series.

Off with --no-collector.wire: then nothing here is built and pyroute2's ethtool messages are never
loaded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.catalog.events import PORT_DOWN, PORT_UP, Event
from rnic_exporter.config.file import WireIntervals
from rnic_exporter.daemon.runtime import collect_young_garbage
from rnic_exporter.model.host import Snapshot
from rnic_exporter.model.wire import DeviceTemperatures, LinkState, NetdevWire, ReadFailure
from rnic_exporter.sinks.samples import Family, FamilyBuilder
from rnic_exporter.sinks.wire_samples import Netdev, hwmon_samples, wire_samples
from rnic_exporter.sources.hwmon import read_mlx5_hwmon
from rnic_exporter.sources.wire import WireReader, WireSettings

log = logging.getLogger("rnic_exporter.wire")

# Bounds on the wait between polls: at least MIN_WAIT_S, at most RESCAN_S (a netdev that appeared
# since is read this soon; a host with no RoCE netdev, or none with a source it supports, wakes only
# for that). Its sources are due once a minute: a first read up to 30 s late loses nothing, and each
# wake-up costs ~0.4 ms of the idle daemon (10 s cost 2.5-3 ms a minute on 16 RoCE netdevs). Before
# the agent's first snapshot the loop looks every MIN_WAIT_S, so the wire is read soon after start.
MIN_WAIT_S = 1.0
RESCAN_S = 30.0
HWMON_INTERVAL_S = 60.0  # an MTMP register access per sensor: on the module timer's pace
ERROR_OPERATIONS = ("link_state", "fec", "pause", "module_eeprom", "gstats", "hwmon", "poll")

Snapshots = Callable[[], Snapshot | None]


def wire_settings(intervals: WireIntervals, base: WireSettings | None = None) -> WireSettings:
    """The reader's settings with the config file's intervals (`[collector.wire]`)."""
    return replace(
        base or WireSettings(),
        module_interval=intervals.module_s,
        fec_interval=intervals.fec_s,
        pause_interval=intervals.pause_s,
        link_state_interval=intervals.link_state_s,
        link_state_up_interval=intervals.link_state_up_s,
        gstats_interval=intervals.gstats_s,
    )


# ethtool operation -> its kind in rnic_exporter_reads_total: what it costs the NIC (docs/read-cost.md)
READ_KINDS = {
    "module_eeprom": "module_page",  # one 128-byte page: an MCIA register access on mlx5
    "fec": "ethtool_fec",  # one PPCNT register read
    "pause": "ethtool_pause",  # one PPCNT register read
    "link_state": "ethtool_link_state",  # the driver's cached state: no firmware access
    "gstats": "ethtool_gstats",  # ethtool -S: every statistics group of the driver
}


def device_reads(
    netdevs: Mapping[str, Netdev], by_netdev: Mapping[str, Mapping[str, int]]
) -> dict[str, dict[str, int]]:
    """Each netdev's requests charged to its RDMA device, by read kind (a new dict: the agent's
    thread reads it while this one polls)."""
    out: dict[str, dict[str, int]] = {}
    for netdev, counts in by_netdev.items():
        where = netdevs.get(netdev)
        if where is None:
            continue
        mine = out.setdefault(where[0], {})
        for operation, count in counts.items():
            kind = READ_KINDS.get(operation, f"ethtool_{operation}")
            mine[kind] = mine.get(kind, 0) + count
    return out


def roce_netdevs(snap: Snapshot | None) -> dict[str, Netdev]:
    """Each netdev of an Ethernet-link-layer (RoCE) port, with its (device, port, netdev) labels."""
    if snap is None:
        return {}
    out: dict[str, Netdev] = {}
    for port in snap.ports:
        if port.link_layer != "Ethernet":
            continue  # InfiniBand: no module path in the kernel; its module temperature is hwmon's
        for netdev in port.netdevs:
            out.setdefault(netdev, (port.device, str(port.number), netdev))
    return out


def pci_functions(snap: Snapshot | None, sysfs: Path) -> dict[str, tuple[str, Path]]:
    """Each device with a PCI function: (its address, the function's directory) for hwmon."""
    if snap is None:
        return {}
    return {
        dev.name: (dev.pci_address, sysfs / "bus" / "pci" / "devices" / dev.pci_address)
        for dev in snap.devices
        if dev.pci_address
    }


class WireWatch:
    """Polls the wire on its own thread; `families()` is what the last poll read (thread-safe)."""

    def __init__(
        self,
        reader: WireReader,
        snapshots: Snapshots,
        sysfs: Path | None = None,
        hwmon_interval_s: float = HWMON_INTERVAL_S,
    ) -> None:
        """`snapshots`: the agent's last snapshot (or None before the first); `sysfs`: where the
        PCI functions' hwmon directories are (None: no hwmon)."""
        self.reader = reader
        self._snapshots = snapshots
        self._sysfs = sysfs
        self._hwmon_interval_s = hwmon_interval_s
        self._hwmon_due = 0.0
        self._hwmon: dict[str, tuple[str, DeviceTemperatures]] = {}
        self.errors: Counter[str] = Counter()
        self.polls = 0
        self._sent = 0  # requests sent by the last poll's end
        self._built_from: tuple[object, ...] | None = None  # what the families were last built from
        self._failing: set[str] = set()  # operations whose failure is logged already
        self._lock = threading.Lock()
        self._families: list[Family] = self._build({}, {})
        self._reads: dict[str, dict[str, int]] = {}  # device -> read kind -> requests (replaced, not mutated)
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by stop, and by a port event whose link state to re-read
        self._announced: set[str] = set()  # netdevs a port event named since the last poll (under _lock)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="wire-watch", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.poll_once()
            self._wake.wait(self.next_wait_s())
            self._wake.clear()

    def next_wait_s(self) -> float:
        """Seconds the loop sleeps after a poll, unless a port event wakes it."""
        if self._snapshots() is None:
            return MIN_WAIT_S  # the agent's first poll is coming: read the wire soon after it lands
        return min(max(self.reader.next_due(), MIN_WAIT_S), RESCAN_S)

    def poll_once(self, now: float | None = None) -> dict[str, NetdevWire]:
        """One pass over what is due; never raises (a failure is counted and logged once)."""
        try:
            snap = self._snapshots()
            netdevs = roce_netdevs(snap)
            with self._lock:
                announced, self._announced = self._announced, set()
            for netdev in announced:
                self.reader.expedite(netdev, "link_state")
            wire = self.reader.poll(netdevs)
            self._read_hwmon(snap, time.monotonic() if now is None else now)
        except Exception as exc:  # a reader bug must cost the wire series, never the daemon
            self._fail("poll", exc)
            errors = self._build({}, {})[-1:]  # the wire series keep their last reading
            with self._lock:
                self._families = [*(f for f in self._families if f.spec is not catalog.WIRE_READ_ERRORS), *errors]
            return {}
        sent = sum(self.reader.requests.values())
        # Nothing read, no netdev come or gone, no sensor read: the families stand (most wake-ups:
        # the loop looks for new netdevs every RESCAN_S, the sources are due once a minute).
        built_from = (sent, tuple(sorted(netdevs.items())), id(self._hwmon))
        if built_from != self._built_from:
            families = self._build(netdevs, wire)
            reads = device_reads(netdevs, self.reader.requests_by_netdev)
            with self._lock:
                self._families = families
                self._reads = reads
            self._built_from = built_from
            self._note_failures(wire)
        with self._lock:
            self.polls += 1
        if sent != self._sent:  # each request left reference cycles behind (pyroute2's messages)
            self._sent = sent
            collect_young_garbage()
        return wire

    def reads_by_device(self) -> Mapping[str, Mapping[str, int]]:
        """The wire's requests so far per RDMA device and read kind (`rnic_exporter_reads_total`)."""
        with self._lock:
            return self._reads

    def _read_hwmon(self, snap: Snapshot | None, now: float) -> None:
        if self._sysfs is None or now < self._hwmon_due:
            return
        self._hwmon_due = now + self._hwmon_interval_s
        found: dict[str, tuple[str, DeviceTemperatures]] = {}
        for device, (address, function) in pci_functions(snap, self._sysfs).items():
            try:
                temps = read_mlx5_hwmon(function)
            except Exception as exc:  # an unreadable sensor file: counted, the others still read
                self._fail("hwmon", exc)
                continue
            if temps is not None:  # no mlx5 hwmon (older kernel, another driver): unsupported
                found[device] = (address, temps)
        self._hwmon = found

    def _build(self, netdevs: Mapping[str, Netdev], wire: Mapping[str, NetdevWire]) -> list[Family]:
        """Built on the poll thread: the reader's counts move only there, so none is read mid-update."""
        builder = FamilyBuilder()
        for spec, labels, value in wire_samples(netdevs, wire, self.reader.requests):
            builder.add(spec, labels, value)
        for device, (address, temps) in sorted(self._hwmon.items()):
            for spec, labels, value in hwmon_samples(device, address, temps):
                builder.add(spec, labels, value)
        counts = self._read_errors()
        for operation in ERROR_OPERATIONS:
            builder.add(catalog.WIRE_READ_ERRORS, (operation,), float(counts.get(operation, 0)))
        return list(builder)

    def _read_errors(self) -> dict[str, int]:
        counts = dict(self.reader.ethtool.errors)
        if self.reader.gstats_errors:
            counts["gstats"] = self.reader.gstats_errors
        for operation, count in self.errors.items():
            counts[operation] = counts.get(operation, 0) + count
        return counts

    def _note_failures(self, wire: Mapping[str, NetdevWire]) -> None:
        """A warning the first time an operation fails, with the netdev and the kernel's answer; the
        counter tells the rest (a flapping read would otherwise log on every poll)."""
        for netdev, reading in sorted(wire.items()):
            for outcome in (reading.link_state, reading.fec, reading.pause, reading.module, reading.driver_pause):
                if isinstance(outcome, ReadFailure) and outcome.operation not in self._failing:
                    self._failing.add(outcome.operation)
                    log.warning(
                        "wire read failed; its series keep their last reading (counted from now on)",
                        extra={"fields": {"operation": outcome.operation, "netdev": netdev, "err": outcome.reason}},
                    )

    def _fail(self, operation: str, exc: Exception) -> None:
        self.errors[operation] += 1
        if operation not in self._failing:
            self._failing.add(operation)
            log.warning(
                "wire read failed; its series keep their last reading (counted from now on)",
                extra={"fields": {"operation": operation, "err": f"{type(exc).__name__}: {exc}"}},
            )

    def annotate(self, events: Sequence[Event]) -> list[Event]:
        """Each port-down event with why its netdev's link is down (ethtool extended link state:
        `link_down_reason`, `link_down_substate`) where the driver says, asked now: a link-state
        request costs no firmware access, and the timer's last reading may predate the drop. Never
        raises; an unsupported or failed request leaves the event as it is."""
        out = []
        announced = {e.netdev for e in events if e.spec in (PORT_DOWN, PORT_UP) and e.netdev}
        if announced:  # the series follow too: the timer reads an up link's state every 10 minutes
            with self._lock:
                self._announced |= announced
            self._wake.set()
        for event in events:
            state = None
            if event.spec is PORT_DOWN and event.netdev:
                try:
                    state = self.reader.ethtool.link_state(event.netdev)
                except Exception as exc:  # a reader bug must not cost the event
                    self._fail("link_state", exc)
            if isinstance(state, LinkState) and state.link_up is False and state.ext_state is not None:
                why = {"link_down_reason": state.ext_state}
                if state.ext_substate:
                    why["link_down_substate"] = state.ext_substate
                out.append(replace(event, attributes={**event.attributes, **why}))
            else:
                out.append(event)
        return out

    def families(self) -> Iterable[Family]:
        """The last poll's families and the error counts (0 per operation on a healthy host)."""
        with self._lock:
            return list(self._families)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5.0)
        self.reader.ethtool.close()
