"""A healthy soft-RoCE host: rxe0 on va (root netns), rxe1 on vb (netns b), both ACTIVE.

Records what the exporter says (show, gids, check, each plain and --json, in process; one serve
subprocess scraped over HTTP) and what the kernel itself says (rxe0's sysfs tree, va's netdev
files, `rdma link`, `ip addr`). tests/kernel/test_healthy.py checks that they agree.
"""

from __future__ import annotations

import json
from typing import Any

from tests.kernel.lab import SYS_NET, VA, Lab, read_attr

NET_FILES = ("speed", "operstate", "mtu", "address", "carrier", "ifindex", "type")


def run(lab: Lab) -> dict[str, Any]:
    lab.rxe_pair()
    result: dict[str, Any] = {"cli": {}}
    for args in (("show",), ("show", "--json"), ("gids",), ("gids", "--json"), ("check",), ("check", "--json")):
        result["cli"][" ".join(args)] = lab.cli_result(*args).as_dict()
    serve = lab.serve("--path.sysfs", "/sys", "--poll.interval", "1")
    lab.wait_until(lambda: 'device="rxe0"' in serve.scrape(), 60, "a scrape that shows rxe0", poll_s=0.5)
    result["scrape"] = serve.scrape()
    result["serve_exit"] = serve.stop()
    result["serve_log"] = serve.log_text()
    result["kernel"] = {
        "rxe0": lab.tree("/sys/class/infiniband/rxe0"),
        "rxe1_gids": {str(i): read_attr(f"/sys/class/infiniband/rxe1/ports/1/gids/{i}") for i in range(4)},
        "net_va": {name: _try_read(f"{SYS_NET}/{VA}/{name}") for name in NET_FILES},
        "rdma_link": json.loads(lab.sh("rdma -j link show").stdout),
        "ip_addr_va": json.loads(lab.sh(f"ip -j addr show dev {VA}").stdout),
        "class_infiniband": sorted(p.name for p in __import__("pathlib").Path("/sys/class/infiniband").iterdir()),
    }
    return result


def _try_read(path: str) -> str:
    try:
        return read_attr(path)
    except OSError as exc:
        return f"<{type(exc).__name__} errno {exc.errno}>"
