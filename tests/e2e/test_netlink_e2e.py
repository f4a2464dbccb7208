"""The whole chain on real interfaces: `ip addr` / carrier changes in a network namespace, the
simulator following them as the kernel would, and the daemon noticing through rtnetlink.

The daemon polls only every 60 s here, so everything seen within seconds came through netlink.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rnic_exporter.sim.gid_table import address_gid
from tests.support.exposition import Samples, samples
from tests.support.netns import Netns, network_namespace
from tests.support.processes import http_get
from tests.support.serve import follow_netlink_args, python_serve_args
from tests.support.wait import wait_for

PORT = 19879  # a fresh namespace: nothing else listens there
NETDEVS = {"ens1f0np0": "0c:42:a1:41:00:36", "ens2f0np0": "0c:42:a1:41:01:36"}


def _v2_gid_file(sysfs: Path, device: str, index: int) -> Path:
    return sysfs / "class/infiniband" / device / "ports/1/gids" / str(index)


class Daemon:
    def __init__(self, ns: Netns, log: Path) -> None:
        self.ns, self.log = ns, log

    def metrics(self) -> Samples:
        status, _, body = http_get(self.ns.url(PORT, "/metrics"), timeout=2)
        assert status == 200
        return samples(body.decode())

    def value(self, name: str, **labels: str) -> float | None:
        return self.metrics().get((name, frozenset(labels.items())))

    def wait(self, expected: float, name: str, **labels: str) -> None:
        """Within 5 s: far below the 60 s poll interval, so only a netlink wakeup gets there in time."""
        seen: list[float | None] = []

        def probe() -> bool:
            seen.append(self.value(name, **labels))
            return seen[-1] == expected

        try:
            wait_for(probe, timeout=5.0, what=f"{name}{labels} == {expected}")
        except AssertionError as exc:
            raise AssertionError(f"{exc} (last {seen[-1:]})") from None

    def events(self) -> list[dict[str, str]]:
        lines = [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]
        return [line for line in lines if "event" in line]


@pytest.fixture
def chain(tmp_path: Path) -> Iterator[tuple[Netns, Daemon, Path]]:
    sysfs = tmp_path / "sys"
    with network_namespace(NETDEVS) as ns:
        ns.ip("addr", "add", "10.0.0.1/24", "dev", "ens1f0np0")
        ns.ip("addr", "add", "10.0.1.1/24", "dev", "ens2f0np0")
        sim_log = open(tmp_path / "simulate.log", "wb")  # noqa: SIM115 - closed below
        try:
            ns.popen(
                follow_netlink_args(sysfs),
                stdout=sim_log,
                stderr=subprocess.STDOUT,
            )
            # "following netlink" is printed once the follower listens and holds its slots.
            wait_for(
                lambda: "following netlink" in (tmp_path / "simulate.log").read_text(),
                timeout=20,
                what="the simulator to follow netlink",
            )
            assert _v2_gid_file(sysfs, "mlx5_0", 3).read_text().strip() == address_gid("10.0.0.1")
            log = tmp_path / "serve.log"
            serve_log = open(log, "wb")  # noqa: SIM115 - closed below
            try:
                ns.popen(
                    [
                        *python_serve_args(sysfs, f"{ns.address}:{PORT}", state_dir=tmp_path / "state"),
                        "--poll.interval",
                        "60",
                        "--log.format",
                        "json",
                    ],
                    stdout=serve_log,
                    stderr=subprocess.STDOUT,
                )
                daemon = Daemon(ns, log)
                wait_for(lambda: _ready(ns), timeout=20, what="the daemon inside the namespace")
                yield ns, daemon, sysfs
            finally:
                serve_log.close()
        finally:
            sim_log.close()


def _ready(ns: Netns) -> bool:
    return http_get(ns.url(PORT, "/-/ready"), timeout=1)[0] == 200  # wait_for retries while it raises


def test_gid_shift_address_loss_and_flap_seen_through_netlink(chain: tuple[Netns, Daemon, Path]) -> None:
    ns, daemon, _ = chain
    port0 = {"device": "mlx5_0", "port": "1"}
    netdev0 = {**port0, "netdev": "ens1f0np0"}
    daemon.wait(3, "rnic_gid_roce_v2_ipv4_index", **port0, address="10.0.0.1")
    daemon.wait(1, "rnic_netdev_addresses", **netdev0, family="ipv4")  # from rtnetlink, not the GID table
    daemon.wait(1, "rnic_netdev_address_present", **netdev0, address="10.0.0.1")

    # Incident 1: the address goes (NetworkManager on carrier loss) and comes back; a job holds index 3.
    ns.ip("addr", "del", "10.0.0.1/24", "dev", "ens1f0np0")
    daemon.wait(0, "rnic_netdev_address_present", **netdev0, address="10.0.0.1")
    daemon.wait(1, "rnic_events_total", event="rnic.address.lost", **port0)
    ns.ip("addr", "add", "10.0.0.1/24", "dev", "ens1f0np0")
    daemon.wait(4, "rnic_gid_roce_v2_ipv4_index", **port0, address="10.0.0.1")
    daemon.wait(1, "rnic_events_total", event="rnic.gid.address_moved", **port0)
    daemon.wait(1, "rnic_netdev_address_present", **netdev0, address="10.0.0.1")
    daemon.wait(4, "rnic_nccl_gid_index", **port0)

    # A carrier flap keeps the address and the GIDs: port events only.
    ns.set_carrier("ens1f0np0", False)
    daemon.wait(0, "rnic_port_up", **port0)
    ns.set_carrier("ens1f0np0", True)
    daemon.wait(1, "rnic_port_up", **port0)
    daemon.wait(1, "rnic_events_total", event="rnic.port.up", **port0)

    wakeups = daemon.value("rnic_exporter_wakeups_total", source="netlink")
    assert wakeups is not None and wakeups >= 4
    assert daemon.value("rnic_exporter_polls_total") is not None
    seen = [(e["event"], e.get("device")) for e in daemon.events() if e.get("device") == "mlx5_0"]
    moved = [e for e in daemon.events() if e["event"] == "rnic.gid.address_moved"]
    assert [(m["before"], m["after"], m["address"]) for m in moved] == [("3", "4", "10.0.0.1")]
    for name in (
        "rnic.address.lost",
        "rnic.address.restored",
        "rnic.gid.address_moved",
        "rnic.port.down",
        "rnic.port.up",
    ):
        assert (name, "mlx5_0") in seen, (name, seen)
    assert daemon.value("rnic_events_total", event="rnic.gid.table_changed", device="mlx5_1", port="1") == 0


def test_ethtool_reader_on_real_netdevs_never_raises() -> None:
    """veths report a speed but advertise no link modes; a missing netdev is an error, counted."""
    from rnic_exporter.sources.ethtool import EthtoolReader

    with network_namespace({"ens1f0np0": None}) as ns, ns.entered():
        reader = EthtoolReader()
        try:
            assert reader.advertised("ens1f0np0") is None  # no advertised modes: no ethtool rating
            assert reader.errors == 0
            assert reader.advertised("absent0") is None
            assert reader.errors == 1
        finally:
            reader.close()
