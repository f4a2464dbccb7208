"""Which trees are the running kernel's: the real /sys and /proc here, a temporary directory, and
mountinfo lines as a pod sees them (the host's sysfs bind-mounted at /host/sys)."""

from __future__ import annotations

import os
from pathlib import Path

from rnic_exporter.sources.live_tree import filesystem_of, is_live_sysfs, is_own_procfs

# As a pod with the host's /sys at /host/sys and the host's /proc at /host/proc sees them (its own
# /proc, a tmpfs, an overlay root; a mount point with a space, escaped as the kernel writes it).
POD_MOUNTINFO = """\
1450 1392 0:311 / / rw,relatime master:494 - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
1451 1450 0:313 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
1460 1450 0:21 / /host/sys ro,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
1461 1450 0:22 / /host/proc ro,nosuid,nodev,noexec,relatime shared:8 - proc proc rw
1462 1450 0:45 / /tmp/a\\040tree rw shared:9 - tmpfs tmpfs rw
"""


def test_the_real_trees_here_and_a_copy_elsewhere(tmp_path: Path) -> None:
    assert is_live_sysfs(Path("/sys")) and filesystem_of(Path("/sys/class")) == "sysfs"
    assert is_own_procfs(Path("/proc"))
    (tmp_path / "class" / "infiniband").mkdir(parents=True)
    (tmp_path / "self").symlink_to(str(os.getpid()))  # a simulated procfs may say so: not a proc mount
    assert not is_live_sysfs(tmp_path) and not is_own_procfs(tmp_path)


def test_a_pods_host_sysfs_is_live_and_a_tree_on_tmpfs_is_not(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(POD_MOUNTINFO)
    assert filesystem_of(Path("/host/sys"), info) == "sysfs"
    assert is_live_sysfs(Path("/host/sys"), info)
    assert filesystem_of(Path("/host/sysfs-copy"), info) == "overlay"  # a prefix of the name is not a parent
    assert filesystem_of(Path("/tmp/a tree/sys"), info) == "tmpfs"
    assert not is_live_sysfs(Path("/tmp/a tree/sys"), info)
    assert filesystem_of(Path("/host/proc"), info) == "proc"
    assert filesystem_of(Path("/nothing"), tmp_path / "no-such-mountinfo") is None  # unknown: not live
