"""Incident 2 (NIC degradation) on the real kernel, part 1: a speed drop, a carrier loss, a device
deleted, the driver unloaded, with one `serve` (1 s polls, a state dir) watching and `check --json`
(reading the same state dir) after each step.

rxe0 on va (root netns) <-> rxe1 on vb (netns b); rxe2 on tap0 (held open: carrier) at 100G, then
25G, then 100G again; vb down/up (rxe0's link partner); `rdma link delete rxe0`; `modprobe -r
rdma_rxe` with rxe1 and rxe2 still registered. Each step records the kernel's files, the scrape
lines of the devices and `check`'s problems; the host test judges them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from tests.kernel.lab import NETNS, SYS_IB, VB, Lab, Serve, measured, read_attr, sample

DEVICES = ("rxe0", "rxe1", "rxe2", "rxe3")


def attr(path: str) -> str:
    try:
        return read_attr(SYS_IB / path).strip()
    except OSError as exc:
        return f"errno {exc.errno}"


def device_lines(scrape: str, devices: tuple[str, ...] = DEVICES) -> list[str]:
    """The scrape's sample lines of these devices (hw counters left out: they are not the point)."""
    return [
        ln
        for ln in scrape.splitlines()
        if not ln.startswith("#") and "hw_stat" not in ln and any(f'device="{d}"' in ln for d in devices)
    ]


class Watch:
    """The scenario's one serve and the state dir `check` reads."""

    def __init__(self, lab: Lab, tag: str) -> None:
        self.lab = lab
        self.state_dir = lab.out / f"state-{tag}"
        self.state_dir.mkdir(exist_ok=True)
        self.serve: Serve = lab.serve(
            "--path.sysfs", "/sys", "--poll.interval", "1s", "--state.dir", str(self.state_dir)
        )

    def scrape(self) -> str:
        return self.serve.scrape()

    def value(self, name: str, **labels: str) -> float | None:
        return sample(self.scrape(), name, **labels)

    def polls(self) -> float:
        return self.value("rnic_exporter_polls_total") or 0.0

    def until(self, what: str, pred: Any, deadline_s: float = 60) -> float:
        """Until a scrape satisfies `pred(scrape)`; then two more polls, so a settled picture is recorded."""
        took = self.lab.wait_until(lambda: pred(self.scrape()), deadline_s, what, poll_s=0.2)
        self.settle()
        return round(took, 2)

    def settle(self, polls: int = 2) -> None:
        target = self.polls() + polls
        self.lab.wait_until(lambda: self.polls() >= target, 30, f"{polls} more polls", poll_s=0.2)

    def check(self, *args: str) -> dict[str, Any]:
        r = self.lab.cli_result("check", "--json", "--no-netlink", "--state.dir", str(self.state_dir), *args)
        out: dict[str, Any] = {"code": r.code, "seconds": round(r.seconds, 2), "stderr": r.stderr[-2000:]}
        try:
            data = json.loads(r.stdout)
            out["problems"], out["notes"], out["devices"] = data["problems"], data["notes"], data["devices"]
        except ValueError:
            out["stdout"] = r.stdout[-4000:]
        return out

    def show(self) -> dict[str, Any]:
        code, out, err = self.lab.cli("show", "--json")
        if code != 0:
            return {"code": code, "stderr": err[-2000:]}
        data = json.loads(out)
        return {
            "code": code,
            "devices": {
                d["name"]: [
                    {
                        "port": p["port"],
                        "state": p["state"],
                        "phys_state": p["phys_state"],
                        "rate": p["rate"],
                        "netdevs": [
                            {k: n.get(k) for k in ("name", "mtu", "speed_mbps", "operstate", "carrier")}
                            for n in p["netdevs"]
                        ],
                    }
                    for p in d["ports"]
                ]
                for d in data["devices"]
            },
        }

    def record(self, devices: tuple[str, ...] = DEVICES, checks: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"scrape": device_lines(self.scrape(), devices), "show": self.show()}
        out["rnic_devices"] = self.value("rnic_devices")
        if checks:
            out["check"] = self.check()
        return out


def state_is(dev: str, state: str) -> Callable[[], bool]:
    return lambda: attr(f"{dev}/ports/1/state") == state


def kernel_port(dev: str) -> dict[str, str]:
    return {f: attr(f"{dev}/ports/1/{f}") for f in ("state", "phys_state", "rate")}


