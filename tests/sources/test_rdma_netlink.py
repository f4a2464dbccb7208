"""The RDMA netlink client: real kernel refusals, replies over a real datagram socket, strict parsing.

The answers of a real RDMA stack (rxe on Debian 6.1 and 6.12) are parsed in
test_rdma_netlink_captures.py from what the kernel lab captured; here the kernel says no for real
(no RDMA netlink on this machine kind, or rtnetlink refusing an nldev request), and replies built
with the same pyroute2 classes go through a socketpair, to reach every branch of the exchange.
"""

from __future__ import annotations

import errno
import socket
import struct
import time
from collections.abc import Callable

import pytest

from rnic_exporter.sources import nldev as nl
from rnic_exporter.sources.nldev import RdmaNetlink, Unavailable
from rnic_exporter.sources.qp_owners import QpConsumer, consumers_by_device
from rnic_exporter.sources.read_path import NO_HW_COUNTERS, choose_read_path
from tests.support.rdma_peer import peer

NLDEV_STAT = nl.message_type(nl.CMD_STAT_GET)


Attr = tuple[int, object]


def encode(attrs: list[Attr]) -> bytes:
    """Attributes as the kernel lays them out: int values u32 unless wrapped as ("u64", v) or
    ("u8", v), str NUL-terminated, list a nested table."""
    out = b""
    for kind, value in attrs:
        if isinstance(value, list):
            out += nl.attr(kind, encode(value))
        elif isinstance(value, str):
            out += nl.text_attr(kind, value)
        elif isinstance(value, tuple) and value[0] == "u64":
            out += nl.u64_attr(kind, value[1])
        elif isinstance(value, tuple) and value[0] == "u8":
            out += nl.attr(kind, struct.pack("=B", value[1]))
        else:
            assert isinstance(value, int)
            out += nl.u32_attr(kind, value)
    return out


def reply(command: int, seq: int, attrs: list[Attr], flags: int = 0) -> bytes:
    """A kernel-shaped nldev message."""
    return nl.message(nl.message_type(command), flags, seq, encode(attrs))


def ack(seq: int, code: int = 0) -> bytes:
    body = struct.pack("=i", -code) + nl.NLMSG_HEADER.pack(16, NLDEV_STAT, 0, seq, 0)
    return nl.NLMSG_HEADER.pack(16 + len(body), nl.NLMSG_ERROR, 0, seq, 0) + body


def done(seq: int, code: int = 0) -> bytes:
    return nl.NLMSG_HEADER.pack(20, nl.NLMSG_DONE, nl.NLM_F_MULTI, seq, 0) + struct.pack("=i", -code)


def hw(values: dict[str, int]) -> Attr:
    entries: list[Attr] = [(81, [(82, n), (83, ("u64", v))]) for n, v in values.items()]
    return (80, entries)


def counters(seq: int, values: dict[str, int], dev: str = "mlx5_0", index: int = 3, port: int = 1) -> bytes:
    return reply(nl.CMD_STAT_GET, seq, [(1, index), (2, dev), (3, port), hw(values)])


def seq_of(request: bytes) -> int:
    return int(nl.NLMSG_HEADER.unpack_from(request)[3])


# -- real kernels saying no -----------------------------------------------------------------------


def test_a_protocol_without_a_kernel_socket_is_unavailable_not_an_exception() -> None:
    """NETLINK protocol 31 has no kernel socket on any Linux: the same EPROTONOSUPPORT as
    NETLINK_RDMA where ib_core is not loaded."""
    client = RdmaNetlink(socket_factory=lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 31))
    got = client.port_counters(1, 1)
    assert isinstance(got, Unavailable)
    assert (got.reason, got.errno) == ("no_rdma_netlink", errno.EPROTONOSUPPORT), got
    assert "ib_core" in got.detail
    assert isinstance(client.devices(), Unavailable)


def test_a_kernel_refusing_the_request_is_a_typed_reason() -> None:
    """rtnetlink answers an nldev message type with EOPNOTSUPP: the kernel's own NLMSG_ERROR path."""
    with RdmaNetlink(socket_factory=lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)) as client:
        got = client.port_counters(1, 1)
        assert isinstance(got, Unavailable) and got.reason == "not_supported", got
        dump = client.devices()
        assert isinstance(dump, Unavailable) and dump.reason == "not_supported", dump


# -- the exchange -----------------------------------------------------------------------------


