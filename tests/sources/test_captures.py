"""Real captures of /sys/class/infiniband (tests/fixtures/*/SOURCE.md): golden `show --json`,
`gids --json`, `check --json` and exposition per capture, `promtool check metrics`, check's exit
code, and the values the files mean in the kernel (drivers/infiniband/core/sysfs.c) checked by hand."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rnic_exporter.cli import main
from rnic_exporter.model.host import Snapshot
from rnic_exporter.sources.reader import HostReader
from rnic_exporter.sources.sysfs import SysfsRoot
from tests.support.captures import CAPTURES, FIXTURES, Capture
from tests.support.exposition import render_text, samples
from tests.support.processes import require_binary

GOLDEN = Path(__file__).parents[1] / "golden" / "captures"
IDS = [c.name for c in CAPTURES]


def cli(capture: Capture, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(
        main,
        [args[0], "--path.sysfs", str(capture.sys), *args[1:]],
        env={"NCCL_IB_ADDR_FAMILY": "", "NCCL_IB_GID_INDEX": "", **(env or {})},
    )
    return result.exit_code, result.stdout


def exposition(capture: Capture) -> str:
    snap = dataclasses.replace(HostReader(SysfsRoot(capture.sys)).read(), taken_at=1_700_000_000.0, read_seconds=0.001)
    return re.sub(r"^rnic_exporter_build_info\{.*\n", "", render_text(snap), flags=re.M)


def outputs(capture: Capture) -> dict[str, str]:
    _, show = cli(capture, "show", "--json")
    shown = json.loads(show)
    shown["sysfs"], shown["taken_at"] = "<capture>/sys", 0
    _, gids = cli(capture, "gids", "--json")
    _, check = cli(capture, "check", "--no-netlink", "--state.dir", "", "--json")
    return {
        "show.json": json.dumps(shown, indent=2) + "\n",
        "gids.json": gids,
        "check.json": check,
        "metrics.prom": exposition(capture),
    }


@pytest.mark.parametrize("capture", CAPTURES, ids=IDS)
def test_capture_golden(capture: Capture, request: pytest.FixtureRequest) -> None:
    assert (FIXTURES / capture.name / "SOURCE.md").is_file()
    got = outputs(capture)
    folder = GOLDEN / capture.name
    if request.config.getoption("--update-golden"):
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in got.items():
            (folder / name).write_text(text)
    for name, text in got.items():
        assert text == (folder / name).read_text(), f"{capture.name}/{name} changed; review, rerun with --update-golden"


@pytest.mark.parametrize("capture", CAPTURES, ids=IDS)
def test_capture_exposition_passes_promtool(capture: Capture) -> None:
    lint = subprocess.run(
        [require_binary("promtool"), "check", "metrics"],
        input=exposition(capture).encode(),
        capture_output=True,
        timeout=60,
    )
    assert lint.returncode == 0 and not lint.stdout and not lint.stderr, lint.stdout + lint.stderr


@pytest.mark.parametrize("capture", CAPTURES, ids=IDS)
def test_check_exit_code_on_each_capture(capture: Capture) -> None:
    code, out = cli(capture, "check", "--no-netlink", "--state.dir", "", "--json")
    report = json.loads(out)
    assert code == capture.exit_code, (capture.why, report["problems"])
    if capture.exit_code:
        assert capture.why
    if capture.nccl_env:  # healthy under the NCCL settings such a host runs with
        code, out = cli(capture, "check", "--no-netlink", "--state.dir", "", "--json", env=capture.nccl_env)
        assert code == 0, json.loads(out)["problems"]
    # Nothing a driver does not provide is a problem; every unreadable file of these trees is absent.
    assert all(p["code"] != "attribute_unreadable" for p in report["problems"])


def read(name: str) -> Snapshot:
    return HostReader(SysfsRoot(FIXTURES / name / "sys")).read()


def metric(name: str, metric_name: str, **labels: str) -> float | None:
    text = exposition(next(c for c in CAPTURES if c.name == name))
    return samples(text).get((metric_name, frozenset(labels.items())))


def show_port(name: str, device: str) -> dict[str, Any]:
    _, out = cli(next(c for c in CAPTURES if c.name == name), "show", "--json")
    [dev] = [d for d in json.loads(out)["devices"] if d["name"] == device]
    port: dict[str, Any] = dev["ports"][0]
    return port


def test_node_exporter_iwarp_port_without_pma() -> None:
    """i40iw: every counters/ file reads `N/A (no PMA)` on an ACTIVE/LinkUp port; the rate is the old
    kernels' SDR spelling without a name (`10 Gb/sec (4X)`: 4 lanes x 2.5 Gb/s)."""
    snap = read("node-exporter-i40iw-mlx4")
    port = snap.port("i40iw0", 1)
    assert port is not None and port.up is True and port.counters == {}
    assert port.rate is not None and (port.rate.gbps, port.rate.lanes, port.rate.speed) == (10, 4, "SDR")
    assert {e.kind for e in snap.unsupported if e.device == "i40iw0" and e.port == 1} == {"no_pma"}
    assert len([e for e in snap.unsupported if e.attribute.startswith("counters/")]) == 17
    pl = {"device": "i40iw0", "port": "1"}
    assert metric("node-exporter-i40iw-mlx4", "rnic_port_active_rate_bytes_per_second", **pl) == 10e9 / 8
    assert (
        metric(
            "node-exporter-i40iw-mlx4",
            "rnic_attribute_unsupported_info",
            **pl,
            attribute="counters/symbol_error",
            reason="no_pma",
        )
        == 1
    )
    # mlx4: port_xmit_data counts 4-octet words; port_xmit_wait sits at 2^32-1, saturated.
    mlx4 = {"device": "mlx4_0", "port": "1"}
    assert metric("node-exporter-i40iw-mlx4", "rnic_port_data_transmitted_bytes_total", **mlx4) == 3733440 * 4
    # One gauge per port: how many of its PMA counters are stuck (here port_xmit_wait alone).
    assert metric("node-exporter-i40iw-mlx4", "rnic_port_pma_counters_saturated", **mlx4) == 1


