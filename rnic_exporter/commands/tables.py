"""One-shot views of a snapshot for `show` and `gids`: a table for people, JSON for scripts.

The JSON is the scripting interface and is documented in docs/json-output.md; `schema` changes only
when a field changes meaning or goes away (new fields may be added).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rnic_exporter.model.consumers import ConsumerScan
from rnic_exporter.model.host import Device, GidEntry, Netdev, PcieLink, Port, ReadError, Snapshot, pcie_generation
from rnic_exporter.sinks.consumer_fields import as_json as consumers_json
from rnic_exporter.sinks.consumer_fields import users_text

JSON_SCHEMA = 1


def _pcie_text(link: PcieLink | None) -> str:
    if link is None:
        return "-"

    def one(gts: float | None, width: int | None) -> str:
        gen = pcie_generation(gts)
        speed = f"Gen{gen}" if gen is not None else (f"{gts:g}GT/s" if gts is not None else "?")
        return f"{speed} x{width if width is not None else '?'}"

    current = one(link.current_speed_gts, link.current_width)
    return f"{current} (max {one(link.expected_speed_gts, link.expected_width)})"


def _rate_text(port: Port) -> str:
    if port.rate is None:
        return "?"
    text = f"{port.rate.gbps:g}G {port.rate.lanes}X {port.rate.speed}"
    # mlx5 reports a default 40 Gb/s on a down RoCE port: say the number is not a live one.
    up = port.up
    return text if up else f"{text} (not up)" if up is False else f"{text} (state unknown)"


def _state_text(port: Port) -> str:
    state = port.state.name if port.state is not None else "?"
    phys = port.phys_state.name if port.phys_state is not None else "?"
    return f"{state}/{phys}"


def _netdev_text(netdev: Netdev | None, name: str | None) -> str:
    if name is None:
        return "-"
    if netdev is None:
        return f"{name} (missing)"
    if netdev.speed_mbps is None:
        speed = "?"
    else:
        speed = "unknown" if netdev.speed_mbps < 0 else f"{netdev.speed_mbps // 1000}G"
    return f"{name} {netdev.operstate or '?'} {speed}"


def _port_errors(snap: Snapshot, port: Port) -> list[ReadError]:
    return [e for e in snap.errors if e.device == port.device and e.port == port.number]


def _device_errors(snap: Snapshot, device: Device) -> list[ReadError]:
    return [e for e in snap.errors if e.device == device.name and e.port is None]


def _port_unsupported(snap: Snapshot, port: Port) -> list[ReadError]:
    return [e for e in snap.unsupported if e.device == port.device and e.port == port.number]


def _device_unsupported(snap: Snapshot, device: Device) -> list[ReadError]:
    return [e for e in snap.unsupported if e.device == device.name and e.port is None]


def _unreadable_text(errors: list[ReadError]) -> str:
    return ",".join(f"{e.attribute}({e.kind})" for e in errors) or "-"


def port_ipv4(port: Port) -> list[str]:
    seen: list[str] = []
    for entry in port.gids:
        ipv4 = entry.ipv4
        if ipv4 is not None and ipv4 not in seen:
            seen.append(ipv4)
    return seen


SHOW_COLUMNS = ("DEVICE", "PORT", "LINK", "STATE", "RATE", "NETDEV", "PCIE", "IPV4", "NCCL_GID", "UNREADABLE")


def show_columns(users: ConsumerScan | None = None) -> tuple[str, ...]:
    """With a consumer scan (`show --collector.consumers`), a last USERS column: who holds the device."""
    return SHOW_COLUMNS if users is None else (*SHOW_COLUMNS, "USERS")


def show_rows(snap: Snapshot, users: ConsumerScan | None = None) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    extra: tuple[str, ...] = ()
    for device in snap.devices:
        link = snap.pcie.get(device.pci_address) if device.pci_address else None
        dev_errors = _device_errors(snap, device)
        if users is not None:
            extra = (users_text(users, device.name),)
        for port in device.ports:
            errors = dev_errors + _port_errors(snap, port)
            rows.append(
                (
                    device.name,
                    str(port.number),
                    port.link_layer or "?",
                    _state_text(port),
                    _rate_text(port),
                    _netdev_text(snap.netdevs.get(port.netdev) if port.netdev else None, port.netdev),
                    _pcie_text(link),
                    ",".join(port_ipv4(port)) or "-",
                    ("-" if port.nccl_gid_index is None else str(port.nccl_gid_index)) if port.gid_table_size else "?",
                    _unreadable_text(errors),
                    *extra,
                )
            )
        if not device.ports:
            rows.append(
                (
                    device.name,
                    "-",
                    "?",
                    "no ports read",
                    "?",
                    "-",
                    _pcie_text(link),
                    "-",
                    "-",
                    _unreadable_text(dev_errors),
                    *extra,
                )
            )
    return rows


def format_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    for row in rows:
        lines.append("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def _error_json(e: ReadError) -> dict[str, Any]:
    return {"device": e.device, "port": e.port, "attribute": e.attribute, "reason": e.reason}


_NETDEV_FIELDS = ("name", "present", *(f for f in Netdev.__dataclass_fields__ if f != "name"))


def _missing_netdev_json(name: str) -> dict[str, Any]:
    """A netdev the port names (its GIDs' ndevs, device/net) that /sys/class/net does not show: it
    lives in another network namespace (a pod's). Listed, as the table lists it "(missing)"."""
    out: dict[str, Any] = dict.fromkeys(_NETDEV_FIELDS)
    out.update(name=name, present=False)
    return out


def _netdev_json(n: Netdev) -> dict[str, Any]:
    return {
        "name": n.name,
        "present": True,
        "ifindex": n.ifindex,
        "address": n.address,
        "mtu": n.mtu,
        "speed_mbps": n.speed_mbps,
        "operstate": n.operstate,
        "carrier": n.carrier,
        "carrier_changes": n.carrier_changes,
        "carrier_up_count": n.carrier_up_count,
        "carrier_down_count": n.carrier_down_count,
        "pci_address": n.pci_address,
    }


def _pcie_json(link: PcieLink | None) -> dict[str, Any] | None:
    if link is None:
        return None
    return {
        "current_speed_gts": link.current_speed_gts,
        "current_generation": pcie_generation(link.current_speed_gts),
        "current_width": link.current_width,
        "max_speed_gts": link.max_speed_gts,
        "max_generation": pcie_generation(link.max_speed_gts),
        "max_width": link.max_width,
        "upstream_max_speed_gts": link.upstream_max_speed_gts,
        "upstream_max_width": link.upstream_max_width,
    }


def gid_json(port: Port, entry: GidEntry) -> dict[str, Any]:
    return {
        "device": port.device,
        "port": port.number,
        "index": entry.index,
        "gid": entry.gid,
        "ipv4": entry.ipv4,
        "type": entry.type,
        "version": entry.version_label,
        "netdev": entry.netdev,
        "link_local": entry.is_link_local,
        "nccl_selected": entry.index == port.nccl_gid_index,
    }


def _gid_table_json(port: Port) -> dict[str, Any]:
    """Size, hash and NCCL's pick; all null when no slot could be read (unknown, not empty: the
    kernel gives every port a table)."""
    known = port.gid_table_size > 0
    return {
        "gid_table_size": port.gid_table_size if known else None,
        "gid_table_hash": port.gid_hash if known else None,
        "nccl_gid_index": port.nccl_gid_index if known else None,
    }


def _port_json(snap: Snapshot, port: Port) -> dict[str, Any]:
    return {
        "port": port.number,
        "link_layer": port.link_layer,
        "state": None if port.state is None else {"number": port.state.number, "name": port.state.name},
        "phys_state": None
        if port.phys_state is None
        else {"number": port.phys_state.number, "name": port.phys_state.name},
        "up": port.up,  # null while state or phys_state is unknown
        "rate": None
        if port.rate is None
        else {
            "gbps": port.rate.gbps,
            "lanes": port.rate.lanes,
            "speed": port.rate.speed,
            "per_lane_gbps": port.rate.per_lane_gbps,
            "bits_per_second": port.rate.bits_per_second,
        },
        "lid": port.lid,
        "netdevs": [
            _netdev_json(snap.netdevs[n]) if n in snap.netdevs else _missing_netdev_json(n) for n in port.netdevs
        ],
        "ipv4": port_ipv4(port),
        **_gid_table_json(port),
        "gids": [gid_json(port, e) for e in port.gids],
        "counters": {k: {"value": v.value, "saturated": v.saturated} for k, v in port.counters.items()},
        "hw_counters": dict(port.hw_counters),
        "unreadable": [_error_json(e) for e in _port_errors(snap, port)],
        "unsupported": [_error_json(e) for e in _port_unsupported(snap, port)],
    }


def show_json(snap: Snapshot, sysfs: str, users: ConsumerScan | None = None) -> dict[str, Any]:
    out = _show_json(snap, sysfs)
    if users is not None:  # only asked for: the key's absence means "not scanned", not "unused"
        for device in out["devices"]:
            device["users"] = consumers_json(users, device["name"])
        out["consumer_scan"] = scan_json(users)
    return out


def scan_json(users: ConsumerScan) -> dict[str, Any]:
    return {
        "at": users.at,
        "complete": users.complete,
        "processes_scanned": users.processes_scanned,
        "skipped": users.skipped,
        "source": users.source,  # procfs (every descriptor walked) or rdma_netlink (the kernel's verbs contexts)
    }


def _show_json(snap: Snapshot, sysfs: str) -> dict[str, Any]:
    return {
        "schema": JSON_SCHEMA,
        "sysfs": sysfs,
        "taken_at": snap.taken_at,
        "devices": [
            {
                "name": d.name,
                "node_guid": d.node_guid,
                "sys_image_guid": d.sys_image_guid,
                "fw_ver": d.fw_ver,
                "hca_type": d.hca_type,
                "board_id": d.board_id,
                "hw_rev": d.hw_rev,
                "node_type": None if d.node_type is None else {"number": d.node_type.number, "name": d.node_type.name},
                "node_desc": d.node_desc,
                "pci_address": d.pci_address,
                "pcie": _pcie_json(snap.pcie.get(d.pci_address) if d.pci_address else None),
                "hw_counters": dict(d.hw_counters),
                "netdevs": list(d.netdevs),
                "ports": [_port_json(snap, p) for p in d.ports],
                "unreadable": [_error_json(e) for e in _device_errors(snap, d)],
                "unsupported": [_error_json(e) for e in _device_unsupported(snap, d)],
            }
            for d in snap.devices
        ],
        "errors": [_error_json(e) for e in snap.errors],
        # Not provided by the driver (sources.availability): no value, and not a fault.
        "unsupported": [_error_json(e) for e in snap.unsupported],
    }


GID_COLUMNS = ("DEV", "PORT", "INDEX", "GID", "IPv4", "VER", "DEV", "NCCL")


def gid_rows(snap: Snapshot, device: str | None = None) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for port in snap.ports:
        if device is not None and port.device != device:
            continue
        for entry in port.gids:
            rows.append(
                (
                    port.device,
                    str(port.number),
                    str(entry.index),
                    entry.gid,
                    entry.ipv4 or "",
                    entry.version_label,
                    entry.netdev or "",
                    "<== NCCL" if entry.index == port.nccl_gid_index else "",
                )
            )
    return rows


def gids_json(snap: Snapshot, device: str | None = None) -> dict[str, Any]:
    return {
        "schema": JSON_SCHEMA,
        "gids": [gid_json(p, e) for p in snap.ports if device is None or p.device == device for e in p.gids],
        "ports": [
            {"device": p.device, "port": p.number, **_gid_table_json(p)}
            for p in snap.ports
            if device is None or p.device == device
        ],
    }
