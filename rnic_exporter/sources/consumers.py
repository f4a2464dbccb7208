"""Who holds an RDMA device: one bounded walk of the process table.

A process that uses verbs holds the character device `/dev/infiniband/uverbsN` open;
`class/infiniband_verbs/uverbsN/{ibdev,dev}` in sysfs names the RDMA device behind it and its
device number. The process's cgroup path names its Slurm job step or Kubernetes pod, and on a
kubelet node `var/log/pods/<namespace>_<name>_<uid>/` turns the pod uid into a name.

How a descriptor is matched: `readlink` of every `/proc/<pid>/fd/<n>` (it never touches the
file's filesystem), then `stat` only of those whose text starts with `/dev/`, and the verdict is
the character device number. The number is the same in every mount namespace, so a container
that was given the host's `uverbs3` as `/dev/infiniband/uverbs0` is still counted on the right
device; the text alone would name the wrong one. `stat` of every descriptor would be decisive
too, but on a file of a hung NFS or Lustre mount it blocks the whole scan. The name is matched
instead only when there is no number to compare: sysfs gives no `dev` for the node, or the `stat`
finds nothing (a descriptor closed right after its readlink; a simulated procfs, whose links are
plain symlinks to paths this host does not have).

Where the kernel's resource tracker lists the verbs contexts (RDMA netlink `RES_CTX_GET`, passed
in as `holders`), the walk is skipped: the holders' threads are mapped to their processes and only
those are read. A context belongs to the thread that opened the device; a forked child that
inherited the descriptor but made no context of its own is not listed, where the walk counts it.

Everything here is a pure function of three roots (`--path.procfs`, `--path.sysfs`,
`--path.rootfs`) plus a clock: nothing runs unless `scan` is called.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from rnic_exporter.model.consumers import Consumer, ConsumerScan, Workload
from rnic_exporter.sources.sysfs import SysfsRoot, errno_name

VERBS_CLASS = "class/infiniband_verbs"
POD_LOGS = "var/log/pods"
PF_KTHREAD = 0x00200000  # include/linux/sched.h
DEFAULT_BUDGET_S = 5.0  # 10,000 processes take 0.4 s of CPU; a loaded host stretches the wall time
# How many descriptors of one process are read between two looks at the clock.
_FDS_PER_CLOCK_CHECK = 512
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


# -- sysfs: the verbs character devices ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VerbsNode:
    """One `uverbsN` character device and the RDMA device it opens."""

    node: str  # uverbsN
    device: str  # its ibdev, e.g. mlx5_1
    rdev: int | None  # os.makedev of its `dev` attribute; None when sysfs does not say


def parse_dev(text: str) -> int:
    """`231:192` (a `dev` attribute) as a device number; ValueError when it is not MAJOR:MINOR."""
    major, sep, minor = text.strip().partition(":")
    if not sep or not major.isdigit() or not minor.isdigit():
        raise ValueError(f"{text!r} is not MAJOR:MINOR")
    return os.makedev(int(major), int(minor))


def verbs_nodes(sysfs: SysfsRoot) -> tuple[list[VerbsNode], list[str]]:
    """Every verbs node sysfs lists, and a message per node that could not be read.

    No `infiniband_verbs` class at all (ib_uverbs not loaded, a capture without it) is no node
    and no problem: then nothing on the host can hold a verbs device.
    """
    try:
        names = sorted(sysfs.listdir(VERBS_CLASS))
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return [], []
        return [], [f"{VERBS_CLASS}: {errno_name(exc.errno or 0)}"]
    nodes: list[VerbsNode] = []
    problems: list[str] = []
    for name in names:
        if not name.startswith("uverbs"):
            continue  # the class's own `abi_version`
        try:
            device = sysfs.read_text(f"{VERBS_CLASS}/{name}/ibdev").strip()
        except OSError as exc:
            problems.append(f"{VERBS_CLASS}/{name}/ibdev: {errno_name(exc.errno or 0)}")
            continue
        if not device:
            problems.append(f"{VERBS_CLASS}/{name}/ibdev: empty")
            continue
        rdev: int | None = None
        try:
            rdev = parse_dev(sysfs.read_text(f"{VERBS_CLASS}/{name}/dev"))
        except OSError as exc:
            if exc.errno not in (errno.ENOENT,):
                problems.append(f"{VERBS_CLASS}/{name}/dev: {errno_name(exc.errno or 0)}")
        except ValueError as exc:
            problems.append(f"{VERBS_CLASS}/{name}/dev: malformed: {exc}")
        nodes.append(VerbsNode(name, device, rdev))
    return nodes, problems


# -- cgroup paths: Slurm job steps and Kubernetes pods ------------------------------------------

# v1: /slurm/uid_<u>/job_<id>/step_<s>/task_<t>; `slurm_<node>` when several slurmd share a host.
# v2: /system.slice/slurmstepd.scope/job_<id>/step_<s>/user/task_<t> (`<node>_slurmstepd.scope`
# for several slurmd); step_<s>/slurm holds slurmstepd itself.
_SLURM_ROOT = re.compile(r"^(?:slurm(?:_[^/]+)?|(?:[^/]+_)?slurmstepd\.scope)$")
_SLURM_JOB = re.compile(r"^job_(\d+)$")
# A step is a number (`0`; `0+1` for a heterogeneous job's component) or a named step.
_SLURM_STEP = re.compile(r"^step_(\d+(?:\+\d+)?|batch|extern|interactive)$")
# systemd driver: kubepods[-<qos>]-pod<uid, dashes as underscores>.slice; also under kind's or
# k3s's `kubelet-kubepods...` slices. cgroupfs driver: pod<uid> under kubepods[/<qos>].
_POD_SLICE = re.compile(r"^(?:[a-z0-9]+-)*kubepods(?:-(?:burstable|besteffort|guaranteed))?-pod([0-9a-f_]+)\.slice$")
_POD_DIR = re.compile(r"^pod([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32})$")
_KUBEPODS_DIR = re.compile(r"^kubepods(?:\.slice)?$|^(?:[a-z0-9]+-)*kubepods(?:-[a-z]+)?\.slice$")
# The container's own cgroup: a systemd scope of the runtime, or (cgroupfs) the bare id.
_CONTAINER_SCOPE = re.compile(r"^(?:cri-containerd|crio|docker|containerd|cri-o)-([0-9a-f]{12,64})\.scope$")
_CONTAINER_DIR = re.compile(r"^(?:cri-containerd-|crio-|docker-)?([0-9a-f]{64})$")


def slurm_from_path(path: str) -> Workload | None:
    """The Slurm job step a cgroup path names, or None. Paths outside the reader's cgroup
    namespace start with `/..`: components are matched wherever they are, not from the root."""
    parts = path.split("/")
    for i, part in enumerate(parts):
        if not _SLURM_ROOT.match(part):
            continue
        rest = parts[i + 1 :]
        if rest and rest[0].startswith("uid_") and rest[0][4:].isdigit():
            rest = rest[1:]
        job = _SLURM_JOB.match(rest[0]) if rest else None
        if job is None:
            continue
        step = _SLURM_STEP.match(rest[1]) if len(rest) > 1 else None
        return Workload(kind="slurm", slurm_job=job.group(1), slurm_step=step.group(1) if step else "")
    return None


def pod_from_path(path: str) -> Workload | None:
    """The Kubernetes pod (and container) a cgroup path names, or None."""
    parts = path.split("/")
    for i, part in enumerate(parts):
        uid = _pod_uid(part, parts[i - 1] if i else "", parts[i - 2] if i > 1 else "")
        if uid is None:
            continue
        container = ""
        if i + 1 < len(parts):
            scope = _CONTAINER_SCOPE.match(parts[i + 1]) or _CONTAINER_DIR.match(parts[i + 1])
            container = scope.group(1) if scope else ""
        return Workload(kind="pod", pod_uid=uid, container_id=container)
    return None


def _pod_uid(part: str, parent: str, grandparent: str) -> str | None:
    sliced = _POD_SLICE.match(part)
    if sliced:
        return _normal_uid(sliced.group(1).replace("_", "-"))
    plain = _POD_DIR.match(part)
    # cgroupfs driver: pod<uid> directly under kubepods (guaranteed) or kubepods/<qos>.
    if plain and (_KUBEPODS_DIR.match(parent) or (_KUBEPODS_DIR.match(grandparent) and parent in _QOS_DIRS)):
        return _normal_uid(plain.group(1))
    return None


_QOS_DIRS = frozenset({"burstable", "besteffort"})


def _normal_uid(uid: str) -> str | None:
    """A pod uid with dashes (8-4-4-4-12), as the API and /var/log/pods spell it."""
    flat = uid.replace("-", "")
    if len(flat) != 32 or any(c not in "0123456789abcdef" for c in flat):
        return None
    return f"{flat[:8]}-{flat[8:12]}-{flat[12:16]}-{flat[16:20]}-{flat[20:]}"


def workload_from_path(path: str) -> Workload | None:
    """A Slurm job step or a pod, from one cgroup path; None when the path names neither."""
    return slurm_from_path(path) or pod_from_path(path)


def workload_from_cgroup(text: str) -> Workload | None:
    """The workload `/proc/<pid>/cgroup` names. The v2 line (`0::<path>`) is asked first, then
    the v1 hierarchies in file order: on a hybrid host Slurm may place a task in v1 `freezer`
    and `memory` only, and the kubelet keeps every controller in step, so any line will do."""
    lines = text.splitlines()
    unified = [line for line in lines if line.startswith("0::")]
    for line in unified + [line for line in lines if not line.startswith("0::")]:
        _, _, rest = line.partition(":")
        _, sep, path = rest.partition(":")
        if sep:
            found = workload_from_path(path)
            if found is not None:
                return found
    return None


# -- rootfs: pod names ----------------------------------------------------------------------------


def parse_pod_log_dir(name: str) -> tuple[str, str, str] | None:
    """`<namespace>_<name>_<uid>` as (namespace, name, uid); namespaces and pod names are DNS
    labels/subdomains, which never contain `_`, so the split is unambiguous."""
    parts = name.split("_")
    if len(parts) != 3 or not all(parts):
        return None
    uid = _normal_uid(parts[2])
    return (parts[0], parts[1], uid) if uid else None


def pod_names(rootfs: Path) -> dict[str, tuple[str, str]]:
    """Pod uid -> (namespace, name) from the kubelet's log directories; empty off a kubelet node."""
    try:
        entries = os.listdir(rootfs / POD_LOGS)
    except OSError:
        return {}
    out: dict[str, tuple[str, str]] = {}
    for entry in entries:
        parsed = parse_pod_log_dir(entry)
        if parsed:
            out[parsed[2]] = (parsed[0], parsed[1])
    return out