def test_gpud_h100_ndr_and_roce_bond() -> None:
    """ConnectX-7 IB NDR (`400 Gb/sec (4X NDR)`: 4 x 100 Gb/s) and a BlueField-3 RoCE LAG running
    200G over 2 lanes (mlx5 maps Ethernet modes onto IB names: `200 Gb/sec (2X NDR)`). Values have no
    trailing newline in this capture."""
    snap = read("gpud-h100-ndr-bond")
    assert snap.errors == () and len(snap.devices) == 9
    ndr = snap.port("mlx5_0", 1)
    bond = snap.port("mlx5_bond_0", 1)
    assert ndr is not None and ndr.rate is not None
    assert (ndr.rate.gbps, ndr.rate.lanes, ndr.rate.speed) == (400, 4, "NDR")
    assert bond is not None and bond.rate is not None and (bond.rate.gbps, bond.rate.lanes) == (200, 2)
    assert ndr.link_layer == "InfiniBand" and bond.link_layer == "Ethernet" and ndr.up and bond.up
    pl = {"device": "mlx5_0", "port": "1"}
    assert metric("gpud-h100-ndr-bond", "rnic_port_active_rate_bytes_per_second", **pl) == 400e9 / 8
    assert metric("gpud-h100-ndr-bond", "rnic_port_data_received_bytes_total", **pl) == 230539874932483 * 4
    assert metric("gpud-h100-ndr-bond", "rnic_port_pma_total", **pl, counter="excessive_buffer_overrun_errors") == 15
    assert metric("gpud-h100-ndr-bond", "rnic_nccl_gid_index", **pl) is None  # no gids/ in the capture: unknown
    dev = snap.device("mlx5_bond_0")
    assert dev is not None and (dev.hca_type, dev.fw_ver, dev.board_id) == ("MT41692", "32.38.3056", "MT_0000000884")
    _, out = cli(CAPTURES[2], "check", "--no-netlink", "--state.dir", "", "--json")
    [problem] = json.loads(out)["problems"]
    assert (problem["code"], problem["severity"], problem["where"]) == (
        "gid_table_unreadable",
        "info",
        "mlx5_bond_0 port 1",
    )


