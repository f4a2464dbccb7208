"""Fake verbs users for a simulated host: a procfs tree whose processes hold `/dev/infiniband/uverbsN`
open, in Slurm and Kubernetes cgroups, laid out as the kernel does.

    <procfs>/<pid>/comm            "python3\\n"
    <procfs>/<pid>/cgroup          "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\\n"
    <procfs>/<pid>/fd/<n>          symlinks: 0 -> /dev/null, ... -> /dev/infiniband/uverbs1
    <rootfs>/var/log/pods/<namespace>_<name>_<uid>/<container>/0.log   (kubelet's, for pod names)

The device side (`class/infiniband_verbs/uverbsN/ibdev`) is the `SimHost`'s. `scan()` is what a
correct scan of this tree returns, built from what was attached (never read back from disk): it is
the simulator's stand-in for the scan seam (`consumer_watch.Scan`), so the wiring can be tested
without real processes; the real scan over this same tree must agree with it.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from rnic_exporter.model.consumers import Consumer, ConsumerScan, Workload
from rnic_exporter.sim.host import SimHost

SlurmLayout = Literal["v1", "v2"]
PodLayout = Literal["systemd", "cgroupfs"]
FIRST_PID = 4100


@dataclass(frozen=True, slots=True)
class SimProcess:
    pid: int
    command: str
    devices: tuple[str, ...]
    workload: Workload


def slurm_cgroup(job: str, step: str, layout: SlurmLayout = "v2", uid: int = 1000) -> str:
    """/proc/<pid>/cgroup of a task of `job`'s `step` under slurmd's cgroup plugin."""
    if layout == "v2":
        return f"0::/system.slice/slurmstepd.scope/job_{job}/step_{step}/user/task_0\n"
    path = f"/slurm/uid_{uid}/job_{job}/step_{step}"
    return (
        "".join(
            f"{n}:{controller}:{path}{'/task_0' if controller == 'memory' else ''}\n"
            for n, controller in ((12, "freezer"), (11, "memory"), (4, "cpuset"), (3, "devices"))
        )
        + "1:name=systemd:/system.slice/slurmd.service\n0::/system.slice/slurmd.service\n"
    )


def pod_cgroup(uid: str, container_id: str, layout: PodLayout = "systemd", qos: str = "burstable") -> str:
    """/proc/<pid>/cgroup of a container of pod `uid` (cgroup v2, containerd), per kubelet driver."""
    if layout == "systemd":
        slice_uid = uid.replace("-", "_")
        return (
            f"0::/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{slice_uid}.slice/"
            f"cri-containerd-{container_id}.scope\n"
        )
    return f"0::/kubepods/{qos}/pod{uid}/{container_id}\n"


class SimProcfs:
    """Processes using the simulated host's RNICs. `procfs` is what `--path.procfs` names."""

    def __init__(self, host: SimHost, procfs: Path, rootfs: Path | None = None) -> None:
        self.host = host
        self.procfs = Path(procfs)
        self.rootfs = Path(rootfs) if rootfs is not None else None
        self.processes: dict[int, SimProcess] = {}
        self._next_pid = FIRST_PID
        self.procfs.mkdir(parents=True, exist_ok=True)

    def spawn(self, command: str, cgroup: str, devices: Sequence[str], workload: Workload) -> int:
        """A process in `cgroup` holding each of `devices`' verbs device open (beside the usual fds)."""
        pid = self._next_pid
        self._next_pid += 1
        root = self.procfs / str(pid)
        (root / "fd").mkdir(parents=True)
        (root / "comm").write_text(f"{command}\n")
        (root / "cgroup").write_text(cgroup)
        targets = ["/dev/null", f"pipe:[{80000 + pid}]", f"socket:[{90000 + pid}]", "/dev/infiniband/rdma_cm"]
        targets += [f"/dev/infiniband/{self.host.device(d).uverbs}" for d in devices]
        for fd, target in enumerate(targets):
            (root / "fd" / str(fd)).symlink_to(target)
        self.processes[pid] = SimProcess(pid, command, tuple(devices), workload)
        return pid

    def slurm_job(
        self, job: str, devices: Sequence[str], step: str = "0", layout: SlurmLayout = "v2", command: str = "python3"
    ) -> int:
        workload = Workload(kind="slurm", slurm_job=job, slurm_step=step, command=command)
        return self.spawn(command, slurm_cgroup(job, step, layout), devices, workload)

    def pod(
        self,
        namespace: str,
        name: str,
        uid: str,
        devices: Sequence[str],
        container_id: str = "",
        layout: PodLayout = "systemd",
        command: str = "torchrun",
    ) -> int:
        """A pod's container process; with a rootfs, kubelet's log directory names the pod."""
        container_id = container_id or uid.replace("-", "")[:12] * 5 + uid.replace("-", "")[:4]
        named = self.rootfs is not None
        if self.rootfs is not None:
            logs = self.rootfs / "var/log/pods" / f"{namespace}_{name}_{uid}" / "trainer"
            logs.mkdir(parents=True, exist_ok=True)
            (logs / "0.log").touch()
        workload = Workload(
            kind="pod",
            pod_uid=uid,
            pod_namespace=namespace if named else "",
            pod_name=name if named else "",
            container_id=container_id,
            command=command,
        )
        return self.spawn(command, pod_cgroup(uid, container_id, layout), devices, workload)

    def process(self, command: str, devices: Sequence[str]) -> int:
        """A verbs user in neither a job nor a pod (an operator's ib_write_bw)."""
        workload = Workload(kind="process", command=command)
        return self.spawn(command, "0::/user.slice/user-1000.slice/session-3.scope\n", devices, workload)

    def exit(self, pid: int) -> None:
        del self.processes[pid]
        shutil.rmtree(self.procfs / str(pid))

    def scan(self) -> ConsumerScan:
        """What a correct scan of this tree returns (see the module docstring)."""
        started = time.monotonic()
        by_device: dict[str, list[Consumer]] = {}
        for proc in sorted(self.processes.values(), key=lambda p: p.pid):
            for device in proc.devices:
                if device not in self.host.removed:  # its class/infiniband_verbs link is gone
                    by_device.setdefault(device, []).append(Consumer(device, proc.pid, proc.command, proc.workload))
        return ConsumerScan(
            at=time.time(),
            by_device=MappingProxyType({d: tuple(c) for d, c in sorted(by_device.items())}),
            processes_scanned=len(self.processes),
            duration_s=time.monotonic() - started,
        )
