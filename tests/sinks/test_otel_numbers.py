"""OTLP is not blinded by one value (issue 14.6): counters beyond int64 go out as doubles.

A real OtelSink exports to a real OTLP/HTTP receiver that decodes the bytes with opentelemetry-proto.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rnic_exporter.config.otlp import OtlpSettings
from rnic_exporter.sim import SimHost
from rnic_exporter.sim.sysfs_root import SimSysfsRoot
from rnic_exporter.sinks.otel_metrics import otlp_number
from rnic_exporter.sinks.samples import ExporterStats, Published
from rnic_exporter.sources.reader import HostReader
from tests.support.agents import CarriedCounters
from tests.support.otlp import HttpReceiver
from tests.support.wait import wait_for

SATURATED = (1 << 64) - 1


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ((1 << 63) - 1, (1 << 63) - 1),
        (-(1 << 63), -(1 << 63)),
        (1 << 63, float(1 << 63)),
        (SATURATED, float(SATURATED)),
        (4 * SATURATED, float(4 * SATURATED)),
        (10**400, float("inf")),
        (1.5, 1.5),
        (0, 0),
    ],
)
def test_otlp_number(value: int | float, want: int | float) -> None:
    got = otlp_number(value)
    assert got == want and type(got) is type(want)


def test_counters_beyond_int64_do_not_stop_the_batch(tmp_path: Path) -> None:
    from rnic_exporter.sinks.otel import OtelSink

    host = SimHost.build(tmp_path / "sys", roce=2, infiniband=0, gid_table_size=16)
    counters = host.root / "class/infiniband/mlx5_0/ports/1/counters"
    (counters / "port_rcv_data").write_text(f"{SATURATED}\n")  # x4 into bytes: 2^66
    (counters / "port_xmit_data").write_text(f"{1 << 61}\n")  # x4: exactly 2^63
    (counters / "symbol_error").write_text(f"{SATURATED}\n")
    root = SimSysfsRoot(host.root, errno_overlay=host.errno_overlay)
    snap = HostReader(root).read(full_gid_tables=True)
    root.close()
    with HttpReceiver() as rcv:
        sink = OtelSink(
            OtlpSettings(endpoint=rcv.url, protocol="http/protobuf", interval_s=0.2, timeout_s=2.0), CarriedCounters()
        )
        try:
            sink.publish(Published(snap, (), ExporterStats(), ()))
            points = wait_for(lambda: rcv.received.latest_points() or None, timeout=20, what="a metrics batch")
        finally:
            sink.close()
    io = {(p.attrs["hw.id"], p.attrs["network.io.direction"]): p.value for p in points if p.metric == "hw.network.io"}
    assert io[("mlx5_0/1", "receive")] == float(4 * SATURATED)
    assert io[("mlx5_0/1", "transmit")] == float(1 << 63)
    assert isinstance(io[("mlx5_1/1", "receive")], int)  # the other port: exact integers as before
    errors = [
        p.value
        for p in points
        if p.metric == "hw.errors" and p.attrs.get("error.type") == "symbol_error" and p.attrs["hw.id"] == "mlx5_0/1"
    ]
    assert errors == [float(SATURATED)]
