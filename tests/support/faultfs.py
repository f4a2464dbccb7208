"""A faulty sysfs: a FUSE filesystem serving a simulated tree and failing, per path and at runtime,
the way a sick NIC's attributes do.

    def test_restricted_counter(faulty_sysfs: FaultyMount, sim_host: SimHost) -> None:
        fs = faulty_sysfs                         # sim_host.root served read-through at fs.mount
        rel = "class/infiniband/mlx5_1/ports/1/counters/*"
        fs.fail(rel, errno.EINVAL)                # every counter of mlx5_1 answers EINVAL on read
        fs.block("class/infiniband/mlx5_0/ports/1/counters/port_rcv_data")   # blocks until released
        ...                                       # point the exporter at fs.mount
        fs.wait_blocked("class/infiniband/mlx5_0/ports/1/counters/port_rcv_data")
        assert fs.reads(rel) <= 5                 # read() calls that reached the filesystem
        fs.release("class/infiniband/mlx5_0/ports/1/counters/port_rcv_data")
        fs.clear()                                # every fault gone, every blocked read released

What it serves: files, directories and symlinks exactly as in the backing tree (symlinks are
answered with their own relative targets, so `device`, `device/net` and the PCI parents resolve
inside the mount). Nothing is cached by the kernel (direct_io, zero attribute/entry timeouts): a
`pread(fd, n, 0)` on a descriptor held open returns the backing file's bytes of that moment, as
sysfs regenerates a value on every read. Two more sysfs behaviours: a regular file's `st_size` is
4096 (a page, whatever the value's length), and a held descriptor whose backing file was removed or
replaced (the device fell off the bus) reads ENODEV, as kernfs answers for a removed node.

Faults, per path and at runtime (paths are relative to the mount and may go through symlinks, as a
reader names them; a `*`, `?` or `[...]` in them is a glob matched against the resolved path, `*`
also crossing `/`):
- `fail(path, errno, op="read")`: `op` is "read", "open", "list" (opendir: listing the directory
  fails) or "stat" (getattr; also fails a lookup, so the path looks absent for that errno).
- `block(path, seconds=None, errno=None, op="read", interruptible=True)`: reads (or opens) block
  until `release(path)`, `clear()`, or `seconds` pass; then they are served, or fail with `errno`.
  Every other path keeps being served meanwhile (a multi-threaded server; a blocked call holds one
  of its threads, `MAX_THREADS` in all).
- `reads(path)`, `opens(path)`: calls that reached the filesystem (glob: summed), faulted or not.
  `blocked(path)` / `wait_blocked(path)`: calls blocked right now.

How a blocked read looks to the reader: the thread sleeps in the kernel (state S while the kernel
still waits interruptibly, D once it was signalled). With `interruptible=True` any signal to the
blocked thread (SIGKILL of the process, or the SIGKILL every thread gets when the process exits)
makes the kernel send FUSE an INTERRUPT, and the blocked call answers EINTR within ~50 ms: a killed
reader goes away at once, a signalled one sees EINTR and Python retries the read (PEP 475), which
blocks again. With `interruptible=False` it models mlx5's uninterruptible firmware-command wait: a
killed reader stays in D state (its process cannot be reaped) until the read is released, times out,
or the server goes away. Killing the server ends every pending call with ECONNABORTED/ENOTCONN.

Robustness: the server is a separate process (`python faultfs.py serve ...`), so a blocked handler or
the GIL cannot wedge the test; it is controlled over a Unix socket speaking JSON lines. It is
mounted with `auto_unmount` (fusermount3 stays behind and unmounts when the server dies, however it
dies) and dies with its parent (PR_SET_PDEATHSIG). `FaultyMount.close()` - the fixture's
finalizer, run also when the test failed - releases every blocked call first (so the exporter under
test is not left in D state), unmounts lazily (`fusermount3 -uz`), then stops the server (SIGTERM,
then SIGKILL). A mount left by a killed run (its server gone) is removed by the next `mount_faultfs`.

Needs Debian's `fuse3` (fusermount3, libfuse3) and PyPI's `mfusepy` (ctypes bindings for libfuse 3:
pure Python, no compiler, no async framework), `/dev/fuse`, and root (or `user_allow_other`-free
fusermount3 use, which works for the calling user's own mounts).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno as errno_codes
import fnmatch
import json
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

FSNAME = "rnicfaultfs"  # mounts are named `rnicfaultfs-<test pid>-<server pid>` in /proc/mounts
MAX_THREADS = 64  # libfuse worker threads: each blocked call holds one
OPS = ("read", "open", "list", "stat")
BLOCKABLE = ("read", "open")
_GLOB = frozenset("*?[")
_PAGE = 4096
_POLL = 0.05  # how often a blocked call looks for an interrupt or its deadline


# -- the server (runs in its own process) -----------------------------------------------------


@dataclass
class _Block:
    pattern: str
    op: str
    errno: int | None
    deadline: float | None
    interruptible: bool
    released: threading.Event = field(default_factory=threading.Event)


class _Faults:
    """Rules and counts, shared by the FUSE handler threads and the control connections."""

    def __init__(self, backing: str) -> None:
        self.backing = os.path.realpath(backing)
        self.lock = threading.Lock()
        self.fails: dict[tuple[str, str], int] = {}  # (op, pattern) -> errno
        self.blocks: list[_Block] = []
        self.counts: Counter[tuple[str, str]] = Counter()  # (op, resolved path) -> calls
        self.waiting: Counter[tuple[str, str]] = Counter()  # (op, resolved path) -> blocked now
        # Whether the kernel sent INTERRUPT for the request this thread answers (its caller got a
        # signal): libfuse's fuse_interrupted(), set once libfuse is loaded.
        self.interrupted: Callable[[], bool] = lambda: False

    def resolve(self, rel: str) -> str:
        """`rel` as the server sees it: symlinks resolved, relative to the backing root.

        Only the part before the first glob component is resolved; the rest is kept as a pattern.
        """
        parts = [p for p in rel.strip("/").split("/") if p]
        fixed: list[str] = []
        for part in parts:
            if _GLOB & set(part):
                break
            fixed.append(part)
        rest = parts[len(fixed) :]
        real = os.path.realpath(os.path.join(self.backing, *fixed))
        if real != self.backing and not real.startswith(self.backing + "/"):
            raise ValueError(f"{rel!r} leads outside the served tree")
        head = os.path.relpath(real, self.backing)
        head = "" if head == "." else head
        return "/".join([head, *rest]) if head else "/".join(rest)

    @staticmethod
    def matches(pattern: str, path: str) -> bool:
        if _GLOB & set(pattern):
            return fnmatch.fnmatchcase(path, pattern)
        return pattern == path

    def check(self, op: str, path: str) -> None:
        """Count the call; block and/or raise as the rules say."""
        with self.lock:
            self.counts[op, path] += 1
            block = next((b for b in self.blocks if b.op == op and self.matches(b.pattern, path)), None)
            code = next((c for (o, p), c in self.fails.items() if o == op and self.matches(p, path)), None)
        if block is not None:
            self._wait(block, op, path)
            if block.errno is not None:
                raise OSError(block.errno, os.strerror(block.errno))
        if code is not None:
            raise OSError(code, os.strerror(code))

    def _wait(self, block: _Block, op: str, path: str) -> None:
        with self.lock:
            self.waiting[op, path] += 1
        try:
            while not block.released.wait(_POLL):
                if block.deadline is not None and time.monotonic() >= block.deadline:
                    return
                if block.interruptible and self.interrupted():
                    raise OSError(errno_codes.EINTR, os.strerror(errno_codes.EINTR))
        finally:
            with self.lock:
                self.waiting[op, path] -= 1
                if not self.waiting[op, path]:
                    del self.waiting[op, path]

    # -- control requests -------------------------------------------------------------------

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        cmd = request["cmd"]
        if cmd == "ping":
            return {"pid": os.getpid()}
        if cmd == "resolve":
            return {"path": self.resolve(request["path"])}
        op = request.get("op", "read")
        if cmd in ("fail", "block") and op not in (OPS if cmd == "fail" else BLOCKABLE):
            raise ValueError(f"{cmd}: unknown op {op!r}")
        pattern = self.resolve(request["path"]) if "path" in request else None
        with self.lock:
            if cmd == "fail":
                assert pattern is not None
                self.fails[op, pattern] = int(request["errno"])
                return {"pattern": pattern}
            if cmd == "block":
                assert pattern is not None
                seconds = request.get("seconds")
                code = request.get("errno")
                self.blocks.append(
                    _Block(
                        pattern,
                        op,
                        None if code is None else int(code),
                        None if seconds is None else time.monotonic() + float(seconds),
                        bool(request.get("interruptible", True)),
                    )
                )
                return {"pattern": pattern}
            if cmd in ("release", "clear"):
                # `release` ends blocks only; `clear` (of one path, or of all) ends faults too.
                gone = [b for b in self.blocks if pattern is None or b.pattern == pattern]
                for b in gone:
                    b.released.set()
                self.blocks = [b for b in self.blocks if b not in gone]
                if cmd == "clear":
                    self.fails = {k: v for k, v in self.fails.items() if pattern is not None and k[1] != pattern}
                return {"released": len(gone)}
            if cmd == "count":
                assert pattern is not None
                table = self.waiting if request.get("what") == "blocked" else self.counts
                return {"n": sum(n for (o, p), n in table.items() if o == op and self.matches(pattern, p))}
            if cmd == "reset_counts":
                self.counts.clear()
                return {}
        raise ValueError(f"unknown command {cmd!r}")


def _serve_control(sock: socket.socket, faults: _Faults) -> None:
    while True:
        conn, _ = sock.accept()
        threading.Thread(target=_control_connection, args=(conn, faults), daemon=True).start()


def _control_connection(conn: socket.socket, faults: _Faults) -> None:
    with conn, conn.makefile("rwb") as stream:
        for line in stream:
            try:
                reply = {"ok": True, **faults.handle(json.loads(line))}
            except Exception as exc:  # a bad request is answered, never fatal to the server
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            stream.write(json.dumps(reply).encode() + b"\n")
            stream.flush()


def _operations(faults: _Faults) -> Any:
    import mfusepy  # type: ignore[import-untyped]  # only the server process needs libfuse

    fuse_interrupted = mfusepy._libfuse.fuse_interrupted
    fuse_interrupted.restype = ctypes.c_int
    fuse_interrupted.argtypes = []
    faults.interrupted = lambda: bool(fuse_interrupted())
    backing = faults.backing

    @dataclass
    class Handle:
        fd: int
        rel: str
        ident: tuple[int, int]

    class FaultOps(mfusepy.Operations):  # type: ignore[misc]
        use_ns = True

        def __init__(self) -> None:
            self._handles: dict[int, Handle] = {}
            self._next_fh = 1
            self._handles_lock = threading.Lock()

        def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
            rel = path.lstrip("/")
            faults.check("stat", rel)
            st = os.lstat(os.path.join(backing, rel))
            attrs = {
                key: getattr(st, key)
                for key in (
                    "st_mode",
                    "st_ino",
                    "st_nlink",
                    "st_uid",
                    "st_gid",
                    "st_size",
                    "st_atime_ns",
                    "st_mtime_ns",
                    "st_ctime_ns",
                )
            }
            for key in ("st_atime", "st_mtime", "st_ctime"):
                attrs[key] = attrs.pop(key + "_ns")
            if stat.S_ISREG(st.st_mode):
                attrs["st_size"] = _PAGE  # as sysfs: a page, whatever the value's length
            return attrs

        def readlink(self, path: str) -> str:
            return os.readlink(os.path.join(backing, path.lstrip("/")))

        def opendir(self, path: str) -> int:
            faults.check("list", path.lstrip("/"))
            return 0

        def readdir(self, path: str, fh: int) -> list[Any]:
            entries: list[Any] = [".", ".."]
            with os.scandir(os.path.join(backing, path.lstrip("/"))) as it:
                for entry in it:
                    # st_ino too: readdir(3) skips entries whose d_ino is 0
                    st = entry.stat(follow_symlinks=False)
                    entries.append((entry.name, {"st_mode": st.st_mode, "st_ino": st.st_ino}, 0))
            return entries

        def open(self, path: str, fi: Any) -> int:
            rel = path.lstrip("/")
            if fi.flags & (os.O_WRONLY | os.O_RDWR):
                raise OSError(errno_codes.EROFS, os.strerror(errno_codes.EROFS))
            faults.check("open", rel)
            fd = os.open(os.path.join(backing, rel), os.O_RDONLY | os.O_CLOEXEC)
            st = os.fstat(fd)
            with self._handles_lock:
                fh = self._next_fh
                self._next_fh += 1
                self._handles[fh] = Handle(fd, rel, (st.st_dev, st.st_ino))
            fi.fh = fh
            fi.direct_io = 1  # every read reaches us: no page cache between reader and value
            fi.keep_cache = 0
            return 0

        def read(self, path: str, size: int, offset: int, fi: Any) -> bytes:
            handle = self._handles[fi.fh]
            faults.check("read", handle.rel)
            try:
                st = os.stat(os.path.join(backing, handle.rel))
                current = (st.st_dev, st.st_ino)
            except FileNotFoundError:
                current = None
            if current != handle.ident:  # removed or re-created: kernfs answers a stale fd so
                raise OSError(errno_codes.ENODEV, os.strerror(errno_codes.ENODEV))
            return os.pread(handle.fd, size, offset)

        def release(self, path: str, fi: Any) -> int:
            with self._handles_lock:
                handle = self._handles.pop(fi.fh, None)
            if handle is not None:
                os.close(handle.fd)
            return 0

        def statfs(self, path: str) -> dict[str, Any]:
            st = os.statvfs(backing)
            return {
                key: getattr(st, key)
                for key in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_namemax")
            }

    return mfusepy, FaultOps()


def serve(backing: str, mount: str, control: str) -> None:
    """The server process: control socket first, then the FUSE loop until unmounted or signalled."""
    with contextlib.suppress(OSError, AttributeError):  # die with the test process that started us
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="faultfs: %(levelname)s %(message)s")
    faults = _Faults(backing)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(control)
    sock.listen(16)
    threading.Thread(target=_serve_control, args=(sock, faults), daemon=True).start()
    mfusepy, ops = _operations(faults)
    mfusepy.FUSE(
        ops,
        mount,
        raw_fi=True,
        foreground=True,
        fsname=f"{FSNAME}-{os.getppid()}-{os.getpid()}",
        ro=True,
        auto_unmount=True,
        default_permissions=True,
        attr_timeout=0,
        entry_timeout=0,
        negative_timeout=0,
        use_ino=True,
        direct_io=True,
        max_threads=MAX_THREADS,
        max_idle_threads=8,
    )


# -- the test side ----------------------------------------------------------------------------


class FaultfsError(AssertionError):
    """The server refused a request, or could not be started or reached."""


class FaultyMount:
    """A mounted faulty sysfs and its control connection. Use `mount_faultfs` or the fixture."""

    def __init__(self, backing: Path, mount: Path, control: Path, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.backing = backing
        self.mount = mount
        self._control = control
        self.proc = proc
        self._log = log
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._stream: Any = None
        self.closed = False

    # -- requests ---------------------------------------------------------------------------

    def ping(self) -> None:
        """One round trip to the server: it is up and answering."""
        self._request(cmd="ping")

    def _request(self, **request: Any) -> dict[str, Any]:
        with self._lock:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self._sock.settimeout(10)
                self._sock.connect(str(self._control))
                self._stream = self._sock.makefile("rwb")
            self._stream.write(json.dumps(request).encode() + b"\n")
            self._stream.flush()
            line = self._stream.readline()
        if not line:
            raise FaultfsError(f"faultfs server closed the control connection; its log: {self.server_log()}")
        reply: dict[str, Any] = json.loads(line)
        if not reply.pop("ok"):
            raise FaultfsError(f"faultfs refused {request}: {reply['error']}")
        return reply

    def fail(self, path: str, code: int, *, op: str = "read") -> str:
        """`op` ("read", "open", "list", "stat") on `path` fails with errno `code` until cleared.
        Returns the resolved pattern the server matches."""
        return str(self._request(cmd="fail", path=path, errno=code, op=op)["pattern"])

    def block(
        self,
        path: str,
        *,
        seconds: float | None = None,
        errno: int | None = None,
        op: str = "read",
        interruptible: bool = True,
    ) -> str:
        """Calls of `op` on `path` block until released (or for `seconds`), then are served, or fail
        with `errno` if given (a firmware command that timed out: ETIMEDOUT)."""
        return str(
            self._request(cmd="block", path=path, seconds=seconds, errno=errno, op=op, interruptible=interruptible)[
                "pattern"
            ]
        )

    def release(self, path: str) -> int:
        """Ends the blocks set on exactly `path`; returns how many rules ended."""
        return int(self._request(cmd="release", path=path)["released"])

    def heal(self, path: str) -> None:
        """Every fault and block set on exactly `path` ends."""
        self._request(cmd="clear", path=path)

    def clear(self) -> None:
        """Every fault and block ends; blocked calls are released (and served)."""
        self._request(cmd="clear")

    def reads(self, path: str) -> int:
        return int(self._request(cmd="count", path=path, op="read")["n"])

    def opens(self, path: str) -> int:
        return int(self._request(cmd="count", path=path, op="open")["n"])

    def calls(self, path: str, op: str) -> int:
        return int(self._request(cmd="count", path=path, op=op)["n"])

    def blocked(self, path: str, *, op: str = "read") -> int:
        return int(self._request(cmd="count", path=path, op=op, what="blocked")["n"])

    def wait_blocked(self, path: str, *, n: int = 1, timeout: float = 10, op: str = "read") -> None:
        """Until at least `n` calls are blocked on `path` (the reader under test got stuck)."""
        deadline = time.monotonic() + timeout
        while self.blocked(path, op=op) < n:
            if time.monotonic() >= deadline:
                raise AssertionError(f"no {op} blocked on {path} after {timeout}s")
            time.sleep(0.02)

    def reset_counts(self) -> None:
        self._request(cmd="reset_counts")

    def resolve(self, path: str) -> str:
        return str(self._request(cmd="resolve", path=path)["path"])

    def server_log(self) -> str:
        try:
            return self._log.read_text(errors="replace")[-4000:]
        except OSError:
            return "(no log)"

    # -- teardown ---------------------------------------------------------------------------

    def close(self) -> None:
        """Release blocked calls, unmount (lazily: a reader still inside cannot stop it), stop the
        server. Safe to call twice and after the server died."""
        if self.closed:
            return
        self.closed = True
        if self.proc.poll() is None:
            with contextlib.suppress(Exception):
                self.clear()
        with self._lock:
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    self._stream.close()
                    self._sock.close()
                self._sock = None
        unmount(self.mount)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # fusermount3's auto_unmount watchdog unmounts once the server is gone; wait for it.
        deadline = time.monotonic() + 5
        while is_mounted(self.mount) and time.monotonic() < deadline:
            time.sleep(0.02)
        if is_mounted(self.mount):
            unmount(self.mount)


def _mounts() -> list[tuple[str, str, str]]:
    """(source, mount point, type) of every mount of this mount namespace."""
    out = []
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 3:
                # /proc/mounts escapes blanks as octal (\040)
                out.append((fields[0], fields[1].encode().decode("unicode_escape"), fields[2]))
    return out


def faultfs_mounts(owner: int | None = None) -> list[str]:
    """Mount points of faultfs mounts made by process `owner` (None: anyone's)."""
    prefix = f"{FSNAME}-" if owner is None else f"{FSNAME}-{owner}-"
    return [point for source, point, _ in _mounts() if source.startswith(prefix)]


def is_mounted(mount: Path) -> bool:
    return str(mount) in {point for _, point, _ in _mounts()}


def _fusermount() -> str:
    from tests.support.processes import require_binary

    return require_binary("fusermount3")


def unmount(mount: Path) -> None:
    if is_mounted(mount):
        subprocess.run([_fusermount(), "-uz", str(mount)], capture_output=True, timeout=10)


def remove_stale_mounts() -> None:
    """Unmount faultfs mounts whose server process is gone (a run killed before its finalizers)."""
    for source, point, _ in _mounts():
        if not source.startswith(FSNAME + "-"):
            continue
        pid = source.rpartition("-")[2]  # the server's
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            subprocess.run([_fusermount(), "-uz", point], capture_output=True, timeout=10)


@contextmanager
def mount_faultfs(backing: Path, mount: Path | None = None, *, timeout: float = 15) -> Iterator[FaultyMount]:
    """Mount a faulty view of `backing` (at `mount`, or a new temporary directory) for the block."""
    _fusermount()
    if not os.path.exists("/dev/fuse"):
        raise AssertionError("/dev/fuse is missing: load the fuse module (modprobe fuse)")
    remove_stale_mounts()
    with tempfile.TemporaryDirectory(prefix="faultfs-") as work:
        mount = Path(mount) if mount is not None else Path(work) / "sys"
        mount.mkdir(parents=True, exist_ok=True)
        control = Path(work) / "control.sock"
        log = Path(work) / "server.log"
        with open(log, "wb") as log_file:
            proc = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "serve", str(backing), str(mount), str(control)],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        fs = FaultyMount(Path(backing), mount, control, proc, log)
        try:
            deadline = time.monotonic() + timeout
            while not (control.exists() and is_mounted(mount)):
                if proc.poll() is not None:
                    raise FaultfsError(f"faultfs server exited with {proc.returncode}: {fs.server_log()}")
                if time.monotonic() >= deadline:
                    raise FaultfsError(f"faultfs not mounted at {mount} after {timeout}s: {fs.server_log()}")
                time.sleep(0.02)
            fs.ping()
            yield fs
        finally:
            fs.close()


MountFactory = Callable[[Path], FaultyMount]


@pytest.fixture
def faulty_sysfs(sim_host: Any) -> Iterator[FaultyMount]:
    """The `sim_host` tree served through faultfs (`.mount`), unmounted after the test, also when it failed."""
    with mount_faultfs(sim_host.root) as fs:
        yield fs


@pytest.fixture
def faultfs_factory() -> Iterator[MountFactory]:
    """`faultfs_factory(backing_dir) -> FaultyMount`, as many as a test asks for, each unmounted
    after the test, also when it failed."""
    with contextlib.ExitStack() as stack:

        def mount(backing: Path) -> FaultyMount:
            return stack.enter_context(mount_faultfs(backing))

        yield mount


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="faulty sysfs FUSE server (see the module docstring)")
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("backing")
    s.add_argument("mount")
    s.add_argument("control")
    args = parser.parse_args(argv)
    serve(args.backing, args.mount, args.control)


if __name__ == "__main__":
    main()
