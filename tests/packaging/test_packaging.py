"""packaging/ (systemd, OTel Collector, Grafana), the Dockerfile and `rnic-exporter bundle`, checked by
the tools that judge them where this machine has them (systemd-analyze, hadolint), and otherwise
against the code they configure (serve's flags, the config loader, the OTLP resource).

Kubernetes manifests: tests/packaging/test_packaging_kubernetes.py.
Wheel, sdist and a fresh venv: tests/packaging/test_release.py.
"""

from __future__ import annotations

import copy
import filecmp
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from rnic_exporter.cli import main
from rnic_exporter.commands import bundle
from rnic_exporter.daemon.agent import DEFAULT_PORT
from tests.support.cli import serve_flags
from tests.support.processes import require_binary, venv_tool

REPO = Path(__file__).resolve().parents[2]
SYSTEMD = REPO / "packaging/systemd"
UNIT = SYSTEMD / "rnic-exporter.service"
INSTALLED_BINARY = "/opt/rnic-exporter/bin/rnic-exporter"  # the layout the unit and docs/deployment.md document
OTEL = REPO / "packaging/otel-collector/config.yaml"
GRAFANA = REPO / "packaging/grafana/provisioning"
DOCKERFILE = REPO / "Dockerfile"


def _flags_in(args: list[str]) -> set[str]:
    return {arg.split("=", 1)[0] for arg in args if arg.startswith("--")}


# --- systemd --------------------------------------------------------------------------------------


def _unit_entries(text: str) -> dict[str, list[str]]:
    """Key -> every value given (systemd allows repeats, e.g. SystemCallFilter=), comments and sections aside."""
    entries: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            entries.setdefault(key, []).append(value)
    return entries


@pytest.fixture
def unit_for_this_machine(tmp_path: Path) -> Path:
    """The unit with ExecStart at this venv's binary: verify rejects a unit whose binary is missing."""
    binary = Path(sys.executable).with_name("rnic-exporter")
    assert binary.is_file(), f"{binary} missing: the package is not installed in this venv"
    text = UNIT.read_text()
    assert text.count(f"ExecStart={INSTALLED_BINARY} ") == 1
    unit = tmp_path / UNIT.name
    unit.write_text(text.replace(f"ExecStart={INSTALLED_BINARY} ", f"ExecStart={binary} "))
    return unit


def _verify(unit: Path) -> subprocess.CompletedProcess[str]:
    # verify exits 0 on unknown keys and unparseable values; only its output tells.
    return subprocess.run(
        [require_binary("systemd-analyze"), "verify", str(unit)], capture_output=True, text=True, timeout=60
    )


def test_systemd_unit_verifies_without_a_single_warning(unit_for_this_machine: Path) -> None:
    result = _verify(unit_for_this_machine)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_systemd_verify_would_report_a_misspelt_setting(unit_for_this_machine: Path) -> None:
    text = unit_for_this_machine.read_text()
    unit_for_this_machine.write_text(text.replace("ProtectSystem=strict", "ProtectSytem=strict"))
    result = _verify(unit_for_this_machine)
    assert "ProtectSytem" in result.stdout + result.stderr


