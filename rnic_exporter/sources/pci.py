"""PCIe link of an RNIC's PCI function: `current_link_{speed,width}`, `max_link_{speed,width}`, and
its AER error counters (`aer_dev_{correctable,nonfatal,fatal}`, kernel 4.17+, absent where AER is off)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence

from rnic_exporter.model.host import PcieLink
from rnic_exporter.sources.plan import Attribute, GroupSpec, Values, under
from rnic_exporter.sources.sysfs import MalformedValueError, SysfsRoot

# Current kernels print `16.0 GT/s PCIe`; up to about 5.6 `16 GT/s` and `Unknown speed`.
_SPEED = re.compile(r"^([0-9]{1,4}(?:\.[0-9]{1,4})?) GT/s(?: PCIe)?$")
_UNKNOWN = ("Unknown", "Unknown speed")
# An all-ones config read (device gone or in reset) reports width 63.
_BOGUS_WIDTH = 63


def parse_link_speed(text: str) -> float | None:
    """`32.0 GT/s PCIe` or `8 GT/s` -> GT/s; `Unknown` (SR-IOV VFs, all-ones reads) -> None."""
    value = text.strip()
    if value in _UNKNOWN:
        return None
    m = _SPEED.match(value)
    if m is None:
        raise MalformedValueError(f"link speed {text[:40]!r} is not '<n> GT/s[ PCIe]' (at most 4 digits)")
    return float(m[1])


def parse_link_width(text: str) -> int | None:
    """`16` -> 16; 0 (VFs) and 63 (all-ones read) mean unknown -> None."""
    value = text.strip()
    if not (value.isascii() and value.isdigit() and len(value) <= 3):
        raise MalformedValueError(f"link width {text[:40]!r} is not a lane count")
    width = int(value)
    return None if width in (0, _BOGUS_WIDTH) else width


CURRENT_LINK_SPEED = Attribute("current_link_speed", parse_link_speed)
MAX_LINK_SPEED = Attribute("max_link_speed", parse_link_speed)
CURRENT_LINK_WIDTH = Attribute("current_link_width", parse_link_width)
MAX_LINK_WIDTH = Attribute("max_link_width", parse_link_width)
LINK_POLLED = (CURRENT_LINK_SPEED, MAX_LINK_SPEED, CURRENT_LINK_WIDTH, MAX_LINK_WIDTH)
# What detection judges (downtrained), read on every state pass.
LINK_WATCHED = (CURRENT_LINK_SPEED, CURRENT_LINK_WIDTH)
# The upstream port's capability: a x16 card in a x8 slot is not "downtrained". The same files
# as the function's, other attributes: a group's values are looked up by attribute.
UPSTREAM_MAX_LINK_SPEED = Attribute("max_link_speed", parse_link_speed)
UPSTREAM_MAX_LINK_WIDTH = Attribute("max_link_width", parse_link_width)
UPSTREAM_POLLED = (UPSTREAM_MAX_LINK_SPEED, UPSTREAM_MAX_LINK_WIDTH)


# drivers/pci/pcie/aer.c (aer_stats_dev_attr): one `NAME COUNT` line per named error bit (and
# `<array>_bit[N] COUNT` for an unnamed bit that counted), then `TOTAL_ERR_COR N` /
# `TOTAL_ERR_NONFATAL N` / `TOTAL_ERR_FATAL N`: the errors the function reported, by severity.
AER_SEVERITIES = {"aer_dev_correctable": "correctable", "aer_dev_nonfatal": "nonfatal", "aer_dev_fatal": "fatal"}
_AER_TOTALS = {"correctable": "TOTAL_ERR_COR", "nonfatal": "TOTAL_ERR_NONFATAL", "fatal": "TOTAL_ERR_FATAL"}


def _aer_parser(severity: str) -> Callable[[str], int]:
    total = _AER_TOTALS[severity]

    def parse(text: str) -> int:
        for line in reversed(text.splitlines()):
            name, _, count = line.strip().partition(" ")
            if name == total:
                if not (count.isascii() and count.isdigit() and len(count) <= 20):
                    break
                return int(count)
        raise MalformedValueError(f"AER counts without a '{total} <n>' line ({text[-40:]!r})")

    return parse


AER_POLLED = tuple(Attribute(name, _aer_parser(severity)) for name, severity in AER_SEVERITIES.items())


def aer_files(root: SysfsRoot, function_dir: str) -> tuple[Attribute[int], ...]:
    """The AER counter files the function has: none where the kernel lacks them (< 4.17) or AER is
    off (no capability, pcie_ports=compat, firmware-first): no value, not an error."""
    return tuple(a for a in AER_POLLED if root.exists(f"{function_dir}/{a.file}"))


def link_files(root: SysfsRoot, function_dir: str) -> tuple[bool, bool]:
    """(the function has link files, its upstream port has). Conventional PCI devices and non-PCI
    parents have none: no link, not an error."""
    return (
        root.exists(f"{function_dir}/current_link_speed"),
        root.exists(f"{os.path.dirname(function_dir)}/max_link_speed"),
    )


def pcie_link(pci_address: str, values: Values, aer: Sequence[Attribute[int]] = ()) -> PcieLink:
    """A `PcieLink` from the values of `LINK_POLLED`, `UPSTREAM_POLLED` (None where the upstream
    port has no link files) and the AER files `aer` read."""
    return PcieLink(
        pci_address=pci_address,
        current_speed_gts=values[CURRENT_LINK_SPEED],
        max_speed_gts=values[MAX_LINK_SPEED],
        current_width=values[CURRENT_LINK_WIDTH],
        max_width=values[MAX_LINK_WIDTH],
        upstream_max_speed_gts=values.get(UPSTREAM_MAX_LINK_SPEED),
        upstream_max_width=values.get(UPSTREAM_MAX_LINK_WIDTH),
        aer_errors=tuple((AER_SEVERITIES[attr.file], count) for attr in aer if isinstance(count := values[attr], int)),
    )


def link_group(
    pci_address: str, function_dir: str, upstream: bool, aer: Sequence[Attribute[int]]
) -> GroupSpec[PcieLink]:
    """The function's link files, its upstream port's (when it has them: `link_files`), and its AER
    files, labelled `device/...` as the device's `device` link reaches them; AER counts are watched
    too (errors count between events)."""
    slots = under(function_dir, LINK_POLLED, "device/")
    if upstream:
        slots += under(os.path.dirname(function_dir), UPSTREAM_POLLED, "device/../")
    slots += under(function_dir, aer, "device/")
    return GroupSpec(slots, lambda values: pcie_link(pci_address, values, aer), watched=(*LINK_WATCHED, *aer))
