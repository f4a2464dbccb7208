"""The reading layer's fast paths: a batch whose descriptors are all held is read in one
comprehension, counters the kernel printed plainly skip the general parser. Both must answer
exactly what the per-file path answers, also when a read fails in the middle of a batch."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from rnic_exporter.sim import SimHost
from rnic_exporter.sources.counters import CounterPlan
from rnic_exporter.sources.infiniband import parse_counter
from rnic_exporter.sources.sysfs import ReadBatch, SysfsRoot, interpret
from tests.support.faultfs import FaultyMount

COUNTERS = "class/infiniband/mlx5_1/ports/1/counters"
NAMES = ("port_rcv_data", "port_xmit_data", "symbol_error", "link_downed")


def test_a_held_batch_reads_as_file_by_file_also_when_one_read_fails(
    faulty_sysfs: FaultyMount, sim_host: SimHost
) -> None:
    root = SysfsRoot(faulty_sysfs.mount, hold_fds=True)  # no errno overlay: the fast path is taken
    fds = root.cache()
    rels = [f"{COUNTERS}/{name}" for name in NAMES]
    long_rel = "class/infiniband/mlx5_1/node_desc"
    (sim_host.root / long_rel).write_text("x" * 300 + "\n")  # beyond the first 128-byte read
    batch = ReadBatch([*rels, long_rel])

    def on_disk() -> list[bytes]:
        return [(sim_host.root / rel).read_bytes() for rel in batch.rels]

    assert fds.read_batch(batch) == on_disk()  # opens and holds every descriptor
    assert batch.complete
    sim_host.add_traffic(1.0)
    assert fds.read_batch(batch) == on_disk() and batch.complete  # the fast path, fresh bytes
    reads = fds.reads

    faulty_sysfs.fail(rels[1], errno.EIO)
    got = fds.read_batch(batch)
    want = on_disk()
    assert got[1] == errno.EIO and got[:1] + got[2:] == want[:1] + want[2:]
    assert not batch.complete  # the failed file's descriptor was dropped
    assert fds.reads == reads + len(batch.rels)  # one read counted per file, not two

    faulty_sysfs.clear()
    sim_host.add_traffic(1.0)
    assert fds.read_batch(batch) == on_disk() and batch.complete  # reopened: fast again
    assert fds.read_batch(batch) == on_disk()


def test_a_held_batch_of_a_removed_device_answers_enodev(faulty_sysfs: FaultyMount, sim_host: SimHost) -> None:
    root = SysfsRoot(faulty_sysfs.mount, hold_fds=True)
    fds = root.cache()
    batch = ReadBatch([f"{COUNTERS}/{name}" for name in NAMES])
    fds.read_batch(batch)
    fds.read_batch(batch)
    sim_host.remove_device("mlx5_1")
    got = fds.read_batch(batch)
    assert all(isinstance(raw, int) and raw in (errno.ENODEV, errno.ENOENT) for raw in got), got


@pytest.mark.parametrize(
    "text",
    [
        "0\n",
        "7\n",
        "18446744073709551615\n",  # u64 max: 20 digits, the general parser's path
        "9999999999999999999\n",  # 19 digits: the fast path's longest
        "0012\n",
        "12\n\n",
        "12",
        "+12\n",
        "-1\n",
        " 12\n",
        "1_000\n",
        "12a\n",
        "N/A (no PMA)\n",
        "\n",
        "",
        "18446744073709551616\n",  # beyond 64 bits
        "1" * 30 + "\n",
        "\u0661\u0662\n",  # Arabic-Indic digits: str.isdigit() says yes, the kernel never prints them
    ],
)
def test_counters_parse_as_the_general_parser_does(tmp_path: Path, text: str) -> None:
    (tmp_path / "counters").mkdir()
    (tmp_path / "counters" / "port_rcv_errors").write_bytes(text.encode())
    root = SysfsRoot(tmp_path, hold_fds=True)
    plan = CounterPlan("mlx5_0", [("hw", 1, "counters", ["port_rcv_errors"])])
    fds = root.cache()
    for _ in range(2):  # the first pass opens, the second is the held batch's
        plan.refresh(fds)
    want, reason = interpret(text.encode(), parse_counter, frozenset())
    assert plan.groups[0].values == [want]
    assert [e.reason for e in plan.errors] == ([] if reason is None else [reason])


# Each step writes these bytes (None: the read fails with EIO) into a port's PMA counters, in the
# order of _PMA_NAMES.
_PMA_NAMES = ("port_rcv_data", "port_xmit_data", "symbol_error", "link_downed")
_STEPS: list[tuple[bytes | None, ...]] = [
    (b"10\n", b"20\n", b"0\n", b"1\n"),
    (b"11\n", b"21\n", b"65535\n", b"2\n"),
    (b"12\n", None, b"65535\n", b"3\n"),
    (b"13\n", b"22\n", b"4\n", b"4\n"),
    (b"14\n", b"18446744073709551616\n", b"5\n", b"5\n"),
    (b"15\n", b"23\n", b"6\n", b"6\n"),
    (b"16", b"24\n25\n", b"7\n", b"7\n"),
    (b"", b"1\n2\n", b"8\n", b"8\n"),
    (b"17\n", b"26\n", b"9\n", b"255\n"),
    (b"9999999999999999999\n", b"27\n", b"10\n", b"9\n"),
    (b"0018\n", b"+28\n", b"1_1\n", b" 10\n"),
    (b"19\n", b"29\n", b"12\n", b"11\n"),
    (b"20\n", b"30\n", b"12\n", b"12\n"),
    (b"21\n", b"31\n", b"65535\n", b"13\n"),
]


def _run_steps(
    mount: FaultyMount, backing: Path, monkeypatch: pytest.MonkeyPatch, whole_groups: bool
) -> tuple[list[tuple[object, ...]], int]:
    from rnic_exporter.sources import counters

    taken = 0
    real = counters.CounterPlan._apply_kernel_digits

    def counted(self: CounterPlan, *args: Any) -> bool:
        nonlocal taken
        took = real(self, *args) if whole_groups else False
        taken += took
        return took

    monkeypatch.setattr(counters.CounterPlan, "_apply_kernel_digits", counted)
    names = list(_PMA_NAMES)
    plan = CounterPlan("mlx5_1", [("counters", 1, COUNTERS, names)])
    fds = SysfsRoot(mount.mount, hold_fds=True).cache()
    seen: list[tuple[object, ...]] = []
    for step in _STEPS:
        mount.clear()
        for name, raw in zip(_PMA_NAMES, step, strict=True):
            (backing / COUNTERS / name).write_bytes(raw if raw is not None else b"0\n")
            if raw is None:
                mount.fail(f"{COUNTERS}/{name}", errno.EIO)
        failed = plan.refresh(fds)
        group = plan.groups[0]
        seen.append(
            (
                list(group.values),
                list(group.saturated),
                group.changed,
                group.reshaped,
                group.version,
                [(e.attribute, e.reason) for e in plan.errors],
                len(failed),
            )
        )
    mount.clear()
    monkeypatch.undo()
    return seen, taken


def test_a_whole_group_of_kernel_digits_stores_what_the_per_file_path_does(
    faulty_sysfs: FaultyMount, sim_host: SimHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The busy host's path (one match and one map(int) per group) against the per-file path, pass
    by pass over saturation, scaling, a failing and healing file, 2**64 and malformed values."""
    whole, taken = _run_steps(faulty_sysfs, sim_host.root, monkeypatch, whole_groups=True)
    per_file, _ = _run_steps(faulty_sysfs, sim_host.root, monkeypatch, whole_groups=False)
    assert whole == per_file
    assert taken == 4, taken  # steps 1, 9, 12, 13: plain digits after a pass with every file clean
    values = [step[0] for step in whole]
    assert values[1] == [44, 84, 65535, 2]  # the data counters are x4: bytes
    assert whole[1][1] == [False, False, True, False]  # symbol_error is 16 bits: 65535 is stuck
    assert whole[2][5] == [("counters/port_xmit_data", "EIO")]
    assert whole[8][1] == [False, False, False, True]  # link_downed is 8 bits: 255 is stuck
    assert values[-3] == [76, 116, 12, 11]
    assert whole[-1][2] == (0, 1, 2, 3) and whole[-1][1] == [False, False, True, False]
