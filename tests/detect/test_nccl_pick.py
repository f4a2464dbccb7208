"""NCCL's pick must be usable: the GID NCCL would use, judged in check, the metric, the events.

The alert on it is unit-tested with promtool in alerts/tests/gid.test.yml.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import logging
from pathlib import Path

import pytest
from click.testing import CliRunner

from rnic_exporter.catalog import events as ev
from rnic_exporter.cli import Exit, main
from rnic_exporter.config.nccl_env import gid_index_from_env, nccl_environment, nccl_settings
from rnic_exporter.daemon.agent import Agent, ServeConfig
from rnic_exporter.detect.settings import DetectionSettings
from rnic_exporter.model.host import ROCE_V1, ROCE_V2, GidEntry, NumberedState, Port
from rnic_exporter.model.nccl import (
    LINK_LOCAL,
    NO_GID,
    OUT_OF_RANGE,
    WRONG_FAMILY,
    WRONG_ROCE_VERSION,
    NcclSettings,
    judge_pick,
    select_gid_index,
)
from rnic_exporter.sim import SimHost
from rnic_exporter.sim.sysfs_root import SimSysfsRoot
from rnic_exporter.sources.reader import ReaderSettings
from tests.support.exposition import samples
from tests.support.sim import refresh_overlay

NETDEV = "ens1f0np0"
LL = "fe80:0000:0000:0000:0e42:a1ff:fe41:2d36"
ULA = "fd00:0000:0000:0000:0000:0000:0000:0001"


def v4(address: str) -> str:
    return ipaddress.IPv6Address(f"::ffff:{address}").exploded


def pair(first: int, gid: str) -> list[GidEntry]:
    return [GidEntry(first, gid, ROCE_V1, NETDEV), GidEntry(first + 1, gid, ROCE_V2, NETDEV)]


def port(gids: list[GidEntry], settings: NcclSettings, size: int = 16) -> Port:
    return Port(
        "mlx5_0",
        1,
        "Ethernet",
        NumberedState(4, "ACTIVE"),
        NumberedState(5, "LinkUp"),
        None,
        0,
        gids=tuple(gids),
        gid_table_size=size,
        nccl_gid_index=select_gid_index(gids, size, "Ethernet", settings),
    )


@pytest.mark.parametrize(
    ("gids", "env", "configured", "problem", "index"),
    [
        pytest.param(pair(0, LL) + pair(2, v4("10.0.0.1")), {}, None, None, 3, id="normal-host-usable"),
        pytest.param(pair(0, LL) + pair(2, ULA), {}, None, LINK_LOCAL, 0, id="ipv6-only-keeps-link-local-0"),
        pytest.param(pair(0, LL), {}, None, LINK_LOCAL, 0, id="no-address-at-all"),
        pytest.param(
            pair(0, LL) + pair(2, ULA),
            {"NCCL_IB_ADDR_FAMILY": "AF_INET6"},
            None,
            None,
            3,
            id="ipv6-only-under-af-inet6-usable",
        ),
        pytest.param(
            [*pair(0, LL), GidEntry(2, v4("10.0.0.1"), ROCE_V1, NETDEV)],
            {},
            None,
            WRONG_ROCE_VERSION,
            2,
            id="only-v1-where-v2-is-asked",
        ),
        pytest.param(
            pair(0, LL) + pair(2, v4("10.0.0.1")),
            {"NCCL_IB_ADDR_RANGE": "192.168.0.0/16"},
            None,
            LINK_LOCAL,
            0,
            id="range-matching-nothing-stays-at-link-local-0",
        ),
        pytest.param(
            pair(0, LL) + pair(2, v4("10.0.0.1")),
            {"NCCL_IB_ADDR_RANGE": "192.168.0.0/16"},
            3,
            OUT_OF_RANGE,
            3,
            id="pinned-index-outside-the-range",
        ),
        pytest.param(pair(0, LL) + pair(2, v4("10.0.0.1")), {}, 5, NO_GID, 5, id="pinned-index-is-empty"),
        pytest.param(pair(0, LL) + pair(2, v4("10.0.0.1")), {}, 1, LINK_LOCAL, 1, id="pinned-index-is-link-local"),
        pytest.param(pair(0, LL) + pair(2, v4("10.0.0.1")), {}, -1, None, 3, id="minus-one-is-auto"),
    ],
)
def test_judge_pick(
    gids: list[GidEntry], env: dict[str, str], configured: int | None, problem: str | None, index: int
) -> None:
    settings = nccl_settings(env)
    pick = judge_pick(port(gids, settings), settings, configured)
    assert (pick.problem, pick.index, pick.usable) == (problem, index, problem is None)
    assert pick.configured == (configured is not None and configured >= 0)


def test_environment_beats_the_config_file_for_every_nccl_setting() -> None:
    file_env = {"NCCL_IB_ADDR_FAMILY": "AF_INET6", "NCCL_IB_ROCE_VERSION_NUM": "1", "NCCL_IB_GID_INDEX": "3"}
    merged = nccl_environment(file_env, {"NCCL_IB_ROCE_VERSION_NUM": "2", "NCCL_IB_GID_INDEX": "5", "HOME": "/"})
    assert merged == {"NCCL_IB_ADDR_FAMILY": "AF_INET6", "NCCL_IB_ROCE_VERSION_NUM": "2", "NCCL_IB_GID_INDEX": "5"}
    assert gid_index_from_env(merged) == 5 and gid_index_from_env({"NCCL_IB_GID_INDEX": ""}) is None
    # NCCL's strtoll: " " and "three" are 0 (a pinned index 0), not an error.
    assert gid_index_from_env({"NCCL_IB_GID_INDEX": " "}) == 0
    assert gid_index_from_env({"NCCL_IB_GID_INDEX": "three"}) == 0


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), env=env)
    return result.exit_code, result.output


def check_json(host: SimHost, *extra: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, object]]:
    code, out = invoke(
        "check", "--path.sysfs", str(host.root), "--no-netlink", "--state.dir", "", "--json", *extra, env=env
    )
    return code, json.loads(out)


def problems(report: dict[str, object]) -> list[dict[str, str]]:
    found = report["problems"]
    assert isinstance(found, list)
    return found


def test_ipv6_only_roce_table_is_a_critical_problem(host: SimHost) -> None:
    assert check_json(host)[0] == Exit.OK
    host.ipv6_only("mlx5_1")
    code, report = check_json(host)
    assert code == Exit.PROBLEMS
    [problem] = problems(report)
    assert problem["code"] == "nccl_gid_unusable" and problem["severity"] == "critical"
    assert problem["where"] == "mlx5_1 port 1 (ens2f0np0)"
    assert "link-local" in problem["what"] and "index 0 holds v1 fe80::" in problem["what"]
    assert "IPv4 address back" in problem["fix"] and "NCCL_IB_ADDR_FAMILY=AF_INET6" in problem["fix"]
    # What NCCL itself would do with AF_INET6: the ULA's v2 GID on mlx5_1 is usable, and the IPv4-only
    # mlx5_0 now has no GID of the wanted family (NCCL keeps its link-local index 0 there).
    code, report = check_json(host, env={"NCCL_IB_ADDR_FAMILY": "AF_INET6"})
    assert code == Exit.PROBLEMS and [p["where"] for p in problems(report)] == ["mlx5_0 port 1 (ens1f0np0)"]
    assert "a routable AF_INET6 address" in problems(report)[0]["fix"]
    code, out = invoke("check", "--path.sysfs", str(host.root), "--no-netlink", "--state.dir", "")
    assert code == Exit.PROBLEMS and "[CRITICAL] mlx5_1 port 1 (ens2f0np0): NCCL's auto-selection uses" in out


def test_config_file_nccl_family_is_what_check_judges(host: SimHost, tmp_path: Path) -> None:
    host.ipv6_only("mlx5_0")
    host.ipv6_only("mlx5_1")
    config = tmp_path / "rnic.toml"
    config.write_text('[nccl]\nib_addr_family = "AF_INET6"\n')
    assert check_json(host, "--config", str(config))[0] == Exit.OK
    code, report = check_json(host, "--config", str(config), env={"NCCL_IB_ADDR_FAMILY": "AF_INET"})
    assert code == Exit.PROBLEMS and [p["code"] for p in problems(report)] == ["nccl_gid_unusable"] * 2


def test_pinned_index_is_judged_as_nccl_uses_it(host: SimHost) -> None:
    host.ipv6_only("mlx5_0")
    host.ipv6_only("mlx5_1")
    # NCCL uses a pinned index without looking at NCCL_IB_ADDR_FAMILY: the ULA's RoCE v2 GID works,
    # and check agrees with rnic_nccl_gid_usable on it.
    assert check_json(host, env={"NCCL_IB_GID_INDEX": "3"})[0] == Exit.OK
    env = {"NCCL_IB_GID_INDEX": "3", "NCCL_IB_ADDR_FAMILY": "AF_INET6"}
    assert check_json(host, env=env)[0] == Exit.OK  # an IPv6 fabric pinning its ULA GID
    code, report = check_json(host, env={**env, "NCCL_IB_GID_INDEX": "1"})
    assert code == Exit.PROBLEMS
    assert [p["what"].split(" (")[0] for p in problems(report)] == [
        "NCCL_IB_GID_INDEX=1 points at a link-local GID, which is not routable between nodes"
    ] * 2
    # The fix names the family NCCL wants, not the IPv4 rows it would ignore.
    assert all("RoCE v2 routable IPv6 GID index" in p["fix"] and "IPv4" not in p["fix"] for p in problems(report))


def test_unreadable_gid_table_says_so_instead(host: SimHost, tmp_path: Path) -> None:
    from rnic_exporter.commands.check import run_check
    from rnic_exporter.sources.address_risks import HostPaths

    port = "class/infiniband/mlx5_0/ports/1"
    host.fail_with(f"{port}/gids", errno.EIO)  # the listing fails
    host.fail_with("class/infiniband/mlx5_1/ports/1/gid_attrs/types/3", errno.EIO)  # one slot NCCL compares
    report = run_check(
        host.root,
        None,
        DetectionSettings(),
        ReaderSettings(),
        HostPaths(rootfs=tmp_path / "none"),
        use_netlink=False,
        root=SimSysfsRoot(host.root, errno_overlay=host.errno_overlay),
    )
    found = [(p.code, p.severity, p.where, p.what) for p in report.problems]
    assert found == [
        ("gid_table_unreadable", "warning", "mlx5_0 port 1 (ens1f0np0)", "the GID table could not be read: gids (EIO)"),
        (
            "gid_table_unreadable",
            "warning",
            "mlx5_1 port 1 (ens2f0np0)",
            "the GID table could not be read: gid_attrs/types/3 (EIO)",
        ),
    ], found
    assert report.failed("warning") and not report.failed("critical")


def test_a_tree_without_gids_says_so_and_does_not_fail(host: SimHost) -> None:
    host.drop_gid_table("mlx5_0")
    code, report = check_json(host)
    assert code == Exit.OK
    [problem] = problems(report)
    assert (problem["code"], problem["severity"], problem["reason"]) == ("gid_table_unreadable", "info", "gids_missing")
    assert "GID table could not be read: gids/" in problem["what"]
    assert "add an IPv4" not in json.dumps(report)


def test_ports_nccl_does_not_use_over_roce_are_not_judged(host: SimHost) -> None:
    host.ipv6_only("mlx5_0")
    host.corrupt("mlx5_0", "node_type", "4: RNIC\n")  # iWARP: NCCL's IB transport does not run RoCE on it
    host.ipv6_only("mlx5_1")
    host.set_port_up("mlx5_1", False)  # ncclIbInit skips ports that are not ACTIVE
    _, report = check_json(host)
    assert [p["code"] for p in problems(report)] == ["port_down"], report


def agent_for(host: SimHost, tmp_path: Path) -> Agent:
    config = ServeConfig(
        sysfs=host.root,
        state_dir=tmp_path / "state",
        detection=DetectionSettings(),
        reader=ReaderSettings(),
        watch_netlink=False,
        watch_udev=False,
    )
    return Agent(config, SimSysfsRoot(host.root, hold_fds=True, errno_overlay=host.errno_overlay))


def test_metric_and_events_follow_the_pick(host: SimHost, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    agent = agent_for(host, tmp_path)
    try:

        def usable() -> dict[str, float]:
            body = agent.prometheus.render(None, None)[0].decode()
            return {
                dict(labels)["device"]: v
                for (name, labels), v in samples(body).items()
                if name == "rnic_nccl_gid_usable"
            }

        agent.poll_once(full_gid_tables=True)
        assert usable() == {"mlx5_0": 1, "mlx5_1": 1}  # mlx5_2 is InfiniBand: no series
        with caplog.at_level(logging.INFO, logger="rnic_exporter.events"):
            host.ipv6_only("mlx5_0")
            refresh_overlay(agent.reader.root, host.errno_overlay)
            agent.poll_once(full_gid_tables=True)
            assert usable() == {"mlx5_0": 0, "mlx5_1": 1}
            agent.poll_once(full_gid_tables=True)  # still unusable: no second event
            host.add_address("mlx5_0", "10.0.0.1")
            refresh_overlay(agent.reader.root, host.errno_overlay)
            agent.poll_once(full_gid_tables=True)
            assert usable() == {"mlx5_0": 1, "mlx5_1": 1}
        fired = [r for r in caplog.records if getattr(r, "fields", {}).get("event", "").startswith("rnic.nccl.gid_u")]
        assert [r.fields["event"] for r in fired] == [ev.NCCL_GID_UNUSABLE.name, ev.NCCL_GID_USABLE.name]  # type: ignore[attr-defined]
        assert fired[0].fields["reason"] == LINK_LOCAL and fired[0].levelno == logging.WARNING  # type: ignore[attr-defined]
        body = agent.prometheus.render(None, None)[0].decode()
        assert (
            samples(body)[
                (
                    "rnic_events_total",
                    frozenset({("event", ev.NCCL_GID_UNUSABLE.name), ("device", "mlx5_0"), ("port", "1")}),
                )
            ]
            == 1
        )
    finally:
        agent.close()


@pytest.mark.parametrize(
    ("env", "pinned", "problem"),
    [
        pytest.param({"NCCL_IB_ADDR_FAMILY": "AF_INET"}, 5, WRONG_FAMILY, id="ipv6-pin-where-af-inet-stated"),
        pytest.param({"NCCL_IB_ADDR_FAMILY": "AF_INET6"}, 3, WRONG_FAMILY, id="ipv4-pin-where-af-inet6-stated"),
        pytest.param({"NCCL_IB_ADDR_RANGE": "10.0.0.0/8"}, 5, WRONG_FAMILY, id="ipv6-pin-where-an-ipv4-range-stated"),
        pytest.param({"NCCL_IB_ADDR_FAMILY": "AF_INET6"}, 5, None, id="ipv6-pin-where-af-inet6-stated"),
        pytest.param({"NCCL_IB_ADDR_FAMILY": "af_inet6"}, 5, None, id="a-misspelt-family-states-nothing"),
        pytest.param({}, 5, None, id="nothing-stated-usable-but-differs"),
    ],
)
def test_pinned_index_judged_by_the_stated_family(env: dict[str, str], pinned: int, problem: str | None) -> None:
    settings = nccl_settings(env)
    pick = judge_pick(port(pair(0, LL) + pair(2, v4("10.0.0.1")) + pair(4, ULA), settings), settings, pinned)
    assert (pick.problem, pick.usable) == (problem, problem is None)


def test_unstated_family_pin_names_nccls_own_choice() -> None:
    settings = nccl_settings({})
    table = port(pair(0, LL) + pair(2, v4("10.0.0.1")) + pair(4, ULA), settings)
    assert judge_pick(table, settings, 5).differs_from_auto == "index 3 holds v2 10.0.0.1"
    assert judge_pick(table, settings, 3).differs_from_auto is None  # the same GID NCCL would pick
    assert judge_pick(table, settings, None).differs_from_auto is None  # auto-selection is NCCL's choice


def test_check_and_gauge_judge_a_pin_of_another_family_alike(host: SimHost, tmp_path: Path) -> None:
    """The incident: a pin on the IPv6 GID of a port whose fabric routes IPv4 RoCE v2. Stated family:
    critical in check and 0 in rnic_nccl_gid_usable; nothing stated: a warning naming both indexes."""
    ula_v2 = host.add_address("mlx5_0", "fd00:0:0:9::1")[-1]
    assert host.add_address("mlx5_1", "fd00:0:0:a::1")[-1] == ula_v2  # the pin is host-wide
    ipv4_v2 = 3
    code, report = check_json(host, env={"NCCL_IB_GID_INDEX": str(ula_v2)})
    assert code == Exit.PROBLEMS
    problem = problems(report)[0]
    assert len(problems(report)) == 2 and problem["where"].startswith("mlx5_0 ")
    assert (problem["code"], problem["severity"], problem["reason"]) == (
        "nccl_gid_family_differs",
        "warning",
        "family_differs",
    )
    assert f"NCCL_IB_GID_INDEX={ula_v2} " in problem["what"] and f"index {ipv4_v2} holds v2 10." in problem["what"]
    # NCCL's own choice is the index `gids` marks (and rnic_nccl_gid_index reports): one judgement.
    code, out = invoke("gids", "--path.sysfs", str(host.root), "--device", "mlx5_0", "--json")
    assert code == Exit.OK and json.loads(out)["ports"][0]["nccl_gid_index"] == ipv4_v2
    assert check_json(host, "--fail-on", "critical", env={"NCCL_IB_GID_INDEX": str(ula_v2)})[0] == Exit.OK
    env = {"NCCL_IB_GID_INDEX": str(ula_v2), "NCCL_IB_ADDR_FAMILY": "AF_INET"}
    code, report = check_json(host, env=env)
    assert code == Exit.PROBLEMS
    problem = problems(report)[0]
    assert [(p["code"], p["severity"]) for p in problems(report)] == [("nccl_gid_index_invalid", "critical")] * 2
    assert "another address family" in problem["what"]
    nccl = nccl_settings(env)
    config = ServeConfig(
        sysfs=host.root,
        state_dir=tmp_path / "state",
        detection=DetectionSettings(nccl_gid_index=ula_v2, nccl=nccl),
        reader=ReaderSettings(nccl=nccl),
        watch_netlink=False,
        watch_udev=False,
    )
    agent = Agent(config, SimSysfsRoot(host.root, hold_fds=True, errno_overlay=host.errno_overlay))
    try:
        agent.poll_once(full_gid_tables=True)
        body = agent.prometheus.render(None, None)[0].decode()
        usable = {dict(lb)["device"]: v for (n, lb), v in samples(body).items() if n == "rnic_nccl_gid_usable"}
        assert usable["mlx5_0"] == 0
    finally:
        agent.close()
