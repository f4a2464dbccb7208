"""packaging/kubernetes/: every manifest validated strictly, and wired together as the daemon needs it.

Core kinds go through `kubernetes-validate --strict` (the upstream OpenAPI schemas, offline). It
does not know the prometheus-operator kinds, so ServiceMonitor and PrometheusRule are checked with
JSON schemas written below from the fields of the operator's CRDs (monitoring.coreos.com/v1) that
we use, closed against unknown fields as `--strict` is.
"""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from rnic_exporter import __version__
from rnic_exporter.commands import bundle
from rnic_exporter.config import file as config
from tests.support.cli import serve_flags
from tests.support.processes import require_binary, venv_tool

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "packaging/kubernetes"
KUBERNETES_VERSIONS = ("1.37.0", "1.28.0")  # newest bundled, and the oldest still common in GPU clusters
OPERATOR_GROUP = "monitoring.coreos.com/v1"

# Go duration as the operator's CRDs spell it (`monitoringv1.Duration`).
_DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
    r"(([0-9]+)s)?(([0-9]+)ms)?)$",
}
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "namespace"],
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "namespace": {"type": "string"},
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
    },
}


def _resource(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": OPERATOR_GROUP},
            "kind": {"const": kind},
            "metadata": _METADATA,
            "spec": spec,
        },
    }


_RELABEL = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "sourceLabels": {"type": "array", "items": {"type": "string", "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$"}},
        "separator": {"type": "string"},
        "targetLabel": {"type": "string"},
        "regex": {"type": "string"},
        "modulus": {"type": "integer"},
        "replacement": {"type": "string"},
        "action": {
            "enum": [
                "replace",
                "Replace",
                "keep",
                "Keep",
                "drop",
                "Drop",
                "hashmod",
                "HashMod",
                "labelmap",
                "LabelMap",
                "labeldrop",
                "LabelDrop",
                "labelkeep",
                "LabelKeep",
                "lowercase",
                "Lowercase",
                "uppercase",
                "Uppercase",
                "keepequal",
                "KeepEqual",
                "dropequal",
                "DropEqual",
            ]
        },
    },
}
SERVICE_MONITOR = _resource(
    "ServiceMonitor",
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["selector", "endpoints"],
        "properties": {
            "jobLabel": {"type": "string"},
            "selector": {"type": "object", "additionalProperties": False, "properties": {"matchLabels": _STRING_MAP}},
            "namespaceSelector": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "any": {"type": "boolean"},
                    "matchNames": {"type": "array", "items": {"type": "string"}},
                },
            },
            "endpoints": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "port": {"type": "string"},
                        "path": {"type": "string"},
                        "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                        "interval": _DURATION,
                        "scrapeTimeout": _DURATION,
                        "honorLabels": {"type": "boolean"},
                        "relabelings": {"type": "array", "items": _RELABEL},
                        "metricRelabelings": {"type": "array", "items": _RELABEL},
                    },
                },
            },
        },
    },
)
PROMETHEUS_RULE = _resource(
    "PrometheusRule",
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["groups"],
        "properties": {
            "groups": {
                "type": "array",
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name", "rules"],
                    "properties": {
                        "name": {"type": "string", "minLength": 1},
                        "interval": _DURATION,
                        "limit": {"type": "integer"},
                        "rules": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "additionalProperties": False,
                                "required": ["expr"],
                                "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                                "properties": {
                                    "alert": {"type": "string"},
                                    "record": {"type": "string"},
                                    "expr": {"type": ["string", "integer"]},
                                    "for": _DURATION,
                                    "keep_firing_for": _DURATION,
                                    "labels": _STRING_MAP,
                                    "annotations": _STRING_MAP,
                                },
                            },
                        },
                    },
                },
            }
        },
    },
)
CRD_SCHEMAS = {"ServiceMonitor": SERVICE_MONITOR, "PrometheusRule": PROMETHEUS_RULE}


