"""Detection: judgments of simulated hosts and the events between two of them, table by table.

Each case drives a real simulated sysfs tree through the reading layer, so the events come from
what the kernel would show, not from hand-built snapshots.
"""

from __future__ import annotations

import json
import socket
from dataclasses import replace
from pathlib import Path

import pytest

from rnic_exporter.catalog import events as ev
from rnic_exporter.catalog.events import Event
from rnic_exporter.detect.conditions import judge
from rnic_exporter.detect.diff import diff
from rnic_exporter.detect.flapping import FlapTracker
from rnic_exporter.detect.inputs import Inputs
from rnic_exporter.detect.problems import find_problems
from rnic_exporter.detect.settings import DetectionSettings, FlapSettings, RatedExpectation
from rnic_exporter.detect.state import STATE_FILE, State, StateStore
from rnic_exporter.model.host import AdvertisedLink
from rnic_exporter.model.nccl import NcclSettings
from rnic_exporter.sim import SimHost
from rnic_exporter.sources.address_risks import HostPaths, address_loss_risks
from rnic_exporter.sources.ethtool import best_mode
from tests.support.detect import Run, names, only, read_full

# -- incident 1: the GID index shift ----------------------------------------------------------


def test_gid_shift_reports_the_move_of_the_roce_v2_address(sim_host: SimHost) -> None:
    run = Run(sim_host)
    assert names(run.poll()) == ["rnic.device.discovered"] * 3
    sim_host.hold_gid("mlx5_0", "10.0.0.1")  # a running job uses index 3
    sim_host.set_port_up("mlx5_0", False)
    sim_host.remove_address("mlx5_0", "10.0.0.1")  # NetworkManager drops the address on carrier loss
    lost = run.poll()
    assert names(lost) == [
        "rnic.address.lost",
        "rnic.gid.table_changed",
        "rnic.nccl.gid_index_changed",
        "rnic.port.down",
    ]
    loss = only(lost, "rnic.address.lost")
    assert loss.attributes["port_state"] == "down" and loss.severity == "warning"
    assert (loss.device, loss.port, loss.netdev) == ("mlx5_0", 1, "ens1f0np0")
    sim_host.set_port_up("mlx5_0", True)
    sim_host.add_address("mlx5_0", "10.0.0.1")
    back = run.poll()
    assert names(back) == [
        "rnic.address.restored",
        "rnic.gid.address_moved",
        "rnic.gid.table_changed",
        "rnic.nccl.gid_index_changed",
        "rnic.port.up",
    ]
    moved = only(back, "rnic.gid.address_moved")
    assert (moved.before, moved.after, moved.attributes["address"]) == ("3", "4", "10.0.0.1")
    assert moved.severity == "critical" and "index 3" in moved.message and "to 4" in moved.message
    assert only(back, "rnic.nccl.gid_index_changed").after == "4"
    assert run.poll() == []  # the new index is remembered: one event per move


def test_flap_that_keeps_its_gids_raises_no_gid_event(sim_host: SimHost) -> None:
    run = Run(sim_host)
    run.poll()
    sim_host.set_port_up("mlx5_0", False)
    assert names(run.poll()) == ["rnic.port.down"]
    sim_host.set_port_up("mlx5_0", True)
    assert names(run.poll()) == ["rnic.port.up"]


def test_moving_counters_and_steady_state_raise_nothing(sim_host: SimHost) -> None:
    run = Run(sim_host)
    run.poll()
    for _ in range(3):
        sim_host.add_traffic(5.0)
        assert run.poll() == []


def test_address_lost_while_the_port_is_up_is_critical(sim_host: SimHost) -> None:
    run = Run(sim_host)
    run.poll()
    sim_host.remove_address("mlx5_1", "10.0.1.1")
    loss = only(run.poll(), "rnic.address.lost")
    assert loss.severity == "critical" and loss.attributes == {
        "address": "10.0.1.1",
        "family": "ipv4",
        "port_state": "up",
    }
    sim_host.add_address("mlx5_1", "10.0.1.1")
    events = run.poll()
    only(events, "rnic.address.restored")
    assert "rnic.gid.address_moved" not in names(events)  # no job held the slot: same index again


