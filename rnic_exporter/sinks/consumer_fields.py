"""How the consumers of one RDMA device are spelled wherever they show: an event's log fields and
OTLP attributes, the info series' labels, and the one-line text of `show` and `check`.

An event never waits for a scan. It carries the last completed scan's view of its device and
that scan's age (`model.consumers.DeviceConsumers.age_s`): the scan *before* an event is also the one that saw
who was using a device that has just disappeared or lost its GID. The event then triggers a fresh
scan (`consumer_watch.ConsumerWatch.publish`), so the series the alert joins are current within a
scan's duration.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.model.consumers import ConsumerScan, DeviceConsumers, Workload
from rnic_exporter.sinks.labels import label_value

# The log line's keys (logfmt and JSON alike); the OTLP record uses OTEL_KEYS instead.
LOG_KEYS = ("consumers", "consumer_processes", "consumers_scan_age_s", "consumers_scan_complete")
OtelValue = str | int | float | bool | Sequence[str]


def log_fields(consumers: DeviceConsumers) -> dict[str, str]:
    """An event's consumer fields in a log line."""
    values = (
        consumers.describe(),
        str(consumers.processes),
        f"{consumers.age_s:.1f}",
        "true" if consumers.complete else "false",
    )
    return dict(zip(LOG_KEYS, values, strict=True))


def otel_attributes(consumers: DeviceConsumers) -> dict[str, OtelValue]:
    """OTel semantic-convention names where they exist (k8s.*, container.id); a device may serve
    several jobs or pods, so each is an array, and the pod arrays are parallel (index i of
    k8s.pod.name, k8s.namespace.name and k8s.pod.uid is one pod)."""
    jobs = [w for w in consumers.workloads if w.kind == "slurm"]
    pods = [w for w in consumers.workloads if w.kind == "pod"]
    attrs: dict[str, OtelValue] = {
        "rnic.consumers": [label_value(w.describe()) for w in consumers.workloads],
        "rnic.consumers.processes": consumers.processes,
        "rnic.consumers.scan.age": round(consumers.age_s, 3),  # seconds
        "rnic.consumers.scan.complete": consumers.complete,
    }
    optional: dict[str, list[str]] = {
        "slurm.job.id": _unique(w.slurm_job for w in jobs),
        "k8s.pod.name": [label_value(w.pod_name) for w in pods],
        "k8s.namespace.name": [label_value(w.pod_namespace) for w in pods],
        "k8s.pod.uid": [w.pod_uid for w in pods],
        "container.id": _unique(w.container_id for w in pods if w.container_id),
        "process.command": _unique(label_value(w.command) for w in consumers.workloads if w.kind == "process"),
    }
    attrs.update({k: v for k, v in optional.items() if v and any(v)})
    return attrs


def _unique(values: Iterator[str] | Sequence[str]) -> list[str]:
    return list(dict.fromkeys(v for v in values if v))


def series_key(workload: Workload) -> tuple[str, str, str, str, str, str]:
    """The info series' labels after `device`: a job without its step, a pod without its container
    (steps and container restarts would churn series; the event record carries them)."""
    if workload.kind == "slurm":
        return ("slurm", workload.slurm_job, "", "", "", "")
    if workload.kind == "pod":
        return ("pod", "", workload.pod_namespace, workload.pod_name, workload.pod_uid, "")
    return ("process", "", "", "", "", workload.command)


def device_series(scan: ConsumerScan, device: str) -> list[tuple[str, ...]]:
    """The device's info series label sets, deduplicated, sorted, at most CONSUMER_WORKLOADS_MAX."""
    keys = sorted({series_key(w) for w in scan.workloads(device)})
    return [(device, *(label_value(v) for v in key)) for key in keys[: catalog.CONSUMER_WORKLOADS_MAX]]


def workload_names(workloads: Sequence[Workload]) -> list[str]:
    """Each workload once, as `show` and `check` print them: job and pod only, not step or container."""
    seen: dict[tuple[str, ...], str] = {}
    for w in workloads:
        key = series_key(w)
        if key not in seen:
            seen[key] = _short(w)
    return list(seen.values())


def workloads_by_device(scan: ConsumerScan | None) -> dict[str, tuple[str, ...]] | None:
    """Each used device's workload names (`workload_names`), what link health says a port hits;
    None without a scan."""
    if scan is None:
        return None
    return {d: tuple(workload_names(scan.workloads(d))) for d in scan.by_device}


def _short(w: Workload) -> str:
    if w.kind == "slurm":
        return f"slurm job {w.slurm_job}"
    return w.describe()


def users_text(scan: ConsumerScan | None, device: str) -> str:
    """`show`'s USERS cell: '-' with no scan, 'none' when unused, else the workloads (and processes)."""
    if scan is None:
        return "-"
    names = workload_names(scan.workloads(device))
    if not names:
        return "none" if scan.complete else "?"
    return ", ".join(names)


def as_json(scan: ConsumerScan, device: str) -> list[Mapping[str, object]]:
    """The scripting form (`show --json`, `check --json`): one object per workload, semantic names."""
    out: list[Mapping[str, object]] = []
    for w in scan.workloads(device):
        item: dict[str, object] = {"kind": w.kind, "description": w.describe()}
        fields = {
            "slurm_job_id": w.slurm_job,
            "slurm_step": w.slurm_step,
            "k8s_namespace_name": w.pod_namespace,
            "k8s_pod_name": w.pod_name,
            "k8s_pod_uid": w.pod_uid,
            "container_id": w.container_id,
            "command": w.command,
        }
        item.update({k: v for k, v in fields.items() if v})
        out.append(item)
    return out
