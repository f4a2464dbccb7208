"""A host's ports judged for link health from two snapshots, and what `check` says of them (pure).

`link_health.py` judges one port's two counter samples; this module pairs the ports of two
snapshots, adds what else is known of each port (below rated, PCIe AER errors, who uses it:
issue 31 item 4) and turns a degrading port into a `check` problem. The daemon (events) and
`check` (two reads a few seconds apart) both come through `judge_host`.
"""

from __future__ import annotations

from collections.abc import Mapping

from rnic_exporter.catalog.link_health import LinkHealthThresholds
from rnic_exporter.detect.conditions import HostConditions
from rnic_exporter.detect.link_health import CounterSample, PortFacts, PortHealth, judge_port
from rnic_exporter.detect.problems import Problem
from rnic_exporter.model.host import Snapshot


def below_rated(conditions: HostConditions | None) -> dict[tuple[str, int], tuple[str, ...]]:
    """Per port, its links judged below rated, as `port 200 Gb/s x4, rated 400 Gb/s x4 (config)`."""
    if conditions is None:
        return {}
    return {
        key: tuple(f"{j.link} {j.active}, rated {j.rated}" for j in view.links if j.below)
        for key, view in conditions.ports.items()
    }


def aer_totals(snap: Snapshot) -> dict[str, int]:
    """Per device, the PCIe AER errors (every severity) its function reported since boot."""
    out: dict[str, int] = {}
    for dev in snap.devices:
        link = snap.pcie.get(dev.pci_address) if dev.pci_address else None
        if link is not None:
            out[dev.name] = sum(count for _, count in link.aer_errors)
    return out


def judge_host(
    prev: Snapshot,
    cur: Snapshot,
    thresholds: LinkHealthThresholds,
    *,
    prev_at: float | None = None,
    cur_at: float | None = None,
    conditions: HostConditions | None = None,
    consumers: Mapping[str, tuple[str, ...]] | None = None,
) -> tuple[PortHealth, ...]:
    """Every port present in both snapshots, judged over the time between them: `prev_at`/`cur_at`
    when the caller timed the reads itself (a one-shot reader may hand back a snapshot object
    whose `taken_at` is older than its counters), else the snapshots' `taken_at`.
    `conditions`: the judgment of `cur` (below-rated links); `consumers`: workload names by device."""
    t0 = prev.taken_at if prev_at is None else prev_at
    t1 = cur.taken_at if cur_at is None else cur_at
    below = below_rated(conditions)
    aer = aer_totals(cur)
    out = []
    for dev in cur.devices:
        before = prev.device(dev.name)
        if before is None:
            continue
        for port in dev.ports:
            old = next((p for p in before.ports if p.number == port.number), None)
            if old is None:
                continue
            facts = PortFacts.of(
                dev,
                port,
                below_rated=below.get((dev.name, port.number), ()),
                aer_errors=aer.get(dev.name, 0),
                consumers=(consumers or {}).get(dev.name, ()),
            )
            health = judge_port(CounterSample.of(before, old, t0), CounterSample.of(dev, port, t1), facts, thresholds)
            if health is not None:
                out.append(health)
    return tuple(out)


def where(facts: PortFacts) -> str:
    return f"{facts.device} port {facts.port}" + (f" ({facts.netdev})" if facts.netdev else "")


def health_problems(healths: tuple[PortHealth, ...]) -> list[Problem]:
    """A problem per failing port: critical when a QP already exhausted its retries, a warning
    when the link or path is degrading. Congestion (ECN, CNPs, xmit wait) is never a problem."""
    out = []
    for health in healths:
        if not health.degrading:
            continue
        line = health.summary()
        if health.level == "critical":
            out.append(
                Problem(
                    "transport_retries_exceeded",
                    "critical",
                    where(health.facts),
                    f"a queue pair exhausted its transport retries: {line}",
                    "a job using this port has failed or hangs now (RETRY_EXC)",
                    "drain the node; look for the link errors and retransmissions behind it "
                    "(runbook RnicRoceRetriesExceeded), then restart the job from its checkpoint",
                )
            )
            continue
        out.append(
            Problem(
                "link_degrading",
                "warning",
                where(health.facts),
                f"the link is degrading: {line}",
                "the cable, transceiver or path is failing: jobs run slower and may hang or lose the link",
                "check the cable and transceiver (mlxlink, perfquery, ethtool -S); reseat or replace them "
                "(runbooks RnicLinkSymbolErrors, RnicRoceRetransmissions)",
                reason=",".join(v.signal for v in health.at("degrading")),
            )
        )
    return out
