"""ethtool netlink reads against the host kernel: veth in a namespace of our own.

veth has `get_link` (link state works) and none of FEC, pause or module ops: those must come back
as `Unsupported`, counted as requests and never as errors. The reply parsers are also run on
messages encoded by pyroute2 itself, for attributes veth never sends (extended state, FEC lanes).
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterator

import pytest

from rnic_exporter.model.optics import ModuleReading
from rnic_exporter.model.wire import FecBin, FecStats, Gone, LinkState, PauseStats, ReadFailure, Unsupported
from rnic_exporter.sim.wire import kernel_encoded
from rnic_exporter.sources import ethtool_netlink as en
from rnic_exporter.sources.optics.memory import ModuleMemory, from_linear
from rnic_exporter.sources.pause_stats import parse as parse_pause
from tests.support.modules import MODULES, parse_ethtool_hex
from tests.support.netns import Netns, network_namespace
from tests.support.wait import wait_for

NETDEV = "ens1f0np0"


@pytest.fixture(scope="module")
def ns() -> Iterator[Netns]:
    with network_namespace({NETDEV: "0c:42:a1:41:00:36"}) as created:
        yield created


def test_link_state_follows_carrier_on_veth(ns: Netns) -> None:
    with ns.entered(), en.EthtoolNetlink() as reader:
        up = reader.link_state(NETDEV)
        assert isinstance(up, LinkState) and up.link_up is True and up.ext_state is None
        ns.set_carrier(NETDEV, False)
        try:
            down = wait_for(
                lambda: s if isinstance(s := reader.link_state(NETDEV), LinkState) and s.link_up is False else None,
                timeout=10,
                what="veth carrier loss seen by LINKSTATE_GET",
            )
            if up.down_count is not None:  # EXT_DOWN_CNT: kernels that count link-down events
                assert down.down_count is not None and down.down_count > up.down_count
        finally:
            ns.set_carrier(NETDEV, True)
        assert reader.errors == {}
        assert reader.requests["link_state"] >= 2


def test_fec_pause_and_module_are_unsupported_on_veth_not_errors(ns: Netns) -> None:
    with ns.entered(), en.EthtoolNetlink() as reader:
        assert reader.fec(NETDEV) == Unsupported("fec", "EOPNOTSUPP")
        assert reader.pause(NETDEV) == Unsupported("pause", "EOPNOTSUPP")
        module = reader.module(NETDEV)
        assert module.result == Unsupported("module_eeprom", "EOPNOTSUPP")
        assert module.requests == 1 and module.memory is None  # the lower page was asked for, once
        assert reader.errors == {}
        assert reader.requests == {"fec": 1, "pause": 1, "module_eeprom": 1}


def test_a_netdev_removed_or_in_another_namespace_is_gone_not_an_error(ns: Netns) -> None:
    with ns.entered(), en.EthtoolNetlink() as reader:
        assert reader.link_state("gone0") == Gone("link_state")
        assert reader.fec("gone0") == Gone("fec")
        assert reader.module("gone0").result == Gone("module_eeprom")
        assert reader.errors == {} and reader.requests == {"link_state": 1, "fec": 1, "module_eeprom": 1}
    with en.EthtoolNetlink() as outside:  # the veth lives in the namespace, not in this one
        assert not outside.present(NETDEV)
        assert outside.link_state(NETDEV) == Gone("link_state") and outside.pause(NETDEV) == Gone("pause")
        assert outside.errors == {}


def test_each_thread_asks_on_a_socket_of_its_own_and_leaves_nothing_behind(ns: Netns) -> None:
    # The daemon asks from two threads: the wire watch polls, the agent asks the link state at a
    # port-down event (WireWatch.annotate). pyroute2 keeps a socket's event loop for the thread that
    # opened it; on one shared socket every request of the other thread made an event loop of its
    # own and left its id and a queued message behind (0.2 MB per 1,000 requests).
    def event_loops_made(reader: en.EthtoolNetlink) -> int:
        return sum(len(sock.asyncore.status["eids"]) for sock in reader._socks.values())

    with ns.entered(), en.EthtoolNetlink() as reader:
        assert isinstance(reader.link_state(NETDEV), LinkState)  # this thread opens its socket

        seen: list[object] = []

        def agent() -> None:
            seen.extend(reader.link_state(NETDEV) for _ in range(40))
            seen.append(reader.sockets)

        other = threading.Thread(target=agent)  # started in the namespace: it stays there
        other.start()
        other.join(30)
        assert not other.is_alive() and len(seen) == 41, seen
        assert all(isinstance(s, LinkState) for s in seen[:40]) and seen[40] == 2
        assert event_loops_made(reader) == 2, "a thread's requests made event loops of their own"
        reader.link_state(NETDEV)
        assert reader.sockets == 1  # the ended thread's socket is closed at the next request
    assert reader.sockets == 0


def test_extended_link_state_names() -> None:
    reply = kernel_encoded(
        en.LinkStateMsg,
        [
            ("ETHTOOL_A_LINKSTATE_LINK", 0),
            ("ETHTOOL_A_LINKSTATE_EXT_STATE", 5),
            ("ETHTOOL_A_LINKSTATE_EXT_SUBSTATE", 1),
            ("ETHTOOL_A_LINKSTATE_EXT_DOWN_CNT", 7),
        ],
    )
    assert en._link_state(reply) == LinkState(False, "cable_issue", "unsupported_cable", 7)
    odd = kernel_encoded(en.LinkStateMsg, [("ETHTOOL_A_LINKSTATE_EXT_STATE", 42)])
    assert en._link_state(odd) == LinkState(None, "unknown_42", None, None)


def test_fec_statistics_total_then_lanes() -> None:
    def u64s(*values: int) -> bytes:
        return struct.pack(f"={len(values)}Q", *values)

    reply = kernel_encoded(
        en.FecMsg,
        [
            ("ETHTOOL_A_FEC_ACTIVE", 50),
            (
                "ETHTOOL_A_FEC_STATS",
                {
                    "attrs": [
                        ("ETHTOOL_A_FEC_STAT_CORRECTED", u64s(1000, 250, 250, 300, 200)),
                        ("ETHTOOL_A_FEC_STAT_UNCORR", u64s(3)),
                    ]
                },
            ),
        ],
    )
    assert en._fec(reply) == FecStats("rs", 1000, 3, None, (250, 250, 300, 200), ())


def _nla(kind: int, payload: bytes, nested: bool = False) -> bytes:
    """One netlink attribute as the kernel lays it out: len, type (NLA_F_NESTED), payload, pad to 4."""
    header = struct.pack("=HH", 4 + len(payload), kind | (0x8000 if nested else 0))
    return header + payload + bytes(-len(payload) % 4)


def test_fec_histogram_bins_from_kernel_bytes() -> None:
    """A 6.18 FEC_GET reply built byte by byte from the uapi (ETHTOOL_A_FEC_STATS = 5 holding
    STAT_HIST = 5 nests of HIST_BIN_LOW = 2, BIN_HIGH = 3, BIN_VAL = 4 as NLA_UINT: u32 when the
    sum fits, u64 past it, BIN_VAL_PER_LANE = 5), not by our own message classes."""

    def hist_bin(low: int, high: int, value: bytes, lanes: bytes = b"") -> bytes:
        body = _nla(2, struct.pack("=I", low)) + _nla(3, struct.pack("=I", high)) + _nla(4, value)
        return _nla(5, body + (_nla(5, lanes) if lanes else b""), nested=True)

    stats = (
        _nla(2, struct.pack("=Q", 200))  # STAT_CORRECTED: the total alone (RS-FEC crosses lanes)
        + _nla(3, struct.pack("=Q", 1))  # STAT_UNCORR
        + hist_bin(0, 0, struct.pack("=Q", 7_000_000_000))  # past 2^32: the kernel sends a u64
        + hist_bin(1, 3, struct.pack("=I", 150), struct.pack("=2Q", 100, 50))
        + hist_bin(4, 7, struct.pack("=I", 50))
    )
    attrs = _nla(4, struct.pack("=I", 50)) + _nla(5, stats, nested=True)  # FEC_ACTIVE: RS
    genl = struct.pack("=BBH", 2, 1, 0)  # ETHTOOL_MSG_FEC_GET_REPLY, version 1
    data = struct.pack("=IHHII", 16 + len(genl) + len(attrs), 30, 0, 1, 0) + genl + attrs
    reply = en.FecMsg(data)
    reply.decode()
    fec = en._fec(reply)
    assert (fec.corrected_blocks, fec.uncorrectable_blocks) == (200, 1)
    assert fec.histogram == (FecBin(0, 0, 7_000_000_000), FecBin(1, 3, 150), FecBin(4, 7, 50))
    assert [b.label for b in fec.histogram] == ["0", "1-3", "4-7"]


def test_fec_without_histogram_and_with_a_malformed_bin() -> None:
    reply = kernel_encoded(en.FecMsg, [("ETHTOOL_A_FEC_ACTIVE", 50)])
    assert en._fec(reply).histogram == ()
    broken = kernel_encoded(
        en.FecMsg,
        [
            (
                "ETHTOOL_A_FEC_STATS",
                {"attrs": [("ETHTOOL_A_FEC_STAT_HIST", {"attrs": [("ETHTOOL_A_FEC_HIST_BIN_VAL", b"\x01\x02")]})]},
            )
        ],
    )
    with pytest.raises(ValueError, match="malformed FEC histogram bin"):
        en._fec(broken)


def test_pause_statistics() -> None:
    reply = kernel_encoded(
        en.PauseMsg,
        [
            ("ETHTOOL_A_PAUSE_AUTONEG", 0),
            ("ETHTOOL_A_PAUSE_RX", 1),
            ("ETHTOOL_A_PAUSE_TX", 1),
            (
                "ETHTOOL_A_PAUSE_STATS",
                {"attrs": [("ETHTOOL_A_PAUSE_STAT_TX_FRAMES", 12), ("ETHTOOL_A_PAUSE_STAT_RX_FRAMES", 2**40)]},
            ),
        ],
    )
    assert en._pause(reply) == PauseStats(False, True, True, 12, 2**40)


def test_driver_pause_strings_keep_only_the_curated_set() -> None:
    stats = {
        "rx_prio3_pause": 10,
        "tx_prio3_pause": 4,
        "rx_prio3_pause_duration": 1500,
        "rx_prio3_pause_transition": 5,
        "rx_prio3_buf_discard": 2,
        "rx_prio0_cong_discard": 1,
        "rx_pause_ctrl_phy": 9,
        "tx_pause_storm_warning_events": 1,
        "module_high_temp": 0,
        "rx_vport_unicast_packets": 123456,  # one of the thousands of others
        "rx_prio9_pause": 1,  # no such priority
    }
    parsed = parse_pause(stats)
    assert parsed is not None
    assert dict(parsed.received.frames) == {3: 10} and dict(parsed.sent.frames) == {3: 4}
    assert dict(parsed.received.duration_microseconds) == {3: 1500}
    assert dict(parsed.received.transitions) == {3: 5}
    assert dict(parsed.buffer_discards) == {3: 2} and dict(parsed.congestion_discards) == {0: 1}
    assert parsed.received.global_frames == 9 and parsed.sent.global_frames is None
    assert dict(parsed.counters) == {"tx_pause_storm_warning_events": 1, "module_high_temp": 0}
    assert parse_pause({"rx_packets": 1, "tx_bytes": 2}) is None  # a driver without them: not exposed


class _PagesFromDump(en.EthtoolNetlink):
    """Serves a real module dump page by page, in place of the kernel's MODULE_EEPROM_GET."""

    def __init__(self, memory: ModuleMemory) -> None:
        super().__init__()
        self.memory = memory
        self.asked: list[tuple[int, int, int]] = []

    def module_page(self, ifname: str, page: int, bank: int, offset: int) -> bytes:
        self.asked.append((page, bank, offset))
        self.requests["module_eeprom"] = self.requests.get("module_eeprom", 0) + 1
        return self.memory.lower if offset == 0 else self.memory.upper[(page, bank)]