def test_stat_get_reads_every_counter_of_the_port_in_one_request() -> None:
    values = {"rx_write_requests": 7, "out_of_buffer": 0, "np_cnp_sent": 2**64 - 1}
    requests: list[bytes] = []

    def answer(request: bytes) -> list[bytes]:
        requests.append(request)
        seq = seq_of(request)
        return [counters(seq, values) + ack(seq)]

    with peer(answer) as client:
        got = client.port_counters(3, 1)
    assert not isinstance(got, Unavailable), got
    assert (got.device, got.device_index, got.port, dict(got.values)) == ("mlx5_0", 3, 1, values)
    assert got.disabled is None
    assert len(requests) == 1
    length, mtype, flags, _seq, _pid = nl.NLMSG_HEADER.unpack_from(requests[0])
    assert (length, mtype, flags) == (len(requests[0]), NLDEV_STAT, nl.NLM_F_REQUEST | nl.NLM_F_ACK)


def test_the_disabled_optional_counters_come_from_stat_get_status() -> None:
    def answer(request: bytes) -> list[bytes]:
        seq = seq_of(request)
        if nl.NLMSG_HEADER.unpack_from(request)[1] == NLDEV_STAT:
            return [counters(seq, {"out_of_buffer": 1}), ack(seq)]
        entries: list[Attr] = [
            (81, [(82, "out_of_buffer"), (94, 0)]),
            (81, [(82, "cc_rx_ce_pkts"), (94, 1), (95, ("u8", 1))]),
        ]
        return [reply(nl.CMD_STAT_GET_STATUS, seq, [(1, 3), (2, "mlx5_0"), (3, 1), (80, entries)]) + ack(seq)]

    with peer(answer) as client:
        got = client.port_counters(3, 1, with_status=True)
    assert not isinstance(got, Unavailable), got
    assert got.disabled == frozenset({"cc_rx_ce_pkts"})


def test_an_older_kernel_without_stat_status_still_gives_the_counters() -> None:
    def answer(request: bytes) -> list[bytes]:
        seq = seq_of(request)
        if nl.NLMSG_HEADER.unpack_from(request)[1] == NLDEV_STAT:
            return [counters(seq, {"out_of_buffer": 1}) + ack(seq)]
        return [ack(seq, errno.EOPNOTSUPP)]

    with peer(answer) as client:
        got = client.port_counters(3, 1, with_status=True)
    assert not isinstance(got, Unavailable) and got.disabled is None and dict(got.values) == {"out_of_buffer": 1}


def test_a_dump_collects_every_message_until_done() -> None:
    def device(seq: int, index: int, name: str) -> bytes:
        attrs: list[Attr] = [(1, index), (2, name), (3, 2), (6, ("u64", 0x0C42A10300B1C2D3)), (5, "28.39.1002")]
        return reply(nl.CMD_GET, seq, attrs, nl.NLM_F_MULTI)

    def answer(request: bytes) -> list[bytes]:
        seq = seq_of(request)
        return [device(seq, 0, "mlx5_0") + device(seq, 1, "mlx5_1"), done(seq)]

    with peer(answer) as client:
        got = client.devices()
    assert not isinstance(got, Unavailable), got
    assert [(d.index, d.name, d.ports, d.node_guid, d.fw_version) for d in got] == [
        (0, "mlx5_0", 2, "0c42:a103:00b1:c2d3", "28.39.1002"),
        (1, "mlx5_1", 2, "0c42:a103:00b1:c2d3", "28.39.1002"),
    ]


def test_a_dump_that_failed_says_so_in_done() -> None:
    with peer(lambda request: [done(seq_of(request), errno.EINVAL)]) as client:
        got = client.devices()
    assert isinstance(got, Unavailable) and got.reason == "no_device", got


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (errno.ENODEV, "no_device"),
        (errno.EINVAL, "no_device"),
        (errno.EPERM, "permission"),
        (errno.EOPNOTSUPP, "not_supported"),
        (errno.EIO, "io_error"),
    ],
)
def test_each_kernel_error_has_its_reason(code: int, reason: str) -> None:
    with peer(lambda request: [ack(seq_of(request), code)]) as client:
        got = client.port_counters(9, 1)
    assert isinstance(got, Unavailable) and (got.reason, got.errno) == (reason, code), got


def test_no_answer_is_a_timeout_within_the_deadline() -> None:
    with peer(lambda request: []) as client:
        start = time.monotonic()
        first = client.port_counters(3, 1)
        took = time.monotonic() - start
    assert isinstance(first, Unavailable) and first.reason == "timeout", first
    assert 0.5 <= took < 2.0, took


