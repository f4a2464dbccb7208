"""A fake procfs tree for the consumers scan: `<root>/<pid>/{fd/<n>, comm, cgroup, stat}`.

Descriptors are symlinks whose text is what `readlink /proc/<pid>/fd/<n>` answers on a real host
(`/dev/infiniband/uverbs0`, `socket:[1234]`, `pipe:[99]`). The real-process tests in
`tests/sources/test_consumers_processes.py` cover the kernel's own procfs; this tree covers what the kernel
makes hard to arrange on demand (a pid vanishing between two reads, a refused directory).
"""

from __future__ import annotations

import os
from pathlib import Path

# The Kubernetes pod of the consumers tests (a pod UID as the kubelet writes it in cgroup paths).
POD_UID = "6c1f3a52-8d0e-4b7e-9a43-1b2c3d4e5f60"
KTHREAD_STAT = "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0"
USER_STAT = "{pid} (python3) S 1 {pid} {pid} 0 -1 4194560 100 0 0 0 3 1 0 0 20 0 4 0 900 0 0"


def add_process(
    root: Path,
    pid: int,
    *,
    fds: dict[int, str],
    comm: str = "python3",
    cgroup: str = "0::/user.slice/user-1000.slice/session-3.scope\n",
    kernel_thread: bool = False,
    tgid: int | None = None,
) -> Path:
    """One process (or, with `tgid`, a thread of that process); `fds` maps descriptor numbers to
    their link text."""
    base = root / str(pid)
    (base / "fd").mkdir(parents=True)
    for number, text in fds.items():
        os.symlink(text, base / "fd" / str(number))
    (base / "comm").write_text(comm + "\n")
    (base / "status").write_text(
        f"Name:\t{comm}\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{tgid or pid}\nPid:\t{pid}\n"
    )
    (base / "cgroup").write_text(cgroup)
    (base / "stat").write_text((KTHREAD_STAT if kernel_thread else USER_STAT.format(pid=pid)) + "\n")
    return base
