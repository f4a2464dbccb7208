"""`/sys/class/net/<if>/`: the Ethernet (or IPoIB) netdev of an RDMA port."""

from __future__ import annotations

import errno
import functools
import os
import re

from rnic_exporter.model import Netdev
from rnic_exporter.sources.sysfs import ErrorLog, MalformedValueError, errno_reason

CLASS_DIR = "class/net"

# `speed`, `carrier`, `duplex` answer EINVAL while the interface is admin down: that is the
# kernel telling us "down", not a fault.
_ADMIN_DOWN = frozenset({errno.EINVAL})
_MAC = re.compile(r"^[0-9a-f]{2}(?::[0-9a-f]{2})+$")
OPERSTATES = ("unknown", "notpresent", "down", "lowerlayerdown", "testing", "dormant", "up")


def parse_int(text: str) -> int:
    """Signed decimal (`speed` is -1 without carrier)."""
    value = text.strip()
    try:
        return int(value, 10)
    except ValueError:
        raise MalformedValueError(f"{text!r} is not a decimal integer") from None


def parse_bool01(text: str) -> bool:
    value = text.strip()
    if value not in ("0", "1"):
        raise MalformedValueError(f"{text!r} is not 0 or 1")
    return value == "1"


def parse_operstate(text: str) -> str:
    value = text.strip()
    if value not in OPERSTATES:
        raise MalformedValueError(f"operstate {text!r} is not one of {', '.join(OPERSTATES)}")
    return value


def parse_mac(text: str) -> str:
    value = text.strip().lower()
    if not _MAC.match(value):
        raise MalformedValueError(f"address {text!r} is not a hardware address")
    return value


def read_netdev(log: ErrorLog, name: str, device: str, port: int | None) -> Netdev | None:
    """The netdev's attributes, or None when it does not exist.

    Errors are filed under the RDMA `device`/`port` that uses the netdev, as `net/<name>/<file>`,
    so one label set (`device`, `port`, `attribute`) covers every unreadable value.
    """
    base = f"{CLASS_DIR}/{name}"
    if not log.root.exists(base):
        return None
    prefix = f"net/{name}/"
    pci_address: str | None = None
    try:
        pci_address = os.path.basename(log.root.realpath(f"{base}/device"))
    except OSError as exc:
        # Bonds, VLANs and macvlans have no device link: that is normal, not a fault.
        if exc.errno != errno.ENOENT:
            log.add(device, port, prefix + "device", f"{errno_reason(exc)}: not a symlink to a PCI function")
    sub = functools.partial(log.read, base, device=device, port=port, label_prefix=prefix)
    return Netdev(
        name=name,
        ifindex=sub("ifindex", parse_int),
        address=sub("address", parse_mac),
        mtu=sub("mtu", parse_int),
        speed_mbps=sub("speed", parse_int, expected=_ADMIN_DOWN),
        operstate=sub("operstate", parse_operstate),
        carrier=sub("carrier", parse_bool01, expected=_ADMIN_DOWN),
        carrier_changes=sub("carrier_changes", parse_int, optional=True),
        carrier_up_count=sub("carrier_up_count", parse_int, optional=True),
        carrier_down_count=sub("carrier_down_count", parse_int, optional=True),
        pci_address=pci_address,
    )
