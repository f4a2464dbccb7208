"""Which decoder a module needs, from its identifier (byte 0), and which pages to read for it.

Byte 0 is SFF-8024's identifier: 0x0d/0x11 are SFF-8636, 0x18/0x19/0x1e CMIS. Anything else
(SFP, legacy QSFP 0x0c, an empty cage's 0x00) is `UnsupportedModule`: not ours to decode, and
no error.
"""

from __future__ import annotations

from rnic_exporter.model.optics import ModuleReading, UnsupportedModule
from rnic_exporter.sources.optics import cmis, sff8636
from rnic_exporter.sources.optics.memory import (
    CMIS_IDENTIFIERS,
    PAGE_SIZE,
    SFF8636_IDENTIFIERS,
    ModuleDecodeError,
    ModuleMemory,
    PageKey,
    identifier_name,
)


def pages_to_read(lower: bytes) -> list[PageKey]:
    """Upper pages (page, bank) the decoder for this lower page uses; [] when unsupported."""
    if len(lower) < PAGE_SIZE:
        raise ModuleDecodeError(f"lower page is {len(lower)} bytes, not {PAGE_SIZE}")
    if lower[0] in SFF8636_IDENTIFIERS:
        return sff8636.pages_to_read(lower)
    if lower[0] in CMIS_IDENTIFIERS:
        return cmis.pages_to_read(lower)
    return []


def decode(memory: ModuleMemory) -> ModuleReading | UnsupportedModule:
    """Raises ModuleDecodeError when the bytes cannot be the module they claim to be."""
    if len(memory.lower) < PAGE_SIZE:
        raise ModuleDecodeError(f"lower page is {len(memory.lower)} bytes, not {PAGE_SIZE}")
    identifier = memory.lower[0]
    if identifier in SFF8636_IDENTIFIERS:
        return sff8636.decode(memory)
    if identifier in CMIS_IDENTIFIERS:
        return cmis.decode(memory)
    return UnsupportedModule(identifier=identifier, type=identifier_name(identifier))
