"""The consumers scan's parsers (cgroup paths, pod log directories, `dev`, `stat`) and its walk
over a fake procfs tree: matching, budget, and processes that vanish or refuse mid-scan."""

from __future__ import annotations

import errno
import itertools
import shutil
from pathlib import Path

import pytest

from rnic_exporter.model.consumers import Workload
from rnic_exporter.sim import SimHost
from rnic_exporter.sources.consumers import (
    is_kernel_thread,
    parse_dev,
    parse_pod_log_dir,
    scan,
    verbs_nodes,
    workload_from_cgroup,
    workload_from_path,
)
from rnic_exporter.sources.sysfs import SysfsRoot
from tests.support.fakeproc import KTHREAD_STAT, add_process
from tests.support.faultfs import MountFactory

# mlx5_0, mlx5_1 (RoCE), mlx5_2 (IB), each with its uverbsN node.
pytestmark = pytest.mark.sim_host(gid_table_size=4)

UID = "8d3f6a2e-1c4b-4e7a-9f0d-2b5c6e7f8a91"
UID_ = UID.replace("-", "_")
BURSTABLE = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"
BESTEFFORT = f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice"
CID = "4f1c9b0e7d2a6c3b8e5f0a1d9c7b6e2f3a4d5c6b7e8f9a0b1c2d3e4f5a6b7c8d"


def slurm(job: str, step: str = "") -> Workload:
    return Workload(kind="slurm", slurm_job=job, slurm_step=step)


def pod(container: str = CID, uid: str = UID) -> Workload:
    return Workload(kind="pod", pod_uid=uid, container_id=container)


CGROUP_PATHS = [
    # Slurm, cgroup v1 (proctrack/cgroup, task/cgroup): every controller gets the same tree.
    ("/slurm/uid_1000/job_4242/step_0/task_0", slurm("4242", "0")),
    ("/slurm/uid_1000/job_4242/step_0", slurm("4242", "0")),
    ("/slurm/uid_1000/job_4242/step_batch/task_0", slurm("4242", "batch")),
    ("/slurm/uid_1000/job_4242/step_extern/task_0", slurm("4242", "extern")),
    ("/slurm/uid_0/job_7/step_interactive", slurm("7", "interactive")),
    ("/slurm/uid_1000/job_4242", slurm("4242")),
    ("/slurm_node17/uid_1000/job_99/step_3/task_1", slurm("99", "3")),  # several slurmd per host
    ("/slurm/uid_1000/job_55/step_1+2/task_0", slurm("55", "1+2")),  # heterogeneous job component
    # Slurm, cgroup v2 (cgroup/v2 plugin under systemd).
    ("/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0", slurm("4242", "0")),
    ("/system.slice/slurmstepd.scope/job_4242/step_0/slurm", slurm("4242", "0")),  # slurmstepd itself
    ("/system.slice/slurmstepd.scope/job_4242/step_batch/user/task_0", slurm("4242", "batch")),
    ("/system.slice/slurmstepd.scope/job_4242/step_extern/user/task_special", slurm("4242", "extern")),
    ("/system.slice/slurmstepd.scope/job_4242/step_interactive/user/task_0", slurm("4242", "interactive")),
    ("/system.slice/node17_slurmstepd.scope/job_12/step_0/user/task_0", slurm("12", "0")),
    ("/slurmstepd.scope/job_12/step_0/user/task_0", slurm("12", "0")),  # IgnoreSystemd=yes
    ("/system.slice/slurmstepd.scope/job_4242/user", slurm("4242")),
    ("/../../system.slice/slurmstepd.scope/job_4242/step_0/user/task_0", slurm("4242", "0")),  # other cgroupns
    # Kubernetes, systemd cgroup driver: one slice per QoS class (none for guaranteed).
    (f"{BURSTABLE}/cri-containerd-{CID}.scope", pod()),
    (f"{BESTEFFORT}/cri-containerd-{CID}.scope", pod()),
    (f"/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope", pod()),  # guaranteed
    (f"{BURSTABLE}/crio-{CID}.scope", pod()),
    (f"{BURSTABLE}/docker-{CID}.scope", pod()),
    (f"{BURSTABLE}/crio-conmon-{CID}.scope", pod("")),
    (BURSTABLE, pod("")),  # pod level
    (
        f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
        f"kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope",
        pod(),
    ),  # kind / kubelet --cgroup-root
    (f"/../../kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope", pod()),  # other cgroupns
    # Kubernetes, cgroupfs driver.
    (f"/kubepods/burstable/pod{UID}/{CID}", pod()),
    (f"/kubepods/besteffort/pod{UID}/{CID}", pod()),
    (f"/kubepods/pod{UID}/{CID}", pod()),  # guaranteed
    (f"/kubepods/burstable/pod{UID}", pod("")),
    (f"/kubepods/burstable/pod{UID}/crio-{CID}", pod()),
    # Neither.
    ("/", None),
    ("", None),
    ("/user.slice/user-1000.slice/session-3.scope", None),
    (f"/system.slice/docker-{CID}.scope", None),  # a plain container is not a pod
    (f"/docker/{CID}", None),
    ("/system.slice/slurmd.service", None),  # the daemon, not a job
    ("/system.slice/slurmstepd.scope/system", None),
    ("/slurm/uid_1000/job_abc/step_0", None),
    ("/home/job_4242/step_0", None),  # job_ outside a Slurm tree
    (f"/mypod{UID}/x", None),
    (f"/kubepods/burstable/pod{UID[:-1]}/{CID}", None),  # truncated uid
    (f"/other/burstable/pod{UID}/{CID}", None),  # pod<uid> outside kubepods
    ("/kubepods.slice/kubepods-burstable.slice", None),
]


