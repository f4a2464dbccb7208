"""Unsupported is not broken: what a driver never provides is said once and never alarms."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest
from click.testing import CliRunner

from rnic_exporter.cli import Exit, main
from rnic_exporter.daemon.agent import Agent, ServeConfig
from rnic_exporter.model.host import ReadError
from rnic_exporter.sim import SimHost
from rnic_exporter.sim.host import PMA_EXTENDED_COUNTERS
from rnic_exporter.sim.sysfs_root import SimSysfsRoot
from rnic_exporter.sources.availability import FirstReads, summarize
from rnic_exporter.sources.reader import HostReader, ReaderSettings
from rnic_exporter.sources.sysfs import SysfsRoot
from tests.support.check import check_in_process as check

PORT = "class/infiniband/mlx5_0/ports/1"


def err(attribute: str, reason: str, port: int | None = 1) -> ReadError:
    return ReadError("mlx5_0", port, attribute, reason)


@pytest.mark.parametrize(
    ("reason", "unsupported_as"),
    [
        ("ENOENT", "absent: ENOENT"),
        ("EINVAL", "not_supported: EINVAL"),
        ("EOPNOTSUPP", "not_supported: EOPNOTSUPP"),
        ("no_pma: N/A (no PMA)", "no_pma: N/A (no PMA)"),
        ("empty: the driver prints an empty line", "empty: the driver prints an empty line"),
        ("EIO", None),
        ("ETIMEDOUT", None),
        ("ENODEV", None),
        ("EACCES", None),
        ("malformed: counter 'x' is not a decimal number", None),
    ],
)
def test_first_read_decides(reason: str, unsupported_as: str | None) -> None:
    first = FirstReads()
    judged = first.judge([err("counters/symbol_error", reason)])
    if unsupported_as is None:
        assert judged.unsupported == () and judged.failed == (err("counters/symbol_error", reason),)
        return
    assert judged.failed == () and judged.unsupported == (err("counters/symbol_error", unsupported_as),)
    assert judged.unsupported[0].kind in ("absent", "not_supported", "no_pma", "empty")
    # Still unreadable the same way: still unsupported, poll after poll.
    assert first.judge([err("counters/symbol_error", reason)]).unsupported == judged.unsupported
    # Readable once, then the same symptom: it failed (the driver did provide it).
    assert first.judge([]) == first.judge([])
    assert first.judge([err("counters/symbol_error", reason)]).failed == (err("counters/symbol_error", reason),)


def test_read_before_means_failed_and_a_gone_device_explains_everything() -> None:
    first = FirstReads()
    first.judge([], read=[(1, "rate")])  # read fine on the first poll
    assert first.judge([err("rate", "EINVAL")]).failed == (err("rate", "EINVAL"),)
    other = FirstReads()
    assert other.judge([err("rate", "ENOENT")], present=False).failed == (err("rate", "ENOENT"),)
    # EINVAL first, then EIO: a failure now, and it does not become "unsupported" again.
    third = FirstReads()
    assert third.judge([err("rate", "EINVAL")]).unsupported
    assert third.judge([err("rate", "EIO")]).failed == (err("rate", "EIO"),)
    assert third.judge([err("rate", "EINVAL")]).failed == (err("rate", "EINVAL"),)


def test_summary_groups_a_directory() -> None:
    rows = [err(f"counters/{name}", "no_pma: N/A (no PMA)") for name in ("a", "b", "c")]
    rows += [err("hw_rev", "not_supported: EINVAL", port=None), err("rate", "absent: ENOENT")]
    assert summarize(rows) == [
        "mlx5_0: hw_rev: not_supported",
        "mlx5_0 port 1: rate: absent",
        "mlx5_0 port 1: counters/* (3 files): no_pma",
    ]


def scraping_agent(host: SimHost, overlay: dict[str, int] | None = None) -> Agent:
    """A daemon over `host` without watchers whose every scrape reads the counters (every PMA file:
    no slow timer); `overlay`: the errnos its reads answer (the host's own by default)."""
    agent = Agent(
        ServeConfig(
            sysfs=host.root,
            state_dir=None,
            watch_netlink=False,
            watch_udev=False,
            reader=ReaderSettings(pma_slow_s=0),
        ),
        SimSysfsRoot(host.root, hold_fds=True, errno_overlay=host.errno_overlay if overlay is None else overlay),
    )
    agent._counter_pass.max_age_s = 0.0  # each scrape reads counters
    return agent


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_no_pma_counters_on_an_active_port_are_no_problem(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=1, infiniband=1, gid_table_size=8)
    for name in PMA_EXTENDED_COUNTERS:
        host.corrupt("mlx5_0", f"ports/1/counters/{name}", "N/A (no PMA)\n")
    snap = HostReader(SysfsRoot(host.root)).read()
    port = snap.port("mlx5_0", 1)
    assert port is not None and port.is_up and port.counters == {}
    assert snap.errors == () and len(snap.unsupported) == len(PMA_EXTENDED_COUNTERS)
    code, out = invoke("check", "--path.sysfs", str(host.root), "--no-netlink", "--state.dir", "")
    assert code == Exit.OK, out
    assert f"mlx5_0 port 1: counters/* ({len(PMA_EXTENDED_COUNTERS)} files): no_pma" in out
    code, out = invoke("show", "--path.sysfs", str(host.root))
    assert code == 0 and "could not be read" not in out and "not provided by the driver" in out


def test_einval_on_every_counter_from_the_first_read_is_no_problem(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=1, gid_table_size=8)
    for name in PMA_EXTENDED_COUNTERS:
        host.fail_with(f"{PORT}/counters/{name}", errno.EINVAL)
    host.fail_with("class/infiniband/mlx5_0/board_id", errno.EINVAL)  # a device attribute it never had
    report = check(host, tmp_path, SimSysfsRoot(host.root, errno_overlay=host.errno_overlay))
    assert report.healthy, report.problems
    assert any("counters/*" in note and "not_supported" in note for note in report.notes)
    assert any("mlx5_0: board_id: not_supported" in note for note in report.notes)


def test_an_empty_firmware_string_is_unsupported_not_malformed(tmp_path: Path) -> None:
    """rxe, EFA and hns print `fw_ver` as an empty line (the kernel lab showed it on rxe): a healthy
    host passes `check` with a note, `show --json` has no firmware, and nothing is a read error."""
    host = SimHost.build(tmp_path / "sys", roce=1, gid_table_size=8)
    host.corrupt("mlx5_0", "fw_ver", "\n")
    snap = HostReader(SysfsRoot(host.root)).read()
    assert snap.errors == ()
    assert [(u.attribute, u.kind) for u in snap.unsupported] == [("fw_ver", "empty")]
    assert snap.devices[0].fw_ver is None
    code, out = invoke("check", "--path.sysfs", str(host.root), "--no-netlink", "--state.dir", "")
    assert code == Exit.OK, out
    assert "WARNING" not in out and "malformed" not in out
    assert "mlx5_0: fw_ver: empty" in out
    code, out = invoke("show", "--json", "--path.sysfs", str(host.root))
    assert code == 0 and '"fw_ver": null' in out


@pytest.mark.parametrize("code", [errno.EIO, errno.EINVAL])
def test_counters_failing_after_having_been_read_are_a_warning(
    tmp_path: Path, code: int, caplog: pytest.LogCaptureFixture
) -> None:
    host = SimHost.build(tmp_path / "sys", roce=1, gid_table_size=8)
    overlay = host.errno_overlay
    agent = scraping_agent(host, overlay)
    try:
        assert agent.poll_once(full_gid_tables=True).errors == ()
        assert agent.counter_view(None).stats.counter_errors == ()  # counters read once (a scrape)
        for name in PMA_EXTENDED_COUNTERS:
            overlay[f"{PORT}/counters/{name}"] = code
        with caplog.at_level(logging.INFO):
            agent.poll_once()
            stats = agent.counter_view(None).stats  # counters are read per scrape
        assert stats.counter_unsupported == ()
        assert {e.attribute for e in stats.counter_errors} == {f"counters/{n}" for n in PMA_EXTENDED_COUNTERS}
        assert sum(r.levelno == logging.WARNING and "unreadable" in r.getMessage() for r in caplog.records) == len(
            PMA_EXTENDED_COUNTERS
        )
    finally:
        agent.close()
    if code == errno.EIO:  # a one-shot check sees EIO as the failure it always is
        for name in PMA_EXTENDED_COUNTERS:
            host.fail_with(f"{PORT}/counters/{name}", code)
        report = check(host, tmp_path, SimSysfsRoot(host.root, errno_overlay=host.errno_overlay))
        assert {p.severity for p in report.problems} == {"warning"}
        assert len(report.problems) == len(PMA_EXTENDED_COUNTERS)


def test_unsupported_is_logged_once_at_info_and_never_warned(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    host = SimHost.build(tmp_path / "sys", roce=1, gid_table_size=8)
    for name in PMA_EXTENDED_COUNTERS:
        host.fail_with(f"{PORT}/counters/{name}", errno.EINVAL)
    agent = scraping_agent(host)
    try:
        with caplog.at_level(logging.INFO):
            for _ in range(3):
                snap = agent.poll_once(full_gid_tables=True)
                stats = agent.counter_view(None).stats  # counters are read per scrape
                host.add_traffic(1.0)
        assert snap.errors == () and stats.counter_errors == ()
        assert len(stats.counter_unsupported) == len(PMA_EXTENDED_COUNTERS)
        mine = [r for r in caplog.records if "not provided by the driver" in r.getMessage()]
        assert len(mine) == 1 and mine[0].levelno == logging.INFO
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        body = agent.prometheus.render(None, None)[0].decode()
        assert "rnic_attribute_unavailable{" not in body
        assert (
            'rnic_attribute_unsupported_info{attribute="counters/symbol_error",device="mlx5_0",port="1",'
            'reason="not_supported"} 1.0' in body
        )
    finally:
        agent.close()


def test_an_attribute_a_driver_lacks_does_not_make_every_poll_learn_the_device_again(tmp_path: Path) -> None:
    """A device attribute that fails is re-learned each poll until it reads; one the driver never had
    (EINVAL from the first read) is not: polls cost the same reads as on a device that has it."""

    def reads_per_poll(lacking: int | None) -> int:
        host = SimHost.build(tmp_path / f"sys-{lacking}", roce=1, gid_table_size=8)
        if lacking is not None:
            host.fail_with("class/infiniband/mlx5_0/board_id", lacking)
        root = SimSysfsRoot(host.root, hold_fds=True, errno_overlay=host.errno_overlay)
        reader = HostReader(root)
        reader.read(full_gid_tables=True)
        reader.read()
        before = root.reads
        reader.read()
        return root.reads - before

    healthy = reads_per_poll(None)
    assert reads_per_poll(errno.EINVAL) == healthy
    assert reads_per_poll(errno.EIO) > healthy  # a failure is retried: the device is learned again


def test_a_device_removed_under_held_descriptors_is_not_a_warning_per_counter(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`rdma link delete rxe0` in the kernel lab: the counter reads through held descriptors answered
    ENODEV and serve logged a warning per hw_counters file before the device was seen gone."""
    host = SimHost.build(tmp_path / "sys", roce=2, ethernet_gbps=10, driver="rxe")
    overlay = host.errno_overlay
    agent = scraping_agent(host, overlay)
    try:
        assert agent.poll_once(full_gid_tables=True).errors == ()
        assert agent.counter_view(None).stats.counter_errors == ()
        held = [f"class/infiniband/rxe0/ports/1/hw_counters/{n}" for n in host.device("rxe0").hw_counters]
        host.remove_device("rxe0")
        overlay.update(dict.fromkeys(held, errno.ENODEV))
        with caplog.at_level(logging.INFO):
            stats = agent.counter_view(None).stats
            snap = agent.poll_once()
        assert stats.counter_errors == () and stats.counter_unsupported == ()
        assert [d.name for d in snap.devices] == ["rxe1"]
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "unreadable" in r.getMessage()]
    finally:
        agent.close()


def test_counters_the_driver_never_provided_are_not_read_errors(tmp_path: Path) -> None:
    """A port whose PMA never answers (a restricted function) is healthy: its `N/A (no PMA)` files are
    unsupported, and rnic_exporter_read_errors_total counts none of them (it counted every one)."""
    host = SimHost.build(tmp_path / "sys", roce=1, gid_table_size=8)
    host.without_pma("mlx5_0")
    agent = scraping_agent(host, {})
    try:
        agent.poll_once(full_gid_tables=True)
        for _ in range(2):
            view = agent.counter_view(None)
        assert len(view.stats.counter_unsupported) == len(PMA_EXTENDED_COUNTERS)
        assert view.stats.counter_errors == ()
        assert dict(view.stats.read_errors_by_reason) == {}
    finally:
        agent.close()
