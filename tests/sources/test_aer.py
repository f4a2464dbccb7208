"""PCIe AER counters of each RNIC function (aer_dev_correctable / _nonfatal / _fatal, kernel 4.17+):
read as drivers/pci/pcie/aer.c prints them, exported, judged by check; absent where AER is off."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from rnic_exporter.cli import Exit, main
from rnic_exporter.sim import SimHost
from rnic_exporter.sources.pci import AER_POLLED
from rnic_exporter.sources.reader import HostReader, ReaderSettings
from rnic_exporter.sources.sysfs import MalformedValueError, SysfsRoot
from tests.support.exposition import render_text, samples

# As the kernel prints aer_dev_correctable (named bits in bit order, an unnamed bit that counted, the total).
CORRECTABLE = """RxErr 2
BadTLP 5
BadDLLP 0
Rollover 0
Timeout 1
NonFatalErr 0
CorrIntErr 0
HeaderOF 0
dev_cor_errs_bit[16] 1
TOTAL_ERR_COR 9
"""


def test_the_total_line_is_the_count() -> None:
    parse = {a.file: a.parse for a in AER_POLLED}
    assert parse["aer_dev_correctable"](CORRECTABLE) == 9
    assert parse["aer_dev_fatal"]("Undefined 0\nDLP 0\nTOTAL_ERR_FATAL 0\n") == 0
    for bad in ("RxErr 2\n", "TOTAL_ERR_COR -1\n", "TOTAL_ERR_COR x\n", "TOTAL_ERR_FATAL 1\n", ""):
        with pytest.raises(MalformedValueError):
            parse["aer_dev_correctable"](bad)


def aer_series(host: SimHost) -> dict[tuple[str, str], float]:
    reader = HostReader(SysfsRoot(host.root), ReaderSettings())
    try:
        snap = reader.read()
    finally:
        reader.close()
    assert not snap.errors, snap.errors
    return {
        (dict(labels)["device"], dict(labels)["severity"]): value
        for (name, labels), value in samples(render_text(snap)).items()
        if name == "rnic_pcie_aer_errors_total"
    }


def test_injected_errors_are_exported_per_function_and_severity(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=2, infiniband=1)
    assert set(aer_series(host).values()) == {0}
    host.inject_aer("mlx5_1", "correctable", "BadTLP", 40)
    host.inject_aer("mlx5_1", "nonfatal", "CmpltTO")
    host.inject_aer("mlx5_2", "fatal", "MalfTLP", 2)
    series = aer_series(host)
    assert series[("mlx5_1", "correctable")] == 40 and series[("mlx5_1", "nonfatal")] == 1
    assert series[("mlx5_2", "fatal")] == 2 and series[("mlx5_0", "fatal")] == 0


def test_no_aer_files_is_no_series_and_no_error(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=2)
    for name in ("mlx5_0", "mlx5_1"):
        for attr in AER_POLLED:
            (host.root / host.device(name).function_dir / attr.file).unlink()
    assert aer_series(host) == {}


def test_check_reports_fatal_and_nonfatal_errors(tmp_path: Path) -> None:
    host = SimHost.build(tmp_path / "sys", roce=2)
    args = ["check", "--path.sysfs", str(host.root), "--no-netlink", "--state.dir", ""]
    host.inject_aer("mlx5_0", "correctable", count=500)  # the link's retries: the alert's business
    assert CliRunner().invoke(main, args).exit_code == Exit.OK
    host.inject_aer("mlx5_0", "nonfatal", "CmpltTO")
    result = CliRunner().invoke(main, [*args, "--fail-on", "critical"])
    assert result.exit_code == Exit.OK and "1 non-fatal uncorrectable PCIe error(s)" in result.output
    host.inject_aer("mlx5_1", "fatal", "DLP")
    result = CliRunner().invoke(main, [*args, "--fail-on", "critical"])
    assert result.exit_code == Exit.PROBLEMS
    assert "[CRITICAL] mlx5_1 (" in result.output and "1 fatal PCIe error(s) since boot" in result.output
