"""`rnic-exporter bundle`: the deployment files that ship with the package, written to a directory.

The canonical files live at the repository root: `dashboards/` (Grafana JSON), `alerts/` (rule
files), `packaging/` (systemd, Kubernetes, OTel Collector, Grafana provisioning, Alertmanager).
A wheel carries a copy under `rnic_exporter/_bundle/` (setup.py puts it there); an editable
install or a source checkout reads the root directories directly. Both give the same tree.

Also the one generator of `packaging/kubernetes/prometheusrule.yaml`: the rule files wrapped in a
prometheus-operator PrometheusRule, so Kubernetes and bare-metal Prometheus evaluate the same rules.
"""

from __future__ import annotations

import filecmp
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from rnic_exporter.errors import ConfigError

BUNDLED_DIRS = ("dashboards", "alerts", "packaging", "docs/runbooks")  # keep in step with setup.py
_PACKAGE = Path(__file__).resolve().parents[1]  # rnic_exporter/
_PACKAGED = _PACKAGE / "_bundle"
_CHECKOUT = _PACKAGE.parent

# Python sources and bytecode are never deployment files.
_SKIPPED_SUFFIXES = frozenset({".py", ".pyc"})

RULE_FILES_GLOB = "*.rules.yml"
K8S_NAMESPACE = "monitoring"
K8S_LABELS: Mapping[str, str] = {
    "app.kubernetes.io/name": "rnic-exporter",
    "app.kubernetes.io/component": "exporter",
    "app.kubernetes.io/part-of": "rnic-exporter",
}


class BundleError(ConfigError):
    """The bundle cannot be found or written; the message says where and why."""


def bundle_root() -> Path:
    """The directory holding `dashboards/`, `alerts/` and `packaging/` for this installation."""
    for candidate in (_PACKAGED, _CHECKOUT):
        if all((candidate / name).is_dir() for name in BUNDLED_DIRS):
            return candidate
    raise BundleError(
        f"the deployment files are not installed (looked for {', '.join(BUNDLED_DIRS)} "
        f"in {_PACKAGED} and {_CHECKOUT}); reinstall rnic-exporter from a wheel or a checkout"
    )


def bundle_files(root: Path) -> list[PurePosixPath]:
    """Every file of the bundle, relative to `root`, in a stable order."""
    found: list[PurePosixPath] = []
    for name in BUNDLED_DIRS:
        for path in sorted((root / name).rglob("*")):
            rel = path.relative_to(root)
            if (
                path.is_file()
                and path.suffix not in _SKIPPED_SUFFIXES
                and not any(part.startswith(".") or part == "__pycache__" for part in rel.parts)
            ):
                found.append(PurePosixPath(rel.as_posix()))
    return found


def output_path(rel: PurePosixPath) -> PurePosixPath:
    """Where a bundle file lands under --out: `packaging/<kind>/...` becomes `<kind>/...`, and
    `docs/runbooks/<alert>.md` becomes `runbooks/<alert>.md` (for a cluster that cannot reach the
    alerts' runbook_url: serve them internally and point the rules there)."""
    if rel.parts[0] in ("packaging", "docs"):
        return PurePosixPath(*rel.parts[1:])
    return rel


@dataclass(frozen=True, slots=True)
class Written:
    path: Path
    changed: bool  # False when an identical file was already there


def write_bundle(out: Path, *, force: bool = False, root: Path | None = None) -> list[Written]:
    """Copy the bundle into `out`. Refuses to replace a different existing file unless `force`."""
    source = root or bundle_root()
    if out.exists() and not out.is_dir():
        raise BundleError(f"--out {out} exists and is not a directory")
    plan = [(source / rel, out / output_path(rel)) for rel in bundle_files(source)]
    if not force:
        clashes = [str(dst) for src, dst in plan if dst.exists() and not filecmp.cmp(src, dst, shallow=False)]
        if clashes:
            what = f"{clashes[0]} exists" if len(clashes) == 1 else f"{clashes[0]} and {len(clashes) - 1} more exist"
            raise BundleError(f"{what} with other content; use --force to overwrite")
    written: list[Written] = []
    try:
        for src, dst in plan:
            if dst.exists() and filecmp.cmp(src, dst, shallow=False):
                written.append(Written(dst, changed=False))
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
            written.append(Written(dst, changed=True))
    except OSError as exc:
        raise BundleError(f"cannot write the bundle to {out}: {exc.strerror} ({exc.filename})") from None
    return written


# --- PrometheusRule ---------------------------------------------------------------------------


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (PromQL) as `|` blocks and long ones folded with `>`, as a person writes them."""


_FOLD_OVER = 100


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else ">" if len(value) > _FOLD_OVER else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str_representer)


def rule_files(root: Path) -> list[Path]:
    files = sorted((root / "alerts").glob(RULE_FILES_GLOB))
    if not files:
        raise BundleError(f"no alert rule files ({RULE_FILES_GLOB}) in {root / 'alerts'}")
    return files


def prometheus_rule(
    groups: Sequence[Mapping[str, Any]], *, name: str = "rnic-exporter", namespace: str = K8S_NAMESPACE
) -> dict[str, Any]:
    """The rule groups as a PrometheusRule; the groups are carried unchanged."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        # `release`: what kube-prometheus-stack's ruleSelector matches (its Helm release name).
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**K8S_LABELS, "release": "kube-prometheus-stack"},
        },
        "spec": {"groups": [dict(group) for group in groups]},
    }


def rule_groups(files: Sequence[Path]) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    for path in files:
        data = yaml.safe_load(path.read_text())
        if not isinstance(data, dict) or not isinstance(data.get("groups"), list):
            raise BundleError(f"{path}: not a Prometheus rule file (no top-level `groups` list)")
        groups.extend(data["groups"])
    return groups


def render_prometheus_rule(root: Path) -> str:
    """The text of packaging/kubernetes/prometheusrule.yaml, generated from `root`/alerts/*.rules.yml."""
    files = rule_files(root)
    sources = ", ".join(f"alerts/{path.name}" for path in files)
    header = (
        f"# Generated from {sources} by rnic_exporter.commands.bundle.render_prometheus_rule; do not edit.\n"
        "# Regenerate: pytest tests/packaging/test_packaging_kubernetes.py --update-golden\n"
        "# Your Prometheus object's ruleSelector must match these labels (kube-prometheus-stack's selects\n"
        "# `release: <its Helm release name>`: change it to yours).\n"
    )
    body = yaml.dump(
        prometheus_rule(rule_groups(files)),
        Dumper=_BlockDumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=120,
    )
    return header + body


def iter_summary(written: Sequence[Written], out: Path) -> Iterator[str]:
    changed = sum(1 for w in written if w.changed)
    for w in written:
        yield f"{'wrote' if w.changed else 'same '} {w.path.relative_to(out)}"
    yield f"{len(written)} files in {out} ({changed} written, {len(written) - changed} already up to date)"


__all__ = [
    "BundleError",
    "bundle_files",
    "bundle_root",
    "output_path",
    "prometheus_rule",
    "render_prometheus_rule",
    "write_bundle",
]