# -- procfs ---------------------------------------------------------------------------------------


def is_kernel_thread(stat_text: str) -> bool:
    """`/proc/<pid>/stat` has PF_KTHREAD in its flags (the 9th field; comm may hold spaces and
    parentheses, so fields are counted after the last `)`)."""
    fields = stat_text[stat_text.rfind(")") + 1 :].split()
    return len(fields) > 6 and fields[6].isdigit() and int(fields[6]) & PF_KTHREAD != 0


@dataclass
class _Tally:
    scanned: int = 0
    kernel_threads: int = 0
    skipped: Counter[str] = field(default_factory=Counter)

    def skip(self, code: int | None) -> None:
        self.skipped[errno_name(code or 0)] += 1


class _Matcher:
    """Which verbs node, if any, one descriptor's link text and number are."""

    def __init__(self, nodes: Iterable[VerbsNode]) -> None:
        self.by_rdev = {n.rdev: n.device for n in nodes if n.rdev is not None}
        self.by_name = {f"/dev/infiniband/{n.node}": n.device for n in nodes}
        self.numbered = {f"/dev/infiniband/{n.node}" for n in nodes if n.rdev is not None}

    def device(self, fd: str, fd_dir: int, link: str) -> str | None:
        if not link.startswith("/dev/"):
            return None
        if not self.by_rdev or (link in self.by_name and link not in self.numbered):
            return self.by_name.get(link)  # sysfs gives no number for it: its name is all there is
        try:
            st = os.stat(fd, dir_fd=fd_dir)
        except OSError:
            # Nothing to stat: on a kernel's procfs the descriptor was closed after its readlink
            # (it was held a moment ago); in a simulated or captured procfs the link is a plain
            # symlink to a path this host does not have. The name is then the best evidence.
            return self.by_name.get(link)
        if not stat.S_ISCHR(st.st_mode):
            return None  # named like a verbs node, but a file
        return self.by_rdev.get(st.st_rdev)


