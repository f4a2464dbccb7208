"""Whether a tree given as `--path.sysfs` or `--path.procfs` is the running kernel's, as this process sees it.

RDMA netlink answers about the running kernel: its device names, and pids as this process's PID
namespace numbers them. Its answers may stand in for a tree's files only where the tree is that
kernel's: a sysfs mount (the host's `/sys` bind-mounted at `/host/sys` in a Kubernetes pod is one;
a captured or simulated tree on tmpfs or a disk is not) and a proc mount whose `self` is this
process (the host's PID namespace with `hostPID`). Anything this cannot tell is "not live": the
caller keeps reading the files, which is always right, only dearer.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

LIVE_SYSFS, LIVE_PROCFS = Path("/sys"), Path("/proc")
MOUNTINFO = Path("/proc/self/mountinfo")
_ESCAPE = re.compile(r"\\([0-7]{3})")  # mountinfo writes a space in a path as \040


def filesystem_of(path: Path, mountinfo: Path = MOUNTINFO) -> str | None:
    """The type of the filesystem `path` lives on (the longest mount point above it), or None."""
    try:
        real = os.path.realpath(path)
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    best, found = -1, None
    for line in lines:
        fields = line.split()
        if "-" not in fields[6:]:
            continue  # not a mountinfo line this parser knows
        point = _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), fields[4])
        prefix = point.rstrip("/") + "/"
        if (real == point or real.startswith(prefix)) and len(point) > best:
            best, found = len(point), fields[fields.index("-", 6) + 1]
    return found


def is_live_sysfs(path: Path, mountinfo: Path = MOUNTINFO) -> bool:
    return Path(path) == LIVE_SYSFS or filesystem_of(path, mountinfo) == "sysfs"


def is_own_procfs(path: Path, mountinfo: Path = MOUNTINFO) -> bool:
    """A proc mount of this process's PID namespace: its `self` names this process."""
    if filesystem_of(path, mountinfo) != "proc":
        return False
    try:
        return os.readlink(Path(path) / "self") == str(os.getpid())
    except OSError:
        return False


__all__ = ["LIVE_PROCFS", "LIVE_SYSFS", "filesystem_of", "is_live_sysfs", "is_own_procfs"]
