"""ethtool netlink reads pyroute2 does not offer: module pages, FEC and pause statistics, link state.

pyroute2's `NlEthtool` knows the family and the header; its message classes lack the statistics
and extended link state attributes, so the messages are declared again here as pyroute2 `nla`
classes (attribute numbers from `include/uapi/linux/ethtool_netlink_generated.h`), and sent on
a bound socket of the calling thread's own (pyroute2 runs each on the event loop of the thread that
opened it). No byte parsing of our own.

Cost (rnic-linux-facts §7): a module page is one MCIA register access on mlx5 per request (128
bytes at most); FEC and pause statistics are one PPCNT each; link state is cheap. Read them on a
timer, not per scrape, and count every request (`EthtoolNetlink.requests`).

Unsupported is a typed value, not an error: EOPNOTSUPP is what the kernel answers for a device
whose driver lacks the operation (veth, tun, IPoIB for FEC, pause and the module; IPoIB has no
module ops at all), and ENODATA/EOPNOTSUPP what a cage without a module answers on some drivers.
"""

from __future__ import annotations

import errno
import logging
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from rnic_exporter.model.optics import ModuleReading, UnsupportedModule
from rnic_exporter.model.wire import FecBin, FecStats, Gone, LinkState, Outcome, PauseStats, ReadFailure, Unsupported
from rnic_exporter.sources import pyroute2_parts
from rnic_exporter.sources.optics.decode import decode as decode_module
from rnic_exporter.sources.optics.decode import pages_to_read
from rnic_exporter.sources.optics.memory import PAGE_SIZE, ModuleDecodeError, ModuleMemory

log = logging.getLogger("rnic_exporter.ethtool_netlink")

_netlink = pyroute2_parts.module("netlink")
_generic = pyroute2_parts.module("netlink.generic.ethtool")
nla: Any = _netlink.nla
genlmsg: Any = _netlink.genlmsg
NLM_F_REQUEST: int = _netlink.NLM_F_REQUEST
NLA_F_NESTED: int = _netlink.NLA_F_NESTED

GENL_NAME = "ethtool"
GENL_VERSION = 1
FLAG_STATS = 1 << 2  # ETHTOOL_FLAG_STATS in the request header

MSG_LINKSTATE_GET = 6
MSG_PAUSE_GET = 21
MSG_FEC_GET = 29
MSG_MODULE_EEPROM_GET = 31

MODULE_I2C_ADDRESS = 0x50  # SFF-8636 and CMIS pages live at the 0x50 address

# An errno that means "this device never does this": unsupported, not a fault.
NOT_SUPPORTED = frozenset({errno.EOPNOTSUPP, errno.ENOTSUP})
# A cage with no module in it (mlx5 answers ENODEV/EIO from MCIA on some firmware; ENODATA elsewhere).
NO_MODULE = frozenset({errno.ENODATA, errno.ENODEV})

# Pages whose bytes move while the module is plugged (CMIS 10h: Tx disable the host writes; 11h:
# data path state and lane monitors); the rest are static.
_LIVE_PAGES = frozenset({0x10, 0x11})
# Pages the decoder does without (CMIS 10h: which transmitters the host disabled; unknown, every
# lane's Tx is judged): a module that refuses one still has its optics read.
_OPTIONAL_PAGES = frozenset({0x10})

