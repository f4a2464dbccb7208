"""A second accept queue for clients already known to be real scrapers, steered in the kernel.

Why: at the connection cap a flood reconnects as fast as the reactor closes it, and the kernel's
accept queue is first come first served: a scraper that opens a fresh connection per scrape (or
Prometheus reconnecting after an error) waits in it behind the flood, and accept() cannot
reorder it (bench/abuse.py: p99 127-248 ms against 30-66 ms for the same attack on another
exporter). So each listen address gets two listening sockets in one SO_REUSEPORT group (index 0
general, 1 priority) and a classic BPF program that picks the queue per SYN: addresses that
recently had a request answered that passed authentication (the reactor's "proven" clients) and
are not flooding (holding few connections, not refused at accept lately as the hog is) go to 1, every
other to 0. The reactor drains the priority queue first, and its connections are never the ones
closed for room. The program is only a hint that can lag by a second: the reactor judges each
connection again when it accepts it. Without auth every answered request counts as proven.

Classic BPF, not eBPF: SO_ATTACH_REUSEPORT_CBPF needs no capability. For a TCP SYN the program
sees the packet past the TCP header; the IP header is reached through the SKF_NET_OFF window.
It always returns 0 or 1: an index outside the group makes the kernel fall back to hashing,
which would spread the flood over both queues.

Where SO_REUSEPORT or the attach is refused (another kernel, seccomp, another OS), start-up logs
one line and the address gets one listener, as before. The first socket of a group is bound
without SO_REUSEPORT (set right after, before listen()), so a port anyone already holds is still
"address already in use"; a later process of the same user that sets SO_REUSEPORT itself can
join the group (our program sends it nothing, but it could attach its own), as with any
SO_REUSEPORT server.
"""

from __future__ import annotations

import ctypes
import errno
import ipaddress
import logging
import socket
import struct
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence

from rnic_exporter.web.listen import ReusePortError, bind, bind_group

log = logging.getLogger(__name__)

SO_ATTACH_REUSEPORT_CBPF = 51  # asm-generic/socket.h; Python's socket module does not name it
SKF_NET_OFF = -0x100000  # linux/filter.h: loads at this offset and above read the network header
GENERAL, PRIORITY = 0, 1  # indices in the SO_REUSEPORT group: the order the sockets listened in

# Who is steered to the priority queue (see the module docstring).
MAX_ADDRESSES = 64  # the most recently proven; 64 IPv6 addresses take 580 of cBPF's 4096 instructions
PROVEN_FOR = 600.0  # seconds a proof counts: longer than any scrape interval in use
REFUSED_FOR = 60.0  # seconds an address refused at accept (it was flooding) stays out
MAX_HELD = 8  # connections an address may hold and still be steered (a Prometheus holds one per target)
ATTACH_EVERY = 1.0  # seconds between two programs: each attach is a syscall and an RCU swap

