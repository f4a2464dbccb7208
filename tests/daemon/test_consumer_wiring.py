"""Where an RNIC's consumers show (issue 15 items 2-3): the scan's cadence, events naming them (log line,
decoded OTLP record), the exposition, all driven by the simulator's fake verbs users.

The scan here is the simulator's (`SimProcfs.scan`, what a correct scan of its fake procfs returns),
plugged into the one seam `consumer_watch.Scan`; the real scan over real processes is tested by
tests/test_consumers*.py.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.catalog.events import GID_ADDRESS_MOVED, Event
from rnic_exporter.config.file import ConsumerSettings
from rnic_exporter.daemon.agent import Agent, ServeConfig
from rnic_exporter.daemon.consumer_watch import ConsumerWatch
from rnic_exporter.daemon.logsetup import JsonFormatter
from rnic_exporter.daemon.serve import run
from rnic_exporter.model.consumers import ConsumerScan, DeviceConsumers
from rnic_exporter.sim import SimHost, SimProcfs
from rnic_exporter.sinks.consumer_fields import log_fields, otel_attributes
from rnic_exporter.sinks.samples import ExporterStats, Published
from tests.support.exposition import label_sets
from tests.support.fakeproc import POD_UID
from tests.support.processes import free_port, http_get
from tests.support.wait import wait_for

pytestmark = pytest.mark.sim_host(roce=3, gid_table_size=32)


@pytest.fixture
def users(host: SimHost, tmp_path: Path) -> SimProcfs:
    """Slurm job 4242 and pod team-a/trainer-0 on mlx5_1; the pod also on mlx5_2; ib_write_bw on mlx5_0."""
    procs = SimProcfs(host, tmp_path / "proc", tmp_path / "root")
    procs.slurm_job("4242", ["mlx5_1"])
    procs.slurm_job("4242", ["mlx5_1"], step="batch", layout="v1")
    procs.pod("team-a", "trainer-0", POD_UID, ["mlx5_1", "mlx5_2"])
    procs.process("ib_write_bw", ["mlx5_0"])
    return procs


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self.guard:
            self.records.append(record)

    def lines(self, logger: str) -> list[dict[str, Any]]:
        with self.guard:
            return [json.loads(JsonFormatter().format(r)) for r in self.records if r.name == logger]


@pytest.fixture
def logs() -> Iterator[_Records]:
    handler = _Records()
    for name in ("rnic_exporter.events", "rnic_exporter.consumers"):
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.INFO)
    yield handler
    for name in ("rnic_exporter.events", "rnic_exporter.consumers"):
        logging.getLogger(name).removeHandler(handler)


def _agent(host: SimHost, watch: ConsumerWatch) -> Agent:
    config = ServeConfig(sysfs=host.root, state_dir=None, watch_netlink=False, watch_udev=False, ethtool=False)
    return Agent(config, consumers=watch)


def _moved(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in lines if line.get("event") == GID_ADDRESS_MOVED.name]


# -- the cadence ----------------------------------------------------------------------------------


def test_a_gid_shift_event_names_the_job_and_pod_on_that_device(
    host: SimHost, users: SimProcfs, logs: _Records
) -> None:
    watch = ConsumerWatch(users.scan, ConsumerSettings(enabled=True))
    agent = _agent(host, watch)
    try:
        watch.scan_now()
        agent.poll_once(full_gid_tables=True)
        host.gid_shift("mlx5_1")
        agent.poll_once(full_gid_tables=True)
    finally:
        agent.close()
    moved = _moved(logs.lines("rnic_exporter.events"))
    assert len(moved) == 1 and moved[0]["device"] == "mlx5_1"
    assert moved[0]["consumers"] == "pod team-a/trainer-0, slurm job 4242 step 0, slurm job 4242 step batch"
    assert moved[0]["consumer_processes"] == "3"
    assert moved[0]["consumers_scan_complete"] == "true"
    assert 0 <= float(moved[0]["consumers_scan_age_s"]) < 60
    # Another device's event names only its own users.
    discovered = {line["device"]: line["consumers"] for line in logs.lines("rnic_exporter.events")}
    assert discovered["mlx5_0"] == "process ib_write_bw" and discovered["mlx5_3"] == "none"


def test_the_exposition_counts_processes_and_names_each_job_and_pod_once(host: SimHost, users: SimProcfs) -> None:
    watch = ConsumerWatch(users.scan, ConsumerSettings(enabled=True))
    agent = _agent(host, watch)
    try:
        watch.scan_now()
        agent.poll_once(full_gid_tables=True)
        body, _ = agent.prometheus.render(None, None)
    finally:
        agent.close()
    counts = {s["device"]: s for s in label_sets(body, catalog.DEVICE_CONSUMER_PROCESSES.name)}
    assert set(counts) == {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}  # an unused device is 0, not absent
    info = label_sets(body, catalog.DEVICE_WORKLOAD_INFO.name)
    on_1 = sorted((s["kind"], s["slurm_job_id"], s["k8s_pod_name"]) for s in info if s["device"] == "mlx5_1")
    assert on_1 == [("pod", "", "trainer-0"), ("slurm", "4242", "")]  # two steps, one job series
    pod = next(s for s in info if s["kind"] == "pod" and s["device"] == "mlx5_2")
    assert pod == {
        "device": "mlx5_2",
        "kind": "pod",
        "slurm_job_id": "",
        "k8s_namespace_name": "team-a",
        "k8s_pod_name": "trainer-0",
        "k8s_pod_uid": POD_UID,
        "command": "",
    }
    assert not [s for s in info if s["device"] == "mlx5_3"]
    values = {
        (s.name, s.labels.get("device", "")): s.value
        for f in text_string_to_metric_families(body.decode())
        for s in f.samples
    }
    assert values[(catalog.DEVICE_CONSUMER_PROCESSES.name, "mlx5_1")] == 3
    assert values[(catalog.DEVICE_CONSUMER_PROCESSES.name, "mlx5_3")] == 0
    assert values[(catalog.DEVICE_WORKLOADS.name, "mlx5_1")] == 2


def test_info_series_per_device_are_bounded(host: SimHost, tmp_path: Path) -> None:
    procs = SimProcfs(host, tmp_path / "proc")
    for job in range(catalog.CONSUMER_WORKLOADS_MAX + 5):
        procs.slurm_job(str(1000 + job), ["mlx5_0"])
    watch = ConsumerWatch(procs.scan)
    watch.scan_now()
    families = {f.spec.name: f for f in watch.families()}
    assert len(families[catalog.DEVICE_WORKLOAD_INFO.name].samples) == catalog.CONSUMER_WORKLOADS_MAX
    assert families[catalog.DEVICE_WORKLOADS.name].samples == [(("mlx5_0",), catalog.CONSUMER_WORKLOADS_MAX + 5.0)]


def test_an_incomplete_scan_never_says_unused(host: SimHost, users: SimProcfs) -> None:
    def partial() -> ConsumerScan:
        full = users.scan()
        return ConsumerScan(at=full.at, by_device={"mlx5_1": full.by_device["mlx5_1"]}, complete=False, skipped=7)

    watch = ConsumerWatch(partial)
    watch.publish(Published(host_snapshot(host), (), ExporterStats(), ()))
    watch.scan_now()
    families = {f.spec.name: f for f in watch.families()}
    assert families[catalog.DEVICE_CONSUMER_PROCESSES.name].samples == [(("mlx5_1",), 3.0)]
    assert families[catalog.CONSUMER_SCAN_COMPLETE.name].samples == [((), 0.0)]
    assert families[catalog.CONSUMER_SCAN_SKIPPED.name].samples == [((), 7.0)]
    event = watch.annotate([Event(GID_ADDRESS_MOVED, "m", device="mlx5_0", time=1.0)])[0]
    assert event.consumers is not None
    fields = log_fields(event.consumers)
    assert fields["consumers"] == "none seen (incomplete scan)"
    assert fields["consumers_scan_complete"] == "false"


def host_snapshot(host: SimHost) -> Any:
    from rnic_exporter.sources.reader import HostReader, ReaderSettings
    from rnic_exporter.sources.sysfs import SysfsRoot

    reader = HostReader(SysfsRoot(host.root), ReaderSettings())
    try:
        return reader.read()
    finally:
        reader.close()


def test_a_failing_scan_is_counted_logged_once_and_keeps_the_last_view(users: SimProcfs, logs: _Records) -> None:
    calls = {"n": 0}

    def flaky() -> ConsumerScan:
        calls["n"] += 1
        if calls["n"] > 1:
            raise PermissionError(13, "Permission denied", "/proc/1/fd")
        return users.scan()

    watch = ConsumerWatch(flaky)
    assert watch.scan_now() is not None
    assert watch.scan_now() is None and watch.scan_now() is None
    assert watch.errors == {"error": 2}
    warned = [line for line in logs.lines("rnic_exporter.consumers") if line["level"] == "warn"]
    assert len(warned) == 1 and warned[0]["reason"] == "error" and "Permission denied" in warned[0]["err"]
    assert watch.last is not None and "mlx5_1" in watch.last.by_device  # the last good scan stays
    errors = next(f for f in watch.families() if f.spec is catalog.CONSUMER_SCAN_ERRORS)
    assert dict(errors.samples) == {("error",): 2.0, ("timeout",): 0.0}


def test_a_hung_scan_times_out_without_a_second_one_beside_it(users: SimProcfs, logs: _Records) -> None:
    release, started = threading.Event(), threading.Event()
    calls = {"n": 0}

    def hangs() -> ConsumerScan:
        calls["n"] += 1
        started.set()
        release.wait(30)
        return users.scan()

    watch = ConsumerWatch(hangs, ConsumerSettings(enabled=True, timeout_s=0.2))
    try:
        assert watch.scan_now() is None
        assert watch.scan_now() is None  # the first is still stuck: no second scan is started
        assert calls["n"] == 1 and watch.errors == {"timeout": 2}
        assert len([line for line in logs.lines("rnic_exporter.consumers") if line["level"] == "warn"]) == 1
    finally:
        release.set()


def test_an_event_wakes_a_scan_at_once(host: SimHost, users: SimProcfs) -> None:
    scans: list[float] = []

    def counted() -> ConsumerScan:
        scan = users.scan()
        scans.append(scan.at)
        return scan

    watch = ConsumerWatch(counted, ConsumerSettings(enabled=True, interval_s=3600))
    watch.start()
    try:
        wait_for(lambda: len(scans) == 1, timeout=10, what="the first scan at start")
        event = Event(GID_ADDRESS_MOVED, "moved", device="mlx5_1", time=1.0)
        watch.publish(Published(host_snapshot(host), (event,), ExporterStats(), ()))
        wait_for(lambda: len(scans) == 2, timeout=10, what="a scan right after the event")
    finally:
        watch.close()


def test_an_event_older_than_nothing_carries_the_scan_and_its_age(users: SimProcfs) -> None:
    scan = users.scan()
    moved = Event(GID_ADDRESS_MOVED, "moved", device="mlx5_1", time=scan.at + 42.0)
    consumers = DeviceConsumers.of(scan, moved.device, moved.time)
    assert consumers.age_s == pytest.approx(42.0)
    attrs = otel_attributes(consumers)
    assert attrs["slurm.job.id"] == ["4242"]
    assert attrs["k8s.pod.name"] == ["trainer-0"] and attrs["k8s.namespace.name"] == ["team-a"]
    assert attrs["k8s.pod.uid"] == [POD_UID]
    assert attrs["rnic.consumers.processes"] == 3
    assert attrs["rnic.consumers.scan.age"] == pytest.approx(42.0)
    containers = attrs["container.id"]
    assert isinstance(containers, list) and len(containers) == 1 and len(containers[0]) == 64


def test_disabled_there_is_no_watch_and_events_carry_nothing(host: SimHost) -> None:
    agent = Agent(ServeConfig(sysfs=host.root, state_dir=None, watch_netlink=False, watch_udev=False, ethtool=False))
    try:
        agent.poll_once(full_gid_tables=True)
        body, _ = agent.prometheus.render(None, None)
    finally:
        agent.close()
    assert agent.consumers is None
    assert b"rnic_device_workload" not in body and b"consumer_scan" not in body


# -- the daemon: real HTTP scrape and the OTLP record ---------------------------------------------


def test_serve_names_the_job_and_pod_over_http_and_in_otlp(
    host: SimHost, users: SimProcfs, logs: _Records, tmp_path: Path
) -> None:
    from dataclasses import replace

    from rnic_exporter.config.otlp import OtlpSettings
    from tests.support.otlp import HttpReceiver, value_of

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    stop = threading.Event()
    with HttpReceiver() as rcv:
        config = ServeConfig(
            sysfs=host.root,
            listen=(f"127.0.0.1:{port}",),
            poll_interval_s=0.2,
            state_dir=tmp_path / "state",
            watch_netlink=False,
            watch_udev=False,
            ethtool=False,
            host_paths=replace(ServeConfig().host_paths, procfs=users.procfs, rootfs=tmp_path / "root"),
            consumers=ConsumerSettings(enabled=True, interval_s=30.0),
            otlp=OtlpSettings(endpoint=rcv.url, protocol="http/protobuf", interval_s=0.3, timeout_s=2.0),
        )
        daemon = threading.Thread(target=run, args=(config,), kwargs={"stop": stop, "scan": users.scan})
        daemon.start()
        try:

            def info_on_mlx5_1() -> list[dict[str, str]]:
                body = http_get(f"{base}/metrics", timeout=5)[2]
                return [s for s in label_sets(body, catalog.DEVICE_WORKLOAD_INFO.name) if s["device"] == "mlx5_1"]

            info = wait_for(info_on_mlx5_1, timeout=20, what="the workload info series on /metrics")
            assert {(s["kind"], s["slurm_job_id"], s["k8s_pod_name"]) for s in info} == {
                ("slurm", "4242", ""),
                ("pod", "", "trainer-0"),
            }
            host.gid_shift("mlx5_1")
            wait_for(lambda: _moved(logs.lines("rnic_exporter.events")), timeout=20, what="the GID-shift event")
            records = wait_for(
                lambda: [r for r in rcv.received.records() if r.event_name == GID_ADDRESS_MOVED.name],
                timeout=20,
                what="the GID-shift OTLP record",
            )
        finally:
            stop.set()
            daemon.join(30)
    assert not daemon.is_alive()
    moved = _moved(logs.lines("rnic_exporter.events"))[0]
    assert moved["device"] == "mlx5_1" and "slurm job 4242" in moved["consumers"]
    attrs = records[0].attrs

    def array(key: str) -> list[Any]:
        return [value_of(v) for v in attrs[key].values]

    assert attrs["device"] == "mlx5_1"
    assert array("slurm.job.id") == ["4242"]
    assert array("k8s.pod.name") == ["trainer-0"] and array("k8s.namespace.name") == ["team-a"]
    assert array("k8s.pod.uid") == [POD_UID]
    assert array("rnic.consumers") == [
        "pod team-a/trainer-0",
        "slurm job 4242 step 0",
        "slurm job 4242 step batch",
    ]
    assert attrs["rnic.consumers.processes"] == 3 and attrs["rnic.consumers.scan.complete"] is True
    assert "consumers" not in attrs  # the log's spelling stays in the log


# -- show and check ---------------------------------------------------------------------------------


@pytest.fixture
def sim_scanner(users: SimProcfs, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, Path, Path]]:
    """The CLI's scan is the simulator's, bound to the paths the command was given (recorded)."""
    from rnic_exporter.daemon import consumer_watch

    calls: list[tuple[Path, Path, Path]] = []

    def scanner(sysfs: Path, procfs: Path, rootfs: Path) -> Any:
        calls.append((sysfs, procfs, rootfs))
        return users.scan

    monkeypatch.setattr(consumer_watch, "scanner", scanner)
    return calls


def _cli(*args: str) -> tuple[int, str, str]:
    from click.testing import CliRunner

    from rnic_exporter.cli import main

    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_show_has_a_users_column_naming_each_devices_workloads(
    host: SimHost, users: SimProcfs, sim_scanner: list[tuple[Path, Path, Path]], tmp_path: Path
) -> None:
    root = str(tmp_path / "root")
    paths = ("--path.sysfs", str(host.root), "--path.procfs", str(users.procfs), "--path.rootfs", root)
    code, out, _ = _cli("show", *paths, "--collector.consumers")
    assert code == 0, out
    header, *rows = out.splitlines()
    assert header.split()[-1] == "USERS"
    users_of = {row.split()[0]: row[header.index("USERS") :].strip() for row in rows}
    assert users_of == {
        "mlx5_0": "process ib_write_bw",
        "mlx5_1": "pod team-a/trainer-0, slurm job 4242",
        "mlx5_2": "pod team-a/trainer-0",
        "mlx5_3": "none",
    }
    assert sim_scanner == [(host.root, users.procfs, tmp_path / "root")]
    code, out, _ = _cli("show", *paths, "--collector.consumers", "--json")
    devices = {d["name"]: d for d in json.loads(out)["devices"]}
    assert [u["slurm_job_id"] for u in devices["mlx5_1"]["users"] if u["kind"] == "slurm"] == ["4242", "4242"]
    assert devices["mlx5_3"]["users"] == []
    # Without the flag: no column, no key, no scan.
    code, out, _ = _cli("show", *paths)
    assert "USERS" not in out
    assert len(sim_scanner) == 2  # the table and the JSON run; this one did not scan


def test_check_names_the_jobs_and_pods_each_problem_puts_at_risk(
    host: SimHost, users: SimProcfs, sim_scanner: list[tuple[Path, Path, Path]], tmp_path: Path
) -> None:
    args = (
        "check",
        "--path.sysfs",
        str(host.root),
        "--path.procfs",
        str(users.procfs),
        "--path.rootfs",
        str(tmp_path / "root"),
        "--state.dir",
        "",
        "--no-netlink",
        "--nccl-gid-index",
        "1",  # a link-local RoCE v2 GID: a critical problem on each RoCE port
        "--collector.consumers",
    )
    code, out, _ = _cli(*args)
    assert code == 1, out
    hits: dict[str, str] = {}
    where = ""
    for line in out.splitlines():
        if line.startswith("[CRITICAL]"):
            where = line.split("] ", 1)[1].split(" ", 1)[0]
        elif line.startswith("  hits:") and where:
            hits.setdefault(where, line.removeprefix("  hits:").strip())
    assert hits == {
        "mlx5_0": "process ib_write_bw",
        "mlx5_1": "pod team-a/trainer-0, slurm job 4242",
        "mlx5_2": "pod team-a/trainer-0",
    }
    code, out, _ = _cli(*args, "--json")
    problems = json.loads(out)["problems"]
    on_1 = next(p for p in problems if p["where"].startswith("mlx5_1"))
    assert {(r["kind"], r.get("slurm_job_id"), r.get("k8s_pod_name")) for r in on_1["at_risk"]} == {
        ("slurm", "4242", None),
        ("pod", None, "trainer-0"),
    }


def test_a_failing_scan_leaves_show_and_check_working(host: SimHost, monkeypatch: pytest.MonkeyPatch) -> None:
    from rnic_exporter.daemon import consumer_watch

    def broken() -> ConsumerScan:
        raise PermissionError(13, "Permission denied", "/proc/1/fd")

    monkeypatch.setattr(consumer_watch, "scanner", lambda *_: broken)
    code, out, err = _cli("show", "--path.sysfs", str(host.root), "--collector.consumers")
    assert code == 0 and "mlx5_0" in out and "USERS" not in out
    assert "consumers unknown" in err and "Permission denied" in err


def test_demo_names_the_job_in_the_gid_shift_step(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    from tests.support.processes import stop_process

    port = free_port()
    log = tmp_path / "demo.err"
    demo_flags = ("--poll.interval", "0.2", "--web.listen-address", f"127.0.0.1:{port}", "--log.format", "json")
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rnic_exporter", "demo", "--devices", "6", "--step.seconds", "4", *demo_flags],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        try:

            def moved() -> list[dict[str, Any]]:
                lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
                return _moved(lines)

            line = wait_for(moved, timeout=40, what="the demo's GID-shift event")[0]
            body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=5)[2]
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=15)
        finally:
            stop_process(proc)
    assert line["device"] == "mlx5_1" and "slurm job 4242 step 0" in line["consumers"]
    assert "step 1: GID index shift" in out and "Slurm job 4242 holds GID" in out
    info = label_sets(body, catalog.DEVICE_WORKLOAD_INFO.name)
    assert {(s["device"], s["kind"]) for s in info} == {("mlx5_1", "slurm"), ("mlx5_1", "pod"), ("mlx5_2", "pod")}


def test_the_config_file_turns_it_on_and_flags_beat_the_file(tmp_path: Path) -> None:
    from rnic_exporter.config.file import resolve
    from rnic_exporter.errors import ConfigError

    conf = tmp_path / "rnic.toml"
    conf.write_text("[collector.consumers]\nenabled = true\ninterval_seconds = 12\n")
    assert resolve(conf).consumers == ConsumerSettings(enabled=True, interval_s=12.0)
    flags = ConsumerSettings(enabled=False, interval_s=45.0)
    given = resolve(conf, consumers=flags, explicit={"consumers", "consumers_interval"}).consumers
    assert (given.enabled, given.interval_s) == (False, 45.0)
    assert resolve(None).consumers.enabled is False  # off by default
    conf.write_text("[collector.consumers]\nenabled = 1\ninterval_seconds = 0.1\n")
    with pytest.raises(ConfigError) as exc:
        resolve(conf)
    assert "collector.consumers.enabled: expected true or false" in str(exc.value)
    assert "collector.consumers.interval_seconds: expected a duration" in str(exc.value)
    conf.write_text('[collector.consumers]\nenabled = true\ninterval_seconds = "1m30s"\n')
    assert resolve(conf).consumers.interval_s == 90.0  # a Prometheus duration, as every time key takes


def test_serve_flags_reach_the_config(host: SimHost, monkeypatch: pytest.MonkeyPatch) -> None:
    from rnic_exporter.daemon import serve

    seen: list[ServeConfig] = []

    def fake_run(config: ServeConfig, explicit: frozenset[str] = frozenset(), **_: Any) -> int:
        seen.append(config)
        assert {"consumers", "consumers_interval"} <= explicit  # so they beat the config file
        return 0

    monkeypatch.setattr(serve, "run", fake_run)
    code, _, err = _cli(
        "serve", "--path.sysfs", str(host.root), "--collector.consumers", "--collector.consumers.interval", "7"
    )
    assert code == 0, err
    assert seen[0].consumers == ConsumerSettings(enabled=True, interval_s=7.0)
    code, _, err = _cli("serve", "--collector.consumers.interval", "0.5")
    assert code == 2 and "--collector.consumers.interval" in err