# enum ethtool_link_ext_state and its substates (include/uapi/linux/ethtool.h), as ethtool prints them
EXT_STATES: tuple[str, ...] = (
    "autoneg",
    "link_training_failure",
    "link_logical_mismatch",
    "bad_signal_integrity",
    "no_cable",
    "cable_issue",
    "eeprom_issue",
    "calibration_failure",
    "power_budget_exceeded",
    "overheat",
    "module",
)
EXT_SUBSTATES: dict[str, tuple[str, ...]] = {
    "autoneg": (
        "no_partner_detected",
        "ack_not_received",
        "next_page_exchange_failed",
        "no_partner_detected_force_mode",
        "fec_mismatch_during_override",
        "no_hcd",
    ),
    "link_training_failure": (
        "kr_frame_lock_not_acquired",
        "kr_link_inhibit_timeout",
        "kr_link_partner_did_not_set_receiver_ready",
        "remote_fault",
    ),
    "link_logical_mismatch": (
        "pcs_did_not_acquire_block_lock",
        "pcs_did_not_acquire_am_lock",
        "pcs_did_not_get_align_status",
        "fc_fec_is_not_locked",
        "rs_fec_is_not_locked",
    ),
    "bad_signal_integrity": (
        "large_number_of_physical_errors",
        "unsupported_rate",
        "serdes_reference_clock_lost",
        "serdes_alos",
    ),
    "cable_issue": ("unsupported_cable", "cable_test_failure"),
    "module": ("cmis_not_ready",),
}
# ETHTOOL_LINK_MODE_FEC_*_BIT: what FEC_ACTIVE carries
FEC_MODES = {49: "none", 50: "rs", 51: "baser", 74: "llrs"}


# pyroute2's request header (device name or index, flags), shared by every message below
ethtoolheader: Any = _generic.ethtoolheader


class LinkStateMsg(genlmsg):  # type: ignore[misc]
    nla_map = (
        ("ETHTOOL_A_LINKSTATE_UNSPEC", "none"),
        ("ETHTOOL_A_LINKSTATE_HEADER", "ethtoolheader"),
        ("ETHTOOL_A_LINKSTATE_LINK", "uint8"),
        ("ETHTOOL_A_LINKSTATE_SQI", "uint32"),
        ("ETHTOOL_A_LINKSTATE_SQI_MAX", "uint32"),
        ("ETHTOOL_A_LINKSTATE_EXT_STATE", "uint8"),
        ("ETHTOOL_A_LINKSTATE_EXT_SUBSTATE", "uint8"),
        ("ETHTOOL_A_LINKSTATE_EXT_DOWN_CNT", "uint32"),
    )
    ethtoolheader = ethtoolheader


class PauseMsg(genlmsg):  # type: ignore[misc]
    nla_map = (
        ("ETHTOOL_A_PAUSE_UNSPEC", "none"),
        ("ETHTOOL_A_PAUSE_HEADER", "ethtoolheader"),
        ("ETHTOOL_A_PAUSE_AUTONEG", "uint8"),
        ("ETHTOOL_A_PAUSE_RX", "uint8"),
        ("ETHTOOL_A_PAUSE_TX", "uint8"),
        ("ETHTOOL_A_PAUSE_STATS", "Stats"),
        ("ETHTOOL_A_PAUSE_STATS_SRC", "uint32"),
    )
    ethtoolheader = ethtoolheader

    class Stats(nla):  # type: ignore[misc]
        nla_flags = NLA_F_NESTED
        nla_map = (
            ("ETHTOOL_A_PAUSE_STAT_UNSPEC", "none"),
            ("ETHTOOL_A_PAUSE_STAT_PAD", "none"),
            ("ETHTOOL_A_PAUSE_STAT_TX_FRAMES", "uint64"),
            ("ETHTOOL_A_PAUSE_STAT_RX_FRAMES", "uint64"),
        )


