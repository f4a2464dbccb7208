"""The soak behind bench/soak.py (an hour) and tests/e2e/test_soak.py (minutes): a real `rnic-exporter serve`
under a host that keeps failing. What it injects and checks: bench/soak.py's help.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from rnic_exporter.catalog import events as ev
from rnic_exporter.detect.settings import FlapSettings
from rnic_exporter.model.host import ROCE_V2
from rnic_exporter.sim import SimHost
from tests.support.processes import free_port
from tests.support.serve import Ours, get

if TYPE_CHECKING:
    from tests.support.faultfs import FaultyMount


LINK_HEALTH = frozenset({"rnic.port.degrading", "rnic.port.recovered"})


def derived(event: str) -> bool:
    """Follows from what was injected by rules of its own (NCCL's GID pick, the host's address manager,
    link health judged on its own 60 s windows of the counters the steps move: a port down counts
    `link_downed`, as the kernel's PMA does)."""
    return event.startswith("rnic.nccl.") or event == ev.RISK_ADDRESS_LOSS.name or event in LINK_HEALTH


STEPS = (
    "flap_down",
    "flap_up",
    "hold_and_down",
    "remove_address",
    "up_again",
    "add_address",
    "release",
    "rate_drop",
    "rate_back",
    "pcie_drop",
    "pcie_back",
    "remove",
    "restore",
)
START_STEPS = (0, 7, 9, 11)  # where a device may start: the port up, the address in place
Key = tuple[str, str, str]  # (event, device, detail): detail is the link or the address, or ""


@dataclass(frozen=True, slots=True)
class SoakConfig:
    seconds: float = 3600.0
    devices: int = 16
    gid_slots: int = 255
    poll_s: float = 2.0
    sample_s: float = 60.0
    warmup_s: float = 300.0
    hung_every_s: float = 0.0  # 0: no hung reads
    hung_block_s: float = 20.0
    ours: Ours = field(default_factory=Ours)
    seed: int = 1
    # Default 70 polls: a GID change no netlink event announces (the simulator's) is found by a sweep
    # of the tables, which may take up to 60 passes.
    step_timeout_s: float | None = None
    log_copy: Path | None = None  # every line the exporter logs, appended here
    # The environment that makes the daemon trace its memory from inside (bench/memtrace.py's install), given a
    # directory for its sitecustomize, the sample period and the snapshot period.
    tracer: Callable[[Path, float, float], dict[str, str]] | None = None

    @property
    def timeout_s(self) -> float:
        base = self.step_timeout_s or max(70 * self.poll_s, 60.0)
        return base + (self.hung_block_s if self.hung_every_s else 0.0)


# RSS still rising faster than this over the last half of a soak (after warm-up) is growth. An hour's
# run resolves about 0.5 MB/h (RSS moves by a few hundred kB between samples); a leak of one object
# per poll (2 s) of a few hundred bytes is ~0.5 MB/h, of one per event more.
RSS_STILL_RISING_MB_PER_H = 1.0


def _slope_mb_per_h(samples: list[Sample]) -> float:
    if len(samples) < 3 or samples[-1].at_s == samples[0].at_s:
        return float("nan")
    fit = statistics.linear_regression([s.at_s / 3600 for s in samples], [s.rss_mb for s in samples])
    return fit.slope


@dataclass(frozen=True, slots=True)
class Sample:
    at_s: float
    rss_mb: float
    fds: int
    threads: int


@dataclass
class Result:
    config: SoakConfig
    samples: list[Sample] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    expected: Counter[Key] = field(default_factory=Counter)
    seen: Counter[Key] = field(default_factory=Counter)
    steps: Counter[str] = field(default_factory=Counter)
    step_latency_s: dict[str, list[float]] = field(default_factory=dict)
    derived: Counter[str] = field(default_factory=Counter)
    other_log_lines: Counter[str] = field(default_factory=Counter)
    hung_reads: int = 0
    hung_windows: list[tuple[float, float, str]] = field(default_factory=list)  # (from, to, device)
    # steps of other devices in flight while a read hung: isolated reads keep these near a poll interval
    beside_hung_s: list[float] = field(default_factory=list)
    late_syncs: int = 0  # injections put off because the poll that had ended was no longer fresh
    pause_max_s: float = 0.0  # longest SIGSTOP pause of the exporter for an injection
    stop_s: float = float("nan")
    exit_code: int | None = None

    @property
    def rss_slopes(self) -> tuple[float, float]:
        """RSS growth in MB per hour, least squares over the first and the last half of the samples after
        warm-up (nan when a half has fewer than three samples)."""
        after = [s for s in self.samples if s.at_s >= self.config.warmup_s]
        half = len(after) // 2
        return _slope_mb_per_h(after[:half]), _slope_mb_per_h(after[half:])

    @property
    def growth(self) -> dict[str, tuple[float, float, bool]]:
        """Per resource over the samples after warm-up, split in thirds: (early, late, grew). RSS: the
        medians of the first and last third, growth when the late one is more than max(1.5 MB, 3%) above
        the early one and RSS is still rising over the last half of the samples (least squares, more than
        RSS_STILL_RISING_MB_PER_H; a curve that has levelled off had a longer warm-up than assumed, not a
        leak; too few samples for a fit: the medians alone decide). Descriptors and threads: the early
        maximum, the late minimum."""
        after = [s for s in self.samples if s.at_s >= self.config.warmup_s]
        if len(after) < 3:
            return {}
        third = max(1, len(after) // 3)
        early, late = after[:third], after[-third:]
        out = {}
        rss_early, rss_late = statistics.median(s.rss_mb for s in early), statistics.median(s.rss_mb for s in late)
        late_slope = self.rss_slopes[1]
        still_rising = math.isnan(late_slope) or late_slope > RSS_STILL_RISING_MB_PER_H  # nan: no fit
        out["rss_mb"] = (rss_early, rss_late, rss_late - rss_early > max(1.5, 0.03 * rss_early) and still_rising)
        # Descriptors and threads move by a device's worth as devices go and come (an exporter may open
        # a device's files lazily): a leak lifts the whole late third above the whole early one.
        for name, slack in (("fds", 2), ("threads", 0)):
            a = max(getattr(s, name) for s in early)
            b = min(getattr(s, name) for s in late)
            out[name] = (float(a), float(b), b > a + slack)
        return out

    @property
    def ok(self) -> bool:
        return (
            not self.failures
            and bool(self.growth)
            and not any(g[2] for g in self.growth.values())
            and self.exit_code == 0
        )


class EventLog:
    """Reads the daemon's JSON log lines as they come; counts events by (event, device, detail)."""

    def __init__(self, stream: IO[bytes], on_event: Callable[[Key], None], copy: Path | None = None) -> None:
        self.cond = threading.Condition()
        self.other: Counter[str] = Counter()
        self.tail: list[str] = []
        self.poll_lines = 0  # the debug line "poll" that ends each poll
        self.event_lines = 0
        self._on_event = on_event
        self._copy = open(copy, "ab") if copy is not None else None  # noqa: SIM115 (closed by the reader)
        self._thread = threading.Thread(target=self._read, args=(stream,), name="event-log", daemon=True)
        self._thread.start()

    def _read(self, stream: IO[bytes]) -> None:
        for raw in stream:
            if self._copy is not None:
                self._copy.write(raw)
                self._copy.flush()
            line = raw.decode(errors="replace").strip()
            try:
                obj = json.loads(line)
            except ValueError:
                obj = None
            with self.cond:
                if isinstance(obj, dict) and "event" in obj:
                    detail = str(obj.get("link") or obj.get("address") or "")
                    self._on_event((str(obj["event"]), str(obj.get("device", "")), detail))
                    self.event_lines += 1
                elif isinstance(obj, dict) and obj.get("msg") == "poll":
                    self.poll_lines += 1
                elif isinstance(obj, dict) and obj.get("level") == "debug":
                    pass  # request lines and the like
                else:
                    msg = obj.get("msg", line) if isinstance(obj, dict) else line
                    level = obj.get("level", "?") if isinstance(obj, dict) else "raw"
                    self.other[f"{level}: {str(msg)[:80]}"] += 1
                    self.tail = [*self.tail[-20:], line]
                self.cond.notify_all()
        if self._copy is not None:
            self._copy.close()

    @property
    def ticks(self) -> int:
        """Moves when a poll has ended: its "poll" line, or where there is none its event lines (a poll
        logs its events once its reads are done)."""
        return self.poll_lines or self.event_lines

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def gid_view(host: SimHost, name: str) -> tuple[tuple[str, str, str | None] | None, ...]:
    table = host.device(name).gid_table
    return tuple(None if (s := table.visible(i)) is None else (s.gid, s.type, s.netdev) for i in range(table.size))


@dataclass
class DeviceRun:
    """One RNIC's walk through STEPS: what each step must make the exporter say."""

    host: SimHost
    name: str
    step: int
    flap: FlapSettings
    transitions: list[float] = field(default_factory=list)  # this registration's observed up/down times
    old_index: int | None = None
    moved_address: str = ""
    pending: Counter[Key] = field(default_factory=Counter)  # to be seen for the step in flight
    started: float = 0.0

    @property
    def address(self) -> str:
        return self.host.device(self.name).addresses[0] if self.host.device(self.name).addresses else "10.0.0.1"

    @property
    def removed(self) -> bool:
        return self.name in self.host.removed

    def apply(self, now: float) -> Counter[Key]:
        """Make the current step's change; returns the events it must cause."""
        host, name, step = self.host, self.name, STEPS[self.step]
        want: Counter[Key] = Counter()
        before = gid_view(host, name)

        def port(up: bool) -> None:
            host.set_port_up(name, up)
            want[(ev.PORT_UP.name if up else ev.PORT_DOWN.name, name, "")] += 1
            # The exporter calls a port flapping on the Nth transition within its window, once
            # per registration (a device that goes away takes its flap history with it).
            self.transitions.append(now)
            recent = [t for t in self.transitions if now - t <= self.flap.window_s]
            if len(self.transitions) == self.flap.transitions and len(recent) == self.flap.transitions:
                want[(ev.PORT_FLAPPING.name, name, "")] += 1

        if step == "flap_down":
            port(False)
        elif step in ("flap_up", "up_again"):
            port(True)
        elif step == "hold_and_down":
            self.old_index = host.device(name).gid_table.index_of(self.address, ROCE_V2)
            host.hold_gid(name, self.address)
            port(False)
        elif step == "remove_address":
            self.moved_address = self.address
            host.remove_address(name, self.moved_address)
            want[(ev.ADDRESS_LOST.name, name, self.moved_address)] += 1
        elif step == "add_address":
            host.add_address(name, self.moved_address)
            want[(ev.ADDRESS_RESTORED.name, name, self.moved_address)] += 1
            if host.device(name).gid_table.index_of(self.moved_address, ROCE_V2) != self.old_index:
                want[(ev.GID_ADDRESS_MOVED.name, name, self.moved_address)] += 1
        elif step == "release":
            host.release_gids(name)
        elif step == "rate_drop":
            host.set_speed(name, 200)
            want.update({(ev.LINK_BELOW_RATED.name, name, "port"): 1, (ev.LINK_BELOW_RATED.name, name, "netdev"): 1})
        elif step == "rate_back":
            host.set_speed(name, 400)
            want.update({(ev.LINK_RESTORED.name, name, "port"): 1, (ev.LINK_RESTORED.name, name, "netdev"): 1})
        elif step == "pcie_drop":
            host.set_pcie(name, 16.0, 8)
            want[(ev.LINK_BELOW_RATED.name, name, "pcie")] += 1
        elif step == "pcie_back":
            host.set_pcie(name, 32.0, 16)
            want[(ev.LINK_RESTORED.name, name, "pcie")] += 1
        elif step == "remove":
            host.remove_device(name)
            want[(ev.DEVICE_DISAPPEARED.name, name, "")] += 1
            self.transitions = []
        elif step == "restore":
            host.restore_device(name)
            want[(ev.DEVICE_REAPPEARED.name, name, "")] += 1
        if step not in ("remove", "restore") and gid_view(host, name) != before:
            want[(ev.GID_TABLE_CHANGED.name, name, "")] += 1
        return want

    def advance(self) -> None:
        self.step = (self.step + 1) % len(STEPS)
        self.pending = Counter()


class Soak:
    def __init__(self, config: SoakConfig, work: Path, out: Callable[[str], None] = print) -> None:
        self.config = config
        self.work = work
        self.out = out
        self.result = Result(config)
        self.derived_by_device: Counter[tuple[str, str]] = Counter()
        self.rng = random.Random(config.seed)
        self.lock = threading.Lock()
        self.host = SimHost.build(work / "sys", roce=config.devices, gid_table_size=config.gid_slots)
        self.runs = {
            name: DeviceRun(self.host, name, START_STEPS[i % len(START_STEPS)], FlapSettings())
            for i, name in enumerate(sorted(self.host.devices))
        }
        for name in self.host.devices:
            self.result.expected[(ev.DEVICE_DISCOVERED.name, name, "")] += 1

    # -- the event log -----------------------------------------------------------------------

    def on_event(self, key: Key) -> None:
        """Called by the log reader with its condition held."""
        r = self.result
        if derived(key[0]):
            r.derived[key[0]] += 1
            self.derived_by_device[(key[0], key[1])] += 1
            return
        r.seen[key] += 1
        if r.seen[key] > r.expected[key]:
            run = self.runs.get(key[1])
            where = f" (device at step {STEPS[run.step]})" if run else ""
            self._fail(
                f"{time.monotonic() - self.t0:7.1f}s: {key} seen {r.seen[key]} times, expected {r.expected[key]}{where}"
            )

    def _fail(self, text: str) -> None:
        self.result.failures.append(text)
        self.out(f"  FAIL {text}")

    # -- the run -----------------------------------------------------------------------------

    def run(self) -> Result:
        c = self.config
        with contextlib.ExitStack() as stack:
            sysfs = self.host.root
            mount: FaultyMount | None = None
            if c.hung_every_s:
                from tests.support.faultfs import mount_faultfs

                mount = stack.enter_context(mount_faultfs(self.host.root, self.work / "mnt"))
                sysfs = mount.mount
            port = free_port()
            self.url = f"http://127.0.0.1:{port}/metrics"
            args = c.ours.args(
                sysfs,
                port,
                self.work / "state",
                "--poll.interval",
                str(c.poll_s),
                "--log.format",
                "json",
                "--log.level",
                "debug",
            )
            proc = subprocess.Popen(
                args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=self._env(), cwd=c.ours.cwd()
            )
            stack.callback(self._stop, proc)
            assert proc.stderr is not None
            self.t0 = time.monotonic()
            self.log = EventLog(proc.stderr, self.on_event, c.log_copy)
            self._wait_started(proc)
            self._loop(proc, mount)
            self._settle()
            self._check_metric("end")
        return self.result

    def _env(self) -> dict[str, str]:
        c = self.config
        env = c.ours.env()
        if c.tracer is not None:
            site = self.work / "memtrace-site"
            env.update(c.tracer(site, c.sample_s, max(c.sample_s, c.seconds / 4)))
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
        return env

    def _wait_started(self, proc: subprocess.Popen[bytes]) -> None:
        discovered = [k for k in self.result.expected if k[0] == ev.DEVICE_DISCOVERED.name]
        deadline = time.monotonic() + 60
        with self.log.cond:
            while not all(self.result.seen[k] >= 1 for k in discovered):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(
                        "the exporter did not report its devices within 60 s:\n" + "\n".join(self.log.tail)
                    )
                self.log.cond.wait(0.5)

    def _inject(self, run: DeviceRun, now: float) -> None:
        """The run's next step that causes events (a step that changes nothing visible is passed)."""
        for _ in STEPS:
            want = run.apply(now)
            self.result.steps[STEPS[run.step]] += 1
            if want:
                self.result.expected.update(want)
                run.pending, run.started = want, now
                return
            run.advance()

    def _loop(self, proc: subprocess.Popen[bytes], mount: FaultyMount | None) -> None:
        c, r = self.config, self.result
        end = self.t0 + c.seconds
        next_sample = self.t0 + c.sample_s
        next_hung = self.t0 + c.hung_every_s if c.hung_every_s else float("inf")
        sampling = False
        last_tick, last_tick_at = -1, time.monotonic()
        with self.log.cond:
            while True:
                now = time.monotonic()
                if proc.poll() is not None:
                    r.failures.append(f"the exporter exited with {proc.returncode}")
                    return
                sampling = sampling or now >= next_sample
                if now >= next_hung and mount is not None:
                    self._hang_one(mount)
                    next_hung = now + c.hung_every_s
                # Inject right after a poll: its reads are done, the next one is a poll interval away.
                # Never without that sign: a poll stalled on a hung read may be halfway through.
                synced = self.log.ticks != last_tick
                if self.log.ticks != last_tick:
                    last_tick, last_tick_at = self.log.ticks, now
                busy = False
                ready: list[DeviceRun] = []
                for run in self.runs.values():
                    if run.pending:
                        if all(r.seen[k] >= r.expected[k] for k in run.pending):
                            r.step_latency_s.setdefault(STEPS[run.step], []).append(now - run.started)
                            if any(a < now and run.started < b and d != run.name for a, b, d in r.hung_windows):
                                r.beside_hung_s.append(now - run.started)
                            run.advance()
                        elif now - run.started > c.timeout_s:
                            missing = {k: r.expected[k] - r.seen[k] for k in run.pending if r.seen[k] < r.expected[k]}
                            self._fail(
                                f"{now - self.t0:7.1f}s: step {STEPS[run.step]} of {run.name}: not "
                                f"seen within {c.timeout_s:.0f} s: {missing}"
                            )
                            for k in missing:  # carry on from what the exporter says
                                r.expected[k] = r.seen[k]
                            run.advance()
                        else:
                            busy = True
                            continue
                    if now >= end or not synced or (sampling and STEPS[run.step] == "remove"):
                        continue  # removals wait for the sample: every device registered when sampled
                    ready.append(run)
                    busy = True
                if ready:
                    self._inject_paused(proc, ready, last_tick_at)
                in_flight = any(
                    run.removed or (run.pending and STEPS[run.step] in ("remove", "restore"))
                    for run in self.runs.values()
                )
                if sampling and not in_flight:
                    self._sample(proc)
                    next_sample += c.sample_s
                    sampling = False
                    continue
                if now >= end and not busy:
                    return
                self.log.cond.wait(0.25)

    def _inject_paused(self, proc: subprocess.Popen[bytes], runs: list[DeviceRun], tick_at: float) -> None:
        """Inject with the exporter stopped (SIGSTOP), so that however long the writes take on a loaded
        machine, no poll reads half of them; and only while the poll that just ended is fresh (a poll
        that started meanwhile would be stopped halfway and read the rest after)."""
        proc.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            if started - tick_at > 0.5 * self.config.poll_s:
                self.result.late_syncs += 1
                return  # the next poll may have begun: wait for it to end
            for run in runs:
                self._inject(run, started)
            self.result.pause_max_s = max(self.result.pause_max_s, time.monotonic() - started)
        finally:
            proc.send_signal(signal.SIGCONT)

    def _hang_one(self, mount: FaultyMount) -> None:
        present = [name for name in sorted(self.host.devices) if name not in self.host.removed]
        if present:
            name = self.rng.choice(present)
            mount.block(f"class/infiniband/{name}/ports/1/counters/port_rcv_data", seconds=self.config.hung_block_s)
            self.result.hung_reads += 1
            now = time.monotonic()
            self.result.hung_windows.append((now, now + self.config.hung_block_s, name))

    def _sample(self, proc: subprocess.Popen[bytes]) -> None:
        """Resources of the daemon (called with the log's condition held: the log reader waits)."""
        pid = proc.pid
        status = Path(f"/proc/{pid}/status").read_text()
        rss = int(re.search(r"VmRSS:\s+(\d+)", status)[1]) / 1024  # type: ignore[index]
        threads = int(re.search(r"Threads:\s+(\d+)", status)[1])  # type: ignore[index]
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        s = Sample(time.monotonic() - self.t0, rss, fds, threads)
        self.result.samples.append(s)
        self.out(
            f"  {s.at_s:7.0f}s  rss {s.rss_mb:6.1f} MB  fds {s.fds:5d}  threads {s.threads:3d}  "
            f"steps {sum(self.result.steps.values()):6d}  events {sum(self.result.seen.values()):6d}  "
            f"failures {len(self.result.failures)}  load {Path('/proc/loadavg').read_text().split()[0]}"
        )
        self._check_metric(f"sample at {s.at_s:.0f}s")

    def _logged(self) -> Counter[tuple[str, str]]:
        logged: Counter[tuple[str, str]] = Counter()
        for (event, device, _), n in self.result.seen.items():
            logged[(event, device)] += n
        for (event, device), n in self.derived_by_device.items():
            logged[(event, device)] += n
        return logged

    def _metric(self) -> Counter[tuple[str, str]]:
        body = get(self.url).decode()
        metric: Counter[tuple[str, str]] = Counter()
        for m in re.finditer(r"^rnic_events_total\{([^}]*)\} ([0-9.e+]+)$", body, re.M):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m[1]))
            metric[(labels.get("event", ""), labels.get("device", ""))] += int(float(m[2]))
        return metric

    def _check_metric(self, when: str) -> None:
        """rnic_events_total counts what the log said, event by event: every logged event is counted
        (the log before the scrape <= the metric) and every counted event is logged (the metric <= the log
        once the lines in the pipe are read). A poll logs its events just before it publishes its metrics,
        so a scrape in between is retried. Called with the log's condition held."""
        present = {n for n in self.host.devices if n not in self.host.removed}
        wrong: list[str] = []
        for _ in range(5):
            before = self._logged()
            metric = self._metric()
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not metric <= self._logged():
                self.log.cond.wait(0.1)
            after = self._logged()
            wrong = [
                f"{when}: rnic_events_total{key} = {metric[key]}, log lines {before[key]} before the scrape "
                f"and {after[key]} after"
                for key in sorted(set(metric) | set(before))
                if key[1] in present and not before[key] <= metric[key] <= after[key]
            ]
            if not wrong:
                return
            self.log.cond.wait(0.2)
        self.result.failures.extend(wrong)

    def _settle(self) -> None:
        """No more injections: every pending step seen (or timed out), then two more polls for strays."""
        with self.log.cond:
            deadline = time.monotonic() + 2 * self.config.poll_s + 1
            while time.monotonic() < deadline:
                self.log.cond.wait(max(0.0, deadline - time.monotonic()))
        for key, want in self.result.expected.items():
            if self.result.seen[key] != want and not any(f"{key}" in f for f in self.result.failures):
                self.result.failures.append(f"end: {key} seen {self.result.seen[key]}, expected {want}")
        self.result.other_log_lines = self.log.other

    def _stop(self, proc: subprocess.Popen[bytes]) -> None:
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            self.result.exit_code = proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            self.result.failures.append("SIGTERM did not stop the exporter within 15 s")
        self.result.stop_s = time.monotonic() - started
        self.log.join(5)


