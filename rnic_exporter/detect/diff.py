"""Two judgments in, events out. Pure: the same pair always gives the same events.

`prev` is None for the first judgment after start. Then only conditions are reported (a device of
the inventory that is missing, a slow link, an invalid configured index, a risk, an expected
address that is gone), never transitions, because nothing was seen to change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from rnic_exporter.catalog import events as ev
from rnic_exporter.catalog.events import Event
from rnic_exporter.detect.conditions import HostConditions, LinkJudgement, PortView

# The last judgement of each link (device, port, link) before this one, kept by the caller: a link
# judged below rated, then not judged while its port was down (a renegotiation drops the carrier),
# then judged at full speed is restored, and one judged below again is not a new degradation.
LinkMemory = Mapping[tuple[str, int, str], LinkJudgement]


def diff(prev: HostConditions | None, cur: HostConditions, links_seen: LinkMemory | None = None) -> list[Event]:
    out: list[Event] = []
    _devices(prev, cur, out)
    # A name can be both: the card that left and another one registered under its name (a replaced
    # NIC in another slot). The one present is judged; the other's absence must not mute it.
    gone = {d.name for d in cur.devices.values() if not d.present} - {d.name for d in cur.devices.values() if d.present}
    for key, port in cur.ports.items():
        if port.device in gone:
            continue
        _port(prev.ports.get(key) if prev else None, port, out, links_seen or {})
    return [replace(e, time=cur.time) for e in out]


def _devices(prev: HostConditions | None, cur: HostConditions, out: list[Event]) -> None:
    for key, dev in cur.devices.items():
        before = prev.devices.get(key) if prev else None
        where = f"{dev.name} ({dev.pci_address or 'no PCI address'})"
        if not dev.present and (before is None or before.present):
            out.append(
                Event(
                    ev.DEVICE_DISAPPEARED,
                    f"RDMA device {where} disappeared",
                    dev.name,
                    pci_address=dev.pci_address,
                    before="present",
                    after="absent",
                )
            )
        elif dev.present and before is not None and not before.present:
            out.append(
                Event(
                    ev.DEVICE_REAPPEARED,
                    f"RDMA device {where} is back",
                    dev.name,
                    pci_address=dev.pci_address,
                    before="absent",
                    after="present",
                )
            )
        elif dev.present and not dev.known and before is None:
            out.append(
                Event(
                    ev.DEVICE_DISCOVERED,
                    f"RDMA device {where} added to the inventory",
                    dev.name,
                    pci_address=dev.pci_address,
                )
            )


def _on(
    port: PortView,
    spec: ev.EventSpec,
    message: str,
    *,
    before: str | None = None,
    after: str | None = None,
    attributes: dict[str, str] | None = None,
    severity: ev.Severity | None = None,
) -> Event:
    return Event(
        spec,
        message,
        port.device,
        port=port.port,
        netdev=port.netdev,
        pci_address=port.pci_address,
        before=before,
        after=after,
        attributes=attributes or {},
        severity_override=severity,
    )


def _port(p: PortView | None, c: PortView, out: list[Event], links_seen: LinkMemory) -> None:
    where = c.where
    if p is not None and p.gid_hash is not None and c.gid_hash is not None and p.gid_hash != c.gid_hash:
        out.append(
            _on(c, ev.GID_TABLE_CHANGED, f"GID table of {where} changed", before=str(p.gid_hash), after=str(c.gid_hash))
        )
    for address, (old, new) in sorted(c.moved.items()):
        out.append(
            _on(
                c,
                ev.GID_ADDRESS_MOVED,
                f"RoCE v2 GID of {address} on {where} moved from index {old} to {new}; NCCL jobs "
                f"using index {old} will fail",
                before=str(old),
                after=str(new),
                attributes={"address": address},
            )
        )
    if p is not None and p.nccl_index != c.nccl_index:
        old_text, new_text = _index(p.nccl_index), _index(c.nccl_index)
        out.append(
            _on(
                c,
                ev.NCCL_GID_INDEX_CHANGED,
                f"NCCL would now auto-select GID index {new_text} on {where} (was {old_text})",
                before=old_text,
                after=new_text,
            )
        )
    if c.configured_index_valid is False and (p is None or p.configured_index_valid is not False):
        out.append(
            _on(
                c,
                ev.NCCL_GID_INDEX_INVALID,
                f"NCCL_IB_GID_INDEX={c.configured_index} points at {c.configured_index_fault} on {where}: "
                f"{c.configured_index_content}",
                after=c.configured_index_content,
                attributes={"gid_index": str(c.configured_index)},
            )
        )
    elif c.configured_index_valid is True and p is not None and p.configured_index_valid is False:
        out.append(
            _on(
                c,
                ev.NCCL_GID_INDEX_VALID,
                f"NCCL_IB_GID_INDEX={c.configured_index} is valid again on {where}",
                after=c.configured_index_content,
                attributes={"gid_index": str(c.configured_index)},
            )
        )
    _nccl_pick(p, c, where, out)
    _addresses(p, c, where, out)
    if p is not None and p.up is True and c.up is False:
        out.append(_on(c, ev.PORT_DOWN, f"{where} is down", before="up", after="down"))
    elif p is not None and p.up is False and c.up is True:
        out.append(_on(c, ev.PORT_UP, f"{where} is up", before="down", after="up"))
    if c.flapping and not (p is not None and p.flapping):
        out.append(_on(c, ev.PORT_FLAPPING, f"{where} is flapping"))
    elif p is not None and p.flapping and not c.flapping:
        out.append(_on(c, ev.PORT_STABLE, f"{where} stopped flapping"))
    for judgement in c.links:
        before = p.link(judgement.link) if p else None
        if before is None:
            before = links_seen.get((c.device, c.port, judgement.link))
        _link(before, c, judgement, where, out)
    for risk in sorted(c.risks - (p.risks if p is not None else frozenset())):
        out.append(
            _on(
                c,
                ev.RISK_ADDRESS_LOSS,
                f"addresses of {where} can vanish on a port flap: {RISK_TEXT[risk]}",
                attributes={"reason": risk},
            )
        )


RISK_TEXT = {
    "networkmanager": "NetworkManager manages the netdev and removes its addresses on carrier loss",
    "ipv6_keep_addr_on_down_off": "net.ipv6.conf keep_addr_on_down is off, so an admin down deletes IPv6 GIDs",
}


def _nccl_pick(p: PortView | None, c: PortView, where: str, out: list[Event]) -> None:
    """Unusable is a condition (reported on the first judgment too); usable again only after unusable.
    A port that left NCCL's view (down, table unreadable) ends neither: nothing was seen to change."""
    pick = c.judged_pick
    if pick is None:
        return
    before = p.judged_pick if p is not None else None
    how = f"NCCL_IB_GID_INDEX={pick.index}" if pick.configured else "NCCL's auto-selection"
    attributes = {"gid_index": _index(pick.index)}
    if not pick.usable and (before is None or before.usable):
        attributes["reason"] = pick.problem or ""
        out.append(
            _on(
                c,
                ev.NCCL_GID_UNUSABLE,
                f"{how} on {where}: {pick.content}, {(pick.problem or '').replace('_', ' ')}; "
                "NCCL connections across nodes fail",
                before=None if before is None else before.content,
                after=pick.content,
                attributes=attributes,
            )
        )
    elif pick.usable and before is not None and not before.usable:
        out.append(
            _on(
                c,
                ev.NCCL_GID_USABLE,
                f"{how} on {where}: {pick.content} again",
                before=before.content,
                after=pick.content,
                attributes=attributes,
            )
        )


