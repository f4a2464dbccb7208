"""Who uses an RNIC: the processes holding its verbs device open, and the job or pod they belong to.

`sources/consumers.py` fills these from procfs and sysfs (a process holds
`/dev/infiniband/uverbsN` open; `/sys/class/infiniband_verbs/uverbsN/ibdev` names the RDMA
device; the process's cgroup path names its Slurm job or Kubernetes pod). Events, `check`,
`show` and the sinks only read them.

Processes are never series: the exposition counts them per device and names the *workloads*
(a Slurm job or a pod), whose number per node is small. A process in neither is a workload of
kind ``"process"`` keyed by its command name, so an operator still sees "python3 holds mlx5_1".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

WorkloadKind = Literal["slurm", "pod", "process"]


@dataclass(frozen=True, slots=True, order=True)
class Workload:
    """A Slurm job (step) or a Kubernetes pod (container), or a bare process when neither."""

    kind: WorkloadKind
    # slurm: job id and step ("0", "batch", "extern", "interactive"; "" when the cgroup has none)
    slurm_job: str = ""
    slurm_step: str = ""
    # pod: uid from the cgroup path; namespace and name from /var/log/pods when the node has it
    pod_uid: str = ""
    pod_namespace: str = ""
    pod_name: str = ""
    container_id: str = ""
    # process: its command name (/proc/<pid>/comm); also set for the other kinds, for display
    command: str = ""

    def describe(self) -> str:
        """One short phrase for logs, `check` and `show`: 'slurm job 4242 step 0', 'pod ns/name'."""
        if self.kind == "slurm":
            step = f" step {self.slurm_step}" if self.slurm_step else ""
            return f"slurm job {self.slurm_job}{step}"
        if self.kind == "pod":
            if self.pod_namespace and self.pod_name:
                return f"pod {self.pod_namespace}/{self.pod_name}"
            return f"pod uid {self.pod_uid}"
        return f"process {self.command or '?'}"


@dataclass(frozen=True, slots=True, order=True)
class Consumer:
    """One process holding one RDMA device's verbs character device open."""

    device: str  # RDMA device, e.g. mlx5_1 (from infiniband_verbs/uverbsN/ibdev)
    pid: int
    command: str  # /proc/<pid>/comm, without the newline
    workload: Workload


def _no_consumers() -> Mapping[str, tuple[Consumer, ...]]:
    return MappingProxyType({})


def _no_counts() -> Mapping[str, int]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ConsumerScan:
    """One scan of the process table. `by_device` has a key only for devices someone uses.

    `complete` is False when the scan hit its time or process budget: then a device missing from
    `by_device` may still be in use, and nothing may say "unused". `skipped` counts processes
    whose fds could not be inspected (EACCES, or gone mid-scan), so a partial view is visible.
    """

    at: float  # time.time() when the scan ended
    by_device: Mapping[str, tuple[Consumer, ...]] = field(default_factory=_no_consumers)
    processes_scanned: int = 0
    skipped: int = 0
    complete: bool = True
    duration_s: float = 0.0
    # RDMA devices that have a verbs node (sysfs `infiniband_verbs`): only for these does "no
    # key in by_device" mean "nobody holds it" (when `complete`). Empty: the host has no verbs.
    devices: frozenset[str] = frozenset()
    # `skipped` by errno name (EACCES: no ptrace/DAC access; ENOENT/ESRCH: exited mid-scan).
    skipped_by_reason: Mapping[str, int] = field(default_factory=_no_counts)
    unscanned: int = 0  # processes not reached because the budget ran out
    kernel_threads: int = 0  # refused /proc/<pid>/fd but hold no files: neither scanned nor skipped
    # sysfs verbs nodes that could not be read, one message each; any makes `complete` False
    problems: tuple[str, ...] = ()
    # how the holders were found: "procfs" (every descriptor of every process) or "rdma_netlink"
    # (the kernel's list of verbs contexts, RES_CTX_GET: /proc is read for the holders only)
    source: str = "procfs"

    def workloads(self, device: str) -> tuple[Workload, ...]:
        """The distinct workloads using `device`, sorted, so output and series are stable."""
        return tuple(sorted({c.workload for c in self.by_device.get(device, ())}))


@dataclass(frozen=True, slots=True)
class DeviceConsumers:
    """Who used one device at the last scan: its distinct workloads, how many processes, and when."""

    workloads: tuple[Workload, ...]
    processes: int
    scanned_at: float  # time.time() when the scan ended
    age_s: float  # how old that scan was when the event was seen
    complete: bool  # False: the scan stopped at its budget; an empty list may not mean "unused"

    @classmethod
    def of(cls, scan: ConsumerScan, device: str, now: float) -> DeviceConsumers:
        return cls(
            workloads=scan.workloads(device),
            processes=len({c.pid for c in scan.by_device.get(device, ())}),
            scanned_at=scan.at,
            age_s=max(0.0, now - scan.at),
            complete=scan.complete,
        )

    def describe(self) -> str:
        """'slurm job 4242 step 0, pod team-a/trainer-0', or 'none' (or 'none seen' when partial)."""
        if not self.workloads:
            return "none" if self.complete else "none seen (incomplete scan)"
        return ", ".join(w.describe() for w in self.workloads)
