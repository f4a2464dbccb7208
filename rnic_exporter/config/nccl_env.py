"""The NCCL_* variables as NCCL reads them, into `model.nccl.NcclSettings`.

`nccl_environment` merges NCCL's own config files (`config/nccl_conf.py`), the config file's `[nccl]`
section and the environment, each beating the one before (the environment wins: it is what the jobs
on this host get), and `nccl_settings` / `gid_index_from_env` read it the
way NCCL does (`ncclLoadParam`, `envIbAddrFamily`, `envIbAddrRange`): integers with
`strtoll(s, NULL, 0)` (`010` is 8, `0x3` is 3, `three` is 0, a value out of int64 range is the
default) then cut to a C `int`; the family compared exactly (anything but `AF_INET6` is AF_INET); a
range NCCL cannot parse ignored. Nothing NCCL runs with is refused: where NCCL reads a value other
than it looks, `notes` say how.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from rnic_exporter.model.nccl import _FAMILY_NAMES, AF_INET, AF_INET6, AddrRange, NcclSettings

# Every NCCL variable that decides which GID a connection uses.
NCCL_VARIABLES = (
    "NCCL_IB_GID_INDEX",
    "NCCL_IB_ADDR_FAMILY",
    "NCCL_IB_ADDR_RANGE",
    "NCCL_IB_ROCE_VERSION_NUM",
    "NCCL_IB_ROUTABLE_FLID_GID_INDEX",
)
_INT_DEFAULTS = {"NCCL_IB_GID_INDEX": -1, "NCCL_IB_ROCE_VERSION_NUM": 2, "NCCL_IB_ROUTABLE_FLID_GID_INDEX": 1}

_INT64 = 1 << 64
_C_SPACE = " \t\n\v\f\r"  # isspace() in the C locale: what strtoll skips


def nccl_environment(
    file_env: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
    conf_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The NCCL_* values jobs on this host run with: NCCL's own config files' (`conf_env`, see
    config/nccl_conf.py), overridden by the config file's `[nccl]`, overridden by the environment (set
    at all, even empty: NCCL's setenv(..., 0) does not replace it either)."""
    environ = os.environ if environ is None else environ
    merged = {name: value for name, value in (conf_env or {}).items() if name in NCCL_VARIABLES}
    merged.update(file_env or {})
    merged.update({name: environ[name] for name in NCCL_VARIABLES if name in environ})
    return merged


def strtoll(text: str, base: int = 0) -> tuple[int, bool]:
    """C's strtoll(text, NULL, base) for base 0 or 10: (value, overflowed). The longest valid prefix
    counts, no digits is 0, an overflow clamps to the int64 limit (and sets ERANGE)."""
    i, n = 0, len(text)
    while i < n and text[i] in _C_SPACE:
        i += 1
    sign = 1
    if i < n and text[i] in "+-":
        sign = -1 if text[i] == "-" else 1
        i += 1
    radix = 10 if base == 10 else 0
    if radix == 0:
        if text[i : i + 2].lower() == "0x" and i + 2 < n and text[i + 2] in "0123456789abcdefABCDEF":
            radix, i = 16, i + 2
        elif text[i : i + 1] == "0":
            radix = 8
        else:
            radix = 10
    digits = "0123456789abcdef"[:radix]
    value = 0
    while i < n and text[i].lower() in digits:
        value = value * radix + digits.index(text[i].lower())
        i += 1
    value *= sign
    if value > (1 << 63) - 1:
        return (1 << 63) - 1, True
    if value < -(1 << 63):
        return -(1 << 63), True
    return value, False


