"""The wire reads (issue 32) on a real driver, QEMU's e1000e, against the real `ethtool`: link state,
`ethtool -S` statistics under traffic, pause parameters; FEC and module memory, and every source on
the veth and tap under rxe, typed Unsupported with no error counted."""

from __future__ import annotations

import re
from typing import Any

import pytest

from rnic_exporter.sources.pause_stats import PORT_COUNTERS
from tests.kernel.conftest import scenario_result
from tests.kernel.vm import RunReport

pytestmark = pytest.mark.kernel

NOT_SUPPORTED = "Operation not supported"


@pytest.fixture(scope="module")
def wire(kernel_lab: RunReport) -> dict[str, Any]:
    result: dict[str, Any] = scenario_result(kernel_lab, "wire_ethtool")
    assert "error" not in result, result["error"]
    return result


def link_detected(ethtool: dict[str, Any]) -> str:
    found = re.findall(r"^\s*Link detected: (.*)$", ethtool["out"], re.M)
    assert len(found) == 1, ethtool
    return str(found[0])


def stats(ethtool: dict[str, Any]) -> dict[str, int]:
    """`ethtool -S` text: "NIC statistics:" then one "     name: value" a line."""
    assert ethtool["code"] == 0, ethtool
    lines = ethtool["out"].splitlines()
    assert lines[0] == "NIC statistics:", lines[:2]
    out = {}
    for line in lines[1:]:
        name, value = line.strip().rsplit(": ", 1)
        out[name] = int(value)
    return out


def pause_params(ethtool: dict[str, Any]) -> tuple[bool, bool, bool]:
    assert ethtool["code"] == 0, ethtool
    got = dict(re.findall(r"^(Autonegotiate|RX|TX):\s+(on|off)$", ethtool["out"], re.M))
    assert sorted(got) == ["Autonegotiate", "RX", "TX"], ethtool
    return got["Autonegotiate"] == "on", got["RX"] == "on", got["TX"] == "on"


def unsupported(ethtool: dict[str, Any]) -> bool:
    return ethtool["code"] != 0 and NOT_SUPPORTED in ethtool["out"] + ethtool["err"]


def test_the_nic_is_e1000e(wire: dict[str, Any]) -> None:
    assert "driver: e1000e" in wire["driver"]["out"], wire["driver"]


def test_link_state_is_what_ethtool_says_up_and_down(wire: dict[str, Any]) -> None:
    up, down = wire["link_up"], wire["link_down"]
    assert up["ours"]["type"] == "LinkState" and up["ours"]["link_up"] is True, up
    assert link_detected(up["ethtool"]) == "yes"
    assert down["ours"]["link_up"] is False, down
    # no extended state on e1000e (no get_link_ext_state): ethtool prints no reason either
    assert link_detected(down["ethtool"]) == "no"
    assert (down["ours"]["ext_state"], down["ours"]["ext_substate"]) == (None, None)


def test_every_statistic_lies_between_two_ethtool_reads(wire: dict[str, Any]) -> None:
    rounds = wire["stats"]["rounds"]
    assert len(rounds) >= 4
    outside = []
    for i, r in enumerate(rounds):
        before, after, ours = stats(r["before"]), stats(r["after"]), r["ours"]
        assert sorted(ours) == sorted(before) == sorted(after)
        outside += [(i, n, before[n], ours[n], after[n]) for n in before if not before[n] <= ours[n] <= after[n]]
    assert outside == [], outside
    assert len(stats(rounds[0]["before"])) >= 30  # e1000e has ~50 strings: a parse gone wrong is no match


def test_the_traffic_moved_the_counters(wire: dict[str, Any]) -> None:
    first = stats(wire["stats"]["first"])
    last = stats(wire["stats"]["rounds"][-1]["after"])
    moved = {n: last[n] - first[n] for n in ("rx_packets", "tx_packets", "rx_bytes", "tx_bytes")}
    assert all(v > 0 for v in moved.values()), moved
    around = [r for r in wire["stats"]["rounds"] if stats(r["before"])["tx_packets"] < stats(r["after"])["tx_packets"]]
    assert around, "tx_packets never moved around our read: every bound was trivially an equality"