def test_addresses_come_from_netlink_when_it_knows_the_netdev(sim_host: SimHost) -> None:
    class Addr:
        def __init__(self, address: str, family: str, flags: int = 0) -> None:
            self.address, self.family, self.flags = address, family, flags

    privacy = Addr("2001:db8::7e3a", "ipv6", flags=0x01)  # IFA_F_TEMPORARY: rotates by design
    both = {"ens1f0np0": (Addr("10.0.0.1", "ipv4"), Addr("2001:db8::1", "ipv6"), Addr("fe80::1", "ipv6"), privacy)}
    run = Run(sim_host)
    run.poll(Inputs(addresses=both))  # learns what is expected
    assert run.poll(Inputs(addresses=both)) == []
    view = run.detector.last.ports[("mlx5_0", 1)] if run.detector.last else None
    assert view is not None and view.addresses_from == "netlink"
    # Link-local and temporary addresses are not expected: they come and go by design.
    assert view.expected == {"10.0.0.1": True, "2001:db8::1": True}
    # The IPv6 address leaves (admin down without keep_addr_on_down); the GID table is not consulted.
    lost = run.poll(Inputs(addresses={"ens1f0np0": (Addr("10.0.0.1", "ipv4"),)}))
    loss = only(lost, "rnic.address.lost")
    assert loss.attributes["address"] == "2001:db8::1" and loss.attributes["family"] == "ipv6"
    # A netdev netlink does not know (another netns) falls back to the GID table.
    view2 = run.detector.last.ports[("mlx5_1", 1)] if run.detector.last else None
    assert view2 is not None and view2.addresses_from == "gid_table"


# -- incident 3: the configured NCCL_IB_GID_INDEX ----------------------------------------------


@pytest.mark.parametrize(("index", "valid"), [(3, True), (2, False), (0, False), (1, False), (9, False)])
def test_configured_gid_index_must_be_roce_v2_ipv4(sim_host: SimHost, index: int, valid: bool) -> None:
    cur = judge(read_full(sim_host), State(), DetectionSettings(nccl_gid_index=index))
    roce = [v for v in cur.ports.values() if v.link_layer == "Ethernet"]
    assert roce and all(v.configured_index_valid is valid for v in roce)
    ib = [v for v in cur.ports.values() if v.link_layer == "InfiniBand"]
    assert ib and all(v.configured_index_valid is None for v in ib)
    first = [e for e in diff(None, cur) if not e.name.startswith("rnic.device.")]
    assert names(first) == ([] if valid else ["rnic.nccl.gid_index_invalid"] * 2)


def test_configured_index_is_judged_as_nccl_uses_it_and_agrees_with_the_usable_gauge(sim_host: SimHost) -> None:
    # NCCL uses a pinned index as it is, whatever NCCL_IB_ADDR_FAMILY says: index 3 (the IPv4
    # address's RoCE v2 GID) works under AF_INET6 too, and both gauges say so.
    v6 = DetectionSettings(nccl_gid_index=3, nccl=NcclSettings(address_family=socket.AF_INET6))
    cur = judge(read_full(sim_host), State(), v6)
    roce = [v for v in cur.ports.values() if v.configured_index_valid is not None]
    assert roce and all(v.configured_index_valid is True and v.nccl_usable is True for v in roce)
    assert "rnic.nccl.gid_index_invalid" not in names(diff(None, cur))
    v4 = DetectionSettings(nccl_gid_index=2)
    events = [e for e in diff(None, judge(read_full(sim_host), State(), v4)) if e.name == "rnic.nccl.gid_index_invalid"]
    assert events and all("points at a GID of another RoCE version" in e.message for e in events)


def test_configured_index_is_not_judged_on_a_port_nccl_does_not_use(sim_host: SimHost) -> None:
    sim_host.set_port_up("mlx5_0", False)
    cur = judge(read_full(sim_host), State(), DetectionSettings(nccl_gid_index=9))
    down = [v for v in cur.ports.values() if v.device == "mlx5_0"]
    assert down and all(v.configured_index_valid is None and v.nccl_usable is None for v in down)
    up = [v for v in cur.ports.values() if v.configured_index_valid is not None]
    assert up and all(v.configured_index_valid is False for v in up)


def test_configured_index_turns_invalid_when_the_address_moves(sim_host: SimHost) -> None:
    run = Run(sim_host, settings=DetectionSettings(nccl_gid_index=3))
    assert "rnic.nccl.gid_index_invalid" not in names(run.poll())
    sim_host.gid_shift("mlx5_0")
    invalid = only(run.poll(), "rnic.nccl.gid_index_invalid")
    assert invalid.device == "mlx5_0" and "index 3 is empty" in invalid.message
    sim_host.release_gids("mlx5_0")
    sim_host.remove_address("mlx5_0", "10.0.0.1")
    sim_host.add_address("mlx5_0", "10.0.0.1")  # the slot is free again: back to 3
    assert "rnic.nccl.gid_index_valid" in names(run.poll())


