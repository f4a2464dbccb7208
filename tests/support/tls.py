"""A throw-away CA-less self-signed server certificate for TLS tests (openssl CLI)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def self_signed(
    workdir: Path, name: str = "server", cn: str = "localhost", subject_alt_name: str = "DNS:localhost,IP:127.0.0.1"
) -> tuple[Path, Path]:
    """(cert, key) `name`.crt/.key for CN=`cn` with `subject_alt_name` (localhost and 127.0.0.1), valid one day."""
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
            f"/CN={cn}",
            "-addext",
            f"subjectAltName={subject_alt_name}",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key
