"""Incident 1 on the real kernel: what keeps a deleted GID's slot so that the re-added address lands at
a higher index, NetworkManager's port flap doing exactly that, the `ip`-configured fix, and what the
exporter said about it. The kernel source behind each assertion is in docs/gid-index-moves.md.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.kernel.conftest import scenario_result
from tests.kernel.vm import RunReport

pytestmark = pytest.mark.kernel

SCENARIOS = ["incident_a_holders", "incident_a"]
ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"
VA_ADDR = "10.77.0.1"
# Users that keep a reference on the GID entry (ib_core: qp->av_sgid_attr, ah->sgid_attr, the cm id's
# dev_addr.sgid_attr) and so keep its slot "pending delete" past the address's removal.
HOLDING = ["qp_rtr", "qp_rts", "ah", "cm_id", "cm_listen", "ib_send_bw_stopped"]
NOT_HOLDING = ["none", "qp_init"]


@pytest.fixture(scope="module")
def cases(kernel_lab: RunReport) -> dict[str, Any]:
    res: dict[str, Any] = scenario_result(kernel_lab, "incident_a_holders")
    print(f"incident_a_holders: {res.get('seconds')} s, pyverbs from {res.get('pyverbs_python')}")
    found: dict[str, Any] = res["cases"]
    return found


@pytest.fixture(scope="module")
def nm(kernel_lab: RunReport) -> dict[str, Any]:
    res: dict[str, Any] = scenario_result(kernel_lab, "incident_a")
    print(f"incident_a: {res.get('seconds')} s, NetworkManager {res.get('nm_version')}")
    assert "error" not in res, res.get("error")
    return res


# -- the kernel ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", NOT_HOLDING)
def test_unreferenced_gid_comes_back_at_its_index(kind: str, cases: dict[str, Any]) -> None:
    case = cases[kind]
    assert "error" not in case, case
    assert case["index_after"] == case["index_before"], case


@pytest.mark.parametrize("kind", HOLDING)
def test_referenced_gid_comes_back_at_a_higher_index(kind: str, cases: dict[str, Any]) -> None:
    case = cases[kind]
    assert "error" not in case, case
    before = case["index_before"]
    # While deleted, and after the re-add, the old slot reads as empty: pending delete is invisible.
    assert case["while_deleted"]["slot"] == {"gid": ZERO, "type": "EINVAL", "ndev": "EINVAL"}, case
    assert case["old_slot_after"]["gid"] == ZERO, case
    assert case["index_after"] > before, case
    # Released (the holder's objects destroyed), the next re-add takes the lowest free slot again.
    assert case["after_release"]["index_after"] == before, case["after_release"]


def test_traffic_running_through_the_delete_kills_the_sender_and_frees_the_slot(cases: dict[str, Any]) -> None:
    """The kernel-lab.md observation: rxe fails the next send (the QP's GID index no longer resolves),
    ib_send_bw exits, its QP goes, and the address comes back at the same index."""
    case = cases["ib_send_bw_running"]
    print(f"back to back: {cases.get('ib_send_bw_running_backtoback')}")
    assert case["client_exit_code"] != 0, case
    assert case["index_after"] == case["index_before"], case


def test_stopped_job_fails_once_resumed_after_the_move(cases: dict[str, Any]) -> None:
    case = cases["ib_send_bw_stopped"]
    assert case["client_exit_code_after_continue"] not in (None, 0), case  # None: still sending 60 s on


# -- NetworkManager ------------------------------------------------------------------------------


def _address_ops(events: list[dict[str, str]]) -> list[tuple[str, str, str]]:
    return [(e["op"], e["family"], e["address"]) for e in events if e["op"] in ("add", "del")]


def test_networkmanager_flap_moves_the_ipv4_gid(nm: dict[str, Any]) -> None:
    flap = nm["flap_nm"]
    print(f"NM removed the addresses {flap['removed_after_carrier_loss_s']} s after carrier loss")
    assert flap["removed_after_carrier_loss_s"] is not None
    assert nm["index_after_flap"] == nm["index_initial"] + 1, (nm["table_initial"], nm["table_after_flap"])
    assert nm["old_slot_after_flap"]["gid"] == ZERO, nm["old_slot_after_flap"]
    assert nm["job_exit_code"] != 0, nm["job_log_tail"]


def test_networkmanager_removes_ipv4_first_and_re_adds_it_first(nm: dict[str, Any]) -> None:
    events = nm["events_nm_flap"]
    lost = next(i for i, e in enumerate(events) if e.get("op") == "link" and e["carrier"] == "false")
    back = next(i for i, e in enumerate(events) if i > lost and e.get("op") == "link" and e["carrier"] == "true")
    removed = _address_ops(events[lost:back])
    added = _address_ops(events[back:])
    print(f"removed: {removed}\nadded: {added}")
    assert removed and removed[0] == ("del", "inet", f"{VA_ADDR}/24"), removed
    assert {a for _, _, a in removed} >= {f"{VA_ADDR}/24", "fd77::1/64"}, removed
    assert added and added[0] == ("add", "inet", f"{VA_ADDR}/24"), added


def test_short_flap_within_networkmanagers_grace_removes_nothing(nm: dict[str, Any]) -> None:
    assert nm["flap_nm_short"]["address_events"] == [], nm["flap_nm_short"]
    assert nm["flap_nm_short"]["index_after"] is not None


def test_ip_configured_address_survives_the_same_flap(nm: dict[str, Any]) -> None:
    fix = nm["flap_fix"]
    assert fix["address_events"] == [], fix
    assert fix["index_after"] == nm["fix_index_initial"], (nm["fix_table_initial"], nm["fix_table_after"])
    assert nm["fix_job_alive_after_continue"], nm


# -- the exporter --------------------------------------------------------------------------------


def test_gids_cli_shows_the_move(nm: dict[str, Any]) -> None:
    assert nm["gids_before"]["code"] == 0, nm["gids_before"]
    assert nm["gids_before"]["v4_indices"] == [nm["index_initial"]], nm["gids_before"]
    assert nm["gids_after"]["v4_indices"] == [nm["index_after_flap"]], nm["gids_after"]


def _nccl_problems(check: dict[str, Any]) -> list[dict[str, Any]]:
    problems: list[dict[str, Any]] = (check.get("json") or {}).get("problems", [])
    return [p for p in problems if p.get("code") == "nccl_gid_index_invalid" and "rxe0" in str(p.get("where"))]


def test_check_flags_the_old_index_after_the_move(nm: dict[str, Any]) -> None:
    before, after = nm["check_before"], nm["check_old_index_after"]
    # `check --fail-on critical`: the stale index is the one critical problem after the move.
    assert _nccl_problems(before) == [] and before["code"] == 0, before
    found = _nccl_problems(after)
    assert found and found[0]["severity"] == "critical", after
    assert after["code"] == 1, after


def test_serve_exports_the_move_and_counts_it(nm: dict[str, Any]) -> None:
    assert nm["serve_before"]["v4_index"] == nm["index_initial"], nm["serve_before"]
    assert nm["serve_saw_new_index"], nm.get("serve_wait_error")
    assert nm["serve_after"]["v4_index"] == nm["index_after_flap"], nm["serve_after"]
    assert (nm["serve_after"]["address_moved_total"] or 0) >= 1, (nm["serve_after"], nm["serve_log_events"])


def test_serve_warns_of_networkmanager_beforehand_and_not_after_the_fix(nm: dict[str, Any]) -> None:
    print(f"NM device file managed: {nm['nm_device_file']}, unmanaged: {nm['nm_device_file_unmanaged']}")
    assert nm["serve_before"]["risk_networkmanager"] == 1, nm["serve_before"]
    assert nm["serve_fix"]["risk_networkmanager"] in (0, None), nm["serve_fix"]