@pytest.mark.parametrize(("path", "expected"), CGROUP_PATHS, ids=[p or "empty" for p, _ in CGROUP_PATHS])
def test_cgroup_path_names_its_workload(path: str, expected: Workload | None) -> None:
    assert workload_from_path(path) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # cgroup v2 only.
        ("0::/system.slice/slurmstepd.scope/job_1/step_0/user/task_0\n", slurm("1", "0")),
        # cgroup v1: a Slurm task is in freezer and memory, the rest is the session's.
        (
            "12:pids:/user.slice\n11:freezer:/slurm/uid_1000/job_4242/step_0\n"
            "4:memory:/slurm/uid_1000/job_4242/step_0/task_0\n1:name=systemd:/system.slice/slurmd.service\n",
            slurm("4242", "0"),
        ),
        # Hybrid: the unified line first, whatever its position in the file.
        (f"1:name=systemd:/user.slice\n0::/kubepods/burstable/pod{UID}/{CID}\n", pod()),
        ("9:name=systemd:/\n4:memory:/process_api/c930c919\n0::/\n", None),
        ("garbage\n\n::\n", None),
    ],
)
def test_proc_cgroup_file_names_its_workload(text: str, expected: Workload | None) -> None:
    assert workload_from_cgroup(text) == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (f"training_llama-70b-worker-3_{UID}", ("training", "llama-70b-worker-3", UID)),
        (f"kube-system_coredns-5d78c9869d-abcde_{UID}", ("kube-system", "coredns-5d78c9869d-abcde", UID)),
        (f"ns_name.with.dots_{UID}", ("ns", "name.with.dots", UID)),
        (f"ns_name_{UID[:-2]}", None),
        ("ns_name", None),
        (f"_name_{UID}", None),
        (f"a_b_c_{UID}", None),
    ],
)
def test_pod_log_directory_names_namespace_name_and_uid(name: str, expected: tuple[str, str, str] | None) -> None:
    assert parse_pod_log_dir(name) == expected


def test_dev_attribute_and_kernel_thread_flags() -> None:
    assert parse_dev("231:192\n") == parse_dev("231:192") != parse_dev("231:193")
    for bad in ("231", "231:", ":192", "a:b", ""):
        with pytest.raises(ValueError):
            parse_dev(bad)
    assert is_kernel_thread(KTHREAD_STAT)
    assert not is_kernel_thread("4242 (python3) S 1 4242 4242 0 -1 4194560 100 0 0")
    assert not is_kernel_thread("4242 (a) b) c (2129984) S 1 4242 4242 0 -1 4194560 100")  # comm with ) and spaces
    assert not is_kernel_thread("")


# -- the walk over a fake procfs tree ----------------------------------------------------------


