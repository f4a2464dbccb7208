"""A healthy rxe host: the exporter's show, gids, check and scrape agree with the kernel's own files."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.kernel.conftest import scenario_result
from tests.kernel.simdiff import gid_rows
from tests.kernel.vm import RunReport

pytestmark = pytest.mark.kernel

RATE = re.compile(r"^(\d+)(\.5)? Gb/sec \((\d+)X(?: (\w+))?\)\n$")


@pytest.fixture(scope="module")
def healthy(kernel_lab: RunReport) -> dict[str, Any]:
    result: dict[str, Any] = scenario_result(kernel_lab, "healthy")
    return result


def _kernel_value(healthy: dict[str, Any], path: str) -> str:
    entry = healthy["kernel"]["rxe0"][path]
    assert "value" in entry, f"kernel file {path} did not read: {entry}"
    value: str = entry["value"]
    return value


def _json(healthy: dict[str, Any], cmd: str) -> Any:
    run = healthy["cli"][cmd]
    assert run["code"] == 0, f"{cmd} exited {run['code']}: {run['stderr']}"
    return json.loads(run["stdout"])


def test_check_is_clean_on_a_healthy_host(healthy: dict[str, Any]) -> None:
    run = healthy["cli"]["check"]
    lines = [ln for ln in run["stdout"].splitlines() if ln.startswith(("[WARNING]", "[CRITICAL]"))]
    assert (run["code"], lines) == (0, []), f"check exited {run['code']} on a healthy rxe host:\n{run['stdout']}"


def test_check_asked_netlink(healthy: dict[str, Any]) -> None:
    """rtnetlink works in the VM: `check` must not fall back to judging addresses from the GID tables."""
    run = healthy["cli"]["check"]
    notes = [ln for ln in run["stdout"].splitlines() if "netlink unavailable" in ln]
    assert notes == [], f"check took {run['seconds']} s and said: {notes}; stderr: {run['stderr']}"


def test_check_json_reports_no_problems(healthy: dict[str, Any]) -> None:
    report = healthy["cli"]["check --json"]
    data = json.loads(report["stdout"])
    assert (report["code"], data["healthy"], data["problems"]) == (0, True, [])


def test_show_reads_every_attribute(healthy: dict[str, Any]) -> None:
    run = healthy["cli"]["show"]
    assert run["code"] == 0
    assert "could not be read" not in run["stderr"], run["stderr"]
    data = _json(healthy, "show --json")
    dev = next(d for d in data["devices"] if d["name"] == "rxe0")
    assert dev["unreadable"] == [], dev["unreadable"]


def test_show_agrees_with_the_kernel(healthy: dict[str, Any]) -> None:
    data = _json(healthy, "show --json")
    dev = next(d for d in data["devices"] if d["name"] == "rxe0")
    port = dev["ports"][0]
    state = _kernel_value(healthy, "ports/1/state")
    phys = _kernel_value(healthy, "ports/1/phys_state")
    assert f"{port['state']['number']}: {port['state']['name']}\n" == state
    assert f"{port['phys_state']['number']}: {port['phys_state']['name']}\n" == phys
    assert port["link_layer"] + "\n" == _kernel_value(healthy, "ports/1/link_layer")
    m = RATE.match(_kernel_value(healthy, "ports/1/rate"))
    assert m, _kernel_value(healthy, "ports/1/rate")
    assert port["rate"]["gbps"] == float(m.group(1)) + (0.5 if m.group(2) else 0)
    assert port["rate"]["lanes"] == int(m.group(3))
    assert dev["node_guid"] + "\n" == _kernel_value(healthy, "node_guid")
    assert dev["node_desc"] + "\n" == _kernel_value(healthy, "node_desc")
    assert dev["pci_address"] is None and "device" not in healthy["kernel"]["rxe0"]
    assert sorted(port["hw_counters"]) == sorted(
        p.split("/")[-1]
        for p in healthy["kernel"]["rxe0"]
        if p.startswith("ports/1/hw_counters/") and not p.endswith("lifespan")
    )
    net = port["netdevs"][0]
    kernel_net = healthy["kernel"]["net_va"]
    assert net["name"] + "\n" == _kernel_value(healthy, "ports/1/gid_attrs/ndevs/0")
    assert (str(net["speed_mbps"]), net["operstate"], str(net["mtu"]), net["address"]) == (
        kernel_net["speed"].strip(),
        kernel_net["operstate"].strip(),
        kernel_net["mtu"].strip(),
        kernel_net["address"].strip(),
    )


def test_gids_agree_with_the_kernel(healthy: dict[str, Any]) -> None:
    kernel = gid_rows(healthy["kernel"]["rxe0"])
    assert kernel, "the kernel's GID table is empty"
    data = _json(healthy, "gids --json")
    exporter = {g["index"]: (g["gid"], g["type"], g["netdev"]) for g in data["gids"] if g["device"] == "rxe0"}
    assert exporter == kernel
    table = healthy["cli"]["gids"]["stdout"]
    for index, (gid, _type, ndev) in kernel.items():
        assert re.search(rf"^rxe0\s+1\s+{index}\s+{gid}\s.*\bv2\s+{ndev}\b", table, re.M), table
    size = sum(1 for p in healthy["kernel"]["rxe0"] if re.fullmatch(r"ports/1/gids/\d+", p))
    port = next(p for p in data["ports"] if p["device"] == "rxe0")
    assert port["gid_table_size"] == size
    # NCCL's auto pick: the lowest-index IPv4 RoCE v2 GID
    v4 = min(
        i for i, (gid, t, _n) in kernel.items() if gid.startswith("0000:0000:0000:0000:0000:ffff:") and t == "RoCE v2"
    )
    assert port["nccl_gid_index"] == v4


def _series(scrape: str, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for line in scrape.splitlines():
        m = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if not m:
            continue
        got = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(1)))
        if all(got.get(k) == v for k, v in labels.items()):
            out.append((got, float(m.group(2))))
    return out


def test_scrape_agrees_with_the_kernel(healthy: dict[str, Any]) -> None:
    scrape = healthy["scrape"]
    kernel = gid_rows(healthy["kernel"]["rxe0"])
    gids = {
        int(lab["index"]): (lab["gid"], lab["type"], lab["netdev"])
        for lab, value in _series(scrape, "rnic_gid_entry_info", device="rxe0")
        if value == 1
    }
    assert gids == kernel
    state = int(_kernel_value(healthy, "ports/1/state").split(":")[0])
    assert _series(scrape, "rnic_port_state", device="rxe0")[0][1] == state
    m = RATE.match(_kernel_value(healthy, "ports/1/rate"))
    assert m
    gbps = float(m.group(1)) + (0.5 if m.group(2) else 0)
    assert _series(scrape, "rnic_port_active_rate_bytes_per_second", device="rxe0")[0][1] == gbps * 1e9 / 8
    info = _series(scrape, "rnic_port_info", device="rxe0")[0][0]
    assert info["netdev"] + "\n" == _kernel_value(healthy, "ports/1/gid_attrs/ndevs/0")
    assert _series(scrape, "rnic_attribute_unavailable", device="rxe0") == []


def test_serve_stopped_cleanly(healthy: dict[str, Any]) -> None:
    assert healthy["serve_exit"] == 0, healthy["serve_log"]
    assert "level=error" not in healthy["serve_log"], healthy["serve_log"]