# Classic BPF opcodes (linux/bpf_common.h).
_LD_W_ABS, _LD_B_ABS = 0x00 | 0x00 | 0x20, 0x00 | 0x10 | 0x20
_RSH_K = 0x04 | 0x70 | 0x00
_JEQ_K = 0x05 | 0x10 | 0x00
_RET_K = 0x06 | 0x00
_INSN = struct.Struct("HBBI")  # struct sock_filter: code, jt, jf, k


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return _INSN.pack(code, jt, jf, k & 0xFFFFFFFF)


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """A client address as the kernel sees it in the IP header: IPv4-mapped IPv6 is IPv4."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def program(hosts: Iterable[str]) -> bytes:
    """The sock_filter array that returns PRIORITY for a SYN from one of `hosts`, else GENERAL."""
    v4 = sorted({int(a) for h in hosts if isinstance(a := _address(h), ipaddress.IPv4Address)})
    v6 = sorted({a.packed for h in hosts if isinstance(a := _address(h), ipaddress.IPv6Address)})
    if len(v4) + len(v6) > MAX_ADDRESSES:  # the IPv4 block's jumps are one byte
        raise ValueError(f"at most {MAX_ADDRESSES} addresses in the steering program, got {len(v4) + len(v6)}")
    v4_block = [_insn(_LD_W_ABS, SKF_NET_OFF + 12)]  # the IPv4 source address
    for value in v4:
        v4_block += [_insn(_JEQ_K, value, 0, 1), _insn(_RET_K, PRIORITY)]
    v4_block.append(_insn(_RET_K, GENERAL))
    v6_block = []
    for packed in v6:  # the IPv6 source, 16 bytes at offset 8, as four words; a mismatch skips to the next
        words = struct.unpack("!4I", packed)
        for i, word in enumerate(words):
            v6_block += [_insn(_LD_W_ABS, SKF_NET_OFF + 8 + 4 * i), _insn(_JEQ_K, word, 0, 7 - 2 * i)]
        v6_block.append(_insn(_RET_K, PRIORITY))
    v6_block.append(_insn(_RET_K, GENERAL))
    head = [
        _insn(_LD_B_ABS, SKF_NET_OFF),  # version and header length
        _insn(_RSH_K, 4),
        _insn(_JEQ_K, 4, 0, len(v4_block)),  # IPv4 (also on a dual-stack socket), else IPv6
    ]
    return b"".join(head + v4_block + v6_block)


def attach(sock: socket.socket, instructions: bytes) -> None:
    """Make `instructions` the program of `sock`'s SO_REUSEPORT group (OSError if refused)."""
    buffer = ctypes.create_string_buffer(instructions, len(instructions))
    fprog = struct.pack("HP", len(instructions) // _INSN.size, ctypes.addressof(buffer))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, fprog)


def bind_steered(address: str) -> tuple[socket.socket, socket.socket | None]:
    """`address`'s general listener and its priority listener (None: not on this host, logged).

    Address errors are ConfigErrors, as from `listen.bind`.
    """
    try:
        general, priority = bind_group(address, 2)
    except ReusePortError as exc:
        _fallback(address, exc.__cause__)
        return bind(address), None
    try:
        attach(general, program(()))
    except OSError as exc:
        general.close()
        priority.close()
        _fallback(address, exc)
        return bind(address), None
    return general, priority


def _fallback(address: str, exc: BaseException | None) -> None:
    reason = (exc.strerror or str(exc)) if isinstance(exc, OSError) else str(exc)
    if isinstance(exc, OSError) and exc.errno in (errno.ENOPROTOOPT, errno.EINVAL, errno.EPERM):
        reason += " (kernel or seccomp policy without SO_REUSEPORT/classic BPF steering)"
    log.warning(
        "%s: one accept queue (no priority queue for proven scrapers: %s); "
        "a fresh-connection scraper may wait behind a connection flood",
        address,
        reason,
    )


class Priority:
    """Which addresses the kernel steers to the priority queue, and the program that does it.

    Fed by the reactor's thread only: proofs, refusals at accept; `refresh` attaches a new
    program at most every ATTACH_EVERY seconds when the set changed.
    """

    def __init__(self, groups: Sequence[socket.socket]) -> None:
        self._groups = list(groups)  # one socket of each SO_REUSEPORT group, to attach on
        self._proven: OrderedDict[str, float] = OrderedDict()  # host -> last proof, most recent last
        self._refused: dict[str, float] = {}  # proven hosts -> when last refused at accept
        self.steered: frozenset[str] = frozenset()  # what the attached program sends to PRIORITY
        self.attached = 0  # programs attached so far
        self._next_attach = 0.0
        self._dirty = False  # a proof that may change the set arrived since the last refresh
        self._failed = False

    def proven(self, host: str, now: float) -> None:
        self._proven[host] = now
        self._proven.move_to_end(host)
        while len(self._proven) > 4 * MAX_ADDRESSES:
            self._proven.popitem(last=False)
        if host not in self.steered:
            self._dirty = True

    def refused(self, host: str, now: float) -> None:
        if host in self._proven:  # only those can be steered; the flood's own addresses are not kept
            self._refused[host] = now

    def eligible(self, host: str, held: int, now: float) -> bool:
        """Proven lately, holding few connections, and not refused at accept lately (the hog is)."""
        proof = self._proven.get(host)
        return (
            proof is not None
            and now - proof < PROVEN_FOR
            and held <= MAX_HELD
            and now - self._refused.get(host, -REFUSED_FOR) >= REFUSED_FOR
        )

    def wake_at(self) -> float | None:
        """When `refresh` has something to do (for the reactor's select timeout)."""
        return self._next_attach if self._dirty else None

    def refresh(self, by_host: Mapping[str, int], now: float) -> None:
        if now < self._next_attach or not (self._dirty or self.steered):
            return
        self._dirty = False
        self._next_attach = now + ATTACH_EVERY
        for host, proof in list(self._refused.items()):
            if now - proof >= REFUSED_FOR:
                del self._refused[host]
        wanted = [h for h in reversed(self._proven) if self.eligible(h, by_host.get(h, 0), now)]
        steered = frozenset(wanted[:MAX_ADDRESSES])
        if steered == self.steered:
            return
        instructions = program(steered)
        started = time.monotonic()
        try:
            for sock in self._groups:
                attach(sock, instructions)
        except OSError as exc:
            if not self._failed:  # once: the previous program stays in force
                log.warning("cannot update the priority accept queue's program: %s", exc)
                self._failed = True
            return
        self.steered = steered
        self.attached += 1
        log.debug("priority accept queue for %d addresses (%.1f ms)", len(steered), (time.monotonic() - started) * 1e3)