def report(r: Result, out: Callable[[str], None] = print) -> None:
    c = r.config
    hung = f"every {c.hung_every_s:g} s for {c.hung_block_s:g} s" if c.hung_every_s else "off"
    out(f"\n## soak: {c.seconds / 60:.1f} min, {c.devices} RNICs, poll {c.poll_s:g} s, hung reads {hung}")
    out(f"steps injected: {sum(r.steps.values())} ({', '.join(f'{k} {v}' for k, v in sorted(r.steps.items()))})")
    by_event: Counter[str] = Counter()
    for (event, _, _), n in r.seen.items():
        by_event[event] += n
    out(
        f"events seen: {sum(r.seen.values())} of {sum(r.expected.values())} expected "
        f"({', '.join(f'{k} {v}' for k, v in sorted(by_event.items()))}); derived: {dict(r.derived)}"
    )
    for step, latencies in sorted(r.step_latency_s.items()):
        lat = sorted(latencies)
        out(f"  {step:<15} seen after p50 {lat[len(lat) // 2]:6.2f} s, max {lat[-1]:6.2f} s ({len(lat)})")
    if r.hung_reads:
        beside = sorted(r.beside_hung_s) or [float("nan")]
        out(
            f"hung reads injected: {r.hung_reads}; steps of other devices in flight meanwhile seen after "
            f"p50 {beside[len(beside) // 2]:.2f} s, max {beside[-1]:.2f} s ({len(r.beside_hung_s)})"
        )
    out(
        f"injections put off for a stale poll: {r.late_syncs}; longest pause of the exporter for one: "
        f"{r.pause_max_s * 1000:.0f} ms"
    )
    for line, n in r.other_log_lines.most_common(8):
        out(f"  log x{n}: {line}")
    out("resources after warm-up (RSS: median of the early -> late third; fds, threads: early max -> late min):")
    for name, (a, b, grew) in r.growth.items():
        out(f"  {name:<8} {a:8.1f} -> {b:8.1f}  {'GREW' if grew else 'flat'}")
    first, last = r.rss_slopes
    out(
        f"  RSS trend (least squares, MB/h): first half after warm-up {first:+.2f}, last half {last:+.2f} "
        f"(growth: still rising over {RSS_STILL_RISING_MB_PER_H:g} MB/h in the last half, and a rise over "
        "max(1.5 MB, 3%) between the thirds)"
    )
    out(f"SIGTERM -> exit {r.exit_code} in {r.stop_s:.2f} s")
    for failure in r.failures[:30]:
        out(f"FAIL {failure}")
    if len(r.failures) > 30:
        out(f"... {len(r.failures) - 30} more failures")
    out(
        f"verdict: {'PASS' if r.ok else 'FAIL'} (exactly once: {'yes' if not r.failures else 'NO'}; "
        f"growth: {'none' if r.growth and not any(g[2] for g in r.growth.values()) else 'YES or too few samples'})"
    )


@contextlib.contextmanager
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="rnic-soak-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_soak(config: SoakConfig, out: Callable[[str], None] = print, work: Path | None = None) -> Result:
    """The soak in `work` (a fresh temporary directory, removed after, when None)."""
    if work is not None:
        return Soak(config, work, out).run()
    with workdir() as tmp:
        return Soak(config, tmp, out).run()
