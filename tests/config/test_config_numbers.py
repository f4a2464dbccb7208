"""Numbers and broken files in the config (issue 14.4, 14.5) and one resolver for serve and check (11.6).

One validator checks every number whether it comes from a flag or the file; a file that cannot be
read as our schema is one line and exit 2 at start-up, and leaves the running config alone on SIGHUP.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rnic_exporter.cli import main
from rnic_exporter.config import file as config
from rnic_exporter.errors import ConfigError
from rnic_exporter.sim import SimHost
from tests.support.processes import free_port, http_get, stop_process
from tests.support.wait import wait_for

LAUGHS = (
    "a: &a [x, x, x, x, x, x, x, x, x]\n"
    + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))
    + "poll_interval_seconds: *i\n"
)

BROKEN: list[tuple[str, bytes]] = [
    ("toml", b"poll_interval_seconds = nan\n"),
    ("toml", b"poll_interval_seconds = inf\n"),
    ("toml", b"poll_interval_seconds = -inf\n"),
    ("toml", b"poll_interval_seconds = 1e-9\n"),
    ("toml", b"poll_interval_seconds = 0.01\n"),  # below the flag's floor: the same floor here
    ("toml", b"poll_interval_seconds = 1e400\n"),
    ("toml", b"[flapping]\nwindow_seconds = nan\n"),
    ("toml", b"[flapping]\nclear_after_seconds = inf\n"),
    ("toml", b"[addresses]\nforget_after_seconds = -1\n"),
    ("toml", b"[inventory]\nexpected_devices = " + b"9" * 5000 + b"\n"),
    ("toml", b"[[rated]]\nmatch = { device = 'mlx5_0' }\nport_rate_gbps = nan\n"),
    ("toml", b"[[rated]]\nmatch = { device = 'mlx5_0' }\npcie_speed_gts = inf\n"),
    ("toml", b"[[rated]]\nmatch = { device = 'mlx5_0' }\nport_width = 1e3\n"),
    ("toml", b"x = " + b"[" * 500 + b"]" * 500 + b"\n"),
    ("toml", b"poll_interval_seconds = 5\n# \xff\n"),
    ("yml", b"poll_interval_seconds: .nan\n"),
    ("yml", b"poll_interval_seconds: .inf\n"),
    ("yml", b"poll_interval_seconds: -.inf\n"),
    ("yml", b"flapping:\n  window_seconds: .nan\n"),
    ("yml", b"poll_interval_seconds: 5\npoll_interval_seconds: 0.1\n"),  # duplicate key
    ("yml", b"x: " + b"[" * 500 + b"]" * 500 + b"\n"),
    ("yml", b"x: " + b"[" * 100_000 + b"]" * 100_000 + b"\n"),
    ("yml", b"1: 2\n"),
    ("yml", b"? [a, b]\n: 1\n"),
    ("yml", b"poll_interval_seconds: !!python/object/apply:os.system [true]\n"),
    ("yml", LAUGHS.encode()),
    ("yml", b"\xfe\xff"),
    ("yml", b"rated: [{match: {device: mlx5_0}, port_rate_gbps: .inf}]\n"),
]


@pytest.mark.parametrize(("suffix", "content"), BROKEN)
def test_a_broken_file_is_one_config_error(tmp_path: Path, suffix: str, content: bytes) -> None:
    path = tmp_path / f"rnic.{suffix}"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        config.load(path)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message and len(message) < 2500


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0.01", "1e400", "NaN", "x"])
def test_the_flag_refuses_what_the_file_refuses(tmp_path: Path, value: str) -> None:
    # A child with a deadline: a flag let through would start a daemon that never returns.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rnic_exporter",
            "serve",
            "--path.sysfs",
            str(tmp_path),
            "--poll.interval",
            value,
            "--web.listen-address",
            f"127.0.0.1:{free_port()}",
            "--state.dir",
            "",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert "--poll.interval" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("flag", "value", "key", "file_value"),
    [
        ("--expected-devices", "0", "inventory.expected_devices", "0"),
        ("--expected-devices", "4097", "inventory.expected_devices", "4097"),
    ],
)
def test_checks_flags_are_bounded_like_the_file(
    tmp_path: Path, flag: str, value: str, key: str, file_value: str
) -> None:
    # check runs in job prologues: a flag the file would refuse must not be judged against silently.
    section, name = key.split(".")
    path = tmp_path / "rnic.toml"
    path.write_text(f"[{section}]\n{name} = {file_value}\n")
    with pytest.raises(ConfigError) as from_file:
        config.load(path)
    result = CliRunner().invoke(main, ["check", "--path.sysfs", str(tmp_path), flag, value])
    assert result.exit_code == 2, result.output
    assert flag in result.stderr and "Traceback" not in result.stderr
    bound = str(from_file.value).split("expected ", 1)[1].split(", got")[0]
    assert f"expected {bound}, got {value}" in result.stderr


def test_the_environments_gid_index_is_read_as_nccl_reads_it(tmp_path: Path) -> None:
    # NCCL pins 99999 and then fails to query it: a problem on every RoCE port, never a usage error.
    result = CliRunner(env={"NCCL_IB_GID_INDEX": "99999"}).invoke(main, ["check", "--path.sysfs", str(tmp_path)])
    assert result.exit_code != 2, result.output
    for value in ("-2", "0x3", "010"):
        path = tmp_path / "rnic.toml"
        path.write_text(f"[nccl]\nib_gid_index = {value!r}\n")
        assert config.load(path).nccl_gid_index == {"-2": -2, "0x3": 3, "010": 8}[value]
        flag = CliRunner().invoke(main, ["check", "--path.sysfs", str(tmp_path), "--nccl-gid-index", value])
        assert flag.exit_code != 2, flag.output


def test_the_floor_is_the_same_from_flag_and_file(tmp_path: Path) -> None:
    path = tmp_path / "rnic.toml"
    path.write_text("poll_interval_seconds = 0.04\n")
    with pytest.raises(ConfigError, match=r">= 0\.05"):
        config.load(path)
    flag = CliRunner().invoke(main, ["serve", "--path.sysfs", str(tmp_path), "--poll.interval", "0.04"])
    assert flag.exit_code == 2 and ">= 0.05" in flag.stderr  # refused before serving: cannot hang
    with pytest.raises(ConfigError, match=r"--poll\.interval"):
        config.resolve(None, poll_interval_s=float("nan"))  # a programmatic value is checked too
    path.write_text("poll_interval_seconds = 0.05\n")
    assert config.load(path).poll_interval_seconds == 0.05


@pytest.mark.parametrize(("suffix", "content"), [BROKEN[0], BROKEN[14], BROKEN[15], BROKEN[17], BROKEN[22]])
def test_serve_with_a_broken_file_exits_2_in_one_line(tmp_path: Path, suffix: str, content: bytes) -> None:
    host = SimHost.build(tmp_path / "sys", roce=1, infiniband=0, gid_table_size=16)
    path = tmp_path / f"rnic.{suffix}"
    path.write_bytes(content)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rnic_exporter",
            "serve",
            "--path.sysfs",
            str(host.root),
            "--config",
            str(path),
            "--web.listen-address",
            f"127.0.0.1:{free_port()}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert str(path) in proc.stderr


def _series(url: str, name: str) -> float | None:
    status, _, body = http_get(url, timeout=2)
    if status != 200:
        return None
    for line in body.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_sighup_with_broken_files_keeps_the_running_config_and_a_good_one_recovers(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=2, infiniband=0, gid_table_size=16)
    path = tmp_path / "rnic.toml"
    path.write_text("poll_interval_seconds = 0.2\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rnic_exporter",
            "serve",
            "--path.sysfs",
            str(host.root),
            "--config",
            str(path),
            "--web.listen-address",
            f"127.0.0.1:{port}",
            "--no-watch.netlink",
            "--no-watch.udev",
            "--no-collector.ethtool",
            "--log.format",
            "json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        reload_ok = "rnic_exporter_config_last_reload_successful"
        polls = "rnic_exporter_polls_total"
        wait_for(lambda: _series(url, "rnic_devices") == 2, timeout=20, what="first scrape")
        for broken in (
            b"poll_interval_seconds = nan\n",
            b"poll_interval_seconds = inf\n",
            b"x = " + b"[" * 500 + b"]" * 500 + b"\n",
            b"poll_interval_seconds = 1\n\xff\n",
            b"poll_interval_seconds = 1e-9\n",
        ):
            path.write_bytes(broken)
            proc.send_signal(signal.SIGHUP)
            wait_for(lambda: _series(url, reload_ok) == 0, timeout=10, what=f"reload of {broken[:30]!r} refused")
            before = _series(url, polls) or 0.0

            def moved(since: float = before) -> bool:
                return (_series(url, polls) or 0.0) >= since + 3

            wait_for(moved, timeout=10, what="polling to go on at the running 0.2 s")
            path.write_text("poll_interval_seconds = 0.2\n")  # reset, so each case starts from a good reload
            proc.send_signal(signal.SIGHUP)
            wait_for(lambda: _series(url, reload_ok) == 1, timeout=10, what="a good reload to recover")
        path.write_text("poll_interval_seconds = 0.2\n[collector.infiniband]\ndevice_exclude = '^mlx5_0$'\n")
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: _series(url, "rnic_devices") == 1, timeout=10, what="the good file to take effect")
        assert http_get(f"http://127.0.0.1:{port}/-/healthy")[0] == 200
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    finally:
        stop_process(proc)
    assert proc.returncode == 0
    records = [json.loads(line) for line in err.decode().splitlines()]
    failures = [r for r in records if r["msg"] == "config reload failed; keeping the running config"]
    assert len(failures) == 5 and all("\n" not in r["err"] for r in failures)


def test_check_honours_the_files_device_filters_as_serve_does(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=2, infiniband=1, gid_table_size=16)
    path = tmp_path / "rnic.toml"
    path.write_text("[collector.infiniband]\ndevice_exclude = '^mlx5_[01]$'\n")
    result = CliRunner().invoke(
        main,
        ["check", "--path.sysfs", str(host.root), "--config", str(path), "--state.dir", "", "--no-netlink", "--json"],
    )
    assert result.exit_code in (0, 1), result.output
    assert json.loads(result.output)["devices"] == 1  # only mlx5_2: the file's exclude applies
    # The flag beats the file, as in serve.
    result = CliRunner().invoke(
        main,
        [
            "check",
            "--path.sysfs",
            str(host.root),
            "--config",
            str(path),
            "--collector.infiniband.device-exclude",
            "^mlx5_2$",
            "--state.dir",
            "",
            "--no-netlink",
            "--json",
        ],
    )
    assert json.loads(result.output)["devices"] == 2  # mlx5_0 and mlx5_1


def test_resolve_orders_flag_file_default(tmp_path: Path) -> None:
    path = tmp_path / "rnic.yml"
    path.write_text("poll_interval_seconds: 2\ncollector:\n  infiniband:\n    device_include: '^mlx5_'\n")
    from_file = config.resolve(path, poll_interval_s=5.0)
    assert from_file.poll_interval_s == 2.0
    assert from_file.reader.device_include is not None and from_file.reader.device_include.pattern == "^mlx5_"
    flags = config.resolve(
        path, poll_interval_s=7.0, device_include="^ib", explicit={"poll_interval", "device_include"}
    )
    assert flags.poll_interval_s == 7.0
    assert flags.reader.device_include is not None and flags.reader.device_include.pattern == "^ib"