def _by_name_only(host: SimHost) -> None:
    """Sysfs without `dev` (a capture that lacks it): nodes are matched by their path."""
    for n in range(len(host.devices)):
        (host.root / f"class/infiniband_verbs/uverbs{n}/dev").unlink()


def test_sysfs_verbs_nodes_name_their_rdma_device(host: SimHost, tmp_path: Path) -> None:
    nodes, problems = verbs_nodes(SysfsRoot(host.root))
    assert problems == []
    assert [(n.node, n.device, n.rdev is not None) for n in nodes] == [
        ("uverbs0", "mlx5_0", True),
        ("uverbs1", "mlx5_1", True),
        ("uverbs2", "mlx5_2", True),
    ]
    (host.root / "class/infiniband_verbs/uverbs1/dev").write_text("garbage\n")
    (host.root / "class/infiniband_verbs/uverbs2/ibdev").unlink()
    nodes, problems = verbs_nodes(SysfsRoot(host.root))
    assert [(n.node, n.rdev) for n in nodes][1] == ("uverbs1", None)  # still matched, by name
    assert [n.node for n in nodes] == ["uverbs0", "uverbs1"]
    assert problems == [
        "class/infiniband_verbs/uverbs1/dev: malformed: 'garbage' is not MAJOR:MINOR",
        "class/infiniband_verbs/uverbs2/ibdev: ENOENT",
    ]
    # Whoever holds uverbs2 cannot be named: the scan says it is not the whole picture.
    (tmp_path / "proc").mkdir()
    result = scan(tmp_path / "proc", host.root, tmp_path)
    assert not result.complete and result.problems == tuple(problems) and "mlx5_2" not in result.devices


def test_host_without_verbs_class_is_not_walked(host: SimHost, tmp_path: Path) -> None:
    shutil.rmtree(host.root / "class/infiniband_verbs")
    result = scan(tmp_path / "no-such-proc", host.root, tmp_path)  # procfs is never listed
    assert (result.devices, result.by_device, result.processes_scanned, result.complete) == (frozenset(), {}, 0, True)


def test_fake_tree_consumers_by_device_with_their_workloads(host: SimHost, tmp_path: Path) -> None:
    _by_name_only(host)
    proc, rootfs = tmp_path / "proc", tmp_path / "root"
    (rootfs / f"var/log/pods/training_llama-0_{UID}").mkdir(parents=True)
    add_process(
        proc,
        100,
        fds={0: "/dev/null", 3: "/dev/infiniband/uverbs1", 4: "socket:[77]", 5: "/dev/infiniband/uverbs0"},
        cgroup="0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n",
    )
    add_process(
        proc,
        200,
        fds={7: "/dev/infiniband/uverbs1", 8: "anon_inode:[infinibandevent]"},
        comm="torchrun",
        cgroup=f"0::{BURSTABLE}/crio-{CID}.scope\n",
    )
    add_process(proc, 300, fds={3: "/dev/infiniband/uverbs2"}, comm="ib_write_bw")
    add_process(proc, 400, fds={0: "/dev/null", 1: "pipe:[5]", 3: "/dev/infiniband/uverbs9"})  # no such node
    add_process(proc, 2, fds={}, comm="kthreadd", kernel_thread=True)
    (proc / "self").symlink_to("100")  # not a pid
    result = scan(proc, host.root, rootfs)

    job = Workload(kind="slurm", slurm_job="4242", slurm_step="0", command="python3")
    named_pod = Workload(
        kind="pod",
        pod_uid=UID,
        pod_namespace="training",
        pod_name="llama-0",
        container_id=CID,
        command="torchrun",
    )
    assert {d: [(c.pid, c.command) for c in cs] for d, cs in result.by_device.items()} == {
        "mlx5_0": [(100, "python3")],
        "mlx5_1": [(100, "python3"), (200, "torchrun")],
        "mlx5_2": [(300, "ib_write_bw")],
    }
    assert result.workloads("mlx5_1") == (named_pod, job)
    assert result.workloads("mlx5_2") == (Workload(kind="process", command="ib_write_bw"),)
    assert named_pod.describe() == "pod training/llama-0" and job.describe() == "slurm job 4242 step 0"
    assert (result.processes_scanned, result.skipped, result.complete, result.unscanned) == (5, 0, True, 0)
    assert result.devices == {"mlx5_0", "mlx5_1", "mlx5_2"}