def test_e1000e_has_none_of_the_curated_pause_strings(wire: dict[str, Any]) -> None:
    """The curated set is the RoCE drivers' (pause_stats.py says why e1000e's 802.3x
    `*_flow_control_xon/xoff` are not in it): on e1000e the daemon's reader says not_exposed."""
    names = set(stats(wire["stats"]["first"]))
    assert {"rx_flow_control_xon", "rx_flow_control_xoff", "tx_flow_control_xon", "tx_flow_control_xoff"} <= names
    curated = re.compile(r"^(rx|tx)_prio[0-7]_|^(rx|tx)_pause_ctrl_phy$")
    assert not [n for n in names if curated.match(n) or n in PORT_COUNTERS]
    nic = wire["nic"]
    assert wire["under_rxe"]["wire"][nic]["driver_pause"] == {
        "type": "Unsupported",
        "operation": "gstats",
        "reason": "not_exposed",
    }


@pytest.mark.parametrize("when", ["defaults", "changed"])
def test_pause_parameters_are_what_ethtool_says(wire: dict[str, Any], when: str) -> None:
    got = wire["pause"][when]
    ours = got["ours"]
    assert ours["type"] == "PauseStats", ours
    assert (ours["autoneg"], ours["rx_enabled"], ours["tx_enabled"]) == pause_params(got["ethtool"])
    # e1000e has no pause statistics (no get_pause_stats): neither side shows any
    assert (ours["tx_frames"], ours["rx_frames"]) == (None, None)
    assert "Statistics:" not in got["ethtool"]["out"]


def test_the_pause_change_was_seen(wire: dict[str, Any]) -> None:
    assert wire["pause"]["set"]["code"] == 0, wire["pause"]["set"]
    assert pause_params(wire["pause"]["changed"]["ethtool"]) == (False, True, False)


@pytest.mark.parametrize("operation", ["fec", "module"])
def test_e1000e_fec_and_module_are_unsupported_not_errors(wire: dict[str, Any], operation: str) -> None:
    got = wire["e1000e_unsupported"][operation]
    name = {"fec": "fec", "module": "module_eeprom"}[operation]
    assert got["ours"] == {"type": "Unsupported", "operation": name, "reason": "EOPNOTSUPP"}, got["ours"]
    assert unsupported(got["ethtool"]), got["ethtool"]
    assert wire["errors_after_e1000e"] == {}


def test_the_netdevs_under_rxe_are_unsupported_but_for_link_state(wire: dict[str, Any]) -> None:
    under = wire["under_rxe"]
    assert under["netdevs"] == ["va", "tap0"]
    for netdev in under["netdevs"]:
        got, cli = under["wire"][netdev], under["ethtool"][netdev]
        assert got["link_state"]["type"] == "LinkState", got
        assert got["link_state"]["link_up"] is (link_detected(cli["link"]) == "yes") is True
        for source, operation in (("fec", "fec"), ("pause", "pause"), ("module", "module_eeprom")):
            assert got[source] == {"type": "Unsupported", "operation": operation, "reason": "EOPNOTSUPP"}, got
        for command in ("fec", "pause", "module"):
            assert unsupported(cli[command]), (netdev, command, cli[command])
        assert got["driver_pause"]["type"] == "Unsupported" and got["driver_pause"]["operation"] == "gstats", got
    assert under["gstats_errors"] == 0
    assert wire["errors"] == {}


def test_what_was_unsupported_is_not_asked_again(wire: dict[str, Any]) -> None:
    """Second pass, every interval due: only link state (all three netdevs) and e1000e's pause."""
    under = wire["under_rxe"]
    first, second = under["requests_first_poll"], under["requests_second_poll"]
    grown = {op: second[op] - first.get(op, 0) for op in second if second[op] != first.get(op, 0)}
    assert grown == {"link_state": 3, "pause": 1}, (first, second)