def test_auto_selection_means_no_configured_index(sim_host: SimHost) -> None:
    cur = judge(read_full(sim_host), State(), DetectionSettings(nccl_gid_index=-1))
    assert all(v.configured_index_valid is None for v in cur.ports.values())


# -- incident 2: silent degradation --------------------------------------------------------------


def test_speed_below_configured_rating_and_restored(sim_host: SimHost) -> None:
    rated = RatedExpectation(match=(("hca_type", "MT4129"),), port_rate_gbps=400, port_width=4)
    run = Run(sim_host, settings=DetectionSettings(rated=(rated,)))
    first = run.poll()
    assert "rnic.link.below_rated" not in names(first)
    sim_host.set_speed("mlx5_0", 200)
    slow = [e for e in run.poll() if e.name == "rnic.link.below_rated"]
    assert sorted(e.attributes["link"] for e in slow) == ["netdev", "port"]
    port = next(e for e in slow if e.attributes["link"] == "port")
    assert port.attributes["source"] == "config" and port.after is not None and "200 Gb/s" in port.after
    assert port.before is not None and "400 Gb/s" in port.before
    sim_host.set_speed("mlx5_0", 400)
    assert sorted(e.attributes["link"] for e in run.poll() if e.name == "rnic.link.restored") == ["netdev", "port"]


def test_ib_width_below_rating(sim_host: SimHost) -> None:
    run = Run(sim_host)
    run.poll()  # learns the baseline: 4X NDR
    sim_host.set_speed("mlx5_2", 0, lanes=2)
    slow = only(run.poll(), "rnic.link.below_rated")
    assert slow.device == "mlx5_2" and slow.attributes == {"link": "port", "source": "baseline"}
    assert slow.after == "200 Gb/s x2"


def test_learned_baseline_and_ethtool_ratings(sim_host: SimHost) -> None:
    run = Run(sim_host)
    advertised = {"ens1f0np0": AdvertisedLink(400000, 4)}
    run.poll(Inputs(advertised=advertised))  # the baseline is learned from this poll, used from the next
    run.poll(Inputs(advertised=advertised))
    view = run.detector.last.ports[("mlx5_0", 1)] if run.detector.last else None
    assert view is not None
    assert [(r.source, r.rate_bytes_per_second, r.lanes) for r in view.rated] == [
        ("ethtool", 400e9 / 8, 4),
        ("baseline", 400e9 / 8, 4),
    ]


def test_pcie_downtrain_against_device_maximum(sim_host: SimHost) -> None:
    run = Run(sim_host)
    run.poll()
    sim_host.set_pcie("mlx5_1", 16.0, 8)
    slow = only(run.poll(), "rnic.link.below_rated")
    assert slow.attributes == {"link": "pcie", "source": "device"}
    assert slow.after == "16 GT/s x8" and slow.before == "32 GT/s x16 (device)"


def test_down_port_rate_is_not_judged(sim_host: SimHost) -> None:
    """A down mlx5 RoCE port prints `40 Gb/sec (4X QDR)`: that is not a slow link."""
    run = Run(sim_host)
    run.poll()
    sim_host.set_port_up("mlx5_0", False)
    assert names(run.poll()) == ["rnic.port.down"]


# -- the NIC that disappears ---------------------------------------------------------------------


def test_device_disappears_and_reappears(sim_host: SimHost, tmp_path: Path) -> None:
    run = Run(sim_host, tmp_path / "state")
    run.poll()
    sim_host.remove_device("mlx5_1")
    gone = only(run.poll(), "rnic.device.disappeared")
    assert (gone.device, gone.pci_address, gone.severity) == ("mlx5_1", "0000:19:00.0", "critical")
    assert run.poll() == []
    sim_host.restore_device("mlx5_1")
    assert names(run.poll()) == ["rnic.device.reappeared"]


def test_device_removed_while_stopped_is_missing_after_restart(sim_host: SimHost, tmp_path: Path) -> None:
    Run(sim_host, tmp_path / "state").poll()
    sim_host.remove_device("mlx5_2")
    restarted = Run(sim_host, tmp_path / "state")
    gone = only(restarted.poll(), "rnic.device.disappeared")
    assert gone.device == "mlx5_2"
    last = restarted.detector.last
    assert last is not None and {d.name: d.present for d in last.devices.values()} == {
        "mlx5_0": True,
        "mlx5_1": True,
        "mlx5_2": False,
    }