class FecMsg(genlmsg):  # type: ignore[misc]
    nla_map = (
        ("ETHTOOL_A_FEC_UNSPEC", "none"),
        ("ETHTOOL_A_FEC_HEADER", "ethtoolheader"),
        ("ETHTOOL_A_FEC_MODES", "cdata"),  # a bitset we do not need
        ("ETHTOOL_A_FEC_AUTO", "uint8"),
        ("ETHTOOL_A_FEC_ACTIVE", "uint32"),
        ("ETHTOOL_A_FEC_STATS", "Stats"),
    )
    ethtoolheader = ethtoolheader

    class Stats(nla):  # type: ignore[misc]
        nla_flags = NLA_F_NESTED
        # each: u64 array, the port total first, then one per lane (or just the total)
        nla_map = (
            ("ETHTOOL_A_FEC_STAT_UNSPEC", "none"),
            ("ETHTOOL_A_FEC_STAT_PAD", "none"),
            ("ETHTOOL_A_FEC_STAT_CORRECTED", "cdata"),
            ("ETHTOOL_A_FEC_STAT_UNCORR", "cdata"),
            ("ETHTOOL_A_FEC_STAT_CORR_BITS", "cdata"),
            ("ETHTOOL_A_FEC_STAT_HIST", "Hist"),  # one per bin, in the driver's order (6.18+)
        )

        class Hist(nla):  # type: ignore[misc]
            # ETHTOOL_A_FEC_HIST_*: the enum starts at 1 (PAD), so index 0 is unused
            nla_flags = NLA_F_NESTED
            nla_map = (
                ("ETHTOOL_A_FEC_HIST_UNSPEC", "none"),
                ("ETHTOOL_A_FEC_HIST_PAD", "none"),
                ("ETHTOOL_A_FEC_HIST_BIN_LOW", "uint32"),
                ("ETHTOOL_A_FEC_HIST_BIN_HIGH", "uint32"),
                ("ETHTOOL_A_FEC_HIST_BIN_VAL", "cdata"),  # NLA_UINT: 4 or 8 bytes
                ("ETHTOOL_A_FEC_HIST_BIN_VAL_PER_LANE", "cdata"),  # u64 per lane, not exported
            )


class ModuleEepromMsg(genlmsg):  # type: ignore[misc]
    nla_map = (
        ("ETHTOOL_A_MODULE_EEPROM_UNSPEC", "none"),
        ("ETHTOOL_A_MODULE_EEPROM_HEADER", "ethtoolheader"),
        ("ETHTOOL_A_MODULE_EEPROM_OFFSET", "uint32"),
        ("ETHTOOL_A_MODULE_EEPROM_LENGTH", "uint32"),
        ("ETHTOOL_A_MODULE_EEPROM_PAGE", "uint8"),
        ("ETHTOOL_A_MODULE_EEPROM_BANK", "uint8"),
        ("ETHTOOL_A_MODULE_EEPROM_I2C_ADDRESS", "uint8"),
        ("ETHTOOL_A_MODULE_EEPROM_DATA", "cdata"),
    )
    ethtoolheader = ethtoolheader


@dataclass(frozen=True, slots=True)
class ModuleRead:
    """A module read: what it decoded to, and the page requests it cost (lower page included)."""

    result: Outcome[ModuleReading | UnsupportedModule]
    requests: int
    memory: ModuleMemory | None = None  # the pages read: pass back as `static` next time


