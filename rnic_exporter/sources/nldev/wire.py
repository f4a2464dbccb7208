"""The nldev wire format: message and attribute layout, the kernel's numbers, a strict attribute reader.

Numbers are `include/uapi/rdma/rdma_netlink.h`'s (ABI: append-only). Why our own codec and not
pyroute2's `nlmsg` classes: see the package's docstring.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Any

NETLINK_RDMA = 20
RDMA_NL_NLDEV = 5  # the nldev client: RDMA_NL_GET_TYPE(client, op) = client << 10 | op

# enum rdma_nldev_command
CMD_GET = 1
CMD_PORT_GET = 5
CMD_RES_QP_GET = 10
CMD_STAT_GET = 17
CMD_RES_CTX_GET = 22  # the verbs contexts (a process that opened a device) and who made them (2020+ kernels)
CMD_STAT_GET_STATUS = 24  # 5.16+: every counter with its index and whether it is disabled

NLM_F_REQUEST = 0x1
NLM_F_MULTI = 0x2
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLMSG_HEADER = struct.Struct("=IHHII")


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
A_RES_CTXN = 64
A_NDEV_INDEX = 50
A_NDEV_NAME = 51
A_DEV_PROTOCOL = 67
A_STAT_HWCOUNTERS = 80
A_STAT_HWCOUNTER_ENTRY = 81
A_STAT_HWCOUNTER_ENTRY_NAME = 82
A_STAT_HWCOUNTER_ENTRY_VALUE = 83
A_RES_CTX = 86
A_RES_CTX_ENTRY = 87
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
