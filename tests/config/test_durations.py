"""Time flags and the config file's times speak Prometheus (issue 16.4): `500ms`, `5s`, `1h30m` as
Prometheus' model parses them, and plain seconds as before; a bad one is one line naming the flag, exit 2."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from rnic_exporter.catalog.metrics import POLLS
from rnic_exporter.config import file as config
from rnic_exporter.config.bounds import POLL_INTERVAL, check_number, parse_duration
from rnic_exporter.errors import ConfigError
from rnic_exporter.sim import SimHost
from tests.support.exposition import samples
from tests.support.processes import exporter, free_port, http_get
from tests.support.wait import wait_for


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("5s", 5.0),
        ("1m", 60.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("1m30s500ms", 90.5),
        ("2d", 172800.0),
        ("1w", 604800.0),
        ("1y", 31536000.0),
        ("1y1w1d1h1m1s1ms", 32230861.001),
        ("0", 0.0),  # Prometheus: zero needs no unit
        ("0s", 0.0),
        ("90s", 90.0),  # an amount may overflow its unit, as in Prometheus
        ("0.5", 0.5),  # plain seconds, as before
        ("5", 5.0),
        ("2.25", 2.25),
        (" 5s ", 5.0),  # an environment variable's stray blank
    ],
)
def test_durations_prometheus_takes_and_plain_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds, abs=1e-9)


@pytest.mark.parametrize(
    "text",
    [
        "5x",
        "",
        "s",
        "ms",
        "1.5s",  # Prometheus amounts are integers
        "30m1h",  # units in order, largest first
        "1s1s",  # each unit once
        "1h 30m",
        "5S",  # units are lower case
        "1sec",
        "-1s",
        "5 s",
        "1d2w",
        "99999999999999999999y",  # beyond Prometheus' int64 nanoseconds
    ],
)
def test_what_prometheus_refuses_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"duration|out of range"):
        parse_duration(text)


def test_the_range_is_checked_after_parsing() -> None:
    assert check_number("--poll.interval", "500ms", POLL_INTERVAL) == 0.5
    assert check_number("--poll.interval", 0.5, POLL_INTERVAL) == 0.5
    for too_short in ("10ms", "0", "0.01"):
        with pytest.raises(ValueError, match=r"--poll\.interval: expected .*>= 0\.05"):
            check_number("--poll.interval", too_short, POLL_INTERVAL)
    with pytest.raises(ValueError, match=r"<= 3600"):
        check_number("--poll.interval", "1h1ms", POLL_INTERVAL)
    with pytest.raises(ValueError, match="not a finite number"):
        check_number("--poll.interval", "nan", POLL_INTERVAL)


@pytest.mark.parametrize("suffix", ["toml", "yml"])
def test_the_config_files_times_take_durations(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"rnic.{suffix}"
    if suffix == "toml":
        path.write_text(
            'poll_interval_seconds = "500ms"\n[flapping]\nwindow_seconds = "5m"\nclear_after_seconds = 900\n'
            '[addresses]\nforget_after_seconds = "1d"\n'
        )
    else:
        path.write_text(
            "poll_interval_seconds: 500ms\nflapping:\n  window_seconds: 5m\n  clear_after_seconds: 900\n"
            "addresses:\n  forget_after_seconds: 1d\n"
        )
    loaded = config.load(path)
    assert loaded.poll_interval_seconds == 0.5
    assert (loaded.flap_window_seconds, loaded.flap_clear_after_seconds) == (300.0, 900.0)
    assert loaded.address_forget_after_seconds == 86400.0
    assert config.resolve(path).poll_interval_s == 0.5

    path.write_text('[flapping]\nwindow_seconds = "5x"\n' if suffix == "toml" else "flapping:\n  window_seconds: 5x\n")
    with pytest.raises(ConfigError) as caught:
        config.load(path)
    message = str(caught.value)
    assert "flapping.window_seconds: '5x' is not a duration" in message and "\n" not in message


def _serve(sysfs: Path, port: int, *extra: str) -> list[str]:
    return [
        "serve",
        "--path.sysfs",
        str(sysfs),
        "--web.listen-address",
        f"127.0.0.1:{port}",
        "--state.dir",
        "",
        "--no-watch.netlink",  # no early polls: only the interval starts one
        "--no-watch.udev",
        "--no-collector.ethtool",
        *extra,
    ]


@pytest.mark.parametrize("interval", ["500ms", "0.5"])
def test_serve_polls_at_a_duration_flags_rate(tmp_path: Path, interval: str) -> None:
    host = SimHost.build(tmp_path / "sys", roce=1, gid_table_size=16)
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"

    def polls() -> float | None:
        status, _, body = http_get(url, timeout=2)
        return samples(body.decode()).get((POLLS.name, frozenset())) if status == 200 else None

    with exporter(_serve(host.root, port, "--poll.interval", interval), ready_url=url):
        first = wait_for(polls, timeout=20, what="a first poll")
        started = time.monotonic()
        wait_for(lambda: (polls() or 0) >= first + 6, timeout=20, what="six more polls")
        elapsed = time.monotonic() - started
    # Six intervals of 0.5 s: at least ~3 s (the scheduler never polls early without a wakeup), and
    # far below the 30 s of the 5 s default even on a loaded machine.
    assert 2.4 <= elapsed < 15, elapsed


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--poll.interval", "5x"),
        ("--poll.interval", "1.5s"),
        ("--otlp.interval", "5x"),
        ("--otlp.timeout", "1h 30m"),
        ("--web.counter-wait", "2secs"),
    ],
)
def test_a_bad_duration_is_one_line_naming_the_flag_and_exit_2(tmp_path: Path, flag: str, value: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "rnic_exporter", *_serve(tmp_path, free_port(), flag, value)],
        capture_output=True,
        text=True,
        timeout=30,  # a value let through would start a daemon that never returns
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and f"{value!r} is not a duration" in lines[0], proc.stderr
