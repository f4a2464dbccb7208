"""Which addresses a port is expected to keep: the ones NCCL and the GID table care about, bounded.

An address matters to a RoCE job through its GID: NCCL picks a RoCE v2 GID, and the kernel adds one
per address of the netdev for as long as the table has room. At most `MAX_EXPECTED_PER_PORT`
addresses are expected per port: NCCL's candidates (a RoCE v2 GID now, or when last seen) first,
then those with a GID in the port's table, then the rest, each in address order (stable across
polls). A netdev given thousands of secondary addresses then costs a bounded number of series and
state entries, and deleting them pages at most that many times, not once per address.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rnic_exporter.detect.state import KnownAddress

MAX_EXPECTED_PER_PORT = 32


def bound_expected(
    remembered: Mapping[str, KnownAddress],
    current: Mapping[str, str],
    candidates: Iterable[str],
    in_gid_table: Mapping[str, str] | None,
    v2_indices: Mapping[str, int],
) -> dict[str, bool]:
    """Expected address -> present now. `candidates`: present addresses worth remembering;
    `in_gid_table`: the addresses the port's GID table holds for its netdev, None when the port has
    no such table (InfiniBand: IPoIB addresses have no GIDs)."""
    wanted = [*remembered, *(a for a in candidates if a not in remembered)]
    if len(wanted) > MAX_EXPECTED_PER_PORT:

        def rank(address: str) -> tuple[bool, bool, str]:
            known = remembered.get(address)
            nccl = address in v2_indices or (known is not None and known.v2_index is not None)
            return not nccl, in_gid_table is not None and address not in in_gid_table, address

        wanted = sorted(wanted, key=rank)[:MAX_EXPECTED_PER_PORT]
    return {address: address in current for address in wanted}