class _NetlinkError(Exception):
    """Any error pyroute2 raised, reduced to its errno."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


R = TypeVar("R")


class EthtoolNetlink:
    """Bound ethtool genetlink sockets, one per calling thread; thread-safe, one request at a time.

    Every call returns a typed outcome and never raises for the device's answer; `requests`
    counts each request sent per operation (the read-cost metric), `errors` each failure.
    """

    def __init__(self) -> None:
        # One socket per calling thread (see `_socket`), closed by `close()` or when its thread ended.
        self._socks: dict[threading.Thread, Any] = {}
        self._lock = threading.Lock()
        self.requests: dict[str, int] = {}
        self.errors: dict[str, int] = {}

    @property
    def sockets(self) -> int:
        """Sockets open now: one per thread that sent a request and is still running."""
        with self._lock:
            return len(self._socks)

    def close(self) -> None:
        with self._lock:
            socks, self._socks = list(self._socks.values()), {}
        for sock in socks:
            _close(sock)

    def __enter__(self) -> EthtoolNetlink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- operations -------------------------------------------------------------------------

    def link_state(self, ifname: str) -> Outcome[LinkState]:
        return self._outcome(
            "link_state", ifname, lambda: _link_state(self._get("link_state", LinkStateMsg, MSG_LINKSTATE_GET, ifname))
        )

    def fec(self, ifname: str) -> Outcome[FecStats]:
        return self._outcome("fec", ifname, lambda: _fec(self._get("fec", FecMsg, MSG_FEC_GET, ifname, FLAG_STATS)))

    def pause(self, ifname: str) -> Outcome[PauseStats]:
        return self._outcome(
            "pause", ifname, lambda: _pause(self._get("pause", PauseMsg, MSG_PAUSE_GET, ifname, FLAG_STATS))
        )

    def present(self, ifname: str) -> bool:
        """Whether a netdev of that name is in this thread's network namespace (an ioctl; no driver call)."""
        try:
            socket.if_nametoindex(ifname)
        except OSError:
            return False
        return True

    def module_page(self, ifname: str, page: int, bank: int, offset: int) -> bytes:
        """128 bytes at `offset` (0 for the lower page, 128 for upper page `page`). Raises _NetlinkError."""
        reply = self._get(
            "module_eeprom",
            ModuleEepromMsg,
            MSG_MODULE_EEPROM_GET,
            ifname,
            0,
            [
                ("ETHTOOL_A_MODULE_EEPROM_OFFSET", offset),
                ("ETHTOOL_A_MODULE_EEPROM_LENGTH", PAGE_SIZE),
                ("ETHTOOL_A_MODULE_EEPROM_PAGE", page),
                ("ETHTOOL_A_MODULE_EEPROM_BANK", bank),
                ("ETHTOOL_A_MODULE_EEPROM_I2C_ADDRESS", MODULE_I2C_ADDRESS),
            ],
        )
        data = reply.get_attr("ETHTOOL_A_MODULE_EEPROM_DATA")
        return bytes(data) if data is not None else b""

    def module(self, ifname: str, static: ModuleMemory | None = None) -> ModuleRead:
        """Lower page, then the upper pages its identifier needs, decoded.

        `static`: the previous read of the same module. Identity (page 00h), advertisements
        (CMIS 01h) and thresholds (03h, 02h) do not change while the module stays plugged, so
        when the lower page's identifier matches they are taken from it and only the lower page
        (and CMIS page 11h, the lane monitors) are read: 1-2 requests instead of 3-5.
        """
        requests = 0
        try:
            requests += 1
            lower = self.module_page(ifname, 0, 0, 0)
            if len(lower) < PAGE_SIZE:
                raise ModuleDecodeError(f"lower page came back with {len(lower)} bytes")
            reuse = static is not None and static.lower[:1] == lower[:1]
            upper: dict[tuple[int, int], bytes] = {}
            for page, bank in pages_to_read(lower):
                cached = static.upper.get((page, bank)) if static is not None and reuse else None
                if cached is not None and page not in _LIVE_PAGES:
                    upper[(page, bank)] = cached
                    continue
                requests += 1
                try:
                    upper[(page, bank)] = self.module_page(ifname, page, bank, PAGE_SIZE)
                except _NetlinkError:
                    if page not in _OPTIONAL_PAGES:
                        raise
            memory = ModuleMemory(lower=lower, upper=upper)
            return ModuleRead(decode_module(memory), requests, memory)
        except _NetlinkError as exc:
            return ModuleRead(self._classify("module_eeprom", ifname, exc.code, NOT_SUPPORTED | NO_MODULE), requests)
        except ModuleDecodeError as exc:
            self._count_error("module_eeprom", f"malformed: {exc}")
            return ModuleRead(ReadFailure("module_eeprom", "malformed"), requests)
        except Exception as exc:  # a reply pyroute2 or our decoder could not take: counted, never raised
            return ModuleRead(self._malformed("module_eeprom", exc), requests)

    # -- plumbing ---------------------------------------------------------------------------

    def _outcome(self, operation: str, ifname: str, read: Callable[[], R]) -> R | Unsupported | Gone | ReadFailure:
        try:
            return read()
        except _NetlinkError as exc:
            return self._classify(operation, ifname, exc.code, NOT_SUPPORTED)
        except Exception as exc:  # a reply pyroute2 or our parser could not take: counted, never raised
            return self._malformed(operation, exc)

    def _malformed(self, operation: str, exc: Exception) -> ReadFailure:
        self._count_error(operation, f"malformed: {exc!r}")
        return ReadFailure(operation, "malformed")

    def _classify(
        self, operation: str, ifname: str, code: int, unsupported: frozenset[int]
    ) -> Unsupported | Gone | ReadFailure:
        # ENODEV is also what mlx5 answers for an empty cage: gone only when the name is gone too.
        if code == errno.ENODEV and not self.present(ifname):
            return Gone(operation)
        # EOPNOTSUPP and ENOTSUP are one number on Linux; the kernel's name for it is EOPNOTSUPP
        name = "EOPNOTSUPP" if code == errno.EOPNOTSUPP else errno.errorcode.get(code, str(code))
        if code in unsupported:
            return Unsupported(operation, name)
        self._count_error(operation, name)
        return ReadFailure(operation, name)

    def _count_error(self, operation: str, reason: str) -> None:
        self.errors[operation] = self.errors.get(operation, 0) + 1
        log.debug("ethtool netlink read failed", extra={"fields": {"operation": operation, "err": reason}})

    def _get(
        self,
        operation: str,
        msg_class: Any,
        cmd: int,
        ifname: str,
        flags: int = 0,
        attrs: list[tuple[str, int]] | None = None,
    ) -> Any:
        header_attrs: list[list[Any]] = [["ETHTOOL_A_HEADER_DEV_NAME", ifname]]
        if flags:
            header_attrs.append(["ETHTOOL_A_HEADER_FLAGS", flags])
        msg = msg_class()
        msg["cmd"] = cmd
        msg["version"] = GENL_VERSION
        msg["attrs"].append((msg_class.nla_map[1][0], {"attrs": header_attrs}))
        msg["attrs"].extend(attrs or [])
        with self._lock, self._errors():
            sock = self._socket()
            sock.marshal.msg_map[sock.prid] = msg_class  # parse this reply with this request's class
            self.requests[operation] = self.requests.get(operation, 0) + 1
            replies = sock.nlm_request(msg, msg_type=sock.prid, msg_flags=NLM_F_REQUEST)
        if not replies:
            raise _NetlinkError(errno.ENODATA)
        return replies[0]

    def _socket(self) -> Any:
        """The calling thread's socket, opened on its first request (called with the lock held).

        pyroute2 (0.9) runs a synchronous socket on an asyncio event loop kept by the thread that
        opened it; a request from any other thread makes a new event loop and endpoint of its own,
        closes them after the reply, and leaves some of each behind in the socket (the loop's id in
        a set, the closed transport's error message in that thread's queue). `WireWatch.annotate`
        asks the link state from the agent's thread while the wire thread polls: one socket each.
        """
        for thread in [t for t in self._socks if not t.is_alive()]:
            _close(self._socks.pop(thread))  # a thread that ended will not ask again
        me = threading.current_thread()
        sock = self._socks.get(me)
        if sock is not None:
            return sock
        sock = _generic.NlEthtool()
        try:
            sock.bind(GENL_NAME, LinkStateMsg)
        except Exception:
            sock.close()
            raise
        self._socks[me] = sock
        return sock

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """pyroute2's NetlinkError and OSError, as one exception carrying the errno."""
        try:
            yield
        except _NetlinkError:
            raise
        except Exception as exc:
            code = getattr(exc, "code", None) or getattr(exc, "errno", None)
            if not isinstance(code, int):
                raise
            if isinstance(exc, OSError):  # the socket itself broke: start afresh next time
                sock = self._socks.pop(threading.current_thread(), None)
                if sock is not None:
                    _close(sock)
            raise _NetlinkError(abs(code)) from exc