def test_systemd_security_exposure_is_2_or_better(unit_for_this_machine: Path) -> None:
    # --threshold is on systemd's 0-100 scale: 20 = an exposure of 2.0 as displayed.
    result = subprocess.run(
        [require_binary("systemd-analyze"), "security", "--offline=yes", "--threshold=20", str(unit_for_this_machine)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    score = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert score is not None and float(score[1]) <= 2.0, result.stdout[-500:]


def test_systemd_unit_gives_the_daemon_what_it_needs_and_no_more() -> None:
    unit = _unit_entries(UNIT.read_text())
    assert unit["DynamicUser"] == ["yes"]
    assert unit["StateDirectory"] == ["rnic-exporter"]
    (exec_start,) = unit["ExecStart"]
    argv = shlex.split(exec_start)
    assert argv[:2] == [INSTALLED_BINARY, "serve"] and argv[-1] == "$ARGS"
    assert "--state.dir=/var/lib/rnic-exporter" in argv  # where StateDirectory= puts it
    assert _flags_in(argv) <= serve_flags()
    assert unit["EnvironmentFile"] == ["-/etc/default/rnic-exporter"]
    assert unit["ReadOnlyPaths"] == ["/sys"] and unit["ProtectSystem"] == ["strict"]
    families = unit["RestrictAddressFamilies"][0].split()
    assert "AF_NETLINK" in families  # rtnetlink, ethtool and uevents
    assert {"AF_PACKET", "AF_BLUETOOTH"}.isdisjoint(families)
    # The host's netdevs must stay visible, and libudev ignores uevents from an unmapped uid 0.
    assert "PrivateNetwork" not in unit and "PrivateUsers" not in unit
    assert unit["CapabilityBoundingSet"] == [""] and unit["NoNewPrivileges"] == ["yes"]


def test_environment_file_sets_args_of_serve_flags() -> None:
    text = (SYSTEMD / "rnic-exporter.default").read_text()
    (line,) = [ln for ln in text.splitlines() if ln.startswith("ARGS=")]
    args = shlex.split(line.removeprefix("ARGS="))
    assert args and _flags_in(args) <= serve_flags()


# --- flags named anywhere in the deployment files --------------------------------------------------

_ARG_LINE = re.compile(r"rnic-exporter serve|ARGS=|^\s*#?\s*- --|^CMD ")
_DOTTED_FLAG = re.compile(r"--[a-z]+\.[a-z0-9.-]+[a-z0-9]")


def test_every_exporter_flag_in_the_deployment_files_exists() -> None:
    """A unit, manifest or example that names a flag `serve` does not have would fail at start-up."""
    units = [p for p in sorted(SYSTEMD.rglob("*")) if p.is_file()]  # with the drop-ins
    files = [*units, REPO / "packaging/kubernetes/daemonset.yaml", OTEL, DOCKERFILE]
    files += [REPO / "README.md", REPO / "docs/deployment.md"]
    named: dict[str, str] = {}
    for path in files:
        for line in path.read_text().splitlines():
            if _ARG_LINE.search(line):
                named.update((flag, path.name) for flag in _DOTTED_FLAG.findall(line))
    unknown = {flag: where for flag, where in named.items() if flag not in serve_flags()}
    assert unknown == {}
    assert {"--path.sysfs", "--state.dir", "--otlp.endpoint", "--web.listen-address"} <= named.keys()


# --- container --------------------------------------------------------------------------------------


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#")))
    return [
        (ln.split(None, 1)[0].upper(), ln.split(None, 1)[1] if " " in ln.strip() else "")
        for ln in joined.splitlines()
        if ln.strip()
    ]


def _hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    binary = venv_tool("hadolint")
    return subprocess.run(
        [binary, "--no-color", "--failure-threshold", "style", str(path)], capture_output=True, text=True, timeout=60
    )


def test_dockerfile_passes_hadolint() -> None:
    result = _hadolint(DOCKERFILE)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_hadolint_would_flag_an_unpinned_apt_install(tmp_path: Path) -> None:
    broken = tmp_path / "Dockerfile"
    unpinned = "RUN apt-get install -y curl\nUSER 65534:65534"
    broken.write_text(DOCKERFILE.read_text().replace("USER 65534:65534", unpinned))
    result = _hadolint(broken)
    assert result.returncode != 0 and "DL3008" in result.stdout


def test_dockerfile_is_multi_stage_non_root_and_runs_serve() -> None:
    steps = _instructions(DOCKERFILE.read_text())
    stages = [i for i, (op, _) in enumerate(steps) if op == "FROM"]
    assert len(stages) >= 2
    final = steps[stages[-1] :]
    ops = dict(final)  # last of each instruction in the runtime stage
    assert re.fullmatch(r"\d+:\d+", ops["USER"]) and not ops["USER"].startswith("0:")
    assert json.loads(ops["ENTRYPOINT"]) == ["rnic-exporter"]
    cmd = json.loads(ops["CMD"])
    assert cmd[0] == "serve" and _flags_in(cmd) <= serve_flags()
    assert "--path.sysfs=/host/sys" in cmd  # the documented mount of the host's /sys
    assert ops["EXPOSE"] == str(DEFAULT_PORT)
    # It follows the exporter's own flags (tests/web/test_web_health.py runs it against a real serve).
    assert json.loads(ops["HEALTHCHECK"].split("CMD", 1)[1]) == ["python", "-m", "rnic_exporter.commands.healthcheck"]
    # The runtime stage takes the build stage's venv and installs nothing itself.
    assert any(op == "COPY" and args.startswith("--from=build") for op, args in final)
    assert not any(op == "RUN" and "pip" in args for op, args in final)


def test_dockerfile_copies_only_files_that_exist() -> None:
    for op, args in _instructions(DOCKERFILE.read_text()):
        if op == "COPY" and not args.startswith("--from"):
            *sources, _dest = args.split()
            missing = [src for src in sources if not (REPO / src).exists()]
            assert missing == [], f"COPY {args}: not in the repository"


# --- OpenTelemetry Collector ------------------------------------------------------------------------

ALL_SIGNALS = frozenset({"metrics", "logs", "traces"})
# Component types of otelcol-contrib we use, with the signals each supports (their metadata.yaml).
SIGNALS: dict[str, dict[str, frozenset[str]]] = {
    "receivers": {"otlp": ALL_SIGNALS},
    "processors": {"memory_limiter": ALL_SIGNALS, "resource": ALL_SIGNALS, "batch": ALL_SIGNALS},
    "exporters": {"prometheusremotewrite": frozenset({"metrics"}), "otlp_http": ALL_SIGNALS, "debug": ALL_SIGNALS},
}
# Component types the collector renamed (v0.144.0, open-telemetry/opentelemetry-collector#14396): the old
# names still load but log a deprecation warning at every start and will be removed.
DEPRECATED: dict[str, dict[str, str]] = {"exporters": {"otlphttp": "otlp_http", "otlp": "otlp_grpc"}}
_ENDPOINT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["endpoint"],
    "properties": {"endpoint": {"type": "string", "pattern": r"^[\w.-]*:\d+$"}},
}
# The settings we use, from each component's config struct; closed, so a misspelt key fails here as it
# fails `otelcol validate`.
COMPONENT_SCHEMAS: dict[str, dict[str, Any]] = {
    "health_check": _ENDPOINT,
    "otlp": {
        "type": "object",
        "additionalProperties": False,
        "required": ["protocols"],
        "properties": {
            "protocols": {
                "type": "object",
                "additionalProperties": False,
                "minProperties": 1,
                "properties": {"grpc": _ENDPOINT, "http": _ENDPOINT},
            }
        },
    },
    "memory_limiter": {
        "type": "object",
        "additionalProperties": False,
        "required": ["check_interval"],
        "properties": {
            "check_interval": {"type": "string"},
            "limit_percentage": {"type": "integer", "minimum": 1, "maximum": 100},
            "spike_limit_percentage": {"type": "integer", "minimum": 0, "maximum": 100},
        },
    },
    "resource": {
        "type": "object",
        "additionalProperties": False,
        "required": ["attributes"],
        "properties": {
            "attributes": {
                "type": "array",
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["key", "action"],
                    "properties": {
                        "key": {"type": "string"},
                        "value": {},
                        "from_attribute": {"type": "string"},
                        "action": {"enum": ["insert", "update", "upsert", "delete", "hash", "extract"]},
                    },
                },
            }
        },
    },
    "batch": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "timeout": {"type": "string"},
            "send_batch_size": {"type": "integer"},
            "send_batch_max_size": {"type": "integer"},
        },
    },
    "prometheusremotewrite": {
        "type": "object",
        "additionalProperties": False,
        "required": ["endpoint"],
        "properties": {
            "endpoint": {"type": "string", "pattern": r"^https?://"},
            "resource_to_telemetry_conversion": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"enabled": {"type": "boolean"}},
            },
            "timeout": {"type": "string", "pattern": r"^\d+(ms|s|m)$"},
            # Its config.go: RemoteWriteQueue (a 0 size with enabled drops everything, so it fails
            # validation) and exporterhelper's RetrySettings.
            "remote_write_queue": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "enabled": {"type": "boolean"},
                    "queue_size": {"type": "integer", "minimum": 1},
                    "num_consumers": {"type": "integer", "minimum": 1},
                },
            },
            "retry_on_failure": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "enabled": {"type": "boolean"},
                    "initial_interval": {"type": "string", "pattern": r"^\d+(ms|s|m)$"},
                    "max_interval": {"type": "string", "pattern": r"^\d+(ms|s|m)$"},
                    "max_elapsed_time": {"type": "string", "pattern": r"^\d+(ms|s|m)$"},
                },
            },
        },
    },
    "otlp_http": {
        "type": "object",
        "additionalProperties": False,
        "required": ["endpoint"],
        "properties": {"endpoint": {"type": "string", "pattern": r"^https?://"}},
    },
    "debug": {
        "type": "object",
        "additionalProperties": False,
        "properties": {"verbosity": {"enum": ["basic", "normal", "detailed"]}},
    },
}


