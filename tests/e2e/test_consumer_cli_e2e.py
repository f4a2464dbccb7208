"""The real consumer scan (`sources/consumers.py`) over the simulator's fake procfs, through the real
commands: `serve` (HTTP scrape, and the GID-shift event log line), `show` and `check` name the right job
and pod for the right device. Proves the simulator lays verbs users out as the scan reads a kernel's.

The scan is the real one (issue 15 item 1), bound by `consumer_watch.scanner`, the daemon's one seam.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.sim import SimHost, SimProcfs
from tests.support.exposition import label_sets
from tests.support.fakeproc import POD_UID
from tests.support.processes import exporter, free_port, http_get
from tests.support.serve import serve_args
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def tree(tmp_path: Path) -> tuple[SimHost, SimProcfs, list[str]]:
    host = SimHost.build(tmp_path / "sys", roce=3, infiniband=1, gid_table_size=32)
    users = SimProcfs(host, tmp_path / "proc", tmp_path / "root")
    users.slurm_job("4242", ["mlx5_1"], layout="v1")
    users.pod("team-a", "trainer-0", POD_UID, ["mlx5_1", "mlx5_2"], layout="cgroupfs")
    paths = [
        "--path.sysfs",
        str(host.root),
        "--path.procfs",
        str(users.procfs),
        "--path.rootfs",
        str(tmp_path / "root"),
    ]
    return host, users, paths


def _rnic(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rnic_exporter", *args], capture_output=True, text=True, timeout=60)


def test_show_and_check_name_them(tree: tuple[SimHost, SimProcfs, list[str]]) -> None:
    _, _, paths = tree
    shown = json.loads(_rnic("show", *paths, "--collector.consumers", "--json").stdout)
    users = {
        d["name"]: {(u["kind"], u.get("slurm_job_id"), u.get("k8s_pod_name")) for u in d["users"]}
        for d in shown["devices"]
    }
    assert users == {
        "mlx5_0": set(),
        "mlx5_1": {("slurm", "4242", None), ("pod", None, "trainer-0")},
        "mlx5_2": {("pod", None, "trainer-0")},
        "mlx5_3": set(),
    }
    checked = _rnic(
        "check", *paths, "--state.dir", "", "--no-netlink", "--nccl-gid-index", "1", "--collector.consumers"
    )
    assert checked.returncode == 1
    assert "  hits:  pod team-a/trainer-0, slurm job 4242" in checked.stdout


def test_serve_names_them_and_the_gid_shift_event_too(
    tree: tuple[SimHost, SimProcfs, list[str]], tmp_path: Path
) -> None:
    host, _, paths = tree
    port = free_port()
    log = tmp_path / "exporter.log"
    args = serve_args(host.root, port, *paths[2:], poll=0.3, state_dir=tmp_path / "state")
    args += ["--no-watch.netlink", "--no-watch.udev", "--log.format", "json"]
    with exporter([*args, "--collector.consumers"], ready_url=f"http://127.0.0.1:{port}/-/ready", log_path=log):

        def info() -> list[dict[str, str]] | None:
            body = http_get(f"http://127.0.0.1:{port}/metrics")[2]
            rows = [s for s in label_sets(body, catalog.DEVICE_WORKLOAD_INFO.name) if s["device"] == "mlx5_1"]
            return rows if len(rows) == 2 else None

        rows = wait_for(info, timeout=20, what="two workloads on mlx5_1")
        assert {(r["kind"], r["slurm_job_id"], r["k8s_pod_name"]) for r in rows} == {
            ("slurm", "4242", ""),
            ("pod", "", "trainer-0"),
        }
        host.gid_shift("mlx5_1")

        def moved() -> list[dict[str, str]]:
            lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
            return [x for x in lines if x.get("event") == "rnic.gid.address_moved"]

        line = wait_for(moved, timeout=20, what="the GID-shift event")[0]
    assert line["device"] == "mlx5_1"
    assert "slurm job 4242" in line["consumers"] and "pod team-a/trainer-0" in line["consumers"]
