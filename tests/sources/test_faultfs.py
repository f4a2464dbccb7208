"""The faulty-sysfs FUSE filesystem (tests/support/faultfs.py) and the reading layer on top of it."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rnic_exporter.model.host import ReadError
from rnic_exporter.sim import SimHost
from rnic_exporter.sources.reader import HostReader
from rnic_exporter.sources.sysfs import SysfsRoot
from tests.support.faultfs import FaultyMount, faultfs_mounts, is_mounted, mount_faultfs
from tests.support.wait import wait_for

PORT = "class/infiniband/mlx5_1/ports/1"
RCV = f"{PORT}/counters/port_rcv_data"
XMIT = f"{PORT}/counters/port_xmit_data"
SICK = (errno.EIO, errno.EINVAL, errno.EOPNOTSUPP, errno.ENODEV, errno.EAGAIN, errno.ETIMEDOUT)


@pytest.fixture(autouse=True)
def no_mount_left_behind() -> Iterator[None]:
    """Runs its check after every fixture of the test (faulty_sysfs included) was torn down."""
    yield
    assert faultfs_mounts(os.getpid()) == []  # other processes' mounts (a soak running beside) are not ours


def _read_errno(path: Path) -> int:
    """The errno of open + read (os.read: Python's buffered read turns EAGAIN into an empty result)."""
    with pytest.raises(OSError) as caught:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.read(fd, 4096)
        finally:
            os.close(fd)
    assert caught.value.errno is not None
    return caught.value.errno


def _proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]


def _blocked_reader(path: Path) -> subprocess.Popen[bytes]:
    """A process stuck reading `path` (once the filesystem blocks it)."""
    code = "import sys; open(sys.argv[1], 'rb').read()"
    return subprocess.Popen([sys.executable, "-c", code, str(path)], stderr=subprocess.DEVNULL)


# -- the filesystem -----------------------------------------------------------------------------


def test_serves_the_backing_tree_exactly(faulty_sysfs: FaultyMount, sim_host: SimHost) -> None:
    """Every directory, file and symlink (with its own target) of the tree, and every file's bytes."""
    backing, mount = sim_host.root, faulty_sysfs.mount
    seen = 0
    for dirpath, dirnames, filenames in os.walk(backing):
        rel = os.path.relpath(dirpath, backing)
        assert sorted(os.listdir(mount / rel)) == sorted(dirnames + filenames), rel
        for name in dirnames + filenames:
            source, served = Path(dirpath, name), mount / rel / name
            if source.is_symlink():
                assert served.is_symlink() and os.readlink(served) == os.readlink(source)
            elif source.is_dir():
                assert served.is_dir() and not served.is_symlink()
            else:
                assert served.read_bytes() == source.read_bytes(), served
                assert served.stat().st_size == 4096  # a page, as sysfs says whatever the value
            seen += 1
    assert seen > 400  # 3 devices: counters, GID slots, links
    # The links a reader follows resolve inside the mount.
    assert os.path.realpath(mount / "class/infiniband/mlx5_1/device") == str(
        mount / sim_host.device("mlx5_1").function_dir
    )
    assert (mount / "class/infiniband/mlx5_1/device/net").is_dir()
    assert (mount / "class/infiniband/mlx5_1/device/../max_link_speed").read_text() == "32.0 GT/s PCIe\n"


def test_held_descriptor_reads_fresh_bytes(faulty_sysfs: FaultyMount, sim_host: SimHost) -> None:
    """pread on a descriptor held open sees each change of the backing file at once (no page cache)."""
    fd = os.open(faulty_sysfs.mount / RCV, os.O_RDONLY)
    try:
        before = os.pread(fd, 128, 0)
        for _ in range(3):
            sim_host.add_traffic(1.0)
            now = os.pread(fd, 128, 0)
            assert now == (sim_host.root / RCV).read_bytes() != before
            before = now
        sim_host.set_port_up("mlx5_1", False)
        assert (faulty_sysfs.mount / f"{PORT}/state").read_text() == "1: DOWN\n"
    finally:
        os.close(fd)


