"""The Alertmanager example: amtool checks, routing and inhibition in a real Alertmanager, and the whole path
from a fault in a simulated host through `serve`, Prometheus and the shipped rules to a webhook."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from rnic_exporter.sim import SimHost
from tests.support.processes import Alertmanager, Prometheus, exporter, free_port, http_get, require_binary
from tests.support.serve import serve_args
from tests.support.wait import wait_for

REPO = Path(__file__).resolve().parents[2]
AM_CONFIG = REPO / "packaging/alertmanager/alertmanager.yml"
RULES = REPO / "alerts/rnic-exporter.rules.yml"
RECEIVER_BY_SEVERITY = {"critical": "rnic-pager", "warning": "rnic-ticket", "info": "rnic-null"}


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"] if "alert" in rule]


def _amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require_binary("amtool"), *args], capture_output=True, text=True, timeout=30)


def test_amtool_check_config_passes() -> None:
    result = _amtool("check-config", str(AM_CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout and "3 inhibit rules" in result.stdout, result.stdout


@pytest.mark.parametrize("rule", _rules(), ids=lambda rule: str(rule["alert"]))
def test_every_alert_routes_by_its_severity(rule: dict[str, Any]) -> None:
    severity = rule["labels"]["severity"]
    labels = [
        f"alertname={rule['alert']}",
        f"severity={severity}",
        "instance=gpu-node-17:19879",
        "device=mlx5_3",
        "port=1",
    ]
    expected = RECEIVER_BY_SEVERITY[severity]
    routed = _amtool(
        "config", "routes", "test", f"--config.file={AM_CONFIG}", f"--verify.receivers={expected}", *labels
    )
    assert routed.returncode == 0, routed.stdout + routed.stderr
    # And only there: a page is never also a ticket, a ticket never a page.
    for other in set(RECEIVER_BY_SEVERITY.values()) - {expected}:
        wrong = _amtool(
            "config", "routes", "test", f"--config.file={AM_CONFIG}", f"--verify.receivers={other}", *labels
        )
        assert wrong.returncode == 1, f"{rule['alert']} also routed to {other}: {wrong.stdout}"


def test_info_and_unmatched_alerts_are_sent_nowhere() -> None:
    receivers = {r["name"]: r for r in yaml.safe_load(AM_CONFIG.read_text())["receivers"]}
    assert set(receivers["rnic-null"]) == {"name"} and set(receivers["default"]) == {"name"}


def test_foreign_critical_alerts_do_not_page_the_rnic_rotation() -> None:
    routed = _amtool(
        "config",
        "routes",
        "test",
        f"--config.file={AM_CONFIG}",
        "--verify.receivers=default",
        "alertname=NodeFilesystemAlmostOutOfSpace",
        "severity=critical",
        "instance=gpu-node-17:9100",
    )
    assert routed.returncode == 0, routed.stdout + routed.stderr


# -- a real Alertmanager ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Delivery:
    receiver: str  # the path the webhook was posted to
    at: float  # time.monotonic() on arrival
    payload: dict[str, Any]


class WebhookReceiver:
    """An HTTP server thread that records every Alertmanager webhook post, by receiver path."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver.lock:
                    receiver.deliveries.append(Delivery(self.path.strip("/"), time.monotonic(), json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep the test output clean of access lines

        self._server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def firing(self, receiver: str) -> list[tuple[float, dict[str, str]]]:
        """(arrival, labels) of every firing alert posted to `receiver`."""
        with self.lock:
            return [
                (d.at, a["labels"])
                for d in self.deliveries
                if d.receiver == receiver
                for a in d.payload["alerts"]
                if a["status"] == "firing"
            ]

    def first(self, receiver: str, match: Callable[[dict[str, str]], bool]) -> float | None:
        times = [at for at, labels in self.firing(receiver) if match(labels)]
        return min(times) if times else None


def _test_am_config(webhook: WebhookReceiver) -> dict[str, Any]:
    """The shipped routes and inhibitions; receivers point at the webhook, and the waits shrink to test time."""
    config: dict[str, Any] = copy.deepcopy(yaml.safe_load(AM_CONFIG.read_text()))
    config["receivers"] = [
        {"name": r["name"], "webhook_configs": [{"url": f"{webhook.url}/{r['name']}", "send_resolved": False}]}
        for r in config["receivers"]
    ]

    def shrink(route: dict[str, Any]) -> None:
        if "group_wait" in route or route is config["route"]:
            # Not 0s: Alertmanager's inhibitor learns of new alerts through its own subscription, so
            # a group flushed the instant its alert arrives can beat the inhibiting alert posted in
            # the same batch (CI saw the lost NIC's port-down ticketed). The shipped waits are 30 s+.
            route.update(group_wait="1s", group_interval="1s", repeat_interval="1h")
        for child in route.get("routes", []):
            shrink(child)

    shrink(config["route"])
    return config


@pytest.fixture
def webhook() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as receiver:
        yield receiver


def _alert(name: str, severity: str, **labels: str) -> dict[str, Any]:
    return {
        "labels": {"alertname": name, "severity": severity, "instance": "gpu-node-17:19879", **labels},
        "annotations": {"summary": name},
    }


@pytest.mark.e2e
def test_alertmanager_pages_critical_tickets_warnings_and_inhibits_a_lost_nics_alerts(
    tmp_path: Path, webhook: WebhookReceiver
) -> None:
    with Alertmanager(tmp_path / "am", _test_am_config(webhook)) as am:
        am.post_alerts(
            [
                _alert("RnicDeviceDisappeared", "critical", device="mlx5_3", pci_address="0000:d8:00.0"),
                _alert("RnicPortDown", "warning", device="mlx5_3", port="1"),  # inhibited: its NIC is gone
                _alert("RnicPortDown", "warning", device="mlx5_1", port="1"),  # another NIC: a ticket
                _alert("RnicAddressLossRisk", "info", device="mlx5_0", port="1", netdev="ens1f0np0"),
            ]
        )

        def settled() -> bool:
            by_key = {(a["labels"]["alertname"], a["labels"].get("device")): a["status"] for a in am.alerts()}
            return (
                by_key.get(("RnicPortDown", "mlx5_3"), {}).get("state") == "suppressed"
                and webhook.first("rnic-pager", lambda labels: True) is not None
                and webhook.first("rnic-ticket", lambda labels: True) is not None
                and webhook.first("rnic-null", lambda labels: True) is not None
            )

        wait_for(settled, timeout=15, what="the page, the ticket and the inhibition")
        pages = [labels for _, labels in webhook.firing("rnic-pager")]
        tickets = [labels for _, labels in webhook.firing("rnic-ticket")]
        assert [(p["alertname"], p["device"]) for p in pages] == [("RnicDeviceDisappeared", "mlx5_3")]
        assert {(t["alertname"], t["device"]) for t in tickets} == {("RnicPortDown", "mlx5_1")}
        # Info goes to the receiver the shipped config leaves without integrations (see the test below).
        assert [labels["alertname"] for _, labels in webhook.firing("rnic-null")] == ["RnicAddressLossRisk"]
        inhibited = [a for a in am.alerts() if a["status"]["inhibitedBy"]]
        assert [(a["labels"]["alertname"], a["labels"]["device"]) for a in inhibited] == [("RnicPortDown", "mlx5_3")]


# -- the whole path: simulated sysfs -> serve -> Prometheus + rules -> Alertmanager -> webhook ---------------


def _test_rules(path: Path) -> Path:
    """The shipped rules with `for:` dropped, so a fault pages in seconds; promtool tests the real `for:`."""
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("for", None)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@dataclass(frozen=True)
class Fault:
    alertname: str
    receiver: str
    device: str
    inject: Callable[[SimHost], object]


# One fault per NIC: the three (GID shift, speed drop, NIC removal) page; the others open tickets.
FAULTS = (
    Fault("RnicGidIndexMoved", "rnic-pager", "mlx5_0", lambda host: host.gid_shift("mlx5_0")),
    Fault("RnicLinkFarBelowRated", "rnic-pager", "mlx5_1", lambda host: host.set_speed("mlx5_1", 100)),
    Fault("RnicDeviceDisappeared", "rnic-pager", "mlx5_2", lambda host: host.remove_device("mlx5_2")),
    Fault("RnicGidTableChanged", "rnic-ticket", "mlx5_0", lambda host: None),  # the GID shift above
    Fault("RnicPcieLinkDowntrained", "rnic-ticket", "mlx5_3", lambda host: host.set_pcie("mlx5_3", 32.0, 8)),
    Fault("RnicPortDown", "rnic-ticket", "mlx5_4", lambda host: host.set_port_up("mlx5_4", False)),
    # Issue 13: the netdev keeps only IPv6 addresses, NCCL's AF_INET pick stays on the link-local GID.
    Fault("RnicNcclGidUnusable", "rnic-pager", "mlx5_5", lambda host: host.ipv6_only("mlx5_5")),
)


@pytest.mark.e2e
def test_faults_in_a_simulated_host_reach_the_webhook(tmp_path: Path, webhook: WebhookReceiver) -> None:
    host = SimHost.build(tmp_path / "sys", roce=7, gid_table_size=16)  # mlx5_6 gets no fault
    port = free_port()
    args = serve_args(host.root, port, poll=0.2, state_dir=tmp_path / "state")
    with (
        exporter(args, ready_url=f"http://127.0.0.1:{port}/-/ready", log_path=tmp_path / "exporter.log"),
        Alertmanager(tmp_path / "am", _test_am_config(webhook)) as am,
    ):
        prom_config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "rnic-exporter", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am.port}"]}]}]},
        }
        with Prometheus(tmp_path / "prom", prom_config, [_test_rules(tmp_path / "rules.yml")]) as prom:
            # The healthy host is quiet: every fault's metric has been scraped and evaluated, nothing fires.
            for before in (
                'rnic_gid_roce_v2_ipv4_index{device="mlx5_0"}',
                'rnic_gid_table_hash{device="mlx5_0"}',
                'rnic_port_rated_rate_bytes_per_second{device="mlx5_1"}',
                'rnic_device_present{device="mlx5_2"} == 1',
                'rnic_pcie_link_width_lanes{device="mlx5_3"}',
                'rnic_port_up{device="mlx5_4"} == 1',
                'rnic_nccl_gid_usable{device="mlx5_5"} == 1',
            ):
                prom.wait_value(f"count({before})")
            scraped = datetime.now(UTC)
            wait_for(lambda: _evaluated_since(prom, scraped), timeout=10, what="a rule evaluation after the scrape")
            assert prom.query("ALERTS") == [], prom.query("ALERTS")
            assert webhook.deliveries == [] and am.alerts() == []

            injected_at = time.monotonic()
            for fault in FAULTS:
                fault.inject(host)

            def delivered() -> bool:
                return all(webhook.first(f.receiver, _matches(f)) is not None for f in FAULTS)

            wait_for(delivered, timeout=20, what="every fault's alert at its webhook", interval=0.1)
            for fault in FAULTS:
                arrived = webhook.first(fault.receiver, _matches(fault))
                assert arrived is not None
                print(f"{fault.alertname}: injection to {fault.receiver} webhook {arrived - injected_at:.1f}s")
            # Only faulted NICs alerted: the untouched one and the exporter itself stayed quiet. A faulted NIC
            # may raise more than its row's alert (the GID shift flaps the port and removes the address for
            # an instant; the speed drop is also below rated), each a true alarm.
            everything = [labels for r in RECEIVER_BY_SEVERITY.values() for _, labels in webhook.firing(r)]
            assert {labels.get("device") for labels in everything} <= {f.device for f in FAULTS}, everything


