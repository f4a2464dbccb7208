"""The state file (issue 14.2, 14.3): validated in full on load, moved aside when it is not ours,
written under a unique temp name, and owned by one daemon at a time."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rnic_exporter.cli import main
from rnic_exporter.detect.detector import Detector
from rnic_exporter.detect.settings import DetectionSettings
from rnic_exporter.detect.state import (
    MAX_STATE_BYTES,
    STATE_FILE,
    Baseline,
    KnownAddress,
    KnownDevice,
    State,
    StateLock,
    StateStore,
)
from rnic_exporter.errors import ConfigError
from rnic_exporter.sim import SimHost
from tests.support.processes import exporter, free_port
from tests.support.serve import python_serve_args, serve_args


def _good() -> dict[str, Any]:
    state = State(
        devices={
            "0000:11:00.0": KnownDevice(
                "mlx5_0", "0000:11:00.0", "0c42:a103:0065:c7a8", "MT4129", "MT_0000000838", 1.0e9, 1.7e9
            )
        },
        baselines={"mlx5_0/1": Baseline(50e9, 4)},
        addresses={"mlx5_0/1": {"10.0.0.1": KnownAddress("ens1f0np0", 1.7e9, 3)}},
    )
    return state.to_json()


def _store(tmp_path: Path, content: bytes) -> StateStore:
    directory = tmp_path / "state"
    directory.mkdir(exist_ok=True)
    (directory / STATE_FILE).write_bytes(content)
    return StateStore(directory)


def test_a_valid_file_loads_as_written(tmp_path: Path) -> None:
    loaded = _store(tmp_path, json.dumps(_good()).encode()).load()
    assert loaded.problem is None
    assert loaded.state.to_json() == _good()


def _with(path: tuple[str, ...], value: Any) -> bytes:
    data = _good()
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return json.dumps(data, allow_nan=True).encode()


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b'{"format": "rnic-exporter-state", "\xff": 1}', id="not-utf8"),
        pytest.param(b"[" * 100_000 + b"]" * 100_000, id="nested-100000"),
        pytest.param(_with(("baselines", "mlx5_0/1", "rate_bytes_per_second"), "fast"), id="string-rate"),
        pytest.param(_with(("baselines", "mlx5_0/1", "rate_bytes_per_second"), float("nan")), id="nan-rate"),
        pytest.param(_with(("baselines", "mlx5_0/1", "rate_bytes_per_second"), float("inf")), id="inf-rate"),
        pytest.param(_with(("baselines", "mlx5_0/1", "rate_bytes_per_second"), 1e300), id="1e300-rate"),
        pytest.param(_with(("baselines", "mlx5_0/1", "rate_bytes_per_second"), 0), id="zero-rate"),
        pytest.param(_with(("baselines", "mlx5_0/1", "lanes"), 4.0), id="float-lanes"),
        pytest.param(_with(("baselines", "mlx5_0/1", "lanes"), True), id="bool-lanes"),
        pytest.param(_with(("addresses", "mlx5_0/1", "10.0.0.1", "last_seen"), None), id="null-last-seen"),
        pytest.param(_with(("addresses", "mlx5_0/1", "10.0.0.1", "v2_index"), "3"), id="string-v2-index"),
        pytest.param(_with(("addresses", "mlx5_0/1", "10.0.0.1", "v2_index"), -1), id="negative-v2-index"),
        pytest.param(_with(("addresses", "mlx5_0/1"), []), id="list-of-addresses"),
        pytest.param(_with(("devices", "0000:11:00.0", "name"), 7), id="int-name"),
        pytest.param(_with(("devices", "0000:11:00.0", "first_seen"), 10**400), id="huge-int-time"),
        pytest.param(_with(("devices", "0000:11:00.0", "colour"), "red"), id="unknown-field"),
        pytest.param(_with(("devices",), None), id="null-devices"),
        pytest.param(
            b'{"format": "rnic-exporter-state", "version": 1, "devices": {}, "baselines": {}, '
            b'"addresses": {}, "x": 1e999}',
            id="1e999",
        ),
        pytest.param(
            b'{"format": "rnic-exporter-state", "version": 1, "devices": {}, "baselines": {}, '
            b'"addresses": {}, "x": NaN}',
            id="bare-NaN",
        ),
        pytest.param(b'{"format": "rnic-exporter-state", "version": 1, "n": ' + b"9" * 5000 + b"}", id="5000-digits"),
    ],
)
def test_a_bad_file_is_moved_aside_and_rebuilt(tmp_path: Path, content: bytes) -> None:
    store = _store(tmp_path, content)
    loaded = store.load()
    assert loaded.problem is not None and "\n" not in loaded.problem
    assert loaded.reason == "corrupt"
    assert loaded.state.to_json() == State().to_json()
    assert store.path is not None and not store.path.exists()
    aside = [p.name for p in store.path.parent.iterdir() if p.name.startswith(f"{STATE_FILE}.corrupt-")]
    assert len(aside) == 1 and (store.path.parent / aside[0]).read_bytes() == content


def test_the_detector_counts_a_rebuilt_file(tmp_path: Path) -> None:
    store = _store(tmp_path, _with(("baselines", "mlx5_0/1", "rate_bytes_per_second"), float("nan")))
    detector = Detector(DetectionSettings(), store)
    assert detector.state_errors["corrupt"] == 1


def test_check_with_a_non_utf8_state_file_reports_instead_of_crashing(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=2, infiniband=1, gid_table_size=16)
    _store(tmp_path, b'{"\xfe": 1}')
    result = CliRunner().invoke(
        main,
        ["check", "--path.sysfs", str(host.root), "--state.dir", str(tmp_path / "state"), "--no-netlink", "--json"],
    )
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code in (0, 1)
    assert "corrupt" in json.dumps(json.loads(result.output))


def test_saves_from_two_writers_never_leave_a_broken_file(tmp_path: Path) -> None:
    """Two writers in one process share a pid, as two containers' PID 1 do: only unique temp names
    keep them from renaming each other's half-written file."""
    directory = tmp_path / "state"
    errors: list[BaseException] = []

    def write(name: str) -> None:
        store = StateStore(directory)
        try:
            for i in range(150):
                store.save(State(devices={name: KnownDevice(name, None, first_seen=float(i))}))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(f"mlx5_{n}",)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert StateStore(directory).load().problem is None
    assert [p.name for p in directory.iterdir() if p.name.endswith(".tmp")] == []


