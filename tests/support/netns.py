"""Network namespaces with veth pairs for netlink tests, removed afterwards, also on failure.

    with network_namespace({"ens1f0np0": "0c:42:a1:41:00:36"}) as ns:
        ns.ip("addr", "add", "10.0.0.1/24", "dev", "ens1f0np0")
        proc = ns.popen([sys.executable, "-m", "rnic_exporter", "serve", "--web.listen-address", ":19879"])
        http_get(ns.url(19879, "/metrics"))

Layout: the named netdevs live in namespace `ns.name`, their veth peers in a second namespace
`ns.peer_ns` (deleting either namespace destroys the pairs, and the root namespace stays clean).
A management veth pair links the root namespace (`ns.host_address`) with `ns.name`
(`ns.address`), so the test process reaches a server started inside with plain HTTP.

Names carry the creating process's pid: `<prefix><pid hex>x<n>` (at most 15 characters with the
suffixes, the kernel's IFNAMSIZ limit), so a later run can tell and remove what a crashed run
left behind without touching a live run's namespaces.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import itertools
import os
import random
import re
import signal
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tests.support.processes import pid_alive, require_binary, stop_process

PREFIX = "rnx"
INSIDE_MGMT = "rnmgmt0"
_counter = itertools.count()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([require_binary("ip"), *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"`ip {' '.join(args)}` failed ({result.returncode}): {result.stderr.strip()}")
    return result


@dataclass
class Netns:
    name: str
    peer_ns: str
    peers: dict[str, str]  # netdev inside -> its veth peer in `peer_ns`
    address: str  # management address inside `name`
    host_address: str  # the root-namespace end of the management pair
    host_link: str
    processes: list[subprocess.Popen[Any]] = field(default_factory=list)

    def exec_args(self, *argv: str) -> list[str]:
        """`argv` prefixed to run inside the namespace (for callers that spawn processes themselves)."""
        return [require_binary("ip"), "netns", "exec", self.name, *argv]

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(self.exec_args(*argv), capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} in {self.name} failed ({result.returncode}): {result.stderr}")
        return result

    def ip(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`ip -n <name> args`: an `ip` command applied inside the namespace."""
        return _ip("-n", self.name, *args, check=check)

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """A process inside the namespace; stopped (SIGTERM, then SIGKILL) when the namespace goes."""
        proc = subprocess.Popen(self.exec_args(*argv), **kwargs)
        self.processes.append(proc)
        return proc

    def set_carrier(self, netdev: str, up: bool) -> None:
        """Carrier loss or return on `netdev`, as a pulled cable: its peer goes down or up."""
        _ip("-n", self.peer_ns, "link", "set", self.peers[netdev], "up" if up else "down")

    def url(self, port: int, path: str = "/") -> str:
        return f"http://{self.address}:{port}{path}"

    @contextmanager
    def entered(self) -> Iterator[None]:
        """Run the calling thread inside the namespace for the block.

        setns() moves only the calling thread; threads started in the block stay inside for their
        life (a new thread inherits its creator's namespace), which is how an in-process
        `NetlinkWatcher` gets started in here.
        """
        with _setns(f"/run/netns/{self.name}"):
            yield


_CLONE_NEWNET = 0x40000000


@contextmanager
def _setns(path: str) -> Iterator[None]:
    libc = ctypes.CDLL(None, use_errno=True)
    back = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(path, os.O_RDONLY)
        try:
            if libc.setns(target, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns({path})")
        finally:
            os.close(target)
        try:
            yield
        finally:
            if libc.setns(back, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the original namespace")
    finally:
        os.close(back)


def _owner(name: str, prefix: str) -> int | None:
    match = re.match(rf"^{re.escape(prefix)}([0-9a-f]+)x", name)
    return int(match[1], 16) if match else None


def remove_leftovers(prefix: str = PREFIX) -> list[str]:
    """Delete namespaces and root-namespace links named by `prefix` whose creating process is gone."""
    removed = []
    for line in _ip("netns", "list").stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        pid = _owner(name, prefix)
        if pid is not None and not pid_alive(pid):
            _kill_inside(name)
            _ip("netns", "del", name, check=False)
            removed.append(name)
    for line in _ip("-o", "link", "show").stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@")[0]
        pid = _owner(name, prefix)
        if pid is not None and not pid_alive(pid):
            _ip("link", "del", name, check=False)
            removed.append(name)
    return removed


def _kill_inside(name: str) -> None:
    """Processes still inside keep a deleted namespace (and its veths) alive: stop them."""
    for pid in _ip("netns", "pids", name, check=False).stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def _free_management_net() -> ipaddress.IPv4Network:
    """A /30 in 169.254.0.0/16 that no address in the root namespace uses yet."""
    used = _ip("-o", "-4", "addr", "show").stdout
    for _ in range(100):
        net = ipaddress.IPv4Network(f"169.254.{random.randint(1, 254)}.{random.randrange(0, 256, 4)}/30")
        if all(str(host) not in used for host in net):
            return net
    raise AssertionError("no free /30 in 169.254.0.0/16 for the management veth")


@contextmanager
def network_namespace(
    netdevs: Mapping[str, str | None] | Sequence[str], *, prefix: str = PREFIX, up: bool = True
) -> Iterator[Netns]:
    """A namespace holding a veth end named after each of `netdevs` (name -> MAC or None).

    With `up` every pair is brought up, so the netdevs have carrier. Everything is removed on
    exit, also when the body fails; leftovers of crashed earlier runs with `prefix` go first.
    """
    macs = dict(netdevs) if isinstance(netdevs, Mapping) else dict.fromkeys(netdevs)
    if len(prefix) > 4:
        raise ValueError(f"prefix {prefix!r} is longer than 4 characters: names would pass 15")
    remove_leftovers(prefix)
    tag = f"{prefix}{os.getpid():x}x{next(_counter)}"
    ns = Netns(name=f"{tag}n", peer_ns=f"{tag}p", peers={}, address="", host_address="", host_link=f"{tag}m")
    try:
        _ip("netns", "add", ns.name)
        _ip("netns", "add", ns.peer_ns)
        ns.ip("link", "set", "lo", "up")
        for i, (netdev, mac) in enumerate(macs.items()):
            peer = f"{tag}p{i}"
            ns.peers[netdev] = peer
            _ip(
                "link",
                "add",
                netdev,
                "netns",
                ns.name,
                *(["address", mac] if mac else []),
                "type",
                "veth",
                "peer",
                "name",
                peer,
                "netns",
                ns.peer_ns,
            )
            if up:
                _ip("-n", ns.peer_ns, "link", "set", peer, "up")
                ns.ip("link", "set", netdev, "up")
        net = _free_management_net()
        host, inside = (str(h) for h in net.hosts())
        ns.host_address, ns.address = host, inside
        _ip("link", "add", ns.host_link, "type", "veth", "peer", "name", INSIDE_MGMT, "netns", ns.name)
        _ip("addr", "add", f"{host}/30", "dev", ns.host_link)
        _ip("link", "set", ns.host_link, "up")
        ns.ip("addr", "add", f"{inside}/30", "dev", INSIDE_MGMT)
        ns.ip("link", "set", INSIDE_MGMT, "up")
        yield ns
    finally:
        for proc in ns.processes:
            stop_process(proc)
        for name in (ns.name, ns.peer_ns):
            _kill_inside(name)
            _ip("netns", "del", name, check=False)
        _ip("link", "del", ns.host_link, check=False)  # normally gone with the namespace


__all__ = ["PREFIX", "Netns", "network_namespace", "remove_leftovers"]