def test_the_kernels_context_list_finds_what_the_walk_finds_reading_only_the_holders(
    host: SimHost, tmp_path: Path
) -> None:
    """RES_CTX_GET names the thread that opened the device: its process is read from its status."""
    _by_name_only(host)
    proc, rootfs = tmp_path / "proc", tmp_path / "root"
    add_process(proc, 100, fds={3: "/dev/infiniband/uverbs1", 5: "/dev/infiniband/uverbs0"})
    add_process(proc, 200, fds={7: "/dev/infiniband/uverbs1"}, comm="torchrun", cgroup=f"0::/kubepods/pod{UID}/{CID}\n")
    add_process(proc, 300, fds={3: "/dev/infiniband/uverbs2"}, comm="ib_write_bw")
    add_process(proc, 400, fds={0: "/dev/null"}, comm="sshd")  # holds nothing: never read
    walked = scan(proc, host.root, rootfs)
    add_process(proc, 201, fds={}, comm="torchrun", tgid=200)  # the thread of 200 that made its context
    (proc / "400" / "status").unlink()  # would make it a skip, were it read
    listed = [(100, "mlx5_0"), (100, "mlx5_1"), (201, "mlx5_1"), (300, "mlx5_2"), (300, "mlx5_2")]
    listed += [(999, "mlx5_1"), (100, "mlx5_7")]  # a thread gone since the dump; a device with no verbs node here
    got = scan(proc, host.root, rootfs, holders=listed)
    assert got.by_device == walked.by_device and got.source == "rdma_netlink" and walked.source == "procfs"
    assert {d: [c.pid for c in cs] for d, cs in got.by_device.items()} == {
        "mlx5_0": [100],
        "mlx5_1": [100, 200],
        "mlx5_2": [300],
    }
    assert (got.processes_scanned, got.skipped, dict(got.skipped_by_reason)) == (3, 1, {"ENOENT": 1})
    assert got.complete and got.devices == walked.devices
    (proc / "300" / "status").write_text("Name:\tib_write_bw\n")  # no Tgid line: not guessed
    odd = scan(proc, host.root, rootfs, holders=[(300, "mlx5_2")])
    assert dict(odd.by_device) == {} and dict(odd.skipped_by_reason) == {"malformed": 1}


def test_pod_without_log_directory_keeps_its_uid(host: SimHost, tmp_path: Path) -> None:
    _by_name_only(host)
    add_process(tmp_path / "proc", 5, fds={3: "/dev/infiniband/uverbs0"}, cgroup=f"0::/kubepods/pod{UID}/{CID}\n")
    (workload,) = scan(tmp_path / "proc", host.root, tmp_path / "not-a-kubelet-node").workloads("mlx5_0")
    assert (workload.pod_uid, workload.pod_name, workload.describe()) == (UID, "", f"pod uid {UID}")


def test_device_number_decides_and_the_name_only_without_one(host: SimHost, tmp_path: Path) -> None:
    """A link whose target has the number of uverbs1 is mlx5_1 whatever it is called (here
    `/dev/null`, 1:3, stands in for the node: the sim says uverbs1 is 1:3). A link to a path this
    host does not have (a simulated procfs) can only be matched by its name. A link outside /dev
    is never stat'ed. Real device nodes, renamed and fake: tests/sources/test_consumers_processes.py."""
    host.set_verbs_rdev("mlx5_1", 1, 3)
    proc = tmp_path / "proc"
    add_process(proc, 10, fds={3: "/dev/null"})
    add_process(proc, 11, fds={3: "/dev/infiniband/uverbs0", 4: "/dev/infiniband/rdma_cm"})
    add_process(proc, 12, fds={3: str(tmp_path / "null-elsewhere")})
    (tmp_path / "null-elsewhere").symlink_to("/dev/null")
    result = scan(proc, host.root, tmp_path)
    assert {d: [c.pid for c in cs] for d, cs in result.by_device.items()} == {"mlx5_0": [11], "mlx5_1": [10]}


