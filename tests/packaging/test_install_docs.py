"""The install and test instructions are true: `scripts/test` says what it does to a host, the
wheel steps work as written, and nothing points at a package index rnic-exporter is not on."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
SCRIPT = REPO / "scripts" / "test"
# What scripts/test installs that changes how the host boots or who manages its network, and the
# name a reader knows it by.
HOST_CHANGING = {"linux-image-amd64": "kernel", "network-manager": "NetworkManager", "dbus": "dbus"}


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end >= 0 else len(text)]


def _texts() -> dict[Path, str]:
    files = [README, *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "rnic_exporter").rglob("*.py"))]
    return {path: path.read_text() for path in files}


def test_the_readme_says_what_scripts_test_installs_on_the_host_and_where_to_run_it() -> None:
    listing = SCRIPT.read_text().split("debs=(\n", 1)[1].split("\n)\n", 1)[0]
    lines = [line.split("#", 1)[0] for line in listing.splitlines()]
    installed = {name for line in lines for name in line.split()}
    assert set(HOST_CHANGING) <= installed, "HOST_CHANGING names packages scripts/test no longer installs"
    for text in (_section(README.read_text(), "## Test it"), (REPO / "docs" / "development.md").read_text()):
        for name in HOST_CHANGING.values():
            assert name in text, name
        assert "throwaway" in text


def test_python_m_build_is_preceded_by_installing_build_and_wheels_install_from_dist() -> None:
    for path, text in _texts().items():
        if "python -m build" in text:  # the first time a file says it, it says to install build first
            first = text[: text.index("python -m build")]
            assert "pip install build" in first, f"{path.relative_to(REPO)}: python -m build without build"
        for wheel in re.findall(r"install\s+'?(\S*rnic_exporter-[^\s']*\.whl)", text):
            assert wheel.startswith("dist/"), f"{path.relative_to(REPO)}: {wheel}"


def test_no_hint_installs_rnic_exporter_from_a_package_index() -> None:
    for path, text in _texts().items():
        found = re.findall(r"pip install '?rnic-exporter\b|pipx install '?rnic-exporter\b", text)
        assert found == [], f"{path.relative_to(REPO)}: {found} (rnic-exporter is on no package index)"


def test_every_command_is_listed_by_help_and_in_the_readme() -> None:
    """`simulate` was hidden from --help and named nowhere in the docs."""
    from click.testing import CliRunner

    from rnic_exporter.cli import main

    listed = CliRunner().invoke(main, ["--help"]).output.split("Commands:", 1)[1]
    commands = _section(README.read_text(), "### Commands")
    for name in main.commands:
        assert re.search(rf"^\s+{name}\s", listed, flags=re.M), f"{name} is not in --help"
        assert f"`rnic-exporter {name}" in commands, f"{name} is not in the README's command table"