def test_held_descriptor_of_a_removed_device_reads_enodev(faulty_sysfs: FaultyMount, sim_host: SimHost) -> None:
    fd = os.open(faulty_sysfs.mount / RCV, os.O_RDONLY)
    try:
        sim_host.remove_device("mlx5_1")
        with pytest.raises(OSError) as caught:
            os.pread(fd, 128, 0)
        assert caught.value.errno == errno.ENODEV
        assert not (faulty_sysfs.mount / "class/infiniband/mlx5_1").exists()
        sim_host.restore_device("mlx5_1")
        with pytest.raises(OSError):  # a re-created file is a new node: the old descriptor stays dead
            os.pread(fd, 128, 0)
        assert (faulty_sysfs.mount / RCV).read_bytes() == (sim_host.root / RCV).read_bytes()
    finally:
        os.close(fd)


def test_each_errno_on_read_for_that_file_only(faulty_sysfs: FaultyMount) -> None:
    mount = faulty_sysfs.mount
    fd = os.open(mount / RCV, os.O_RDONLY)  # held across the faults, as the exporter holds it
    try:
        for code in SICK:
            faulty_sysfs.fail(RCV, code)
            with pytest.raises(OSError) as caught:
                os.pread(fd, 128, 0)
            assert caught.value.errno == code
            assert _read_errno(mount / RCV) == code
            assert (mount / XMIT).read_bytes()
            faulty_sysfs.heal(RCV)
            assert os.pread(fd, 128, 0) == (mount / RCV).read_bytes()
    finally:
        os.close(fd)


def test_glob_fails_every_counter_of_one_device(faulty_sysfs: FaultyMount) -> None:
    mount = faulty_sysfs.mount
    pattern = faulty_sysfs.fail(f"{PORT}/counters/*", errno.EINVAL)
    assert pattern.startswith("devices/") and pattern.endswith("/infiniband/mlx5_1/ports/1/counters/*")
    names = os.listdir(mount / PORT / "counters")
    assert len(names) > 10
    assert {_read_errno(mount / PORT / "counters" / n) for n in names} == {errno.EINVAL}
    assert (mount / "class/infiniband/mlx5_0/ports/1/counters/port_rcv_data").read_bytes()
    assert (mount / f"{PORT}/state").read_bytes()


def test_errno_on_open_and_on_listing(faulty_sysfs: FaultyMount) -> None:
    mount = faulty_sysfs.mount
    held = os.open(mount / RCV, os.O_RDONLY)
    try:
        faulty_sysfs.fail(RCV, errno.EACCES, op="open")
        assert _read_errno(mount / RCV) == errno.EACCES
        assert os.pread(held, 128, 0)  # an open descriptor is not affected by open faults
        faulty_sysfs.fail("class/infiniband", errno.EIO, op="list")
        with pytest.raises(OSError) as caught:
            os.listdir(mount / "class/infiniband")
        assert caught.value.errno == errno.EIO
        assert (mount / "class/infiniband/mlx5_0/node_guid").read_bytes()  # lookups still work
        faulty_sysfs.fail("class/infiniband/mlx5_0", errno.ENODEV, op="stat")
        with pytest.raises(OSError) as caught:
            os.stat(mount / "class/infiniband/mlx5_0/node_guid")  # a lookup through it fails too
        assert caught.value.errno == errno.ENODEV
        faulty_sysfs.clear()
        assert sorted(os.listdir(mount / "class/infiniband")) == ["mlx5_0", "mlx5_1", "mlx5_2"]
        assert (mount / RCV).read_bytes()
    finally:
        os.close(held)