def _read_small(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 65536).decode("utf-8", errors="replace")
    finally:
        os.close(fd)


def _pids(procfs: str) -> list[int]:
    return sorted(int(name) for name in os.listdir(procfs) if name.isdigit())


def scan(
    procfs: Path | str,
    sysfs: SysfsRoot | Path | str,
    rootfs: Path | str,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
    holders: Iterable[tuple[int, str]] | None = None,
) -> ConsumerScan:
    """One walk of `procfs`: every process holding a verbs node of `sysfs`, with its workload.

    `holders`: (thread id, device) of each verbs context the kernel lists; then `procfs` is not
    walked, only the holders' entries are read.

    Stops when `budget_s` of `clock` has passed (then `complete` is False and `unscanned` says
    how many processes were not reached). Never raises for what a process does meanwhile:
    exiting (ENOENT/ESRCH) or refusing (EACCES) costs that process and is counted by reason.
    Raises OSError only when `procfs` itself cannot be listed, which is a configuration error.
    """
    started = clock()
    sys_root = sysfs if isinstance(sysfs, SysfsRoot) else SysfsRoot(sysfs)
    nodes, problems = verbs_nodes(sys_root)
    devices = frozenset(n.device for n in nodes)
    if not nodes:  # nothing can be held: do not walk the process table at all
        return ConsumerScan(
            at=wall(), devices=devices, problems=tuple(problems), complete=not problems, duration_s=clock() - started
        )
    base = str(procfs).rstrip("/") + "/"
    tally = _Tally()
    held: list[tuple[int, str]] = []  # (pid, device); comm and cgroup are read for these only
    complete = True
    unscanned = 0
    if holders is not None:
        held = _listed_holders(base, holders, devices, tally)
        return _scan_result(
            base, held, rootfs, tally, wall, clock() - started, devices, problems, True, 0, "rdma_netlink"
        )
    matcher = _Matcher(nodes)
    pids = _pids(base)
    deadline = started + budget_s
    for n, pid in enumerate(pids):
        if clock() > deadline:
            complete = False
            unscanned = len(pids) - n
            break
        found = _held_devices(base, pid, matcher, tally, deadline, clock)
        if found is None:
            complete = False
            unscanned = len(pids) - n
            break
        held.extend((pid, device) for device in sorted(found))
    return _scan_result(base, held, rootfs, tally, wall, clock() - started, devices, problems, complete, unscanned)


