"""`rnic-exporter check`: one judgment of this host now, against the daemon's persisted inventory.

For job prologues and on-call. Reads sysfs once (whole GID tables), the addresses over netlink
when it can (else from the GID table), and the state directory read-only: `check` never changes
what the daemon learned.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rnic_exporter.catalog.events import Severity
from rnic_exporter.detect.conditions import AddressLike, HostConditions, judge
from rnic_exporter.detect.inputs import gather_inputs
from rnic_exporter.detect.port_health import health_problems, judge_host
from rnic_exporter.detect.problems import SEVERITY_ORDER, Problem, aer_problems, fails, find_problems
from rnic_exporter.detect.settings import DetectionSettings
from rnic_exporter.detect.state import StateStore
from rnic_exporter.errors import ConfigError
from rnic_exporter.model.consumers import ConsumerScan, Workload
from rnic_exporter.model.host import Snapshot
from rnic_exporter.model.nccl import VERSIONS_NOTE
from rnic_exporter.model.optics import Level, ModuleReading
from rnic_exporter.model.wire import LinkState, NetdevWire
from rnic_exporter.sinks.consumer_fields import as_json as consumers_json
from rnic_exporter.sinks.consumer_fields import workload_names
from rnic_exporter.sources.address_risks import HostPaths, host_risks
from rnic_exporter.sources.availability import summarize
from rnic_exporter.sources.ethtool import EthtoolReader
from rnic_exporter.sources.reader import HostReader, ReaderSettings
from rnic_exporter.sources.sysfs import SysfsRoot

if TYPE_CHECKING:
    from rnic_exporter.sources.wire import WireReader

CHECK_SCHEMA = 1
HOST_SYSFS = Path("/sys")  # --path.sysfs's default: the sysfs the default --state.dir's inventory describes


@dataclass(frozen=True, slots=True)
class CheckReport:
    problems: tuple[Problem, ...]
    notes: tuple[str, ...]  # what limited the check (no inventory, no netlink...), unsupported attributes
    devices: int
    ports: int
    users: ConsumerScan | None = None  # check --collector.consumers: who each problem puts at risk

    def at_risk(self, problem: Problem) -> tuple[Workload, ...]:
        """The workloads on the problem's device; a host-wide problem (a NIC short) puts all at risk."""
        if self.users is None:
            return ()
        device = problem.where.split(" ", 1)[0]
        if device == "host":
            return tuple(sorted({w for d in self.users.by_device for w in self.users.workloads(d)}))
        return self.users.workloads(device)

    @property
    def healthy(self) -> bool:
        return not self.problems

    def failed(self, fail_on: str = "warning") -> bool:
        """Whether a job prologue should stop: a problem at `fail_on` or worse. Notes never count."""
        return fails(self.problems, fail_on)

    def to_json(self, fail_on: str = "warning") -> dict[str, Any]:
        return {
            "schema": CHECK_SCHEMA,
            "healthy": self.healthy,
            "fail_on": fail_on,
            "failed": self.failed(fail_on),
            "devices": self.devices,
            "ports": self.ports,
            "problems": [self._problem_json(p) for p in self.problems],
            "notes": list(self.notes),
        }

    def _problem_json(self, problem: Problem) -> dict[str, Any]:
        out = problem.to_json()
        if self.users is not None:  # absent: not scanned; [] : nobody was using the device
            device = problem.where.split(" ", 1)[0]
            devices = list(self.users.by_device) if device == "host" else [device]
            out["at_risk"] = [w for d in devices for w in consumers_json(self.users, d)]
        return out


# How long check waits for netlink's first address dump. A failure ends the wait at once; only a slow
# success waits (under emulation in the kernel lab, importing pyroute2 and dumping took over 5 s, and
# a 5 s wait quietly narrowed check to the GID tables). A healthy host answers in ~0.1 s.
NETLINK_START_S = 30.0