def _close(sock: Any) -> None:
    try:
        sock.close()
    except Exception:  # a broken socket must not take the caller down
        log.debug("ethtool netlink close failed", exc_info=True)


def _link_state(reply: Any) -> LinkState:
    link = reply.get_attr("ETHTOOL_A_LINKSTATE_LINK")
    state = reply.get_attr("ETHTOOL_A_LINKSTATE_EXT_STATE")
    sub = reply.get_attr("ETHTOOL_A_LINKSTATE_EXT_SUBSTATE")
    state_name = _name(EXT_STATES, state)
    substate_name = None
    if sub is not None and state_name is not None:
        substate_name = _name(EXT_SUBSTATES.get(state_name, ()), sub - 1) if sub > 0 else None
    return LinkState(
        link_up=None if link is None else bool(link),
        ext_state=state_name,
        ext_substate=substate_name,
        down_count=reply.get_attr("ETHTOOL_A_LINKSTATE_EXT_DOWN_CNT"),
    )


def _name(names: tuple[str, ...], index: int | None) -> str | None:
    if index is None:
        return None
    return names[index] if 0 <= index < len(names) else f"unknown_{index}"


def _u64s(data: bytes | None) -> tuple[int, ...]:
    if not data:
        return ()
    count = len(data) // 8
    return struct.unpack(f"={count}Q", data[: count * 8])


