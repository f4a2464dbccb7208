"""Unknown stays unknown: a `state` file or a GID table that cannot be read is never "down",
"empty" or "no index" in show, show --json, gids, check, the exposition or OTLP."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner

from rnic_exporter.cli import Exit, main
from rnic_exporter.model.host import Snapshot
from rnic_exporter.sim import SimHost
from rnic_exporter.sinks.samples import ExporterStats, Published
from tests.support.agents import CarriedCounters
from tests.support.exposition import render_text, samples
from tests.support.otlp import HttpReceiver
from tests.support.wait import wait_for

pytestmark = pytest.mark.sim_host(infiniband=0)


@pytest.fixture
def host(sim_host: SimHost) -> SimHost:
    host = sim_host
    host.drop_state_file("mlx5_1")
    host.drop_gid_table("mlx5_0")
    return host


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def ports_of(show: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d["ports"][0] for d in show["devices"]}


def test_show_and_gids_say_unknown(host: SimHost) -> None:
    code, out, _ = run("show", "--path.sysfs", str(host.root), "--json")
    ports = ports_of(json.loads(out))
    assert code == 0
    assert ports["mlx5_1"]["up"] is None and ports["mlx5_1"]["state"] is None
    assert ports["mlx5_1"]["phys_state"] == {"number": 5, "name": "LinkUp"}
    assert ports["mlx5_0"]["up"] is True
    assert (
        ports["mlx5_0"]["gid_table_size"],
        ports["mlx5_0"]["gid_table_hash"],
        ports["mlx5_0"]["nccl_gid_index"],
    ) == (None, None, None)
    assert ports["mlx5_1"]["nccl_gid_index"] == 3
    code, out, _ = run("show", "--path.sysfs", str(host.root))
    rows = {line.split()[0]: line for line in out.splitlines()[1:] if line.startswith("mlx5_")}
    assert "?/LinkUp" in rows["mlx5_1"] and "(state unknown)" in rows["mlx5_1"] and "(not up)" not in rows["mlx5_1"]
    header = out.splitlines()[0]
    at = header.index("NCCL_GID")
    assert rows["mlx5_0"][at : at + 2] == "? "  # NCCL's index: unknown, not "-" (none)
    code, out, err = run("gids", "--path.sysfs", str(host.root), "--json")
    table = {p["device"]: p for p in json.loads(out)["ports"]}
    assert table["mlx5_0"]["gid_table_size"] is None and table["mlx5_1"]["gid_table_size"] == 16
    code, out, err = run("gids", "--path.sysfs", str(host.root))
    assert code == 0 and "mlx5_0 port 1: the GID table could not be read" in err


def test_check_does_not_call_unknown_down(host: SimHost) -> None:
    code, out, _ = run("check", "--path.sysfs", str(host.root), "--no-netlink", "--state.dir", "", "--json")
    report = json.loads(out)
    assert [(p["code"], p["where"]) for p in report["problems"]] == [
        ("gid_table_unreadable", "mlx5_0 port 1 (ens1f0np0)")
    ]
    assert code == Exit.OK  # an info problem: the tree has no gids/, nothing failed
    assert any("mlx5_1 port 1: state: absent" in note for note in report["notes"])


def test_exposition_and_otlp_leave_unknown_out(host: SimHost, read_sim: Callable[[SimHost], Snapshot]) -> None:
    from rnic_exporter.config.otlp import OtlpSettings
    from rnic_exporter.sinks.otel import OtelSink

    snap = read_sim(host)
    got = samples(render_text(snap))

    def has(name: str, device: str) -> bool:
        return any(n == name and ("device", device) in labels for n, labels in got)

    assert not has("rnic_port_up", "mlx5_1") and not has("rnic_port_state", "mlx5_1")
    assert has("rnic_port_physical_state", "mlx5_1") and has("rnic_port_up", "mlx5_0")
    for name in ("rnic_nccl_gid_index", "rnic_gid_table_size", "rnic_gid_table_hash"):
        assert not has(name, "mlx5_0") and has(name, "mlx5_1"), name
    with HttpReceiver() as rcv:
        sink = OtelSink(
            OtlpSettings(endpoint=rcv.url, protocol="http/protobuf", interval_s=0.2, timeout_s=2.0),
            CarriedCounters(ExporterStats(polls=1)),
        )
        try:
            sink.publish(Published(snap, (), ExporterStats(polls=1), ()))
            wait_for(lambda: bool(rcv.received.latest_points()), timeout=20, what="an OTLP metrics export")
        finally:
            sink.close()
        points = rcv.received.latest_points()
    up = {p.attrs["hw.id"]: p.value for p in points if p.metric == "hw.network.up"}
    assert up == {"mlx5_0/1": 1}
    nccl = {p.attrs["device"] for p in points if p.metric == "rnic.nccl.gid_index"}
    assert nccl == {"mlx5_1"}