def test_blocked_read_waits_for_release_while_others_are_served(faulty_sysfs: FaultyMount, sim_host: SimHost) -> None:
    mount = faulty_sysfs.mount
    faulty_sysfs.block(RCV)
    got: list[bytes] = []
    readers = [threading.Thread(target=lambda: got.append((mount / RCV).read_bytes())) for _ in range(12)]
    for reader in readers:
        reader.start()
    faulty_sysfs.wait_blocked(RCV, n=12)  # more than libfuse's default 10 worker threads
    for _ in range(20):  # every other file, device and listing meanwhile
        assert (mount / XMIT).read_bytes()
        assert os.listdir(mount / "class/infiniband/mlx5_0/ports/1/counters")
    assert not got and all(r.is_alive() for r in readers)
    sim_host.add_traffic(1.0)
    assert faulty_sysfs.release(RCV) == 1
    for reader in readers:
        reader.join(timeout=10)
    assert got == [(sim_host.root / RCV).read_bytes()] * 12  # served after release, fresh
    assert faulty_sysfs.blocked(RCV) == 0


def test_timed_block_then_errno(faulty_sysfs: FaultyMount) -> None:
    """A firmware command that times out: the read hangs for a while, then fails with ETIMEDOUT."""
    faulty_sysfs.block(RCV, seconds=0.3, errno=errno.ETIMEDOUT)
    started = time.monotonic()
    assert _read_errno(faulty_sysfs.mount / RCV) == errno.ETIMEDOUT
    assert time.monotonic() - started >= 0.3
    faulty_sysfs.block(XMIT, seconds=0.2)  # a slow read that then succeeds
    assert (faulty_sysfs.mount / XMIT).read_bytes()


def test_killed_reader_of_an_interruptible_block_goes_at_once(faulty_sysfs: FaultyMount) -> None:
    faulty_sysfs.block(RCV)
    proc = _blocked_reader(faulty_sysfs.mount / RCV)
    faulty_sysfs.wait_blocked(RCV)
    proc.kill()
    assert proc.wait(timeout=5) == -signal.SIGKILL
    wait_for(lambda: faulty_sysfs.blocked(RCV) == 0, timeout=5, what="the interrupted read to end")


def test_killed_reader_of_an_uninterruptible_block_stays_until_release(faulty_sysfs: FaultyMount) -> None:
    """As in an mlx5 firmware-command wait: D state, not reaped, until the read is answered."""
    faulty_sysfs.block(RCV, interruptible=False)
    proc = _blocked_reader(faulty_sysfs.mount / RCV)
    try:
        faulty_sysfs.wait_blocked(RCV)
        proc.kill()
        wait_for(lambda: _proc_state(proc.pid) == "D", timeout=5, what="the killed reader in D state")
        assert proc.poll() is None
        faulty_sysfs.release(RCV)
        assert proc.wait(timeout=5) == -signal.SIGKILL
    finally:
        faulty_sysfs.clear()
        proc.kill()
        proc.wait()


def test_read_counts(faulty_sysfs: FaultyMount) -> None:
    mount = faulty_sysfs.mount
    faulty_sysfs.reset_counts()
    fd = os.open(mount / RCV, os.O_RDONLY)
    try:
        for _ in range(7):
            os.pread(fd, 128, 0)
        faulty_sysfs.fail(RCV, errno.EINVAL)
        for _ in range(3):
            with pytest.raises(OSError):
                os.pread(fd, 128, 0)
    finally:
        os.close(fd)
    (mount / XMIT).read_bytes()  # read() asks until EOF: two reads
    assert faulty_sysfs.reads(RCV) == 10  # failed reads count too
    assert faulty_sysfs.opens(RCV) == 1
    assert faulty_sysfs.reads(f"{PORT}/counters/*") == 12
    assert faulty_sysfs.reads("class/infiniband/mlx5_0/ports/1/counters/*") == 0