def _component_type(component_id: str) -> str:
    return component_id.split("/", 1)[0]  # `type[/name]`


def collector_problems(config: dict[str, Any]) -> list[str]:
    """What `otelcol validate` would reject in the pipeline wiring and in the settings we use."""
    problems: list[str] = []
    service = config.get("service", {})
    used: dict[str, set[str]] = {kind: set() for kind in SIGNALS}
    for pipeline_id, pipeline in service.get("pipelines", {}).items():
        signal = _component_type(pipeline_id)
        if signal not in ALL_SIGNALS:
            problems.append(f"pipeline {pipeline_id}: unknown signal")
        for kind, known in SIGNALS.items():
            for component_id in pipeline.get(kind, []):
                used[kind].add(component_id)
                if component_id not in (config.get(kind) or {}):
                    problems.append(f"pipeline {pipeline_id}: {kind[:-1]} {component_id} is not defined")
                supported = known.get(_component_type(component_id))
                renamed = DEPRECATED.get(kind, {}).get(_component_type(component_id))
                if renamed is not None:
                    problems.append(f"{kind[:-1]} {component_id}: a deprecated alias, use {renamed}")
                elif supported is None:
                    problems.append(f"{kind[:-1]} {component_id}: not a component type this test knows")
                elif signal not in supported:
                    problems.append(f"pipeline {pipeline_id}: {component_id} does not support {signal}")
        if pipeline.get("processors", ["memory_limiter"])[0] != "memory_limiter":
            problems.append(f"pipeline {pipeline_id}: memory_limiter must be the first processor")
    for kind in SIGNALS:
        unused = set(config.get(kind) or {}) - used[kind]
        problems.extend(f"{kind[:-1]} {component_id} is defined but in no pipeline" for component_id in unused)
    for extension in service.get("extensions", []):
        if extension not in (config.get("extensions") or {}):
            problems.append(f"extension {extension} is not defined")
    for kind in (*SIGNALS, "extensions"):
        for component_id, settings in (config.get(kind) or {}).items():
            schema = COMPONENT_SCHEMAS.get(_component_type(component_id))
            if schema is None:
                problems.append(f"{component_id}: no schema")
                continue
            problems.extend(
                f"{component_id}: {error.message}"
                for error in jsonschema.Draft202012Validator(schema).iter_errors(settings or {})
            )
    return problems


