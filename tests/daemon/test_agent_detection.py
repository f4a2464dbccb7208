"""Detection inside the agent: the exposition's detection metrics, event log lines, `check`."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.catalog.events import EVENT_SPECS
from rnic_exporter.daemon.agent import Agent, ServeConfig
from rnic_exporter.detect.settings import DetectionSettings, RatedExpectation
from rnic_exporter.sim import SimHost
from rnic_exporter.sources.sysfs import SysfsRoot
from tests.support.agent import make_agent, metrics, series
from tests.support.exposition import Samples, samples
from tests.support.processes import exporter, free_port, http_get, require_binary
from tests.support.sim import refresh_overlay


def test_detection_metrics_in_the_exposition(sim_host: SimHost, tmp_path: Path) -> None:
    rated = RatedExpectation(match=(("device", "mlx5_0"),), port_rate_gbps=400, pcie_width=16)
    agent = make_agent(sim_host, tmp_path / "state", DetectionSettings(rated=(rated,), nccl_gid_index=3))
    agent.poll_once(full_gid_tables=True)
    pl = {"device": "mlx5_0", "port": "1"}
    assert series(agent, "rnic_port_rated_rate_bytes_per_second", **pl, source="config") == 400e9 / 8
    assert series(agent, "rnic_link_below_rated", **pl, link="port") == 0
    assert series(agent, "rnic_link_below_rated", **pl, link="pcie") == 0
    assert series(agent, "rnic_gid_roce_v2_ipv4_index", **pl, address="10.0.0.1") == 3
    assert series(agent, "rnic_nccl_configured_gid_index_valid", **pl) == 1
    assert series(agent, "rnic_device_present", device="mlx5_1", pci_address="0000:19:00.0") == 1
    assert series(agent, "rnic_port_flapping", **pl) == 0
    # Every port's event counters exist from the start, so increase() sees the first event.
    assert series(agent, "rnic_events_total", event="rnic.gid.address_moved", **pl) == 0
    assert series(agent, "rnic_events_total", event="rnic.device.disappeared", device="mlx5_2", port="") == 0

    sim_host.hold_gid("mlx5_0", "10.0.0.1")
    sim_host.remove_address("mlx5_0", "10.0.0.1")
    refresh_overlay(agent.reader.root, sim_host.errno_overlay)
    agent.poll_once(full_gid_tables=True)
    assert series(agent, "rnic_netdev_address_present", **pl, netdev="ens1f0np0", address="10.0.0.1") == 0
    assert series(agent, "rnic_nccl_configured_gid_index_valid", **pl) == 0
    sim_host.add_address("mlx5_0", "10.0.0.1")
    sim_host.set_speed("mlx5_0", 200)
    sim_host.remove_device("mlx5_1")
    refresh_overlay(agent.reader.root, sim_host.errno_overlay)
    agent.poll_once(full_gid_tables=True)
    assert series(agent, "rnic_gid_roce_v2_ipv4_index", **pl, address="10.0.0.1") == 4
    assert series(agent, "rnic_events_total", event="rnic.gid.address_moved", **pl) == 1
    assert series(agent, "rnic_gid_table_changes_total", **pl) == 2
    assert series(agent, "rnic_link_below_rated", **pl, link="port") == 1
    assert series(agent, "rnic_device_present", device="mlx5_1", pci_address="0000:19:00.0") == 0
    assert series(agent, "rnic_events_total", event="rnic.device.disappeared", device="mlx5_1", port="") == 1
    agent.close()


def test_every_detection_name_is_in_the_catalogue_and_promtool_is_happy(sim_host: SimHost, tmp_path: Path) -> None:
    agent = make_agent(sim_host, tmp_path / "state", DetectionSettings(nccl_gid_index=2))
    agent.poll_once(full_gid_tables=True)
    agent.poll_once()
    names = {name for name, _ in metrics(agent)}
    known = set(catalog.BY_NAME) | {f"{m.family_name}_created" for m in catalog.METRICS}
    assert names <= known, names - known
    for spec in (
        catalog.DEVICE_PRESENT,
        catalog.EVENTS,
        catalog.PORT_RATED_RATE,
        catalog.GID_V2_IPV4_INDEX,
        catalog.NCCL_CONFIGURED_GID_INDEX_VALID,
        catalog.NETDEV_ADDRESS_LOSS_RISK,
        catalog.PORT_FLAPPING,
        catalog.GID_TABLE_CHANGES,
        catalog.LINK_BELOW_RATED,
    ):
        assert spec.name in names, spec.name
    body, _ = agent.prometheus.render(None, None)
    lint = subprocess.run([require_binary("promtool"), "check", "metrics"], input=body, capture_output=True)
    assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), lint.stderr
    agent.close()


def _logged_after(
    host: SimHost, state: Path, caplog: pytest.LogCaptureFixture, change: Callable[[], None]
) -> list[logging.LogRecord]:
    """What the agent logs on the poll after `change` (the first poll, learning the host, not counted)."""
    agent = make_agent(host, state)
    try:
        agent.poll_once(full_gid_tables=True)
        caplog.clear()
        change()
        with caplog.at_level(logging.INFO, logger="rnic_exporter"):
            agent.poll_once()
    finally:
        agent.close()
    return list(caplog.records)


def test_events_are_logged_as_structured_lines(
    sim_host: SimHost, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    logged = _logged_after(sim_host, tmp_path / "state", caplog, lambda: sim_host.set_port_up("mlx5_1", False))
    records = [r for r in logged if r.name == "rnic_exporter.events"]
    assert [r.getMessage() for r in records] == ["mlx5_1 port 1 (ens2f0np0) is down"]
    fields = records[0].fields  # type: ignore[attr-defined]
    assert fields["event"] == "rnic.port.down" and fields["device"] == "mlx5_1" and fields["port"] == "1"
    assert records[0].levelno == logging.WARNING


def test_a_critical_nic_event_is_not_logged_as_an_exporter_error(
    sim_host: SimHost, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    logged = _logged_after(sim_host, tmp_path / "state", caplog, lambda: sim_host.remove_device("mlx5_1"))
    gone = [r for r in logged if r.name == "rnic_exporter.events" and r.fields["severity"] == "critical"]  # type: ignore[attr-defined]
    assert gone and all(r.levelno == logging.WARNING for r in gone)
    assert not [r for r in logged if r.levelno >= logging.ERROR]


def test_event_log_line_in_json_format(sim_host: SimHost, tmp_path: Path) -> None:
    """The daemon's own formatter, end to end: one JSON object per event on stderr."""
    code = (
        "import logging, sys\n"
        "from pathlib import Path\n"
        "from rnic_exporter.daemon.logsetup import configure\n"
        "from rnic_exporter.daemon.agent import Agent, ServeConfig\n"
        "from rnic_exporter.sim import SimHost\n"
        "configure('info', 'json')\n"
        f"host = SimHost.build(Path({str(tmp_path / 'j')!r}), roce=1, gid_table_size=8)\n"
        f"agent = Agent(ServeConfig(sysfs=host.root, state_dir=Path({str(tmp_path / 'js')!r}), "
        "watch_netlink=False, watch_udev=False))\n"
        "agent.poll_once(True)\n"
        "host.remove_device('mlx5_0')\n"
        "agent.poll_once(True)\n"
        "agent.close()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stderr.splitlines()]
    gone = [line for line in lines if line.get("event") == "rnic.device.disappeared"]
    assert len(gone) == 1 and gone[0]["device"] == "mlx5_0" and gone[0]["pci_address"] == "0000:11:00.0"
    assert gone[0]["severity"] == "critical"


def test_event_specs_have_a_log_level() -> None:
    from rnic_exporter.daemon.agent import _EVENT_LEVEL

    assert {s.severity for s in EVENT_SPECS} <= set(_EVENT_LEVEL)


# -- check ------------------------------------------------------------------------------------


def run_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rnic_exporter", "check", *args], capture_output=True, text=True, timeout=60
    )


