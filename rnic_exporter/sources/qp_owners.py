"""Who holds queue pairs on which RDMA device, from RDMA netlink's QP table (`RES_QP_GET`).

For the consumers feature, which today finds RDMA users by scanning `/proc/*/fd` for uverbs
descriptors: the kernel's own resource tracker already knows each QP's device, port and owning pid,
in one dump per device, whatever the process's file descriptors look like (a QP held through a
forked child, a container's process). Not wired in: `consumers_by_device` is the pure step, the
caller passes `RdmaNetlink().qp_owners()` and a `comm_of` (default: `/proc/<pid>/comm`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rnic_exporter.sources.nldev import QpOwner


@dataclass(frozen=True, slots=True)
class QpConsumer:
    """A process (or a kernel module) holding QPs on one device."""

    device: str
    pid: int | None  # None for a kernel owner
    comm: str  # the process's comm, or the kernel owner's name ("ib_core" for QP1 of each port)
    qps: int
    ports: tuple[int, ...]  # the ports its QPs are bound to (empty while none is)


def proc_comm(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The process's comm, None once it is gone."""
    try:
        return (proc / str(pid) / "comm").read_text().rstrip("\n")
    except OSError:
        return None


def consumers_by_device(
    owners: Sequence[QpOwner], comm_of: Callable[[int], str | None] = proc_comm
) -> Mapping[str, list[QpConsumer]]:
    """device -> its QP holders, by pid (kernel owners by name), in pid order; a process that exited
    since the dump (no comm) is left out."""
    groups: dict[tuple[str, int | None, str | None], list[QpOwner]] = {}
    for qp in owners:
        key = (qp.device, qp.pid, None if qp.pid is not None else (qp.kernel_owner or "kernel"))
        groups.setdefault(key, []).append(qp)
    out: dict[str, list[QpConsumer]] = {}
    for (device, pid, kernel), qps in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or -1, kv[0][2] or "")):
        comm = kernel if pid is None else comm_of(pid)
        if comm is None:
            continue
        ports = tuple(sorted({q.port for q in qps if q.port is not None}))
        out.setdefault(device, []).append(QpConsumer(device, pid, comm, len(qps), ports))
    return out


__all__ = ["QpConsumer", "consumers_by_device", "proc_comm"]