def _otel_config() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(OTEL.read_text())
    return config


def test_collector_pipelines_are_wired_from_defined_components() -> None:
    config = _otel_config()
    assert collector_problems(config) == []
    pipelines = config["service"]["pipelines"]
    assert set(pipelines) == {"metrics", "logs"}
    assert "prometheusremotewrite" in pipelines["metrics"]["exporters"]
    assert any(_component_type(e) == "otlp_http" for e in pipelines["logs"]["exporters"])
    assert all("batch" in p["processors"] for p in pipelines.values())


@pytest.mark.parametrize(
    "breakage",
    [
        lambda c: c["service"]["pipelines"]["metrics"]["processors"].append("batch/typo"),
        lambda c: c["service"]["pipelines"]["logs"]["exporters"].append("prometheusremotewrite"),
        lambda c: c["exporters"].update({"debug/unused": {}}),
        lambda c: c["processors"]["batch"].update({"send_batch_size_max": 10}),
        lambda c: c["exporters"]["prometheusremotewrite"]["remote_write_queue"].update({"queue_size": 0}),
        lambda c: c["exporters"]["prometheusremotewrite"]["remote_write_queue"].update({"num_workers": 4}),
        lambda c: c["service"]["pipelines"]["logs"]["processors"].reverse(),
        # the deprecated alias the file used before: it loads, and warns at every collector start
        lambda c: (
            c["exporters"].update({"otlphttp/loki": c["exporters"].pop("otlp_http/loki")}),
            c["service"]["pipelines"]["logs"].update({"exporters": ["otlphttp/loki", "debug"]}),
        ),
    ],
)
def test_collector_check_would_catch_a_broken_pipeline(breakage: Any) -> None:
    config = copy.deepcopy(_otel_config())
    breakage(config)
    assert collector_problems(config) != []


