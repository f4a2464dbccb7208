"""Ship the deployment files inside the package, so `rnic-exporter bundle` works from a wheel.

The canonical files stay at the repository root (`dashboards/`, `alerts/`, `packaging/`), where
operators and tests find them. MANIFEST.in puts them into the sdist; this build step copies them
into the wheel as `rnic_exporter/_bundle/...`, where `rnic_exporter.commands.bundle` reads them through the
package. An editable install needs no copy: the package then sits in the checkout and
`rnic_exporter.commands.bundle` reads the root directories themselves. Everything else is in pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

BUNDLED_DIRS = (
    "dashboards",
    "alerts",
    "packaging",
    "docs/runbooks",
)  # keep in step with rnic_exporter/commands/bundle.py
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")


class BuildPyWithBundle(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        source = Path(__file__).resolve().parent
        target = Path(self.build_lib) / "rnic_exporter" / "_bundle"
        for name in BUNDLED_DIRS:
            if not (source / name).is_dir():
                raise SystemExit(f"setup.py: {name}/ is missing from the source tree; it must be in the sdist")
            shutil.copytree(source / name, target / name, ignore=IGNORED, dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildPyWithBundle})
