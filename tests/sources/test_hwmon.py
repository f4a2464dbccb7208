"""mlx5 hwmon temperatures: the module channel found by its label, ASIC channels kept apart, files that
fail to read counted and skipped, an older kernel without the hwmon device is None, not an error."""

from __future__ import annotations

from pathlib import Path

from rnic_exporter.catalog import metrics as c
from rnic_exporter.model.wire import DeviceTemperatures, Temperature
from rnic_exporter.sinks.wire_samples import hwmon_samples
from rnic_exporter.sources.hwmon import is_module_label, read_mlx5_hwmon


def _hwmon(function: Path, index: int, name: str, channels: dict[int, dict[str, str]]) -> Path:
    """`<function>/hwmon/hwmon<index>/` as the kernel lays it out: one value and a newline per file."""
    directory = function / "hwmon" / f"hwmon{index}"
    directory.mkdir(parents=True)
    (directory / "name").write_text(f"{name}\n")
    for i, attrs in channels.items():
        for attr, value in attrs.items():
            (directory / f"temp{i}_{attr}").write_text(f"{value}\n")
    return directory


def test_module_channel_by_firmware_label_or_sensor_index(tmp_path: Path) -> None:
    function = tmp_path / "0000:3b:00.0"
    _hwmon(
        function,
        3,
        "mlx5",
        {
            1: {"input": "61125", "label": "asic", "highest": "74000", "crit": "105000"},
            2: {"input": "45375", "label": "sensor64", "highest": "47000", "crit": "75000"},
        },
    )
    temps = read_mlx5_hwmon(function)
    assert temps == DeviceTemperatures(
        asic=(Temperature("asic", 61.125, 74.0, 105.0),),
        module=Temperature("sensor64", 45.375, 47.0, 75.0),
    )
    samples = list(hwmon_samples("mlx5_0", "0000:3b:00.0", temps))
    assert (c.DEVICE_TEMPERATURE, ("mlx5_0", "0000:3b:00.0", "module", "sensor64"), 45.375) in samples
    assert (c.DEVICE_TEMPERATURE_CRITICAL, ("mlx5_0", "0000:3b:00.0", "asic", "asic"), 105.0) in samples


def test_labels() -> None:
    assert is_module_label("module0") and is_module_label("Module 1") and is_module_label("sensor64")
    assert not is_module_label("asic") and not is_module_label("sensor1") and not is_module_label("sensorX")


def test_no_module_channel_without_a_plugged_module(tmp_path: Path) -> None:
    function = tmp_path / "0000:5e:00.0"
    _hwmon(function, 0, "nvme", {1: {"input": "30000"}})  # another driver's hwmon on the same function
    _hwmon(function, 4, "mlx5", {1: {"input": "58000", "label": "asic"}})
    temps = read_mlx5_hwmon(function)
    assert temps is not None and temps.module is None and [t.label for t in temps.asic] == ["asic"]


def test_older_kernel_without_mlx5_hwmon_is_none(tmp_path: Path) -> None:
    function = tmp_path / "0000:86:00.0"
    function.mkdir()
    assert read_mlx5_hwmon(function) is None


def test_malformed_value_is_reported_and_skipped(tmp_path: Path) -> None:
    function = tmp_path / "0000:af:00.0"
    _hwmon(
        function, 1, "mlx5", {1: {"input": "not a number", "label": "asic"}, 2: {"input": "40000", "label": "module0"}}
    )
    temps = read_mlx5_hwmon(function)
    assert temps is not None and temps.asic == () and temps.module == Temperature("module0", 40.0, None, None)
    assert temps.errors == ("hwmon1/temp1_input: malformed",)
