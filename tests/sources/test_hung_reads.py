"""A read that hangs (a sick firmware's command timeout) stalls only its own device; counters are
read per scrape; a restricted function's EINVAL counters are backed off.

The daemon runs over the faulty FUSE filesystem (`tests/support/faultfs.py`), which blocks one
file's reads until released; the reader's off-loop runner is also tested alone over a FIFO (a FIFO
in a simulated tree blocks a read until someone writes it).
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.config.file import reader_settings
from rnic_exporter.daemon.agent import Agent, Announcer, ServeConfig
from rnic_exporter.sim import SimHost
from rnic_exporter.sim.sysfs_root import SimSysfsRoot
from rnic_exporter.sources.counters import BACKOFF_MAX_S
from rnic_exporter.sources.read_thread import Gate, ReadRunner
from rnic_exporter.sources.reader import SWEEP_STAGGER, HostReader, ReaderSettings, run_here
from rnic_exporter.sources.sysfs import SysfsRoot
from tests.support.agents import Announcements
from tests.support.exposition import samples
from tests.support.faultfs import FaultyMount
from tests.support.processes import free_port, http_get, stop_process
from tests.support.wait import wait_for

COUNTER = "class/infiniband/mlx5_0/ports/1/counters/port_rcv_data"


def value(text: str, name: str, **labels: str) -> float | None:
    for (metric, got), v in samples(text).items():
        if metric == name and all((k, want) in got for k, want in labels.items()):
            return v
    return None


def scrape(agent: Agent) -> str:
    body, _ = agent.prometheus.render(None, None)
    return body.decode()


def make_agent(root: SysfsRoot, tmp_path: Path, announcer: Announcer | None = None, **config: object) -> Agent:
    return Agent(
        ServeConfig(sysfs=root.mount, state_dir=tmp_path / "state", ethtool=False, **config),  # type: ignore[arg-type]
        root=root,
        announcer=announcer,
    )


# -- counters per scrape ------------------------------------------------------------------------


def test_a_counter_change_is_visible_in_the_very_next_scrape(sim_host: SimHost, tmp_path: Path) -> None:
    agent = make_agent(SimSysfsRoot(sim_host.root, hold_fds=True, errno_overlay=sim_host.errno_overlay), tmp_path)
    agent._counter_pass.max_age_s = 0.0  # every scrape is "the next one" (Prometheus' come seconds apart)
    try:
        agent.poll_once(full_gid_tables=True)
        before = value(scrape(agent), catalog.PORT_DATA_RECEIVED.name, device="mlx5_1")
        assert before is not None
        sim_host.add_traffic(1.0)  # no poll in between: only the scrape reads counters
        after = value(scrape(agent), catalog.PORT_DATA_RECEIVED.name, device="mlx5_1")
        assert after is not None and after > before
        assert int(after) == 4 * int(
            (sim_host.root / "class/infiniband/mlx5_1/ports/1/counters/port_rcv_data").read_text()
        )
        assert value(scrape(agent), catalog.COUNTERS_STALE.name) == 0
    finally:
        agent.close()


def test_concurrent_scrapes_share_one_counter_pass(sim_host: SimHost, tmp_path: Path) -> None:
    agent = make_agent(SimSysfsRoot(sim_host.root, hold_fds=True, errno_overlay=sim_host.errno_overlay), tmp_path)
    try:
        agent.poll_once(full_gid_tables=True)
        passes = agent._counter_pass.passes
        bodies: list[str] = []
        threads = [threading.Thread(target=lambda: bodies.append(scrape(agent))) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(bodies) == 8 and len(set(bodies)) == 1
        assert agent._counter_pass.passes == passes + 1  # a pass under a second old is reused
    finally:
        agent.close()


def test_a_quiet_poll_reads_only_what_no_event_announces(sim_host: SimHost, tmp_path: Path) -> None:
    """Trusting netlink, a pass over an unchanged host reads only what nothing announces and is
    due: the InfiniBand port's state and rate every pass (each PCIe link and the InfiniBand GID
    table wait for their 30 s and 60 s periods); a RoCE port's netdev, state, rate and GIDs wait for an
    announcement or the safety sweep. Nothing new is handed to the sinks."""
    root = SimSysfsRoot(sim_host.root, hold_fds=True, errno_overlay=sim_host.errno_overlay)
    agent = make_agent(root, tmp_path, announcer=Announcements(trusted=True))
    try:
        agent.poll_once(full_gid_tables=True)
        agent.poll_once()
        published = agent.last
        reads = root.reads
        agent.poll_once()
        assert agent.last is published  # no detection, nothing published
        snap = agent.reader.state_pass(trust_events=True).snapshot
        assert agent.reader.state_pass(trust_events=True).snapshot is snap  # the very same objects
        # The InfiniBand port's state, physical state and rate; the PCIe links and the GID table
        # were read by the first quiet pass and wait for their periods (test_poll_budget.py).
        per_pass = 3
        assert root.reads - reads == 3 * per_pass
        # A RoCE port going down is announced (carrier): polls do not see it before the event...
        sim_host.set_port_up("mlx5_1", False)
        agent.poll_once()
        assert agent.last is published
        agent.poll_once(full_gid_tables={"mlx5_1"}, event=True)  # ... the announcement's burst does
        port = agent.last.port("mlx5_1", 1) if agent.last else None
        assert port is not None and not port.is_up
        # An InfiniBand port's state is announced by nothing: the next poll sees it.
        published = agent.last
        sim_host.set_port_up("mlx5_2", False)
        agent.poll_once()
        assert agent.last is not published
        port = agent.last.port("mlx5_2", 1) if agent.last else None
        assert port is not None and not port.is_up
    finally:
        agent.close()


def test_the_safety_sweep_reads_what_events_announce(sim_host: SimHost, tmp_path: Path) -> None:
    """A change no announcement came for (a GID slot freed when its last user let go) is seen by
    the next safety sweep; a device's sweep comes every safety interval, staggered (or with the
    PCIe link's read before it, up to --poll.pcie-interval early, rather than on a wake-up of its own)."""
    now = [1000.0]
    root = SimSysfsRoot(sim_host.root, hold_fds=True, errno_overlay=sim_host.errno_overlay)
    reader = HostReader(root, clock=lambda: now[0])
    reader.safety_s = 60.0
    first = reader.state_pass(full_gid_tables=True).snapshot
    sim_host.set_port_up("mlx5_0", False)  # no announcement
    now[0] += 29.0  # neither the sweep nor the PCIe link's read (at 30 s) is due
    assert reader.state_pass(trust_events=True).snapshot is first
    now[0] += 60.0 * (1 + 1 / SWEEP_STAGGER)  # mlx5_0 (ordinal 0): no stagger; a sweep is due
    snap = reader.state_pass(trust_events=True).snapshot
    port = snap.port("mlx5_0", 1)
    assert port is not None and not port.is_up


