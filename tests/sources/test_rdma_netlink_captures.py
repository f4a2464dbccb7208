"""The RDMA netlink parser on what real kernels sent: rxe on Debian's 6.1 and 6.12, captured by the
kernel lab's nldev scenario (tests/fixtures/kernel-rxe-*/nldev.json; see their README), checked
against the sysfs files read in the same run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rnic_exporter.sources import nldev as nl

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CAPTURES = sorted(FIXTURES.glob("kernel-rxe-*/nldev.json"))


def types(hexes: list[str]) -> list[int]:
    """The nldev command, or the netlink control type (NLMSG_DONE, NLMSG_ERROR), of every message."""
    out = []
    for datagram in hexes:
        for mtype, _flags, _seq, _body in nl.split_messages(bytes.fromhex(datagram)):
            out.append(mtype & 0x3FF if mtype >> 10 == nl.RDMA_NL_NLDEV else mtype)
    return out


def of(hexes: list[str], command: int) -> list[nl.Attrs]:
    """The attributes of every nldev message of `command`."""
    out = []
    for datagram in hexes:
        for mtype, _flags, _seq, body in nl.split_messages(bytes.fromhex(datagram)):
            if mtype == nl.message_type(command):
                out.append(nl.Attrs(body, 0, len(body), "capture"))
    return out


@pytest.fixture(params=CAPTURES, ids=[p.parent.name for p in CAPTURES])
def capture(request: pytest.FixtureRequest) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(request.param.read_text())
    return data


def test_there_are_captures_of_both_kernels() -> None:
    assert {p.parent.name for p in CAPTURES} >= {"kernel-rxe-6.1", "kernel-rxe-6.12"}, CAPTURES


def test_the_device_dump_is_what_sysfs_says(capture: dict[str, Any]) -> None:
    devices = [nl.parse_device(a) for a in of(capture["dumps_and_status"], nl.CMD_GET)]
    sysfs = capture["sysfs"]["devices"]
    assert devices and {d.name for d in devices} == set(sysfs)
    for d in devices:
        want = sysfs[d.name]
        assert (d.node_guid, d.sys_image_guid, d.ports, d.fw_version, d.protocol) == (
            want["node_guid"],
            want["sys_image_guid"],
            int(want["ports"]),
            want["fw_ver"] or None,
            "roce",
        )


def test_the_port_dumps_are_what_sysfs_says(capture: dict[str, Any]) -> None:
    ports = [nl.parse_port(a) for a in of(capture["dumps_and_status"], nl.CMD_PORT_GET)]
    sysfs = capture["sysfs"]["ports"]
    assert {f"{p.device}/{p.port}" for p in ports} == set(sysfs)
    for p in ports:
        want = sysfs[f"{p.device}/{p.port}"]
        assert (p.state, p.phys_state) == (want["state"], want["phys_state"])
        assert p.lid is None  # RoCE: no LID attribute at all
    by_dev = {p.device: p for p in ports}
    assert (by_dev["rxe0"].netdev, by_dev["rxe0"].netdev_index) == ("va", capture["sysfs"]["va_ifindex"])


def test_stat_get_is_between_the_sysfs_reads_around_it(capture: dict[str, Any]) -> None:
    (counters,) = [nl.parse_port_counters(a) for a in of(capture["stat_get_under_traffic"], nl.CMD_STAT_GET)]
    around = capture["sysfs_around_stat_get"]
    assert set(counters.values) == set(around["before"])
    for name, value in counters.values.items():
        assert around["before"][name] <= value <= around["after"][name], name
    assert counters.values["sent_pkts"] > 0


def test_stat_status_names_the_same_counters_none_disabled(capture: dict[str, Any]) -> None:
    """rxe has no optional counters: STAT_GET_STATUS lists every counter, none dynamic (off)."""
    status = of(capture["dumps_and_status"], nl.CMD_STAT_GET_STATUS)
    stats = of(capture["dumps_and_status"], nl.CMD_STAT_GET)
    assert len(status) == len(stats) == 1
    assert nl.parse_disabled(status[0]) == frozenset()
    assert set(nl.parse_port_counters(stats[0]).values) == set(capture["sysfs_around_stat_get"]["before"])


def test_each_request_ends_with_its_ack_or_done(capture: dict[str, Any]) -> None:
    kinds = types(capture["dumps_and_status"])
    assert kinds.count(nl.NLMSG_DONE) == 4  # device dump twice (devices(), ports()), two port dumps
    assert kinds.count(nl.NLMSG_ERROR) == 2  # the ACKs of STAT_GET and STAT_GET_STATUS
