"""Port rate from the netdev's speed: rxe on a tap (held open, so it has carrier) whose ethtool speed
is set to each value; the kernel's `rate` file and what `show --json` makes of it, per speed."""

from __future__ import annotations

import json
from typing import Any

from tests.kernel.lab import SYS_IB, Lab, read_attr

SPEEDS_MBPS = (1000, 2500, 5000, 10000, 20000, 25000, 40000, 50000, 56000, 100000, 200000, 400000)


def run(lab: Lab) -> dict[str, Any]:
    lab.rxe_tap("tap0", "rxe2", SPEEDS_MBPS[0])
    rate = SYS_IB / "rxe2/ports/1/rate"
    lab.wait_until(lambda: read_attr(SYS_IB / "rxe2/ports/1/state").strip() == "4: ACTIVE", 30, "rxe2 ACTIVE")
    rows: list[dict[str, Any]] = []
    for mbps in SPEEDS_MBPS:
        lab.sh(f"ethtool -s tap0 speed {mbps} duplex full")
        kernel = read_attr(rate)
        code, out, err = lab.cli("show", "--json", "--collector.infiniband.device-include", "rxe2")
        port = json.loads(out)["devices"][0]["ports"][0] if code == 0 else None
        rows.append(
            {
                "mbps": mbps,
                "netdev_speed": read_attr("/sys/class/net/tap0/speed"),
                "kernel_rate": kernel,
                "show_rate": port["rate"] if port else None,
                "show_netdev_speed_mbps": port["netdevs"][0]["speed_mbps"] if port and port["netdevs"] else None,
                "show_code": code,
                "show_stderr": err,
            }
        )
    return {"rows": rows}
