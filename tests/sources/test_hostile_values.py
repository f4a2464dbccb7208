"""Hostile sysfs values (issue 14.1): each is "malformed" for its one attribute, never a crash.

Every case goes through the real reading layer over a simulated tree and the real renderer; the
exposition must stay parseable and valid UTF-8, and the bad attribute must show as unavailable.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.cli import main
from rnic_exporter.model.host import GidEntry, LinkRate, Netdev, Snapshot
from rnic_exporter.sim import SimHost
from rnic_exporter.sim.sysfs_root import SimSysfsRoot
from rnic_exporter.sinks import otel_metrics
from rnic_exporter.sinks.samples import ExporterStats, snapshot_families
from rnic_exporter.sources.gids import parse_gid_type, parse_netdev_name
from rnic_exporter.sources.infiniband import (
    parse_counter,
    parse_lid,
    parse_link_layer,
    parse_numbered_state,
    parse_rate,
    parse_string,
)
from rnic_exporter.sources.netclass import parse_int, parse_mac
from rnic_exporter.sources.pci import parse_link_speed, parse_link_width
from rnic_exporter.sources.reader import HostReader
from rnic_exporter.sources.sysfs import MalformedValueError
from tests.support.agents import FedSink

HUGE = "9" * 400


@pytest.mark.parametrize(
    ("parse", "text"),
    [
        (parse_counter, HUGE),
        (parse_counter, str(1 << 64)),  # one past u64
        (parse_counter, "9" * 5000),  # past Python's own int() digit limit
        (parse_counter, "\u0663\u0664"),  # Arabic-Indic digits: int() takes them, the kernel never prints them
        (parse_int, HUGE),
        (parse_int, str(1 << 31)),
        (parse_int, str(-(1 << 31) - 1)),
        (parse_numbered_state, f"{HUGE}: ACTIVE"),
        (parse_numbered_state, "256: ACTIVE"),
        (parse_rate, f"{HUGE} Gb/sec (4X NDR)"),
        (parse_rate, f"400 Gb/sec ({HUGE}X NDR)"),
        (parse_lid, "0x" + "f" * 400),
        (parse_link_speed, f"{HUGE} GT/s PCIe"),
        (parse_link_speed, f"1.{HUGE} GT/s PCIe"),
        (parse_link_width, HUGE),
        (parse_mac, ":".join(["aa"] * 33)),
        (parse_netdev_name, "ens\x001"),
        (parse_netdev_name, "a" * 16),
        (parse_netdev_name, "eth:0"),
        (parse_netdev_name, ".."),
        (parse_gid_type, "RoCE\x00 v2"),
        (parse_string, "16.35\x002000"),
        (parse_link_layer, "Ether\x00net"),
    ],
)
def test_values_beyond_their_type_are_malformed(parse: Callable[[str], object], text: str) -> None:
    with pytest.raises(MalformedValueError):
        parse(text)


@pytest.mark.parametrize(
    ("parse", "text", "want"),
    [
        (parse_counter, str((1 << 64) - 1), (1 << 64) - 1),  # saturation stays a value
        (parse_int, str((1 << 31) - 1), (1 << 31) - 1),
        (parse_int, "-1", -1),
        (parse_netdev_name, "a" * 15, "a" * 15),
    ],
)
def test_the_bounds_themselves_are_values(parse: Callable[[str], object], text: str, want: object) -> None:
    assert parse(text) == want


def test_model_properties_never_raise() -> None:
    huge = Netdev("x", 1, None, 1500, int(HUGE), "up", True, 0, 0, 0, None)
    assert huge.speed_bytes_per_second is None  # not representable: unavailable, not inf
    assert LinkRate(400.0, 0, "NDR").per_lane_gbps != LinkRate(400.0, 0, "NDR").per_lane_gbps  # NaN
    odd = GidEntry(0, "0000:0000:0000:0000:0000:ffff:zzzz:zzzz", "RoCE v2", None)
    assert odd.ipv4 is None and odd.address == odd.gid


def _read(host: SimHost) -> tuple[str, Snapshot]:
    root = SimSysfsRoot(host.root, errno_overlay=host.errno_overlay)
    try:
        reader = HostReader(root)
        snap = reader.read(full_gid_tables=True)
        sink = FedSink(reader)  # counters from a counter pass, as the agent serves them
        sink.publish(snap, ExporterStats())
        body, _headers = sink.render(None, None)
    finally:
        root.close()
    return body.decode("utf-8"), snap  # strict: the exposition is valid UTF-8


def _unavailable(text: str) -> set[tuple[str, str]]:
    out = set()
    for family in text_string_to_metric_families(text):
        if family.name == catalog.ATTRIBUTE_UNAVAILABLE.name:
            out |= {(s.labels["attribute"], s.labels["reason"]) for s in family.samples}
    return out


def _write(path: Path, text: str) -> None:
    path.write_bytes(text.encode())


@pytest.mark.parametrize(
    ("where", "text", "attribute"),
    [
        ("ports/1/counters/port_rcv_data", HUGE, "counters/port_rcv_data"),
        ("ports/1/counters/symbol_error", HUGE, "counters/symbol_error"),
        ("ports/1/hw_counters/out_of_sequence", HUGE, "hw_counters/out_of_sequence"),
        ("ports/1/state", f"{HUGE}: ACTIVE", "state"),
        ("ports/1/rate", f"{HUGE} Gb/sec (4X NDR)", "rate"),
        ("net:speed", HUGE, "net/ens2f0np0/speed"),
        ("net:mtu", HUGE, "net/ens2f0np0/mtu"),
        ("pci:current_link_speed", f"{HUGE} GT/s PCIe", "current_link_speed"),
        ("ports/1/gid_attrs/ndevs/0", "ens\x002f0np0", "gid_attrs/ndevs/0"),
    ],
)
def test_one_hostile_file_costs_one_attribute(tmp_path: Path, where: str, text: str, attribute: str) -> None:
    host = SimHost.build(tmp_path / "sys", roce=2, infiniband=1, gid_table_size=16)
    healthy, _ = _read(host)
    ib = host.root / "class/infiniband/mlx5_1"
    if where.startswith("net:"):
        _write(host.root / "class/net/ens2f0np0" / where[4:], text + "\n")
    elif where.startswith("pci:"):
        _write((ib / "device").resolve() / where[4:], text + "\n")
    else:
        _write(ib / where, text + "\n")
    exposition, _ = _read(host)
    unavailable = _unavailable(exposition)
    assert any(a.endswith(attribute) and reason == "malformed" for a, reason in unavailable), unavailable
    assert len(unavailable) == 1
    # The other devices are untouched.
    assert [line for line in exposition.splitlines() if 'device="mlx5_0"' in line] == [
        line for line in healthy.splitlines() if 'device="mlx5_0"' in line
    ]


def _rename_netdev(host: SimHost, old: str, new: bytes) -> None:
    """What `ip link set <old> name <new>` leaves in sysfs (a name Linux allows: any bytes but /, :, space)."""
    root = bytes(host.root)
    target = os.path.realpath(root + b"/class/net/" + old.encode())
    renamed = os.path.dirname(target) + b"/" + new
    os.rename(target, renamed)
    os.unlink(root + b"/class/net/" + old.encode())
    os.symlink(os.path.relpath(renamed, root + b"/class/net"), root + b"/class/net/" + new)


def test_a_non_utf8_netdev_name_is_escaped_in_both_exports(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=2, infiniband=1, gid_table_size=16)
    _rename_netdev(host, "ibp48s0", b"ib\xff0")
    exposition, snap = _read(host)  # decodes strictly
    infos = [
        s
        for f in text_string_to_metric_families(exposition)
        for s in f.samples
        if s.name == catalog.PORT_INFO.name and s.labels["device"] == "mlx5_2"
    ]
    assert [s.labels["netdev"] for s in infos] == ["ib\\xff0"]
    # OTLP attributes of the same samples are valid UTF-8 too (protobuf refuses anything else).
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    for family in snapshot_families(snap, ExporterStats()):
        mapping = otel_metrics.BY_SPEC.get(family.spec.name)
        if mapping is None:
            continue
        for labels, _value in family.samples:
            for key, value in mapping.attributes(mapping.route(labels), labels).items():
                KeyValue(key=key, value=AnyValue(string_value=value)).SerializeToString()


def test_check_on_a_huge_speed_reports_instead_of_crashing(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=2, infiniband=1, gid_table_size=16)
    _write(host.root / "class/net/ens2f0np0/speed", HUGE + "\n")
    result = CliRunner().invoke(
        main, ["check", "--path.sysfs", str(host.root), "--state.dir", "", "--no-netlink", "--json"]
    )
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code in (0, 1)
    report = json.loads(result.output)
    assert "net/ens2f0np0/speed" in json.dumps(report)
