"""Where the real sysfs captures vendored under `tests/fixtures/` live (one home for their paths).

Each capture is `tests/fixtures/<name>/` with a `sys/` root and a `SOURCE.md` (source, licence,
driver, kernel, and for reconstructions how rows became files).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

# The prometheus/procfs capture (hfi1_0, mlx4_0, mlx5_0); its sys/ root, as the reader expects.
PROCFS_SYS = FIXTURES / "procfs-sysfs" / "sys"


@dataclass(frozen=True)
class Capture:
    name: str
    # The check's exit code with no NCCL settings (NCCL's defaults), and why when it is not 0.
    exit_code: int = 0
    why: str = ""
    nccl_env: dict[str, str] = field(default_factory=dict)  # settings under which the host is healthy

    @property
    def sys(self) -> Path:
        return FIXTURES / self.name / "sys"


CAPTURES = (
    # phys_state `4: ACTIVE` on mlx5_0 is number 4, PortConfigurationTraining: not LinkUp.
    Capture("procfs-sysfs", exit_code=1, why="mlx5_0 port 1's phys_state is 4 (training), not 5 (LinkUp)"),
    Capture("node-exporter-i40iw-mlx4"),
    Capture("gpud-h100-ndr-bond"),
    # An IPv6-only fabric: NCCL's default AF_INET keeps the link-local GID 0; AF_INET6 is the fix.
    Capture(
        "mooncake-ipv6-only-v2",
        exit_code=1,
        why="IPv6-only RoCE v2 tables under NCCL's default AF_INET",
        nccl_env={"NCCL_IB_ADDR_FAMILY": "AF_INET6"},
    ),
    Capture("nccl-k8s-macvlan-sparse"),
    Capture("nccl-roce-bond-devinfo"),
    Capture("rdma-core-efa"),
)
