"""How fast the exporter sees real kernel events: `serve` with 1 s polls, then an address deleted,
the carrier dropped (peer down) and the device removed (`rdma link delete`). For each, the time
until sysfs shows it and until a scrape shows it (figures, under TCG emulation)."""

from __future__ import annotations

import re
import time
from typing import Any

from tests.kernel.lab import NETNS, SYS_IB, VA, VA_ADDR, VB, Lab, ipv4_gid, read_attr


def _has(scrape: str, name: str, value: float | None = None, **labels: str) -> bool:
    for line in scrape.splitlines():
        m = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if not m:
            continue
        got = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(1)))
        if all(got.get(k) == v for k, v in labels.items()) and (value is None or float(m.group(2)) == value):
            return True
    return False


def run(lab: Lab) -> dict[str, Any]:
    lab.rxe_pair()
    serve = lab.serve("--path.sysfs", "/sys", "--poll.interval", "1")
    lab.wait_until(lambda: _has(serve.scrape(), "rnic_port_up", 1.0, device="rxe0"), 60, "rxe0 up in a scrape", 0.5)
    figures: dict[str, Any] = {}

    def measure(what: str, action: str, netns: str | None, kernel: Any, exported: Any) -> None:
        t0 = time.monotonic()
        lab.sh(action, netns=netns)
        k = lab.wait_until(kernel, 60, f"{what}: sysfs shows it", 0.02)
        e = lab.wait_until(lambda: exported(serve.scrape()), 60, f"{what}: a scrape shows it", 0.1)
        figures[what] = {
            "sysfs_s": round(k, 3),
            "scrape_s": round(time.monotonic() - t0, 3),
            "after_sysfs_s": round(e, 3),
        }

    measure(
        "address_deleted",
        f"ip addr del {VA_ADDR}/24 dev {VA}",
        None,
        lambda: lab.gid_of("rxe0", ipv4_gid(VA_ADDR)) is None,
        lambda s: not _has(s, "rnic_gid_entry_info", 1.0, device="rxe0", ipv4=VA_ADDR),
    )
    measure(
        "carrier_lost",
        f"ip link set {VB} down",
        NETNS,
        lambda: read_attr(SYS_IB / "rxe0/ports/1/state").strip() == "1: DOWN",
        lambda s: _has(s, "rnic_port_up", 0.0, device="rxe0"),
    )
    measure(
        "device_removed",
        "rdma link delete rxe0",
        None,
        lambda: not (SYS_IB / "rxe0").exists(),
        lambda s: not _has(s, "rnic_port_up", device="rxe0") or _has(s, "rnic_device_present", 0.0, device="rxe0"),
    )
    final = serve.scrape()
    return {
        "figures": figures,
        "final_rxe0_lines": [ln for ln in final.splitlines() if 'device="rxe0"' in ln and "present" in ln],
        "serve_exit": serve.stop(),
        "serve_log": serve.log_text()[-20000:],
    }