def _scan_result(
    base: str,
    held: list[tuple[int, str]],
    rootfs: Path | str,
    tally: _Tally,
    wall: Callable[[], float],
    seconds: float,
    devices: frozenset[str],
    problems: list[str],
    complete: bool,
    unscanned: int,
    source: str = "procfs",
) -> ConsumerScan:
    consumers = _describe(base, held, Path(rootfs), tally)
    by_device: dict[str, list[Consumer]] = {}
    for consumer in consumers:
        by_device.setdefault(consumer.device, []).append(consumer)
    skipped = tally.skipped
    return ConsumerScan(
        at=wall(),
        by_device=MappingProxyType({d: tuple(sorted(cs)) for d, cs in sorted(by_device.items())}),
        processes_scanned=tally.scanned,
        skipped=sum(skipped.values()),
        complete=complete and not problems,  # a node that could not be read may have holders
        duration_s=seconds,
        devices=devices,
        skipped_by_reason=MappingProxyType(dict(sorted(skipped.items()))),
        unscanned=unscanned,
        kernel_threads=tally.kernel_threads,
        problems=tuple(problems),
        source=source,
    )


def _listed_holders(
    base: str, holders: Iterable[tuple[int, str]], devices: frozenset[str], tally: _Tally
) -> list[tuple[int, str]]:
    """The kernel's (thread, device) list as (process, device): a context is made by a thread,
    which /proc/<tid>/status names the process (Tgid) of; a thread gone since is counted skipped."""
    tgids: dict[int, int | None] = {}
    held: set[tuple[int, str]] = set()
    for tid, device in holders:
        if device not in devices:
            continue  # a device without a verbs node here (another network namespace's)
        if tid not in tgids:
            tgids[tid] = _tgid(base, tid, tally)
        tgid = tgids[tid]
        if tgid is not None:
            held.add((tgid, device))
    tally.scanned += len({pid for pid, _ in held})
    return sorted(held)


