"""Carries detection from poll to poll: the last judgment, flap history, counters and the state file."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

from rnic_exporter.catalog.events import Event
from rnic_exporter.detect.conditions import HostConditions, LinkJudgement, judge
from rnic_exporter.detect.diff import diff
from rnic_exporter.detect.flapping import FlapTracker
from rnic_exporter.detect.inputs import Inputs
from rnic_exporter.detect.settings import DetectionSettings
from rnic_exporter.detect.state import (
    Baseline,
    KnownAddress,
    KnownDevice,
    State,
    StateStore,
    device_key,
    merge,
    port_key,
    same_device,
)
from rnic_exporter.model.host import Snapshot

log = logging.getLogger("rnic_exporter.detect")

# last_seen is refreshed at this granularity so the state file is rewritten only when something
# real changes, not on every poll.
_SEEN_GRANULARITY_S = 300.0


STATE_ERROR_REASONS = ("corrupt", "foreign", "unreadable", "unwritable")


class Detector:
    def __init__(self, settings: DetectionSettings, store: StateStore) -> None:
        self.settings = settings
        self.store = store
        self.flaps = FlapTracker(settings.flap)
        self.last: HostConditions | None = None
        # Each link's last judgement, kept across the polls where it had none (its port down).
        self._links_seen: dict[tuple[str, int, str], LinkJudgement] = {}
        self.gid_changes: Counter[tuple[str, int]] = Counter()
        self.events: Counter[tuple[str, str, str]] = Counter()
        # Every reason at 0 from the start: a healthy host shows 0, not an absent series, so
        # `increase()` sees the first failure and alert rules need no `or vector(0)`.
        self.state_errors: Counter[str] = Counter(dict.fromkeys(STATE_ERROR_REASONS, 0))
        self._unsaved = True  # the first poll writes the file (a new or rebuilt state)
        self.learned = False  # the last observation changed the state: judging again may differ
        loaded = store.load()
        self.state: State = loaded.state
        if loaded.problem is not None:
            self.state_errors[loaded.reason or "corrupt"] += 1
            if store.withheld is not None:
                log.error("state file unreadable; it is kept, not rewritten", extra={"fields": {"err": loaded.problem}})
            else:
                log.warning("state file rebuilt", extra={"fields": {"err": loaded.problem}})

    def reconfigure(self, settings: DetectionSettings) -> None:
        self.settings = settings
        self.flaps.settings = settings.flap

    def observe(self, snap: Snapshot, inputs: Inputs | None = None) -> list[Event]:
        inputs = inputs or Inputs()
        now = snap.taken_at
        flapping = {(p.device, p.number): self.flaps.observe((p.device, p.number), p.up, now) for p in snap.ports}
        self.flaps.forget(set(flapping))
        cur = judge(
            snap,
            self.state,
            self.settings,
            addresses=inputs.addresses,
            advertised=inputs.advertised,
            risks=inputs.risks,
            flapping=flapping,
        )
        events = diff(self.last, cur, self._links_seen)
        for view in cur.ports.values():
            for judgement in view.links:
                self._links_seen[(view.device, view.port, judgement.link)] = judgement
        self.count(events)
        self.last = cur
        self.learned = self._learn(snap, cur)
        if self.learned:
            self._save()
        return events

    def count(self, events: Sequence[Event]) -> None:
        """Count events in `rnic_events_total`: this detector's own, and those judged beside it
        (link health, `daemon/link_watch.py`)."""
        for event in events:
            self.events[(event.name, event.device, "" if event.port is None else str(event.port))] += 1
            if event.name == "rnic.gid.table_changed" and event.port is not None:
                self.gid_changes[(event.device, event.port)] += 1

    def _learn(self, snap: Snapshot, cur: HostConditions) -> bool:
        """Fold this poll into the state; True when something changed (the file is then rewritten)."""
        before = self._fingerprint()
        self._learn_into(snap, cur)
        after = self._fingerprint()
        if after == before and not self._unsaved:
            return False
        self._unsaved = True
        return True

    def _fingerprint(self) -> tuple[object, ...]:
        """Cheap summary of everything _learn_into may change (counts, sums, times, indices)."""
        state = self.state
        devices = tuple((k, d.name, d.last_seen, d.node_guid, d.hca_type, d.board_id) for k, d in state.devices.items())
        baselines = tuple((k, b.rate_bytes_per_second, b.lanes) for k, b in state.baselines.items())
        addresses = tuple(
            (k, a, s.netdev, s.last_seen, s.v2_index) for k, v in state.addresses.items() for a, s in v.items()
        )
        return devices, baselines, addresses

    def _learn_into(self, snap: Snapshot, cur: HostConditions) -> None:
        now = snap.taken_at
        state = self.state
        # Aliases exist only where a side lacks a PCI address: on most hosts none, and no search.
        pciless = any(d.pci_address is None for d in state.devices.values())
        for dev in snap.devices:
            key = device_key(dev)
            aliases = (
                [k for k, d in state.devices.items() if k != key and same_device(d, dev)]
                if pciless or dev.pci_address is None
                else []
            )
            for alias in aliases:
                if dev.pci_address is None:
                    key = alias  # its `device` link fails now: it stays the entry under its PCI address
                    continue
                # An entry made under its node GUID while the link failed: the device, healed, is
                # known under its PCI address from now on (the GUID entry would page "disappeared").
                phantom = state.devices.pop(alias)
                if key not in state.devices:
                    phantom.pci_address = dev.pci_address
                    state.devices[key] = phantom
            known = state.devices.get(key)
            if known is None:
                state.devices[key] = KnownDevice(
                    dev.name, dev.pci_address, dev.node_guid, dev.hca_type, dev.board_id, first_seen=now, last_seen=now
                )
            else:
                known.name, known.node_guid = dev.name, dev.node_guid or known.node_guid
                known.hca_type, known.board_id = dev.hca_type or known.hca_type, dev.board_id or known.board_id
                if now - known.last_seen >= _SEEN_GRANULARITY_S:
                    known.last_seen = now
            for port in dev.ports:
                pk = port_key(dev.name, port.number)
                if port.is_up and port.rate is not None:
                    best = state.baselines.get(pk)
                    if best is None or (port.rate.bytes_per_second, port.rate.lanes) > (
                        best.rate_bytes_per_second,
                        best.lanes,
                    ):
                        state.baselines[pk] = Baseline(port.rate.bytes_per_second, port.rate.lanes)
        for key in [k for k, d in state.devices.items() if d.name in snap.filtered_out]:
            # Left out by the device filter (a reload or restart with device_exclude): an operator's
            # choice, not a lost NIC. Out of the inventory, so it is never "disappeared" (also once
            # removed while filtered out); its ports' baselines stay for when it is monitored again.
            log.info("device left out by the filter; dropped from the inventory", extra={"fields": {"device": key}})
            del state.devices[key]
        for view in cur.ports.values():
            if view.addresses is None or view.netdev is None:
                continue
            pk = port_key(view.device, view.port)
            remembered = state.addresses.setdefault(pk, {})
            for address, present in view.expected.items():
                if not present:
                    continue
                known_address = remembered.get(address)
                index = view.v2_ipv4_index.get(address)
                if known_address is None:
                    remembered[address] = KnownAddress(view.netdev, now, index)
                    continue
                if index is not None:
                    known_address.v2_index = index
                if now - known_address.last_seen >= _SEEN_GRANULARITY_S or known_address.netdev != view.netdev:
                    known_address.last_seen, known_address.netdev = now, view.netdev
            for address in [
                a
                for a, k in remembered.items()
                if a not in view.addresses and now - k.last_seen > self.settings.address_forget_after_s
            ]:
                log.info(
                    "forgetting an address missing too long",
                    extra={"fields": {"device": view.device, "port": view.port, "address": address}},
                )
                del remembered[address]
            if not remembered:
                del state.addresses[pk]

    def _save(self) -> None:
        if self.store.withheld is not None and not self._readable_again():
            self.state_errors["unreadable"] += 1
            return
        try:
            self.store.save(self.state)
            self._unsaved = False
        except OSError as exc:
            self.state_errors["unwritable"] += 1
            if self.state_errors["unwritable"] == 1 or self.state_errors["unwritable"] % 100 == 0:
                log.error(
                    "cannot write the state file; the inventory will not survive a restart",
                    extra={"fields": {"path": str(self.store.path), "err": exc.strerror or str(exc)}},
                )

    def _readable_again(self) -> bool:
        """Whether the unreadable state file reads now; if so, what it holds is taken back, with
        what was learned meanwhile added, and saving resumes."""
        loaded = self.store.load()
        if self.store.withheld is not None:
            return False
        self.state = merge(loaded.state, self.state)
        if loaded.problem is not None:  # it reads, but is corrupt: moved aside, as at start-up
            self.state_errors[loaded.reason or "corrupt"] += 1
        log.warning("state file readable again; saving resumes", extra={"fields": {"path": str(self.store.path)}})
        return True