def _documents() -> list[tuple[Path, dict[str, Any]]]:
    docs = [
        (path, doc)
        for path in sorted(K8S.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc is not None
    ]
    assert docs, f"no manifests in {K8S}"
    return docs


def _one(kind: str) -> dict[str, Any]:
    found = [doc for _, doc in _documents() if doc["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def _core_files() -> list[Path]:
    return sorted({path for path, doc in _documents() if doc["apiVersion"] != OPERATOR_GROUP})


def _kubernetes_validate(files: list[Path], version: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [venv_tool("kubernetes-validate"), "--strict", "-k", version, *map(str, files)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_core_manifests_pass_kubernetes_validate_strict(version: str) -> None:
    files = _core_files()
    result = _kubernetes_validate(files, version)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    passed = re.findall(r"^INFO (\S+) passed for resource", out, flags=re.M)
    assert sorted(passed) == sorted(str(f) for f in files), out
    assert "WARN" not in out and "ERROR" not in out, out


def test_kubernetes_validate_catches_a_misspelt_field(tmp_path: Path) -> None:
    """The strict check is not vacuous: one typo in our DaemonSet fails it."""
    broken = tmp_path / "daemonset.yaml"
    broken.write_text((K8S / "daemonset.yaml").read_text().replace("hostNetwork:", "hostNetwrk:"))
    result = _kubernetes_validate([broken], KUBERNETES_VERSIONS[0])
    assert result.returncode != 0 and "hostNetwrk" in result.stdout + result.stderr


def test_every_manifest_is_validated_by_one_of_the_two_checks() -> None:
    for path, doc in _documents():
        if doc["apiVersion"] == OPERATOR_GROUP:
            assert doc["kind"] in CRD_SCHEMAS, f"{path.name}: no schema for {doc['kind']}"
            jsonschema.validate(doc, CRD_SCHEMAS[doc["kind"]])
        else:
            assert path in _core_files()


@pytest.mark.parametrize(
    ("kind", "breakage"),
    [
        ("ServiceMonitor", lambda d: d["spec"]["endpoints"][0].update(intervall="15s")),
        ("ServiceMonitor", lambda d: d["spec"]["endpoints"][0].update(interval="15 seconds")),
        ("PrometheusRule", lambda d: d["spec"]["groups"][0]["rules"][0].update(record="also_a_recording_rule")),
        ("PrometheusRule", lambda d: d["spec"]["groups"][0]["rules"][0].update(For="5m")),
    ],
)
def test_crd_schemas_reject_what_the_operator_would(kind: str, breakage: Any) -> None:
    doc = copy.deepcopy(_one(kind))
    breakage(doc)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, CRD_SCHEMAS[kind])


def test_prometheus_rule_is_generated_from_the_rule_files(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    committed = K8S / "prometheusrule.yaml"
    expected = bundle.render_prometheus_rule(REPO)
    if request.config.getoption("--update-golden"):
        committed.write_text(expected)
    assert committed.read_text() == expected, (
        "packaging/kubernetes/prometheusrule.yaml is stale: "
        "pytest tests/packaging/test_packaging_kubernetes.py --update-golden"
    )
    # Same rules, value for value, as the files Prometheus loads on bare metal...
    groups = yaml.safe_load(committed.read_text())["spec"]["groups"]
    assert groups == bundle.rule_groups(bundle.rule_files(REPO))
    # ...and promtool accepts them as a rule file.
    extracted = tmp_path / "from-prometheusrule.yml"
    extracted.write_text(yaml.safe_dump({"groups": groups}))
    check = subprocess.run(
        [require_binary("promtool"), "check", "rules", str(extracted)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr


def _flag_values(args: list[str]) -> dict[str, str]:
    return dict(arg.split("=", 1) for arg in args if arg.startswith("--") and "=" in arg)


def test_daemonset_runs_serve_with_flags_that_exist_and_mounts_what_they_name() -> None:
    pod = _one("DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    assert args[0] == "serve"
    assert {arg.split("=", 1)[0] for arg in args[1:]} <= serve_flags(), args
    flags = _flag_values(args[1:])
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}

    def host_path_at(mount_path: str) -> tuple[str, bool]:
        (mount,) = [m for m in mounts.values() if m["mountPath"] == mount_path]
        return volumes[mount["name"]]["hostPath"]["path"], mount.get("readOnly", False)

    assert pod["hostNetwork"] is True
    assert host_path_at(flags["--path.sysfs"]) == ("/sys", True)
    assert mounts["sys"]["mountPropagation"] == "HostToContainer"
    assert host_path_at(flags["--state.dir"]) == ("/var/lib/rnic-exporter", False)
    assert host_path_at(flags["--path.rootfs"] + "/run/NetworkManager") == ("/run/NetworkManager", True)
    assert host_path_at("/etc/machine-id") == ("/etc/machine-id", True)  # the OTLP resource's host.id
    assert volumes[mounts["machine-id"]["name"]]["hostPath"]["type"] == "File"  # never created empty
    # The config file is the ConfigMap's key, mounted where --config points.
    config_path = Path(flags["--config"])
    (config_mount,) = [m for m in mounts.values() if m["mountPath"] == str(config_path.parent)]
    config_map = _one("ConfigMap")
    assert volumes[config_mount["name"]]["configMap"]["name"] == config_map["metadata"]["name"]
    assert config_path.name in config_map["data"]
    # The init container prepares exactly the state directory the exporter uses.
    (init,) = pod["initContainers"]
    assert init["volumeMounts"][0]["mountPath"] == flags["--state.dir"]
    assert f"'{flags['--state.dir']}'" in init["command"][-1]


def test_daemonset_is_non_root_locked_down_probed_and_bounded() -> None:
    daemonset = _one("DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 65534
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    init_sc = pod["initContainers"][0]["securityContext"]
    assert init_sc["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}  # its one root action, nothing more
    assert pod["automountServiceAccountToken"] is False
    # Every taint: a key-less Exists tolerates all of them (GPU taints differ per site).
    assert pod["tolerations"] == [{"operator": "Exists"}]
    (port,) = container["ports"]
    listen = _flag_values(container["args"])["--web.listen-address"]
    assert listen == f":{port['containerPort']}" and port["hostPort"] == port["containerPort"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/-/healthy", "port": port["name"]}
    assert container["readinessProbe"]["httpGet"] == {"path": "/-/ready", "port": port["name"]}
    units = {"m": 1e-3, "Mi": 2**20}

    def quantity(text: str) -> float:
        number, unit = re.fullmatch(r"(\d+)(m|Mi)", text).groups()  # type: ignore[union-attr]
        return int(number) * units[unit]

    for name in ("cpu", "memory"):
        request, limit = container["resources"]["requests"][name], container["resources"]["limits"][name]
        assert quantity(request) <= quantity(limit), name
    # 58 MB peak RSS measured with the OTLP sink (daemonset.yaml): the request covers it, the limit doubles it.
    assert quantity(container["resources"]["requests"]["memory"]) >= 58e6
    assert quantity(container["resources"]["limits"]["memory"]) >= 2 * 58e6
    # One version: the image tag and the version label are the package's.
    assert container["image"].rsplit(":", 1)[1] == __version__
    assert daemonset["metadata"]["labels"]["app.kubernetes.io/version"] == __version__


def test_service_and_servicemonitor_select_the_daemonset_pods() -> None:
    pod_template = _one("DaemonSet")["spec"]["template"]
    pod_labels = pod_template["metadata"]["labels"]
    service = _one("Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (container,) = pod_template["spec"]["containers"]
    (service_port,) = service["spec"]["ports"]
    assert service_port["targetPort"] == container["ports"][0]["name"]
    monitor = _one("ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service_port["name"]
    telemetry = _flag_values(container["args"]).get("--web.telemetry-path", "/metrics")
    assert endpoint["path"] == telemetry
    assert _one("ServiceAccount")["metadata"]["name"] == pod_template["spec"]["serviceAccountName"]
    namespaces = {doc["metadata"]["namespace"] for _, doc in _documents()}
    assert namespaces == {bundle.K8S_NAMESPACE}


def test_configmap_config_is_accepted_by_the_config_loader(tmp_path: Path) -> None:
    data = _one("ConfigMap")["data"]
    assert data, "the ConfigMap carries no config file"
    for name, text in data.items():
        path = tmp_path / name
        path.write_text(text)
        loaded = config.load(path)  # raises ConfigError on any unknown key or bad value
        assert loaded.poll_interval_seconds == 5
        assert loaded.device_include == "^mlx5_"


# --- the consumers patch (issue 15: who holds each RDMA device) -------------------------------------

CONSUMERS_PATCH = K8S / "consumers/daemonset-patch.yaml"
# patchMergeKey of the lists the patch touches (k8s.io/api core/v1 types); other lists are replaced.
_MERGE_KEYS = {"containers": "name", "initContainers": "name", "volumes": "name", "volumeMounts": "mountPath"}


def _strategic_merge(base: Any, patch: Any, key: str = "") -> Any:
    """What `kubectl patch --local --type strategic` does for the fields our patch uses (same
    result as kubectl v1.x on the day it was written; kubectl is not a test dependency)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for name, value in patch.items():
            merged[name] = _strategic_merge(base[name], value, name) if name in base else value
        return merged
    if isinstance(base, list) and isinstance(patch, list) and key in _MERGE_KEYS:
        field = _MERGE_KEYS[key]
        out = list(base)
        added = []
        for item in patch:
            at = [i for i, old in enumerate(out) if old[field] == item[field]]
            if at:
                out[at[0]] = _strategic_merge(out[at[0]], item)
            else:
                added.append(item)
        return added + out  # kubectl puts new items first
    return patch


def _patched_daemonset() -> dict[str, Any]:
    patch = yaml.safe_load(CONSUMERS_PATCH.read_text())
    base = _one("DaemonSet")
    assert (patch["kind"], patch["metadata"]) == ("DaemonSet", {k: base["metadata"][k] for k in ("name", "namespace")})
    merged: dict[str, Any] = _strategic_merge(copy.deepcopy(base), patch)
    return merged


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_consumers_patched_daemonset_passes_kubernetes_validate_strict(version: str, tmp_path: Path) -> None:
    patched = tmp_path / "daemonset-consumers.yaml"
    patched.write_text(yaml.safe_dump(_patched_daemonset()))
    result = _kubernetes_validate([patched], version)
    out = result.stdout + result.stderr
    assert result.returncode == 0 and "WARN" not in out and "ERROR" not in out, out


def test_consumers_patch_grants_host_pids_two_capabilities_and_read_only_pod_logs() -> None:
    pod = _patched_daemonset()["spec"]["template"]["spec"]
    base = _one("DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["hostPID"] is True and "hostPID" not in base
    sc = container["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE", "DAC_READ_SEARCH"]}
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    # Root without any other capability: Kubernetes gives a non-root container none of the added ones.
    pod_sc = pod["securityContext"]
    assert pod_sc["runAsUser"] == 0 and pod_sc["seccompProfile"]["type"] == "RuntimeDefault"
    (init,) = pod["initContainers"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert "os.chown(d, 0, 0)" in init["command"][-1]  # the state directory follows the user
    # /var/log/pods read-only where --path.rootfs expects it; the host's /proc comes with hostPID.
    rootfs = _flag_values(container["args"])["--path.rootfs"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    logs = mounts[f"{rootfs}/var/log/pods"]
    assert logs["readOnly"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[logs["name"]]["hostPath"] == {"path": "/var/log/pods", "type": "Directory"}
    # Nothing else changed: every other mount, volume and setting is the base's.
    assert [m for m in container["volumeMounts"] if m is not logs] == base["containers"][0]["volumeMounts"]
    assert [v for v in pod["volumes"] if v["name"] != logs["name"]] == base["volumes"]
    changed = {k for k in pod if pod[k] != base.get(k)}
    assert changed == {"hostPID", "securityContext", "initContainers", "containers", "volumes"}


def test_kube_prometheus_stack_finds_the_monitor_and_rules_and_the_pod_is_evicted_last() -> None:
    # kube-prometheus-stack's Prometheus selects ServiceMonitors and PrometheusRules by `release`.
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert _one(kind)["metadata"]["labels"]["release"] == "kube-prometheus-stack", kind
    assert _one("DaemonSet")["spec"]["template"]["spec"]["priorityClassName"] == "system-node-critical"
