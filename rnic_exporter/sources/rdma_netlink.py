"""RDMA netlink (NETLINK_RDMA, the nldev client): a port's hw counters in one request, device and port dumps.

Why: on mlx5 every `hw_counters/*` file read can run up to three firmware commands (facts §7: the
lifespan cache is bypassed while the driver returns a partial count, as mlx5 does once it has
optional counters), where `RDMA_NLDEV_CMD_STAT_GET` with a device and port index and no resource
asks the driver once for the whole port. GET needs no privilege (`rdma statistic show` as a user).

The messages are pyroute2's netlink message classes (`nlmsg` with an `nla_map`: pyroute2 has no
RDMA family, but its attribute encoder and decoder fit the nldev layout, nested tables included);
the socket is a plain stdlib one, owned by the caller's thread, one request at a time: no asyncio
core, no reader thread, nothing pyroute2's sockets would add. Attribute numbers are the kernel's
`include/uapi/rdma/rdma_netlink.h` (ABI: append-only), checked against the real kernel by the lab.

Nothing here raises at its caller for a kernel that says no: a refused socket (EPROTONOSUPPORT: no
ib_core; EPERM), a device gone or not visible in this network namespace (ENODEV, ENOENT, EINVAL on
a device index), a timeout or a malformed reply is an `Unavailable` value naming why.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from rnic_exporter.sources import pyroute2_parts

NETLINK_RDMA = 20
RDMA_NL_NLDEV = 5  # the nldev client: RDMA_NL_GET_TYPE(client, op) = client << 10 | op

# enum rdma_nldev_command
CMD_GET = 1
CMD_PORT_GET = 5
CMD_RES_QP_GET = 10
CMD_STAT_GET = 17
CMD_STAT_GET_STATUS = 24  # 5.16+: every counter with its index and whether it is disabled

NLM_F_REQUEST = 0x1
NLM_F_MULTI = 0x2
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLMSG_HEADER = struct.Struct("=IHHII")

DEFAULT_TIMEOUT_S = 2.0
RECV_BUFFER = 65536

Reason = Literal[
    "no_rdma_netlink",  # EPROTONOSUPPORT: the kernel has no RDMA netlink (ib_core not loaded, or no RDMA core)
    "permission",  # EPERM / EACCES: a seccomp or LSM policy refused the socket or the request
    "no_device",  # ENODEV / ENOENT / EINVAL on an index: gone, or not in this RDMA network namespace
    "not_supported",  # EOPNOTSUPP: the kernel or driver has no such request (STAT_GET before 5.3)
    "timeout",  # no complete answer within the deadline
    "malformed",  # an answer this parser does not accept (strict: missing or mistyped attributes)
    "io_error",  # anything else the socket said, with its errno name
]


@dataclass(frozen=True, slots=True)
class Unavailable:
    """Netlink cannot answer this, and why: `reason` is a stable label value, `detail` for a person."""

    reason: Reason
    detail: str
    errno: int | None = None

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


@dataclass(frozen=True, slots=True)
class NlDevice:
    """One RDMA device as `RDMA_NLDEV_CMD_GET` describes it."""

    index: int
    name: str
    ports: int  # the highest port number (PORT_INDEX in a GET reply)
    node_guid: str  # as sysfs prints it: four groups of four hex digits
    sys_image_guid: str | None
    fw_version: str | None  # None where the driver has none (rxe, efa): sysfs prints an empty line
    node_type: int | None
    protocol: str | None  # "roce", "ib", "iw" (5.4+)


@dataclass(frozen=True, slots=True)
class NlPort:
    """One port as `RDMA_NLDEV_CMD_PORT_GET` describes it."""

    device_index: int
    device: str
    port: int
    state: int  # IB_PORT_* as sysfs's `state` number (4 ACTIVE)
    phys_state: int  # as sysfs's `phys_state` number (5 LinkUp)
    lid: int | None  # InfiniBand only
    sm_lid: int | None
    lmc: int | None
    subnet_prefix: str | None
    netdev_index: int | None  # RoCE and iWARP: the netdev of this port, where in this network namespace
    netdev: str | None


@dataclass(frozen=True, slots=True)
class PortCounters:
    """Every hw counter of one port from one `STAT_GET`: name -> value (the default counter plus
    every bound counter, as sysfs prints it). `disabled` names the optional counters the kernel
    said are off (STAT_GET_STATUS, 5.16+); None where it was not asked or the kernel is older."""

    device_index: int
    device: str
    port: int
    values: Mapping[str, int]
    disabled: frozenset[str] | None = None
    seconds: float = 0.0  # the request's wall time


@dataclass(frozen=True, slots=True)
class QpOwner:
    """One queue pair and who holds it (`RES_QP_GET`): a user QP has a pid, a kernel one a name."""

    device_index: int
    device: str
    port: int | None  # None before the QP is bound to a port (RESET/INIT of some types)
    qpn: int
    qp_type: int | None
    state: int | None
    pid: int | None
    kernel_owner: str | None  # e.g. "ib_core", "ib_ipoib" for a kernel QP


# -- message classes ----------------------------------------------------------------------------

_classes: dict[str, Any] = {}

# nla_map rows: (attribute number, name, pyroute2 type or the name of a nested class on the owner).
_HWCOUNTER_ENTRY = (
    (0, "PAD", "none"),
    (82, "NAME", "asciiz"),
    (83, "VALUE", "uint64"),
    (94, "INDEX", "uint32"),
    (95, "DYNAMIC", "uint8"),
)
_QP_ENTRY = (
    (0, "PAD", "none"),
    (3, "PORT_INDEX", "uint32"),
    (21, "LQPN", "uint32"),
    (22, "RQPN", "uint32"),
    (26, "TYPE", "uint8"),
    (27, "STATE", "uint8"),
    (28, "PID", "uint32"),
    (29, "KERN_NAME", "asciiz"),
    (60, "PDN", "uint32"),
)
_NLDEV = (
    (0, "PAD", "none"),
    (1, "DEV_INDEX", "uint32"),
    (2, "DEV_NAME", "asciiz"),
    (3, "PORT_INDEX", "uint32"),
    (4, "CAP_FLAGS", "uint64"),
    (5, "FW_VERSION", "asciiz"),
    (6, "NODE_GUID", "uint64"),
    (7, "SYS_IMAGE_GUID", "uint64"),
    (8, "SUBNET_PREFIX", "uint64"),
    (9, "LID", "uint32"),
    (10, "SM_LID", "uint32"),
    (11, "LMC", "uint8"),
    (12, "PORT_STATE", "uint8"),
    (13, "PORT_PHYS_STATE", "uint8"),
    (14, "DEV_NODE_TYPE", "uint8"),
    (19, "RES_QP", "qp_table"),
    (50, "NDEV_INDEX", "uint32"),
    (51, "NDEV_NAME", "asciiz"),
    (67, "DEV_PROTOCOL", "asciiz"),
    (80, "STAT_HWCOUNTERS", "hwcounters"),
)


def _message_class() -> Any:
    """The nldev message class on pyroute2's `nlmsg`, built once on first use (the daemon may never
    ask netlink, and pyroute2's netlink module is then never imported)."""
    if "msg" in _classes:
        return _classes["msg"]
    nl = pyroute2_parts.module("netlink")
    # pyroute2 finds a nested attribute's class by its name on the owning class.
    entry = type("hwcounter_entry", (nl.nla,), {"nla_map": _HWCOUNTER_ENTRY})
    hwcounters = type(
        "hwcounters", (nl.nla,), {"nla_map": ((81, "ENTRY", "hwcounter_entry"),), "hwcounter_entry": entry}
    )
    qp_entry = type("qp_entry", (nl.nla,), {"nla_map": _QP_ENTRY})
    qp_table = type("qp_table", (nl.nla,), {"nla_map": ((20, "ENTRY", "qp_entry"),), "qp_entry": qp_entry})
    msg = type(
        "nldev_msg", (nl.nlmsg,), {"fields": (), "nla_map": _NLDEV, "hwcounters": hwcounters, "qp_table": qp_table}
    )
    _classes["msg"] = msg
    return msg


