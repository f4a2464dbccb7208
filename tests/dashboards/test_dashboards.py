"""The Grafana dashboards: committed JSON is a fresh generation, every query names catalogue metrics and events,
uses the `$datasource` variable, passes promtool, and parses and returns data on a real Prometheus scraping
`serve` over a simulated host."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rnic_exporter.catalog import events
from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.dashboards import generate, recording
from rnic_exporter.sim import SimHost
from tests.support.dashboards import panels, substitute
from tests.support.processes import Prometheus, exporter, free_port, http_get, require_binary
from tests.support.promql import metric_names
from tests.support.serve import serve_args
from tests.support.wait import wait_for

REPO = Path(__file__).resolve().parents[2]
DASHBOARD_DIR = REPO / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>\w+)\)$")
_EVENT_MATCHER = re.compile(r'\bevent\s*=~?\s*"([^"]*)"')


@pytest.fixture(scope="module")
def dashboards() -> dict[str, dict[str, Any]]:
    return {filename: json.loads(text) for filename, text in generate().items()}


def _queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target, variable and annotation."""
    for panel in panels(dashboard):
        for t in panel.get("targets", []):
            yield f"panel {panel['title']!r} {t['refId']}", t["expr"]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            match = _LABEL_VALUES.match(var["query"]["query"])
            assert match, f"variable {var['name']}: {var['query']} is not label_values(selector, label)"
            yield f"variable {var['name']}", f"group by ({match['label']}) ({match['selector']})"
    for annotation in dashboard["annotations"]["list"]:
        yield f"annotation {annotation['name']!r}", annotation["expr"]


def test_committed_json_is_a_fresh_generation() -> None:
    fresh = generate()
    committed = {path.name: path.read_text() for path in DASHBOARD_DIR.glob("*.json")}
    assert set(committed) == set(fresh), "dashboards/ holds other files than the generator writes"
    for filename, text in fresh.items():
        assert committed[filename] == text, (
            f"dashboards/{filename} is stale: run `python -m rnic_exporter.dashboards --out dashboards`"
        )