def _netlink_addresses(notes: list[str]) -> dict[str, tuple[AddressLike, ...]] | None:
    try:
        from rnic_exporter.sources.netlink import NetlinkWatcher

        watcher = NetlinkWatcher()
        watcher.start(timeout=NETLINK_START_S)
    except Exception as exc:  # any failure only narrows the check: fall back to the GID tables
        notes.append(f"netlink unavailable ({exc}); addresses judged from the GID tables")
        return None
    try:
        if not watcher.healthy:
            notes.append("netlink unavailable; addresses judged from the GID tables")
            return None
        return dict(watcher.addresses())
    finally:
        watcher.close()


def gather(
    snap: Snapshot, store: StateStore, settings: DetectionSettings, paths: HostPaths, use_netlink: bool = True
) -> tuple[HostConditions, list[str]]:
    notes: list[str] = []
    loaded = store.load()
    if loaded.problem is not None:
        notes.append(f"state: {loaded.problem}")
    elif store.path is None:
        notes.append("no inventory (--state.dir empty): missing devices are judged only against --expected-devices")
    elif not store.path.exists():
        notes.append(
            f"no inventory (state file {store.path} not found): missing devices are judged only against "
            "--expected-devices"
        )
    else:
        notes.append(f"inventory: judged against the state file {store.path} ({len(loaded.state.devices)} device(s))")
    addresses = _netlink_addresses(notes) if use_netlink else None
    ethtool = EthtoolReader()
    try:
        inputs = gather_inputs(snap, host_risks(paths), addresses, ethtool.advertised)
    finally:
        ethtool.close()
    cur = judge(
        snap, loaded.state, settings, addresses=inputs.addresses, advertised=inputs.advertised, risks=inputs.risks
    )
    return cur, notes


def run_check(
    sysfs: Path,
    state_dir: Path | None,
    settings: DetectionSettings,
    reader_settings: ReaderSettings,
    paths: HostPaths,
    use_netlink: bool = True,
    root: SysfsRoot | None = None,
    users: ConsumerScan | None = None,
    state_dir_given: bool = True,
    wire: WireReader | None = None,
) -> CheckReport:
    """Raises ConfigError for an unusable sysfs path (exit 2). `root`: read through this one instead
    (a test's errno overlay). `state_dir_given`: --state.dir was given, not its default; the default
    inventory is this host's, so it judges only this host's sysfs. `wire`: the reader of the RoCE
    netdevs' optics and link state (None: the real one over ethtool netlink), read once."""
    inventory_note = None
    if not state_dir_given and sysfs != HOST_SYSFS:
        inventory_note = (
            f"--path.sysfs {sysfs} is not {HOST_SYSFS}: not judged against this host's inventory "
            f"({state_dir}); give --state.dir to judge against one"
        )
        state_dir = None
    reader = HostReader(root or SysfsRoot(sysfs), reader_settings)
    with contextlib.closing(reader):
        snap = reader.read(full_gid_tables=True)
        samples = sample_counters(reader, settings.link_health.check_window_seconds)
    excluded = reader_settings.excludes_all(snap, sysfs)
    if excluded is not None:  # nothing would be checked: "OK: 0 devices" would be a lie
        raise ConfigError(excluded)
    store = StateStore(state_dir, read_only=True)  # a diagnosis writes nothing, not even a rename
    cur, notes = gather(snap, store, settings, paths, use_netlink)
    if inventory_note is not None:
        notes[:] = [inventory_note, *(n for n in notes if not n.startswith("no inventory"))]
    notes.extend(f"NCCL: {note}" for note in settings.nccl.notes)
    if any(view.nccl_pick is not None for view in cur.ports.values()):
        notes.append(VERSIONS_NOTE)
    if not snap.devices and not cur.devices:
        notes.append(f"no RDMA devices under {sysfs}/class/infiniband")
    notes.extend(f"not provided by the driver, not checked: {line}" for line in summarize(snap.unsupported))
    if users is not None and not users.complete:
        notes.append(
            f"the consumer scan was incomplete ({users.skipped} process(es) not inspectable): "
            "a problem may put more workloads at risk than it names"
        )
    notes.append(samples.note)
    found = [
        *find_problems(cur, snap.errors, settings.nccl, settings.nccl_gid_index_source, str(store.path or "")),
        *aer_problems(snap),
        *link_health_problems(samples, settings, cur, users),
    ]
    netdevs, readings = read_wire(snap, wire)
    problems = sorted(
        [*with_link_down_reasons(found, readings), *optic_problems(netdevs, readings)],
        key=lambda p: (SEVERITY_ORDER[p.severity], p.where, p.code),
    )
    return CheckReport(tuple(problems), tuple(notes), len(snap.devices), len(snap.ports), users)