def message_type(command: int) -> int:
    return (RDMA_NL_NLDEV << 10) | command


def encode_request(command: int, seq: int, attrs: Sequence[tuple[str, object]], dump: bool = False) -> bytes:
    """One nldev request as the kernel expects it (NLM_F_DUMP for the dump commands)."""
    msg = _message_class()()
    msg["header"]["type"] = message_type(command)
    msg["header"]["flags"] = NLM_F_REQUEST | (NLM_F_DUMP if dump else NLM_F_ACK)
    msg["header"]["sequence_number"] = seq
    msg["header"]["pid"] = 0
    msg["attrs"] = list(attrs)
    msg.encode()
    return bytes(msg.data)


class MalformedError(ValueError):
    """A reply this parser does not accept; becomes `Unavailable("malformed", ...)`."""


def _decode(data: bytes) -> Any:
    msg = _message_class()(data)
    try:
        msg.decode()
    except Exception as exc:  # pyroute2 raises what its struct unpacking raises on short buffers
        raise MalformedError(f"undecodable nldev message: {type(exc).__name__}: {exc}") from exc
    return msg


def _required(msg: Any, name: str, kind: type) -> Any:
    value = msg.get_attr(name)
    if value is None:
        raise MalformedError(f"{name} missing")
    if not isinstance(value, kind):
        raise MalformedError(f"{name} is {type(value).__name__}, not {kind.__name__}")
    return value