def test_generation_command_writes_the_files(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rnic_exporter.dashboards", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == generate()


def test_generation_without_grafanalib_says_which_extra_to_install(tmp_path: Path) -> None:
    code = (
        "import runpy, sys; sys.modules['grafanalib'] = None; "
        f"sys.argv = ['x', '--out', {str(tmp_path / 'out')!r}]; "
        "runpy.run_module('rnic_exporter.dashboards', run_name='__main__')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 2 and "'.[dashboards]'" in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


def test_the_daemon_never_loads_grafanalib() -> None:
    code = (
        "import sys, rnic_exporter.cli, rnic_exporter.daemon.serve; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'grafanalib' "
        "or m.startswith('rnic_exporter.dashboards')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_every_panel_target_variable_and_annotation_uses_the_datasource_variable(
    dashboards: dict[str, dict[str, Any]],
) -> None:
    for filename, dashboard in dashboards.items():
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
        for panel in panels(dashboard):
            if panel["type"] == "row":
                continue
            assert panel["datasource"] == DATASOURCE, f"{filename}: panel {panel['title']!r}"
            assert panel["targets"], f"{filename}: panel {panel['title']!r} has no query"
            for t in panel["targets"]:
                assert t["datasource"] == DATASOURCE, f"{filename}: panel {panel['title']!r} {t['refId']}"
        for var in variables.values():
            if var["type"] == "query":
                assert var["datasource"] == DATASOURCE, f"{filename}: variable {var['name']}"
        for annotation in dashboard["annotations"]["list"]:
            assert annotation["datasource"] == DATASOURCE, f"{filename}: annotation {annotation['name']}"


def test_dashboards_have_the_variables_and_panel_kinds_asked_for(dashboards: dict[str, dict[str, Any]]) -> None:
    fleet, host = dashboards["rnic-fleet-overview.json"], dashboards["rnic-host-detail.json"]
    assert [v["name"] for v in fleet["templating"]["list"]] == ["datasource", "instance"]
    assert [v["name"] for v in host["templating"]["list"]] == ["datasource", "instance", "device", "port"]
    kinds = {p["type"] for d in dashboards.values() for p in panels(d)}
    assert {"timeseries", "stat", "table", "state-timeline"} <= kinds
    assert not kinds & {"graph", "singlestat", "table-old"}, "deprecated panel types"
    for filename, dashboard in dashboards.items():
        assert dashboard["schemaVersion"] >= 36 and dashboard["uid"] == filename.removesuffix(".json")
        ids = [p["id"] for p in panels(dashboard)]
        assert len(ids) == len(set(ids)) and None not in ids
        for panel in panels(dashboard):
            if panel["type"] == "row":
                continue
            assert panel["description"], f"{filename}: panel {panel['title']!r} has no description"
            defaults = panel["fieldConfig"]["defaults"]
            if panel["type"] in {"timeseries", "stat"}:
                assert defaults["unit"], f"{filename}: panel {panel['title']!r} has no unit"
            if panel["type"] in {"stat", "state-timeline"}:
                steps = defaults["thresholds"]["steps"]
                assert steps[0]["value"] is None and len(steps) >= 2, f"{filename}: {panel['title']!r} thresholds"
    gid_table = next(p for p in panels(host) if p["title"] == "GID table")
    assert metric_names(gid_table["targets"][0]["expr"]) == {catalog.GID_ENTRY_INFO.name}


def test_every_metric_in_a_query_is_in_the_catalogue(dashboards: dict[str, dict[str, Any]]) -> None:
    used: set[str] = set()
    for filename, dashboard in dashboards.items():
        for where, expr in _queries(dashboard):
            names = metric_names(expr)
            assert names, f"{filename} {where}: no metric found in {expr}"
            unknown = names - set(catalog.BY_NAME) - set(recording.BY_RECORD)
            assert not unknown, (
                f"{filename} {where} names {sorted(unknown)}, which neither rnic_exporter/catalog/metrics.py nor the "
                "recording rules have"
            )
            used |= _sources(names)
    # The headline signals of the issue are all on a dashboard.
    wanted = {
        catalog.DEVICE_PRESENT,
        catalog.PORT_UP,
        catalog.LINK_BELOW_RATED,
        catalog.GID_TABLE_HASH,
        catalog.GID_V2_IPV4_INDEX,
        catalog.NCCL_GID_INDEX,
        catalog.NETDEV_ADDRESS_PRESENT,
        catalog.PORT_FLAPPING,
        catalog.NETDEV_ADDRESS_LOSS_RISK,
        catalog.PORT_PMA,
        catalog.PORT_HW_STAT,
        catalog.PORT_DATA_RECEIVED,
        catalog.PORT_DATA_TRANSMITTED,
        catalog.PORT_RATED_RATE,
        catalog.PCIE_LINK_SPEED,
        catalog.PCIE_LINK_WIDTH,
        catalog.GID_ENTRY_INFO,
        catalog.EVENTS,
        catalog.NCCL_CONFIGURED_GID_INDEX_VALID,
    }
    assert {spec.name for spec in wanted} - used == set()


def _sources(names: set[str]) -> set[str]:
    """The catalogue metrics behind `names`: a recorded series stands for what its rule reads."""
    out: set[str] = set()
    for name in names:
        rule = recording.BY_RECORD.get(name)
        out |= _sources(metric_names(rule.expr)) if rule else {name}
    return out


def test_every_fleet_panel_reads_recorded_series(dashboards: dict[str, dict[str, Any]]) -> None:
    """A refresh over 10,000 nodes must not scan every raw series: each fleet panel query reads the
    recording rules, or a raw metric that is one series per node already (no device label)."""
    fleet = dashboards["rnic-fleet-overview.json"]
    recorded_panels = 0
    for where, expr in _queries(fleet):
        raw = metric_names(expr) - set(recording.BY_RECORD)
        per_node = {name for name in raw if "device" not in catalog.BY_NAME[name].labels}
        assert raw == per_node, f"fleet {where} scans raw per-port series {sorted(raw - per_node)}: {expr}"
        recorded_panels += bool(metric_names(expr) & set(recording.BY_RECORD))
    # Time series step at least a minute: recorded series have one point per evaluation.
    for panel in panels(fleet):
        if panel["type"] == "timeseries":
            assert {t["interval"] for t in panel["targets"]} == {"1m"}, panel["title"]
    assert recorded_panels >= 20
    # Every recording rule is read by some panel (or by a rule a panel reads).
    read = {n for _, expr in _queries(fleet) for n in metric_names(expr)}
    read |= {n for rule in recording.RULES if rule.record in read for n in metric_names(rule.expr)}
    assert set(recording.BY_RECORD) <= read, sorted(set(recording.BY_RECORD) - read)


def test_metric_name_extraction_sees_through_promql() -> None:
    expr = (
        'topk(10, sum by (instance, counter) (increase(rnic_port_pma_total{counter=~"a|b", port="1"}[$__range])))'
        " / on (instance) group_left (device) max without (source) (rnic_port_rated_rate_bytes_per_second)"
        " or vector(0) unless rnic_port_up offset 5m > bool 1e9"
    )
    assert metric_names(expr) == {"rnic_port_pma_total", "rnic_port_rated_rate_bytes_per_second", "rnic_port_up"}
    assert metric_names("sum(rnic_no_such_metric)") == {"rnic_no_such_metric"}


def test_annotations_mark_catalogue_events(dashboards: dict[str, dict[str, Any]]) -> None:
    host = dashboards["rnic-host-detail.json"]
    by_name: dict[str, set[str]] = {}
    for annotation in host["annotations"]["list"]:
        assert metric_names(annotation["expr"]) == {catalog.EVENTS.name}
        by_name[annotation["name"]] = set()
        for alternatives in _EVENT_MATCHER.findall(annotation["expr"]):
            by_name[annotation["name"]] |= {alt.replace("\\\\.", ".") for alt in alternatives.split("|")}
    used = set().union(*by_name.values())
    assert used, "no event names found"
    assert used <= set(events.BY_NAME), f"unknown events {sorted(used - set(events.BY_NAME))}"
    assert events.GID_ADDRESS_MOVED.name in by_name["GID change"]
    assert events.PORT_FLAPPING.name in by_name["Port flap"]
    assert events.ADDRESS_LOST.name in by_name["Address loss"]
    assert events.PORT_DEGRADING.name in by_name["Link degrading"]
    # Every query naming an event at all names a catalogue one.
    for dashboard in dashboards.values():
        for where, expr in _queries(dashboard):
            for alternatives in _EVENT_MATCHER.findall(expr):
                names = {alt.replace("\\\\.", ".") for alt in alternatives.split("|")}
                assert names <= set(events.BY_NAME), f"{where}: {sorted(names - set(events.BY_NAME))}"


def test_every_query_passes_promtool(tmp_path: Path, dashboards: dict[str, dict[str, Any]]) -> None:
    rules = [
        {"record": f"dashboard:query_{i}", "expr": substitute(expr)}
        for i, (_, expr) in enumerate(q for d in dashboards.values() for q in _queries(d))
    ]
    path = tmp_path / "dashboard-queries.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}))
    result = subprocess.run(
        [require_binary("promtool"), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


@pytest.mark.e2e
def test_every_query_runs_on_prometheus_scraping_a_simulated_host(
    tmp_path: Path, dashboards: dict[str, dict[str, Any]]
) -> None:
    """Each query parses on a real Prometheus; each one whose metrics `serve` exposes returns data.

    The faults make the "what changed" queries and the event annotations non-empty: a GID shift, a PCIe
    downtrain, a speed drop, a port down, an address removal and symbol errors (link health judged over
    1 s windows instead of 60 s).
    """
    host = SimHost.build(tmp_path / "sys", roce=3, gid_table_size=16)
    port = free_port()
    (tmp_path / "rnic.toml").write_text("[link_health]\nwindow_seconds = 1\n")
    # 1 s link-health windows and error counters read each second: the annotation's event within the test
    args = serve_args(
        host.root,
        port,
        "--config",
        str(tmp_path / "rnic.toml"),
        "--collector.pma.slow-interval",
        "1s",
        poll=0.2,
        state_dir=tmp_path / "state",
    )
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "rnic-exporter", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}],
    }
    # A configured NCCL index, so the validity panel has a series too.
    with (
        exporter(
            args,
            ready_url=f"http://127.0.0.1:{port}/-/ready",
            log_path=tmp_path / "exporter.log",
            env={"NCCL_IB_GID_INDEX": "3"},
        ),
        Prometheus(tmp_path / "prom", config, [REPO / "alerts" / recording.FILENAME]) as prom,
    ):
        prom.wait_value('count(rnic_gid_table_hash{device="mlx5_0"})')
        host.gid_shift("mlx5_0")
        host.set_pcie("mlx5_1", 16.0, 8)
        host.set_speed("mlx5_1", 200)
        host.set_port_up("mlx5_2", False)
        host.remove_address("mlx5_2", "10.0.2.1")
        host.degrade_link("mlx5_0", {"symbol_error": 1000.0})
        host.add_traffic(1.0)
        prom.wait_value('count(rnic_port_up{device="mlx5_2"} == 0)')

        exposed = {m["metric"]["__name__"] for m in prom.query('{__name__=~"rnic_.+"}')}
        assert {catalog.PORT_UP.name, catalog.GID_TABLE_HASH.name} <= exposed
        # A recorded series must have data once its rule's own expression has some (sparse rules record
        # only faults: no error counter grows here, so their panels only have to parse).
        exposed |= {rule.record for rule in recording.RULES if _query(prom, rule.expr)}
        must_answer: dict[str, str] = {}
        for filename, dashboard in dashboards.items():
            for where, expr in _queries(dashboard):
                promql = substitute(expr)
                _query(prom, promql)  # parses, or fails the test with Prometheus' error
                if metric_names(expr) <= exposed:
                    must_answer[f"{filename} {where}"] = promql

        def silent() -> list[str]:
            return [where for where, promql in must_answer.items() if not _query(prom, promql)]

        def answered() -> bool:
            host.add_traffic(0.1)  # symbol errors keep rising until link health judges a window
            return not silent()

        try:
            wait_for(answered, timeout=20, what="data for every dashboard query")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; still without data: {silent()}") from None
        print(f"{len(must_answer)} of {sum(1 for d in dashboards.values() for _ in _queries(d))} queries answered")
        assert len(must_answer) >= 30, sorted(must_answer)


def _query(prom: Prometheus, promql: str) -> list[dict[str, Any]]:
    status, _, body = http_get(f"{prom.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    data = json.loads(body)
    assert status == 200 and data["status"] == "success", f"{promql}: {data.get('error', body[:300])}"
    result: list[dict[str, Any]] = data["data"]["result"]
    return result


def test_the_workloads_panel_names_the_job_and_pod_on_each_device(
    tmp_path: Path, dashboards: dict[str, dict[str, Any]]
) -> None:
    """The host dashboard's workload table, on a real Prometheus scraping the daemon with the simulator's
    fake verbs users (its scan plugged into the daemon's one scan seam)."""
    import threading

    from rnic_exporter.config.file import ConsumerSettings
    from rnic_exporter.daemon.agent import ServeConfig
    from rnic_exporter.daemon.serve import run
    from rnic_exporter.sim import SimProcfs
    from rnic_exporter.sources.address_risks import HostPaths

    host = SimHost.build(tmp_path / "sys", roce=2, gid_table_size=16)
    users = SimProcfs(host, tmp_path / "proc", tmp_path / "root")
    users.slurm_job("4242", ["mlx5_1"])
    users.pod("team-a", "trainer-0", "6c1f3a52-8d0e-4b7e-9a43-1b2c3d4e5f60", ["mlx5_0"])
    port = free_port()
    config = ServeConfig(
        sysfs=host.root,
        listen=(f"127.0.0.1:{port}",),
        poll_interval_s=0.5,
        state_dir=None,
        watch_netlink=False,
        watch_udev=False,
        ethtool=False,
        host_paths=HostPaths(procfs=users.procfs, rootfs=tmp_path / "root"),
        consumers=ConsumerSettings(enabled=True),
    )
    stop = threading.Event()
    daemon = threading.Thread(target=run, args=(config,), kwargs={"stop": stop, "scan": users.scan})
    daemon.start()
    panel = next(p for p in panels(dashboards["rnic-host-detail.json"]) if p["title"] == "Jobs and pods per device")
    assert metric_names(panel["targets"][0]["expr"]) == {catalog.DEVICE_WORKLOAD_INFO.name}
    scrape = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "rnic-exporter", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}],
    }
    try:
        with Prometheus(tmp_path / "prom", scrape) as prom:
            promql = substitute(panel["targets"][0]["expr"])

            def both() -> list[dict[str, Any]] | None:
                result = _query(prom, promql)
                return result if len(result) == 2 else None

            rows = wait_for(both, timeout=30, what="a row per device in the workloads table")
    finally:
        stop.set()
        daemon.join(30)
    by_device = {r["metric"]["device"]: r["metric"] for r in rows}
    assert by_device["mlx5_1"]["kind"] == "slurm" and by_device["mlx5_1"]["slurm_job_id"] == "4242"
    assert (by_device["mlx5_0"]["k8s_namespace_name"], by_device["mlx5_0"]["k8s_pod_name"]) == ("team-a", "trainer-0")
