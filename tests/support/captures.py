"""Where the real sysfs captures vendored under `tests/fixtures/` live (one home for their paths)."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

# The prometheus/procfs capture (hfi1_0, mlx4_0, mlx5_0); its sys/ root, as the reader expects.
PROCFS_SYS = FIXTURES / "procfs-sysfs" / "sys"