def _optional(msg: Any, name: str, kind: type) -> Any:
    value = msg.get_attr(name)
    if value is not None and not isinstance(value, kind):
        raise MalformedError(f"{name} is {type(value).__name__}, not {kind.__name__}")
    return value


def guid_text(value: int) -> str:
    """A u64 GUID as sysfs prints it (`node_guid`): the kernel sends it in host order."""
    h = f"{value:016x}"
    return ":".join(h[i : i + 4] for i in range(0, 16, 4))


def parse_device(msg: Any) -> NlDevice:
    node_guid = _required(msg, "NODE_GUID", int)
    image = _optional(msg, "SYS_IMAGE_GUID", int)
    fw = _optional(msg, "FW_VERSION", str)
    return NlDevice(
        index=_required(msg, "DEV_INDEX", int),
        name=_required(msg, "DEV_NAME", str),
        ports=_required(msg, "PORT_INDEX", int),
        node_guid=guid_text(node_guid),
        sys_image_guid=None if image is None else guid_text(image),
        fw_version=fw or None,
        node_type=_optional(msg, "DEV_NODE_TYPE", int),
        protocol=_optional(msg, "DEV_PROTOCOL", str),
    )


def parse_port(msg: Any) -> NlPort:
    prefix = _optional(msg, "SUBNET_PREFIX", int)
    return NlPort(
        device_index=_required(msg, "DEV_INDEX", int),
        device=_required(msg, "DEV_NAME", str),
        port=_required(msg, "PORT_INDEX", int),
        state=_required(msg, "PORT_STATE", int),
        phys_state=_required(msg, "PORT_PHYS_STATE", int),
        lid=_optional(msg, "LID", int),
        sm_lid=_optional(msg, "SM_LID", int),
        lmc=_optional(msg, "LMC", int),
        subnet_prefix=None if prefix is None else guid_text(prefix),
        netdev_index=_optional(msg, "NDEV_INDEX", int),
        netdev=_optional(msg, "NDEV_NAME", str),
    )


def _hw_entries(msg: Any) -> Iterator[Any]:
    table = msg.get_attr("STAT_HWCOUNTERS")
    if table is None:
        raise MalformedError("STAT_HWCOUNTERS missing")
    yield from table.get_attrs("ENTRY")


def parse_port_counters(msg: Any, seconds: float = 0.0) -> PortCounters:
    values: dict[str, int] = {}
    for entry in _hw_entries(msg):
        name = _required(entry, "NAME", str)
        if name in values:
            raise MalformedError(f"counter {name} twice in one reply")
        values[name] = _required(entry, "VALUE", int)
    return PortCounters(
        device_index=_required(msg, "DEV_INDEX", int),
        device=_required(msg, "DEV_NAME", str),
        port=_required(msg, "PORT_INDEX", int),
        values=MappingProxyType(values),
        seconds=seconds,
    )


def parse_disabled(msg: Any) -> frozenset[str]:
    """STAT_GET_STATUS: the names whose DYNAMIC flag is set (an optional counter that is off)."""
    off = set()
    for entry in _hw_entries(msg):
        name = _required(entry, "NAME", str)
        if _optional(entry, "DYNAMIC", int):
            off.add(name)
    return frozenset(off)


def parse_qps(msg: Any) -> list[QpOwner]:
    dev_index = _required(msg, "DEV_INDEX", int)
    dev = _required(msg, "DEV_NAME", str)
    table = msg.get_attr("RES_QP")
    if table is None:
        return []
    owners = []
    for entry in table.get_attrs("ENTRY"):
        owners.append(
            QpOwner(
                device_index=dev_index,
                device=dev,
                port=_optional(entry, "PORT_INDEX", int),
                qpn=_required(entry, "LQPN", int),
                qp_type=_optional(entry, "TYPE", int),
                state=_optional(entry, "STATE", int),
                pid=_optional(entry, "PID", int),
                kernel_owner=_optional(entry, "KERN_NAME", str),
            )
        )
    return owners


# -- the socket ---------------------------------------------------------------------------------