# `check` needs a rate of the error counters: it reads them twice, this far apart (the config file's
# [link_health] check_window_seconds, 3 s by default), instead of trusting the daemon's history, which
# may be missing or stale on a node that just booted. Tests replace the wait (`tests/conftest.py`).
def wait_between_samples(seconds: float) -> None:
    time.sleep(seconds)


clock = time.monotonic  # what times the two reads (tests move it with their wait)


@dataclass(frozen=True, slots=True)
class CounterSamples:
    first: Snapshot
    second: Snapshot
    first_at: float  # monotonic midpoints of the two reads: the counters' own time
    second_at: float
    window_s: float  # as configured; the judged window is second_at - first_at

    @property
    def note(self) -> str:
        return (
            f"link health: counters read twice, {self.window_s:g} s apart ([link_health] check_window_seconds); "
            "slower trends are the daemon's alerts"
        )


def sample_counters(reader: HostReader, window_s: float, wait: Callable[[float], None] | None = None) -> CounterSamples:
    """Two counter reads `window_s` apart, each timed at its midpoint."""
    started = clock()
    first = reader.read()
    first_at = (started + clock()) / 2
    (wait or wait_between_samples)(window_s)
    started = clock()
    second = reader.read()
    return CounterSamples(first, second, first_at, (started + clock()) / 2, window_s)


def link_health_problems(
    samples: CounterSamples, settings: DetectionSettings, cur: HostConditions, users: ConsumerScan | None
) -> list[Problem]:
    """The ports whose error counters rose too fast between the two reads (detect/link_health.py)."""
    consumers = None if users is None else {d: tuple(workload_names(users.workloads(d))) for d in users.by_device}
    healths = judge_host(
        samples.first,
        samples.second,
        settings.link_health,
        prev_at=samples.first_at,
        cur_at=samples.second_at,
        conditions=cur,
        consumers=consumers,
    )
    return health_problems(healths)


def read_wire(
    snap: Snapshot, reader: WireReader | None = None
) -> tuple[dict[str, tuple[str, str, str]], dict[str, NetdevWire]]:
    """One read of the RoCE netdevs' wire (module, link state, FEC, pause): their labels and readings.
    A netdev whose driver lacks an operation reads as unsupported, and a failed read as nothing: both
    only leave its lines out (a false alarm would drain a healthy node)."""
    from rnic_exporter.daemon.wire_watch import roce_netdevs

    netdevs = roce_netdevs(snap)
    if not netdevs:
        return netdevs, {}
    if reader is None:
        from rnic_exporter.sources.ethtool_netlink import EthtoolNetlink
        from rnic_exporter.sources.wire import WireReader

        reader = WireReader(EthtoolNetlink())
    try:
        return netdevs, reader.poll(netdevs)
    except Exception:  # a reader bug narrows the check, never fails it
        return netdevs, {}
    finally:
        reader.ethtool.close()


_BEYOND: dict[Level, tuple[Severity, str]] = {
    Level.ALARM_HIGH: ("warning", "above its high alarm"),
    Level.ALARM_LOW: ("warning", "below its low alarm"),
    Level.WARNING_HIGH: ("info", "above its high warning"),
    Level.WARNING_LOW: ("info", "below its low warning"),
}
_MONITOR_TEXT = {
    "temperature": ("temperature", "{:.1f} °C", 1.0),
    "supply_voltage": ("supply voltage", "{:.3f} V", 1.0),
    "rx_power": ("Rx power", "{:.3f} mW", 1e3),
    "tx_power": ("Tx power", "{:.3f} mW", 1e3),
    "tx_bias": ("laser bias", "{:.2f} mA", 1e3),
}


