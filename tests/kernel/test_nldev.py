"""RDMA netlink against sysfs on the real kernel (both kernels): STAT_GET gives every hw counter sysfs
gives with the same values, the dumps name the same devices and ports, and where netlink cannot see
the device (exclusive RDMA netns mode, a socket in another namespace) the client says so as a typed
reason and the read-path decision falls back to sysfs, which still reads."""

from __future__ import annotations

from typing import Any

import pytest

from tests.kernel.conftest import scenario_result
from tests.kernel.vm import RunReport

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def nldev(kernel_lab: RunReport) -> dict[str, Any]:
    result: dict[str, Any] = scenario_result(kernel_lab, "nldev")
    assert "error" not in result, result["error"]
    return result


def test_stat_get_names_every_hw_counter_sysfs_has(nldev: dict[str, Any]) -> None:
    first = nldev["first_stat"]
    assert "values" in first, first
    sysfs = nldev["traffic"]["still_sysfs"]
    assert sorted(first["values"]) == sorted(sysfs)
    assert len(sysfs) >= 10  # rxe has 15 (sent_pkts, rcvd_pkts, ...): a listing that went wrong is not a match


def test_stat_get_is_within_the_sysfs_reads_around_it_under_traffic(nldev: dict[str, Any]) -> None:
    """sysfs before <= netlink <= sysfs after for every counter of every round, with each phase
    past the hw_counters cache's lifespan (so neither read can be served from an older refresh)."""
    traffic = nldev["traffic"]
    rounds = traffic["rounds"]
    assert len(rounds) >= 10, traffic
    outside = [
        (i, name, r["before"][name], r["netlink"][name], r["after"][name])
        for i, r in enumerate(rounds)
        for name in r["before"]
        if not r["before"][name] <= r["netlink"][name] <= r["after"][name]
    ]
    assert outside == [], outside
    # the traffic really moved the counters during the rounds, so the bounds were not trivially equal
    # (rxe's loopback RC stalls now and then for a round: 6.12 once paused ~60 ms between two reads)
    moved = [r["after"]["sent_pkts"] - r["before"]["sent_pkts"] for r in rounds]
    assert sum(m > 0 for m in moved) >= len(rounds) - 2, (moved, traffic["client_log"])
    inside_strictly = [
        r for r in rounds if r["before"]["sent_pkts"] < r["netlink"]["sent_pkts"] < r["after"]["sent_pkts"]
    ]
    assert inside_strictly, "netlink never read between the two sysfs reads: the order was not the defined one"


def test_stat_get_equals_sysfs_exactly_at_rest(nldev: dict[str, Any]) -> None:
    traffic = nldev["traffic"]
    assert traffic["still_netlink"].get("values") == traffic["still_sysfs"]
    assert traffic["still_sysfs"]["sent_pkts"] > 0


def test_the_dumps_name_what_sysfs_names(nldev: dict[str, Any]) -> None:
    devices = nldev["dumps"]["devices"]
    sysfs = nldev["sysfs"]["devices"]
    assert sorted(d["name"] for d in devices) == sorted(sysfs)
    for d in devices:
        kernel = sysfs[d["name"]]
        assert (d["node_guid"], d["sys_image_guid"], str(d["ports"])) == (
            kernel["node_guid"],
            kernel["sys_image_guid"],
            kernel["ports"],
        )
        assert d["fw_version"] is None and kernel["fw_ver"] == ""  # rxe has no firmware string either way
        assert d["protocol"] == "roce"
    ports = {f"{p['device']}/{p['port']}": p for p in nldev["dumps"]["ports"]}
    assert sorted(ports) == sorted(nldev["sysfs"]["ports"])
    for key, kernel in nldev["sysfs"]["ports"].items():
        assert (ports[key]["state"], ports[key]["phys_state"]) == (kernel["state"], kernel["phys_state"])
    # the netdev is named where it lives in the socket's namespace (va, root) and not otherwise (vb is in b)
    assert (ports["rxe0/1"]["netdev"], ports["rxe0/1"]["netdev_index"]) == ("va", nldev["netdev_ifindex"]["va"])
    assert ports["rxe1/1"]["netdev"] is None


