"""Incident 1, part 1: which users of a GID keep its slot past an `ip addr del` (scenario
`incident_a_holders`; the code is `holders()` in incident_a.py), and the reference holder it runs.

As a scenario (`run(lab)`): for each user of a GID reference, the IPv4 address of va is deleted
and re-added and the GID table of rxe0 read before, while deleted and after; then the user is
released and the address churned once more.

As a script, run by that scenario with a Python that has rdma-core's pyverbs (Debian
`python3-pyverbs`; only stdlib at module level, so the system Python can run this file alone):

    python3 incident_a_holders.py KIND SGID_INDEX DGID SRC_IP DST_IP

holds one kind of reference on a GID table entry of rxe0 port 1 until killed.

KIND is one of the ib_core users of `ib_gid_attr` references (drivers/infiniband/core, Linux 6.1):
- `qp_init`: an RC QP moved to INIT only; no address vector yet, so no GID reference (control).
- `qp_rtr`, `qp_rts`: an RC QP moved to RTR (and RTS) with a RoCE address vector whose
  sgid_index is SGID_INDEX: `_ib_modify_qp` keeps `qp->av_sgid_attr` until the QP is destroyed.
- `ah`: an address handle (what UD senders create): `ah->sgid_attr` until the AH is destroyed.
- `cm_id`: an rdma_cm id whose address and route are resolved from SRC_IP to DST_IP: the id is
  bound to the GID of SRC_IP (`cma_bind_sgid_attr`) until it is destroyed.
- `cm_listen`: an rdma_cm id bound to SRC_IP and listening (a server bound to its address).
Prints one line `READY <kind>` once the object exists, then sleeps until SIGTERM/SIGKILL.
"""

from __future__ import annotations

import signal
import sys
import time
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from tests.kernel.lab import Lab

KINDS = ("qp_init", "qp_rtr", "qp_rts", "ah", "cm_id", "cm_listen")


def _hold(kind: str, index: int, dgid: str, src: str, dst: str) -> list[Any]:
    keep: list[Any] = []
    if kind.startswith("cm_"):
        import pyverbs.cm_enums as ce  # type: ignore[import-not-found, unused-ignore]
        from pyverbs.cmid import CMID, AddrInfo  # type: ignore[import-not-found, unused-ignore]

        if kind == "cm_id":
            info = AddrInfo(src=src, dst=dst, dst_service="7471", port_space=ce.RDMA_PS_TCP)
            keep.append(CMID(creator=info))  # rdma_create_ep: resolve_addr + resolve_route
        else:
            info = AddrInfo(src=src, src_service="7471", port_space=ce.RDMA_PS_TCP, flags=ce.RAI_PASSIVE)
            cmid = CMID(creator=info)
            cmid.listen()
            keep.append(cmid)
        return keep

    import pyverbs.enums as e  # type: ignore[import-not-found, unused-ignore]
    from pyverbs.addr import AH, GID, AHAttr, GlobalRoute  # type: ignore[import-not-found, unused-ignore]
    from pyverbs.cq import CQ  # type: ignore[import-not-found, unused-ignore]
    from pyverbs.device import Context  # type: ignore[import-not-found, unused-ignore]
    from pyverbs.pd import PD  # type: ignore[import-not-found, unused-ignore]
    from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr  # type: ignore[import-not-found, unused-ignore]

    ctx = Context(name="rxe0")
    pd = PD(ctx)
    cq = CQ(ctx, 8)
    keep += [ctx, pd, cq]
    ah_attr = AHAttr(gr=GlobalRoute(dgid=GID(dgid), sgid_index=index), is_global=1, port_num=1)
    if kind == "ah":
        keep.append(AH(pd, attr=ah_attr))
        return keep
    cap = QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap))
    keep.append(qp)
    attr = QPAttr()
    attr.port_num = 1
    qp.to_init(attr)
    if kind in ("qp_rtr", "qp_rts"):
        attr = QPAttr()
        attr.ah_attr = ah_attr
        attr.dest_qp_num = 0x11  # no peer QP: nothing is sent, the QP only has to exist
        attr.path_mtu = e.IBV_MTU_1024
        attr.rq_psn = 0
        attr.max_dest_rd_atomic = 1
        attr.min_rnr_timer = 12
        qp.to_rtr(attr)
    if kind == "qp_rts":
        attr = QPAttr()
        attr.sq_psn = 0
        attr.timeout = 14
        attr.retry_cnt = 7
        attr.rnr_retry = 7
        attr.max_rd_atomic = 1
        qp.to_rts(attr)
    return keep


def main(argv: list[str]) -> NoReturn:
    kind, index, dgid, src, dst = argv[0], int(argv[1]), argv[2], argv[3], argv[4]
    if kind not in KINDS:
        raise SystemExit(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
    signal.signal(signal.SIGTERM, lambda _s, _f: sys.exit(0))
    keep = _hold(kind, index, dgid, src, dst)
    print(f"READY {kind} objects={len(keep)}", flush=True)
    while True:
        time.sleep(3600)


def run(lab: Lab) -> dict[str, Any]:
    from tests.kernel.scenarios.incident_a import holders

    t0 = time.monotonic()
    result = holders(lab)
    result["seconds"] = round(time.monotonic() - t0, 1)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
