"""`check` as a job prologue: severities decide the exit code, notes never do, and the README's
prologue lines are commands that work."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from rnic_exporter.cli import Exit, main
from rnic_exporter.commands import bundle
from rnic_exporter.sim import SimHost

README = Path(__file__).resolve().parents[2] / "README.md"


def check(host: SimHost, *args: str) -> tuple[int, dict[str, object]]:
    result = CliRunner().invoke(
        main, ["check", "--path.sysfs", str(host.root), "--no-netlink", "--state.dir", "", "--json", *args]
    )
    return result.exit_code, json.loads(result.output)


def listed(report: dict[str, object], key: str) -> list[dict[str, str]]:
    value = report[key]
    assert isinstance(value, list)
    return value


def test_warnings_fail_by_default_and_not_with_fail_on_critical(host: SimHost) -> None:
    host.set_port_up("mlx5_2", False)  # port_down: a warning
    code, report = check(host)
    assert code == Exit.PROBLEMS and report["failed"] is True and report["fail_on"] == "warning"
    [problem] = listed(report, "problems")
    assert (problem["severity"], problem["reason"], problem["code"]) == ("warning", "port_down", "port_down")
    code, report = check(host, "--fail-on", "critical")
    assert code == Exit.OK and report["failed"] is False and report["healthy"] is False
    host.ipv6_only("mlx5_0")  # and now a critical one
    code, report = check(host, "--fail-on", "critical")
    assert code == Exit.PROBLEMS
    assert [(p["severity"], p["reason"]) for p in listed(report, "problems")] == [
        ("critical", "link_local"),
        ("warning", "port_down"),
    ]
    assert (
        CliRunner().invoke(main, ["check", "--path.sysfs", str(host.root), "--fail-on", "info"]).exit_code == Exit.USAGE
    )


def test_notes_never_change_the_exit_code(host: SimHost) -> None:
    host.without_pma("mlx5_1")
    code, report = check(host)  # no inventory, and a port whose PMA does not answer
    notes = listed(report, "notes")
    assert code == Exit.OK and report["healthy"] is True and listed(report, "problems") == []
    assert any("no inventory" in str(n) for n in notes) and any("no_pma" in str(n) for n in notes)
    result = CliRunner().invoke(main, ["check", "--path.sysfs", str(host.root), "--no-netlink", "--state.dir", ""])
    assert result.exit_code == Exit.OK and result.output.startswith("OK: 3 RDMA device(s)")


def test_an_unreadable_attribute_carries_its_errno_as_reason(host: SimHost) -> None:
    host.corrupt("mlx5_0", "ports/1/rate", "fast\n")
    code, report = check(host)
    [problem] = listed(report, "problems")
    assert code == Exit.PROBLEMS and (problem["code"], problem["reason"]) == ("attribute_unreadable", "malformed")


def _readme_block(lang: str, marker: str) -> str:
    for block in re.findall(rf"```{lang}\n(.*?)\n```", README.read_text(), flags=re.S):
        if marker in block:
            return str(block)
    raise AssertionError(f"README has no {lang} block with {marker!r}")


def test_readme_slurm_prologue_installs_the_shipped_script() -> None:
    """The README installs the script the bundle ships (tests/packaging/test_slurm_prologue.py runs it)."""
    script = _readme_block("sh", "50-rnic-check.sh")
    [line] = [ln for ln in script.splitlines() if ln.startswith("install ")]
    source = shlex.split(line)[-2]
    assert source.endswith("slurm/50-rnic-check.sh")
    shipped = bundle.bundle_root() / "packaging" / "slurm" / "50-rnic-check.sh"
    assert (shipped.is_file() and os.access(shipped, os.X_OK)) or shipped.read_text().startswith("#!")


def test_readme_init_container_args_run(host: SimHost) -> None:
    spec = yaml.safe_load(_readme_block("yaml", "initContainers"))
    [container] = spec["initContainers"]
    args = [a.replace("/host/sys", str(host.root)) for a in container["args"]]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert CliRunner().invoke(main, args, env=env).exit_code == Exit.OK
    host.ipv6_only("mlx5_1")
    assert CliRunner().invoke(main, args, env=env).exit_code == Exit.PROBLEMS


def test_a_corrupt_state_file_is_reported_and_left_for_the_daemon(host: SimHost, tmp_path: Path) -> None:
    """check is a diagnosis: it writes nothing, not even the rename the daemon makes of a corrupt file."""
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "state.json").write_text("{not json")
    result = CliRunner().invoke(
        main, ["check", "--path.sysfs", str(host.root), "--no-netlink", "--state.dir", str(state_dir), "--json"]
    )
    notes = json.loads(result.output)["notes"]
    assert any(n.startswith("state: ") and "left in place" in n for n in notes), notes
    assert sorted(p.name for p in state_dir.iterdir()) == ["state.json"]
    assert (state_dir / "state.json").read_text() == "{not json"


def test_ctrl_c_is_neither_ok_nor_problems(host: SimHost, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exit 1 makes the shipped prologue drain the node: an interrupted check must not say it (130, as a
    shell reports SIGINT, is a run that judged nothing; the prologue lets the job run)."""
    from rnic_exporter.commands import check

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(check, "run_check", interrupted)
    result = CliRunner().invoke(main, ["check", "--path.sysfs", str(host.root), "--no-netlink", "--state.dir", ""])
    assert result.exit_code == 130, (result.exit_code, result.output)
    assert "interrupted" in result.output
