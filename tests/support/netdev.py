"""A one-shot read of one netdev's attributes, as the reader's batches read them: for table tests."""

from __future__ import annotations

from rnic_exporter.model.host import Netdev
from rnic_exporter.sources.netclass import CLASS_DIR, NETDEV_POLLED, netdev_from_values, netdev_pci_address
from rnic_exporter.sources.sysfs import ErrorLog, interpret


def read_netdev(log: ErrorLog, name: str, device: str, port: int | None) -> Netdev | None:
    """The netdev's attributes, or None when it does not exist (a one-shot read).

    Errors are filed under the RDMA `device`/`port` that uses the netdev, as `net/<name>/<file>`,
    so one label set (`device`, `port`, `attribute`) covers every unreadable value.
    """
    base = f"{CLASS_DIR}/{name}"
    if not log.root.exists(base):
        return None
    prefix = f"net/{name}/"
    pci_address, reason = netdev_pci_address(log.root, name)
    if reason is not None:
        log.add(device, port, prefix + "device", reason)
    values = []
    raws = log.root.read_many([f"{base}/{attr.file}" for attr in NETDEV_POLLED])
    for attr, raw in zip(NETDEV_POLLED, raws, strict=True):
        value, reason = interpret(raw, attr.parse, attr.quiet)
        if reason is not None:
            log.add(device, port, prefix + attr.file, reason)
        values.append(value)
    return netdev_from_values(name, values, pci_address)
