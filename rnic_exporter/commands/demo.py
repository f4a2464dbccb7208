"""`rnic-exporter demo`: the daemon over a simulated host, with the failures played on a timer."""

from __future__ import annotations

import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rnic_exporter.config.file import ConsumerSettings, reader_settings
from rnic_exporter.daemon import agent, serve
from rnic_exporter.sim import SimHost, SimProcfs
from rnic_exporter.sim.wire import SimEthtool, SimWire
from rnic_exporter.sources.address_risks import HostPaths
from rnic_exporter.sources.wire import WireReader, WireSettings


@dataclass(frozen=True)
class Step:
    title: str
    act: Callable[[SimHost], str]  # does the change, returns what to look for


# The fake verbs users the demo attaches (sim/procfs.py): who the GID-shift step hits.
DEMO_JOB = "4242"
DEMO_POD = ("team-a", "trainer-0", "6c1f3a52-8d0e-4b7e-9a43-1b2c3d4e5f60")


def _gid_shift(host: SimHost) -> str:
    old, new = host.gid_shift("mlx5_1")
    return (
        f"mlx5_1: Slurm job {DEMO_JOB} holds GID {old}; the port flapped and NetworkManager dropped and "
        f"restored 10.0.1.1, whose RoCE v2 GID moved {old} -> {new}. The event names the job "
        f'(consumers="... slurm job {DEMO_JOB} step 0"). Look at rnic_nccl_gid_index, rnic_gid_table_hash, '
        f'rnic_gid_entry_info{{device="mlx5_1"}} and rnic_device_workload_info{{device="mlx5_1"}}.'
    )


# The cable of mlx5_2 going bad, per second: symbol errors at BER 1.25e-11 on 400 Gb/s (12x the IBTA
# limit), a retrain a minute, and the RoCE retransmissions of a lossy link (out_of_sequence at 2e-4 of
# the ~12M packets a second the demo's half-busy port carries, over the 1e-4 limit; the others below it).
CABLE_GOING_BAD = {
    "symbol_error": 5.0,
    "link_error_recovery": 1 / 60,
    "out_of_sequence": 2500.0,
    "packet_seq_err": 1200.0,
    "roce_adp_retrans": 300.0,
}
# The cable degrades this many steps before the link renegotiates (150 s at the default 20 s steps): the
# degrading alerts (for: 5m) go pending well before the speed ones, so a Prometheus watching the demo sees
# them fire first. In steps, so a fast demo (tests: 1 s steps) stays fast.
CABLE_LEAD_STEPS = 7.5


def _cable_going_bad(host: SimHost) -> str:
    host.degrade_link("mlx5_2", CABLE_GOING_BAD)
    return (
        "mlx5_2's cable is going bad: symbol errors (5/s, BER 1.25e-11 > IBTA 1e-12), a link retrain a minute, "
        "RoCE retransmissions (out_of_sequence, packet_seq_err, roce_adp_retrans). In a few minutes it "
        'renegotiates to a lower speed. Look at rnic_port_pma_total{device="mlx5_2"} and '
        f"rnic_port_hw_stat_total; RnicLinkSymbolErrors fires before RnicLinkBelowRated. Run {_HINTS['check']}"
    )


# The demo host's simulated wire (modules, FEC, pause of its RoCE netdevs), as _HINTS a module-level
# part of the story: run_demo attaches it to the host it builds (`attach_wire`).
WIRE = SimWire()
FADING = ("mlx5_2", "ens3f0np0", 2)  # the device whose optic fades, then whose link renegotiates; lane
HEALTHY_RX_POWER_W = 0.9e-3
FADED_RX_POWER_W = 0.1e-3  # under the simulated module's low warning (0.1445 mW), above its low alarm


def attach_wire(host: SimHost) -> SimWire:
    """`WIRE` with a module, FEC and pause on each RoCE netdev of `host` (a fresh state)."""
    WIRE.ports.clear()
    for dev in host.devices.values():
        if dev.roce and dev.netdev:
            WIRE.add(dev.netdev)
    return WIRE


def wire_reader(wire: SimWire, step_seconds: float) -> WireReader:
    """The demo's wire reader: the module read several times a step (a real one: every minute)."""
    module = max(1.0, step_seconds / 4)
    settings = WireSettings(
        module_interval=module,
        min_module_interval=module,
        fec_interval=module,
        pause_interval=module,
        link_state_interval=1.0,
        link_state_up_interval=1.0,
        gstats_interval=module,
    )
    return WireReader(SimEthtool(wire), settings, gstats=wire.gstats)