def optic_problems(netdevs: Mapping[str, tuple[str, str, str]], wire: Mapping[str, NetdevWire]) -> list[Problem]:
    """A line per module value beyond the module's own thresholds: warning past an alarm limit (the
    module says it is out of its operating range), info past a warning limit (it still works; a job
    prologue at --fail-on warning must not drain the node for it)."""
    out = []
    for name, reading in sorted(wire.items()):
        module = reading.module
        if not isinstance(module, ModuleReading) or name not in netdevs:
            continue
        device, port, netdev = netdevs[name]
        for monitor, lane, mon in module.monitors():
            beyond = _BEYOND.get(mon.level)
            if beyond is None or mon.thresholds is None:
                continue
            severity, how = beyond
            label, fmt, scale = _MONITOR_TEXT[monitor]
            limit = {
                Level.ALARM_HIGH: mon.thresholds.high_alarm,
                Level.ALARM_LOW: mon.thresholds.low_alarm,
                Level.WARNING_HIGH: mon.thresholds.high_warning,
                Level.WARNING_LOW: mon.thresholds.low_warning,
            }[mon.level]
            where_lane = "" if lane is None else f" lane {lane}"
            out.append(
                Problem(
                    f"optic_{monitor}_{mon.level.value}",
                    severity,
                    f"{device} port {port} ({netdev})",
                    f"module {label}{where_lane} {fmt.format(mon.value * scale)} is {how} threshold "
                    f"{fmt.format(limit * scale)} ({module.identity.vendor} {module.identity.part_number})",
                    "the optic or its fibre is degrading: the link may renegotiate to a lower speed or drop",
                    f"clean the connectors, check the fibre bends, or replace the module (ethtool -m {netdev})",
                    mon.level.value,
                    device=device,
                    port=int(port),
                    netdev=netdev,
                )
            )
    return out


def with_link_down_reasons(problems: list[Problem], wire: Mapping[str, NetdevWire]) -> list[Problem]:
    """Each port-down problem of a RoCE netdev with why the driver says its link is down (ethtool
    extended link state), where it says."""
    out = []
    for problem in problems:
        reading = wire.get(problem.netdev or "") if problem.code == "port_down" else None
        state = reading.link_state if reading is not None else None
        if isinstance(state, LinkState) and state.link_up is False and state.ext_state is not None:
            why = state.ext_state + (f"/{state.ext_substate}" if state.ext_substate else "")
            out.append(replace(problem, what=f"{problem.what}; link down: {why} (ethtool extended link state)"))
        else:
            out.append(problem)
    return out


def format_report(report: CheckReport, fail_on: str = "warning") -> str:
    lines = []
    if report.healthy:
        lines.append(f"OK: {report.devices} RDMA device(s), {report.ports} port(s), no problems found.")
    else:
        counts = {s: sum(1 for p in report.problems if p.severity == s) for s in ("critical", "warning", "info")}
        summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        verdict = "PROBLEMS" if report.failed(fail_on) else f"PASSED (--fail-on {fail_on}), PROBLEMS"
        lines.append(
            f"{verdict}: {len(report.problems)} ({summary}) on {report.devices} RDMA device(s), {report.ports} port(s)."
        )
        for problem in report.problems:
            lines += [
                "",
                f"[{problem.severity.upper()}] {problem.where}: {problem.what}",
                f"  means: {problem.meaning}",
                f"  do:    {problem.fix}",
            ]
            if report.users is not None:
                names = workload_names(report.at_risk(problem))
                lines.append(f"  hits:  {', '.join(names) if names else 'no running workload uses it'}")
    for note in report.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)