def test_module_read_asks_for_the_pages_its_identifier_needs_and_reuses_static_ones() -> None:
    data = parse_ethtool_hex((MODULES / "mlxsw-qsfp28-mellanox" / "ethtool-m-hex.txt").read_text())
    reader = _PagesFromDump(from_linear(data, [0, 1, 2, 3]))
    first = reader.module("eth0")
    assert isinstance(first.result, ModuleReading) and first.result.identity.vendor == "Mellanox"
    assert reader.asked == [(0, 0, 0), (0, 0, 128), (3, 0, 128)] and first.requests == 3
    again = reader.module("eth0", static=first.memory)
    assert again.requests == 1 and again.result == first.result  # identity and thresholds reused


class _GarbledReplies(en.EthtoolNetlink):
    """Replies that do not parse (a kernel newer than the message classes, a truncated message)."""

    def _get(self, *args: object, **kwargs: object) -> object:
        raise struct.error("unpack requires a buffer of 8 bytes")


def test_a_reply_that_does_not_parse_is_a_counted_failure_not_a_crash() -> None:
    reader = _GarbledReplies()
    assert reader.fec("ens1f0np0") == ReadFailure("fec", "malformed")
    assert reader.link_state("ens1f0np0") == ReadFailure("link_state", "malformed")
    assert reader.module("ens1f0np0").result == ReadFailure("module_eeprom", "malformed")
    assert reader.errors == {"fec": 1, "link_state": 1, "module_eeprom": 1}
