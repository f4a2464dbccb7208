"""The NETLINK_RDMA socket: one request at a time, every answer typed, every refusal an `Unavailable`."""

from __future__ import annotations

import errno
import os
import socket
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rnic_exporter.sources.nldev.records import (
    ContextOwner,
    NlDevice,
    NlPort,
    PortCounters,
    QpOwner,
    Unavailable,
    parse_contexts,
    parse_device,
    parse_disabled,
    parse_port,
    parse_port_counters,
    parse_qps,
)
from rnic_exporter.sources.nldev.wire import (
    A_DEV_INDEX,
    A_PORT_INDEX,
    CMD_GET,
    CMD_PORT_GET,
    CMD_RES_CTX_GET,
    CMD_RES_QP_GET,
    CMD_STAT_GET,
    CMD_STAT_GET_STATUS,
    NETLINK_RDMA,
    NLM_F_MULTI,
    NLMSG_DONE,
    NLMSG_ERROR,
    RDMA_NL_NLDEV,
    Attrs,
    MalformedError,
    encode_request,
    split_messages,
)

DEFAULT_TIMEOUT_S = 2.0
RECV_BUFFER = 65536


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

    def context_owners(self, devices: Sequence[NlDevice] | None = None) -> list[ContextOwner] | Unavailable:
        """Every verbs context of every device with the thread that made it: one RES_CTX_GET dump
        per device. What the consumers scan otherwise learns by reading every descriptor of every
        process under /proc; a kernel without the request answers EOPNOTSUPP (`not_supported`)."""
        got = self._per_device(CMD_RES_CTX_GET, parse_contexts, "context dump", devices)
        return got if isinstance(got, Unavailable) else [ctx for part in got for ctx in part]

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