def _matches(fault: Fault) -> Callable[[dict[str, str]], bool]:
    return lambda labels: labels["alertname"] == fault.alertname and labels.get("device") == fault.device


def _evaluated_since(prom: Prometheus, since: datetime) -> bool:
    status, _, body = http_get(prom.url + "/api/v1/rules")
    groups = json.loads(body)["data"]["groups"] if status == 200 else []
    # Prometheus prints nanoseconds; fromisoformat takes at most microseconds.
    return bool(groups) and all(
        datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", g["lastEvaluation"])) > since for g in groups
    )


# -- the shipped timings, scaled: a warning's first ticket, the page's title ------------------------------------

_DURATION = re.compile(r"(\d+)(ms|s|m|h)")
_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}


def _scaled(route: dict[str, Any], factor: float) -> None:
    """Every wait of the route tree divided by `factor`: the shipped minutes become the test's seconds,
    and which notification comes first stays what it is with the shipped file."""
    for key in ("group_wait", "group_interval", "repeat_interval"):
        if key in route:
            value = sum(int(n) * _SECONDS[unit] for n, unit in _DURATION.findall(route[key]))
            route[key] = f"{max(1, round(value / factor * 1000))}ms"
    for child in route.get("routes", []):
        _scaled(child, factor)


def _deliveries(webhook: WebhookReceiver, receiver: str) -> list[tuple[str, str]]:
    """(alertname, status) of every alert posted to `receiver`, in arrival order."""
    with webhook.lock:
        return [
            (a["labels"]["alertname"], a["status"])
            for d in webhook.deliveries
            if d.receiver == receiver
            for a in d.payload["alerts"]
        ]