def test_collector_batches_and_limits_fit_together() -> None:
    """The fleet sizing (docs/fleet-scale.md): batches bounded, the queue on, memory refused before it runs out."""
    config = _otel_config()
    batch = config["processors"]["batch"]
    assert batch["send_batch_size"] <= batch["send_batch_max_size"]
    limiter = config["processors"]["memory_limiter"]
    assert 0 < limiter["spike_limit_percentage"] < limiter["limit_percentage"] <= 90
    queue = config["exporters"]["prometheusremotewrite"]["remote_write_queue"]
    assert queue["enabled"] and queue["queue_size"] > 0 and queue["num_consumers"] > 1
    assert config["exporters"]["prometheusremotewrite"]["retry_on_failure"]["enabled"]


def test_documented_otlp_endpoint_reaches_the_collector_receiver() -> None:
    from rnic_exporter.config.otlp import resolve

    (line,) = [ln for ln in OTEL.read_text().splitlines() if "rnic-exporter serve --otlp.endpoint=" in ln]
    url = line.split("--otlp.endpoint=", 1)[1].split()[0]
    settings = resolve({"otlp_endpoint": url}, environ={})
    assert settings is not None and settings.protocol == "http/protobuf"
    http_receiver = _otel_config()["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    # The collector's OTLP/HTTP receiver serves /v1/metrics and /v1/logs on its port.
    assert settings.signal_url("metrics").endswith(f":{http_receiver.rsplit(':', 1)[1]}/v1/metrics")
    grpc_receiver = _otel_config()["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
    assert f":{grpc_receiver.rsplit(':', 1)[1]}" in OTEL.read_text().split("--otlp.protocol=grpc", 1)[1].split()[0]


def test_documented_resource_attributes_are_what_the_exporter_sends(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from rnic_exporter.sinks.otel import resource

    for name in ("OTEL_RESOURCE_ATTRIBUTES", "OTEL_SERVICE_NAME"):
        monkeypatch.delenv(name, raising=False)
    machine_id = tmp_path / "machine-id"
    machine_id.write_text("0123456789abcdef0123456789abcdef\n")
    sent = set(resource(machine_id_files=[machine_id]).attributes)
    documented = set(re.findall(r"^#   - ([a-z0-9_.]+):", OTEL.read_text(), flags=re.M))
    assert documented == sent


# --- Grafana provisioning ----------------------------------------------------------------------------


def _dashboards() -> list[tuple[Path, dict[str, Any]]]:
    files = sorted((REPO / "dashboards").glob("*.json"))
    assert files, "no dashboards/*.json to provision"
    return [(path, json.loads(path.read_text())) for path in files]


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def test_grafana_datasource_is_one_prometheus_that_cannot_stop_grafana() -> None:
    provisioning = yaml.safe_load((GRAFANA / "datasources/rnic-exporter.yaml").read_text())
    assert provisioning["apiVersion"] == 1
    (datasource,) = provisioning["datasources"]
    assert datasource["type"] == "prometheus" and datasource["uid"]
    assert datasource["url"].startswith(("http://", "https://")) and datasource["access"] == "proxy"
    # Next to kube-prometheus-stack's provisioned datasource (default, uid `prometheus`, name
    # `Prometheus`): Grafana refuses to start with two defaults in an organization, and a shared uid
    # or name would overwrite the other.
    stack = {"name": "Prometheus", "uid": "prometheus", "type": "prometheus", "isDefault": True}
    both = [stack, datasource]
    assert sum(1 for d in both if d.get("isDefault")) <= 1
    assert len({d["uid"] for d in both}) == 2 and len({d["name"] for d in both}) == 2


def test_grafana_provider_loads_the_dashboards_unchanged_from_one_directory() -> None:
    text = (GRAFANA / "dashboards/rnic-exporter.yaml").read_text()
    provisioning = yaml.safe_load(text)
    assert provisioning["apiVersion"] == 1
    (provider,) = provisioning["providers"]
    assert provider["type"] == "file" and provider["allowUiUpdates"] is False
    options = provider["options"]
    assert PurePosixPath(options["path"]).is_absolute() and options["foldersFromFilesStructure"] is False
    # The install step in the file copies the bundle's dashboards exactly there.
    assert f"DIR/dashboards/*.json {options['path']}/" in text
    readme = (REPO / "README.md").read_text()
    assert options["path"] in readme


def test_dashboards_select_the_provisioned_datasource_without_import_placeholders() -> None:
    (datasource,) = yaml.safe_load((GRAFANA / "datasources/rnic-exporter.yaml").read_text())["datasources"]
    uids: set[str] = set()
    for path, dashboard in _dashboards():
        # Provisioning never resolves ${DS_...} import inputs (grafana/grafana#10786).
        assert "${DS_" not in path.read_text(), path.name
        assert dashboard["uid"] not in uids and len(dashboard["uid"]) <= 40, path.name
        uids.add(dashboard["uid"])
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        ds_vars = [v for v in variables.values() if v["type"] == "datasource"]
        assert [v["query"] for v in ds_vars] == [datasource["type"]], path.name
        current = ds_vars[0].get("current") or {}
        if current.get("value") in (None, "", "default"):
            pass  # no preset: Grafana selects the organization's default (or first) Prometheus
        else:
            assert current["value"] in (datasource["uid"], datasource["name"]), path.name
        refs = [node["datasource"] for node in _walk(dashboard) if isinstance(node.get("datasource"), dict)]
        assert refs, path.name
        for ref in refs:
            assert ref.get("type") == datasource["type"], (path.name, ref)
            assert ref.get("uid") in ("${datasource}", "$datasource", datasource["uid"]), (path.name, ref)


# --- rnic-exporter bundle ------------------------------------------------------------------------------


def test_bundle_writes_every_deployment_file_unchanged(tmp_path: Path) -> None:
    root = bundle.bundle_root()
    written = bundle.write_bundle(tmp_path / "out")
    files = bundle.bundle_files(root)
    assert [w.path for w in written] == [tmp_path / "out" / bundle.output_path(rel) for rel in files]
    for rel in files:
        assert filecmp.cmp(root / rel, tmp_path / "out" / bundle.output_path(rel), shallow=False), rel
    out = tmp_path / "out"
    for expected in (
        "systemd/rnic-exporter.service",
        "systemd/rnic-exporter.default",
        "kubernetes/daemonset.yaml",
        "kubernetes/prometheusrule.yaml",
        "kubernetes/servicemonitor.yaml",
        "otel-collector/config.yaml",
        "grafana/provisioning/datasources/rnic-exporter.yaml",
        "grafana/provisioning/dashboards/rnic-exporter.yaml",
        "alerts/rnic-exporter.rules.yml",
        "slurm/50-rnic-check.sh",
        "runbooks/RnicPcieLinkDowntrained.md",
    ):
        assert (out / expected).is_file(), expected
    # A runbook for every alert, next to the rules: an offline cluster cannot follow runbook_url.
    alerts = yaml.safe_load((out / "alerts/rnic-exporter.rules.yml").read_text())
    names = {r["alert"] for g in alerts["groups"] for r in g["rules"] if "alert" in r}
    assert {p.stem for p in (out / "runbooks").glob("*.md")} == names
    assert list((out / "dashboards").glob("*.json")), "no dashboards in the bundle"
    assert list((out / "alertmanager").glob("*.yml")), "no Alertmanager example in the bundle"
    assert not list(out.rglob("*.py")) and not list(out.rglob("__pycache__"))


def test_bundle_cli_is_idempotent_and_never_clobbers_without_force(tmp_path: Path) -> None:
    runner = CliRunner()
    first = runner.invoke(main, ["bundle", "--out", str(tmp_path)])
    assert first.exit_code == 0, first.output
    again = runner.invoke(main, ["bundle", "--out", str(tmp_path)])
    assert again.exit_code == 0 and "(0 written," in again.output
    edited = tmp_path / "systemd/rnic-exporter.default"
    edited.write_text(edited.read_text() + 'ARGS="--log.level=debug"\n')
    refused = runner.invoke(main, ["bundle", "--out", str(tmp_path)])
    assert refused.exit_code == 2 and "--force" in refused.output
    assert "--log.level=debug" in edited.read_text()
    forced = runner.invoke(main, ["bundle", "--out", str(tmp_path), "--force"])
    assert forced.exit_code == 0 and "(1 written," in forced.output
    assert filecmp.cmp(edited, SYSTEMD / "rnic-exporter.default", shallow=False)


def test_bundle_cli_rejects_a_file_as_out_dir(tmp_path: Path) -> None:
    target = tmp_path / "a-file"
    target.write_text("")
    result = CliRunner().invoke(main, ["bundle", "--out", str(target)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [f"rnic-exporter: error: --out {target} exists and is not a directory"]


def test_bundle_root_is_the_checkout_in_an_editable_install() -> None:
    """Wheels carry the files under rnic_exporter/_bundle (tests/packaging/test_release.py); a checkout reads
    its own."""
    assert bundle.bundle_root() == REPO


# --- the consumers drop-in (issue 15: who holds each RDMA device) -----------------------------------

CONSUMERS_DROP_IN = SYSTEMD / "rnic-exporter.service.d/consumers.conf"


def _add_consumers_drop_in(unit: Path) -> Path:
    """The drop-in beside `unit`, where systemd (and systemd-analyze on a unit file) looks for it."""
    drop_ins = unit.parent / f"{unit.name}.d"
    drop_ins.mkdir()
    (drop_ins / CONSUMERS_DROP_IN.name).write_text(CONSUMERS_DROP_IN.read_text())
    return unit


@pytest.fixture
def unit_with_consumers(unit_for_this_machine: Path) -> Path:
    return _add_consumers_drop_in(unit_for_this_machine)


def _security(unit: Path) -> tuple[float, set[str]]:
    """The overall exposure and the settings systemd-analyze counts against the unit (its ✗ lines)."""
    result = subprocess.run(
        [require_binary("systemd-analyze"), "security", "--offline=yes", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    score = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert score is not None, result.stdout[-2000:] + result.stderr
    failed = {line.split()[1] for line in result.stdout.splitlines() if line.startswith("✗")}
    return float(score[1]), failed


def test_consumers_drop_in_verifies_without_a_single_warning(unit_with_consumers: Path) -> None:
    result = _verify(unit_with_consumers)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_consumers_drop_in_grants_the_two_capabilities_and_the_processes_they_inspect() -> None:
    entries = _unit_entries(CONSUMERS_DROP_IN.read_text())
    caps = ["CAP_SYS_PTRACE CAP_DAC_READ_SEARCH"]  # both needed: tests/sources/test_consumers_processes.py
    assert entries == {"CapabilityBoundingSet": caps, "AmbientCapabilities": caps, "ProtectProc": ["ptraceable"]}
    # The base unit's empty bounding set is what the drop-in widens (an empty value resets, a
    # list then adds), and NoNewPrivileges= stays on underneath.
    base = _unit_entries(UNIT.read_text())
    assert base["CapabilityBoundingSet"] == [""] and base["NoNewPrivileges"] == ["yes"]
    assert base["ProtectProc"] == ["invisible"]  # which would hide every other user's process


def test_consumers_drop_in_costs_only_its_capabilities_in_the_security_score(unit_for_this_machine: Path) -> None:
    without, failed_without = _security(unit_for_this_machine)
    with_drop_in, failed_with = _security(_add_consumers_drop_in(unit_for_this_machine))
    # Measured with systemd 252: 1.3 without, 1.8 with (docs/consumers.md, "Privileges").
    assert without < with_drop_in <= 2.0
    assert failed_with - failed_without == {
        "AmbientCapabilities=",
        "CapabilityBoundingSet=~CAP_SYS_PTRACE",
        "CapabilityBoundingSet=~CAP_(DAC_*|FOWNER|IPC_OWNER)",
    }
