"""Real processes that hold `/dev/infiniband/uverbsN` open, placed in real cgroups.

A holder is `unshare --mount` (a private mount namespace, so the host's `/dev` is never touched)
that mounts a tmpfs on `/dev`, makes `/dev/infiniband/uverbsN` character device nodes there and
execs `sleep` with them open. No verbs driver is loaded here, and opening a node of major 231
would fail with ENXIO: each node gets the number of a memory device that opens anywhere
(`/dev/full` 1:7, `/dev/random` 1:8, `/dev/urandom` 1:9), and the simulated sysfs says the same
number in `infiniband_verbs/uverbsN/dev`, so the scan's match by device number is what is tested.

Cgroups: the test mounts the unified (v2) hierarchy and a named v1 hierarchy of its own in its
temporary directory, creates everything under `rnic-exporter-test-<pid>/` and, on exit (also when
the test failed), kills the holders first, removes the directories deepest first and unmounts.
A run that was killed leaves directories named after a dead pid: the next run removes them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.processes import pid_alive, require_binary
from tests.support.wait import wait_for

# Device numbers a holder's node can have, one per uverbs node it opens (see the module doc).
OPENABLE_CHAR_DEVICES = ((1, 7), (1, 8), (1, 9))
V1_NAME = "rnictest"  # the named v1 hierarchy: no controllers, so nothing on the host is affected
PREFIX = "rnic-exporter-test-"


def _mount(kind: str, options: str, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run([require_binary("mount"), "-t", kind, "-o", options, kind, str(target)], check=True)


def _umount(target: Path) -> None:
    """A plain umount, so that an emptied named hierarchy is destroyed; lazy only if busy."""
    if subprocess.run([require_binary("umount"), str(target)], check=False).returncode != 0:
        subprocess.run([require_binary("umount"), "-l", str(target)], check=False)


def _remove_tree(top: Path) -> None:
    """rmdir every cgroup under `top`, deepest first; a cgroup whose last task was just reaped
    may still read as busy for a moment (EBUSY), so each removal is waited on."""
    if not top.is_dir():
        return
    dirs = sorted((Path(d) for d, _, _ in os.walk(top)), key=lambda p: len(p.parts), reverse=True)
    for path in dirs:

        def removed(path: Path = path) -> bool:
            try:
                path.rmdir()
            except FileNotFoundError:
                return True
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
                for pid in (path / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
                return False
            return True

        wait_for(removed, timeout=10, what=f"cgroup {path} to be removable")


@dataclass
class Cgroups:
    """The test's own subtree in the unified hierarchy (`v2`) and in its named v1 hierarchy (`v1`)."""

    v2: Path
    v1: Path
    made: list[Path] = field(default_factory=list)

    def place(self, pid: int, rel: str, *, v1: bool = False) -> Path:
        """Move `pid` into `<subtree>/<rel>` (created if need be) of the v1 or the v2 hierarchy."""
        path = (self.v1 if v1 else self.v2) / rel.strip("/")
        path.mkdir(parents=True, exist_ok=True)
        (path / "cgroup.procs").write_text(f"{pid}\n")
        return path


@contextlib.contextmanager
def cgroups(workdir: Path) -> Iterator[Cgroups]:
    """Mount both hierarchies under `workdir`, yield the test's subtrees, clean everything up."""
    v2_mount, v1_mount = workdir / "cgroup2", workdir / "cgroup1"
    mounted: list[Path] = []
    try:
        _mount("cgroup2", "rw", v2_mount)
        mounted.append(v2_mount)
        _mount("cgroup", f"none,name={V1_NAME}", v1_mount)
        mounted.append(v1_mount)
        for root in mounted:
            _remove_leftovers(root)
        top = f"{PREFIX}{os.getpid()}"
        groups = Cgroups(v2_mount / top, v1_mount / top)
        try:
            yield groups
        finally:
            for subtree in (groups.v2, groups.v1):
                _remove_tree(subtree)
    finally:
        for target in reversed(mounted):
            _umount(target)
        if v1_mount in mounted:
            _destroy_named_hierarchy(v1_mount)


def _destroy_named_hierarchy(target: Path) -> None:
    """An unmounted named hierarchy is destroyed only once no removed cgroup of it is still
    dying; one unmounted too soon stays listed in /proc/<pid>/cgroup. Mount and unmount it again
    until it is gone."""

    def gone() -> bool:
        if f":name={V1_NAME}:" not in Path("/proc/self/cgroup").read_text():
            return True
        _mount("cgroup", f"none,name={V1_NAME}", target)
        _umount(target)
        return False

    wait_for(gone, timeout=10, interval=0.2, what=f"the named cgroup hierarchy {V1_NAME} to be destroyed")


def _remove_leftovers(root: Path) -> None:
    for entry in root.iterdir():
        match = re.fullmatch(rf"{re.escape(PREFIX)}(\d+)", entry.name)
        if match and entry.is_dir() and not pid_alive(int(match[1])):
            _remove_tree(entry)


@dataclass
class Holder:
    proc: subprocess.Popen[bytes]
    nodes: tuple[str, ...]  # uverbsN names it holds open

    @property
    def pid(self) -> int:
        return self.proc.pid


def _held_links(pid: int) -> set[str]:
    fd_dir = Path(f"/proc/{pid}/fd")
    links = set()
    for fd in os.listdir(fd_dir):
        with contextlib.suppress(OSError):
            links.add(os.readlink(fd_dir / fd))
    return links


@contextlib.contextmanager
def holders() -> Iterator[list[Holder]]:
    """A list to `start(...)` holders into; every holder is killed and reaped on exit."""
    started: list[Holder] = []
    try:
        yield started
    finally:
        for holder in started:
            with contextlib.suppress(ProcessLookupError):
                holder.proc.kill()
        for holder in started:
            holder.proc.wait(timeout=10)


def start(into: list[Holder], nodes: dict[str, tuple[int, int] | None]) -> Holder:
    """A `sleep` holding `/dev/infiniband/<node>` open for each node (node -> major, minor of the
    character device made there; None: a plain file of that name), returned once the kernel
    shows the descriptors in its `/proc/<pid>/fd`."""
    script = ["mount -t tmpfs -o mode=0755 rnic-test-dev /dev", "mkdir /dev/infiniband"]
    for i, (node, number) in enumerate(sorted(nodes.items())):
        if number is None:
            script.append(f"touch /dev/infiniband/{node}")
        else:
            script.append(f"mknod -m 0666 /dev/infiniband/{node} c {number[0]} {number[1]}")
        script.append(f"exec {3 + i}</dev/infiniband/{node}")  # dash: one digit
    script.append("exec sleep 600")
    proc = subprocess.Popen(
        [require_binary("unshare"), "--mount", "--propagation", "private", "sh", "-c", " && ".join(script)],
        stdin=subprocess.DEVNULL,
    )
    holder = Holder(proc, tuple(sorted(nodes)))
    into.append(holder)
    want = {f"/dev/infiniband/{node}" for node in nodes}

    def holding() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"holder exited with {proc.returncode}")
        comm = Path(f"/proc/{proc.pid}/comm").read_text().strip()
        return comm == "sleep" and want <= _held_links(proc.pid)

    wait_for(holding, timeout=15, what=f"pid {proc.pid} holding {sorted(want)}")
    return holder