def test_without_trust_every_poll_reads_everything(sim_host: SimHost, tmp_path: Path) -> None:
    """The fallback (netlink off or failing): every attribute at the fast interval, and says so."""
    root = SimSysfsRoot(sim_host.root, hold_fds=True, errno_overlay=sim_host.errno_overlay)
    announcer = Announcements(trusted=False)
    agent = make_agent(root, tmp_path, announcer=announcer)
    try:
        agent.poll_once(full_gid_tables=True)
        sim_host.set_port_up("mlx5_0", False)
        agent.poll_once()
        port = agent.last.port("mlx5_0", 1) if agent.last else None
        assert port is not None and not port.is_up
        assert all(d.fallback for d in agent.reader.freshness())
        announcer.trust = True
        agent.poll_once()
        assert not any(d.fallback for d in agent.reader.freshness())
    finally:
        agent.close()


# -- the runner alone, over a FIFO ------------------------------------------------------------


def test_a_job_blocked_on_one_device_delays_no_other(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    runner = ReadRunner("test", deadline_s=0.2)
    stuck, healthy = Gate("stuck"), Gate("healthy")
    done: list[str] = []

    def blocked() -> None:
        with open(fifo, "rb") as f:  # blocks in open until a writer comes
            f.read()
        done.append("stuck")

    started = time.monotonic()
    assert runner.run([(stuck, blocked), (healthy, lambda: done.append("healthy"))], wait_s=5) is True
    assert time.monotonic() - started < 2 and done == ["healthy"]
    assert stuck.stuck and not healthy.stuck and runner.written_off == 1
    assert runner.run([(stuck, lambda: done.append("again")), (healthy, lambda: done.append("healthy"))], wait_s=5)
    assert done == ["healthy", "healthy"]  # the stuck device is skipped while its read hangs
    with open(fifo, "wb"):  # the hung read returns
        pass
    wait_for(lambda: not stuck.stuck, timeout=5, what="the stuck device to come back")
    assert done[-1] == "stuck"
    runner.close()


# A child that runs passes back to back, each device's job a 2 ms read, and says how many it wrote off.
_PAUSED_CHILD = """
import select, sys, time
from rnic_exporter.sources.read_thread import Gate, ReadRunner
runner = ReadRunner("paused", deadline_s=0.2)
gates = [Gate(f"mlx5_{i}") for i in range(4)]
def read():  # like a pread: 2 ms in the kernel, without the GIL
    time.sleep(0.002)
passes = 0
print("ready", flush=True)
while not select.select([sys.stdin], [], [], 0)[0]:
    runner.run([(g, read) for g in gates], wait_s=5)
    passes += 1
print(runner.written_off, passes, flush=True)
"""


def test_a_process_paused_mid_read_is_not_a_hung_read() -> None:
    """SIGSTOP (a debugger, a frozen cgroup, a VM paused), or a starved CPU, stops the read and its
    waiter alike; on waking, the read's clock says it overran, but it was never stuck: marking the
    device stuck would raise a page that drains a healthy node. The soak, which pauses the exporter
    while it writes a change, saw 10 such alarms an hour."""
    child = subprocess.Popen(
        [sys.executable, "-c", _PAUSED_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline() == "ready\n"
        for _ in range(8):
            child.send_signal(signal.SIGSTOP)  # lands in a job: the passes are nearly all jobs
            time.sleep(0.6)  # the pause under test: 3 deadlines
            child.send_signal(signal.SIGCONT)
            time.sleep(0.3)  # running again, so the next pause lands in a fresh job
        child.stdin.write("stop\n")
        child.stdin.close()
        written_off, passes = map(int, child.stdout.readline().split())
        assert child.wait(timeout=10) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert passes > 100 and written_off == 0


@pytest.mark.parametrize("sim_host", [{"roce": 1, "infiniband": 0, "gid_table_size": 8}], indirect=True)
def test_a_job_of_slow_reads_that_all_answer_is_not_hung(sim_host: SimHost, faulty_sysfs: FaultyMount) -> None:
    """Six reads answering 0.2 s apart take 1.2 s in all, twice the deadline, but none of them is
    hung: a big first read of a loaded host, or a firmware taking its time per counter. Progress
    is marked per batch, and every 32 files of a batch that opens them (a new registration's)."""
    fs = faulty_sysfs
    counters = sorted(os.listdir(sim_host.root / "class/infiniband/mlx5_0/ports/1/counters"))[:6]
    rels = [f"class/infiniband/mlx5_0/ports/1/counters/{name}" for name in counters]
    root = SysfsRoot(fs.mount, hold_fds=True)
    cache = root.cache()
    runner = ReadRunner("test", deadline_s=0.3)
    got: list[object] = []
    try:
        for i, rel in enumerate(rels):
            fs.block(rel, seconds=0.2 * (i + 1))  # each file answers 0.2 s after the one before
        started = time.monotonic()
        assert runner.run([(Gate("mlx5_0"), lambda: got.extend(cache.read_many([r])[0] for r in rels))], wait_s=10)
        took = time.monotonic() - started
        assert took > 2 * runner.deadline_s and runner.written_off == 0
        assert all(isinstance(raw, bytes) for raw in got) and len(got) == 6
        fs.clear()
        for i, rel in enumerate(rels):  # the same reads in one batch: no progress between them
            fs.block(rel, seconds=0.2 * (i + 1))
        assert runner.run([(Gate("mlx5_0"), lambda: got.extend(cache.read_many(rels)))], wait_s=10)
        assert runner.written_off == 1
        # A batch that opens what it reads (a new registration: hundreds of files) marks progress
        # every 32 files: 66 opened in one batch, the 32nd, 64th and 66th answering 0.5 s apart.
        fs.clear()
        port = sim_host.root / "class/infiniband/mlx5_0/ports/1"
        many = [
            f"class/infiniband/mlx5_0/ports/1/{d}/{n}"
            for d in ("counters", "hw_counters", "gids", "gid_attrs/types")
            for n in sorted(os.listdir(port / d))
        ]
        assert len(many) >= 66
        many = many[:66]
        for i, at in ((31, 0.5), (63, 1.0), (65, 1.5)):
            fs.block(many[i], seconds=at)
        slow = ReadRunner("test", deadline_s=0.75)
        fresh = root.cache()
        started = time.monotonic()
        assert slow.run([(Gate("mlx5_0"), lambda: got.extend(fresh.read_many(many)))], wait_s=10)
        assert time.monotonic() - started > 1.4 and slow.written_off == 0
        slow.close()
    finally:
        runner.close()
        fs.clear()
        root.close()


def test_a_counter_job_queued_behind_a_hung_read_opens_nothing_for_a_retired_device(sim_host: SimHost) -> None:
    """A counter pass queued behind a hung read can run after its device re-registered and the
    old registration's descriptors were closed: it must not reopen the new files into the old
    cache, which nobody closes again (the hung-read soak leaked a port's 49 counter descriptors,
    twice in 30 minutes)."""
    reader = HostReader(SysfsRoot(sim_host.root, hold_fds=True))
    reader.state_pass()
    run_here(reader.counter_jobs())
    queued = reader.counter_jobs()  # submitted, then held up behind a hung read
    sim_host.remove_device("mlx5_1")
    sim_host.restore_device("mlx5_1")  # registered again: the same paths, new files
    reader.state_pass()  # retires the old registration and closes its descriptors
    before = len(os.listdir("/proc/self/fd"))
    run_here(queued)  # the queue moves on at last
    assert len(os.listdir("/proc/self/fd")) == before
    reader.close()


# -- the daemon over the faulty filesystem ----------------------------------------------------


@contextmanager
def daemon(sysfs: Path, tmp_path: Path, *extra: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rnic_exporter",
            "serve",
            "--path.sysfs",
            str(sysfs),
            "--web.listen-address",
            f"127.0.0.1:{port}",
            "--state.dir",
            str(tmp_path / "state"),
            "--no-watch.netlink",
            "--no-watch.udev",
            "--no-collector.ethtool",
            *extra,
        ],
        stdout=log,
        stderr=log,
    )
    try:
        wait_for(
            lambda: proc.poll() is None and http_get(f"{base}/-/ready", timeout=1)[0] == 200,
            timeout=30,
            what="the exporter ready",
        )
        yield proc, base
    finally:
        stop_process(proc)
        log.close()


def timed_scrape(base: str) -> tuple[float, str]:
    started = time.monotonic()
    status, _, body = http_get(f"{base}/metrics", timeout=10)
    assert status == 200
    return time.monotonic() - started, body.decode()


@pytest.mark.e2e
def test_a_hung_counter_read_stalls_only_its_device(
    sim_host: SimHost, faulty_sysfs: FaultyMount, tmp_path: Path
) -> None:
    fs = faulty_sysfs
    interval, wait = 0.5, 1.5
    with daemon(fs.mount, tmp_path, "--poll.interval", str(interval), "--web.counter-wait", str(wait)) as (proc, base):
        timed_scrape(base)  # counters read once: the last values to serve
        fs.block(COUNTER, seconds=30)
        slowest = 0.0

        def hung() -> bool:
            nonlocal slowest
            slowest = max(slowest, timed_scrape(base)[0])  # the counter pass of one of them meets the hung read
            return fs.blocked(COUNTER) >= 1

        wait_for(hung, timeout=10, what="a counter read hung")
        assert slowest < wait + 1.0
        took, text = timed_scrape(base)
        assert took < wait + 1.0
        assert value(text, catalog.DEVICE_READ_STUCK.name, device="mlx5_0") == 1
        assert value(text, catalog.DEVICE_READ_STUCK.name, device="mlx5_1") == 0
        assert value(text, catalog.DEVICE_READ_STUCK.name, device="mlx5_2") == 0
        assert value(text, catalog.COUNTERS_STALE.name) == 1
        assert value(text, catalog.PORT_DATA_RECEIVED.name, device="mlx5_0") is not None  # its last values

        sim_host.set_port_up("mlx5_1", False)  # another device's state change, while mlx5_0 hangs
        changed = time.monotonic()

        def seen() -> bool:
            return value(timed_scrape(base)[1], catalog.PORT_UP.name, device="mlx5_1") == 0

        wait_for(seen, timeout=10, what="mlx5_1's port down in the exposition")
        assert time.monotonic() - changed < interval + 1.0
        sim_host.add_traffic(1.0)
        want = 4 * int((sim_host.root / "class/infiniband/mlx5_2/ports/1/counters/port_rcv_data").read_text())
        wait_for(
            lambda: value(timed_scrape(base)[1], catalog.PORT_DATA_RECEIVED.name, device="mlx5_2") == want,
            timeout=5,
            what="mlx5_2's counters moving on (the pass of a second ago is reused meanwhile)",
        )
        for path in ("/-/healthy", "/-/ready"):
            assert http_get(f"{base}{path}", timeout=5)[0] == 200
        assert fs.blocked(COUNTER) == 1  # still hung: everything above happened meanwhile
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        assert time.monotonic() - started < 5.0


@pytest.mark.e2e
def test_a_first_poll_that_hangs_still_serves_the_other_devices(
    sim_host: SimHost, faulty_sysfs: FaultyMount, tmp_path: Path
) -> None:
    fs = faulty_sysfs
    fs.block("class/infiniband/mlx5_0/ports/1/state", seconds=30)
    with daemon(fs.mount, tmp_path, "--poll.interval", "0.5") as (_, base):
        _, text = timed_scrape(base)
        assert value(text, catalog.DEVICE_READ_STUCK.name, device="mlx5_0") == 1
        assert value(text, catalog.PORT_UP.name, device="mlx5_1") == 1
        assert value(text, catalog.PORT_UP.name, device="mlx5_2") == 1
        assert value(text, catalog.LAST_POLL.name) is not None  # the shipped rules see polls going on
        assert http_get(f"{base}/-/healthy", timeout=5)[0] == 200


# -- restricted functions ---------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("sim_host", [{"roce": 2, "infiniband": 0, "gid_table_size": 8}], indirect=True)
@pytest.mark.parametrize("code", [errno.EINVAL, errno.EOPNOTSUPP])
def test_unsupported_counters_cost_a_handful_of_reads_per_hour(
    sim_host: SimHost, faulty_sysfs: FaultyMount, code: int
) -> None:
    fs = faulty_sysfs
    pattern = "class/infiniband/mlx5_1/ports/1/counters/*"
    files = len(os.listdir(sim_host.root / "class/infiniband/mlx5_1/ports/1/counters"))
    clock = Clock()
    # Every PMA file every scrape (no slow timer): the back-off alone is what spares the reads.
    reader = HostReader(SysfsRoot(fs.mount, hold_fds=True), ReaderSettings(pma_slow_s=0), clock=clock)
    reader.state_pass()
    fs.fail(pattern, code)
    fs.reset_counts()
    for _ in range(3600 // 15):  # an hour of 15 s scrapes, each one counter pass
        run_here(reader.counter_jobs())
        clock.now += 15
    reads = fs.reads(pattern)
    assert reads <= 8 * files, f"{reads / files:.1f} reads per file in an hour"
    assert fs.reads("class/infiniband/mlx5_0/ports/1/counters/*") == 240 * files  # a healthy one: every pass
    backed_off = {d.name: d for d in reader.freshness()}["mlx5_1"].backed_off
    assert len(backed_off) == files and len({s for _, _, s in backed_off}) == 1
    assert BACKOFF_MAX_S / 2 <= backed_off[0][2] <= BACKOFF_MAX_S
    snap = reader.read()  # EINVAL from the first read on: unsupported (sources/availability.py), still said
    assert snap.errors == () and {e.kind for e in snap.unsupported} == {"not_supported"}
    fs.heal(pattern)
    clock.now += BACKOFF_MAX_S
    port = reader.read().port("mlx5_1", 1)
    assert port is not None and port.counters and not reader.freshness()[1].backed_off


def test_an_excluded_device_is_never_read(sim_host: SimHost, faulty_sysfs: FaultyMount, tmp_path: Path) -> None:
    """A read can itself upset a restricted NIC: an excluded one is listed, never opened or read."""
    fs = faulty_sysfs
    root = SysfsRoot(fs.mount, hold_fds=True)
    agent = Agent(
        ServeConfig(
            sysfs=fs.mount,
            state_dir=tmp_path / "state",
            ethtool=False,
            reader=reader_settings(device_exclude="^mlx5_1$"),
        ),
        root=root,
    )
    try:
        fs.reset_counts()
        agent.poll_once(full_gid_tables=True)
        agent.poll_once()
        text = scrape(agent)
        assert value(text, catalog.DEVICE_INFO.name, device="mlx5_0") == 1
        assert value(text, catalog.DEVICE_INFO.name, device="mlx5_1") is None
        assert fs.reads("class/infiniband/mlx5_1/*") == fs.opens("class/infiniband/mlx5_1/*") == 0
        assert fs.reads("class/infiniband/mlx5_0/*") > 0
    finally:
        agent.close()
