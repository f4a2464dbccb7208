"""The consumers scan over the kernel's own procfs: real processes holding `/dev/infiniband/uverbsN`
open (private mount namespaces), in real cgroups named like Slurm job steps (v1 and v2) and
Kubernetes pods (systemd and cgroupfs drivers), and real processes exiting during scans.

See `tests/support/verbs_holders.py` for how the device nodes and cgroups are made and removed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from rnic_exporter.model.consumers import Consumer, ConsumerScan, Workload
from rnic_exporter.sim import SimHost
from rnic_exporter.sources.consumers import scan
from tests.support.processes import require_binary
from tests.support.verbs_holders import OPENABLE_CHAR_DEVICES, Cgroups, Holder, cgroups, holders, start

pytestmark = pytest.mark.sim_host(gid_table_size=4)

PROCFS = Path("/proc")
POD_UID = "3b5d7f91-2c4e-4a6b-8d0f-1e3a5c7b9d2f"
POD2_UID = "c0ffee00-1234-4abc-9def-00112233aabb"
CID = "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f9e8d"
CID2 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"


@pytest.fixture
def host(sim_host: SimHost) -> SimHost:
    """mlx5_0..2, their verbs nodes numbered as the holders' device nodes."""
    sim = sim_host
    for name, (major, minor) in zip(sorted(sim.devices), OPENABLE_CHAR_DEVICES, strict=True):
        sim.set_verbs_rdev(name, major, minor)
    return sim


@pytest.fixture
def groups(tmp_path: Path) -> Iterator[Cgroups]:
    if os.geteuid() != 0:
        pytest.fail("needs root: it mounts cgroup hierarchies and device nodes in a private namespace")
    with cgroups(tmp_path / "cgroups") as made:
        yield made


@pytest.fixture
def started() -> Iterator[list[Holder]]:
    with holders() as procs:
        yield procs


def node(n: int) -> dict[str, tuple[int, int] | None]:
    return {f"uverbs{n}": OPENABLE_CHAR_DEVICES[n]}


def ours(result: ConsumerScan, pids: set[int]) -> dict[str, list[Consumer]]:
    """Only the test's holders: any process on this host holding /dev/full or /dev/random would
    also count as a consumer of the device whose number the sim gave it."""
    return {d: [c for c in cs if c.pid in pids] for d, cs in result.by_device.items() if any(c.pid in pids for c in cs)}


def test_real_processes_in_real_cgroups_are_named_for_the_right_device(
    host: SimHost, groups: Cgroups, started: list[Holder], tmp_path: Path
) -> None:
    rootfs = tmp_path / "root"
    (rootfs / f"var/log/pods/training_llama-70b-0_{POD_UID}").mkdir(parents=True)
    (rootfs / f"var/log/pods/kube-system_other_{POD2_UID}").mkdir(parents=True)

    # Slurm, cgroup v2: a task of job 4242 step 0 uses mlx5_0.
    slurm_v2 = start(started, node(0))
    groups.place(slurm_v2.pid, "system.slice/slurmstepd.scope/job_4242/step_0/user/task_0")
    # Kubernetes, systemd driver, containerd: a container of a burstable pod uses mlx5_1.
    pod_systemd = start(started, node(1))
    uid_ = POD_UID.replace("-", "_")
    groups.place(
        pod_systemd.pid,
        f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{CID}.scope",
    )
    # Slurm, cgroup v1 only (its v2 cgroup names nothing): the batch step uses mlx5_0 and mlx5_2.
    slurm_v1 = start(started, {**node(0), **node(2)})
    groups.place(slurm_v1.pid, "neutral")
    groups.place(slurm_v1.pid, "slurm/uid_0/job_5151/step_batch", v1=True)
    # Kubernetes, cgroupfs driver, a best-effort pod with no log directory: uses mlx5_2.
    pod_cgroupfs = start(started, node(2))
    groups.place(pod_cgroupfs.pid, f"kubepods/besteffort/pod{POD2_UID}/{CID2}")
    # A process in neither: its command names it.
    bare = start(started, node(1))
    groups.place(bare.pid, "user.slice/user-0.slice/session-1.scope")
    # A container given the host's uverbs2 under the name uverbs0: the number says mlx5_2.
    renamed = start(started, {"uverbs0": OPENABLE_CHAR_DEVICES[2]})
    groups.place(renamed.pid, f"kubepods/besteffort/pod{POD2_UID}/{CID2}")
    # A plain file named like a verbs node is nobody's verbs device.
    fake = start(started, {"uverbs1": None})
    groups.place(fake.pid, "system.slice/slurmstepd.scope/job_4242/step_0/user/task_1")

    result = scan(PROCFS, host.root, rootfs, budget_s=30)

    assert result.complete and result.devices == {"mlx5_0", "mlx5_1", "mlx5_2"}
    job_v2 = Workload(kind="slurm", slurm_job="4242", slurm_step="0", command="sleep")
    job_v1 = Workload(kind="slurm", slurm_job="5151", slurm_step="batch", command="sleep")
    pod = Workload(
        kind="pod",
        pod_uid=POD_UID,
        pod_namespace="training",
        pod_name="llama-70b-0",
        container_id=CID,
        command="sleep",
    )
    other_pod = Workload(
        kind="pod",
        pod_uid=POD2_UID,
        pod_namespace="kube-system",
        pod_name="other",
        container_id=CID2,
        command="sleep",
    )
    process = Workload(kind="process", command="sleep")
    expected = {
        "mlx5_0": {(slurm_v2.pid, job_v2), (slurm_v1.pid, job_v1)},
        "mlx5_1": {(pod_systemd.pid, pod), (bare.pid, process)},
        "mlx5_2": {(slurm_v1.pid, job_v1), (pod_cgroupfs.pid, other_pod), (renamed.pid, other_pod)},
    }
    pids = {h.pid for h in started}
    assert {d: {(c.pid, c.workload) for c in cs} for d, cs in ours(result, pids).items()} == expected
    # Nobody else on the host is said to be in these jobs or pods.
    named = {job_v2, job_v1, pod, other_pod}
    assert all(c.pid in pids for cs in result.by_device.values() for c in cs if c.workload in named)
    assert pod.describe() == "pod training/llama-70b-0" and job_v1.describe() == "slurm job 5151 step batch"

    # The holder of mlx5_1 exits: the next scan no longer names the pod.
    pod_systemd.proc.kill()
    pod_systemd.proc.wait(timeout=10)
    again = scan(PROCFS, host.root, rootfs, budget_s=30)
    assert {c.workload for c in ours(again, pids)["mlx5_1"]} == {process}


