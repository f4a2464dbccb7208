"""RDMA netlink (NETLINK_RDMA, the nldev client): a port's hw counters in one request, device and port dumps.

Why: on mlx5 every `hw_counters/*` file read can run up to three firmware commands (facts §7: the
lifespan cache is bypassed while the driver returns a partial count, as mlx5 does once it has
optional counters), where `RDMA_NLDEV_CMD_STAT_GET` with a device and port index and no resource
asks the driver once for the whole port. GET needs no privilege (`rdma statistic show` as a user).

A small codec of our own, not pyroute2's message classes: those fit (an `nlmsg` subclass with an
`nla_map` encodes and decodes nldev, nested tables included: tried), but decoding one 30-counter
STAT_GET reply with them costs ~0.74 ms of CPU against ~0.03 ms for the struct walk below (this
machine kind), and a scrape of an 8-port host asks 8 of them: netlink would have saved the NIC's
firmware and spent the exporter's CPU budget. The socket is a plain stdlib one, owned by the
caller's thread, one request at a time. Attribute numbers are the kernel's
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

# enum rdma_nldev_attr: the numbers this client reads or sends.
A_DEV_INDEX = 1
A_DEV_NAME = 2
A_PORT_INDEX = 3
A_FW_VERSION = 5
A_NODE_GUID = 6
A_SYS_IMAGE_GUID = 7
A_SUBNET_PREFIX = 8
A_LID = 9
A_SM_LID = 10
A_LMC = 11
A_PORT_STATE = 12
A_PORT_PHYS_STATE = 13
A_DEV_NODE_TYPE = 14
A_RES_QP = 19
A_RES_QP_ENTRY = 20
A_RES_LQPN = 21
A_RES_TYPE = 26
A_RES_STATE = 27
A_RES_PID = 28
A_RES_KERN_NAME = 29
A_NDEV_INDEX = 50
A_NDEV_NAME = 51
A_DEV_PROTOCOL = 67
A_STAT_HWCOUNTERS = 80
A_STAT_HWCOUNTER_ENTRY = 81
A_STAT_HWCOUNTER_ENTRY_NAME = 82
A_STAT_HWCOUNTER_ENTRY_VALUE = 83
A_STAT_HWCOUNTER_INDEX = 94
A_STAT_HWCOUNTER_DYNAMIC = 95

NLA_HEADER = struct.Struct("=HH")
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED / NLA_F_NET_BYTEORDER
_U8, _U32, _U64 = struct.Struct("=B"), struct.Struct("=I"), struct.Struct("=Q")


class MalformedError(ValueError):
    """A reply this parser does not accept; becomes `Unavailable("malformed", ...)`."""


class Attrs:
    """The attributes of one message or nest: number -> payloads, read with typed, strict getters
    (a u32 of another length, a string without its NUL, an attribute twice where one is expected:
    MalformedError naming it)."""

    __slots__ = ("_by_type", "_where")

    def __init__(self, data: bytes, start: int, end: int, where: str) -> None:
        self._where = where
        by_type: dict[int, list[bytes]] = {}
        offset = start
        while offset < end:
            if end - offset < NLA_HEADER.size:
                raise MalformedError(f"{where}: {end - offset} stray bytes after the last attribute")
            length, kind = NLA_HEADER.unpack_from(data, offset)
            if length < NLA_HEADER.size or offset + length > end:
                raise MalformedError(f"{where}: attribute {kind & NLA_TYPE_MASK} of length {length} overruns")
            by_type.setdefault(kind & NLA_TYPE_MASK, []).append(data[offset + NLA_HEADER.size : offset + length])
            offset += (length + 3) & ~3
        self._by_type = by_type

    def _one(self, kind: int, what: str) -> bytes | None:
        found = self._by_type.get(kind)
        if not found:
            return None
        if len(found) > 1:
            raise MalformedError(f"{self._where}: {what} twice")
        return found[0]

    def _fixed(self, kind: int, what: str, codec: struct.Struct) -> int | None:
        raw = self._one(kind, what)
        if raw is None:
            return None
        if len(raw) != codec.size:
            raise MalformedError(f"{self._where}: {what} has {len(raw)} bytes, not {codec.size}")
        value: int = codec.unpack(raw)[0]
        return value

    def u8(self, kind: int, what: str) -> int | None:
        return self._fixed(kind, what, _U8)

    def u32(self, kind: int, what: str) -> int | None:
        return self._fixed(kind, what, _U32)

    def u64(self, kind: int, what: str) -> int | None:
        return self._fixed(kind, what, _U64)

    def text(self, kind: int, what: str) -> str | None:
        raw = self._one(kind, what)
        if raw is None:
            return None
        if not raw.endswith(b"\0"):
            raise MalformedError(f"{self._where}: {what} is not NUL-terminated")
        try:
            return raw[: raw.index(b"\0")].decode()
        except UnicodeDecodeError as exc:
            raise MalformedError(f"{self._where}: {what} is not UTF-8") from exc

    def nests(self, kind: int, what: str) -> list[Attrs]:
        return [Attrs(raw, 0, len(raw), f"{self._where} {what}") for raw in self._by_type.get(kind, [])]

    def nest(self, kind: int, what: str) -> Attrs | None:
        raw = self._one(kind, what)
        return None if raw is None else Attrs(raw, 0, len(raw), f"{self._where} {what}")

    def need(self, value: int | str | None, what: str) -> Any:
        if value is None:
            raise MalformedError(f"{self._where}: {what} missing")
        return value


def attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    length = NLA_HEADER.size + len(payload)
    return NLA_HEADER.pack(length, kind) + payload + bytes(-length % 4)


def u32_attr(kind: int, value: int) -> bytes:
    return attr(kind, _U32.pack(value))


def u64_attr(kind: int, value: int) -> bytes:
    return attr(kind, _U64.pack(value))


def text_attr(kind: int, value: str) -> bytes:
    return attr(kind, value.encode() + b"\0")


def message(mtype: int, flags: int, seq: int, payload: bytes) -> bytes:
    return NLMSG_HEADER.pack(NLMSG_HEADER.size + len(payload), mtype, flags, seq, 0) + payload


def message_type(command: int) -> int:
    return (RDMA_NL_NLDEV << 10) | command


def encode_request(command: int, seq: int, attrs: Sequence[tuple[int, int]], dump: bool = False) -> bytes:
    """One nldev request (u32 attributes only: device and port indexes), NLM_F_DUMP for the dumps."""
    flags = NLM_F_REQUEST | (NLM_F_DUMP if dump else NLM_F_ACK)
    return message(message_type(command), flags, seq, b"".join(u32_attr(k, v) for k, v in attrs))


def guid_text(value: int) -> str:
    """A u64 GUID as sysfs prints it (`node_guid`): the kernel sends it in host order."""
    h = f"{value:016x}"
    return ":".join(h[i : i + 4] for i in range(0, 16, 4))


def parse_device(a: Attrs) -> NlDevice:
    image = a.u64(A_SYS_IMAGE_GUID, "SYS_IMAGE_GUID")
    return NlDevice(
        index=a.need(a.u32(A_DEV_INDEX, "DEV_INDEX"), "DEV_INDEX"),
        name=a.need(a.text(A_DEV_NAME, "DEV_NAME"), "DEV_NAME"),
        ports=a.need(a.u32(A_PORT_INDEX, "PORT_INDEX"), "PORT_INDEX"),
        node_guid=guid_text(a.need(a.u64(A_NODE_GUID, "NODE_GUID"), "NODE_GUID")),
        sys_image_guid=None if image is None else guid_text(image),
        fw_version=a.text(A_FW_VERSION, "FW_VERSION") or None,
        node_type=a.u8(A_DEV_NODE_TYPE, "DEV_NODE_TYPE"),
        protocol=a.text(A_DEV_PROTOCOL, "DEV_PROTOCOL"),
    )


def parse_port(a: Attrs) -> NlPort:
    prefix = a.u64(A_SUBNET_PREFIX, "SUBNET_PREFIX")
    return NlPort(
        device_index=a.need(a.u32(A_DEV_INDEX, "DEV_INDEX"), "DEV_INDEX"),
        device=a.need(a.text(A_DEV_NAME, "DEV_NAME"), "DEV_NAME"),
        port=a.need(a.u32(A_PORT_INDEX, "PORT_INDEX"), "PORT_INDEX"),
        state=a.need(a.u8(A_PORT_STATE, "PORT_STATE"), "PORT_STATE"),
        phys_state=a.need(a.u8(A_PORT_PHYS_STATE, "PORT_PHYS_STATE"), "PORT_PHYS_STATE"),
        lid=a.u32(A_LID, "LID"),
        sm_lid=a.u32(A_SM_LID, "SM_LID"),
        lmc=a.u8(A_LMC, "LMC"),
        subnet_prefix=None if prefix is None else guid_text(prefix),
        netdev_index=a.u32(A_NDEV_INDEX, "NDEV_INDEX"),
        netdev=a.text(A_NDEV_NAME, "NDEV_NAME"),
    )


def _hw_entries(a: Attrs) -> list[Attrs]:
    table = a.nest(A_STAT_HWCOUNTERS, "STAT_HWCOUNTERS")
    if table is None:
        raise MalformedError("STAT_HWCOUNTERS missing")
    return table.nests(A_STAT_HWCOUNTER_ENTRY, "ENTRY")


def parse_port_counters(a: Attrs, seconds: float = 0.0) -> PortCounters:
    values: dict[str, int] = {}
    for entry in _hw_entries(a):
        name = entry.need(entry.text(A_STAT_HWCOUNTER_ENTRY_NAME, "NAME"), "NAME")
        if name in values:
            raise MalformedError(f"counter {name} twice in one reply")
        values[name] = entry.need(entry.u64(A_STAT_HWCOUNTER_ENTRY_VALUE, "VALUE"), f"VALUE of {name}")
    return PortCounters(
        device_index=a.need(a.u32(A_DEV_INDEX, "DEV_INDEX"), "DEV_INDEX"),
        device=a.need(a.text(A_DEV_NAME, "DEV_NAME"), "DEV_NAME"),
        port=a.need(a.u32(A_PORT_INDEX, "PORT_INDEX"), "PORT_INDEX"),
        values=MappingProxyType(values),
        seconds=seconds,
    )


def parse_disabled(a: Attrs) -> frozenset[str]:
    """STAT_GET_STATUS: the names whose DYNAMIC flag is set (an optional counter that is off)."""
    off = set()
    for entry in _hw_entries(a):
        name = entry.need(entry.text(A_STAT_HWCOUNTER_ENTRY_NAME, "NAME"), "NAME")
        if entry.u8(A_STAT_HWCOUNTER_DYNAMIC, "DYNAMIC"):
            off.add(name)
    return frozenset(off)


def parse_qps(a: Attrs) -> list[QpOwner]:
    dev_index = a.need(a.u32(A_DEV_INDEX, "DEV_INDEX"), "DEV_INDEX")
    dev = a.need(a.text(A_DEV_NAME, "DEV_NAME"), "DEV_NAME")
    table = a.nest(A_RES_QP, "RES_QP")
    if table is None:
        return []
    return [
        QpOwner(
            device_index=dev_index,
            device=dev,
            port=e.u32(A_PORT_INDEX, "PORT_INDEX"),
            qpn=e.need(e.u32(A_RES_LQPN, "LQPN"), "LQPN"),
            qp_type=e.u8(A_RES_TYPE, "TYPE"),
            state=e.u8(A_RES_STATE, "STATE"),
            pid=e.u32(A_RES_PID, "PID"),
            kernel_owner=e.text(A_RES_KERN_NAME, "KERN_NAME"),
        )
        for e in table.nests(A_RES_QP_ENTRY, "ENTRY")
    ]


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

    def ports(self, devices: Sequence[NlDevice] | None = None) -> list[NlPort] | Unavailable:
        """Every port of every device: one PORT_GET dump per device (the kernel dumps the ports of
        the device named by DEV_INDEX; without it, EINVAL), as `rdma link show` does."""
        got = self._per_device(CMD_PORT_GET, parse_port, "port dump", devices)
        return got

    def port_counters(self, device_index: int, port: int, with_status: bool = False) -> PortCounters | Unavailable:
        """Every hw counter of one port in one request (STAT_GET, no resource: the default counter).

        with_status: also ask STAT_GET_STATUS which optional counters are off (5.16+; an older
        kernel's refusal leaves `disabled` None, not an error)."""
        attrs = [(A_DEV_INDEX, device_index), (A_PORT_INDEX, port)]
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

    def qp_owners(self, devices: Sequence[NlDevice] | None = None) -> list[QpOwner] | Unavailable:
        """Every QP of every device with its owner: one RES_QP_GET dump per device (the kernel wants
        the device index, as for ports). A user QP's pid is as this PID namespace sees it; QPs of
        processes in other PID namespaces are not listed."""
        got = self._per_device(CMD_RES_QP_GET, parse_qps, "QP dump", devices)
        return got if isinstance(got, Unavailable) else [qp for part in got for qp in part]

    # -- plumbing ---------------------------------------------------------------------------

    def _per_device(
        self, command: int, parse: Callable[[Attrs], Any], what: str, devices: Sequence[NlDevice] | None
    ) -> list[Any] | Unavailable:
        """A dump per device (`devices`, else a device dump first); a device gone since is skipped."""
        if devices is None:
            listed = self.devices()
            if isinstance(listed, Unavailable):
                return listed
            devices = listed
        out: list[Any] = []
        for device in devices:
            got = self._dump(command, [(A_DEV_INDEX, device.index)], parse, f"{what} of {device.name}")
            if isinstance(got, Unavailable):
                if got.reason == "no_device":
                    continue
                return got
            out.extend(got)
        return out

    def _dump(
        self, command: int, attrs: Sequence[tuple[int, int]], parse: Callable[[Attrs], Any], what: str
    ) -> list[Any] | Unavailable:
        got = self._dump_raw(command, attrs, what)
        if isinstance(got, Unavailable):
            return got
        try:
            return [parse(m) for m in got]
        except MalformedError as exc:
            return Unavailable("malformed", f"{what}: {exc}")

    def _dump_raw(self, command: int, attrs: Sequence[tuple[int, int]], what: str) -> list[Attrs] | Unavailable:
        return self._exchange(command, attrs, what, dump=True)

    def _request(self, command: int, attrs: Sequence[tuple[int, int]], what: str) -> list[Attrs] | Unavailable:
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
        self, command: int, attrs: Sequence[tuple[int, int]], what: str, dump: bool
    ) -> list[Attrs] | Unavailable:
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
    ) -> list[Attrs] | Unavailable:
        """Messages of request `seq` until NLMSG_DONE (a dump) or the answer and its ACK."""
        out: list[Attrs] = []
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
                    # a dump that failed says so in DONE's payload (the kernel's dump_done_errno)
                    if len(body) >= 4 and struct.unpack_from("=i", body)[0] < 0:
                        return _reason_of(-struct.unpack_from("=i", body)[0], what)
                    return out
                if mtype >> 10 != RDMA_NL_NLDEV:
                    raise MalformedError(f"message type {mtype:#x} is not nldev's")
                out.append(Attrs(body, 0, len(body), what))
                if not dump and not flags & NLM_F_MULTI:
                    continue  # the ACK follows


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