def test_ipv6_only_v2_only_tables() -> None:
    """One RoCE v2 GID per address (a v2-only device), link-local at 0 and a ULA at 1: NCCL's default
    AF_INET keeps index 0; AF_INET6 takes index 1."""
    capture = next(c for c in CAPTURES if c.name == "mooncake-ipv6-only-v2")
    port = show_port(capture.name, "rocep105s0")
    assert port["nccl_gid_index"] == 0 and [g["version"] for g in port["gids"]] == ["v2", "v2"]
    assert port["up"] is None  # show_gids says nothing of the state: unknown, not down
    _, out = cli(capture, "check", "--no-netlink", "--state.dir", "", "--json")
    assert {(p["reason"], p["severity"]) for p in json.loads(out)["problems"]} == {("link_local", "critical")}
    _, out = cli(capture, "gids", "--json", env=capture.nccl_env)
    picked = {(g["device"], g["index"]) for g in json.loads(out)["gids"] if g["nccl_selected"]}
    assert picked == {(d, 1) for d in ("rocep105s0", "rocep121s0", "rocep137s0", "rocep153s0")}
    assert metric(capture.name, "rnic_nccl_gid_index", device="rocep105s0", port="1") == 0


def test_sparse_pod_table_and_bond_pick_the_v2_ipv4_gid() -> None:
    """A pod's view (slots 0-3 zero, its macvlan's GIDs at 4-7) and a RoCE LAG (ibv_devinfo rows):
    NCCL's auto-selection lands on the RoCE v2 IPv4 GID, 7 and 3."""
    assert show_port("nccl-k8s-macvlan-sparse", "mlx5_0")["nccl_gid_index"] == 7
    # net2 is in the pod, not this tree: listed as not present, as the table shows it "(missing)"
    assert [(n["name"], n["present"]) for n in show_port("nccl-k8s-macvlan-sparse", "mlx5_1")["netdevs"]] == [
        ("net2", False)
    ]
    bond = show_port("nccl-roce-bond-devinfo", "mlx5_bond_0")
    assert bond["nccl_gid_index"] == 3 and bond["ipv4"] == ["200.0.209.6"]
    assert bond["phys_state"] == {"number": 5, "name": "LinkUp"} and bond["up"] is None  # state not in the rows


def test_efa_is_no_roce_port_and_its_zero_guid_is_a_value() -> None:
    """EFA: node type 7 (`unspecified`), link layer `Unknown`: NCCL's RoCE GID rules do not apply, and
    an all-zero GUID is what the device reports, not a missing value."""
    snap = read("rdma-core-efa")
    dev = snap.device("efa_0")
    assert (
        dev is not None
        and dev.node_type is not None
        and (dev.node_type.number, dev.node_type.name) == (7, "unspecified")
    )
    assert dev.node_guid == "0000:0000:0000:0000" and dev.fw_ver == "0.0.0.0"
    port = snap.port("efa_0", 1)
    assert port is not None and port.link_layer == "Unknown" and port.up is None
    _, out = cli(
        next(c for c in CAPTURES if c.name == "rdma-core-efa"), "check", "--no-netlink", "--state.dir", "", "--json"
    )
    assert json.loads(out)["problems"] == []
    assert metric("rdma-core-efa", "rnic_port_state", device="efa_0", port="1") == 4
    assert metric("rdma-core-efa", "rnic_port_up", device="efa_0", port="1") is None