def test_unmounts_and_releases_blocked_reads_when_the_test_fails(sim_host: SimHost) -> None:
    got: list[bytes | int] = []

    def read(path: Path) -> None:
        try:
            got.append(path.read_bytes())
        except OSError as exc:
            got.append(exc.errno or -1)

    with pytest.raises(RuntimeError), mount_faultfs(sim_host.root) as fs:
        fs.block(RCV)
        reader = threading.Thread(target=read, args=(fs.mount / RCV,))
        reader.start()
        fs.wait_blocked(RCV)
        raise RuntimeError("the test failed here")
    reader.join(timeout=10)
    assert got and not reader.is_alive()
    assert not is_mounted(fs.mount) and fs.proc.poll() is not None


def test_a_killed_server_leaves_no_mount_and_no_stuck_reader(sim_host: SimHost) -> None:
    errors: list[int] = []

    def read(path: Path) -> None:
        try:
            path.read_bytes()
        except OSError as exc:
            errors.append(exc.errno or -1)

    with mount_faultfs(sim_host.root) as fs:
        fs.block(RCV, interruptible=False)
        reader = threading.Thread(target=read, args=(fs.mount / RCV,))
        reader.start()
        fs.wait_blocked(RCV)
        fs.proc.kill()  # the server dies with a read in flight: the kernel aborts the connection
        reader.join(timeout=10)
        assert errors and errors[0] in (errno.ECONNABORTED, errno.ENOTCONN)
        wait_for(lambda: not is_mounted(fs.mount), timeout=10, what="auto_unmount to remove the mount")


# -- the reading layer on it ----------------------------------------------------------------------


def _counter_errors(errors: tuple[ReadError, ...]) -> list[tuple[str, int | None, str, str]]:
    return [(e.device, e.port, e.attribute, e.reason) for e in errors]


def test_host_reader_reports_each_errno_for_that_attribute_only(faulty_sysfs: FaultyMount, sim_host: SimHost) -> None:
    """Through the mount, each errno costs one attribute of one device; the rest reads as directly."""
    reader = HostReader(SysfsRoot(faulty_sysfs.mount, hold_fds=True))
    direct = HostReader(SysfsRoot(sim_host.root, hold_fds=True))
    try:
        healthy = reader.read()
        assert healthy.errors == ()
        assert healthy.devices == direct.read().devices
        for code in SICK:
            faulty_sysfs.fail(f"{PORT}/counters/symbol_error", code)
            sim_host.add_traffic(1.0)
            snap, expected = reader.read(), direct.read()
            assert _counter_errors(snap.errors) == [("mlx5_1", 1, "counters/symbol_error", errno.errorcode[code])]
            assert [snap.devices[0], snap.devices[2]] == [expected.devices[0], expected.devices[2]]
            sick, fine = snap.devices[1].ports[0], expected.devices[1].ports[0]
            assert "symbol_error" not in sick.counters
            assert sick.counters == {k: v for k, v in fine.counters.items() if k != "symbol_error"}
            assert sick.counters["port_rcv_data"] != healthy.devices[1].ports[0].counters["port_rcv_data"]
            faulty_sysfs.clear()
            recovered = reader.read()
            assert recovered.errors == ()
            assert recovered.devices == direct.read().devices
    finally:
        reader.close()
        direct.close()


def test_host_reader_on_a_failing_device_listing_keeps_going(faulty_sysfs: FaultyMount) -> None:
    reader = HostReader(SysfsRoot(faulty_sysfs.mount, hold_fds=True))
    try:
        before = reader.read()
        assert len(before.devices) == 3
        faulty_sysfs.fail("class/infiniband", errno.EIO, op="list")
        snap = reader.read()  # a failed listing is a failed pass, not an empty host: the devices stay
        assert snap.devices == before.devices
        assert _counter_errors(snap.errors) == [("-", None, "class/infiniband", "EIO")]
        faulty_sysfs.clear()
        assert len(reader.read().devices) == 3
    finally:
        reader.close()
