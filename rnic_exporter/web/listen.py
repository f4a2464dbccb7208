"""Listen addresses: node_exporter's `--web.listen-address` syntax and binding, dual-stack included."""

from __future__ import annotations

import errno
import os
import re
import socket
from typing import Any

from rnic_exporter.errors import ConfigError

_PORT = re.compile(r"[0-9]{1,5}")


def parse_listen_address(address: str) -> tuple[str, int]:
    """(host, port) from node_exporter's syntax: `:9100`, `0.0.0.0:9100`, `[::1]:9100`, `host:port`.

    An empty host means all interfaces.
    """
    host, colon, port_text = address.rpartition(":")
    if not colon:
        raise ConfigError(f"listen address {address!r}: missing ':<port>' (examples: ':9100', '[::1]:9100')")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ConfigError(f"listen address {address!r}: put an IPv6 address in brackets, e.g. '[::1]:9100'")
    if not _PORT.fullmatch(port_text) or int(port_text) > 65535:
        raise ConfigError(f"listen address {address!r}: port {port_text!r} is not a number from 0 to 65535")
    return host, int(port_text)


def bind(address: str) -> socket.socket:
    """A listening socket for `address`; every failure is a ConfigError naming the address."""
    return _bind(address, 1)[0]


class ReusePortError(Exception):
    """The kernel would not put a second listener on the address (SO_REUSEPORT); the cause says why."""


def bind_group(address: str, size: int) -> list[socket.socket]:
    """`size` listening sockets on `address` in one SO_REUSEPORT group, in the group's index order.

    The first is bound without SO_REUSEPORT, so a port another socket holds (with SO_REUSEPORT or
    not) is "address already in use" as with `bind` (a ConfigError); SO_REUSEPORT is set on it
    before listen(), which is when a TCP socket joins or founds its group. ReusePortError (nothing
    left open) when the others cannot join.
    """
    return _bind(address, size)


def _bind(address: str, size: int) -> list[socket.socket]:
    host, port = parse_listen_address(address)
    try:
        if host == "":
            return _bind_all_interfaces(port, size)
        family, sockaddr = _resolve(host, port)
        dual = family == socket.AF_INET6 and sockaddr[0] == "::" and socket.has_dualstack_ipv6()
        # `[::]` listens on IPv4 too, as it does in Go (and so in node_exporter).
        return _listeners(family, sockaddr, dual, size)
    except socket.gaierror as exc:
        raise ConfigError(f"cannot listen on {address!r}: cannot resolve {host!r}: {exc.strerror}") from exc
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise ConfigError(f"cannot listen on {address!r}: {reason}") from exc


# Connections over the connection cap wait here, in the kernel, without a descriptor of ours;
# the kernel clamps this to net.core.somaxconn.
_BACKLOG = 4096


def _bind_all_interfaces(port: int, size: int) -> list[socket.socket]:
    """`:port`: dual-stack sockets when the host has IPv6, else IPv4 only."""
    if socket.has_dualstack_ipv6():
        try:
            return _listeners(socket.AF_INET6, ("::", port), True, size)
        except OSError as exc:
            # IPv6 switched off at runtime (sysctl disable_ipv6) shows up only when binding.
            if exc.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT):
                raise
    return _listeners(socket.AF_INET, ("0.0.0.0", port), False, size)


def _listeners(family: int, sockaddr: tuple[Any, ...], dual: bool, size: int) -> list[socket.socket]:
    """What socket.create_server does, for the first of `size` sockets and then for the rest of the group."""
    first = _socket(family, dual)
    try:
        first.bind(sockaddr)
        if size > 1:
            _reuse_port(first)
        first.listen(_BACKLOG)
    except BaseException:
        first.close()
        raise
    group = [first]
    try:
        for _ in range(size - 1):
            sock = _socket(family, dual)
            group.append(sock)
            _reuse_port(sock)
            sock.bind(first.getsockname())  # the port the first got, also for port 0
            sock.listen(_BACKLOG)
    except (OSError, ReusePortError) as exc:
        for sock in group:
            sock.close()
        if isinstance(exc, ReusePortError):
            raise
        raise ReusePortError(str(exc)) from exc
    return group


def _socket(family: int, dual: bool) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as create_server: restart past TIME_WAIT
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if dual else 1)
    except BaseException:
        sock.close()
        raise
    return sock


def _reuse_port(sock: socket.socket) -> None:
    option = getattr(socket, "SO_REUSEPORT", None)
    if option is None:
        raise ReusePortError("this platform has no SO_REUSEPORT")
    try:
        sock.setsockopt(socket.SOL_SOCKET, option, 1)
    except OSError as exc:
        raise ReusePortError(str(exc)) from exc


def _resolve(host: str, port: int) -> tuple[int, tuple[Any, ...]]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = infos[0]
    return int(family), tuple(sockaddr)


def format_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
