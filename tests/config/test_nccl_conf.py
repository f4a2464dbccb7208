"""NCCL's own config files, read as NCCL's setEnvFile / initEnvFunc read them (src/misc/param.cc).

Jobs get NCCL_* from NCCL_CONF_FILE (else ~/.nccl.conf) and /etc/nccl.conf as well as from their
environment; check and serve judge with what the jobs get. One test per parsing rule, each failing
if the rule were implemented otherwise; then the precedence end to end through the real CLI:
--nccl-gid-index > NCCL_IB_GID_INDEX > the config file's [nccl] > NCCL_CONF_FILE or ~/.nccl.conf >
/etc/nccl.conf under --path.rootfs. Every test names its own HOME, NCCL_CONF_FILE and rootfs: no
file of this machine is read.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner

from rnic_exporter.cli import Exit, main
from rnic_exporter.config.nccl_conf import NcclConf, conf_paths, parse, read_nccl_conf
from rnic_exporter.config.nccl_env import gid_index_from_env
from rnic_exporter.sim import SimHost
from tests.support.exposition import samples
from tests.support.processes import exporter, free_port, http_get
from tests.support.wait import wait_for

# Two RoCE ports, GIDs at 0-3 (index 3: RoCE v2 IPv4, what NCCL auto-selects), 4-7 empty.
pytestmark = pytest.mark.sim_host(infiniband=0, gid_table_size=8)

CONF = "/etc/nccl.conf"


def values(text: bytes) -> dict[str, str]:
    return {name: setting.value for name, setting in parse(text, CONF).values.items()}


def notes(text: bytes) -> tuple[str, ...]:
    return parse(text, CONF).notes


# -- one line at a time, as setEnvFile ---------------------------------------------------------------


def test_a_name_and_value_are_split_at_the_first_equals_sign() -> None:
    assert values(b"NCCL_IB_ADDR_RANGE=10.0.0.0/8=x\n") == {"NCCL_IB_ADDR_RANGE": "10.0.0.0/8=x"}


def test_a_line_without_an_equals_sign_sets_nothing() -> None:
    assert values(b"NCCL_IB_GID_INDEX 3\nNCCL_IB_GID_INDEX\n") == {}


def test_a_comment_is_a_hash_in_the_first_column_only() -> None:
    assert values(b"#NCCL_IB_GID_INDEX=3\n") == {}
    # Indented, it is a line like any other: a variable named " #NCCL_IB_GID_INDEX" (harmless, never read).
    assert values(b" #NCCL_IB_GID_INDEX=3\n") == {" #NCCL_IB_GID_INDEX": "3"}


def test_the_name_is_not_stripped_and_nccl_never_reads_a_spaced_one() -> None:
    text = b"NCCL_IB_GID_INDEX = 3\n"
    assert values(text) == {"NCCL_IB_GID_INDEX ": " 3"}
    (note,) = notes(text)
    assert note == (
        "/etc/nccl.conf line 1: 'NCCL_IB_GID_INDEX ' is not NCCL_IB_GID_INDEX: NCCL sets a variable of that "
        "name and never reads it (write NCCL_IB_GID_INDEX=3: no spaces around '=')"
    )
    assert "NCCL_IB_GID_INDEX" in " ".join(notes(b"export NCCL_IB_GID_INDEX=3\n"))  # shell syntax, same fate
    assert notes(b"NCCL_DEBUG =INFO\n") == ()  # notes only for the variables that decide the GID


def test_the_value_keeps_its_quotes_and_nccl_reads_them() -> None:
    text = b'NCCL_IB_GID_INDEX="3"\n'
    assert values(text) == {"NCCL_IB_GID_INDEX": '"3"'}
    assert gid_index_from_env(values(text)) == 0  # strtoll stops at the quote: index 0, not 3
    (note,) = notes(text)
    assert "NCCL keeps the quotes" in note and "write NCCL_IB_GID_INDEX=3" in note
    assert notes(b"NCCL_IB_ADDR_FAMILY='AF_INET6'\n") and not notes(b"NCCL_IB_ADDR_FAMILY=AF_INET6\n")


def test_the_first_line_for_a_name_wins_within_a_file() -> None:
    text = b"NCCL_IB_GID_INDEX=5\nNCCL_IB_GID_INDEX=3\n"
    assert values(text) == {"NCCL_IB_GID_INDEX": "5"}
    assert parse(text, CONF).values["NCCL_IB_GID_INDEX"].line == 1
    (note,) = notes(text)
    assert note.startswith("/etc/nccl.conf line 2: NCCL_IB_GID_INDEX=3 is ignored: NCCL keeps the first")


def test_an_empty_value_is_a_value_and_wins_too() -> None:
    # setenv("NCCL_IB_GID_INDEX", "", 0) sets it: the later line does not count, NCCL auto-selects.
    assert values(b"NCCL_IB_GID_INDEX=\nNCCL_IB_GID_INDEX=3\n") == {"NCCL_IB_GID_INDEX": ""}


def test_an_empty_name_is_ignored() -> None:
    # setenv("", ...) fails: nothing set, nothing blocked.
    assert values(b"=3\nNCCL_IB_GID_INDEX=3\n") == {"NCCL_IB_GID_INDEX": "3"}


def test_one_newline_then_one_carriage_return_are_stripped() -> None:
    assert values(b"NCCL_IB_ADDR_FAMILY=AF_INET6\r\n") == {"NCCL_IB_ADDR_FAMILY": "AF_INET6"}
    assert values(b"NCCL_IB_ADDR_FAMILY=AF_INET6\r\r\n") == {"NCCL_IB_ADDR_FAMILY": "AF_INET6\r"}
    assert values(b"NCCL_IB_ADDR_FAMILY=AF_INET6\n\r") == {"NCCL_IB_ADDR_FAMILY": "AF_INET6"}  # "\r": no "="
    assert values(b"NCCL_IB_ADDR_FAMILY=AF_INET6 \t\n") == {"NCCL_IB_ADDR_FAMILY": "AF_INET6 \t"}  # no more
    assert values(b"NCCL_IB_ADDR_FAMILY=AF_INET6\r") == {"NCCL_IB_ADDR_FAMILY": "AF_INET6"}  # the last line


def test_name_and_value_are_cut_to_1023_bytes() -> None:
    assert values(b"N" * 1500 + b"=v\n") == {"N" * 1023: "v"}
    assert values(b"NCCL_IB_ADDR_RANGE=" + b"1" * 2000 + b"\n") == {"NCCL_IB_ADDR_RANGE": "1" * 1023}


def test_a_line_longer_than_4095_bytes_is_read_as_two() -> None:
    # fgets into char[4096]: the first 4095 bytes are the comment, the rest is a line of its own.
    text = b"#" + b"x" * 4094 + b"NCCL_IB_GID_INDEX=3\nNCCL_IB_ADDR_FAMILY=AF_INET6\n"
    parsed = parse(text, CONF)
    assert {n: s.value for n, s in parsed.values.items()} == {
        "NCCL_IB_GID_INDEX": "3",
        "NCCL_IB_ADDR_FAMILY": "AF_INET6",
    }
    assert parsed.values["NCCL_IB_GID_INDEX"].line == 1 and parsed.values["NCCL_IB_ADDR_FAMILY"].line == 2
    assert parsed.notes == (
        "/etc/nccl.conf line 1 is longer than 4095 bytes: NCCL reads its rest as a line of its own, "
        "which sets NCCL_IB_GID_INDEX",
    )
    # A newline as the 4096th byte: the 4095 bytes, then an empty line; nothing is split off.
    assert values(b"NCCL_IB_ADDR_RANGE=" + b"1" * 4076 + b"\nNCCL_IB_GID_INDEX=3\n") == {
        "NCCL_IB_ADDR_RANGE": "1" * 1023,
        "NCCL_IB_GID_INDEX": "3",
    }


def test_a_nul_byte_ends_the_line_as_strlen_does() -> None:
    assert values(b"NCCL_IB_GID_INDEX=3\0junk\nNCCL_IB_ADDR_FAMILY\0=AF_INET6\n") == {"NCCL_IB_GID_INDEX": "3"}


# -- which files, in which order ------------------------------------------------------------------------


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """A host root with etc/nccl.conf, a HOME with .nccl.conf and a file for NCCL_CONF_FILE, all empty."""
    paths = {"root": tmp_path / "root", "home": tmp_path / "home"}
    (paths["root"] / "etc").mkdir(parents=True)
    paths["home"].mkdir()
    paths["etc"] = paths["root"] / "etc/nccl.conf"
    paths["user"] = paths["home"] / ".nccl.conf"
    paths["conf_file"] = tmp_path / "job-nccl.conf"
    return paths


def read(files: dict[str, Path], **environ: str) -> NcclConf:
    return read_nccl_conf({"HOME": str(files["home"]), **environ}, files["root"])


def test_the_environment_beats_the_user_file_which_beats_etc(files: dict[str, Path]) -> None:
    files["etc"].write_text("NCCL_IB_GID_INDEX=5\nNCCL_IB_ADDR_FAMILY=AF_INET6\nNCCL_IB_ROCE_VERSION_NUM=1\n")
    files["user"].write_text("NCCL_IB_GID_INDEX=3\nNCCL_IB_ADDR_FAMILY=AF_INET\n")
    conf = read(files, NCCL_IB_ADDR_FAMILY="")  # set, even empty: setenv(..., 0) leaves it alone
    assert conf.env() == {"NCCL_IB_GID_INDEX": "3", "NCCL_IB_ROCE_VERSION_NUM": "1"}
    assert conf.values["NCCL_IB_GID_INDEX"].where == f"{files['user']} line 1"
    assert conf.values["NCCL_IB_ROCE_VERSION_NUM"].where == f"{files['etc']} line 3"


def test_nccl_conf_file_replaces_the_home_file_and_an_empty_one_does_not(files: dict[str, Path]) -> None:
    files["user"].write_text("NCCL_IB_GID_INDEX=3\n")
    files["conf_file"].write_text("NCCL_IB_GID_INDEX=2\n")
    assert read(files, NCCL_CONF_FILE=str(files["conf_file"])).env() == {"NCCL_IB_GID_INDEX": "2"}
    assert read(files, NCCL_CONF_FILE="").env() == {"NCCL_IB_GID_INDEX": "3"}
    # A missing NCCL_CONF_FILE is no file: ~/.nccl.conf is still not read.
    assert read(files, NCCL_CONF_FILE=str(files["home"] / "missing")).env() == {}
    assert conf_paths({}, files["root"]) == [str(files["etc"])]  # no HOME: /etc/nccl.conf only


def test_etc_is_read_under_the_rootfs_and_the_user_files_are_not(files: dict[str, Path]) -> None:
    files["etc"].write_text("NCCL_IB_GID_INDEX=5\n")
    assert conf_paths({"NCCL_CONF_FILE": "/job.conf"}, files["root"]) == ["/job.conf", str(files["etc"])]
    assert conf_paths({"HOME": "/home/u"}, Path("/")) == ["/home/u/.nccl.conf", "/etc/nccl.conf"]
    assert read(files).values["NCCL_IB_GID_INDEX"].path == str(files["etc"])


def test_a_file_that_cannot_be_read_is_no_file(files: dict[str, Path]) -> None:
    os.mkfifo(files["conf_file"])  # opened without blocking, and not a regular file: skipped
    assert read(files, NCCL_CONF_FILE=str(files["conf_file"])) == NcclConf()
    assert read(files, NCCL_CONF_FILE=str(files["home"])) == NcclConf()  # a directory
    assert read_nccl_conf({"HOME": str(files["home"] / "nowhere")}, files["root"] / "nowhere") == NcclConf()


# -- end to end through the CLI: check ------------------------------------------------------------------


def check(host: SimHost, files: dict[str, Path], *extra: str, **env: str | None) -> tuple[int, dict[str, object]]:
    """`check --json` with the host root `files["root"]`, HOME `files["home"]` and no NCCL_CONF_FILE
    unless given."""
    environ: dict[str, str | None] = {"HOME": str(files["home"]), "NCCL_CONF_FILE": None, **env}
    args = ["check", "--path.sysfs", str(host.root), "--path.rootfs", str(files["root"]), "--state.dir", ""]
    result = CliRunner(env=environ).invoke(main, [*args, "--no-netlink", "--json", *extra])
    assert result.exit_code in (Exit.OK, Exit.PROBLEMS), result.output
    return result.exit_code, json.loads(result.stdout)


def problems(report: dict[str, object]) -> list[dict[str, str]]:
    found = report["problems"]
    assert isinstance(found, list)
    return found


def codes(report: dict[str, object]) -> list[str]:
    return [p["code"] for p in problems(report)]


def notes_of(report: dict[str, object]) -> list[str]:
    found = report["notes"]
    assert isinstance(found, list)
    return found


def test_an_index_in_etc_nccl_conf_at_an_empty_slot_fails_check_naming_the_file(
    host: SimHost, files: dict[str, Path]
) -> None:
    files["etc"].write_text("# site defaults\nNCCL_IB_GID_INDEX=5\n")
    code, report = check(host, files)
    assert code == Exit.PROBLEMS and codes(report) == ["nccl_gid_index_invalid"] * 2
    problem = problems(report)[0]
    assert problem["what"].startswith(f"NCCL_IB_GID_INDEX=5 (from {files['etc']} line 2) points at no GID")
    assert f"NCCL: read {files['etc']}: NCCL_IB_GID_INDEX=5 (line 2)" in notes_of(report)


def test_the_environment_beats_etc_nccl_conf(host: SimHost, files: dict[str, Path]) -> None:
    files["etc"].write_text("NCCL_IB_GID_INDEX=5\n")
    code, report = check(host, files, NCCL_IB_GID_INDEX="3")
    assert code == Exit.OK, report
    assert f"NCCL: read {files['etc']}: NCCL_IB_GID_INDEX (line 1, not used: the environment's wins)" in notes_of(
        report
    )
    assert check(host, files, NCCL_IB_GID_INDEX="")[0] == Exit.OK  # empty: NCCL auto-selects, the file unused


def test_the_user_file_beats_etc_nccl_conf(host: SimHost, files: dict[str, Path]) -> None:
    files["etc"].write_text("NCCL_IB_GID_INDEX=5\n")
    files["user"].write_text("NCCL_IB_GID_INDEX=3\n")
    assert check(host, files)[0] == Exit.OK
    files["conf_file"].write_text("NCCL_IB_GID_INDEX=6\n")  # NCCL_CONF_FILE replaces ~/.nccl.conf
    code, report = check(host, files, NCCL_CONF_FILE=str(files["conf_file"]))
    assert code == Exit.PROBLEMS and f"(from {files['conf_file']} line 1)" in problems(report)[0]["what"]


def test_the_config_files_nccl_section_beats_nccl_files_and_the_flag_beats_all(
    host: SimHost, files: dict[str, Path], tmp_path: Path
) -> None:
    files["etc"].write_text("NCCL_IB_GID_INDEX=5\n")
    config = tmp_path / "rnic.toml"
    config.write_text("[nccl]\nib_gid_index = 3\n")
    code, report = check(host, files, "--config", str(config))
    assert code == Exit.OK
    overridden = f"NCCL_IB_GID_INDEX=5 (line 1, overridden by {config} [nccl])"
    assert f"NCCL: read {files['etc']}: {overridden}" in notes_of(report)
    code, report = check(host, files, "--config", str(config), "--nccl-gid-index", "6", NCCL_IB_GID_INDEX="3")
    assert code == Exit.PROBLEMS and problems(report)[0]["what"].startswith("NCCL_IB_GID_INDEX=6 points at")
    config.write_text("[nccl]\nib_gid_index = 7\n")
    code, report = check(host, files, "--config", str(config))
    assert code == Exit.PROBLEMS
    assert f"NCCL_IB_GID_INDEX=7 (from {config} [nccl] ib_gid_index)" in problems(report)[0]["what"]


def test_a_spaced_line_in_etc_nccl_conf_is_ignored_with_a_note(host: SimHost, files: dict[str, Path]) -> None:
    files["etc"].write_text("NCCL_IB_GID_INDEX = 5\n")
    code, report = check(host, files)
    assert code == Exit.OK  # NCCL never reads "NCCL_IB_GID_INDEX ": it auto-selects index 3
    assert any("'NCCL_IB_GID_INDEX ' is not NCCL_IB_GID_INDEX" in n for n in notes_of(report))


def test_the_other_gid_variables_come_from_the_files_too(host: SimHost, files: dict[str, Path]) -> None:
    # AF_INET6 on a host without global IPv6 GIDs: NCCL auto-selects a link-local GID.
    files["etc"].write_text("NCCL_IB_ADDR_FAMILY=AF_INET6\n")
    code, report = check(host, files)
    assert code == Exit.PROBLEMS and codes(report) == ["nccl_gid_unusable"] * 2
    assert check(host, files, NCCL_IB_ADDR_FAMILY="AF_INET")[0] == Exit.OK
    files["user"].write_text('NCCL_IB_ROCE_VERSION_NUM="2"\n')  # read as 0 by NCCL: no GID has RoCE v0
    code, report = check(host, files, NCCL_IB_ADDR_FAMILY="AF_INET")
    assert code == Exit.PROBLEMS
    assert "NCCL: NCCL_IB_ROCE_VERSION_NUM='\"2\"': NCCL reads as 0" in " ".join(notes_of(report))


def test_show_and_gids_name_the_index_check_judges(host: SimHost, files: dict[str, Path]) -> None:
    """The files move NCCL's auto-selection (AF_INET6 on a host with IPv4 addresses only: off the
    IPv4 GID at 3, to a link-local one); `show` and `gids` must say so, or an operator reads one
    index and `check` judges another."""
    env: dict[str, str | None] = {"HOME": str(files["home"]), "NCCL_CONF_FILE": None}
    root = ["--path.sysfs", str(host.root), "--path.rootfs", str(files["root"])]

    def picks() -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
        shown = CliRunner(env=env).invoke(main, ["show", *root, "--json"])
        listed = CliRunner(env=env).invoke(main, ["gids", *root, "--json"])
        assert shown.exit_code == 0 and listed.exit_code == 0, shown.output + listed.output
        by_show = {
            (d["name"], port["port"]): port["nccl_gid_index"]
            for d in json.loads(shown.stdout)["devices"]
            for port in d["ports"]
        }
        by_gids = {
            (g["device"], g["port"]): g["index"] for g in json.loads(listed.stdout)["gids"] if g["nccl_selected"]
        }
        return by_show, by_gids

    assert picks() == ({("mlx5_0", 1): 3, ("mlx5_1", 1): 3},) * 2
    files["etc"].write_text("NCCL_IB_ADDR_FAMILY=AF_INET6\n")
    by_show, by_gids = picks()
    assert by_show == by_gids and set(by_show.values()) != {3}, by_show
    _, report = check(host, files)
    judged = {p["where"].split(" (")[0]: p["what"] for p in problems(report) if p["code"] == "nccl_gid_unusable"}
    assert set(judged) == {f"{device} port {port}" for device, port in by_show}
    for (device, port), index in by_show.items():
        assert f"index {index} holds" in judged[f"{device} port {port}"]


# -- serve: read at start and on SIGHUP -------------------------------------------------------------------


def test_serve_reads_the_files_at_start_and_again_on_sighup(host: SimHost, files: dict[str, Path]) -> None:
    files["etc"].write_text("NCCL_IB_GID_INDEX=5\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    args = [
        "serve",
        "--path.sysfs",
        str(host.root),
        "--path.rootfs",
        str(files["root"]),
        "--web.listen-address",
        f"127.0.0.1:{port}",
        "--poll.interval",
        "0.2",
        "--no-watch.netlink",
        "--no-watch.udev",
        "--no-collector.ethtool",
    ]

    def valid() -> set[float]:
        status, _, body = http_get(url, timeout=2)
        assert status == 200
        return {v for (name, _), v in samples(body.decode()).items() if name == "rnic_nccl_configured_gid_index_valid"}

    with exporter(args, ready_url=url, env={"HOME": str(files["home"]), "NCCL_CONF_FILE": ""}) as proc:
        wait_for(lambda: valid() == {0.0}, timeout=20, what="index 5 of /etc/nccl.conf judged invalid")
        files["etc"].write_text("NCCL_IB_GID_INDEX=3\n")
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: valid() == {1.0}, timeout=20, what="the edited /etc/nccl.conf read on SIGHUP")