# -- flapping --------------------------------------------------------------------------------


def test_flap_tracker_window_and_sticky_clear() -> None:
    tracker = FlapTracker(FlapSettings(transitions=4, window_s=60, clear_after_s=120))
    key = ("mlx5_0", 1)
    timeline = [
        (0, True, False),
        (10, False, False),
        (20, True, False),
        (30, False, False),
        (40, True, True),
        (100, True, True),
        (159, True, True),
        (160, True, False),
    ]
    for now, up, flapping in timeline:
        assert tracker.observe(key, up, now) is flapping, now


def test_slow_transitions_are_not_a_flap() -> None:
    tracker = FlapTracker(FlapSettings(transitions=4, window_s=60, clear_after_s=120))
    assert not any(tracker.observe(("d", 1), i % 2 == 0, i * 40.0) for i in range(10))


def test_flapping_events(sim_host: SimHost) -> None:
    run = Run(sim_host, settings=DetectionSettings(flap=FlapSettings(transitions=4, window_s=20, clear_after_s=30)))
    run.poll()
    seen: list[str] = []
    for up in (False, True, False, True):
        sim_host.set_port_up("mlx5_0", up)
        seen += names(run.poll(advance=1.0))
    assert seen.count("rnic.port.flapping") == 1
    assert names(run.poll(advance=31.0)) == ["rnic.port.stable"]


# -- risks -----------------------------------------------------------------------------------


def test_address_loss_risks(tmp_path: Path) -> None:
    paths = HostPaths(procfs=tmp_path / "proc", rootfs=tmp_path / "root")
    assert address_loss_risks(paths, "ens1f0np0", 11, has_global_ipv6=True) == frozenset()
    nm = paths.rootfs / "run/NetworkManager/devices"
    nm.mkdir(parents=True)
    (nm / "11").write_text("[device]\nmanaged=true\nperm-hw-addr-fake=\n")
    (nm / "12").write_text("[device]\nmanaged=false\n")
    conf = paths.procfs / "sys/net/ipv6/conf"
    for name, value in (("ens1f0np0", "0"), ("all", "0"), ("ens2f0np0", "1")):
        (conf / name).mkdir(parents=True)
        (conf / name / "keep_addr_on_down").write_text(f"{value}\n")
    assert address_loss_risks(paths, "ens1f0np0", 11, True) == {"networkmanager", "ipv6_keep_addr_on_down_off"}
    assert address_loss_risks(paths, "ens1f0np0", 11, False) == {"networkmanager"}
    assert address_loss_risks(paths, "ens2f0np0", 12, True) == frozenset()
    (conf / "all" / "keep_addr_on_down").write_text("1\n")
    assert address_loss_risks(paths, "ens1f0np0", 12, True) == frozenset()


def test_risk_event_once_per_new_reason(sim_host: SimHost) -> None:
    run = Run(sim_host)
    risk = only(run.poll(Inputs(risks={"ens1f0np0": frozenset({"networkmanager"})})), "rnic.risk.address_loss")
    assert risk.attributes == {"reason": "networkmanager"} and risk.netdev == "ens1f0np0"
    assert run.poll(Inputs(risks={"ens1f0np0": frozenset({"networkmanager"})})) == []


# -- ethtool modes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("modes", "best"),
    [
        (["100000baseCR4/Full", "400000baseCR4/Full", "200000baseCR2/Full"], AdvertisedLink(400000, 4)),
        (["25000baseCR/Full", "10000baseT/Full"], AdvertisedLink(25000, 1)),
        (["400000baseCR8/Full"], AdvertisedLink(400000, 8)),
        (["Autoneg", "TP", "Pause"], None),
        ([], None),
    ],
)
def test_best_advertised_mode(modes: list[str], best: AdvertisedLink | None) -> None:
    assert best_mode(modes) == best


# -- the state file --------------------------------------------------------------------------