def test_netlink_is_the_read_path_where_it_answers(nldev: dict[str, Any]) -> None:
    assert nldev["decision_root"]["path"] == "netlink", nldev["decision_root"]


def test_where_netlink_cannot_see_the_device_sysfs_reads_it(nldev: dict[str, Any]) -> None:
    fb = nldev["fallback"]
    assert fb["set_exclusive"]["code"] == 0, fb
    assert "exclusive" in fb["mode"]
    assert fb["in_c"]["devices"] == []
    assert fb["in_c"]["stat"]["unavailable"] == "no_device", fb["in_c"]
    assert fb["decision"]["path"] == "sysfs" and "no_device" in fb["decision"]["reason"], fb["decision"]
    assert "sent_pkts" in fb["sysfs_values"]
    assert fb["restore_shared"] == 0 and "shared" in fb["mode_after"], fb


def test_a_stat_get_costs_less_than_reading_every_file(nldev: dict[str, Any]) -> None:
    """The exporter's side of the bargain: one STAT_GET must not cost more CPU than the sysfs pass it
    replaces (each measured with the lifespan cache expired, as a scrape finds it)."""
    t = nldev["timing"]
    assert t["netlink_stat_get_cpu_ms"] <= t["sysfs_all_files_cpu_ms"], t


def test_the_qp_table_names_the_processes_holding_qps(nldev: dict[str, Any]) -> None:
    """RES_QP_GET while both ib_send_bw processes run on rxe0: both pids own QPs there (the
    consumers feature's answer without scanning /proc/*/fd), each with its comm."""
    qps = nldev["traffic"]["qps"]
    owners = qps["owners"]
    assert isinstance(owners, list), owners
    on_rxe0 = {o["pid"] for o in owners if o["device"] == "rxe0" and o["pid"] is not None}
    assert {qps["pids"]["server"], qps["pids"]["client"]} <= on_rxe0, (qps["pids"], owners)
    consumers = {c["pid"]: c for c in qps["consumers"]["rxe0"]}
    for pid in qps["pids"].values():
        assert consumers[pid]["comm"] == "ib_send_bw" and consumers[pid]["qps"] >= 1, consumers[pid]


def test_the_consumers_scan_finds_the_same_processes_from_the_verbs_contexts(nldev: dict[str, Any]) -> None:
    """RES_CTX_GET lists each ib_send_bw's context on rxe0 (by the thread that made it); the scan built
    on it names the same processes as the walk of every descriptor under /proc, which it replaces."""
    qps = nldev["traffic"]["qps"]
    pids = {qps["pids"]["server"], qps["pids"]["client"]}
    contexts = qps["contexts"]
    assert isinstance(contexts, list) and any(c["device"] == "rxe0" for c in contexts), contexts
    walk, netlink = qps["scan_walk"], qps["scan_netlink"]
    assert (walk["source"], netlink["source"]) == ("procfs", "rdma_netlink"), (walk, netlink)
    assert pids <= set(walk["by_device"]["rxe0"]), walk
    assert netlink["by_device"] == walk["by_device"] and netlink["complete"], (netlink, walk)


def test_node_exporter_scraped_the_same_sysfs(nldev: dict[str, Any]) -> None:
    """The reference beside the two paths: node_exporter's infiniband collector on the same devices
    (the figure is in the lab's summary; rxe has no counters/, which its collector may call an error)."""
    ne = nldev["node_exporter"]
    assert any(ln.startswith('node_scrape_collector_success{collector="infiniband"}') for ln in ne["infiniband_lines"])
    assert ne["scrapes"] == 50 and ne["wall_ms_per_scrape"] > 0