def c_int(value: int) -> int:
    """An int64 stored in a C `int` (two's complement, as gcc does on every platform NCCL runs on)."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def nccl_param(env: Mapping[str, str], name: str) -> tuple[int, str | None]:
    """An integer NCCL_* variable as `ncclLoadParam` reads it and NCCL then uses it (an `int`), and a
    note when that is not what the text plainly says."""
    default = _INT_DEFAULTS[name]
    raw = env.get(name)
    if raw is None or raw == "":
        return default, None
    value, overflowed = strtoll(raw)
    if overflowed:
        return default, f"{name}={raw!r} is out of range: NCCL ignores it and uses its default, {default}"
    used = c_int(value)
    if raw.strip() == str(used) and raw == raw.strip():
        return used, None
    why = "wraps to a C int as" if used != value else "reads as"
    return used, f"{name}={raw!r}: NCCL {why} {used} (strtoll base 0: a leading 0 is octal, 0x hex)"


def gid_index_from_env(env: Mapping[str, str]) -> int | None:
    """NCCL_IB_GID_INDEX as NCCL uses it: None when unset or empty, else the `int` NCCL gets (negative:
    auto-selection). Never raises: NCCL runs with any value."""
    raw = env.get("NCCL_IB_GID_INDEX")
    if raw is None or raw == "":
        return None
    return nccl_param(env, "NCCL_IB_GID_INDEX")[0]


def read_family(env: Mapping[str, str]) -> tuple[int, str | None]:
    """envIbAddrFamily: exactly `AF_INET6` is AF_INET6; anything else (unset, `af_inet6`, a trailing
    space) is AF_INET."""
    raw = env.get("NCCL_IB_ADDR_FAMILY")
    if raw is None or raw in ("", "AF_INET"):
        return AF_INET, None
    if raw == "AF_INET6":
        return AF_INET6, None
    return AF_INET, f"NCCL_IB_ADDR_FAMILY={raw!r} is neither 'AF_INET' nor 'AF_INET6' exactly: NCCL uses AF_INET"


def read_range(env: Mapping[str, str], family: int) -> tuple[AddrRange | None, str | None]:
    """envIbAddrRange: the first 127 characters; no `/`, a base inet_pton rejects for the family, or a
    prefix longer than the family's is ignored (every GID then matches)."""
    raw = env.get("NCCL_IB_ADDR_RANGE")
    if raw is None or raw == "":
        return None, None
    text = raw[:127]  # snprintf into char[128]
    base_text, slash, mask_text = text.partition("/")
    family_name = _FAMILY_NAMES[family]
    ignored = f"NCCL_IB_ADDR_RANGE={raw!r}"
    if not slash:
        return None, f"{ignored} has no '/': NCCL ignores it (every GID is in range)"
    try:
        base = socket.inet_pton(family, base_text)
    except (OSError, ValueError):
        return None, f"{ignored}: {base_text!r} is not an {family_name} address: NCCL ignores the range"
    prefixlen = c_int(strtoll(mask_text, 10)[0])  # (int)strtol(mask, NULL, 10)
    if prefixlen > (32 if family == AF_INET else 128):
        return None, f"{ignored}: /{prefixlen} is too long for {family_name}: NCCL ignores the range"
    note = None
    if prefixlen < 0:
        note = f"{ignored}: a negative prefix length makes NCCL find no GID in range"
    elif mask_text != str(prefixlen):
        note = f"{ignored}: NCCL reads the prefix length as {prefixlen}"
    return AddrRange(text, base, prefixlen), note


def nccl_settings(env: Mapping[str, str] | None = None) -> NcclSettings:
    """Never raises: whatever NCCL runs with is read as NCCL reads it, with a note where that
    differs from how it looks."""
    env = os.environ if env is None else env
    family, family_note = read_family(env)
    address_range, range_note = read_range(env, family)
    roce_version, roce_note = nccl_param(env, "NCCL_IB_ROCE_VERSION_NUM")
    flid_index, flid_note = nccl_param(env, "NCCL_IB_ROUTABLE_FLID_GID_INDEX")
    _, index_note = nccl_param(env, "NCCL_IB_GID_INDEX")
    notes = [n for n in (index_note, family_note, range_note, roce_note, flid_note) if n is not None]
    if roce_version not in (1, 2):
        notes.append(
            f"NCCL_IB_ROCE_VERSION_NUM={roce_version}: no GID has that RoCE version, so NCCL's "
            "auto-selection never moves off index 0 for a version match"
        )
    stated = env.get("NCCL_IB_ADDR_FAMILY") in ("AF_INET", "AF_INET6") or address_range is not None
    return NcclSettings(family, address_range, roce_version, flid_index, stated, tuple(notes))


def gid_index_given(flag: int | None, environ: Mapping[str, str]) -> bool:
    """Whether the index is given above the config files: by a flag, or by NCCL_IB_GID_INDEX in the
    environment, even empty (NCCL then auto-selects: its setenv(..., 0) keeps the empty value too)."""
    return flag is not None or "NCCL_IB_GID_INDEX" in environ
