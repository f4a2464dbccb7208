"""A throw-away CA-less self-signed server certificate for TLS tests (openssl CLI)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def self_signed(workdir: Path, name: str = "server") -> tuple[Path, Path]:
    """(cert, key) for CN=localhost with SANs localhost and 127.0.0.1, valid one day."""
    cert, key = workdir / f"{name}.crt", workdir / f"{name}.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key