@pytest.mark.parametrize(
    ("path", "op", "code", "reason"),
    [
        ("20/fd", "list", errno.ENOENT, "ENOENT"),  # exited before its fds were listed
        ("20/fd", "stat", errno.ESRCH, "ESRCH"),  # exiting: its task is gone, its pid not yet
        ("20/fd", "list", errno.EACCES, "EACCES"),  # another user's, without ptrace access
        ("20/comm", "read", errno.ESRCH, "ESRCH"),  # exited after its fds were read
        ("20/cgroup", "read", errno.ENOENT, "ENOENT"),
    ],
)
def test_process_vanishing_or_refusing_mid_scan_costs_only_itself(
    host: SimHost, tmp_path: Path, faultfs_factory: MountFactory, path: str, op: str, code: int, reason: str
) -> None:
    _by_name_only(host)
    backing = tmp_path / "proc"
    for pid in (10, 20, 30):
        add_process(backing, pid, fds={0: "/dev/null", 3: "/dev/infiniband/uverbs0"})
    fs = faultfs_factory(backing)
    fs.fail(path, code, op=op)
    result = scan(fs.mount, host.root, tmp_path)
    assert [c.pid for c in result.by_device["mlx5_0"]] == [10, 30]
    assert (result.processes_scanned, result.skipped, dict(result.skipped_by_reason)) == (2, 1, {reason: 1})
    assert result.complete  # a process that went away is no gap in the view


def test_refusing_kernel_thread_is_not_a_skip(host: SimHost, tmp_path: Path, faultfs_factory: MountFactory) -> None:
    _by_name_only(host)
    backing = tmp_path / "proc"
    add_process(backing, 10, fds={3: "/dev/infiniband/uverbs0", 4: "/dev/infiniband/uverbs1"})
    add_process(backing, 2, fds={}, kernel_thread=True)
    fs = faultfs_factory(backing)
    fs.fail("2/fd", errno.EACCES, op="list")  # a non-root scanner may not list a kthread's fds
    result = scan(fs.mount, host.root, tmp_path)
    assert list(result.by_device) == ["mlx5_0", "mlx5_1"]
    assert (result.processes_scanned, result.skipped, result.kernel_threads) == (1, 0, 1)


def test_pids_deleted_between_listing_and_reading(host: SimHost, tmp_path: Path) -> None:
    """The clock is read before each process: this one removes every other process's directory
    right then, after the pid list was taken, as exits do on a busy host."""
    _by_name_only(host)
    proc = tmp_path / "proc"
    for pid in range(1, 21):
        add_process(proc, pid, fds={3: "/dev/infiniband/uverbs0"})
    ticks = itertools.count()
    doomed = iter(range(2, 21, 2))

    def clock() -> float:
        if next(ticks) >= 1:  # the first reading is the start of the scan
            victim = next(doomed, None)
            if victim is not None:
                shutil.rmtree(proc / str(victim))
        return 0.0

    result = scan(proc, host.root, tmp_path, clock=clock)
    held = [c.pid for c in result.by_device["mlx5_0"]]
    assert set(held) <= set(range(1, 21, 2)) and len(held) >= 5
    assert result.processes_scanned + result.skipped == 20
    assert set(result.skipped_by_reason) <= {"ENOENT"} and result.complete


def test_budget_stops_the_walk_and_says_what_was_not_reached(host: SimHost, tmp_path: Path) -> None:
    _by_name_only(host)
    proc = tmp_path / "proc"
    for pid in range(1, 11):
        add_process(proc, pid, fds={3: "/dev/infiniband/uverbs0"})
    add_process(proc, 11, fds={n: "/dev/infiniband/uverbs1" for n in range(1200)})
    ticks = itertools.count()

    def clock() -> float:
        return float(next(ticks))  # one second per look at the clock

    result = scan(proc, host.root, tmp_path, budget_s=5.5, clock=clock)
    assert not result.complete
    assert result.processes_scanned == 5 and result.unscanned == 6
    assert [c.pid for c in result.by_device["mlx5_0"]] == [1, 2, 3, 4, 5]
    # Within one process with very many descriptors the clock is looked at too.
    ticks = itertools.count()
    result = scan(proc, host.root, tmp_path, budget_s=11.5, clock=clock)
    assert (result.complete, result.processes_scanned, result.unscanned, "mlx5_1" in result.by_device) == (
        False,
        10,
        1,
        False,
    )