def test_check_healthy_then_problems_then_usage_error(sim_host: SimHost, tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    healthy = run_check("--path.sysfs", str(sim_host.root), "--state.dir", state, "--no-netlink")
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert healthy.stdout.startswith("OK: 3 RDMA device(s), 3 port(s)")

    # The daemon learned the host; then a NIC goes and the configured index is wrong.
    agent = make_agent(sim_host, tmp_path / "state")
    agent.poll_once(full_gid_tables=True)
    agent.close()
    sim_host.remove_device("mlx5_1")
    sick = run_check(
        "--path.sysfs", str(sim_host.root), "--state.dir", state, "--nccl-gid-index", "2", "--no-netlink", "--json"
    )
    assert sick.returncode == 1, sick.stderr
    report = json.loads(sick.stdout)
    assert report["schema"] == 1 and report["healthy"] is False and report["devices"] == 2
    codes = sorted(p["code"] for p in report["problems"])
    assert codes == ["device_missing", "nccl_gid_index_invalid"]
    missing = next(p for p in report["problems"] if p["code"] == "device_missing")
    assert missing["severity"] == "critical" and "mlx5_1" in missing["where"] and missing["fix"]

    text = run_check("--path.sysfs", str(sim_host.root), "--state.dir", state, "--no-netlink")
    assert text.returncode == 1 and "[CRITICAL] mlx5_1 (0000:19:00.0): a device of the inventory" in text.stdout

    bad = run_check("--path.sysfs", str(tmp_path / "nowhere"))
    assert bad.returncode == 2 and bad.stderr.startswith("rnic-exporter: error:") and not bad.stdout
    broken = tmp_path / "broken.toml"
    broken.write_text("[inventory]\nexpected_devices = 'eight'\n")
    cfg = run_check("--path.sysfs", str(sim_host.root), "--config", str(broken))
    assert cfg.returncode == 2 and "inventory.expected_devices" in cfg.stderr


def test_check_takes_nccl_gid_index_from_the_environment(sim_host: SimHost, tmp_path: Path) -> None:
    env_run = subprocess.run(
        [sys.executable, "-m", "rnic_exporter", "check", "--path.sysfs", str(sim_host.root), "--no-netlink", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NCCL_IB_GID_INDEX": "0"},
    )
    assert env_run.returncode == 1
    assert {p["code"] for p in json.loads(env_run.stdout)["problems"]} == {"nccl_gid_index_invalid"}
    garbage = subprocess.run(
        [sys.executable, "-m", "rnic_exporter", "check", "--path.sysfs", str(sim_host.root)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NCCL_IB_GID_INDEX": "three"},
    )
    # NCCL reads "three" as 0 (strtoll): the same verdict as index 0, and a note that says so; never exit 2.
    assert garbage.returncode == 1 and "NCCL_IB_GID_INDEX='three': NCCL reads as 0" in garbage.stdout


def scrape(url: str) -> Samples:
    status, _, body = http_get(url)
    assert status == 200
    return samples(body.decode())


def test_nic_removed_while_stopped_is_missing_after_restart(sim_host: SimHost, tmp_path: Path) -> None:
    """Real daemon, stopped with SIGTERM, NIC removed, started again with the same --state.dir."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    args = [
        "serve",
        "--path.sysfs",
        str(sim_host.root),
        "--web.listen-address",
        f"127.0.0.1:{port}",
        "--state.dir",
        str(tmp_path / "state"),
        "--no-watch.netlink",
        "--no-watch.udev",
        "--log.format",
        "json",
    ]
    present = ("rnic_device_present", frozenset({("device", "mlx5_1"), ("pci_address", "0000:19:00.0")}))
    with exporter(args, ready_url=f"{base}/-/ready", log_path=tmp_path / "first.log"):
        assert scrape(f"{base}/metrics")[present] == 1
    assert (tmp_path / "state" / "state.json").is_file()
    sim_host.remove_device("mlx5_1")
    with exporter(args, ready_url=f"{base}/-/ready", log_path=tmp_path / "second.log"):
        values = scrape(f"{base}/metrics")
        assert values[present] == 0
        assert values[("rnic_devices", frozenset())] == 2
        gone = (
            "rnic_events_total",
            frozenset({("event", "rnic.device.disappeared"), ("device", "mlx5_1"), ("port", "")}),
        )
        assert values[gone] == 1
    log_lines = [json.loads(line) for line in (tmp_path / "second.log").read_text().splitlines()]
    assert [line["device"] for line in log_lines if line.get("event") == "rnic.device.disappeared"] == ["mlx5_1"]


def test_a_detection_failure_costs_no_metrics(
    sim_host: SimHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    agent = make_agent(sim_host, tmp_path / "state")

    def broken(*args: object, **kwargs: object) -> list[object]:
        raise ValueError("a bug")

    monkeypatch.setattr(agent.detector, "observe", broken)
    with caplog.at_level(logging.ERROR):
        agent.poll_once(full_gid_tables=True)
    assert series(agent, "rnic_devices") == 3
    assert series(agent, "rnic_exporter_event_source_errors_total", source="detection") == 1
    assert "detection failed" in caplog.text and "ValueError: a bug" in caplog.text
    agent.close()


def test_nccl_gid_index_from_the_environment_beats_the_config_file(tmp_path: Path) -> None:
    from rnic_exporter.config.file import apply_file

    cfg = tmp_path / "rnic.toml"
    cfg.write_text("[nccl]\nib_gid_index = 2\n[inventory]\nexpected_devices = 4\n")
    base = ServeConfig(config_file=cfg, detection=DetectionSettings(nccl_gid_index=3))
    assert apply_file(base, {"nccl_gid_index"}).detection.nccl_gid_index == 3  # NCCL_IB_GID_INDEX was set
    from_file = apply_file(base, set()).detection
    assert from_file.nccl_gid_index == 2 and from_file.expected_devices == 4


def test_serve_says_when_the_device_filter_leaves_out_every_device(
    sim_host: SimHost, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from dataclasses import replace

    from rnic_exporter.config.file import reader_settings

    agent = make_agent(sim_host, tmp_path)
    agent.close()
    config = replace(agent.config, reader=reader_settings(device_include="^bnxt_"))
    agent = Agent(config, SysfsRoot(sim_host.root, hold_fds=True))
    try:
        with caplog.at_level(logging.INFO, logger="rnic_exporter"):
            agent.poll_once()
    finally:
        agent.close()
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "matches none of" in r.getMessage()]
    assert warned and "mlx5_0" in warned[0].getMessage()
    assert not [r for r in caplog.records if "no RDMA devices found" in r.getMessage()]


def test_exporter_error_and_wakeup_counters_are_zero_on_a_healthy_host(sim_host: SimHost, tmp_path: Path) -> None:
    agent = make_agent(sim_host, tmp_path / "state")
    try:
        agent.poll_once(full_gid_tables=True)
        for reason in ("corrupt", "foreign", "unreadable", "unwritable"):
            assert series(agent, "rnic_exporter_state_errors_total", reason=reason) == 0, reason
        for source in ("netlink", "udev"):
            assert series(agent, "rnic_exporter_wakeups_total", source=source) == 0, source
    finally:
        agent.close()