@pytest.mark.e2e
def test_a_warning_joining_a_hosts_open_ticket_arrives_firing(tmp_path: Path, webhook: WebhookReceiver) -> None:
    """A host's warnings share one group. The second one, a port that is below rated for 5 minutes,
    must reach the ticket system while it fires: with a 15-minute group_interval it arrived only as
    "resolved". The shipped timings run 60 times faster (a minute is a second)."""
    config: dict[str, Any] = copy.deepcopy(yaml.safe_load(AM_CONFIG.read_text()))
    config["receivers"] = [
        {"name": r["name"], "webhook_configs": [{"url": f"{webhook.url}/{r['name']}", "send_resolved": True}]}
        for r in config["receivers"]
    ]
    _scaled(config["route"], 60)
    with Alertmanager(tmp_path / "am", config) as am:
        am.post_alerts([_alert("RnicPortDown", "warning", device="mlx5_1", port="1")])
        wait_for(
            lambda: ("RnicPortDown", "firing") in _deliveries(webhook, "rnic-ticket"),
            timeout=15,
            what="the host's first ticket",
        )
        ends = datetime.fromtimestamp(time.time() + 5, UTC)  # 5 s here: 5 minutes with the shipped timings
        second = _alert("RnicLinkBelowRated", "warning", device="mlx5_2", port="1", link="port")
        am.post_alerts([{**second, "endsAt": ends.isoformat()}])
        wait_for(
            lambda: any(name == "RnicLinkBelowRated" for name, _ in _deliveries(webhook, "rnic-ticket")),
            timeout=30,
            what="the second warning's ticket",
        )
        first = next(status for name, status in _deliveries(webhook, "rnic-ticket") if name == "RnicLinkBelowRated")
        assert first == "firing", _deliveries(webhook, "rnic-ticket")


