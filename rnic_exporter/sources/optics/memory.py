"""A module's memory as the kernel hands it out: the lower page and 128-byte upper pages.

ethtool netlink `MODULE_EEPROM_GET` reads at most 128 bytes at a time, addressed by page, bank and
offset; offsets 0-127 are the lower page (page number ignored), 128-255 the selected upper page.
`ModuleMemory` holds exactly that, so the decoders never see how the bytes were fetched. The
legacy linear layouts (`ethtool -m ... hex on`, the ioctl) are converted by `from_linear`.

The helpers here are the encodings both SFF-8636 and CMIS share (SFF-8024 identifiers, big-endian
16-bit monitors in fixed units, space-padded ASCII fields).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from rnic_exporter.model.optics import MemoryMap, ModuleIdentity

PAGE_SIZE = 128

# SFF-8024 Table 4-1, the identifiers we decode and the neighbours people will plug in.
IDENTIFIERS: Mapping[int, str] = MappingProxyType(
    {
        0x03: "SFP",
        0x0C: "QSFP",
        0x0D: "QSFP+",
        0x11: "QSFP28",
        0x18: "QSFP-DD",
        0x19: "OSFP",
        0x1E: "QSFP+ (CMIS)",
    }
)
SFF8636_IDENTIFIERS = frozenset({0x0D, 0x11})
CMIS_IDENTIFIERS = frozenset({0x18, 0x19, 0x1E})

PageKey = tuple[int, int]  # (page, bank)


class ModuleDecodeError(ValueError):
    """The bytes cannot be a module of the type they claim (short page, impossible values)."""


def _empty_pages() -> Mapping[PageKey, bytes]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ModuleMemory:
    """Lower page (offsets 0-127) and the upper pages read, keyed by (page, bank)."""

    lower: bytes
    upper: Mapping[PageKey, bytes] = field(default_factory=_empty_pages)

    def page(self, page: int, bank: int = 0) -> bytes | None:
        """Upper page `page` (offsets 128-255 as 0-127), or None when it was not read."""
        data = self.upper.get((page, bank))
        return data if data is not None and len(data) == PAGE_SIZE else None

    def identity_page(self, memory_map: str) -> bytes:
        """Upper page 00h, after checking the lower page: what every decoder needs first."""
        if len(self.lower) < PAGE_SIZE:
            raise ModuleDecodeError(f"{memory_map} lower page is {len(self.lower)} bytes, not {PAGE_SIZE}")
        page00 = self.page(0)
        if page00 is None:
            raise ModuleDecodeError(f"{memory_map} upper page 00h (identity) was not read")
        return page00


def identifier_name(identifier: int) -> str:
    return IDENTIFIERS.get(identifier, f"unknown (0x{identifier:02x})")


def from_linear(data: bytes, upper_pages: Sequence[int]) -> ModuleMemory:
    """A linear dump: lower page, then each of `upper_pages` in order, 128 bytes each.

    ethtool's ioctl layouts: SFF-8636 is pages 00h, 01h, 02h, 03h after the lower page (640
    bytes); ethtool's CMIS layout is pages 00h, 01h, 02h, 10h, 11h. A short dump keeps the pages
    it has.
    """
    if len(data) < PAGE_SIZE:
        raise ModuleDecodeError(f"a module dump needs the {PAGE_SIZE}-byte lower page, got {len(data)} bytes")
    upper: dict[PageKey, bytes] = {}
    for i, page in enumerate(upper_pages):
        chunk = data[PAGE_SIZE * (i + 1) : PAGE_SIZE * (i + 2)]
        if len(chunk) == PAGE_SIZE:
            upper[(page, 0)] = bytes(chunk)
    return ModuleMemory(lower=bytes(data[:PAGE_SIZE]), upper=MappingProxyType(upper))


def u16(page: bytes, offset: int) -> int:
    return (page[offset] << 8) | page[offset + 1]


def s16(page: bytes, offset: int) -> int:
    value = u16(page, offset)
    return value - 0x10000 if value & 0x8000 else value


# The fixed units of SFF-8636 and CMIS monitors and thresholds (identical in both).
def celsius(page: bytes, offset: int) -> float:
    """Signed, 1/256 degree C."""
    return s16(page, offset) / 256.0


def volts(page: bytes, offset: int) -> float:
    """Unsigned, 100 microvolts."""
    return u16(page, offset) * 100e-6


def watts(page: bytes, offset: int) -> float:
    """Unsigned, 0.1 microwatt."""
    return u16(page, offset) * 1e-7


def amperes(page: bytes, offset: int, multiplier: int = 1) -> float:
    """Unsigned, 2 microamperes (CMIS may scale it by 2 or 4 for high-current lasers)."""
    return u16(page, offset) * 2e-6 * multiplier


def ascii_field(page: bytes, start: int, length: int) -> str:
    """A space-padded ASCII field; bytes outside printable ASCII become '?' (never a crash).

    Trailing NULs are padding too: the specs say spaces, but real modules pad with NULs (a blank
    revision, a date code's lot digits), and a label of "??" would say "garbled" where it is empty."""
    raw = page[start : start + length].rstrip(b" \x00")
    return "".join(chr(b) if 0x20 <= b < 0x7F else "?" for b in raw)


def oui(page: bytes, start: int) -> str:
    return ":".join(f"{b:02x}" for b in page[start : start + 3])


@dataclass(frozen=True, slots=True)
class IdentityLayout:
    """Where upper page 00h keeps the identity fields, as offsets in the 128-255 address space."""

    vendor: int  # 16 bytes
    oui: int  # 3 bytes
    part_number: int  # 16 bytes
    revision: int  # 2 bytes
    serial_number: int  # 16 bytes
    date_code: int  # 8 bytes


def read_identity(identifier: int, page00: bytes, memory_map: MemoryMap, at: IdentityLayout) -> ModuleIdentity:
    def text(offset: int, length: int) -> str:
        return ascii_field(page00, offset - PAGE_SIZE, length)

    return ModuleIdentity(
        identifier=identifier,
        type=identifier_name(identifier),
        memory_map=memory_map,
        vendor=text(at.vendor, 16),
        part_number=text(at.part_number, 16),
        serial_number=text(at.serial_number, 16),
        revision=text(at.revision, 2),
        oui=oui(page00, at.oui - PAGE_SIZE),
        date_code=text(at.date_code, 8),
    )


__all__ = [
    "CMIS_IDENTIFIERS",
    "IDENTIFIERS",
    "PAGE_SIZE",
    "SFF8636_IDENTIFIERS",
    "IdentityLayout",
    "ModuleDecodeError",
    "ModuleMemory",
    "PageKey",
    "amperes",
    "ascii_field",
    "celsius",
    "from_linear",
    "identifier_name",
    "oui",
    "read_identity",
    "s16",
    "u16",
    "volts",
    "watts",
]
