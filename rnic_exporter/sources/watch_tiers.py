"""What a fast pass that trusts announcements reads, in tiers by detection-latency budget.

Nothing announces these, so they are polled; each at the slowest rate that meets its failure
class's budget (docs/detection.md#detection-latency-budget):
- `port`: an InfiniBand port's state, physical state and rate (a port down or below rated,
  <= 5 s): every pass (`--poll.interval`);
- `pcie`: the PCIe link's current speed and width and its AER counts (a downtrained link, AER
  errors, <= 30 s): every `--poll.pcie-interval`;
- `gids`: an InfiniBand GID table, its populated slots' files and all its empty slots (<= 60 s;
  NCCL addresses InfiniBand peers by LID, the GID-shift incident is RoCE's): every
  `--poll.gid-interval`.
A tier whose period is due within `DUE_SLACK_S` is read now rather than on a wake-up of its own.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from rnic_exporter.sources.plan import GroupKind, ReadPlan
from rnic_exporter.sources.sysfs import Raw, ReadBatch

# The daemon wakes at a tier's due time (daemon/schedule.py), a little after it, or on the fast
# interval a little before it: a read due this soon is made by the pass at hand.
DUE_SLACK_S = 0.5


class TierKind(enum.Enum):
    PORT = "port"  # InfiniBand port state, physical state, rate: every pass
    PCIE = "pcie"  # PCIe link speed and width, AER counts: every pcie_s
    GIDS = "gids"  # InfiniBand GID tables: every ib_gids_s


@dataclass(slots=True)
class Tier:
    """Plan slots read together, compared byte for byte with what the last read found."""

    kind: TierKind
    index: list[int] = field(default_factory=list)  # plan slot of each file
    states: list[int] = field(default_factory=list)  # positions in `index` whose change re-reads GID tables
    gid_ports: list[int] = field(default_factory=list)  # ports whose empty GID slots this tier sweeps
    raws: list[Raw | None] = field(default_factory=list)
    due: float = float("-inf")  # (reader clock) when it is read next; -inf: on the next pass
    batch: ReadBatch = field(default_factory=lambda: ReadBatch([]))

    @property
    def empty(self) -> bool:
        return not self.index and not self.gid_ports

    def is_due(self, now: float) -> bool:
        return self.kind is TierKind.PORT or now + DUE_SLACK_S >= self.due


def plan_tiers(
    plan: ReadPlan,
    announced: set[int],
    port_states: frozenset[str],
    previous: Sequence[Tier] = (),
) -> list[Tier]:
    """The tiers of `plan`'s watched files: what nothing announces. `announced` are the ports whose
    state, rate and GIDs rtnetlink announces (RoCE ports with a netdev); `port_states` the port
    files whose change re-reads the whole GID tables. Due times carry over from `previous`."""
    tiers = {kind: Tier(kind) for kind in TierKind}
    for group in plan.groups:
        kind, number = group.key.kind, group.key.port
        if kind is GroupKind.NETDEV or (kind in (GroupKind.PORT, GroupKind.GIDS) and number in announced):
            continue
        if kind is GroupKind.GIDS and number is not None:
            tier = tiers[TierKind.GIDS]
            tier.gid_ports.append(number)
            tier.states.extend(range(len(tier.index), len(tier.index) + group.end - group.start))
            tier.index.extend(range(group.start, group.end))
            continue
        tier = tiers[TierKind.PCIE if kind is GroupKind.PCIE else TierKind.PORT]
        for i in range(group.start, group.end):
            name = plan.rels[i].rsplit("/", 1)[1]
            if name in group.watched:
                if name in port_states:
                    tier.states.append(len(tier.index))
                tier.index.append(i)
    dues = {tier.kind: tier.due for tier in previous}
    out = []
    for tier in tiers.values():
        tier.due = dues.get(tier.kind, float("-inf"))
        tier.batch = ReadBatch([plan.rels[i] for i in tier.index])
        out.append(tier)
    return out
