"""`check` and the wire (issue 32): an optic beyond its module's own thresholds is a line (warning past
an alarm limit, info past a warning limit, so a prologue at --fail-on warning does not drain a node for
a module that still works); a down RoCE port says why its link is down where the driver tells; a
healthy wire, and one the driver does not support, add nothing."""

from __future__ import annotations

from pathlib import Path

from rnic_exporter.commands.check import CheckReport, format_report
from rnic_exporter.sim import SimHost
from rnic_exporter.sim.wire import SimEthtool, SimModule, SimPort, SimWire
from rnic_exporter.sources.wire import WireReader
from tests.support.check import check_in_process


def _check(host: SimHost, wire: SimWire, tmp_path: Path) -> CheckReport:
    return check_in_process(host, tmp_path, wire=WireReader(SimEthtool(wire), gstats=wire.gstats))


def _wire(*netdevs: str) -> SimWire:
    wire = SimWire()
    for netdev in netdevs:
        wire.add(netdev)
    return wire


def test_a_healthy_wire_adds_nothing(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=2, infiniband=1)
    report = _check(host, _wire("ens1f0np0", "ens2f0np0"), tmp_path)
    assert report.healthy, format_report(report)


def test_unsupported_netdevs_add_nothing(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=2)
    wire = SimWire()
    wire.add("ens1f0np0", SimPort(supported=False, module=None))
    wire.add("ens2f0np0", SimPort(supported=False, module=None))
    assert _check(host, wire, tmp_path).healthy


def test_lanes_the_host_keeps_dark_add_nothing(tmp_path: Path) -> None:
    """A CMIS module whose lanes 3-4 the host deactivated (0 W): a healthy node, not a drain; the
    same 0 W on an activated lane is a warning."""
    host = SimHost.build(tmp_path / "sys", roce=2)
    wire = SimWire()
    for netdev in ("ens1f0np0", "ens2f0np0"):
        wire.add(netdev, SimPort(module=SimModule(memory_map="cmis")))
    wire.dark_lanes("ens1f0np0", [3, 4])
    report = _check(host, wire, tmp_path)
    assert report.healthy, format_report(report)
    wire.fade_rx_power("ens2f0np0", lane=3, watts=0.0)
    problems = _check(host, wire, tmp_path).problems
    assert [(p.netdev, p.code, p.severity) for p in problems] == [("ens2f0np0", "optic_rx_power_alarm_low", "warning")]


def test_an_optic_below_its_warning_and_alarm_thresholds(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=2)
    wire = _wire("ens1f0np0", "ens2f0np0")
    wire.fade_rx_power("ens1f0np0", lane=2, watts=0.1e-3)  # low warning 0.1445 mW, low alarm 0.0724 mW
    wire.fade_rx_power("ens2f0np0", lane=1, watts=0.05e-3)
    report = _check(host, wire, tmp_path)
    by_where = {(p.where, p.code): p for p in report.problems}
    low = by_where[("mlx5_0 port 1 (ens1f0np0)", "optic_rx_power_warning_low")]
    assert low.severity == "info"
    assert "Rx power lane 2 0.100 mW is below its low warning threshold 0.144 mW" in low.what, low.what
    alarm = by_where[("mlx5_1 port 1 (ens2f0np0)", "optic_rx_power_alarm_low")]
    assert alarm.severity == "warning" and (alarm.device, alarm.port, alarm.netdev) == ("mlx5_1", 1, "ens2f0np0")
    assert len(report.problems) == 2
    text = format_report(report)
    assert "[WARNING] mlx5_1 port 1 (ens2f0np0): module Rx power lane 1 0.050 mW is below its low alarm" in text


def test_only_a_warning_level_optic_passes_a_prologue(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=1)
    wire = _wire("ens1f0np0")
    wire.fade_rx_power("ens1f0np0", lane=2, watts=0.1e-3)
    report = _check(host, wire, tmp_path)
    assert [p.severity for p in report.problems] == ["info"]
    assert not report.failed("warning") and report.failed("info")


def test_a_down_roce_port_says_why(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=2)
    host.set_port_up("mlx5_0", False)
    host.set_port_up("mlx5_1", False)
    wire = _wire("ens1f0np0", "ens2f0np0")
    wire.link_down("ens1f0np0")  # 5: cable issue
    wire.link_down("ens2f0np0", ext_state=None)  # the driver does not say
    report = _check(host, wire, tmp_path)
    down = {p.netdev: p for p in report.problems if p.code == "port_down"}
    assert set(down) == {"ens1f0np0", "ens2f0np0"}, format_report(report)
    assert down["ens1f0np0"].what.endswith("; link down: cable_issue (ethtool extended link state)")
    assert "link down:" not in down["ens2f0np0"].what
