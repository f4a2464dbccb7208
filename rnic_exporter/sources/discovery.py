"""What a device is made of, learned once per registration: its static attributes, PCI function,
ports and counter file names (its `Shape`), read by `discover`.

A shape is learned again while any of it is unreadable (`settled`), and when `device/net`
changes (`sources/device_reader.py`).
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass, field

from rnic_exporter.model.host import ReadError
from rnic_exporter.sources import availability, pci
from rnic_exporter.sources.infiniband import DEVICE_STATIC, DeviceStatic, parse_link_layer
from rnic_exporter.sources.plan import Attribute, Values
from rnic_exporter.sources.sysfs import ErrorLog, SysfsRoot, errno_reason, interpret

_BDF = re.compile(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


@dataclass(slots=True)
class PortShape:
    number: int
    link_layer: str | None
    counter_names: list[str]
    hw_names: list[str]


@dataclass(slots=True)
class Shape:
    """What does not change while the device stays registered (or is re-learned while unreadable)."""

    static: DeviceStatic
    pci_address: str | None
    function_dir: str | None
    link_files: tuple[bool, bool]
    dev_netdevs: tuple[str, ...]
    aer_files: tuple[Attribute[int], ...]
    ports: list[PortShape]
    hw_names: list[str]
    errors: list[ReadError] = field(default_factory=list)


def settled(shape: Shape) -> bool:
    """Learned whole: nothing failed (what the driver does not provide never comes:
    sources/availability.py; the `device` link is the device's identity, retried whatever it
    answers), and the ports are there (the kernel adds a device's ports after the device itself:
    `ports/` listed empty at registration is not the last word)."""
    return bool(shape.ports) and not any(
        availability.symptom(e) is None or e.attribute == "device" for e in shape.errors
    )


def discover(root: SysfsRoot, name: str, base: str) -> Shape:
    """The shape of the device `name` whose class directory is `base` (relative to the mount)."""
    log = ErrorLog(root)
    values: list[object] = []
    raws = root.read_many([f"{base}/{attr.file}" for attr in DEVICE_STATIC])
    for attr, raw in zip(DEVICE_STATIC, raws, strict=True):
        value, reason = interpret(raw, attr.parse, attr.quiet)
        values.append(value)
        if reason is not None:
            log.add(name, None, attr.file, reason)
    pci_address, function_dir = _pci_function(root, name, base, log)
    link_files = (False, False)
    aer_files: tuple[Attribute[int], ...] = ()
    dev_netdevs: tuple[str, ...] = ()
    if function_dir is not None:
        link_files = pci.link_files(root, function_dir)
        aer_files = pci.aer_files(root, function_dir) if link_files[0] else ()
        dev_netdevs = tuple(
            sorted(log.listdir(f"{base}/device/net", device=name, attribute="device/net", optional=True))
        )
    ports = []
    for number in log.numbered_entries(f"{base}/ports", device=name, port=None, attribute="ports", what="port number"):
        port_dir = f"{base}/ports/{number}"
        link_layer = log.read(port_dir, "link_layer", parse_link_layer, device=name, port=number)
        # Drivers without process_mad (irdma, efa, rxe) have no counters/ at all: not an error.
        counters = sorted(
            log.listdir(f"{port_dir}/counters", device=name, port=number, attribute="counters", optional=True)
        )
        ports.append(PortShape(number, link_layer, counters, _hw_names(log, name, port_dir, number)))
    return Shape(
        static=DeviceStatic.of(Values.of(DEVICE_STATIC, values)),
        pci_address=pci_address,
        function_dir=function_dir,
        link_files=link_files,
        dev_netdevs=dev_netdevs,
        aer_files=aer_files,
        ports=ports,
        hw_names=_hw_names(log, name, base, None),
        errors=log.errors,
    )


def _hw_names(log: ErrorLog, device: str, base: str, port: int | None) -> list[str]:
    """Every `hw_counters/` file whatever the driver calls it, except `lifespan` (a setting)."""
    names = log.listdir(f"{base}/hw_counters", device=device, port=port, attribute="hw_counters", optional=True)
    return sorted(n for n in names if n != "lifespan")


def _pci_function(root: SysfsRoot, name: str, base: str, log: ErrorLog) -> tuple[str | None, str | None]:
    """(BDF, function dir relative to the mount) through the `device` link, if it is PCI."""
    try:
        target = root.realpath(f"{base}/device")
    except OSError as exc:
        if exc.errno != errno.ENOENT:  # software devices (rxe, siw) have no parent: normal
            log.add(name, None, "device", f"{errno_reason(exc)}: not a symlink to the parent device")
        return None, None
    function_dir = os.path.relpath(target, os.path.realpath(root.mount))
    bdf = os.path.basename(target)
    if not _BDF.match(bdf):
        return None, function_dir  # auxiliary-bus parent (mlx5 sub-function): no BDF
    return bdf, function_dir
