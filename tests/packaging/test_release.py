"""Release hygiene: `python -m build` gives an sdist and a wheel that carry the deployment files, and a
fresh venv with nothing but that wheel (and its dependencies from the package index) runs `serve`,
`check` and `bundle`.

The build runs on a copy of exactly what the Dockerfile's build stage copies, so the container
build cannot be missing a file either. One build and one venv per session (module fixture).
"""

from __future__ import annotations

import email.parser
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rnic_exporter import __version__
from rnic_exporter.commands import bundle
from rnic_exporter.sim import SimHost
from tests.support.processes import free_port, http_get, stop_process
from tests.support.wait import wait_for

REPO = Path(__file__).resolve().parents[2]
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".*")


@dataclass(frozen=True)
class Release:
    context: Path  # the sources the release was built from (a snapshot: others edit the checkout meanwhile)
    wheel: Path
    sdist: Path
    venv: Path

    def exe(self, name: str) -> str:
        return str(self.venv / "bin" / name)


def _dockerfile_sources() -> list[str]:
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    sources: list[str] = []
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not words[1].startswith("--from"):
            sources.extend(words[1:-1])
    assert sources, "no COPY in the Dockerfile"
    return sources


def _run(argv: list[str], *, timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)
    assert result.returncode == 0, f"{argv} exited {result.returncode}:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    work = tmp_path_factory.mktemp("release")
    context = work / "context"
    for source in _dockerfile_sources():
        src = REPO / source
        if src.is_dir():
            shutil.copytree(src, context / source, ignore=IGNORED)
        else:
            (context / source).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, context / source)
    dist = work / "dist"
    # Without --sdist/--wheel, build makes the sdist and then the wheel *from the sdist*: an sdist
    # missing a bundled file fails here.
    _run([sys.executable, "-m", "build", "--outdir", str(dist), str(context)], timeout=300)
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    venv = work / "venv"
    # No pip inside the new venv (ensurepip costs more than the rest): this pip installs into it, and
    # nothing but the wheel and its dependencies lands there.
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], timeout=120)
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin/python"),
            "install",
            "-q",
            "--disable-pip-version-check",
            str(wheel),
        ],
        timeout=300,
    )
    return Release(context, wheel, sdist, venv)


def test_wheel_carries_every_bundle_file_byte_for_byte(release: Release) -> None:
    with zipfile.ZipFile(release.wheel) as wheel:
        names = set(wheel.namelist())
        files = bundle.bundle_files(release.context)
        assert files
        for rel in files:
            member = f"rnic_exporter/_bundle/{rel}"
            assert member in names, member
            assert wheel.read(member) == (release.context / rel).read_bytes(), member
        assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc") or n.startswith("tests/")]
        dist_info = f"rnic_exporter-{__version__}.dist-info"
        metadata = email.parser.Parser().parsestr(wheel.read(f"{dist_info}/METADATA").decode())
        assert metadata["Version"] == __version__
        assert "rnic-exporter = rnic_exporter.cli:run" in wheel.read(f"{dist_info}/entry_points.txt").decode()
    assert {
        "dashboards/rnic-fleet-overview.json",
        "alerts/rnic-exporter.rules.yml",
        "packaging/kubernetes/prometheusrule.yaml",
        "packaging/systemd/rnic-exporter.service",
    } <= {str(rel) for rel in files}


def test_sdist_carries_the_sources_and_the_deployment_files(release: Release) -> None:
    top = f"rnic_exporter-{__version__}"
    with tarfile.open(release.sdist) as sdist:
        names = {name.removeprefix(f"{top}/") for name in sdist.getnames()}
    for required in (
        "pyproject.toml",
        "setup.py",
        "MANIFEST.in",
        "README.md",
        "CHANGELOG.md",
        "rnic_exporter/__init__.py",
        "rnic_exporter/commands/bundle.py",
    ):
        assert required in names, required
    assert {str(rel) for rel in bundle.bundle_files(release.context)} <= names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc") or n.startswith(".venv")]


