"""The kernel's RoCE GID table bookkeeping (roce_gid_mgmt.c + cache.c), for the simulator.

- The first slots are reserved for the default GIDs (MAC-derived `fe80::`), one per GID type the
  device supports: 0 and 1 (v1, v2) on mlx5, 0 alone on rxe, which has RoCE v2 only.
- An address takes the lowest free non-reserved slot, one per type, v1 first (`find_gid` looks for
  the first NULL slot; there is no "the same GID goes back to its old slot").
- Deleting an address whose entry is still referenced leaves the slot PENDING_DEL (`del_gid` only
  marks it and drops the table's reference): it reads as the zero GID, with EINVAL from its
  gid_attrs, exactly as an empty slot, but is not free, so a re-added address lands higher. That is
  incident 1's "GID index incremented". The kernel lab showed who holds such a reference on 6.1: a
  QP past RTR (its address vector), an address handle, a bound rdma_cm id; a QP in INIT, a process
  waiting to connect, or a job that died on the delete (rxe fails its next send) hold none. Once the
  last reference goes the slot is freed, and the next add takes the lowest free slot again.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from rnic_exporter.model.host import ROCE_V1, ROCE_V2, ZERO_GID


def format_gid(raw: bytes) -> str:
    """16 bytes -> `%pI6`: eight 4-digit lowercase groups, never compressed."""
    h = raw.hex()
    return ":".join(h[i : i + 4] for i in range(0, 32, 4))


def mac_default_gid(mac: str) -> str:
    """MAC -> `fe80::` + EUI-64 (flip bit 0x02 of the first byte, insert ff:fe)."""
    b = bytes.fromhex(mac.replace(":", ""))
    eui = bytes([b[0] ^ 0x02]) + b[1:3] + b"\xff\xfe" + b[3:6]
    return format_gid(b"\xfe\x80" + bytes(6) + eui)


def address_gid(address: str) -> str:
    """IPv4 -> IPv4-mapped GID; IPv6 -> the address itself."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv4Address):
        return format_gid(bytes(10) + b"\xff\xff" + ip.packed)
    return format_gid(ip.packed)


@dataclass(slots=True)
class Slot:
    gid: str
    type: str
    netdev: str | None
    pending_delete: bool = False  # deleted but still referenced: zero GID, not free


@dataclass
class GidTable:
    size: int
    roce: bool = True  # False: InfiniBand link layer (no types per netdev, no pending state)
    slots: dict[int, Slot] = field(default_factory=dict)
    held: set[int] = field(default_factory=set)  # slots referenced by QPs (e.g. a running job)
    types: tuple[str, ...] = (ROCE_V1, ROCE_V2)  # the RoCE GID types the device supports (rxe: v2 only)

    def set_defaults(self, gid: str, netdev: str | None) -> None:
        if self.roce:
            for index, gid_type in enumerate(self.types):
                self.slots[index] = Slot(gid, gid_type, netdev)
        else:
            self.slots[0] = Slot(gid, ROCE_V1, None)

    def _free_slot(self) -> int:
        reserved = len(self.types) if self.roce else 1
        for index in range(reserved, self.size):
            if index not in self.slots:
                return index
        raise OSError(28, "ENOSPC: GID table full")  # __ib_cache_gid_add ... error=-28

    def add_address(self, address: str, netdev: str) -> list[int]:
        """Add a GID of each supported type for an address; a (GID, type, netdev) already present is a no-op."""
        gid = address_gid(address)
        placed = []
        for gid_type in self.types:
            existing = [
                i
                for i, s in self.slots.items()
                if s.gid == gid and s.type == gid_type and s.netdev == netdev and not s.pending_delete
            ]
            if existing:
                placed.append(existing[0])
                continue
            index = self._free_slot()
            self.slots[index] = Slot(gid, gid_type, netdev)
            placed.append(index)
        return placed

    def delete_address(self, address: str, netdev: str) -> None:
        gid = address_gid(address)
        for index, slot in list(self.slots.items()):
            if slot.gid == gid and slot.netdev == netdev and not slot.pending_delete:
                if index in self.held:
                    slot.pending_delete = True
                else:
                    del self.slots[index]

    def release(self, index: int) -> None:
        """The last reference went away (the job's QPs were destroyed): a pending slot is freed."""
        self.held.discard(index)
        slot = self.slots.get(index)
        if slot is not None and slot.pending_delete:
            del self.slots[index]

    def visible(self, index: int) -> Slot | None:
        """What sysfs shows for a slot: None for empty or pending-delete (zero GID, EINVAL)."""
        slot = self.slots.get(index)
        if slot is None or slot.pending_delete:
            return None
        return slot

    def gid_text(self, index: int) -> str:
        slot = self.visible(index)
        return ZERO_GID if slot is None else slot.gid

    def index_of(self, address: str, gid_type: str = ROCE_V2) -> int | None:
        gid = address_gid(address)
        for index in sorted(self.slots):
            slot = self.visible(index)
            if slot is not None and slot.gid == gid and slot.type == gid_type:
                return index
        return None
