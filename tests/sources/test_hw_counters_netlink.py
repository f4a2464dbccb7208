"""The counter pass reads hw counters over RDMA netlink: one STAT_GET per port, answered here by
what the real kernels sent (the kernel lab's rxe captures on Debian 6.1 and 6.12,
tests/fixtures/kernel-rxe-*/nldev.json) through a real datagram socketpair, against a simulated
rxe tree holding the sysfs values of the same capture; and the fallback to the sysfs files where
netlink is refused, off, or fails a device later."""

from __future__ import annotations

import errno
import json
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from rnic_exporter.sim.gid_table import GidTable
from rnic_exporter.sim.host import ROCE_V2, SimDevice, SimHost
from rnic_exporter.sources import nldev as nl
from rnic_exporter.sources.counter_netlink import HwNetlink
from rnic_exporter.sources.device_counters import NETLINK_RETRY_S
from rnic_exporter.sources.read_context import ReaderSettings
from rnic_exporter.sources.reader import HostReader
from rnic_exporter.sources.sysfs import SysfsRoot
from tests.support.rdma_peer import peer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CAPTURES = sorted(FIXTURES.glob("kernel-rxe-*/nldev.json"))


@pytest.fixture(params=CAPTURES, ids=[p.parent.name for p in CAPTURES])
def capture(request: pytest.FixtureRequest) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(request.param.read_text())
    return data


def messages(hexes: list[str]) -> list[tuple[int, int, bytes]]:
    """(type, flags, body) of every message the kernel sent, in order."""
    return [
        (mtype, flags, body)
        for datagram in hexes
        for mtype, flags, _seq, body in nl.split_messages(bytes.fromhex(datagram))
    ]


class Kernel:
    """Answers a client's requests with the captured replies, re-numbered to each request;
    `refuse` makes STAT_GET answer that errno instead."""

    def __init__(self, capture: dict[str, Any]) -> None:
        got = messages(capture["dumps_and_status"])
        first_done = next(i for i, (mtype, _f, _b) in enumerate(got) if mtype == nl.NLMSG_DONE)
        self.dump = [m for m in got[: first_done + 1]]  # the device dump and its DONE
        (self.stat,) = [
            m for m in messages(capture["stat_get_under_traffic"]) if m[0] == nl.message_type(nl.CMD_STAT_GET)
        ]
        self.refuse: int | None = None
        self.asked: list[int] = []  # nldev command of each request

    def answer(self, request: bytes) -> list[bytes]:
        _len, mtype, _flags, seq, _pid = nl.NLMSG_HEADER.unpack_from(request)
        command = mtype & 0x3FF
        self.asked.append(command)
        if command == nl.CMD_GET:
            return [b"".join(nl.message(t, f, seq, body) for t, f, body in self.dump)]
        if command == nl.CMD_STAT_GET and self.refuse is None:
            ack = struct.pack("=i", 0) + request[: nl.NLMSG_HEADER.size]
            return [nl.message(self.stat[0], self.stat[1], seq, self.stat[2]) + nl.message(nl.NLMSG_ERROR, 0, seq, ack)]
        code = self.refuse or errno.EOPNOTSUPP
        return [nl.message(nl.NLMSG_ERROR, 0, seq, struct.pack("=i", -code) + request[: nl.NLMSG_HEADER.size])]


@contextmanager
def served(kernel: Kernel) -> Iterator[HwNetlink]:
    """An `HwNetlink` whose socket is one end of a real datagram socketpair, `kernel` at the other."""
    with peer(kernel.answer, timeout_s=1.0) as client:
        netlink = HwNetlink(client)
        yield netlink


def rxe_tree(tmp_path: Path, hw: dict[str, int]) -> SimHost:
    """rxe0 as the kernel lab showed it, its hw_counters/ files holding `hw`."""
    host = SimHost(tmp_path)
    host.add_device(
        SimDevice(
            name="rxe0",
            number=0,
            link_layer="Ethernet",
            gbps=10,
            netdev="veth0",
            mac="0c:42:a1:41:00:36",
            addresses=["10.0.0.1"],
            gid_table=GidTable(1024, roce=True, types=(ROCE_V2,)),
            driver="rxe",
            hca_type="",
            fw_ver="",
            board_id="",
            hw_counters=dict(hw),
        )
    )
    return host


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def served_hw(reader: HostReader) -> dict[str, int]:
    (device,) = reader.read().devices
    return dict(device.ports[0].hw_counters)


def test_netlink_serves_the_kernels_stat_get_where_sysfs_read_around_it(
    capture: dict[str, Any], tmp_path: Path
) -> None:
    around = capture["sysfs_around_stat_get"]
    rxe_tree(tmp_path, around["before"])
    kernel = Kernel(capture)
    want = nl.parse_port_counters(nl.Attrs(kernel.stat[2], 0, len(kernel.stat[2]), "capture")).values
    with served(kernel) as netlink:
        # Held descriptors (the daemon's way): the batch of what is read differs from the plan's.
        reader = HostReader(SysfsRoot(tmp_path, hold_fds=True), netlink=netlink)
        by_netlink = served_hw(reader)
        reader.close()
        (counters,) = [r.counters for r in reader._order]
        assert counters.read_path is not None
        assert (counters.read_path.path, counters.read_path.code) == ("netlink", "netlink_answers")
        # One device dump and one STAT_GET to decide, one STAT_GET for the pass; no hw file read.
        assert kernel.asked == [nl.CMD_GET, nl.CMD_STAT_GET, nl.CMD_STAT_GET]
        assert counters.reads == {"netlink_stat": 2, "hw_counters_file": 0, "pma_file": 0}  # rxe: no PMA
    by_sysfs = served_hw(HostReader(SysfsRoot(tmp_path), ReaderSettings(rdma_netlink=False)))
    assert by_netlink == dict(want)
    assert by_sysfs == around["before"]  # the sysfs path reads the tree, as before
    assert by_netlink.keys() == by_sysfs.keys()
    for name, value in by_netlink.items():
        assert around["before"][name] <= value <= around["after"][name], name
    assert by_netlink["sent_pkts"] > by_sysfs["sent_pkts"]  # traffic ran: these are netlink's values