def _optic_fade(host: SimHost) -> str:
    device, netdev, lane = FADING
    if netdev not in WIRE.ports:
        WIRE.add(netdev)
    WIRE.fade_rx_power(netdev, lane=lane, watts=FADED_RX_POWER_W)
    return (
        f"{device}'s optic ({netdev}) receives {FADED_RX_POWER_W * 1e3:.1f} mW on lane {lane}, under its own "
        "low warning threshold, and the link still runs at full speed: the warning before the renegotiation. "
        f'Look at rnic_module_rx_power_watts{{device="{device}"}} and rnic_module_monitor_level.'
    )


def _speed_drop(host: SimHost) -> str:
    host.set_speed("mlx5_2", 200)
    return (
        "mlx5_2 renegotiated 400G -> 200G (a tired cable). "
        "Look at rnic_port_active_rate_bytes_per_second and rnic_netdev_speed_bytes_per_second."
    )


def _pcie_downtrain(host: SimHost) -> str:
    host.set_pcie("mlx5_3", 16.0, 8)
    return (
        "mlx5_3's PCIe link trained at Gen4 x8 instead of Gen5 x16. "
        "Look at rnic_pcie_link_width_lanes and rnic_pcie_link_speed_transfers_per_second."
    )


def _nic_gone(host: SimHost) -> str:
    host.remove_device("mlx5_4")
    return "mlx5_4 fell off the PCIe bus. Look at rnic_devices and rnic_device_info."


IPV6_ADDRESS = "fd00:0:0:0::1"  # what mlx5_0 keeps when it loses its IPv4 address (and keeps after)


def _ipv6_only(host: SimHost) -> str:
    # The netdev *kept* its IPv6 address: it carried it before it lost 10.0.0.1, so its GIDs sit above
    # 10.0.0.1's and the slots 10.0.0.1 leaves stay free. Added after the loss (SimHost.ipv6_only's
    # order) they would take those slots, 10.0.0.1 would come back at a higher index at the heal, and
    # the daemon would rightly raise a critical rnic.gid.address_moved right after "Everything
    # healed". Only the first time: the heal keeps the IPv6 address, as a real host would.
    if IPV6_ADDRESS not in host.device("mlx5_0").addresses:
        host.add_address("mlx5_0", IPV6_ADDRESS)
    host.ipv6_only("mlx5_0", ())
    return (
        "mlx5_0's netdev lost 10.0.0.1 and kept only IPv6 addresses: NCCL (NCCL_IB_ADDR_FAMILY=AF_INET) "
        'keeps the link-local GID at index 0. Look at rnic_nccl_gid_usable{device="mlx5_0"} and run '
        f"{_HINTS['check']}"
    )


def _heal(host: SimHost) -> str:
    # The IPv4 address comes back; the IPv6 one stays (removing it would be a new "address lost").
    host.add_address("mlx5_0", "10.0.0.1")
    host.restore_device("mlx5_4")
    host.set_speed("mlx5_2", 400)
    host.degrade_link("mlx5_2", {})  # the cable replaced
    host.set_pcie("mlx5_3", 32.0, 16)
    host.release_gids("mlx5_1")
    _device, netdev, lane = FADING
    if netdev in WIRE.ports:
        WIRE.fade_rx_power(netdev, lane=lane, watts=HEALTHY_RX_POWER_W)
    return (
        "mlx5_0 has 10.0.0.1 back, mlx5_4 is back, mlx5_2 has a new cable and optic and runs 400G, mlx5_3 Gen5 "
        "x16, the job on mlx5_1 ended. The cycle starts again."
    )


# The longest `for:` of the alerts the failures raise (RnicLinkBelowRated, RnicPcieLinkDowntrained,
# RnicDeviceDisappeared: 5m) plus a scrape and an evaluation: the failures stay that long before the
# heal, so a Prometheus watching the demo sees every alert fire.
HOLD_BEFORE_HEAL_S = 6 * 60.0


def wait_before(step: int, step_seconds: float) -> float:
    """Seconds between step `step - 1` and step `step` (0-based, cycling)."""
    act = STEPS[step % len(STEPS)].act
    if act is _heal:
        return max(step_seconds, HOLD_BEFORE_HEAL_S)
    return step_seconds * CABLE_LEAD_STEPS if act is _speed_drop else step_seconds


