"""RDMA netlink (NETLINK_RDMA, the nldev client): a port's hw counters in one request, device and port dumps.

Why: on mlx5 every `hw_counters/*` file read can run up to three firmware commands (facts §7: the
lifespan cache is bypassed while the driver returns a partial count, as mlx5 does once it has
optional counters), where `RDMA_NLDEV_CMD_STAT_GET` with a device and port index and no resource
asks the driver once for the whole port. GET needs no privilege (`rdma statistic show` as a user).

A small codec of our own, not pyroute2's message classes: those fit (an `nlmsg` subclass with an
`nla_map` encodes and decodes nldev, nested tables included: tried), but decoding one 30-counter
STAT_GET reply with them costs ~0.74 ms of CPU against ~0.03 ms for the struct walk below (this
machine kind), and a scrape of an 8-port host asks 8 of them: netlink would have saved the NIC's
firmware and spent the exporter's CPU budget. The socket is a plain stdlib one, owned by the
caller's thread, one request at a time. Attribute numbers are the kernel's
`include/uapi/rdma/rdma_netlink.h` (ABI: append-only), checked against the real kernel by the lab.

Nothing here raises at its caller for a kernel that says no: a refused socket (EPROTONOSUPPORT: no
ib_core; EPERM), a device gone or not visible in this network namespace (ENODEV, ENOENT, EINVAL on
a device index), a timeout or a malformed reply is an `Unavailable` value naming why.

The package: `wire` (layout, numbers, the strict attribute reader), `records` (the typed answers
and their parsers), `client` (the socket).
"""

from __future__ import annotations

from rnic_exporter.sources.nldev.client import DEFAULT_TIMEOUT_S, RdmaNetlink, in_network_namespace
from rnic_exporter.sources.nldev.records import (
    ContextOwner,
    NlDevice,
    NlPort,
    PortCounters,
    QpOwner,
    Reason,
    Unavailable,
    guid_text,
    parse_contexts,
    parse_device,
    parse_disabled,
    parse_port,
    parse_port_counters,
    parse_qps,
)
from rnic_exporter.sources.nldev.wire import (
    CMD_GET,
    CMD_PORT_GET,
    CMD_RES_CTX_GET,
    CMD_RES_QP_GET,
    CMD_STAT_GET,
    CMD_STAT_GET_STATUS,
    NETLINK_RDMA,
    NLM_F_ACK,
    NLM_F_DUMP,
    NLM_F_MULTI,
    NLM_F_REQUEST,
    NLMSG_DONE,
    NLMSG_ERROR,
    NLMSG_HEADER,
    RDMA_NL_NLDEV,
    Attrs,
    MalformedError,
    attr,
    encode_request,
    message,
    message_type,
    split_messages,
    text_attr,
    u32_attr,
    u64_attr,
)

__all__ = [
    "CMD_GET",
    "CMD_PORT_GET",
    "CMD_RES_CTX_GET",
    "CMD_RES_QP_GET",
    "CMD_STAT_GET",
    "CMD_STAT_GET_STATUS",
    "DEFAULT_TIMEOUT_S",
    "NETLINK_RDMA",
    "NLMSG_DONE",
    "NLMSG_ERROR",
    "NLMSG_HEADER",
    "NLM_F_ACK",
    "NLM_F_DUMP",
    "NLM_F_MULTI",
    "NLM_F_REQUEST",
    "RDMA_NL_NLDEV",
    "Attrs",
    "ContextOwner",
    "MalformedError",
    "NlDevice",
    "NlPort",
    "PortCounters",
    "QpOwner",
    "RdmaNetlink",
    "Reason",
    "Unavailable",
    "attr",
    "encode_request",
    "guid_text",
    "in_network_namespace",
    "message",
    "message_type",
    "parse_contexts",
    "parse_device",
    "parse_disabled",
    "parse_port",
    "parse_port_counters",
    "parse_qps",
    "split_messages",
    "text_attr",
    "u32_attr",
    "u64_attr",
]