def test_the_same_values_either_way_when_sysfs_holds_what_netlink_answers(
    capture: dict[str, Any], tmp_path: Path
) -> None:
    """At rest (the lab: equal both ways once traffic stopped), both paths serve the same series."""
    kernel = Kernel(capture)
    values = dict(nl.parse_port_counters(nl.Attrs(kernel.stat[2], 0, len(kernel.stat[2]), "capture")).values)
    rxe_tree(tmp_path, values)
    with served(kernel) as netlink:
        reader = HostReader(SysfsRoot(tmp_path), netlink=netlink)
        (before,) = reader.read().devices
    (after,) = HostReader(SysfsRoot(tmp_path), ReaderSettings(rdma_netlink=False)).read().devices
    assert before.ports[0].hw_counters == after.ports[0].hw_counters == values


def test_a_device_netlink_fails_later_is_read_from_sysfs_then_asked_again(
    capture: dict[str, Any], tmp_path: Path
) -> None:
    around = capture["sysfs_around_stat_get"]
    rxe_tree(tmp_path, around["before"])
    kernel = Kernel(capture)
    clock = Clock()
    with served(kernel) as netlink:
        reader = HostReader(SysfsRoot(tmp_path), clock=clock, netlink=netlink)
        assert served_hw(reader)["sent_pkts"] != around["before"]["sent_pkts"]
        (counters,) = [r.counters for r in reader._order]
        kernel.refuse = errno.ENODEV  # e.g. moved to another RDMA namespace
        assert served_hw(reader) == around["before"]  # this very pass, from the files
        assert counters.read_path is not None
        assert (counters.read_path.path, counters.read_path.code) == ("sysfs", "netlink_no_device")
        assert reader.netlink_failures == 1  # rnic_exporter_event_source_errors_total{source="rdma_netlink"}
        asked = len(kernel.asked)
        served_hw(reader)
        assert len(kernel.asked) == asked  # not asked again every pass
        assert counters.reads["hw_counters_file"] == 2 * len(around["before"])
        kernel.refuse = None
        clock.now += NETLINK_RETRY_S
        assert served_hw(reader)["sent_pkts"] != around["before"]["sent_pkts"]
        assert counters.read_path.path == "netlink"


def test_a_kernel_refusing_at_the_decision_leaves_sysfs_with_the_reason(
    capture: dict[str, Any], tmp_path: Path
) -> None:
    around = capture["sysfs_around_stat_get"]
    rxe_tree(tmp_path, around["before"])
    kernel = Kernel(capture)
    kernel.refuse = errno.EPERM
    with served(kernel) as netlink:
        reader = HostReader(SysfsRoot(tmp_path), netlink=netlink)
        assert served_hw(reader) == around["before"]
        (counters,) = [r.counters for r in reader._order]
        assert counters.read_path is not None
        assert (counters.read_path.path, counters.read_path.code) == ("sysfs", "netlink_permission")
        assert reader.netlink_failures == 0  # refused when chosen: not a failure of a path in use


def test_turned_off_netlink_is_never_asked(capture: dict[str, Any], tmp_path: Path) -> None:
    around = capture["sysfs_around_stat_get"]
    rxe_tree(tmp_path, around["before"])
    kernel = Kernel(capture)
    with served(kernel) as netlink:
        reader = HostReader(SysfsRoot(tmp_path), ReaderSettings(rdma_netlink=False), netlink=netlink)
        assert served_hw(reader) == around["before"]
        assert kernel.asked == []
        (counters,) = [r.counters for r in reader._order]
        assert counters.read_path is not None and counters.read_path.code == "disabled"


def test_a_kernel_without_rdma_netlink_leaves_every_device_on_sysfs(tmp_path: Path) -> None:
    """The real socket of this process: refused where the kernel has no RDMA netlink (this machine
    kind: EPROTONOSUPPORT), or a kernel with one that has no device of the simulated tree's name."""
    host = SimHost.build(tmp_path, roce=1, driver="rxe")
    reader = HostReader(SysfsRoot(tmp_path), netlink=HwNetlink())
    (device,) = reader.read().devices
    assert dict(device.ports[0].hw_counters) == host.devices["rxe0"].hw_counters
    (counters,) = [r.counters for r in reader._order]
    assert counters.read_path is not None and counters.read_path.path == "sysfs"
    assert counters.read_path.code in ("netlink_no_rdma_netlink", "netlink_no_device"), counters.read_path
    reader.close()


def test_a_tree_other_than_the_live_sys_gets_no_netlink(tmp_path: Path) -> None:
    SimHost.build(tmp_path, roce=1, driver="rxe")
    reader = HostReader(SysfsRoot(tmp_path))
    reader.read()
    (counters,) = [r.counters for r in reader._order]
    assert counters.read_path is not None and counters.read_path.code == "not_live_sysfs"
