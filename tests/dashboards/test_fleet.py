"""A fleet in a real Prometheus: every fleet panel query returns the hosts carrying the faults of incidents.md,
and every alert expression finds exactly the injected ones at the injected times.

The fleet is backfilled with promtool (OpenMetrics, then the recording rules evaluated into blocks) and
served by a real Prometheus; see tests/support/fleet.py. Here it is 100 hosts x 8 RNICs over 40 minutes
at a 60 s step (about 1.6 million samples; about 12 s on this 2-core machine, under 2 minutes on shared cores):
promtool parses OpenMetrics at about 0.3 million samples per core-second, and 1,000 hosts x 8 RNICs over
even one hour is 15 million. `bench/fleet.py` loads the full fleet and times the panel queries.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from rnic_exporter.dashboards import generate, recording
from tests.support.dashboards import ALERT_RULES, panels, substitute
from tests.support.fleet import ADDRESS_GONE_S, NONFATAL_APART_S, PORT_DOWN_S, REPO, Fleet, loaded, query
from tests.support.processes import Prometheus

pytestmark = pytest.mark.e2e

NOW = int(time.time()) // 60 * 60
# On a 2-hour block boundary, so promtool parses the text twice (bounds, one block), not three times.
FLEET = Fleet(hosts=100, start=(NOW - 2700) // 7200 * 7200, duration=2400, step=60)
G = FLEET.at("gid_shift")
AER_F, AER_N, AER_C = FLEET.at("aer_fatal"), FLEET.at("aer_nonfatal"), FLEET.at("aer_correctable")
DRIFT, STORM = FLEET.at("optic_drift"), FLEET.at("pause")
# increase(...[10m]) > 0 sees an AER error from its sample until the range no longer holds the sample before
# it, a step earlier: 10 minutes less a step after it. (Exactly then Prometheus 2's closed range still holds
# it, 3's left-open one does not: the check times stay off that second.)
AER_SEEN_S = 600 - FLEET.step
INF = math.inf
Key = tuple[str, str]  # (instance, device); device "" for a node-level series


@pytest.fixture(scope="module")
def prom() -> Iterator[Prometheus]:
    with loaded(FLEET, timeout=300) as (server, timings):
        print(f"fleet loaded: {timings}")
        yield server


def _hosts(kind: str) -> set[str]:
    return {FLEET.instance(f.host) for f in FLEET.of(kind)}


def _ports(kind: str) -> list[Key]:
    return [(FLEET.instance(f.host), FLEET.device(f.device)) for f in FLEET.of(kind)]


def _every_rnic(kind: str) -> list[Key]:
    return [(FLEET.instance(f.host), FLEET.device(d)) for f in FLEET.of(kind) for d in range(FLEET.rnics)]


# --- alerts -----------------------------------------------------------------------------------------------

# alert -> (from, until, series): when its expression must find which (instance, device) series; none else.
# The windows come from each rule: 15 minutes of changes() see the flap's first change until 16 minutes
# after it (the last change is 2 minutes later) and the index move until 14 minutes after it (samples
# either side of the gap). AER: see AER_SEEN_S; the correctable stream (20 a minute) is above the rule's
# 1 a minute over 15 minutes from its first sample, a step after it starts (the alert, for: 15m, from 15
# minutes later). The windows are the expressions', as for every rule here: `for:` is not evaluated.
WINDOWS: dict[str, list[tuple[float, float, list[Key]]]] = {
    "RnicNcclGidIndexInvalid": [(FLEET.at("nccl"), INF, _every_rnic("nccl"))],
    "RnicPcieLinkDowntrained": [(FLEET.at("pcie"), INF, _ports("pcie"))],
    "RnicLinkBelowRated": [(FLEET.at("speed"), INF, _ports("speed") * 2)],  # link=port and link=netdev
    "RnicLinkFarBelowRated": [(FLEET.at("speed"), INF, _ports("speed"))],
    "RnicDeviceDisappeared": [(FLEET.at("gone"), INF, _ports("gone"))],
    "RnicPortDown": [(G, G + PORT_DOWN_S, _ports("gid_shift"))],
    "RnicAddressLost": [(G + PORT_DOWN_S, G + ADDRESS_GONE_S, _ports("gid_shift"))],
    "RnicNcclGidUnusable": [(G, G + ADDRESS_GONE_S, _ports("gid_shift"))],
    "RnicGidTableChanged": [(G, G + 16 * 60, _ports("gid_shift"))],
    "RnicGidIndexMoved": [(G + ADDRESS_GONE_S, G + 14 * 60, _ports("gid_shift"))],
    "RnicAddressLossRisk": [(-INF, INF, _every_rnic("gid_shift"))],  # NetworkManager: the cause, always there
    "RnicPcieAerFatalErrors": [(AER_F, AER_F + AER_SEEN_S, _ports("aer_fatal"))],
    "RnicPcieAerNonFatalErrors": [(AER_N, AER_N + NONFATAL_APART_S + AER_SEEN_S, _ports("aer_nonfatal"))],
    "RnicPcieAerCorrectableRising": [(AER_C + FLEET.step, INF, _ports("aer_correctable"))],
    # The degraded link's symbol errors (2/s: BER 1e-11 at 200 Gb/s, 7,200 an hour) and receive errors
    # (1/s) count from its first sample after the renegotiation, a step after it.
    "RnicLinkSymbolErrors": [(FLEET.at("speed") + FLEET.step, INF, _ports("speed"))],
    "RnicPortReceiveErrors": [(FLEET.at("speed") + FLEET.step, INF, _ports("speed"))],
    # The wire. A lane below its module's low warning: from the sample on. A drift (half its median, above the
    # warning) until the median over the fleet's samples catches up with the new value: while the port has
    # more samples before the drift than since it (one less, as the median of an even count is the mean of
    # the middle two). The same low lane is below half its median too: only `unless` keeps the drift silent
    # there. Lanes the host takes dark (optic_dark: 0 W, no level, rnic_module_lane_active 0) fire nothing,
    # though 0 W is below half their median: the rule's second `unless`. FEC: from the first sample with an
    # uncorrectable block, a step after the fault. The pause storm: from when the 5-minute rate holds it whole
    # (before, Prometheus 2's closed range and 3's left-open one cross 0.5 at different seconds: no check time
    # falls there).
    "RnicOpticRxPowerLow": [(FLEET.at("optic_low"), INF, _ports("optic_low"))],
    "RnicOpticRxPowerDrifting": [(DRIFT, DRIFT + (DRIFT - FLEET.start) - FLEET.step, _ports("optic_drift"))],
    "RnicFecUncorrectableRising": [(FLEET.at("fec") + FLEET.step, INF, _ports("fec"))],
    "RnicPauseStorm": [(STORM + 300, INF, _ports("pause"))],
}
# Never injected, but their metrics are in the fleet (up, last poll, read stuck, flapping): they must stay silent.
# (The AER alerts must also stay silent on the counts every twelfth host had before the exporter started.)
SILENT = {
    "RnicExporterDown",
    "RnicExporterPollStalled",
    "RnicAttributeUnreadable",
    "RnicDeviceReadStuck",
    "RnicExporterNeverPolled",
    "RnicPortFlapping",
    "RnicExporterConfigReloadFailed",
    "RnicExporterStateUnwritable",
    "RnicExporterEventSourceFailing",
    # The degraded link retransmits 0.5/s, below the 1/s of a port without packet counters; nothing retrains,
    # drops or exhausts its retries.
    "RnicRoceRetransmissions",
    "RnicLinkRetrained",
    "RnicRoceRetriesExceeded",
    "RnicReceiveDrops",
}
# Before any fault, in each fault, after the flap, and past the 5-minute lookback of the NIC that vanished;
# the AER ones either side of each window's edges (off the second a range's edge falls on a sample).
CHECK_TIMES = {
    "before any fault": FLEET.start + 300,
    "nccl index configured wrong": FLEET.at("nccl") + 120,
    "pcie downtrained": FLEET.at("pcie") + 120,
    "speed below rated": FLEET.at("speed") + 120,
    "gid shift: port down": G,
    "gid shift: port up, address missing": G + PORT_DOWN_S,
    "gid shift: address back at another index": G + 300,
    "NIC gone": FLEET.at("gone") + 360,
    "aer correctable: the second before the stream's first sample": AER_C + FLEET.step - 1,
    "aer correctable: the stream's first sample": AER_C + FLEET.step,
    "aer fatal: the second before": AER_F - 1,
    "aer fatal: the error": AER_F,
    "aer fatal: the last half minute in range": AER_F + AER_SEEN_S - 30,
    "aer fatal: out of range": AER_F + AER_SEEN_S + 30,
    "aer nonfatal: the first error": AER_N,
    "aer nonfatal: the last half minute in range": AER_N + NONFATAL_APART_S + AER_SEEN_S - 30,
    "aer nonfatal: out of range": AER_N + NONFATAL_APART_S + AER_SEEN_S + 30,
    "optic drift: its last minute": DRIFT + (DRIFT - FLEET.start) - 2 * FLEET.step,
    "optic drift: the median caught up": DRIFT + (DRIFT - FLEET.start) - FLEET.step,
    "optic low": FLEET.at("optic_low"),
    "optic dark: lanes taken dark on purpose": FLEET.at("optic_dark") + 120,
    "pause storm: the rate holds it whole": STORM + 300,
    "end": FLEET.end,
}


def _expected(alert: str, at: float) -> Counter[Key]:
    found: Counter[Key] = Counter()
    for start, until, keys in WINDOWS.get(alert, []):
        if start <= at < until:
            found.update(keys)
    return found


def _keys(result: list[dict[str, Any]]) -> Counter[Key]:
    return Counter((r["metric"].get("instance", ""), r["metric"].get("device", "")) for r in result)


def test_every_alert_is_injected_or_known_silent() -> None:
    assert set(WINDOWS) | SILENT == {rule["alert"] for rule in ALERT_RULES}
    assert not set(WINDOWS) & SILENT
    # Each injected window holds at least one check time, so each expression is seen firing.
    for alert, windows in WINDOWS.items():
        for start, until, _ in windows:
            assert any(start <= at < until for at in CHECK_TIMES.values()), alert
    # Prometheus 2 and 3 differ on the second an increase()'s range loses a sample: no check time there.
    for alert in ("RnicPcieAerFatalErrors", "RnicPcieAerNonFatalErrors"):
        assert not {until for _, until, _ in WINDOWS[alert]} & set(CHECK_TIMES.values()), alert
    # ... and on when a 5-minute rate() first crosses 0.5 in the pause storm's first five minutes.
    assert not [at for at in CHECK_TIMES.values() if STORM <= at < STORM + 300]


@pytest.mark.parametrize("rule", ALERT_RULES, ids=lambda rule: str(rule["alert"]))
def test_alert_expression_finds_exactly_the_injected_series(prom: Prometheus, rule: dict[str, Any]) -> None:
    alert = rule["alert"]
    fired_somewhere = False
    for when, at in CHECK_TIMES.items():
        got = _keys(query(prom, rule["expr"], at))
        assert got == _expected(alert, at), f"{alert} at '{when}' (t={at - FLEET.start:+}s): {sorted(got.elements())}"
        fired_somewhere |= bool(got)
    assert fired_somewhere == (alert not in SILENT)


# --- fleet dashboard panels -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """What a panel query returns at `at` over the time range `range_s`: one number, or instance -> value
    (one row or line per node; only `hosts` are compared when `values` is None)."""

    at: float
    number: float | None = None
    hosts: frozenset[str] | None = None
    per_host: dict[str, float] | None = None
    labels: dict[str, float] | None = None  # by the one label that is not the instance (e.g. link)
    top: int | None = None  # that many series, of `hosts` (a topk among equals)
    range_s: int = FLEET.duration


ALL = frozenset(FLEET.instance(h) for h in range(FLEET.hosts))
GONE = frozenset(_hosts("gone"))
GID = frozenset(_hosts("gid_shift"))
SPEED = frozenset(_hosts("speed"))
PER_HOST_DEVICES = {i: float(FLEET.rnics - (i in GONE)) for i in ALL}
E = FLEET.end
# The recording rules run at an offset within their minute (13 s here), so the minute-long port-down is in
# the recorded series from some second of that minute on: look at its last second.
DOWN = G + PORT_DOWN_S - 1

# (panel title, refId) -> checks. Every target of the fleet dashboard is here (a test says so).
PANELS: dict[tuple[str, str], list[Check]] = {
    ("RNICs missing", "A"): [Check(E, number=len(GONE)), Check(FLEET.start + 300, number=0)],
    ("Ports not up", "A"): [Check(DOWN, number=len(GID)), Check(E, number=0)],
    ("Links below rated", "A"): [
        Check(E, labels={"port": len(SPEED), "netdev": len(SPEED), "pcie": len(_hosts("pcie"))}),
        Check(FLEET.start + 300, labels={"port": 0, "netdev": 0, "pcie": 0}),
    ],
    ("Flapping ports", "A"): [Check(E, number=0)],
    ("NetworkManager risk", "A"): [Check(E, number=len(GID) * FLEET.rnics)],
    ("RNICs present vs known per node", "A"): [Check(E, per_host=PER_HOST_DEVICES)],
    ("RNICs present vs known per node", "B"): [Check(E, per_host=dict.fromkeys(ALL, float(FLEET.rnics)))],
    ("RNICs present vs known per node", "C"): [Check(E, per_host=PER_HOST_DEVICES)],
    ("RNICs present vs known per node", "D"): [
        Check(E, per_host=dict.fromkeys(ALL, 0.0)),
        Check(DOWN, per_host={i: float(i in GID) for i in ALL}),
    ],
    ("Ports not up per node", "A"): [Check(DOWN, per_host=dict.fromkeys(GID, 1)), Check(E, hosts=frozenset())],
    ("Ports with GID table changes", "A"): [Check(E, number=len(GID)), Check(G - 120, number=0, range_s=600)],
    ("Addresses whose RoCE v2 index moved", "A"): [Check(E, number=len(GID)), Check(G - 120, number=0, range_s=600)],
    ("Ports whose NCCL GID index moved", "A"): [Check(E, number=len(GID)), Check(G - 120, number=0, range_s=600)],
    ("Address losses", "A"): [Check(E, number=len(GID)), Check(G - 120, number=0, range_s=600)],
    ("Ports with GID or address changes", "A"): [Check(E, per_host=dict.fromkeys(GID, 2))],  # two changes
    ("Ports with GID or address changes", "B"): [Check(E, per_host=dict.fromkeys(GID, 1))],  # 3 -> 5
    ("Ports with GID or address changes", "C"): [Check(E, per_host=dict.fromkeys(GID, 2))],  # 3 -> 1 -> 5
    ("Ports with link errors", "A"): [Check(E, number=len(_ports("speed"))), Check(FLEET.start + 300, number=0)],
    ("Ports retransmitting", "A"): [Check(E, number=len(_ports("speed"))), Check(FLEET.start + 300, number=0)],
    ("Link errors by port", "A"): [Check(E, hosts=SPEED)],
    ("Top error counters", "A"): [Check(E, hosts=SPEED)],
    ("Top retransmission counters", "A"): [Check(E, hosts=SPEED)],
    # Every host but the ones missing a NIC carries the same traffic: any 20 of them.
    ("RDMA throughput, busiest nodes", "A"): [Check(E, hosts=ALL - GONE, top=20)],
    ("RDMA throughput, busiest nodes", "B"): [Check(E, hosts=ALL - GONE, top=20)],
    ("Error counter rate per node", "A"): [Check(E, per_host=dict.fromkeys(SPEED, 3.0))],  # 2/s + 1/s
    ("Retransmission rate per node", "A"): [Check(E, per_host=dict.fromkeys(SPEED, 0.5))],
}


def _fleet_targets() -> dict[tuple[str, str], str]:
    dashboard = json.loads(generate()["rnic-fleet-overview.json"])
    return {(panel["title"], t["refId"]): t["expr"] for panel in panels(dashboard) for t in panel.get("targets", [])}


def test_every_fleet_panel_target_is_checked() -> None:
    assert set(_fleet_targets()) == set(PANELS)


@pytest.mark.parametrize("where", sorted(PANELS), ids=lambda w: f"{w[0]}-{w[1]}")
def test_fleet_panel_returns_the_right_hosts(prom: Prometheus, where: tuple[str, str]) -> None:
    expr = _fleet_targets()[where]
    for check in PANELS[where]:
        promql = substitute(expr.replace("$__range", f"{check.range_s}s"))
        result = query(prom, promql, check.at)
        what = f"{where} at t={check.at - FLEET.start:+}s: {promql}"
        if check.number is not None:
            assert [float(r["value"][1]) for r in result] == [check.number], f"{what} -> {result}"
        if check.labels is not None:
            (label,) = {k for r in result for k in r["metric"]} - {"instance", "job"}
            got = {r["metric"][label]: float(r["value"][1]) for r in result}
            assert got == check.labels, what
        if check.per_host is not None:
            got = {r["metric"]["instance"]: float(r["value"][1]) for r in result}
            assert got == pytest.approx(check.per_host), what
        if check.top is not None:
            assert check.hosts is not None and len(result) == check.top, what
            assert {r["metric"]["instance"] for r in result} <= check.hosts, what
        elif check.hosts is not None:
            assert {r["metric"]["instance"] for r in result} == check.hosts, what


def test_node_variable_lists_every_host(prom: Prometheus) -> None:
    dashboard = json.loads(generate()["rnic-fleet-overview.json"])
    (var,) = [v for v in dashboard["templating"]["list"] if v["name"] == "instance"]
    selector = var["query"]["query"].removeprefix("label_values(").rsplit(",", 1)[0]
    assert {r["metric"]["instance"] for r in query(prom, f"group by (instance) ({selector})", FLEET.end)} == ALL


def test_the_recorded_series_are_per_node_or_only_where_something_is_wrong(prom: Prometheus) -> None:
    """The point of the rules: a refresh reads about one series per node, not one per port."""
    rules = yaml.safe_load((REPO / "alerts" / recording.FILENAME).read_text())["groups"][0]["rules"]
    for rule in rules:
        (count,) = query(prom, f"count({rule['record']})", E) or [{"value": [0, "0"]}]
        n = int(count["value"][1])
        assert n <= 3 * FLEET.hosts, f"{rule['record']}: {n} series for {FLEET.hosts} hosts"
        if rule["record"].startswith(("port", "address")):
            assert n <= 3 * len(FLEET.faults), f"{rule['record']} records healthy ports: {n} series"