def test_an_answer_to_an_earlier_request_is_skipped() -> None:
    def answer(request: bytes) -> list[bytes]:
        seq = seq_of(request)
        return [counters(seq - 1, {"stale": 1}) + ack(seq - 1), counters(seq, {"fresh": 2}) + ack(seq)]

    with peer(answer) as client:
        got = client.port_counters(3, 1)
    assert not isinstance(got, Unavailable) and dict(got.values) == {"fresh": 2}, got


@pytest.mark.parametrize(
    ("datagram", "what"),
    [
        (lambda seq: counters(seq, {"a": 1})[:-3], "message length"),
        (lambda seq: reply(nl.CMD_STAT_GET, seq, [(1, 3), (80, [])]), "DEV_NAME missing"),
        (lambda seq: reply(nl.CMD_STAT_GET, seq, [(1, 3), (2, "m"), (3, 1)]), "HWCOUNT"),
        (lambda seq: reply(nl.CMD_STAT_GET, seq, [(1, ("u64", 3)), (2, "m"), (3, 1), (80, [])]), "not 4"),
        (lambda seq: reply(nl.CMD_STAT_GET, seq, [(1, 3), (2, "m"), (3, 1), (80, [(81, [(82, "a")])])]), "VALUE"),
        (lambda seq: nl.message(NLDEV_STAT, 0, seq, encode([(1, 3), (80, [])]) + nl.attr(2, b"no-nul")), "NUL"),
        (lambda seq: nl.NLMSG_HEADER.pack(16, 0x1234, 0, seq, 0), "not nldev"),
    ],
)
def test_a_malformed_reply_is_unavailable_with_what_was_wrong(datagram: Callable[[int], bytes], what: str) -> None:
    with peer(lambda request: [datagram(seq_of(request)) + ack(seq_of(request))]) as client:
        got = client.port_counters(3, 1)
    assert isinstance(got, Unavailable) and got.reason == "malformed" and what in got.detail, got


def test_a_counter_twice_in_one_reply_is_malformed() -> None:
    def answer(request: bytes) -> list[bytes]:
        seq = seq_of(request)
        entry: Attr = (81, [(82, "a"), (83, ("u64", 1))])
        return [reply(nl.CMD_STAT_GET, seq, [(1, 3), (2, "m"), (3, 1), (80, [entry, entry])]) + ack(seq)]

    with peer(answer) as client:
        got = client.port_counters(3, 1)
    assert isinstance(got, Unavailable) and got.reason == "malformed" and "twice" in got.detail, got


# -- which path a device is read by ---------------------------------------------------------------


def _probe(values: dict[str, int]) -> nl.PortCounters:
    return nl.PortCounters(3, "mlx5_0", 1, values)


def test_netlink_is_chosen_where_it_gives_every_sysfs_counter() -> None:
    names = {1: frozenset({"out_of_buffer", "np_cnp_sent"})}
    got = choose_read_path("mlx5_0", names, {1: _probe({"out_of_buffer": 0, "np_cnp_sent": 0, "cc_rx_ce_pkts": 0})})
    assert (got.path, got.code) == ("netlink", "netlink_answers"), got


def test_sysfs_stays_where_netlink_is_refused_lacks_a_counter_or_was_not_asked() -> None:
    names = {1: frozenset({"out_of_buffer", "np_cnp_sent"}), 2: frozenset({"out_of_buffer"})}
    refused = Unavailable("no_device", "STAT_GET 3/1: EINVAL", errno.EINVAL)
    got = choose_read_path("mlx5_0", names, {1: refused, 2: _probe({"out_of_buffer": 0})})
    assert (got.path, got.code, got.reason.startswith("port 1: netlink no_device")) == (
        "sysfs",
        "netlink_no_device",
        True,
    )
    lacking = choose_read_path("mlx5_0", names, {1: _probe({"out_of_buffer": 0}), 2: _probe({"out_of_buffer": 0})})
    assert (lacking.path, lacking.reason) == ("sysfs", "port 1: netlink lacks np_cnp_sent")
    unasked = choose_read_path("mlx5_0", names, {1: _probe({"out_of_buffer": 0, "np_cnp_sent": 0})})
    assert (unasked.path, unasked.reason, unasked.code) == ("sysfs", "port 2: netlink not asked yet", "not_asked")


