"""`python -m rnic_exporter.commands.healthcheck [PID]`: the container's HEALTHCHECK, at the exporter's address.

Docker runs it inside the container beside the exporter, which is PID 1 there: it reads that
command line's `--web.listen-address` (the first) and `--web.config.file`, so another port, a host
address or TLS need no change to the image. It asks `/-/healthy`, which is answered without basic
auth, over HTTPS when the web config has `tls_server_config`, without checking the certificate (it
asks whether the exporter is alive, not who it is). When the web config requires a client
certificate it has none to present, and a completed TCP connection is all it checks. Exit 0:
healthy; 1: not, with the reason on stderr.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import sys
from collections.abc import Sequence
from pathlib import Path

from rnic_exporter.config.web_file import ClientAuthType, load_web_config
from rnic_exporter.errors import ConfigError
from rnic_exporter.web.listen import parse_listen_address

DEFAULT_LISTEN = ":19879"
_TIMEOUT = 4.0
_CERT_REQUIRED = (ClientAuthType.REQUIRE_ANY_CLIENT_CERT, ClientAuthType.REQUIRE_AND_VERIFY_CLIENT_CERT)


def flag(args: Sequence[str], name: str) -> str | None:
    """The first value of `--name` in `args`, given as `--name=value` or `--name value`."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.partition("=")[2]
    return None


def check(args: Sequence[str], cwd: Path) -> str | None:
    """Why the exporter started with `args` in `cwd` is not healthy, or None when it is."""
    host, port = parse_listen_address(flag(args, "--web.listen-address") or DEFAULT_LISTEN)
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    web_config = flag(args, "--web.config.file")
    tls = None if not web_config else load_web_config(cwd / web_config).tls_server_config
    if tls is not None and tls.client_auth_type in _CERT_REQUIRED:
        socket.create_connection((host, port), timeout=_TIMEOUT).close()
        return None
    if tls is None:
        conn: http.client.HTTPConnection = http.client.HTTPConnection(host, port, timeout=_TIMEOUT)
    else:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        conn = http.client.HTTPSConnection(host, port, timeout=_TIMEOUT, context=context)
    try:
        conn.request("GET", "/-/healthy")
        response = conn.getresponse()
        body = response.read(512).decode("utf-8", "replace").strip()
    finally:
        conn.close()
    return None if response.status == 200 else f"/-/healthy answered {response.status}: {body}"


def main(proc: Path = Path("/proc/1")) -> int:
    try:
        args = (proc / "cmdline").read_bytes().split(b"\0")
        problem = check([arg.decode("utf-8", "replace") for arg in args], (proc / "cwd").resolve())
    except (OSError, ConfigError, http.client.HTTPException) as exc:
        problem = str(exc) or type(exc).__name__
    if problem is not None:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    # Another PID: tests, or a pod with a shared process namespace.
    sys.exit(main(Path("/proc", sys.argv[1] if len(sys.argv) > 1 else "1")))
