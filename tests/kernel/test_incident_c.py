"""Incident 3 (NCCL GID index mismatch) on the real kernel: `check`'s verdict on a configured
NCCL_IB_GID_INDEX agrees with whether RDMA traffic (ib_send_bw RC, both sides on the index) runs.

What is right for an operator: an index is good when traffic runs over it across a routed fabric
(the kind GPU clusters build; the flat veth pair is one L2 segment, where a link-local GID can still
carry traffic, so it is recorded but does not decide the link-local verdict).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.kernel.conftest import scenario_result
from tests.kernel.vm import RunReport

pytestmark = pytest.mark.kernel

NCCL_CODES = ("nccl_gid_index_invalid", "nccl_gid_unusable")


@pytest.fixture(scope="module")
def res(kernel_lab: RunReport) -> dict[str, Any]:
    result: dict[str, Any] = scenario_result(kernel_lab, "incident_c")
    print(f"incident_c: {result.get('seconds')} s, indexes {result.get('indexes')}")
    return result


def nccl_problems(res: dict[str, Any], case: str, device: str = "rxe0") -> list[dict[str, Any]]:
    run = res["check"][case]
    assert "problems" in run, run
    return [p for p in run["problems"] if p["code"] in NCCL_CODES and p["where"].startswith(f"{device} ")]


def passed(res: dict[str, Any], where: str, case: str) -> bool:
    t = res[where][case]
    print(f"{where} {case} (-x {t['index']}): client {t['client_code']}, server {t['server_code']}, {t['seconds']} s")
    return bool(t["passed"])


# -- the kernel ----------------------------------------------------------------------------------


def test_scenario_completed(res: dict[str, Any]) -> None:
    assert "error" not in res, res["error"]


def test_the_table_is_as_the_lab_expects(res: dict[str, Any]) -> None:
    assert res["table_size"] == 1024
    assert res["indexes"]["ipv4"] == 1, res["tables"]
    assert res["tables"]["rxe0"]["0"].startswith("fe80:") and res["tables"]["rxe0"]["0"].endswith("RoCE v2")


def test_rxe_in_another_netns_receives_nothing(res: dict[str, Any]) -> None:
    """Kernel fact (6.1): rxe's UDP 4791 socket lives in init_net only, so rxe1 (on vb in netns b)
    never receives: on the IPv4 GID the client sends and the server counts no packet. The lab can
    therefore not show traffic running on any index; only where the verbs setup fails is measurable."""
    t = res["flat"]["ipv4"]
    print("flat ipv4 counters:", t["counters"])
    assert t["counters"]["rxe0"]["sent_pkts"] > 0 and t["counters"]["rxe1"]["rcvd_pkts"] == 0, t["counters"]


def test_empty_index_fails_at_rtr(res: dict[str, Any]) -> None:
    t = res["flat"]["empty"]
    assert not passed(res, "flat", "empty") and "Failed to modify QP" in t["client"] and "to RTR" in t["client"], t


def test_beyond_table_is_refused_by_perftest(res: dict[str, Any]) -> None:
    """perftest itself refuses -x above 64 before touching the device (a tool limit, not the kernel's)."""
    t = res["flat"]["beyond"]
    assert not passed(res, "flat", "beyond") and "Gid index should be between 0 and 64" in t["client"], t


def test_link_local_index_fails_across_a_router(res: dict[str, Any]) -> None:
    t = res["routed"]["link_local"]
    assert not passed(res, "routed", "link_local") and "to RTR" in t["client"], t


# -- check against the traffic --------------------------------------------------------------------


def test_check_accepts_the_ipv4_index(res: dict[str, Any]) -> None:
    assert nccl_problems(res, "ipv4") == [], res["check"]["ipv4"]


@pytest.mark.parametrize("case", ["empty", "beyond", "link_local"])
def test_check_rejects_an_index_without_routable_traffic(case: str, res: dict[str, Any]) -> None:
    problems = nccl_problems(res, case)
    assert problems, res["check"][case]
    assert all(p["severity"] == "critical" for p in problems), problems
    assert res["check"][case]["code"] == 1, res["check"][case]


@pytest.mark.parametrize(("where", "case"), [("flat", "empty"), ("flat", "beyond"), ("routed", "link_local")])
def test_check_verdict_agrees_with_traffic(where: str, case: str, res: dict[str, Any]) -> None:
    """Where the lab can measure (an index whose verbs setup fails), check must call it a problem."""
    assert not passed(res, where, case)
    assert nccl_problems(res, case), res["check"][case]


@pytest.mark.parametrize("case", ["empty", "beyond", "link_local", "ipv4"])
def test_check_judges_every_rxe_port_alike(case: str, res: dict[str, Any]) -> None:
    """Every port has the same table layout (link-local at 0, IPv4 at 1): one verdict for all."""
    verdicts = {dev: bool(nccl_problems(res, case, dev)) for dev in ("rxe0", "rxe1", "rxe3", "rxe4")}
    assert len(set(verdicts.values())) == 1, verdicts
