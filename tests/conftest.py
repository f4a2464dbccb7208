"""Fixtures every test module may use: the captured sysfs tree and the simulated host."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rnic_exporter.model.host import Snapshot
from rnic_exporter.sim import SimHost
from rnic_exporter.sim.sysfs_root import SimSysfsRoot
from rnic_exporter.sources.reader import HostReader
from tests.support.captures import PROCFS_SYS

# The faulty-sysfs FUSE fixtures (`faulty_sysfs`, `faultfs_factory`), for every test module.
pytest_plugins = ("tests.support.faultfs",)

FIXTURE_ENV = "RNIC_FIXTURE_SYS"
_SIM_DEFAULTS: dict[str, Any] = {"roce": 2, "infiniband": 1, "gid_table_size": 16}


@pytest.fixture(scope="session")
def fixture_sys() -> Path:
    """The captured tree from prometheus/procfs (hfi1_0, mlx4_0, mlx5_0). Never write to it: use `fixture_copy`.

    `RNIC_FIXTURE_SYS` points elsewhere; a missing tree fails the tests that need it, it never skips them.
    """
    override = os.environ.get(FIXTURE_ENV)
    path = Path(override) if override else PROCFS_SYS
    if not (path / "class/infiniband").is_dir():
        pytest.fail(f"captured sysfs tree not found at {path}: set {FIXTURE_ENV} to its sys/ directory", pytrace=False)
    return path


@pytest.fixture
def fixture_copy(fixture_sys: Path, tmp_path: Path) -> Path:
    """A writable copy of the captured tree, for tests that break files on purpose."""
    dest = tmp_path / "fixture-sys"
    shutil.copytree(fixture_sys, dest, symlinks=True)
    for dirpath, _dirnames, filenames in os.walk(dest):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                os.chmod(path, 0o644)
    return dest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "sim_host(**build): SimHost.build arguments of the `sim_host` (alias `host`) of a test or module"
    )


@pytest.fixture
def sim_host(request: pytest.FixtureRequest, tmp_path: Path) -> SimHost:
    """`SimHost.build(tmp_path/"sys", roce=2, infiniband=1, gid_table_size=16)`: mlx5_0 and mlx5_1 RoCE, mlx5_2 IB.

    Other build arguments for a module or a test: `pytestmark = pytest.mark.sim_host(gid_table_size=8)`, or per
    case `@pytest.mark.parametrize("sim_host", [{"gid_table_size": 255}], indirect=True)` (which wins).
    """
    marker = request.node.get_closest_marker("sim_host")
    kwargs = {**_SIM_DEFAULTS, **(marker.kwargs if marker else {}), **getattr(request, "param", {})}
    return SimHost.build(tmp_path / "sys", **kwargs)


@pytest.fixture
def host(sim_host: SimHost) -> SimHost:
    """`sim_host` under the shorter name most modules read it by."""
    return sim_host


@pytest.fixture
def read_sim() -> Callable[[SimHost], Snapshot]:
    """One in-process snapshot of a simulated host, its empty GID attributes answering EINVAL as a kernel does.

    `host.errno_overlay` is a copy taken now: a reader kept across host changes must take it again.
    """

    def read(host: SimHost) -> Snapshot:
        root = SimSysfsRoot(host.root, errno_overlay=host.errno_overlay)
        try:
            return HostReader(root).read()
        finally:
            root.close()

    return read


@pytest.fixture(autouse=True)
def private_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every exporter a test starts (in-process or as a child) keeps its inventory under tmp_path,
    never in the host's /var/lib/rnic-exporter, so tests cannot see each other's devices."""
    state = tmp_path / "state"
    for command in ("SERVE", "CHECK"):
        monkeypatch.setenv(f"RNIC_EXPORTER_{command}_STATE_DIR", str(state))
    monkeypatch.delenv("NCCL_IB_GID_INDEX", raising=False)
    return state


@pytest.fixture(autouse=True)
def private_nccl_conf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """check and serve read NCCL's config files as NCCL does; no test reads this machine's: no NCCL_*
    variable of the developer's shell, NCCL_CONF_FILE names a missing file (so ~/.nccl.conf is not
    read) and check's and serve's --path.rootfs (/etc/nccl.conf) is an empty directory unless a test
    gives its own. A test of the files passes its own NCCL_CONF_FILE and HOME."""
    from rnic_exporter.config.nccl_env import NCCL_VARIABLES

    for name in NCCL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NCCL_CONF_FILE", str(tmp_path / "no-nccl.conf"))
    for command in ("SERVE", "CHECK", "SHOW", "GIDS"):
        monkeypatch.setenv(f"RNIC_EXPORTER_{command}_PATH_ROOTFS", str(tmp_path / "no-rootfs"))


@pytest.fixture(autouse=True)
def _check_samples_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """`check` reads the counters twice, 3 s apart, for their rates: tests that are not about link
    health would each wait for nothing. tests/commands/test_check_link_health.py sets its own wait."""
    monkeypatch.setattr("rnic_exporter.commands.check.wait_between_samples", lambda seconds: None)