def test_the_lock_names_its_holder_and_drops_with_it(tmp_path: Path) -> None:
    first = StateLock.acquire(tmp_path / "state")
    assert first.held
    with pytest.raises(ConfigError, match=r"in use by another rnic-exporter \(pid \d+ on "):
        StateLock.acquire(tmp_path / "state")
    first.release()
    StateLock.acquire(tmp_path / "state").release()


def test_a_second_daemon_on_one_state_dir_exits_2_in_one_line(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=2, infiniband=0, gid_table_size=16)
    state = tmp_path / "shared-state"
    port = free_port()
    quiet = ("--no-watch.netlink", "--no-watch.udev", "--no-collector.ethtool")
    with exporter(
        serve_args(host.root, port, *quiet, state_dir=state), ready_url=f"http://127.0.0.1:{port}/-/ready"
    ) as first:
        second = subprocess.run(
            python_serve_args(host.root, free_port(), *quiet, state_dir=state),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert second.returncode == 2
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert f"pid {first.pid} on " in lines[0] and str(state) in lines[0]


def _valid_file_of(size: int) -> bytes:
    """A valid state file of about `size` bytes: one port remembering ever more addresses."""
    data = _good()
    per_port = {
        f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}": {"netdev": "ens1f0np0", "last_seen": 1.7e9}
        for n in range(size // 55)
    }
    data["addresses"]["mlx5_0/1"] = per_port
    return json.dumps(data).encode()


def test_a_valid_file_over_the_bound_is_moved_aside_without_being_decoded(tmp_path: Path) -> None:
    """Issue 33 item 7: a valid 50 MB file took 30 s and 445 MB before /metrics answered; no file
    this exporter writes comes near the bound, so a bigger one is refused at a glance."""
    content = _valid_file_of(2 * MAX_STATE_BYTES)
    assert len(content) > MAX_STATE_BYTES
    store = _store(tmp_path, content)
    started = time.monotonic()
    loaded = store.load()
    assert time.monotonic() - started < 0.5
    assert loaded.reason == "corrupt" and loaded.problem is not None
    assert f"{len(content)} bytes, over the 4 MiB" in loaded.problem
    assert loaded.state.to_json() == State().to_json()
    aside = [p for p in tmp_path.joinpath("state").iterdir() if p.name.startswith(f"{STATE_FILE}.corrupt-")]
    assert len(aside) == 1 and aside[0].stat().st_size == len(content)


def test_a_valid_file_under_the_bound_loads(tmp_path: Path) -> None:
    content = _valid_file_of(MAX_STATE_BYTES // 2)
    loaded = _store(tmp_path, content).load()
    assert loaded.problem is None and len(loaded.state.addresses["mlx5_0/1"]) > 30_000
