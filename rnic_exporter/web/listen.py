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
    host, port = parse_listen_address(address)
    try:
        if host == "":
            return _bind_all_interfaces(port)
        family, sockaddr = _resolve(host, port)
        # `[::]` listens on IPv4 too, as it does in Go (and so in node_exporter).
        dual = family == socket.AF_INET6 and sockaddr[0] == "::" and socket.has_dualstack_ipv6()
        return _listener(family, sockaddr, dual)
    except socket.gaierror as exc:
        raise ConfigError(f"cannot listen on {address!r}: cannot resolve {host!r}: {exc.strerror}") from exc
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise ConfigError(f"cannot listen on {address!r}: {reason}") from exc


# Connections over the connection cap wait here, in the kernel, without a descriptor of ours;
# the kernel clamps this to net.core.somaxconn.
_BACKLOG = 4096


def _bind_all_interfaces(port: int) -> socket.socket:
    """`:port`: a dual-stack socket when the host has IPv6, else IPv4 only."""
    if socket.has_dualstack_ipv6():
        try:
            return _listener(socket.AF_INET6, ("::", port), True)
        except OSError as exc:
            # IPv6 switched off at runtime (sysctl disable_ipv6) shows up only when binding.
            if exc.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT):
                raise
    return _listener(socket.AF_INET, ("0.0.0.0", port), False)


def _listener(family: int, sockaddr: tuple[Any, ...], dual: bool) -> socket.socket:
    """What socket.create_server does."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as create_server: restart past TIME_WAIT
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if dual else 1)
        sock.bind(sockaddr)
        sock.listen(_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def _resolve(host: str, port: int) -> tuple[int, tuple[Any, ...]]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = infos[0]
    return int(family), tuple(sockaddr)


def format_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