def test_state_round_trip_is_atomic_and_versioned(sim_host: SimHost, tmp_path: Path) -> None:
    run = Run(sim_host, tmp_path / "state")
    run.poll()
    path = tmp_path / "state" / STATE_FILE
    data = json.loads(path.read_text())
    assert data["format"] == "rnic-exporter-state" and data["version"] == 1
    assert sorted(d["name"] for d in data["devices"].values()) == ["mlx5_0", "mlx5_1", "mlx5_2"]
    assert data["addresses"]["mlx5_0/1"]["10.0.0.1"]["v2_index"] == 3
    assert data["baselines"]["mlx5_0/1"]["lanes"] == 4
    assert [p.name for p in path.parent.iterdir()] == [STATE_FILE]  # no temp file left behind
    mtime = path.stat().st_mtime_ns
    run.poll()
    assert path.stat().st_mtime_ns == mtime  # nothing changed: not rewritten


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("{not json", "corrupt"),
        ('{"format": "something-else", "version": 1}', "foreign"),
        ('{"format": "rnic-exporter-state", "version": 99}', "corrupt"),
        ('{"format": "rnic-exporter-state", "version": 1, "devices": {"x": {"bogus": 1}}}', "corrupt"),
        ("[1, 2]", "foreign"),
    ],
)
def test_corrupt_or_foreign_state_is_rebuilt(sim_host: SimHost, tmp_path: Path, content: str, reason: str) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / STATE_FILE).write_text(content)
    run = Run(sim_host, state_dir)
    assert +run.detector.state_errors == {reason: 1}  # the other reasons are there at 0
    assert names(run.poll()) == ["rnic.device.discovered"] * 3
    assert json.loads((state_dir / STATE_FILE).read_text())["version"] == 1
    assert any(p.name.startswith(f"{STATE_FILE}.{reason}-") for p in state_dir.iterdir())


