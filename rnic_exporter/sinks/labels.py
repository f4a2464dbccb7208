"""Label and attribute values as valid UTF-8, whatever the kernel's names hold.

Linux allows any bytes but `/`, `:`, whitespace and NUL in an interface name, so an IPoIB netdev
may be called `ib\\xff0`. `os.listdir` hands such a name over with lone surrogates (PEP 383), and
the name is kept that way inside the exporter so that paths built from it still open. Where it
leaves as text - a Prometheus label, an OTLP attribute - each byte that is not UTF-8 is written as
the four characters `\\xNN` (the way `ls -b` shows it): the series stays, the name stays readable
and tells two such devices apart, and the exposition stays valid UTF-8.
"""

from __future__ import annotations


def label_value(value: str) -> str:
    """`value` unchanged when it is valid UTF-8 text, else with each undecodable byte as `\\xNN`."""
    if value.isascii():  # nearly every label: the one check rendering pays
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raw = (
            value.encode("utf-8", "surrogateescape")
            if _escaped_only(value)
            else value.encode("utf-8", "backslashreplace")
        )
        return raw.decode("utf-8", "backslashreplace")
    return value


def _escaped_only(value: str) -> bool:
    """True when every surrogate in `value` is one of PEP 383's (U+DC80-U+DCFF, one per byte)."""
    return all(not 0xD800 <= ord(c) <= 0xDFFF or 0xDC80 <= ord(c) <= 0xDCFF for c in value)