# Filled in by run_demo: the commands, as they run on this machine, against the demo's tree.
_HINTS = {"check": "rnic-exporter check --path.sysfs <the tree above> --state.dir <its state> --no-netlink"}

STEPS = (
    Step("GID index shift (incident 1)", _gid_shift),
    Step("Optic fading (issue 32, before the speed drops)", _optic_fade),
    Step("A cable going bad (issue 31)", _cable_going_bad),
    Step("Speed below rated (incident 2)", _speed_drop),
    Step("PCIe downtrain (incident 2)", _pcie_downtrain),
    Step("NIC disappeared (incident 2)", _nic_gone),
    Step("NCCL would use a link-local GID", _ipv6_only),
    Step("Everything healed", _heal),
)


def run_demo(
    *, devices: int, step_seconds: float, listen: tuple[str, ...], poll_interval: float, echo: Callable[[str], None]
) -> int:
    stop = threading.Event()
    # Until the daemon installs its own handlers, SIGTERM/SIGINT (systemd, Ctrl-C, a test harness in
    # the first seconds) only set `stop`: the default action would kill the process (143) before the
    # `finally` below removes the tree from /tmp.
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    workdir = Path(tempfile.mkdtemp(prefix="rnic-exporter-demo-"))
    try:
        ib = max(1, devices // 4)
        host = SimHost.build(workdir / "sys", roce=devices - ib, infiniband=ib)
        # A port whose PMA does not answer (as on an iWARP card or a restricted function): its counters
        # are listed once in rnic_attribute_unsupported_info, never alerted on.
        host.without_pma(f"mlx5_{devices - ib - 1}")
        echo(
            f"Simulated host with {devices} RNICs ({devices - ib} RoCE, {ib} InfiniBand) in {workdir / 'sys'}; "
            f"mlx5_{devices - ib - 1}'s PMA does not answer (counters N/A: unsupported, not broken)"
        )
        users = SimProcfs(host, workdir / "proc", workdir / "root")
        users.slurm_job(DEMO_JOB, ["mlx5_1"])
        users.pod(*DEMO_POD, devices=["mlx5_1", "mlx5_2"])
        echo(f"Slurm job {DEMO_JOB} uses mlx5_1; pod {DEMO_POD[0]}/{DEMO_POD[1]} uses mlx5_1 and mlx5_2")
        prog = "rnic-exporter" if shutil.which("rnic-exporter") else f"{sys.executable} -m rnic_exporter"
        _HINTS["check"] = f"{prog} check --path.sysfs {workdir / 'sys'} --state.dir {workdir / 'state'} --no-netlink"
        echo(f"Try: {prog} show --path.sysfs {workdir / 'sys'}")
        echo(f"Metrics: http://{listen[0].lstrip(':') if listen[0].startswith(':') else listen[0]}/metrics")
        if stop.is_set():  # stopped while the tree was built: nothing to serve
            return 0
        player = threading.Thread(
            target=_play, args=(host, step_seconds, poll_interval, stop, echo), name="demo-player", daemon=True
        )
        player.start()
        config = agent.ServeConfig(
            sysfs=workdir / "sys",
            listen=listen,
            poll_interval_s=poll_interval,
            reader=reader_settings(),
            state_dir=workdir / "state",
            host_paths=HostPaths(procfs=workdir / "proc", rootfs=workdir / "root"),
            consumers=ConsumerSettings(enabled=True, interval_s=max(1.0, step_seconds / 4)),
        )
        # the real scan, over the fake procfs; the simulated wire under the RoCE netdevs
        return serve.run(config, stop=stop, wire=wire_reader(attach_wire(host), step_seconds))
    finally:
        stop.set()
        shutil.rmtree(workdir, ignore_errors=True)
        echo(f"Removed {workdir}")
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _play(
    host: SimHost, step_seconds: float, poll_interval: float, stop: threading.Event, echo: Callable[[str], None]
) -> None:
    step = 0
    elapsed = 0.0
    while not stop.wait(poll_interval):
        host.add_traffic(poll_interval)
        elapsed += poll_interval
        if elapsed >= wait_before(step, step_seconds):
            elapsed = 0.0
            current = STEPS[step % len(STEPS)]
            echo(f"\n== step {step + 1}: {current.title}\n{current.act(host)}")
            step += 1
