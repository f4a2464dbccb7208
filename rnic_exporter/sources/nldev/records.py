"""What nldev answers, as frozen dataclasses, and the strict parsers that make them from `Attrs`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from rnic_exporter.sources.nldev.wire import (
    A_DEV_INDEX,
    A_DEV_NAME,
    A_DEV_NODE_TYPE,
    A_DEV_PROTOCOL,
    A_FW_VERSION,
    A_LID,
    A_LMC,
    A_NDEV_INDEX,
    A_NDEV_NAME,
    A_NODE_GUID,
    A_PORT_INDEX,
    A_PORT_PHYS_STATE,
    A_PORT_STATE,
    A_RES_CTX,
    A_RES_CTX_ENTRY,
    A_RES_CTXN,
    A_RES_KERN_NAME,
    A_RES_LQPN,
    A_RES_PID,
    A_RES_QP,
    A_RES_QP_ENTRY,
    A_RES_STATE,
    A_RES_TYPE,
    A_SM_LID,
    A_STAT_HWCOUNTER_DYNAMIC,
    A_STAT_HWCOUNTER_ENTRY,
    A_STAT_HWCOUNTER_ENTRY_NAME,
    A_STAT_HWCOUNTER_ENTRY_VALUE,
    A_STAT_HWCOUNTERS,
    A_SUBNET_PREFIX,
    A_SYS_IMAGE_GUID,
    Attrs,
    MalformedError,
)

Reason = Literal[
    "no_rdma_netlink",  # EPROTONOSUPPORT: the kernel has no RDMA netlink (ib_core not loaded, or no RDMA core)
    "permission",  # EPERM / EACCES: a seccomp or LSM policy refused the socket or the request
    "no_device",  # ENODEV / ENOENT / EINVAL on an index: gone, or not in this RDMA network namespace
    "not_supported",  # EOPNOTSUPP: the kernel or driver has no such request (STAT_GET before 5.3)
    "timeout",  # no complete answer within the deadline
    "malformed",  # an answer this parser does not accept (strict: missing or mistyped attributes)
    "io_error",  # anything else the socket said, with its errno name
]


@dataclass(frozen=True, slots=True)
class Unavailable:
    """Netlink cannot answer this, and why: `reason` is a stable label value, `detail` for a person."""

    reason: Reason
    detail: str
    errno: int | None = None

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


@dataclass(frozen=True, slots=True)
class NlDevice:
    """One RDMA device as `RDMA_NLDEV_CMD_GET` describes it."""

    index: int
    name: str
    ports: int  # the highest port number (PORT_INDEX in a GET reply)
    node_guid: str  # as sysfs prints it: four groups of four hex digits
    sys_image_guid: str | None
    fw_version: str | None  # None where the driver has none (rxe, efa): sysfs prints an empty line
    node_type: int | None
    protocol: str | None  # "roce", "ib", "iw" (5.4+)


@dataclass(frozen=True, slots=True)
class NlPort:
    """One port as `RDMA_NLDEV_CMD_PORT_GET` describes it."""

    device_index: int
    device: str
    port: int
    state: int  # IB_PORT_* as sysfs's `state` number (4 ACTIVE)
    phys_state: int  # as sysfs's `phys_state` number (5 LinkUp)
    lid: int | None  # InfiniBand only
    sm_lid: int | None
    lmc: int | None
    subnet_prefix: str | None
    netdev_index: int | None  # RoCE and iWARP: the netdev of this port, where in this network namespace
    netdev: str | None


@dataclass(frozen=True, slots=True)
class PortCounters:
    """Every hw counter of one port from one `STAT_GET`: name -> value (the default counter plus
    every bound counter, as sysfs prints it). `disabled` names the optional counters the kernel
    said are off (STAT_GET_STATUS, 5.16+); None where it was not asked or the kernel is older."""

    device_index: int
    device: str
    port: int
    values: Mapping[str, int]
    disabled: frozenset[str] | None = None
    seconds: float = 0.0  # the request's wall time


@dataclass(frozen=True, slots=True)
class QpOwner:
    """One queue pair and who holds it (`RES_QP_GET`): a user QP has a pid, a kernel one a name."""

    device_index: int
    device: str
    port: int | None  # None before the QP is bound to a port (RESET/INIT of some types)
    qpn: int
    qp_type: int | None
    state: int | None
    pid: int | None
    kernel_owner: str | None  # e.g. "ib_core", "ib_ipoib" for a kernel QP


@dataclass(frozen=True, slots=True)
class ContextOwner:
    """One verbs context (`RES_CTX_GET`): a process that opened the device through libibverbs.

    `pid` is the id of the thread that created it (the kernel's `task_pid_vnr`), as this PID
    namespace sees it; a context of a process in another PID namespace is not listed at all."""

    device_index: int
    device: str
    ctxn: int
    pid: int | None


def guid_text(value: int) -> str:
    """A u64 GUID as sysfs prints it (`node_guid`): the kernel sends it in host order."""
    h = f"{value:016x}"
    return ":".join(h[i : i + 4] for i in range(0, 16, 4))


def parse_device(a: Attrs) -> NlDevice:
    image = a.u64(A_SYS_IMAGE_GUID, "SYS_IMAGE_GUID")
    return NlDevice(
        index=a.need(a.u32(A_DEV_INDEX, "DEV_INDEX"), "DEV_INDEX"),
        name=a.need(a.text(A_DEV_NAME, "DEV_NAME"), "DEV_NAME"),
        ports=a.need(a.u32(A_PORT_INDEX, "PORT_INDEX"), "PORT_INDEX"),
        node_guid=guid_text(a.need(a.u64(A_NODE_GUID, "NODE_GUID"), "NODE_GUID")),
        sys_image_guid=None if image is None else guid_text(image),
        fw_version=a.text(A_FW_VERSION, "FW_VERSION") or None,
        node_type=a.u8(A_DEV_NODE_TYPE, "DEV_NODE_TYPE"),
        protocol=a.text(A_DEV_PROTOCOL, "DEV_PROTOCOL"),
    )


def parse_port(a: Attrs) -> NlPort:
    prefix = a.u64(A_SUBNET_PREFIX, "SUBNET_PREFIX")
    return NlPort(
        device_index=a.need(a.u32(A_DEV_INDEX, "DEV_INDEX"), "DEV_INDEX"),
        device=a.need(a.text(A_DEV_NAME, "DEV_NAME"), "DEV_NAME"),
        port=a.need(a.u32(A_PORT_INDEX, "PORT_INDEX"), "PORT_INDEX"),
        state=a.need(a.u8(A_PORT_STATE, "PORT_STATE"), "PORT_STATE"),
        phys_state=a.need(a.u8(A_PORT_PHYS_STATE, "PORT_PHYS_STATE"), "PORT_PHYS_STATE"),
        lid=a.u32(A_LID, "LID"),
        sm_lid=a.u32(A_SM_LID, "SM_LID"),
        lmc=a.u8(A_LMC, "LMC"),
        subnet_prefix=None if prefix is None else guid_text(prefix),
        netdev_index=a.u32(A_NDEV_INDEX, "NDEV_INDEX"),
        netdev=a.text(A_NDEV_NAME, "NDEV_NAME"),
    )


def _hw_entries(a: Attrs) -> list[Attrs]:
    table = a.nest(A_STAT_HWCOUNTERS, "STAT_HWCOUNTERS")
    if table is None:
        raise MalformedError("STAT_HWCOUNTERS missing")
    return table.nests(A_STAT_HWCOUNTER_ENTRY, "ENTRY")


def parse_port_counters(a: Attrs, seconds: float = 0.0) -> PortCounters:
    values: dict[str, int] = {}
    for entry in _hw_entries(a):
        name = entry.need(entry.text(A_STAT_HWCOUNTER_ENTRY_NAME, "NAME"), "NAME")
        if name in values:
            raise MalformedError(f"counter {name} twice in one reply")
        values[name] = entry.need(entry.u64(A_STAT_HWCOUNTER_ENTRY_VALUE, "VALUE"), f"VALUE of {name}")
    return PortCounters(
        device_index=a.need(a.u32(A_DEV_INDEX, "DEV_INDEX"), "DEV_INDEX"),
        device=a.need(a.text(A_DEV_NAME, "DEV_NAME"), "DEV_NAME"),
        port=a.need(a.u32(A_PORT_INDEX, "PORT_INDEX"), "PORT_INDEX"),
        values=MappingProxyType(values),
        seconds=seconds,
    )


def parse_disabled(a: Attrs) -> frozenset[str]:
    """STAT_GET_STATUS: the names whose DYNAMIC flag is set (an optional counter that is off)."""
    off = set()
    for entry in _hw_entries(a):
        name = entry.need(entry.text(A_STAT_HWCOUNTER_ENTRY_NAME, "NAME"), "NAME")
        if entry.u8(A_STAT_HWCOUNTER_DYNAMIC, "DYNAMIC"):
            off.add(name)
    return frozenset(off)


def _resource_entries(a: Attrs, table: int, entry: int, name: str) -> tuple[int, str, list[Attrs]]:
    """A resource dump's device index and name, and the entries of its table (none: empty)."""
    dev_index = a.need(a.u32(A_DEV_INDEX, "DEV_INDEX"), "DEV_INDEX")
    dev = a.need(a.text(A_DEV_NAME, "DEV_NAME"), "DEV_NAME")
    nest = a.nest(table, name)
    return dev_index, dev, [] if nest is None else nest.nests(entry, "ENTRY")


def parse_qps(a: Attrs) -> list[QpOwner]:
    dev_index, dev, entries = _resource_entries(a, A_RES_QP, A_RES_QP_ENTRY, "RES_QP")
    return [
        QpOwner(
            device_index=dev_index,
            device=dev,
            port=e.u32(A_PORT_INDEX, "PORT_INDEX"),
            qpn=e.need(e.u32(A_RES_LQPN, "LQPN"), "LQPN"),
            qp_type=e.u8(A_RES_TYPE, "TYPE"),
            state=e.u8(A_RES_STATE, "STATE"),
            pid=e.u32(A_RES_PID, "PID"),
            kernel_owner=e.text(A_RES_KERN_NAME, "KERN_NAME"),
        )
        for e in entries
    ]


def parse_contexts(a: Attrs) -> list[ContextOwner]:
    dev_index, dev, entries = _resource_entries(a, A_RES_CTX, A_RES_CTX_ENTRY, "RES_CTX")
    return [
        ContextOwner(dev_index, dev, ctxn=e.need(e.u32(A_RES_CTXN, "CTXN"), "CTXN"), pid=e.u32(A_RES_PID, "PID"))
        for e in entries
    ]
