"""An RDMA netlink client whose socket is one end of a real datagram socketpair, a thread at the
other answering each request: how the unit suite plays the kernel's side of nldev."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rnic_exporter.sources.nldev import RdmaNetlink


@contextmanager
def peer(answer: Callable[[bytes], list[bytes]], timeout_s: float = 0.5) -> Iterator[RdmaNetlink]:
    """A client whose socket is one end of a real datagram socketpair; a thread answers each
    request with `answer(request)` (a list of datagrams)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)

    class Unbound(socket.socket):
        def bind(self, _address: object) -> None:  # AF_UNIX pairs are connected already
            return None

    client_sock = Unbound(fileno=ours.detach())
    stop = threading.Event()

    def serve() -> None:
        theirs.settimeout(0.1)
        while not stop.is_set():
            try:
                request = theirs.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            for datagram in answer(request):
                theirs.send(datagram)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = RdmaNetlink(timeout_s=timeout_s, socket_factory=lambda: client_sock)
    try:
        yield client
    finally:
        stop.set()
        thread.join(2)
        client.close()
        theirs.close()