def test_unwritable_state_dir_is_counted_not_fatal(sim_host: SimHost, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    run = Run(sim_host, blocker / "state")  # a path under a regular file can never be created
    assert len(run.poll()) == 3
    assert run.detector.state_errors["unwritable"] == 1


# -- problems (check) -------------------------------------------------------------------------


def test_problems_explain_each_condition(sim_host: SimHost, tmp_path: Path) -> None:
    Run(sim_host, tmp_path / "state").poll()
    sim_host.remove_device("mlx5_2")
    sim_host.set_speed("mlx5_0", 100)
    sim_host.remove_address("mlx5_1", "10.0.1.1")
    state = StateStore(tmp_path / "state").load().state
    cur = judge(
        replace(read_full(sim_host), taken_at=1_000_010.0),  # on Run's clock: the address was lost 5 s ago
        state,
        DetectionSettings(nccl_gid_index=2, expected_devices=4),
        risks={"ens1f0np0": frozenset({"networkmanager"})},
    )
    problems = find_problems(cur)
    codes = sorted((p.code, p.where.split(" ")[0]) for p in problems)
    assert codes == sorted(
        [
            ("device_missing", "mlx5_2"),
            ("device_count", "host"),
            ("port_below_rated", "mlx5_0"),
            ("netdev_below_rated", "mlx5_0"),
            ("nccl_gid_index_invalid", "mlx5_0"),
            ("nccl_gid_index_invalid", "mlx5_1"),
            ("address_missing", "mlx5_1"),
            ("risk_networkmanager", "mlx5_0"),
        ]
    )
    assert [p.severity for p in problems] == ["critical"] * 5 + ["warning"] * 3  # most severe first
    assert all(p.meaning and p.fix for p in problems)


def test_event_catalogue_is_complete_and_consistent() -> None:
    assert len(ev.BY_NAME) == len(ev.EVENT_SPECS)
    for spec in ev.EVENT_SPECS:
        assert spec.name.startswith("rnic.") and spec.name == spec.name.lower() and spec.meaning
        assert spec.severity in ev.OTEL_SEVERITY_NUMBER


def test_a_listed_device_not_read_yet_is_not_disappeared(sim_host: SimHost) -> None:
    # The reading layer lists a device whose first read hangs but cannot publish it: the inventory
    # must not page "disappeared" for it (the stuck-read metric and alert say what is wrong).
    run = Run(sim_host)
    run.poll()
    full = replace(read_full(sim_host), taken_at=run.clock + 5)
    others = tuple(d for d in full.devices if d.name != "mlx5_1")
    stuck = replace(full, devices=others, listed_unread=("mlx5_1",))
    events = run.detector.observe(stuck, None)
    assert "rnic.device.disappeared" not in names(events)
    gone = replace(full, devices=others, taken_at=run.clock + 10)  # no longer listed at all
    assert only(run.detector.observe(gone, None), "rnic.device.disappeared").device == "mlx5_1"


def test_a_card_registered_under_a_departed_cards_name_is_still_judged(sim_host: SimHost) -> None:
    run = Run(sim_host)
    run.poll()
    sim_host.set_port_up("mlx5_1", False)
    snap = replace(read_full(sim_host), taken_at=run.clock + 5)
    moved = tuple(replace(d, pci_address="0000:99:00.0") if d.name == "mlx5_1" else d for d in snap.devices)
    events = run.detector.observe(replace(snap, devices=moved), None)
    gone = only(events, "rnic.device.disappeared")
    assert (gone.device, gone.pci_address) == ("mlx5_1", "0000:19:00.0")
    # The new card's port is down: the old card's absence under the same name must not mute that.
    assert "rnic.port.down" in names(events), names(events)


# -- identity: what stays when a device is renamed ------------------------------------------------


def test_a_renamed_soft_device_is_the_same_device_not_a_lost_one(tmp_path: Path) -> None:
    """`rdma dev set rxe0 name rxe9` in the kernel lab: rxe has no PCI address, and keying it by name
    made the rename a critical "disappeared" for rxe0 and a new device rxe9 (its GUID never changed)."""
    host = SimHost.build(tmp_path / "sys", roce=2, ethernet_gbps=10, driver="rxe")
    run = Run(host)
    assert names(run.poll()) == ["rnic.device.discovered"] * 2
    host.rename_device("rxe0", "rxe9")
    events = run.poll()
    assert "rnic.device.disappeared" not in names(events) and "rnic.device.discovered" not in names(events)
    devices = {view.name: view for view in run.detector.last.devices.values()} if run.detector.last else {}
    assert devices["rxe9"].present and "rxe0" not in devices


def test_a_state_file_that_keyed_a_soft_device_by_name_still_knows_it(tmp_path: Path) -> None:
    """State written before the GUID key: the same device read now is neither new nor missing."""
    host = SimHost.build(tmp_path / "sys", roce=1, ethernet_gbps=10, driver="rxe")
    run = Run(host, tmp_path / "state")
    run.poll()
    path = tmp_path / "state" / "state.json"
    data = json.loads(path.read_text())
    data["devices"] = {f"name:{v['name']}": v for v in data["devices"].values()}
    path.write_text(json.dumps(data))
    again = Run(host, tmp_path / "state")
    assert names(again.poll()) == []


def test_a_soft_roce_port_rate_is_no_measure_of_its_netdev(tmp_path: Path) -> None:
    """rxe reports a 50G netdev as a 100 Gb/s port (the kernel lab's tap_speed): a healthy 50G netdev
    is not below a "rated" 100 learned from the port. A real drop still shows on both links."""
    host = SimHost.build(tmp_path / "sys", roce=1, ethernet_gbps=50, driver="rxe")
    run = Run(host)
    assert names(run.poll()) == ["rnic.device.discovered"]
    run.poll()
    assert run.detector.last is not None
    view = run.detector.last.ports[("rxe0", 1)]
    assert [(j.link, j.below) for j in view.links if j.link == "netdev"] == []
    assert not any(j.below for j in view.links)
    mirrored = SimHost.build(tmp_path / "sys2", roce=1, ethernet_gbps=100, driver="rxe")
    run = Run(mirrored)
    run.poll()
    mirrored.set_speed("rxe0", 25)
    below = [e for e in run.poll() if e.name == "rnic.link.below_rated"]
    assert sorted(e.attributes.get("link", "") for e in below) == ["netdev", "port"], below


def test_a_link_restored_through_a_renegotiation_is_restored(tmp_path: Path) -> None:
    """A renegotiation drops the carrier (the kernel lab's incident_b1): the port link is not judged
    while the port is down, and coming back at full speed must still say "restored", as going down
    to a lower speed again must not say "below rated" twice."""
    host = SimHost.build(tmp_path / "sys", roce=1, ethernet_gbps=100, driver="rxe")
    run = Run(host)
    run.poll()

    def renegotiate(gbps: int) -> list[Event]:
        host.set_port_up("rxe0", False)
        down = run.poll()
        host.set_speed("rxe0", gbps)
        host.set_port_up("rxe0", True)
        return down + run.poll()

    events = renegotiate(25)
    assert sorted(e.attributes["link"] for e in events if e.name == "rnic.link.below_rated") == ["netdev", "port"]
    assert sorted(e.attributes["link"] for e in renegotiate(10) if e.name == "rnic.link.below_rated") == []
    events = renegotiate(100)
    assert sorted(e.attributes["link"] for e in events if e.name == "rnic.link.restored") == ["netdev", "port"]