def _index(value: int | None) -> str:
    return "none" if value is None else str(value)


def _addresses(p: PortView | None, c: PortView, where: str, out: list[Event]) -> None:
    for address, present in sorted(c.expected.items()):
        before = p.expected.get(address) if p is not None else None
        family = "ipv6" if ":" in address else "ipv4"
        if not present and before is not False:
            state = "up" if c.up else "down" if c.up is False else "unknown"
            out.append(
                _on(
                    c,
                    ev.ADDRESS_LOST,
                    f"{address} left {where} while the port was {state}",
                    before="present",
                    after="absent",
                    attributes={"address": address, "family": family, "port_state": state},
                    severity="critical" if c.up else "warning",
                )
            )
        elif present and before is False:
            out.append(
                _on(
                    c,
                    ev.ADDRESS_RESTORED,
                    f"{address} is back on {where}",
                    before="absent",
                    after="present",
                    attributes={"address": address, "family": family},
                )
            )


def _link(p: LinkJudgement | None, port: PortView, c: LinkJudgement, where: str, out: list[Event]) -> None:
    if c.below and (p is None or not p.below):
        out.append(
            _on(
                port,
                ev.LINK_BELOW_RATED,
                f"{c.link} link of {where} runs at {c.active}, rated {c.rated}",
                before=c.rated,
                after=c.active,
                attributes={"link": c.link, "source": c.source},
            )
        )
    elif not c.below and p is not None and p.below:
        out.append(
            _on(
                port,
                ev.LINK_RESTORED,
                f"{c.link} link of {where} is back at {c.active}",
                before=p.active,
                after=c.active,
                attributes={"link": c.link, "source": c.source},
            )
        )