def _fec(reply: Any) -> FecStats:
    stats = reply.get_attr("ETHTOOL_A_FEC_STATS")
    corrected = _u64s(stats.get_attr("ETHTOOL_A_FEC_STAT_CORRECTED")) if stats is not None else ()
    uncorrectable = _u64s(stats.get_attr("ETHTOOL_A_FEC_STAT_UNCORR")) if stats is not None else ()
    bits = _u64s(stats.get_attr("ETHTOOL_A_FEC_STAT_CORR_BITS")) if stats is not None else ()
    active = reply.get_attr("ETHTOOL_A_FEC_ACTIVE")
    histogram = tuple(_fec_bin(b) for b in stats.get_attrs("ETHTOOL_A_FEC_STAT_HIST")) if stats is not None else ()
    return FecStats(
        active_mode=None if active is None else FEC_MODES.get(active, f"mode_{active}"),
        corrected_blocks=corrected[0] if corrected else None,
        uncorrectable_blocks=uncorrectable[0] if uncorrectable else None,
        corrected_bits=bits[0] if bits else None,
        corrected_blocks_per_lane=corrected[1:],
        uncorrectable_blocks_per_lane=uncorrectable[1:],
        histogram=histogram,
    )


def _fec_bin(nest: Any) -> FecBin:
    """One bin of the RS-FEC histogram: codewords the FEC corrected with `low`..`high` errors.

    The kernel sends the bin's sum as NLA_UINT (u32 when it fits, else u64): both are read."""
    low = nest.get_attr("ETHTOOL_A_FEC_HIST_BIN_LOW")
    high = nest.get_attr("ETHTOOL_A_FEC_HIST_BIN_HIGH")
    raw = nest.get_attr("ETHTOOL_A_FEC_HIST_BIN_VAL")
    if low is None or high is None or not isinstance(raw, bytes) or len(raw) not in (4, 8):
        raise ValueError("malformed FEC histogram bin")
    (value,) = struct.unpack("=I" if len(raw) == 4 else "=Q", raw)
    return FecBin(low=int(low), high=int(high), codewords=int(value))


def _pause(reply: Any) -> PauseStats:
    stats = reply.get_attr("ETHTOOL_A_PAUSE_STATS")

    def flag(name: str) -> bool | None:
        value = reply.get_attr(name)
        return None if value is None else bool(value)

    return PauseStats(
        autoneg=flag("ETHTOOL_A_PAUSE_AUTONEG"),
        rx_enabled=flag("ETHTOOL_A_PAUSE_RX"),
        tx_enabled=flag("ETHTOOL_A_PAUSE_TX"),
        tx_frames=stats.get_attr("ETHTOOL_A_PAUSE_STAT_TX_FRAMES") if stats is not None else None,
        rx_frames=stats.get_attr("ETHTOOL_A_PAUSE_STAT_RX_FRAMES") if stats is not None else None,
    )


__all__ = ["EthtoolNetlink", "ModuleRead"]
