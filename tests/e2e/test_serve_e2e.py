"""`serve` over a simulated host, scraped by a real Prometheus (plain HTTP, then TLS + basic auth)."""

from __future__ import annotations

import base64
import ssl
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest

from rnic_exporter.sim import SimHost
from tests.support.processes import Prometheus, exporter, free_port, http_get, require_binary, stop_process
from tests.support.serve import python_serve_args, serve_args
from tests.support.tls import self_signed
from tests.support.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.sim_host(roce=3, gid_table_size=32)]


def _scrape_config(target: str, **extra: object) -> dict[str, object]:
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "rnic", "static_configs": [{"targets": [target]}], **extra}],
    }


def _assert_known_values(prom: Prometheus) -> None:
    assert prom.wait_value('up{job="rnic"}') == 1
    assert prom.wait_value("rnic_devices") == 4
    # 400G RoCE ports: 50e9 bytes/s; the IB port is 4X NDR = 400 Gb/s too.
    assert prom.wait_value('rnic_port_active_rate_bytes_per_second{device="mlx5_0",port="1"}') == 50e9
    assert prom.wait_value('rnic_port_active_width_lanes{device="mlx5_3"}') == 4
    assert prom.wait_value('rnic_nccl_gid_index{device="mlx5_1"}') == 3
    assert prom.wait_value('rnic_nccl_gid_index{device="mlx5_3"}') == 0  # InfiniBand: GID 0
    assert prom.wait_value('count(rnic_gid_entry_info{device="mlx5_0"})') == 4
    assert prom.wait_value('rnic_gid_entry_info{device="mlx5_0",index="3",type="RoCE v2",ipv4="10.0.0.1"}') == 1
    assert prom.wait_value('rnic_pcie_link_width_lanes{device="mlx5_2",link="current"}') == 16
    assert prom.wait_value('rnic_netdev_speed_bytes_per_second{netdev="ens1f0np0"}') == 50e9
    assert prom.wait_value('rnic_port_data_transmitted_bytes_total{device="mlx5_0"}') == 14000 * 4
    assert prom.value("count(rnic_attribute_unavailable)") is None  # nothing unreadable
    hash_value = prom.wait_value('rnic_gid_table_hash{device="mlx5_0"}')
    assert hash_value == int(hash_value) and 0 < hash_value < 2**53


def test_prometheus_scrapes_plain_http(tmp_path: Path, host: SimHost) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    args = serve_args(host.root, port, poll=0.5)
    with exporter(args, ready_url=f"{base}/-/ready", log_path=tmp_path / "exporter.log"):
        status, headers, body = http_get(f"{base}/metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
        lint = subprocess.run([require_binary("promtool"), "check", "metrics"], input=body, capture_output=True)
        assert lint.returncode == 0 and lint.stdout == b"" and lint.stderr == b"", lint.stdout + lint.stderr
        with Prometheus(tmp_path / "prom-plain", _scrape_config(f"127.0.0.1:{port}")) as prom:
            _assert_known_values(prom)
            # A live change reaches Prometheus: the speed drop of mlx5_2.
            host.set_speed("mlx5_2", 200)
            prom_query = 'rnic_port_active_rate_bytes_per_second{device="mlx5_2"} == 25e9'
            assert prom.wait_value(prom_query) == 25e9


@pytest.fixture
def tls_files(tmp_path: Path) -> Iterator[tuple[Path, Path, Path, str]]:
    cert, key = self_signed(tmp_path)
    password = "s3cret-scraper"
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
    web_config = tmp_path / "web-config.yml"
    web_config.write_text(
        "tls_server_config:\n"
        f"  cert_file: {cert.name}\n"
        f"  key_file: {key.name}\n"
        "basic_auth_users:\n"
        f"  prometheus: '{hashed}'\n"
    )
    yield cert, key, web_config, password


def test_prometheus_scrapes_tls_with_basic_auth(
    tmp_path: Path, host: SimHost, tls_files: tuple[Path, Path, Path, str]
) -> None:
    cert, _key, web_config, password = tls_files
    port = free_port()
    base = f"https://127.0.0.1:{port}"
    context = ssl.create_default_context(cafile=str(cert))
    auth = {"Authorization": "Basic " + base64.b64encode(f"prometheus:{password}".encode()).decode()}
    args = [
        *serve_args(host.root, port, poll=0.5),
        "--web.config.file",
        str(web_config),
    ]
    with exporter(args, ready_url=f"{base}/-/ready", context=context, headers=auth, log_path=tmp_path / "exporter.log"):
        assert http_get(f"{base}/metrics", context=context)[0] == 401
        assert http_get(f"{base}/metrics", context=context, headers=auth)[0] == 200
        config = _scrape_config(
            f"127.0.0.1:{port}",
            scheme="https",
            tls_config={"ca_file": str(cert), "server_name": "localhost"},
            basic_auth={"username": "prometheus", "password": password},
        )
        with Prometheus(tmp_path / "prom-tls", config) as prom:
            _assert_known_values(prom)


def _page_problem(text: str, devices: int) -> str | None:
    """What is wrong with a 200 page of `devices` RoCE devices (line checks: thousands of pages)."""
    lines = text.splitlines()
    if f"rnic_devices {devices}.0" not in lines:
        return "no rnic_devices line: " + ("an empty page" if not text else "an incomplete one")
    counted = {
        line.split('device="', 1)[1].split('"', 1)[0]
        for line in lines
        if line.startswith("rnic_port_data_transmitted_bytes_total{")
    }
    stale = [line for line in lines if line.startswith("rnic_exporter_counters_stale ")]
    if len(counted) != devices or stale != ["rnic_exporter_counters_stale 0.0"]:
        return f"counters of {len(counted)} of {devices} devices, {stale}"
    return None


def test_scrapes_from_the_first_moment_are_complete_or_refused(tmp_path: Path) -> None:
    """A restart must not look like every series ended: from the first connection on, a scrape is
    either complete (every device's counters, `rnic_exporter_counters_stale 0`) or refused (503),
    never an empty 200 or a page of devices without their counters that says it is fresh."""
    host = SimHost.build(tmp_path / "sys", roce=16, gid_table_size=32)
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    argv = python_serve_args(host.root, port, "--no-watch.netlink", "--no-watch.udev")
    responses: list[tuple[float, int, bytes]] = []
    stop = threading.Event()

    def scrape_hard() -> None:  # several scrapers, as close together as the machine allows
        while not stop.is_set():
            try:
                status, _headers, body = http_get(url, timeout=10)
            except OSError:
                stop.wait(0.005)  # not listening yet
                continue
            responses.append((time.monotonic(), status, body))

    with (tmp_path / "exporter.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=log)
        scrapers = [threading.Thread(target=scrape_hard) for _ in range(3)]
        try:
            for thread in scrapers:
                thread.start()
            # Two seconds of pages after the first 200: the first counter passes are behind us then.
            first = wait_for(
                lambda: next((at for at, status, _ in list(responses) if status == 200), None),
                timeout=30,
                what="a first 200 from /metrics",
            )
            wait_for(lambda: time.monotonic() > first + 2, timeout=5, what="two seconds of scrapes")
        finally:
            stop.set()
            for thread in scrapers:
                thread.join(timeout=15)
            stop_process(proc)
    statuses = Counter(status for _, status, _ in responses)
    assert set(statuses) <= {200, 503}, statuses
    assert statuses[200] > 10, statuses
    for _, status, body in responses:
        if status == 503:
            assert body.startswith(b"no poll has completed yet"), body
        else:
            assert _page_problem(body.decode(), 16) is None, _page_problem(body.decode(), 16)
