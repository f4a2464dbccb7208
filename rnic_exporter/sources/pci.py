"""PCIe link of an RNIC's PCI function: `current_link_{speed,width}`, `max_link_{speed,width}`."""

from __future__ import annotations

import os
import re

from rnic_exporter.model import PcieLink
from rnic_exporter.sources.sysfs import ErrorLog, MalformedValueError

# Current kernels print `16.0 GT/s PCIe`; up to about 5.6 `16 GT/s` and `Unknown speed`.
_SPEED = re.compile(r"^(\d+(?:\.\d+)?) GT/s(?: PCIe)?$")
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
        raise MalformedValueError(f"link speed {text!r} is not '<n> GT/s[ PCIe]'")
    return float(m[1])


def parse_link_width(text: str) -> int | None:
    """`16` -> 16; 0 (VFs) and 63 (all-ones read) mean unknown -> None."""
    value = text.strip()
    if not value.isdigit():
        raise MalformedValueError(f"link width {text!r} is not a lane count")
    width = int(value)
    return None if width in (0, _BOGUS_WIDTH) else width


def read_pcie_link(log: ErrorLog, function_dir: str, device: str) -> PcieLink | None:
    """Link of the PCI function at `function_dir` (relative to the mount), with its upstream port.

    Conventional PCI devices and non-PCI parents have no link files: None, not an error.
    Errors are filed as `device/<file>` under the RDMA device (the path through its link).
    """
    pci_address = os.path.basename(function_dir)
    if not log.root.exists(f"{function_dir}/current_link_speed"):
        return None
    prefix = "device/"
    upstream = os.path.dirname(function_dir)
    has_upstream = log.root.exists(f"{upstream}/max_link_speed")
    return PcieLink(
        pci_address=pci_address,
        current_speed_gts=log.read(function_dir, "current_link_speed", parse_link_speed,
                                   device=device, label_prefix=prefix),
        max_speed_gts=log.read(function_dir, "max_link_speed", parse_link_speed, device=device,
                               label_prefix=prefix),
        current_width=log.read(function_dir, "current_link_width", parse_link_width, device=device,
                               label_prefix=prefix),
        max_width=log.read(function_dir, "max_link_width", parse_link_width, device=device,
                           label_prefix=prefix),
        upstream_max_speed_gts=log.read(upstream, "max_link_speed", parse_link_speed, device=device,
                                        label_prefix="device/../") if has_upstream else None,
        upstream_max_width=log.read(upstream, "max_link_width", parse_link_width, device=device,
                                    label_prefix="device/../") if has_upstream else None,
    )