def _reason_of(code: int | None, context: str) -> Unavailable:
    name = errno.errorcode.get(code or 0, f"errno {code}")
    if code == errno.EPROTONOSUPPORT:
        return Unavailable("no_rdma_netlink", f"{context}: {name}: this kernel has no RDMA netlink (ib_core)", code)
    if code in (errno.EPERM, errno.EACCES):
        return Unavailable("permission", f"{context}: {name}", code)
    if code in (errno.ENODEV, errno.ENOENT, errno.EINVAL, errno.ENXIO):
        return Unavailable("no_device", f"{context}: {name}: no such device or port in this RDMA namespace", code)
    if code in (errno.EOPNOTSUPP, errno.ENOSYS):
        return Unavailable("not_supported", f"{context}: {name}", code)
    if code in (errno.ETIMEDOUT, errno.EAGAIN):
        return Unavailable("timeout", f"{context}: {name}", code)
    return Unavailable("io_error", f"{context}: {name}", code)


SocketFactory = Callable[[], socket.socket]


def _open_socket() -> socket.socket:
    return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_RDMA)


@dataclass
class RdmaNetlink:
    """One NETLINK_RDMA socket of the calling thread's network namespace; one request at a time.

    Use as a context manager or call `close()`. Every method returns its typed result or an
    `Unavailable`; the socket is opened lazily and reopened after an I/O failure."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    socket_factory: SocketFactory = _open_socket
    record: list[bytes] | None = None  # every datagram received, raw (the lab keeps them as fixtures)
    _sock: socket.socket | None = field(default=None, repr=False)
    _seq: int = 0

    def __enter__(self) -> RdmaNetlink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    # -- requests ---------------------------------------------------------------------------

    def devices(self) -> list[NlDevice] | Unavailable:
        """Every RDMA device this network namespace sees (RDMA_NLDEV_CMD_GET dump)."""
        return self._dump(CMD_GET, [], parse_device, "device dump")

    def ports(self) -> list[NlPort] | Unavailable:
        """Every port of every device (RDMA_NLDEV_CMD_PORT_GET dump)."""
        return self._dump(CMD_PORT_GET, [], parse_port, "port dump")

    def port_counters(self, device_index: int, port: int, with_status: bool = False) -> PortCounters | Unavailable:
        """Every hw counter of one port in one request (STAT_GET, no resource: the default counter).

        with_status: also ask STAT_GET_STATUS which optional counters are off (5.16+; an older
        kernel's refusal leaves `disabled` None, not an error)."""
        attrs = [("DEV_INDEX", device_index), ("PORT_INDEX", port)]
        start = time.monotonic()
        got = self._request(CMD_STAT_GET, attrs, f"STAT_GET {device_index}/{port}")
        if isinstance(got, Unavailable):
            return got
        seconds = time.monotonic() - start
        try:
            counters = parse_port_counters(got[0], seconds)
        except MalformedError as exc:
            return Unavailable("malformed", f"STAT_GET {device_index}/{port}: {exc}")
        if not with_status:
            return counters
        status = self._request(CMD_STAT_GET_STATUS, attrs, f"STAT_GET_STATUS {device_index}/{port}")
        if isinstance(status, Unavailable):
            return counters
        try:
            disabled = parse_disabled(status[0])
        except MalformedError:
            return counters
        return PortCounters(counters.device_index, counters.device, counters.port, counters.values, disabled, seconds)

    def qp_owners(self) -> list[QpOwner] | Unavailable:
        """Every QP of every device with its owner (RES_QP_GET dump; a user QP's pid as seen from
        this PID namespace)."""
        got = self._dump_raw(CMD_RES_QP_GET, [], "QP dump")
        if isinstance(got, Unavailable):
            return got
        owners: list[QpOwner] = []
        try:
            for msg in got:
                owners.extend(parse_qps(msg))
        except MalformedError as exc:
            return Unavailable("malformed", f"QP dump: {exc}")
        return owners

    # -- plumbing ---------------------------------------------------------------------------

    def _dump(
        self, command: int, attrs: Sequence[tuple[str, object]], parse: Callable[[Any], Any], what: str
    ) -> list[Any] | Unavailable:
        got = self._dump_raw(command, attrs, what)
        if isinstance(got, Unavailable):
            return got
        try:
            return [parse(m) for m in got]
        except MalformedError as exc:
            return Unavailable("malformed", f"{what}: {exc}")

    def _dump_raw(self, command: int, attrs: Sequence[tuple[str, object]], what: str) -> list[Any] | Unavailable:
        return self._exchange(command, attrs, what, dump=True)

    def _request(self, command: int, attrs: Sequence[tuple[str, object]], what: str) -> list[Any] | Unavailable:
        got = self._exchange(command, attrs, what, dump=False)
        if not isinstance(got, Unavailable) and not got:
            return Unavailable("malformed", f"{what}: acknowledged without an answer")
        return got

    def _socket(self) -> socket.socket:
        if self._sock is None:
            sock = self.socket_factory()
            try:
                sock.bind((0, 0))
                sock.settimeout(self.timeout_s)
            except OSError:
                sock.close()
                raise
            self._sock = sock
        return self._sock

    def _exchange(
        self, command: int, attrs: Sequence[tuple[str, object]], what: str, dump: bool
    ) -> list[Any] | Unavailable:
        try:
            sock = self._socket()
        except OSError as exc:
            return _reason_of(exc.errno, f"{what}: opening the NETLINK_RDMA socket")
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        seq = self._seq
        deadline = time.monotonic() + self.timeout_s
        try:
            sock.send(encode_request(command, seq, attrs, dump=dump))
            return self._collect(sock, seq, deadline, what, dump)
        except TimeoutError:
            self.close()  # a late answer would be read as the next request's
            return Unavailable("timeout", f"{what}: no answer within {self.timeout_s:g} s")
        except MalformedError as exc:
            self.close()
            return Unavailable("malformed", f"{what}: {exc}")
        except OSError as exc:
            self.close()
            return _reason_of(exc.errno, what)

    def _collect(
        self, sock: socket.socket, seq: int, deadline: float, what: str, dump: bool
    ) -> list[Any] | Unavailable:
        """Messages of request `seq` until NLMSG_DONE (a dump) or the answer and its ACK."""
        out: list[Any] = []
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            sock.settimeout(remaining)
            data = sock.recv(RECV_BUFFER)
            if self.record is not None:
                self.record.append(data)
            for mtype, flags, mseq, body in split_messages(data):
                if mseq != seq:
                    continue  # an answer to an earlier request that timed out
                if mtype == NLMSG_ERROR:
                    if len(body) < 4:
                        raise MalformedError("short NLMSG_ERROR")
                    (code,) = struct.unpack_from("=i", body)
                    if code == 0:  # the ACK after a request's answer
                        return out
                    return _reason_of(-code, what)
                if mtype == NLMSG_DONE:
                    return out
                if mtype >> 10 != RDMA_NL_NLDEV:
                    raise MalformedError(f"message type {mtype:#x} is not nldev's")
                out.append(_decode(body_with_header(mtype, flags, mseq, body)))
                if not dump and not flags & NLM_F_MULTI:
                    continue  # the ACK follows


def body_with_header(mtype: int, flags: int, seq: int, body: bytes) -> bytes:
    return NLMSG_HEADER.pack(NLMSG_HEADER.size + len(body), mtype, flags, seq, 0) + body


def split_messages(data: bytes) -> Iterator[tuple[int, int, int, bytes]]:
    """(type, flags, seq, payload) of each netlink message in one datagram; strict about lengths."""
    offset = 0
    while offset < len(data):
        if len(data) - offset < NLMSG_HEADER.size:
            raise MalformedError(f"{len(data) - offset} stray bytes after the last message")
        length, mtype, flags, seq, _pid = NLMSG_HEADER.unpack_from(data, offset)
        if length < NLMSG_HEADER.size or offset + length > len(data):
            raise MalformedError(f"message length {length} at offset {offset} of {len(data)}")
        yield mtype, flags, seq, data[offset + NLMSG_HEADER.size : offset + length]
        offset += (length + 3) & ~3


def in_network_namespace(path: str, make: Callable[[], RdmaNetlink]) -> RdmaNetlink:
    """A client whose socket lives in the network namespace at `path` (e.g. /run/netns/b); the
    calling thread enters it only while the socket is made (needs CAP_SYS_ADMIN)."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(path, os.O_RDONLY)
    client = make()
    try:
        _setns(target)
        try:
            client._socket()
        finally:
            _setns(own)
    except OSError:
        pass  # left unopened: the first request reports why
    finally:
        os.close(own)
        os.close(target)
    return client


def _setns(fd: int) -> None:
    """setns(2) into a network namespace (os.setns is 3.12+)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


__all__ = [
    "NETLINK_RDMA",
    "MalformedError",
    "NlDevice",
    "NlPort",
    "PortCounters",
    "QpOwner",
    "RdmaNetlink",
    "Unavailable",
    "encode_request",
    "guid_text",
    "in_network_namespace",
    "split_messages",
]
