"""`check` judged in-process on a simulated host, without netlink or the host's own files."""

from __future__ import annotations

from pathlib import Path

from rnic_exporter.commands.check import CheckReport, run_check
from rnic_exporter.detect.settings import DetectionSettings
from rnic_exporter.sim import SimHost
from rnic_exporter.sources.address_risks import HostPaths
from rnic_exporter.sources.reader import ReaderSettings
from rnic_exporter.sources.sysfs import SysfsRoot
from rnic_exporter.sources.wire import WireReader


def check_in_process(
    host: SimHost, tmp_path: Path, root: SysfsRoot | None = None, wire: WireReader | None = None
) -> CheckReport:
    """`wire`: the RoCE netdevs' wire reader (the simulator's); None reads the real one."""
    return run_check(
        host.root,
        None,
        DetectionSettings(),
        ReaderSettings(),
        HostPaths(rootfs=tmp_path / "none"),
        use_netlink=False,
        root=root,
        wire=wire,
    )