def test_scans_during_a_storm_of_exiting_processes_never_fail(
    host: SimHost, groups: Cgroups, started: list[Holder], tmp_path: Path
) -> None:
    """Thousands of real processes start and exit while the scan walks the table: no scan
    raises or stops short (an exit met is counted in `skipped`, never a gap), and every scan
    finds the holder that stays."""
    steady = start(started, node(0))
    groups.place(steady.pid, "system.slice/slurmstepd.scope/job_77/step_0/user/task_0")
    storm = subprocess.Popen(
        [require_binary("sh"), "-c", "i=0; while [ $i -lt 3000 ]; do /bin/true & i=$((i+1)); done; wait"],
        stdin=subprocess.DEVNULL,
    )
    results: list[ConsumerScan] = []
    try:
        while storm.poll() is None or not results:
            results.append(scan(PROCFS, host.root, tmp_path, budget_s=30))
    finally:
        storm.kill()
        storm.wait(timeout=30)
    for result in results:
        # EACCES: a non-dumpable process may refuse even root (here: the machine's pid 1).
        assert result.complete and set(result.skipped_by_reason) <= {"ENOENT", "ESRCH", "EACCES"}
        assert [c.workload.slurm_job for c in result.by_device["mlx5_0"] if c.pid == steady.pid] == ["77"]
    assert len(results) >= 1


SCAN_AS_ANOTHER_USER = """
import json, sys
from rnic_exporter.sources.consumers import scan
result = scan("/proc", sys.argv[1], sys.argv[2], budget_s=30)
print(json.dumps({
    "pids": sorted(c.pid for cs in result.by_device.values() for c in cs),
    "skipped": dict(result.skipped_by_reason),
}))
"""


@pytest.fixture
def readable_host() -> Iterator[SimHost]:
    """A simulated sysfs any user can read (pytest's own temporary tree is root's alone)."""
    top = Path(tempfile.mkdtemp(prefix="rnic-consumers-"))
    try:
        top.chmod(0o755)
        sim = SimHost.build(top / "sys", roce=1, gid_table_size=4)
        sim.set_verbs_rdev("mlx5_0", *OPENABLE_CHAR_DEVICES[0])
        yield sim
    finally:
        shutil.rmtree(top)


