"""PMA counters on purpose: a scrape's counter pass reads the PMA files rates are drawn from, the
error counters once a minute (served from their last read in between, still counters), and a
file that answered `N/A (no PMA)` from the first read never again; a one-shot read reads all."""

from __future__ import annotations

from pathlib import Path

from rnic_exporter.sim import SimHost
from rnic_exporter.sources.counters import RATE_PMA, SLOW_PMA_S
from rnic_exporter.sources.reader import HostReader, ReaderSettings, run_here
from rnic_exporter.sources.sysfs import SysfsRoot

PORT = "class/infiniband/mlx5_0/ports/1/counters"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pma_reads(reader: HostReader, device: str = "mlx5_0") -> int:
    return {name: reads for name, _path, reads in reader.read_costs()}[device].get("pma_file", 0)


def scrape(reader: HostReader) -> int:
    """One scrape's counter pass; the PMA files it read."""
    before = pma_reads(reader)
    run_here(reader.counter_jobs())
    return pma_reads(reader) - before


def pma(reader: HostReader, name: str) -> int | None:
    (plan,) = [p for d, p in reader.counter_plans() if d == "mlx5_0"]
    assert plan is not None
    group = plan.group("counters", 1)
    assert group is not None
    return group.values[group.names.index(name)]


def test_rates_every_scrape_errors_on_their_timer(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path, roce=1, gid_table_size=8)
    files = len(host.device("mlx5_0").counters)
    clock = Clock()
    reader = HostReader(SysfsRoot(tmp_path, hold_fds=True), clock=clock)
    reader.state_pass()
    assert scrape(reader) == files  # the first pass reads every file
    (host.root / PORT / "symbol_error").write_text("7\n")
    (host.root / PORT / "port_xmit_data").write_text("123456\n")
    clock.now += 15
    assert scrape(reader) == len(RATE_PMA)
    assert pma(reader, "port_xmit_data") == 123456 * 4  # read: 4-octet words to bytes
    assert pma(reader, "symbol_error") == 0  # served from its last read
    clock.now += SLOW_PMA_S - 15
    assert scrape(reader) == files  # the timer is due
    assert pma(reader, "symbol_error") == 7
    clock.now += 15
    assert scrape(reader) == len(RATE_PMA)


def test_a_one_shot_read_reads_every_file(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path, roce=1, gid_table_size=8)
    reader = HostReader(SysfsRoot(tmp_path))
    reader.read()
    (host.root / PORT / "symbol_error").write_text("3\n")
    port = reader.read().port("mlx5_0", 1)
    assert port is not None and port.counters["symbol_error"].value == 3


def test_the_timer_can_be_turned_to_every_scrape(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path, roce=1, gid_table_size=8)
    reader = HostReader(SysfsRoot(tmp_path), ReaderSettings(pma_slow_s=0))
    reader.state_pass()
    files = len(host.device("mlx5_0").counters)
    assert [scrape(reader) for _ in range(3)] == [files] * 3


def test_a_port_without_pma_is_not_asked_again(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path, roce=1, gid_table_size=8)
    host.without_pma("mlx5_0", "text")
    files = len(host.device("mlx5_0").counters)
    clock = Clock()
    reader = HostReader(SysfsRoot(tmp_path, hold_fds=True), clock=clock)
    reader.state_pass()
    assert scrape(reader) == files
    for _ in range(10):
        clock.now += SLOW_PMA_S
        assert scrape(reader) == 0
    snap = reader.read()  # still said: unsupported, not failed
    assert snap.errors == () and {e.kind for e in snap.unsupported} == {"no_pma"}
