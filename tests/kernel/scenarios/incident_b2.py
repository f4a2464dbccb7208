"""Incident 2 (NIC degradation) on the real kernel, part 2: a device deleted and re-added under the
same name, renamed (`rdma dev set rxe0 name rxe9`), its netdev renamed (va -> vz), its MTU changed;
then the RDMA subsystem in exclusive netns mode with a device in netns b. One `serve` (1 s polls, a
state dir) watches from the root namespace throughout; `check --json` reads the same state dir.

Leaves the kernel as it found it even on failure: vz renamed back to va's name is not needed (it is
deleted), and the netns mode is set back to shared (the other scenarios expect it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

from tests.kernel.lab import NETNS, SYS_IB, SYS_NET, VA, VA_ADDR, VB, Lab, ipv4_gid, measured, read_attr, sample
from tests.kernel.scenarios.incident_b1 import Watch, attr, kernel_port

VZ = "vz"


def netns_python(lab: Lab, netns: str, *args: str) -> dict[str, Any]:
    """`python -m rnic_exporter ARGS` as a process inside `netns` (ip netns exec remounts /sys there)."""
    argv = ["ip", "netns", "exec", netns, sys.executable]
    if sys.flags.no_site:
        argv.append("-S")
    argv += ["-m", "rnic_exporter", *args]
    start = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    return {
        "code": proc.returncode,
        "stdout": proc.stdout[-20000:],
        "stderr": proc.stderr[-3000:],
        "seconds": round(time.monotonic() - start, 1),
    }


def ib_devices(lab: Lab, netns: str | None = None) -> list[str]:
    return sorted(lab.sh("ls /sys/class/infiniband 2>/dev/null || true", netns=netns).stdout.split())


def run(lab: Lab) -> dict[str, Any]:
    steps: dict[str, Any] = {}
    res: dict[str, Any] = {"steps": steps}

    def body() -> None:
        try:
            _run(lab, steps, res)
        finally:
            # The other scenarios need the shared mode: only settable with no netns but init_net.
            lab.sh("ip netns delete b 2>/dev/null; ip link delete vz 2>/dev/null; true", check=False)
            res["netns_mode_restore"] = lab.sh("rdma system set netns shared", check=False).returncode
            res["netns_mode_after"] = lab.sh("rdma system show", check=False).stdout.strip()

    return measured(res, body)


def _run(lab: Lab, steps: dict[str, Any], res: dict[str, Any]) -> None:
    lab.rxe_pair()
    w = Watch(lab, "b2")
    devs = ("rxe0", "rxe1", "rxe9")

    def up(dev: str) -> Any:
        return lambda s: sample(s, "rnic_port_up", device=dev, port="1") == 1.0

    w.until("rxe0 and rxe1 up in a scrape", lambda s: up("rxe0")(s) and up("rxe1")(s))
    steps["start"] = {"guid": attr("rxe0/node_guid"), **w.record(devs, checks=False)}

    # 5. deleted and re-added under the same name
    lab.sh("rdma link delete rxe0")
    took = w.until("rxe0 absent", lambda s: sample(s, "rnic_device_present", device="rxe0", pci_address="") == 0.0)
    steps["deleted"] = {"scrape_s": took, **w.record(devs, checks=False)}
    lab.rdma_link_add("rxe0", VA)
    lab.wait_until(lambda: lab.gid_of("rxe0", ipv4_gid(VA_ADDR)) is not None, 30, "rxe0's IPv4 GID")
    took = w.until(
        "rxe0 present and up again",
        lambda s: sample(s, "rnic_device_present", device="rxe0", pci_address="") == 1.0 and up("rxe0")(s),
    )
    steps["readded"] = {"scrape_s": took, "guid": attr("rxe0/node_guid"), **w.record(devs)}

    # 6. renamed
    lab.sh("rdma dev set rxe0 name rxe9")
    took = w.until("rxe9 up in a scrape", up("rxe9"))
    steps["renamed"] = {
        "scrape_s": took,
        "class_infiniband": ib_devices(lab),
        "guid": attr("rxe9/node_guid"),
        **w.record(devs),
    }

    # 7. its netdev renamed (a netdev can only be renamed while down)
    lab.sh(f"ip link set {VA} down && ip link set {VA} name {VZ} && ip link set {VZ} up")
    took = w.until(
        "rxe9's port on vz and up in a scrape",
        lambda s: sample(s, "rnic_port_info", device="rxe9", port="1", netdev=VZ) is not None and up("rxe9")(s),
    )
    steps["netdev_renamed"] = {
        "scrape_s": took,
        "parent": attr("rxe9/parent"),
        "ndev_of_gid1": attr("rxe9/ports/1/gid_attrs/ndevs/1"),
        **w.record(devs),
    }

    # 8. MTU 1200 on the netdev
    ports_files = sorted(os.listdir(SYS_IB / "rxe9/ports/1"))
    lab.sh(f"ip link set {VZ} mtu 1200")
    took = w.until(
        "vz's MTU 1200 in a scrape", lambda s: sample(s, "rnic_netdev_mtu_bytes", device="rxe9", netdev=VZ) == 1200.0
    )
    devinfo = lab.sh("ibv_devinfo -d rxe9", check=False)
    steps["mtu"] = {
        "scrape_s": took,
        "port_files": ports_files,
        "netdev_mtu": read_attr(SYS_NET / VZ / "mtu").strip(),
        "ibv_devinfo": devinfo.stdout + devinfo.stderr,
        "kernel": kernel_port("rxe9"),
        **w.record(devs, checks=False),
    }

    # 9. exclusive netns mode: settable only while no netns but init_net exists
    lab.sh(f"ip netns delete {NETNS}")
    took = w.until("rxe1 gone with vb's netns", lambda s: sample(s, "rnic_port_up", device="rxe1", port="1") is None)
    before = lab.sh("rdma system show", check=False).stdout.strip()
    mode = lab.sh("rdma system set netns exclusive", check=False)
    excl: dict[str, Any] = {
        "rxe1_gone_s": took,
        "mode_before": before,
        "set_code": mode.returncode,
        "set_out": mode.stdout + mode.stderr,
        "mode_after": lab.sh("rdma system show", check=False).stdout.strip(),
    }
    steps["exclusive"] = excl
    lab.sh(f"ip netns add {NETNS}")
    lab.sh(f"ip link add {VB} type veth peer name vb2 && ip link set {VB} netns {NETNS}")
    lab.sh(f"ip -n {NETNS} link set {VB} up && ip -n {NETNS} link set lo up && ip link set vb2 up")
    lab.sh(f"ip -n {NETNS} addr add 10.77.5.2/24 dev {VB}")
    lab.sh(f"rdma link add rxe1 type rxe netdev {VB}", netns=NETNS)
    lab.wait_until(
        lambda: "rxe1" in ib_devices(lab, NETNS) + ib_devices(lab), 30, "rxe1 in netns b's or the root's sysfs"
    )
    excl["created_in_b"] = {
        "root_sysfs": ib_devices(lab),
        "b_sysfs": ib_devices(lab, NETNS),
        "root_rdma_dev": lab.sh("rdma dev show", check=False).stdout,
        "b_rdma_dev": lab.sh("rdma dev show", netns=NETNS, check=False).stdout,
    }
    w.settle(3)
    excl["created_in_b"]["root_exporter"] = w.record(devs)
    if "rxe1" in excl["created_in_b"]["root_sysfs"]:
        # created in b but registered in init_net: try to move it explicitly
        mv = lab.sh(f"rdma dev set rxe1 netns {NETNS}", check=False)
        excl["moved"] = {"code": mv.returncode, "out": mv.stdout + mv.stderr}
        if mv.returncode == 0:
            lab.wait_until(lambda: "rxe1" not in ib_devices(lab), 30, "rxe1 left the root namespace")
            w.settle(3)
            excl["moved"].update({"root_sysfs": ib_devices(lab), "b_sysfs": ib_devices(lab, NETNS)})
            excl["moved"]["root_exporter"] = w.record(devs)
    excl["b_show"] = netns_python(lab, NETNS, "show", "--json")
    excl["b_check"] = netns_python(lab, NETNS, "check", "--json", "--no-netlink")
    res["serve_exit"] = w.serve.stop()
    res["serve_log"] = w.serve.log_text()[-30000:]
