"""mlx5 temperatures from hwmon (Linux 6.6+): the ASIC sensors and the module in the cage.

The one module reading InfiniBand ports have without vendor tools: an IPoIB netdev has no module
EEPROM ops (`ethtool -m ib0` fails), but mlx5's hwmon device, on the PCI function
(`<function>/hwmon/hwmonN/`, `name` = `mlx5`), adds one temperature channel for the port's module
when the module reports a temperature (IB and RoCE alike). Per-lane optics on InfiniBand need
vendor tools (mlxlink, `mlxcables`); this exporter does not run them.

Channels (drivers/net/ethernet/mellanox/mlx5/core/hwmon.c): the ASIC and platform sensors first,
then the module's, each `temp<i>_input` (millidegrees C), `temp<i>_label`, `temp<i>_highest`,
`temp<i>_crit`. A label is the firmware's sensor name, or `sensor<index>` when it has none; the
module's MTMP sensor index is 64 + the module number, so a label naming a module or a
`sensor<N>` with N >= 64 is the module. Every read is one MTMP register access: read on the
module timer, not per scrape.
"""

from __future__ import annotations

import errno
import re
from pathlib import Path

from rnic_exporter.model.wire import DeviceTemperatures, Temperature

_TEMP_INPUT = re.compile(r"^temp(\d+)_input$")
_MODULE_SENSOR = re.compile(r"^sensor(\d+)$")
MODULE_SENSOR_BASE = 64


def is_module_label(label: str) -> bool:
    if "module" in label.lower():
        return True
    match = _MODULE_SENSOR.match(label)
    return match is not None and int(match[1]) >= MODULE_SENSOR_BASE


def read_mlx5_hwmon(function_dir: Path) -> DeviceTemperatures | None:
    """The mlx5 hwmon temperatures of a PCI function, or None without an mlx5 hwmon (older kernel)."""
    hwmon_root = function_dir / "hwmon"
    try:
        candidates = sorted(hwmon_root.iterdir())
    except OSError:
        return None
    for hwmon in candidates:
        if _text(hwmon / "name") == "mlx5":
            return _read(hwmon)
    return None


def _read(hwmon: Path) -> DeviceTemperatures:
    asic: list[Temperature] = []
    module: Temperature | None = None
    errors: list[str] = []
    try:
        names = sorted(p.name for p in hwmon.iterdir())
    except OSError as exc:
        return DeviceTemperatures((), None, (f"{hwmon.name}: {_errno(exc)}",))
    channels = sorted(int(m[1]) for n in names if (m := _TEMP_INPUT.match(n)))
    for i in channels:
        try:
            celsius = _millidegrees(hwmon / f"temp{i}_input")
        except (OSError, ValueError) as exc:
            errors.append(f"{hwmon.name}/temp{i}_input: {_errno(exc)}")
            continue
        label = _text(hwmon / f"temp{i}_label") or f"temp{i}"
        temp = Temperature(label, celsius, _optional(hwmon / f"temp{i}_highest"), _optional(hwmon / f"temp{i}_crit"))
        if is_module_label(label) and module is None:
            module = temp
        else:
            asic.append(temp)
    return DeviceTemperatures(tuple(asic), module, tuple(errors))


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _millidegrees(path: Path) -> float:
    return int(path.read_text().strip()) / 1000.0


def _optional(path: Path) -> float | None:
    try:
        return _millidegrees(path)
    except (OSError, ValueError):
        return None  # crit/highest are optional attributes


def _errno(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.errno is not None:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return "malformed"
