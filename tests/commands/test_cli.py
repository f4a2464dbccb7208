"""The CLI end to end: show, gids, exit codes, and serve's refusals (real processes where it matters)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rnic_exporter import __version__
from rnic_exporter.cli import Exit, main
from rnic_exporter.sim import SimHost
from tests.support.processes import free_port, http_get, stop_process
from tests.support.serve import python_serve_args, start_demo
from tests.support.wait import wait_for


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_version_and_help() -> None:
    code, out, _ = invoke("--version")
    assert code == 0 and __version__ in out
    for command in ("show", "gids", "serve", "demo"):
        code, out, _ = invoke(command, "--help")
        assert code == 0 and "--" in out, command


def test_show_table_marks_unreadable_and_nccl_index(host: SimHost) -> None:
    host.gid_shift("mlx5_1")
    host.corrupt("mlx5_0", "ports/1/rate", "garbage")
    code, out, err = invoke("show", "--path.sysfs", str(host.root))
    assert code == Exit.OK
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert set(rows) == {"mlx5_0", "mlx5_1", "mlx5_2"}
    assert "rate(malformed)" in rows["mlx5_0"]
    assert rows["mlx5_1"].split()[-2] == "4"  # NCCL index after the shift
    assert "10.0.1.1" in rows["mlx5_1"] and "Gen5 x16" in rows["mlx5_1"]
    assert "mlx5_0 port 1 rate: malformed" in err


def test_show_json_gives_exact_file_values(host: SimHost) -> None:
    code, out, _ = invoke("show", "--path.sysfs", str(host.root), "--json")
    assert code == 0
    data = json.loads(out)
    assert data["schema"] == 1 and data["errors"] == []
    dev = {d["name"]: d for d in data["devices"]}
    sim = host.device("mlx5_0")
    mlx5_0 = dev["mlx5_0"]
    ib = host.root / "class/infiniband/mlx5_0"
    assert mlx5_0["node_guid"] == (ib / "node_guid").read_text().strip() == sim.node_guid
    assert mlx5_0["fw_ver"] == "28.39.2048" and mlx5_0["hca_type"] == "MT4129"
    assert mlx5_0["pci_address"] == sim.pci_address
    assert mlx5_0["pcie"]["current_generation"] == 5 and mlx5_0["pcie"]["max_width"] == 16
    port = mlx5_0["ports"][0]
    assert port["rate"] == {"gbps": 400.0, "lanes": 4, "speed": "NDR", "per_lane_gbps": 100.0, "bits_per_second": 400e9}
    assert port["state"] == {"number": 4, "name": "ACTIVE"} and port["up"] is True
    assert port["ipv4"] == ["10.0.0.1"] and port["nccl_gid_index"] == 3 and port["gid_table_size"] == 16
    assert port["netdevs"][0]["name"] == "ens1f0np0" and port["netdevs"][0]["speed_mbps"] == 400000
    data_words = int((ib / "ports/1/counters/port_xmit_data").read_text())
    assert port["counters"]["port_xmit_data"] == {"value": data_words * 4, "saturated": False}
    assert port["hw_counters"]["out_of_sequence"] == 0 and "lifespan" not in port["hw_counters"]
    assert dev["mlx5_2"]["ports"][0]["link_layer"] == "InfiniBand"


def test_gids_json_and_table(host: SimHost) -> None:
    old, new = host.gid_shift("mlx5_0")
    code, out, _ = invoke("gids", "--path.sysfs", str(host.root), "--json", "--device", "mlx5_0")
    assert code == 0
    data = json.loads(out)
    rows = [(g["index"], g["ipv4"], g["version"], g["nccl_selected"]) for g in data["gids"]]
    assert rows == [
        (0, None, "v1", False),
        (1, None, "v2", False),
        (2, "10.0.0.1", "v1", False),
        (new, "10.0.0.1", "v2", True),
    ]
    assert (old, new) == (3, 4)
    code, out, _ = invoke("gids", "--path.sysfs", str(host.root))
    assert code == 0
    lines = out.splitlines()
    assert lines[-1] == "n_gids_found=9"  # 4 + 4 + the IB port's one
    selected = [line for line in lines if "<== NCCL" in line]
    assert len(selected) == 3 and any(line.split()[:3] == ["mlx5_0", "1", "4"] for line in selected)


def test_nccl_environment_changes_the_pick(host: SimHost, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_IB_ROCE_VERSION_NUM", "1")
    _, out, _ = invoke("gids", "--path.sysfs", str(host.root), "--json", "--device", "mlx5_0")
    assert [g["index"] for g in json.loads(out)["gids"] if g["nccl_selected"]] == [2]
    # NCCL reads anything but exactly AF_INET6 as AF_INET: no usage error, the same pick.
    monkeypatch.setenv("NCCL_IB_ADDR_FAMILY", "AF_UNIX")
    code, out, _ = invoke("gids", "--path.sysfs", str(host.root), "--json", "--device", "mlx5_0")
    assert code == 0 and [g["index"] for g in json.loads(out)["gids"] if g["nccl_selected"]] == [2]


def test_bad_sysfs_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for command in ("show", "gids"):
        proc = subprocess.run(
            [sys.executable, "-m", "rnic_exporter", command, "--path.sysfs", str(tmp_path / "nope")],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 2
        assert proc.stderr.count("\n") == 1 and "is not a directory" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_host_without_rdma_devices(tmp_path: Path) -> None:
    (tmp_path / "class" / "net").mkdir(parents=True)
    code, out, _ = invoke("show", "--path.sysfs", str(tmp_path))
    assert code == 0 and "No RDMA devices found" in out
    code, out, _ = invoke("show", "--path.sysfs", str(tmp_path), "--json")
    assert code == 0 and json.loads(out)["devices"] == []


def test_device_filters_and_unknown_device(host: SimHost) -> None:
    code, out, _ = invoke(
        "show", "--path.sysfs", str(host.root), "--json", "--collector.infiniband.device-exclude", "^mlx5_[01]$"
    )
    assert [d["name"] for d in json.loads(out)["devices"]] == ["mlx5_2"]
    code, _, err = invoke("show", "--path.sysfs", str(host.root), "--collector.infiniband.device-include", "(")
    assert code == Exit.USAGE and "device-include" in err
    code, _, err = invoke("gids", "--path.sysfs", str(host.root), "--device", "mlx9_9")
    assert code == Exit.USAGE and "mlx9_9" in err and "mlx5_0" in err


def test_serve_refuses_broken_config_and_busy_port(host: SimHost, tmp_path: Path) -> None:
    bad = tmp_path / "rnic.toml"
    bad.write_text("poll_interval_seconds = -1\n[collector.infiniband]\ndevice_inclde = 'x'\n")
    proc = subprocess.run(
        python_serve_args(host.root, free_port(), "--config", str(bad)),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2, proc.stderr
    assert str(bad) in proc.stderr and "poll_interval_seconds" in proc.stderr
    assert "collector.infiniband.device_inclde: unknown key" in proc.stderr and "Traceback" not in proc.stderr

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run(
            python_serve_args(host.root, port),
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert proc.returncode == 2 and f"127.0.0.1:{port}" in proc.stderr and "Traceback" not in proc.stderr


def test_serve_reloads_config_on_sighup_and_stops_on_sigterm(host: SimHost, tmp_path: Path) -> None:
    config = tmp_path / "rnic.yml"
    config.write_text("collector:\n  infiniband:\n    device_exclude: '^mlx5_0$'\n")
    port = free_port()
    proc = subprocess.Popen(
        python_serve_args(host.root, port, "--config", str(config), "--log.format", "json", poll=0.2),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        url = f"http://127.0.0.1:{port}/metrics"

        def devices() -> str | None:
            status, _, body = http_get(url, timeout=1)
            line = next((x for x in body.decode().splitlines() if x.startswith("rnic_devices ")), None)
            return line if status == 200 else None

        assert wait_for(devices, timeout=20, what="first scrape") == "rnic_devices 2.0"
        config.write_text("collector:\n  infiniband:\n    device_exclude: '^mlx5_[01]$'\n")
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: devices() == "rnic_devices 1.0", timeout=10, what="reload to exclude mlx5_1")
        config.write_text("collector: [not, a, mapping\n")
        proc.send_signal(signal.SIGHUP)

        def reload_failed() -> bool:
            body = http_get(url, timeout=1)[2].decode()
            return "rnic_exporter_config_last_reload_successful 0.0" in body

        wait_for(reload_failed, timeout=10, what="the failed reload to be reported")
        assert devices() == "rnic_devices 1.0"  # still the last good config
        status, _, _ = http_get(f"http://127.0.0.1:{port}/-/healthy")
        assert status == 200
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    finally:
        stop_process(proc)  # only when the test failed before the process ended
    assert proc.returncode == 0
    records = [json.loads(line) for line in err.decode().splitlines()]
    messages = [r["msg"] for r in records]
    assert "config reloaded" in messages and "config reload failed; keeping the running config" in messages
    assert messages[-1] == "stopped"


@pytest.mark.parametrize("devices", ["2", "5", "25"])
def test_demo_refuses_a_host_its_story_does_not_fit(devices: str) -> None:
    # Five RoCE RNICs play the story and one more has no PMA: fewer used to crash with a KeyError.
    code, _, err = invoke("demo", "--devices", devices)
    assert code == 2 and "'--devices': expected an integer >= 6 and <= 24" in err and "Traceback" not in err


def test_demo_plays_failures_and_cleans_up(tmp_path: Path) -> None:
    port = free_port()
    proc = start_demo(port)
    try:
        url = f"http://127.0.0.1:{port}/metrics"

        def nccl_moved() -> bool:
            body = http_get(url, timeout=1)[2].decode()
            return 'rnic_nccl_gid_index{device="mlx5_1",port="1"} 4.0' in body

        wait_for(nccl_moved, timeout=30, what="the demo's GID shift to show in the metrics")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=15)
    finally:
        stop_process(proc)  # only when the test failed before the process ended
    assert proc.returncode == 0
    assert "step 1: GID index shift" in out
    workdir = next(line.split()[-1] for line in out.splitlines() if line.startswith("Removed "))
    assert not Path(workdir).exists()


def test_a_device_filter_that_matches_nothing_is_not_no_hardware(host: SimHost) -> None:
    # The shipped ConfigMap's `^mlx5_` on a Broadcom node: every device is there, none is read.
    for command in (["show"], ["show", "--json"], ["check", "--no-netlink", "--state.dir", ""]):
        code, out, err = invoke(
            *command, "--path.sysfs", str(host.root), "--collector.infiniband.device-include", "^bnxt_"
        )
        assert code == Exit.USAGE, (command, out)
        assert "No RDMA devices" not in out and "OK:" not in out
        assert err.count("\n") == 1 and "matches none of the 3 RDMA device(s)" in err and "mlx5_0" in err, err
    # A filter that keeps some devices, and a host with none at all, are as before.
    code, out, _ = invoke("show", "--path.sysfs", str(host.root), "--collector.infiniband.device-exclude", "^mlx5_0$")
    assert code == 0 and "mlx5_1" in out and "mlx5_0" not in out


def test_every_error_is_one_line_naming_what_to_fix(host: SimHost, tmp_path: Path) -> None:
    for args in (["show", "--nope"], ["nosuch"], ["show", "--path.sysfs"], ["check", "--fail-on", "sometimes"]):
        proc = subprocess.run(
            [sys.executable, "-m", "rnic_exporter", *args], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, (args, proc.stderr)
        assert proc.stderr.startswith("rnic-exporter: error: ") and "--help" in proc.stderr, proc.stderr
    bad = tmp_path / "rnic.yml"
    bad.write_text("poll_interval_seconds: [1\n")
    code, _, err = invoke("check", "--path.sysfs", str(host.root), "--config", str(bad))
    assert code == 2 and err.count("\n") == 1 and f'in "{bad}", line 1' in err and "<unicode string>" not in err
    # An [nccl] value NCCL runs with is not an error at all (it used to name an environment variable).
    cfg = tmp_path / "rnic.toml"
    cfg.write_text('[nccl]\nib_addr_range = "10.0.0.0/33"\n')
    code, out, err = invoke(
        "check", "--path.sysfs", str(host.root), "--no-netlink", "--state.dir", "", "--config", str(cfg)
    )
    assert code != 2 and "NCCL_IB_ADDR_RANGE='10.0.0.0/33'" in out and "NCCL ignores the range" in out, err


def test_show_json_keeps_a_netdev_in_another_namespace(host: SimHost) -> None:
    netdev = host.device("mlx5_0").netdev
    (host.root / "class/net" / netdev).unlink()  # it lives in a pod's network namespace
    _, table, _ = invoke("show", "--path.sysfs", str(host.root))
    assert f"{netdev} (missing)" in table
    code, out, _ = invoke("show", "--path.sysfs", str(host.root), "--json")
    (port,) = next(d for d in json.loads(out)["devices"] if d["name"] == "mlx5_0")["ports"]
    assert code == 0 and [(n["name"], n["present"]) for n in port["netdevs"]] == [(netdev, False)]
    other = next(d for d in json.loads(out)["devices"] if d["name"] == "mlx5_1")["ports"][0]["netdevs"]
    assert other and all(n["present"] is True for n in other) and set(other[0]) == set(port["netdevs"][0])


def test_help_shows_defaults_as_an_operator_types_them() -> None:
    _, out, _ = invoke("serve", "--help")
    flat = " ".join(out.split())
    assert "no-collector.consumers]" not in flat and "[default: 5.0]" not in flat, flat
    assert "[default: 5s]" in flat and "[default: off]" in flat and "[default: on]" in flat


def _documented_env_var(command: str, flag: str) -> str:
    """docs/configuration.md: RNIC_EXPORTER_<COMMAND>_<FLAG>, dots and dashes become `_`."""
    return f"RNIC_EXPORTER_{command.upper()}_{flag.lstrip('-').replace('.', '_').replace('-', '_').upper()}"


def test_every_flag_reads_the_variable_the_docs_name_and_no_other() -> None:
    import click

    for name, command in main.commands.items():
        for param in command.params:
            if not isinstance(param, click.Option) or param.name == "help":
                continue
            flag = next(opt for opt in param.opts if opt.startswith("--"))
            assert param.envvar == _documented_env_var(name, flag), (name, flag, param.envvar)
            assert not param.allow_from_autoenv, (name, flag)  # Click's name from the parameter is not read


def test_flags_from_the_environment_as_documented(host: SimHost, tmp_path: Path) -> None:
    """The names an operator types from the docs work, with dotted flags (`--path.sysfs`) and ones
    whose Python parameter is named otherwise (`--json`, `--collector.infiniband.device-include`)."""
    env = {
        "RNIC_EXPORTER_SHOW_PATH_SYSFS": str(host.root),
        "RNIC_EXPORTER_SHOW_JSON": "1",
        "RNIC_EXPORTER_SHOW_COLLECTOR_INFINIBAND_DEVICE_INCLUDE": "^mlx5_1$",
    }
    result = CliRunner().invoke(main, ["show"], env=env)
    assert result.exit_code == 0, result.output
    assert [d["name"] for d in json.loads(result.stdout)["devices"]] == ["mlx5_1"]
    # Click's own name for the parameter is not a second way in.
    result = CliRunner().invoke(main, ["show", "--path.sysfs", str(host.root)], env={"RNIC_EXPORTER_SHOW_AS_JSON": "1"})
    assert result.exit_code == 0 and not result.stdout.startswith("{")