def test_a_device_without_hw_counters_or_with_device_wide_ones_stays_on_sysfs() -> None:
    assert choose_read_path("rxe0", {1: frozenset()}, {}).reason == NO_HW_COUNTERS
    wide = choose_read_path("hfi1_0", {0: frozenset({"x"}), 1: frozenset({"y"})}, {1: _probe({"y": 1})})
    assert (wide.path, wide.code) == ("sysfs", "device_wide") and "device-wide" in wide.reason


# -- QP owners for the consumers feature ----------------------------------------------------------


def test_qp_owners_group_by_device_and_pid_with_comm_and_ports() -> None:
    owners = [
        nl.QpOwner(0, "mlx5_0", 1, 1, 7, 3, None, "ib_core"),
        nl.QpOwner(0, "mlx5_0", 1, 90, 2, 3, 4242, None),
        nl.QpOwner(0, "mlx5_0", 2, 91, 2, 3, 4242, None),
        nl.QpOwner(0, "mlx5_0", None, 92, 2, 0, 4242, None),
        nl.QpOwner(1, "mlx5_1", 1, 93, 2, 3, 777, None),  # exited since the dump: no comm
    ]
    comms = {4242: "python3"}
    got = consumers_by_device(owners, comms.get)
    assert dict(got) == {
        "mlx5_0": [
            QpConsumer("mlx5_0", None, "ib_core", 1, (1,)),
            QpConsumer("mlx5_0", 4242, "python3", 3, (1, 2)),
        ]
    }


def two_devices(seq: int) -> list[bytes]:
    """A device dump's answer: mlx5_0 and mlx5_1, one port each."""
    devs = [reply(nl.CMD_GET, seq, [(1, i), (2, f"mlx5_{i}"), (3, 1), (6, ("u64", i))], 2) for i in (0, 1)]
    return [b"".join(devs), done(seq)]


def test_qp_dumps_are_per_device_and_a_device_gone_meanwhile_is_skipped() -> None:
    def answer(request: bytes) -> list[bytes]:
        seq = seq_of(request)
        mtype = nl.NLMSG_HEADER.unpack_from(request)[1]
        if mtype == nl.message_type(nl.CMD_GET):
            return two_devices(seq)
        index = struct.unpack_from("=I", request, 16 + 4)[0]
        if index == 1:
            return [done(seq, errno.ENODEV)]
        qp: Attr = (20, [(3, 1), (21, 90), (26, ("u8", 2)), (27, ("u8", 3)), (28, 4242)])
        return [reply(nl.CMD_RES_QP_GET, seq, [(1, 0), (2, "mlx5_0"), (19, [qp])], 2), done(seq)]

    with peer(answer) as client:
        got = client.qp_owners()
    assert got == [nl.QpOwner(0, "mlx5_0", 1, 90, 2, 3, 4242, None)], got


def test_context_dumps_name_each_context_and_its_thread_and_an_old_kernel_says_not_supported() -> None:
    """RES_CTX_GET (22): RES_CTX (86) of RES_CTX_ENTRY (87) nests, each CTXN (64) and PID (28)."""

    def answer(request: bytes) -> list[bytes]:
        seq = seq_of(request)
        mtype = nl.NLMSG_HEADER.unpack_from(request)[1]
        if mtype == nl.message_type(nl.CMD_GET):
            return two_devices(seq)
        assert mtype == nl.message_type(nl.CMD_RES_CTX_GET)
        index = struct.unpack_from("=I", request, 16 + 4)[0]
        entries: list[Attr] = [(87, [(64, 0), (28, 4242)]), (87, [(64, 1), (28, 4250)])]
        table: Attr = (86, entries if index == 0 else [])
        return [reply(nl.CMD_RES_CTX_GET, seq, [(1, index), (2, f"mlx5_{index}"), table], 2), done(seq)]

    with peer(answer) as client:
        got = client.context_owners()
    assert got == [nl.ContextOwner(0, "mlx5_0", 0, 4242), nl.ContextOwner(0, "mlx5_0", 1, 4250)], got

    def old_kernel(request: bytes) -> list[bytes]:
        seq = seq_of(request)
        if nl.NLMSG_HEADER.unpack_from(request)[1] == nl.message_type(nl.CMD_GET):
            return [reply(nl.CMD_GET, seq, [(1, 0), (2, "mlx5_0"), (3, 1), (6, ("u64", 0))], 2), done(seq)]
        return [done(seq, errno.EOPNOTSUPP)]

    with peer(old_kernel) as client:
        refused = client.context_owners()
    assert isinstance(refused, Unavailable) and refused.reason == "not_supported", refused
