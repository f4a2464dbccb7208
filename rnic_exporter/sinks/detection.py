"""Judgments and detection counters as Prometheus families (the catalogue's detection metrics)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from rnic_exporter.catalog import events as ev
from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.catalog.events import EVENT_SPECS
from rnic_exporter.detect.conditions import HostConditions, PortView
from rnic_exporter.model.host import IPV6_KEEP_ADDR_OFF, NETWORKMANAGER
from rnic_exporter.sinks.samples import Family, FamilyBuilder

RISK_REASONS = (NETWORKMANAGER, IPV6_KEEP_ADDR_OFF)
DEVICE_EVENTS = tuple(s.name for s in EVENT_SPECS if s.name.startswith("rnic.device."))
# rnic.device.discovered is raised by the very poll that first sees a device: no zero can precede it,
# and a device of the inventory never raises it again.
ZEROED_DEVICE_EVENTS = tuple(name for name in DEVICE_EVENTS if name != ev.DEVICE_DISCOVERED.name)
PORT_EVENTS = tuple(s.name for s in EVENT_SPECS if not s.name.startswith("rnic.device."))

# Which port events a port can raise (detect/diff.py), so only those counters are created at 0.
# Keyed on what does not change while the exporter runs (link layer, netdev, the configured NCCL
# index), never on the port's current state: a counter that comes and goes breaks increase().
_EVERY_PORT = (
    ev.GID_TABLE_CHANGED,
    ev.PORT_DOWN,
    ev.PORT_UP,
    ev.PORT_FLAPPING,
    ev.PORT_STABLE,
    ev.LINK_BELOW_RATED,
    ev.LINK_RESTORED,
)
# NCCL's RoCE path: IPv4 GIDs that move, the index it auto-selects and whether that GID crosses
# nodes; and the address managers that drop a RoCE netdev's addresses (an InfiniBand port's GIDs
# are not built from addresses).
_ROCE_PORT = (
    ev.GID_ADDRESS_MOVED,
    ev.NCCL_GID_INDEX_CHANGED,
    ev.NCCL_GID_UNUSABLE,
    ev.NCCL_GID_USABLE,
    ev.RISK_ADDRESS_LOSS,
)
_CONFIGURED_INDEX = (ev.NCCL_GID_INDEX_INVALID, ev.NCCL_GID_INDEX_VALID)  # NCCL_IB_GID_INDEX is set
_NETDEV_PORT = (ev.ADDRESS_LOST, ev.ADDRESS_RESTORED)  # addresses are a netdev's
# Link health (detect/link_health_events.py, judged by the daemon's `daemon/link_watch.py`): any port
# whose counters are read can degrade, and which counters a driver has is not known before they are read.
_LINK_HEALTH = (ev.PORT_DEGRADING, ev.PORT_RECOVERED)
# Every port event has a rule above (tests/sinks/test_series_budget.py holds the catalogue to that).
PORT_EVENT_RULES = (_EVERY_PORT, _ROCE_PORT, _CONFIGURED_INDEX, _NETDEV_PORT, _LINK_HEALTH)


def port_events(view: PortView) -> tuple[str, ...]:
    """The events `view`'s port can raise, in catalogue order."""
    possible = {s.name for s in (*_EVERY_PORT, *_LINK_HEALTH)}
    if view.link_layer == "Ethernet":
        possible.update(s.name for s in _ROCE_PORT)
    if view.configured_index is not None:  # set only for an Ethernet port (conditions.py)
        possible.update(s.name for s in _CONFIGURED_INDEX)
    if view.netdev is not None:
        possible.update(s.name for s in _NETDEV_PORT)
    return tuple(name for name in PORT_EVENTS if name in possible)


def detection_families(
    cur: HostConditions | None,
    gid_changes: Mapping[tuple[str, int], int],
    events: Mapping[tuple[str, str, str], int],
) -> Iterator[Family]:
    """`events` is keyed (event, device, port-as-text); every event a known port or device can raise
    (`port_events`) starts at 0, so an alert's increase() sees the first one (a counter born at 1 hides
    it); one that could not be foreseen still counts from 1."""
    out = FamilyBuilder()
    c = catalog
    if cur is not None:
        for view in cur.ports.values():
            pl = (view.device, str(view.port))
            for rated in view.rated:
                if rated.rate_bytes_per_second is not None:
                    out.add(c.PORT_RATED_RATE, (*pl, rated.source), rated.rate_bytes_per_second)
                if rated.lanes is not None:
                    out.add(c.PORT_RATED_WIDTH, (*pl, rated.source), rated.lanes)
            for judgement in view.links:
                out.add(c.LINK_BELOW_RATED, (*pl, judgement.link), 1 if judgement.below else 0)
            if view.netdev is not None:
                nl = (*pl, view.netdev)
                for address, present in sorted(view.expected.items()):
                    out.add(c.NETDEV_ADDRESS_PRESENT, (*nl, address), 1 if present else 0)
                if view.addresses is not None:
                    families = list(view.addresses.values())
                    for family in ("ipv4", "ipv6"):
                        out.add(c.NETDEV_ADDRESSES, (*nl, family), families.count(family))
                if view.link_layer == "Ethernet":
                    for reason in RISK_REASONS:
                        out.add(c.NETDEV_ADDRESS_LOSS_RISK, (*nl, reason), 1 if reason in view.risks else 0)
            for address, index in sorted(view.v2_ipv4_index.items()):
                out.add(c.GID_V2_IPV4_INDEX, (*pl, address), index)
            if view.configured_index_valid is not None:
                out.add(c.NCCL_CONFIGURED_GID_INDEX_VALID, pl, 1 if view.configured_index_valid else 0)
            if view.nccl_usable is not None:
                out.add(c.NCCL_GID_USABLE, pl, 1 if view.nccl_usable else 0)
            out.add(c.PORT_FLAPPING, pl, 1 if view.flapping else 0)
            out.add(c.GID_TABLE_CHANGES, pl, gid_changes.get(view.key, 0))
        for dev in sorted(cur.devices.values(), key=lambda d: d.key):
            out.add(c.DEVICE_PRESENT, (dev.name, dev.pci_address or ""), 1 if dev.present else 0)
    counts = dict(events)
    if cur is not None:
        for view in cur.ports.values():
            for name in port_events(view):
                counts.setdefault((name, view.device, str(view.port)), 0)
        for dev in cur.devices.values():
            for name in ZEROED_DEVICE_EVENTS:
                counts.setdefault((name, dev.name, ""), 0)
    for labels, count in sorted(counts.items()):
        out.add(c.EVENTS, labels, count)
    yield from out