@pytest.mark.parametrize(
    ("caps", "sees_it"),
    [
        ("", False),
        ("+sys_ptrace", False),  # the fd directory is 0500 and root's: not even listed
        ("+dac_read_search", False),  # listed, but each link needs ptrace read access
        ("+sys_ptrace,+dac_read_search", True),  # what packaging/ grants
    ],
)
def test_a_non_root_scanner_needs_ptrace_read_and_dac_read_search(
    readable_host: SimHost, started: list[Holder], caps: str, sees_it: bool
) -> None:
    """The privileges docs/consumers.md and the packaged drop-in/patch name, checked: a scanner running
    as nobody (65534) with exactly `caps` as ambient capabilities, against a holder owned by root."""
    if os.geteuid() != 0:
        pytest.fail("needs root: it starts the scanner as another user")
    holder = start(started, node(0))
    setpriv = [require_binary("setpriv"), "--reuid=65534", "--regid=65534", "--clear-groups"]
    if caps:
        setpriv += [f"--inh-caps={caps}", f"--ambient-caps={caps}"]
    out = subprocess.run(
        [*setpriv, sys.executable, "-c", SCAN_AS_ANOTHER_USER, str(readable_host.root), "/nonexistent"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert (holder.pid in seen["pids"]) is sees_it
    if not sees_it:
        assert seen["skipped"].get("EACCES", 0) >= 1  # counted as not inspected, never "unused"


def _rnic(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rnic_exporter", *args], capture_output=True, text=True, timeout=120)


def _hits(check_output: str, where: str) -> str:
    """The `hits:` line of the problem reported at `where`."""
    lines = check_output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("[") and f"] {where}" in line)
    return next(line for line in lines[start + 1 :] if line.startswith("  hits:"))


def test_show_check_and_serve_name_real_jobs_and_pods(groups: Cgroups, started: list[Holder], tmp_path: Path) -> None:
    """Issue 15's whole path on the kernel's procfs: real holders in real cgroups, the real commands."""
    from tests.support.processes import exporter, free_port
    from tests.support.wait import wait_for

    host = SimHost.build(tmp_path / "sys", roce=2, infiniband=1, gid_table_size=32)
    for name, (major, minor) in zip(sorted(host.devices), OPENABLE_CHAR_DEVICES, strict=True):
        host.set_verbs_rdev(name, major, minor)
    rootfs = tmp_path / "root"
    (rootfs / f"var/log/pods/training_llama-70b-0_{POD_UID}").mkdir(parents=True)
    job = start(started, node(0))
    groups.place(job.pid, "system.slice/slurmstepd.scope/job_4242/step_0/user/task_0")
    pod = start(started, node(1))
    groups.place(
        pod.pid,
        f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_UID.replace('-', '_')}.slice"
        f"/cri-containerd-{CID}.scope",
    )
    paths = ["--path.sysfs", str(host.root), "--path.procfs", str(PROCFS), "--path.rootfs", str(rootfs)]

    shown = json.loads(_rnic("show", *paths, "--collector.consumers", "--json").stdout)
    users = {
        d["name"]: {(u["kind"], u.get("slurm_job_id"), u.get("k8s_pod_name")) for u in d["users"]}
        for d in shown["devices"]
    }
    assert ("slurm", "4242", None) in users["mlx5_0"] and ("pod", None, "llama-70b-0") in users["mlx5_1"]
    assert not any(u[1] == "4242" for u in users["mlx5_1"] | users["mlx5_2"])  # the job only on its NIC

    checked = _rnic(
        "check", *paths, "--state.dir", "", "--no-netlink", "--nccl-gid-index", "1", "--collector.consumers"
    )
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "slurm job 4242" in _hits(checked.stdout, "mlx5_0 port 1")
    assert "pod training/llama-70b-0" in _hits(checked.stdout, "mlx5_1 port 1")
    assert "slurm job 4242" not in _hits(checked.stdout, "mlx5_1 port 1")

    port = free_port()
    log = tmp_path / "exporter.log"
    args = ["serve", *paths, "--web.listen-address", f"127.0.0.1:{port}", "--poll.interval", "0.3"]
    args += ["--state.dir", str(tmp_path / "state"), "--no-watch.netlink", "--no-watch.udev", "--log.format", "json"]
    args += ["--collector.consumers", "--collector.consumers.interval", "1s"]
    with exporter(args, ready_url=f"http://127.0.0.1:{port}/-/ready", log_path=log):

        def scanned() -> bool:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            rows = [x for x in body.splitlines() if x.startswith("rnic_device_workload_info{")]
            return any('device="mlx5_0"' in x and 'slurm_job_id="4242"' in x for x in rows)

        wait_for(scanned, timeout=30, what="the real job in the exposition")
        host.gid_shift("mlx5_0")

        def moved() -> list[dict[str, str]]:
            lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
            return [x for x in lines if x.get("event") == "rnic.gid.address_moved"]

        line = wait_for(moved, timeout=30, what="the GID-shift event")[0]
    assert line["device"] == "mlx5_0" and "slurm job 4242" in line["consumers"]
    assert "llama-70b-0" not in line["consumers"]  # the pod uses mlx5_1, not the shifted NIC