def test_version_comes_from_one_place(release: Release) -> None:
    assert release.wheel.name == f"rnic_exporter-{__version__}-py3-none-any.whl"
    assert _run([release.exe("rnic-exporter"), "--version"], timeout=60).stdout.strip() == (
        f"rnic-exporter, version {__version__}"
    )
    changelog = (REPO / "CHANGELOG.md").read_text()
    newest = re.search(r"^## \[(\d+\.\d+\.\d+)\]", changelog, flags=re.M)
    assert newest is not None and newest[1] == __version__


@pytest.fixture
def sim(tmp_path: Path) -> SimHost:
    return SimHost.build(tmp_path / "sys", roce=2, infiniband=1, gid_table_size=16)


@pytest.fixture
def served(release: Release, sim: SimHost, tmp_path: Path) -> Iterator[str]:
    """`serve` from the fresh venv, run outside the checkout so nothing of it can be imported."""
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                release.exe("rnic-exporter"),
                "serve",
                "--path.sysfs",
                str(sim.root),
                "--web.listen-address",
                f"127.0.0.1:{port}",
                "--state.dir",
                str(tmp_path / "state"),
                "--path.rootfs",
                str(tmp_path),
                "--poll.interval",
                "0.5",
            ],
            stdout=out,
            stderr=out,
            cwd=tmp_path,
            env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
        )
        base = f"http://127.0.0.1:{port}"
        try:

            def ready() -> bool:
                if proc.poll() is not None:
                    raise AssertionError(f"serve exited with {proc.returncode}: {log.read_text()}")
                return http_get(f"{base}/-/ready", timeout=1)[0] == 200

            wait_for(ready, timeout=30, what="serve from the release venv")
            yield base
        finally:
            stop_process(proc)


def test_fresh_venv_serves_metrics_from_the_installed_package(release: Release, served: str) -> None:
    def scrape() -> str | None:
        # The first scrape after /-/ready already has the first poll; waiting costs nothing if so.
        status, _, body = http_get(f"{served}/metrics")
        assert status == 200
        return body.decode() if b"rnic_devices" in body else None

    text = wait_for(scrape, timeout=20, what="a scrape with the first poll")
    assert re.search(r"^rnic_devices 3\.0$", text, flags=re.M), text[:2000]
    assert re.search(rf'^rnic_exporter_build_info\{{[^}}]*version="{re.escape(__version__)}"', text, flags=re.M)
    where = _run(
        [release.exe("python"), "-c", "import rnic_exporter; print(rnic_exporter.__file__)"],
        timeout=60,
        cwd=release.venv,
    ).stdout.strip()
    assert Path(where).is_relative_to(release.venv)


def test_fresh_venv_check_passes_a_healthy_host_and_fails_a_short_one(
    release: Release, sim: SimHost, tmp_path: Path
) -> None:
    argv = [
        release.exe("rnic-exporter"),
        "check",
        "--path.sysfs",
        str(sim.root),
        "--state.dir",
        str(tmp_path / "state"),
        "--path.rootfs",
        str(tmp_path),
        "--no-netlink",
    ]
    healthy = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    short = subprocess.run([*argv, "--expected-devices", "4"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert short.returncode == 1, short.stdout + short.stderr
    assert "4 expected" in short.stdout


def test_fresh_venv_writes_the_bundle_from_the_wheel(release: Release, tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    _run([release.exe("rnic-exporter"), "bundle", "--out", str(out)], timeout=60, cwd=tmp_path)
    root = _run(
        [release.exe("python"), "-c", "from rnic_exporter.commands import bundle; print(bundle.bundle_root())"],
        timeout=60,
        cwd=tmp_path,
    ).stdout.strip()
    assert Path(root).is_relative_to(release.venv)  # the wheel's copy, not a checkout
    files = bundle.bundle_files(release.context)
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert written == sorted(str(bundle.output_path(rel)) for rel in files)
    for rel in files:
        assert (out / bundle.output_path(rel)).read_bytes() == (release.context / rel).read_bytes(), rel
