"""The README stays true: its commands are what CI runs, and every metric is documented."""

from __future__ import annotations

import re
from pathlib import Path

from rnic_exporter.catalog import metrics as catalog

REPO = Path(__file__).resolve().parents[2]


def _code_blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)\n```", text, flags=re.S)


def test_readme_has_two_commands_and_ci_runs_the_test_one() -> None:
    readme = (REPO / "README.md").read_text()
    blocks = _code_blocks(readme)
    assert len(blocks) >= 2
    run_cmd, test_cmd = blocks[0], blocks[1]
    assert "rnic-exporter demo" in run_cmd and "pip install" in run_cmd
    ci = (REPO / ".ci" / "run").read_text()
    assert test_cmd in ci, f"{test_cmd!r} must be what .ci/run runs"


def test_every_metric_is_in_the_readme() -> None:
    readme = (REPO / "README.md").read_text()
    missing = [spec.name for spec in catalog.METRICS if f"`{spec.name}`" not in readme]
    assert missing == [], f"document these in README.md's metric table: {missing}"