def run(lab: Lab) -> dict[str, Any]:
    steps: dict[str, Any] = {}
    res: dict[str, Any] = {"steps": steps}
    return measured(res, lambda: _run(lab, steps, res))


def _run(lab: Lab, steps: dict[str, Any], res: dict[str, Any]) -> None:
    lab.rxe_pair()
    lab.rxe_tap("tap0", "rxe2", 100000)
    # a healthy 50G netdev from the start: rxe rates it 100 Gb/sec (4X EDR), a bucket above its speed
    lab.rxe_tap("tap1", "rxe3", 50000)
    for dev in ("rxe2", "rxe3"):
        lab.wait_until(state_is(dev, "4: ACTIVE"), 30, f"{dev} ACTIVE")
    w = Watch(lab, "b1")

    def up(dev: str) -> Any:
        return lambda s: sample(s, "rnic_port_up", device=dev, port="1") == 1.0

    # 0. all three up, rxe2 at 100G (the baseline it learns)
    w.until("all ports up in a scrape", lambda s: all(up(d)(s) for d in DEVICES))
    steps["start"] = {"kernel": {d: kernel_port(d) for d in DEVICES}, **w.record()}

    # 1. speed drop 100G -> 25G on rxe2's netdev, then back
    lab.renegotiate("tap0", 25000)
    took = w.until(
        "rxe2's rate at 25G in a scrape",
        lambda s: sample(s, "rnic_port_active_rate_bytes_per_second", device="rxe2", port="1") == 25e9 / 8,
    )
    steps["speed_25g"] = {
        "scrape_s": took,
        "kernel": kernel_port("rxe2"),
        "netdev_speed": read_attr("/sys/class/net/tap0/speed").strip(),
        "ethtool": lab.sh("ethtool tap0", check=False).stdout,
        **w.record(("rxe2",)),
    }
    lab.renegotiate("tap0", 100000)
    took = w.until(
        "rxe2's rate back at 100G in a scrape",
        lambda s: sample(s, "rnic_port_active_rate_bytes_per_second", device="rxe2", port="1") == 100e9 / 8,
    )
    steps["speed_100g_again"] = {"scrape_s": took, "kernel": kernel_port("rxe2"), **w.record(("rxe2",))}

    # 2. carrier loss: rxe0's link partner (vb) down, then up
    lab.sh(f"ip link set {VB} down", netns=NETNS)
    took = w.until("rxe0 down in a scrape", lambda s: sample(s, "rnic_port_up", device="rxe0", port="1") == 0.0)
    steps["carrier_lost"] = {"scrape_s": took, "kernel": kernel_port("rxe0"), **w.record(("rxe0",))}
    lab.sh(f"ip link set {VB} up", netns=NETNS)
    took = w.until("rxe0 up again in a scrape", up("rxe0"))
    steps["carrier_back"] = {"scrape_s": took, "kernel": kernel_port("rxe0"), **w.record(("rxe0",))}

    # 3. rdma link delete rxe0
    lab.sh("rdma link delete rxe0")
    took = w.until(
        "rxe0 absent in a scrape", lambda s: sample(s, "rnic_device_present", device="rxe0", pci_address="") == 0.0
    )
    steps["deleted"] = {
        "scrape_s": took,
        "kernel_present": (SYS_IB / "rxe0").exists(),
        "rdma_link": lab.sh("rdma -j link show", check=False).stdout,
        **w.record(),
    }

    # 4. modprobe -r rdma_rxe with rxe1 and rxe2 registered
    mod = lab.sh("modprobe -r rdma_rxe", check=False)
    steps["unload"] = {"modprobe_code": mod.returncode, "modprobe_out": mod.stdout + mod.stderr}
    if mod.returncode == 0:
        took = w.until("no RDMA device in a scrape", lambda s: sample(s, "rnic_devices") == 0.0)
        steps["unload"].update(
            {
                "scrape_s": took,
                "class_infiniband": sorted(os.listdir(SYS_IB)) if SYS_IB.exists() else None,
                "module_loaded": os.path.exists("/sys/module/rdma_rxe"),
                **w.record(),
            }
        )
    res["state_file"] = {p.name: p.read_text()[:20000] for p in w.state_dir.iterdir() if p.is_file()}
    res["serve_exit"] = w.serve.stop()
    res["serve_log"] = w.serve.log_text()[-30000:]
