"""Module memory fixtures: `ethtool -m ... hex on` text to bytes, and the fixtures' paths."""

from __future__ import annotations

import re
from pathlib import Path

MODULES = Path(__file__).resolve().parent.parent / "fixtures" / "modules"

_ROW = re.compile(r"^\s*0x([0-9a-f]{4}):\s+((?:[0-9a-f]{2}\s*)+)$")


def parse_ethtool_hex(text: str) -> bytes:
    """The bytes of ethtool's hex dump; rows must follow each other without a gap."""
    out = bytearray()
    for line in text.splitlines():
        match = _ROW.match(line)
        if match is None:
            continue
        if int(match[1], 16) != len(out):
            raise ValueError(f"row 0x{match[1]} follows {len(out)} bytes")
        out.extend(bytes.fromhex(match[2]))
    return bytes(out)