@pytest.mark.e2e
def test_the_page_title_is_the_rules_summary(tmp_path: Path, webhook: WebhookReceiver) -> None:
    """The shipped PagerDuty integration, pointed at the webhook: PagerDuty titles the incident with the
    event's payload.summary, which must be the rule's summary annotation and the host."""
    config = _test_am_config(webhook)
    shipped = yaml.safe_load(AM_CONFIG.read_text())
    [pagerduty] = next(r for r in shipped["receivers"] if r["name"] == "rnic-pager")["pagerduty_configs"]
    pagerduty.pop("routing_key_file")
    pagerduty.update(routing_key="test-routing-key", url=f"{webhook.url}/pagerduty")
    config["receivers"] = [
        {"name": "rnic-pager", "pagerduty_configs": [pagerduty]} if r["name"] == "rnic-pager" else r
        for r in config["receivers"]
    ]
    summary = "An RDMA device of the inventory is gone."
    with Alertmanager(tmp_path / "am", config) as am:
        page = _alert("RnicDeviceDisappeared", "critical", device="mlx5_3")
        am.post_alerts([{**page, "annotations": {"summary": summary}}])

        def paged() -> list[dict[str, Any]]:
            with webhook.lock:
                return [d.payload for d in webhook.deliveries if d.receiver == "pagerduty"]

        wait_for(lambda: bool(paged()), timeout=15, what="the PagerDuty event")
        event = paged()[0]
        assert event["event_action"] == "trigger"
        assert event["payload"]["summary"] == f"{summary} (gpu-node-17:19879)"
        second = _alert("RnicPortDown", "critical", device="mlx5_1", port="1")
        am.post_alerts([{**second, "annotations": {"summary": "Another."}}])
        wait_for(lambda: len(paged()) >= 2, timeout=15, what="the page's update")
        assert paged()[-1]["payload"]["summary"].endswith("(gpu-node-17:19879, 2 alerts)")
