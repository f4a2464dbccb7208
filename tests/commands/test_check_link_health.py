"""`check` judges the error counters by their rate: two reads `[link_health] check_window_seconds`
apart. The wait between the reads is where these tests let the simulated host carry traffic or errors
(the kernel would count them in that time); the reads, the judgement and the report are the real ones."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from click.testing import CliRunner

from rnic_exporter.cli import Exit, main
from rnic_exporter.commands import check as check_module
from rnic_exporter.sim import SimHost


@pytest.fixture
def host(tmp_path: Path) -> SimHost:
    # mlx5_0, mlx5_1: 400 Gb/s RoCE; mlx5_2: 4X NDR InfiniBand.
    return SimHost.build(tmp_path / "sys", roce=2, infiniband=1, gid_table_size=16)


def during_the_window(monkeypatch: pytest.MonkeyPatch, host: SimHost, story: Callable[[float], None]) -> list[float]:
    """What the host does while check waits between its two reads; the waits asked for. Check's
    clock moves by the wait, so the judged window is the one asked for (plus the reads' own time)."""
    asked: list[float] = []

    def wait(seconds: float) -> None:
        asked.append(seconds)
        story(seconds)

    monkeypatch.setattr(check_module, "wait_between_samples", wait)
    monkeypatch.setattr(check_module, "clock", lambda: time.monotonic() + sum(asked))
    return asked


def run(host: SimHost, *args: str, config: Path | None = None) -> tuple[int, dict[str, object]]:
    extra = ["--config", str(config)] if config else []
    result = CliRunner().invoke(
        main, ["check", "--path.sysfs", str(host.root), "--no-netlink", "--state.dir", "", "--json", *extra, *args]
    )
    assert result.exit_code in (Exit.OK, Exit.PROBLEMS), result.output
    return result.exit_code, json.loads(result.output)


def problems(report: Mapping[str, object]) -> list[dict[str, str]]:
    value = report["problems"]
    assert isinstance(value, list)
    return value


def busy(host: SimHost, seconds: float) -> None:
    """A healthy busy host: 90% of line rate, congestion marks and CNPs, a stray symbol error,
    a little reordering (tens a second against millions of packets)."""
    host.add_traffic(seconds, utilisation=0.9)
    for name in ("mlx5_0", "mlx5_1"):
        host.add_counts(
            name,
            {
                "np_ecn_marked_roce_packets": int(17_000 * seconds),
                "np_cnp_sent": int(3_000 * seconds),
                "rp_cnp_handled": int(2_900 * seconds),
                "out_of_sequence": int(13 * seconds),
                "packet_seq_err": 1,
                "port_xmit_wait": int(300_000 * seconds),
                "port_xmit_discards": 4,
                "out_of_buffer": 2,
            },
        )
    host.add_counts("mlx5_2", {"symbol_error": 1, "port_xmit_wait": int(120_000 * seconds)})


def test_a_healthy_busy_host_passes(monkeypatch: pytest.MonkeyPatch, host: SimHost) -> None:
    asked = during_the_window(monkeypatch, host, lambda s: busy(host, s))
    code, report = run(host)
    assert asked == [3.0]  # the documented default
    assert code == Exit.OK and problems(report) == [], report
    notes = report["notes"]
    assert isinstance(notes, list)
    assert "link health: counters read twice, 3 s apart ([link_health] check_window_seconds)" in notes[-1]


def test_a_cable_going_bad_is_a_warning_that_names_the_port(monkeypatch: pytest.MonkeyPatch, host: SimHost) -> None:
    def story(seconds: float) -> None:
        busy(host, seconds)
        host.add_counts("mlx5_2", {"symbol_error": 60, "link_error_recovery": 1})

    during_the_window(monkeypatch, host, story)
    code, report = run(host)
    assert code == Exit.PROBLEMS
    [problem] = problems(report)
    assert (problem["severity"], problem["code"], problem["reason"]) == (
        "warning",
        "link_degrading",
        "symbol_error,link_error_recovery",
    )
    assert problem["where"] == "mlx5_2 port 1 (ibp48s0)"
    # 61 errors over 3 s (and the reads' own milliseconds) of 4 x 100 Gb/s: BER 5e-11.
    assert re.search(
        r"symbol_error \+61 in 3(\.\d+)? s \(20(\.\d)?/s, BER 5(\.\d)?e-11\), above BER 1e-12 or 120/h; "
        r"link_error_recovery \+1 in 3(\.\d+)? s \(0\.3\d+/s\), above 0$",
        problem["what"],
    ), problem["what"]


def test_retries_exceeded_is_critical(monkeypatch: pytest.MonkeyPatch, host: SimHost) -> None:
    host.device("mlx5_0").hw_counters["req_transport_retries_exceeded"] = 0  # newer kernels' mlx5 has it
    host.add_counts("mlx5_0", {"req_transport_retries_exceeded": 0})

    def story(seconds: float) -> None:
        busy(host, seconds)
        host.add_counts("mlx5_0", {"req_transport_retries_exceeded": 1})

    during_the_window(monkeypatch, host, story)
    code, report = run(host, "--fail-on", "critical")
    assert code == Exit.PROBLEMS
    [problem] = problems(report)
    assert (problem["severity"], problem["code"]) == ("critical", "transport_retries_exceeded")
    assert problem["where"] == "mlx5_0 port 1 (ens1f0np0)"


def test_lossy_roce_path_and_the_port_also_below_rated(monkeypatch: pytest.MonkeyPatch, host: SimHost) -> None:
    host.inject_aer("mlx5_1", "correctable", count=3)

    def story(seconds: float) -> None:
        busy(host, seconds)
        host.add_counts("mlx5_1", {"out_of_sequence": 40_000, "packet_seq_err": 20_000, "roce_adp_retrans": 5_000})

    during_the_window(monkeypatch, host, story)
    config = host.root.parent / "rnic.toml"
    config.write_text('[[rated]]\nmatch = { device = "mlx5_1" }\nnetdev_speed_gbps = 800\n')
    code, report = run(host, config=config)
    assert code == Exit.PROBLEMS
    link = [p for p in problems(report) if p["code"] == "link_degrading"]
    assert len(link) == 1 and link[0]["where"] == "mlx5_1 port 1 (ens2f0np0)"
    # 66M packets in the window: 40,000 and 20,000 are above 1e-4 of them, 5,000 (7.5e-5) is not.
    assert link[0]["reason"] == "out_of_sequence,packet_seq_err"
    assert "also below rated: netdev 400 Gb/s, rated 800 Gb/s (config)" in link[0]["what"]
    assert "its NIC reported 3 PCIe AER error(s) since boot" in link[0]["what"]


def test_the_window_is_configurable(monkeypatch: pytest.MonkeyPatch, host: SimHost) -> None:
    asked = during_the_window(monkeypatch, host, lambda s: busy(host, s))
    config = host.root.parent / "rnic.toml"
    config.write_text('[link_health]\ncheck_window_seconds = "1500ms"\n')
    code, report = run(host, config=config)
    assert asked == [1.5] and code == Exit.OK
    assert "1.5 s apart" in str(report["notes"])
