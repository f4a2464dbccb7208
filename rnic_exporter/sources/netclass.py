"""`/sys/class/net/<if>/`: the Ethernet (or IPoIB) netdev of an RDMA port."""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Sequence

from rnic_exporter.model.host import Netdev
from rnic_exporter.sources.plan import Attribute, GroupSpec, Values, under
from rnic_exporter.sources.sysfs import NOT_EXPOSED, MalformedValueError, Tree, errno_reason

CLASS_DIR = "class/net"

# `speed`, `carrier`, `duplex` answer EINVAL while the interface is admin down: that is the
# kernel telling us "down", not a fault.
_ADMIN_DOWN = frozenset({errno.EINVAL})
# Up to MAX_ADDR_LEN (32) octets: InfiniBand hardware addresses have 20.
_MAC = re.compile(r"^[0-9a-f]{2}(?::[0-9a-f]{2}){0,31}$")
OPERSTATES = ("unknown", "notpresent", "down", "lowerlayerdown", "testing", "dormant", "up")


# net-sysfs prints every number of ours with "%d": a C int.
_INT = re.compile(r"^-?[0-9]{1,10}$")
INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1


def parse_int(text: str) -> int:
    """Signed decimal C int (`speed` is -1 without carrier); beyond 32 bits is malformed."""
    value = text.strip()
    if not _INT.match(value):
        raise MalformedValueError(f"{text[:40]!r} is not a decimal integer of at most 32 bits")
    number = int(value, 10)
    if not INT_MIN <= number <= INT_MAX:
        raise MalformedValueError(f"{value!r} is beyond a 32-bit integer")
    return number


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
        raise MalformedValueError(f"address {text[:40]!r} is not a hardware address")
    return value


IFINDEX = Attribute("ifindex", parse_int)
ADDRESS = Attribute("address", parse_mac)
MTU = Attribute("mtu", parse_int)
SPEED = Attribute("speed", parse_int, _ADMIN_DOWN)
OPERSTATE = Attribute("operstate", parse_operstate)
CARRIER = Attribute("carrier", parse_bool01, _ADMIN_DOWN)
CARRIER_CHANGES = Attribute("carrier_changes", parse_int, NOT_EXPOSED)
CARRIER_UP_COUNT = Attribute("carrier_up_count", parse_int, NOT_EXPOSED)
CARRIER_DOWN_COUNT = Attribute("carrier_down_count", parse_int, NOT_EXPOSED)
NETDEV_POLLED = (
    IFINDEX,
    ADDRESS,
    MTU,
    SPEED,
    OPERSTATE,
    CARRIER,
    CARRIER_CHANGES,
    CARRIER_UP_COUNT,
    CARRIER_DOWN_COUNT,
)
# What detection judges, read on every state pass: speed, operstate, carrier.
NETDEV_WATCHED = (SPEED, OPERSTATE, CARRIER)


def netdev(name: str, values: Values, pci_address: str | None) -> Netdev:
    """A `Netdev` from the values of `NETDEV_POLLED`."""
    return Netdev(
        name=name,
        ifindex=values[IFINDEX],
        address=values[ADDRESS],
        mtu=values[MTU],
        speed_mbps=values[SPEED],
        operstate=values[OPERSTATE],
        carrier=values[CARRIER],
        carrier_changes=values[CARRIER_CHANGES],
        carrier_up_count=values[CARRIER_UP_COUNT],
        carrier_down_count=values[CARRIER_DOWN_COUNT],
        pci_address=pci_address,
    )


def netdev_from_values(name: str, values: Sequence[object], pci_address: str | None) -> Netdev:
    """A `Netdev` from the values of `NETDEV_POLLED`, in that order (a one-shot read)."""
    return netdev(name, Values.of(NETDEV_POLLED, values), pci_address)


def netdev_group(name: str, pci_address: str | None) -> GroupSpec[Netdev]:
    """The netdev's files, labelled `net/<name>/<file>` (errors are filed under the RDMA port)."""
    return GroupSpec(
        under(f"{CLASS_DIR}/{name}", NETDEV_POLLED, f"net/{name}/"),
        lambda values: netdev(name, values, pci_address),
        watched=NETDEV_WATCHED,
    )


def netdev_pci_address(root: Tree, name: str) -> tuple[str | None, str | None]:
    """(BDF behind the netdev's `device` link, ReadError reason). Bonds, VLANs and macvlans have no
    link: that is normal, not a fault."""
    try:
        return os.path.basename(root.realpath(f"{CLASS_DIR}/{name}/device")), None
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None, None
        return None, f"{errno_reason(exc)}: not a symlink to a PCI function"
