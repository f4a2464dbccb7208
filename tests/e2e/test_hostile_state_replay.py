"""Issue 33's reliability findings replayed against `rnic-exporter serve` itself, as an operator or
an attacker met them: a symlinked lock, a full disk (a 64 KiB tmpfs), a state file the daemon's
user cannot read, a NIC excluded by SIGHUP and by restart, and a `device` link healed after
discovery. (The bcrypt flood is in tests/web/test_web_abuse.py.)"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from rnic_exporter.detect.state import LOCK_FILE, STATE_FILE
from rnic_exporter.sim import SimHost
from tests.support.exposition import Samples, samples
from tests.support.processes import exporter, free_port, http_get, stop_process
from tests.support.wait import wait_for

QUIET = ["--no-watch.netlink", "--no-watch.udev", "--no-collector.ethtool", "--poll.interval", "0.2"]
DISAPPEARED = "rnic.device.disappeared"
NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]


def serve_args(sysfs: Path, state: Path, port: int, *extra: str) -> list[str]:
    return [
        "serve",
        "--path.sysfs",
        str(sysfs),
        "--state.dir",
        str(state),
        "--web.listen-address",
        f"127.0.0.1:{port}",
        *QUIET,
        *extra,
    ]


def scrape(port: int) -> Samples:
    status, _, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    assert status == 200, body[:200]
    return samples(body.decode())


def value(got: Samples, name: str, **labels: str) -> float | None:
    return got.get((name, frozenset(labels.items())))


def polls(port: int) -> float:
    return value(scrape(port), "rnic_exporter_polls_total") or 0.0


def wait_polls(port: int, count: int = 3) -> None:
    start = polls(port)
    wait_for(lambda: polls(port) >= start + count, timeout=20, what=f"{count} more polls")


def no_disappearance(port: int) -> None:
    """Nothing judged gone: no device present at 0, no disappeared event counted."""
    got = scrape(port)
    absent = [dict(labels) for (name, labels), v in got.items() if name == "rnic_device_present" and v == 0]
    assert absent == [], absent
    gone = [dict(labels) for (name, labels), v in got.items() if name == "rnic_events_total" and v > 0]
    assert [g for g in gone if g["event"] == DISAPPEARED] == []


def inventory(state: Path) -> list[str]:
    return sorted(json.loads((state / STATE_FILE).read_text())["devices"])


@pytest.fixture
def host(tmp_path: Path) -> SimHost:
    return SimHost.build(tmp_path / "sys", roce=2, infiniband=1, gid_table_size=16)


# -- the lock ------------------------------------------------------------------------------------


def test_a_symlinked_lock_is_refused_in_one_line_and_its_target_is_untouched(host: SimHost, tmp_path: Path) -> None:
    decoy = tmp_path / "decoy"
    decoy.write_text("precious\n")
    state = tmp_path / "state"
    state.mkdir()
    (state / LOCK_FILE).symlink_to(decoy)
    result = subprocess.run(
        [sys.executable, "-m", "rnic_exporter", *serve_args(host.root, state, free_port())],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert decoy.read_text() == "precious\n"
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "symbolic link" in lines[0] and str(state / LOCK_FILE) in lines[0], result.stderr


@contextmanager
def full_tmpfs(where: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs at `where`, filled to the last byte; unmounted after."""
    if os.geteuid() != 0:
        pytest.fail("needs root: it mounts a small tmpfs to fill")
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(where)], check=True)
    try:
        fd = os.open(where / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
        finally:
            os.close(fd)
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def test_a_full_disk_does_not_stop_the_daemon(host: SimHost, tmp_path: Path) -> None:
    with full_tmpfs(tmp_path / "disk") as disk:
        state = disk / "state"
        port = free_port()
        log = tmp_path / "serve.log"
        with exporter(serve_args(host.root, state, port), ready_url=f"http://127.0.0.1:{port}/-/ready", log_path=log):
            wait_for(
                lambda: (value(scrape(port), "rnic_exporter_state_errors_total", reason="unwritable") or 0) >= 1,
                timeout=20,
                what="the failed writes to be counted",
            )
            assert value(scrape(port), "rnic_devices") == 3
        assert "Traceback" not in log.read_text()
        assert not (state / STATE_FILE).exists()


# -- the state file ------------------------------------------------------------------------------


@contextmanager
def world_readable_dir() -> Iterator[Path]:
    """A directory another user can reach (a test's tmp_path is root's alone); removed after."""
    path = Path(tempfile.mkdtemp(prefix="rnic-exporter-test-"))
    try:
        path.chmod(0o755)
        yield path
    finally:
        shutil.rmtree(path)


def unprivileged(args: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """`rnic-exporter <args>` as user and group nobody (65534), as a non-root daemon runs."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [*NOBODY, sys.executable, "-m", "rnic_exporter", *args],
            stdout=out,
            stderr=out,
        )


def test_a_state_file_the_daemon_cannot_read_is_kept_not_overwritten(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("needs root: the daemon runs as nobody over a state file it may not read")
    with world_readable_dir() as base:
        host = SimHost.build(base / "sys", roce=2, infiniband=1, gid_table_size=16)
        state = base / "state"
        port = free_port()
        with exporter(serve_args(host.root, state, port), ready_url=f"http://127.0.0.1:{port}/-/ready"):
            wait_for((state / STATE_FILE).exists, timeout=20, what="the inventory to be saved")
        before = (state / STATE_FILE).read_bytes()
        os.chown(state, 65534, 65534)  # the daemon's directory, but a file it may not read (EACCES)
        (state / LOCK_FILE).unlink()
        (state / STATE_FILE).chmod(0o600)
        host.set_speed("mlx5_0", 800)  # something new to learn: a save is due
        proc = unprivileged(serve_args(host.root, state, port), tmp_path / "serve.log")
        try:
            wait_for(
                lambda: proc.poll() is None and http_get(f"http://127.0.0.1:{port}/-/ready", timeout=1)[0] == 200,
                timeout=20,
                what="the daemon to serve",
            )
            wait_polls(port)
            assert (state / STATE_FILE).read_bytes() == before  # the inventory and baselines are still there
            assert (value(scrape(port), "rnic_exporter_state_errors_total", reason="unreadable") or 0) >= 3
            (state / STATE_FILE).chmod(0o644)  # readable again: saving resumes with what it held
            wait_for(lambda: (state / STATE_FILE).read_bytes() != before, timeout=20, what="a save after the heal")
            saved = json.loads((state / STATE_FILE).read_text())
            assert sorted(saved["devices"]) == sorted(json.loads(before)["devices"])
            assert saved["baselines"]["mlx5_0/1"]["rate_bytes_per_second"] == 800e9 / 8
        finally:
            stop_process(proc)
        assert "Traceback" not in (tmp_path / "serve.log").read_text()


# -- the inventory ---------------------------------------------------------------------------------


def test_a_nic_excluded_by_sighup_and_by_restart_never_pages_disappeared(host: SimHost, tmp_path: Path) -> None:
    config = tmp_path / "rnic-exporter.toml"
    config.write_text("")
    state = tmp_path / "state"
    port = free_port()
    args = serve_args(host.root, state, port, "--config", str(config))
    with exporter(args, ready_url=f"http://127.0.0.1:{port}/-/ready") as proc:
        wait_for(
            lambda: (
                inventory(state) == ["0000:11:00.0", "0000:19:00.0", "0000:21:00.0"]
                if (state / STATE_FILE).exists()
                else False
            ),
            timeout=20,
            what="three devices inventoried",
        )
        config.write_text("[collector.infiniband]\ndevice_exclude = '^mlx5_1$'\n")
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: value(scrape(port), "rnic_devices") == 2, timeout=20, what="the exclusion to take effect")
        wait_polls(port)
        no_disappearance(port)
        wait_for(lambda: inventory(state) == ["0000:11:00.0", "0000:21:00.0"], timeout=20, what="mlx5_1 to leave")
    with exporter(args, ready_url=f"http://127.0.0.1:{port}/-/ready"):  # restarted with the exclusion
        wait_polls(port)
        no_disappearance(port)
    check = ["check", "--path.sysfs", str(host.root), "--state.dir", str(state), "--config", str(config)]
    checked = subprocess.run(
        [sys.executable, "-m", "rnic_exporter", *check, "--no-netlink"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_device_link_healed_after_discovery_is_one_device(host: SimHost, tmp_path: Path) -> None:
    link = host.root / "class/infiniband/mlx5_1/device"
    target = os.readlink(link)
    link.unlink()  # not there yet when the daemon first reads the device
    state = tmp_path / "state"
    port = free_port()
    args = serve_args(host.root, state, port)
    with exporter(args, ready_url=f"http://127.0.0.1:{port}/-/ready"):
        wait_for(
            lambda: (state / STATE_FILE).exists() and any(k.startswith("guid:") for k in inventory(state)),
            timeout=20,
            what="mlx5_1 inventoried by its node GUID",
        )
        link.symlink_to(target)
        wait_for(
            lambda: inventory(state) == ["0000:11:00.0", "0000:19:00.0", "0000:21:00.0"],
            timeout=20,
            what="mlx5_1 known by its PCI address, and only so",
        )
        wait_polls(port)
        no_disappearance(port)
    with exporter(args, ready_url=f"http://127.0.0.1:{port}/-/ready"):
        wait_polls(port)
        no_disappearance(port)