def _tgid(base: str, tid: int, tally: _Tally) -> int | None:
    try:
        status = _read_small(f"{base}{tid}/status")
    except OSError as exc:
        tally.skip(exc.errno)
        return None
    for line in status.splitlines():
        if line.startswith("Tgid:"):
            try:
                return int(line.split()[1])
            except (IndexError, ValueError):
                break
    tally.skipped["malformed"] += 1
    return None


def _held_devices(
    base: str, pid: int, matcher: _Matcher, tally: _Tally, deadline: float, clock: Callable[[], float]
) -> set[str] | None:
    """The devices `pid` holds (an empty set when none or when it cannot be inspected); None
    when the budget ran out inside a process with very many descriptors."""
    # Opened once, each link is looked up relative to it: a path walk through /proc/<pid> per
    # descriptor is an eighth of the scan's CPU on a table of sleepers.
    try:
        fd_dir = os.open(f"{base}{pid}/fd", _DIRECTORY)
        try:
            fds = os.listdir(fd_dir)
        except BaseException:
            os.close(fd_dir)
            raise
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM) and _kernel_thread(base, pid):
            tally.kernel_threads += 1  # holds no files: not a process we failed to inspect
        else:
            tally.skip(exc.errno)
        return set()
    try:
        found: set[str] = set()
        readlink = os.readlink
        for i, fd in enumerate(fds):
            if i and i % _FDS_PER_CLOCK_CHECK == 0 and clock() > deadline:
                return None
            try:
                link = readlink(fd, dir_fd=fd_dir)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    continue  # this descriptor was closed since the listing
                tally.skip(exc.errno)  # the process exited (ESRCH) or its credentials changed (EACCES)
                return set()
            device = matcher.device(fd, fd_dir, link)
            if device is not None:
                found.add(device)
    finally:
        os.close(fd_dir)
    tally.scanned += 1
    return found


def _kernel_thread(base: str, pid: int) -> bool:
    try:
        return is_kernel_thread(_read_small(f"{base}{pid}/stat"))
    except OSError:
        return False


def _describe(base: str, held: list[tuple[int, str]], rootfs: Path, tally: _Tally) -> list[Consumer]:
    """Command and workload of each holder; a holder that exits meanwhile is dropped and counted."""
    names: dict[str, tuple[str, str]] | None = None
    known: dict[int, tuple[str, Workload] | None] = {}
    out: list[Consumer] = []
    for pid, device in held:
        if pid not in known:
            known[pid] = _identify(base, pid, tally)
        ident = known[pid]
        if ident is None:
            continue
        command, workload = ident
        if workload.kind == "pod":
            if names is None:
                names = pod_names(rootfs)
            ns_name = names.get(workload.pod_uid)
            if ns_name:
                workload = replace(workload, pod_namespace=ns_name[0], pod_name=ns_name[1])
        out.append(Consumer(device=device, pid=pid, command=command, workload=workload))
    return out


def _identify(base: str, pid: int, tally: _Tally) -> tuple[str, Workload] | None:
    try:
        command = _read_small(f"{base}{pid}/comm").rstrip("\n")
        cgroup = _read_small(f"{base}{pid}/cgroup")
    except OSError as exc:
        tally.scanned -= 1
        tally.skip(exc.errno)
        return None
    found = workload_from_cgroup(cgroup)
    workload = Workload(kind="process") if found is None else found
    return command, replace(workload, command=command)
