"""The wire reads (issue 32) against a real driver: QEMU's e1000e, beside the real `ethtool`.

The boot gives the VM an emulated Intel 82574L (vm.NIC_SCENARIOS) behind user-mode networking,
which gives it carrier; the e1000e driver's ethtool operations are the real kernel's.

1. Link state: LINKSTATE_GET (ours) beside `ethtool NIC`'s "Link detected", up and then down.
2. Statistics under traffic (ping to the user network's gateway): rounds of `ethtool -S`, our
   GSTATS read (`wire.read_gstats`), `ethtool -S` again. e1000e folds its clear-on-read hardware
   registers into running totals on every read, so ours must lie between the two reads.
3. Pause: PAUSE_GET with statistics (ours) beside `ethtool -I -a`, at the defaults and after
   `ethtool -A` changed them.
4. FEC and module memory on e1000e, and every wire source on the netdevs under rxe (a veth, a tap):
   what our reader makes of them, beside what `ethtool` says, and the error counters.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from typing import Any

from rnic_exporter.sources.ethtool_netlink import EthtoolNetlink
from rnic_exporter.sources.wire import WireReader, WireSettings, read_gstats
from tests.kernel.lab import SYS_IB, SYS_NET, VA, Lab, LabError, measured, read_attr, timed

NIC_ADDR, GATEWAY = "10.0.2.15/24", "10.0.2.2"  # QEMU user networking's defaults
ROUNDS = 4


def as_json(value: object) -> Any:
    """A typed outcome as JSON, its type named (LinkState, Unsupported, ReadFailure, ...)."""
    if hasattr(value, "__dataclass_fields__"):
        fields = {k: as_json(getattr(value, k)) for k in value.__dataclass_fields__}
        return {"type": type(value).__name__, **fields}
    if isinstance(value, Mapping):
        return {str(k): as_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_json(v) for v in value]
    return value


def e1000e_netdev(lab: Lab) -> str:
    """The netdev the e1000e driver made (its kernel name; nothing renames it in the guest)."""
    lab.sh("modprobe e1000e")

    def found() -> str | None:
        for name in sorted(os.listdir(SYS_NET)):
            driver = SYS_NET / name / "device/driver"
            if driver.exists() and os.path.basename(os.path.realpath(driver)) == "e1000e":
                return name
        return None

    lab.wait_until(found, 30, "a netdev of the e1000e driver (is the VM's e1000e device there?)")
    name = found()
    assert name is not None
    return name


def run(lab: Lab) -> dict[str, Any]:
    result: dict[str, Any] = {"kernel": os.uname().release}
    return measured(result, lambda: _run(lab, result))


def _ethtool(lab: Lab, args: str) -> dict[str, Any]:
    proc = lab.sh(f"ethtool {args}", check=False)
    return {"code": proc.returncode, "out": proc.stdout, "err": proc.stderr}


def _run(lab: Lab, result: dict[str, Any]) -> None:
    times: dict[str, float] = {}
    result["times"] = times
    with timed(times, "e1000e_netdev"):
        nic = e1000e_netdev(lab)
    result["nic"] = nic
    result["driver"] = _ethtool(lab, f"-i {nic}")
    try:
        lab.sh(f"ip link set {nic} up && ip addr add {NIC_ADDR} dev {nic}")
        times["carrier"] = round(
            lab.wait_until(lambda: read_attr(SYS_NET / nic / "carrier").strip() == "1", 60, f"{nic} carrier"), 3
        )
        with EthtoolNetlink() as et:
            result["link_up"] = {"ours": as_json(et.link_state(nic)), "ethtool": _ethtool(lab, nic)}
            with timed(times, "stats"):
                result["stats"] = _stats_under_traffic(lab, nic)
            with timed(times, "pause"):
                result["pause"] = _pause(lab, et, nic)
            result["e1000e_unsupported"] = {
                "fec": {"ours": as_json(et.fec(nic)), "ethtool": _ethtool(lab, f"--show-fec {nic}")},
                "module": {"ours": as_json(et.module(nic).result), "ethtool": _ethtool(lab, f"-m {nic}")},
            }
            result["errors_after_e1000e"] = dict(et.errors)
            with timed(times, "under_rxe"):
                result["under_rxe"] = _under_rxe(lab, et, nic)
            lab.sh(f"ip link set {nic} down")
            # carrier itself reads EINVAL on a netdev that is down
            lab.wait_until(lambda: read_attr(SYS_NET / nic / "operstate").strip() == "down", 30, f"{nic} down")
            result["link_down"] = {"ours": as_json(et.link_state(nic)), "ethtool": _ethtool(lab, nic)}
            result["requests"] = dict(et.requests)
            result["errors"] = dict(et.errors)
    finally:
        lab.sh(f"ip addr flush dev {nic}; ip link set {nic} down", check=False)


def _stats_under_traffic(lab: Lab, nic: str) -> dict[str, Any]:
    log = open(lab.out / "ping.log", "w")  # noqa: SIM115 (lives as long as the process)
    ping = subprocess.Popen(
        ["busybox", "ping", "-c", "2000", "-i", "0.02", GATEWAY], stdout=log, stderr=subprocess.STDOUT
    )
    rounds: list[dict[str, Any]] = []
    try:
        first = _ethtool(lab, f"-S {nic}")
        lab.wait_until(
            lambda: _ethtool(lab, f"-S {nic}")["out"] != first["out"], 30, f"{nic} statistics moving (ping)", 0.2
        )
        for _ in range(ROUNDS):
            before = _ethtool(lab, f"-S {nic}")
            ours = read_gstats(nic)
            after = _ethtool(lab, f"-S {nic}")
            rounds.append({"before": before, "ours": dict(ours), "after": after})
    finally:
        ping.kill()
        ping.wait()
        log.close()
    return {"first": first, "rounds": rounds, "ping_log": (lab.out / "ping.log").read_text()[-1500:]}


def _pause(lab: Lab, et: EthtoolNetlink, nic: str) -> dict[str, Any]:
    out: dict[str, Any] = {"defaults": {"ours": as_json(et.pause(nic)), "ethtool": _ethtool(lab, f"-I -a {nic}")}}
    changed = lab.sh(f"ethtool -A {nic} autoneg off rx on tx off", check=False)
    out["set"] = {"code": changed.returncode, "out": changed.stdout + changed.stderr}
    out["changed"] = {"ours": as_json(et.pause(nic)), "ethtool": _ethtool(lab, f"-I -a {nic}")}
    return out


def _under_rxe(lab: Lab, et: EthtoolNetlink, nic: str) -> dict[str, Any]:
    """The netdevs rxe runs on (a veth, a tap): every wire source through the daemon's reader, beside
    `ethtool`; then a second pass with every interval due again, which must not ask what was unsupported."""
    lab.modprobe_rxe()
    lab.sh(f"ip link add {VA} type veth peer name vb && ip link set {VA} up && ip link set vb up")
    lab.made.append(f"link {VA}")
    lab.rdma_link_add("rxe0", VA)
    lab.rxe_tap("tap0", "rxe2", 25000)
    netdevs = [read_attr(SYS_IB / dev / "parent").strip() for dev in ("rxe0", "rxe2")]
    if netdevs != [VA, "tap0"]:
        raise LabError(f"rxe's parent netdevs are {netdevs}")
    now = [0.0]
    reader = WireReader(et, WireSettings(), clock=lambda: now[0])
    before = dict(et.requests)
    wire = reader.poll([nic, *netdevs])
    first = dict(reader.requests)
    now[0] += 3600.0  # every interval due again
    reader.poll([nic, *netdevs])
    out: dict[str, Any] = {
        "netdevs": netdevs,
        "wire": {name: as_json(w) for name, w in wire.items()},
        "requests_before": before,
        "requests_first_poll": first,
        "requests_second_poll": dict(reader.requests),
        "gstats_errors": reader.gstats_errors,
        "ethtool": {
            name: {
                "link": _ethtool(lab, name),
                "fec": _ethtool(lab, f"--show-fec {name}"),
                "pause": _ethtool(lab, f"-a {name}"),
                "module": _ethtool(lab, f"-m {name}"),
                "stats": _ethtool(lab, f"-S {name}"),
            }
            for name in netdevs
        },
    }
    return out
