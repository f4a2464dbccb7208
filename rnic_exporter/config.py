"""The `--config FILE` (TOML or YAML): parsed strictly, every problem named with file, key and reason.

Precedence, as documented in the README: a flag given on the command line or through its
environment variable beats the file; the file beats the built-in default.

    poll_interval_seconds = 5
    [collector.infiniband]
    device_include = "^mlx5_"
    device_exclude = "^mlx5_bond"
    [nccl]
    ib_gid_index = 3              # what your jobs set NCCL_IB_GID_INDEX to (-1 = auto)
    ib_addr_family = "AF_INET"
    ib_addr_range = "10.0.0.0/8"
    ib_roce_version_num = 2
    [inventory]
    expected_devices = 8          # check and alerts: fewer present is a problem
    [flapping]
    transitions = 4               # up/down transitions within window_seconds make a port flapping
    window_seconds = 300
    clear_after_seconds = 900     # quiet time before it counts as stable again
    [addresses]
    forget_after_seconds = 86400  # an expected address missing this long stops being expected
    [[rated]]                     # expectations; all given match keys must agree; last match wins
    match = { hca_type = "MT4129" }   # keys: device, pci_address, hca_type, board_id
    port_rate_gbps = 400
    port_width = 4
    netdev_speed_gbps = 400
    pcie_speed_gts = 32
    pcie_width = 16
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rnic_exporter.detect.settings import MATCH_KEYS, DetectionSettings, FlapSettings, RatedExpectation
from rnic_exporter.errors import ConfigError


@dataclass(frozen=True, slots=True)
class FileConfig:
    """What a config file may set; None means "not set in the file"."""

    poll_interval_seconds: float | None = None
    device_include: str | None = None
    device_exclude: str | None = None
    nccl_env: Mapping[str, str] = field(default_factory=dict)  # NCCL_* names -> values, as NCCL reads them
    nccl_gid_index: int | None = None
    expected_devices: int | None = None
    flap_transitions: int | None = None
    flap_window_seconds: float | None = None
    flap_clear_after_seconds: float | None = None
    address_forget_after_seconds: float | None = None
    rated: tuple[RatedExpectation, ...] = ()

    def detection(self, base: DetectionSettings, keep_gid_index: bool = False) -> DetectionSettings:
        """`base` (built-in defaults, flags) overlaid with what this file sets. `keep_gid_index`:
        base's NCCL index came from NCCL_IB_GID_INDEX, which is what jobs get and beats the file."""
        flap = FlapSettings(
            transitions=self.flap_transitions or base.flap.transitions,
            window_s=self.flap_window_seconds or base.flap.window_s,
            clear_after_s=self.flap_clear_after_seconds or base.flap.clear_after_s)
        return replace(base, rated=self.rated or base.rated, flap=flap,
                       expected_devices=self.expected_devices if self.expected_devices is not None
                       else base.expected_devices,
                       nccl_gid_index=base.nccl_gid_index if keep_gid_index or self.nccl_gid_index is None
                       else self.nccl_gid_index,
                       address_forget_after_s=self.address_forget_after_seconds or base.address_forget_after_s)


def _positive(path: str, value: Any, what: str = "a positive number") -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"{path}: expected {what}, got {value!r}")
    return float(value)


def _number(path: str, value: Any) -> float:
    return _positive(path, value, "a positive number of seconds")


def _regex(path: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{path}: expected a regular expression string, got {value!r}")
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"{path}: {value!r} is not a valid regular expression ({exc})") from None
    return value


def _int(path: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{path}: expected an integer, got {value!r}")
    return value


def _count(path: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{path}: expected a positive integer, got {value!r}")
    return value


# A [[rated]] table's values (RatedExpectation fields), in the order the error message lists them.
_RATED_VALUES: Mapping[str, Callable[[str, Any], Any]] = {
    "port_rate_gbps": _positive, "port_width": _count, "netdev_speed_gbps": _positive,
    "pcie_speed_gts": _positive, "pcie_width": _count,
}


def _rated(path: str, value: Any) -> tuple[RatedExpectation, ...]:
    if not isinstance(value, list):
        raise ValueError(f"{path}: expected a list of tables ([[rated]] in TOML, a list in YAML), got {value!r}")
    out = []
    problems = []
    for i, item in enumerate(value):
        where = f"{path}[{i}]"
        if not isinstance(item, Mapping):
            problems.append(f"{where}: expected a table, got {item!r}")
            continue
        match = item.get("match")
        if not isinstance(match, Mapping) or not match:
            problems.append(f"{where}.match: expected a table of {', '.join(MATCH_KEYS)}")
            continue
        bad = [k for k in match if k not in MATCH_KEYS or not isinstance(match[k], str)]
        if bad:
            problems.append(f"{where}.match: unknown key or non-string value {bad[0]!r} "
                            f"(keys: {', '.join(MATCH_KEYS)})")
            continue
        values: dict[str, Any] = {}
        for key, raw in item.items():
            if key == "match":
                continue
            validate = _RATED_VALUES.get(key)
            if validate is None:
                problems.append(f"{where}.{key}: unknown key ({', '.join(_RATED_VALUES)}, match)")
                continue
            try:
                values[key] = validate(f"{where}.{key}", raw)
            except ValueError as exc:
                problems.append(str(exc))
        if not values:
            problems.append(f"{where}: sets no rated value")
            continue
        out.append(RatedExpectation(match=tuple(sorted((str(k), str(v)) for k, v in match.items())), **values))
    if problems:
        raise ValueError("; ".join(problems))
    return tuple(out)


def _str(path: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{path}: expected a string, got {value!r}")
    return value


# key path -> (validator, FileConfig field or NCCL env name)
_SCHEMA: Mapping[str, tuple[Callable[[str, Any], Any], str]] = {
    "poll_interval_seconds": (_number, "poll_interval_seconds"),
    "collector.infiniband.device_include": (_regex, "device_include"),
    "collector.infiniband.device_exclude": (_regex, "device_exclude"),
    "nccl.ib_gid_index": (_int, "nccl_gid_index"),
    "nccl.ib_addr_family": (_str, "env:NCCL_IB_ADDR_FAMILY"),
    "nccl.ib_addr_range": (_str, "env:NCCL_IB_ADDR_RANGE"),
    "nccl.ib_roce_version_num": (_int, "env:NCCL_IB_ROCE_VERSION_NUM"),
    "inventory.expected_devices": (_count, "expected_devices"),
    "flapping.transitions": (_count, "flap_transitions"),
    "flapping.window_seconds": (_number, "flap_window_seconds"),
    "flapping.clear_after_seconds": (_number, "flap_clear_after_seconds"),
    "addresses.forget_after_seconds": (_number, "address_forget_after_seconds"),
    "rated": (_rated, "rated"),
}
_SECTIONS = {key.rsplit(".", 1)[0] for key in _SCHEMA if "." in key} | {"collector"}


def _flatten(data: Mapping[str, Any], prefix: str, out: dict[str, Any], problems: list[str]) -> None:
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            if path not in _SECTIONS:
                problems.append(f"{path}: unknown section")
                continue
            _flatten(value, path + ".", out, problems)
        else:
            out[path] = value


def load(path: Path) -> FileConfig:
    """Parse and validate `path`; raise ConfigError listing every problem at once."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read it: {exc.strerror}") from None
    # Parsers only when a config file is given: PyYAML costs ~1.4 MB of resident memory.
    import tomllib

    import yaml

    try:
        data = (yaml.safe_load(text) or {}) if path.suffix in (".yml", ".yaml") else tomllib.loads(text)
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        kind = "YAML" if path.suffix in (".yml", ".yaml") else "TOML (use .yml/.yaml for YAML)"
        raise ConfigError(f"config file {path}: not valid {kind}: {exc}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"config file {path}: the top level must be a table/mapping of keys")
    flat: dict[str, Any] = {}
    problems: list[str] = []
    _flatten(data, "", flat, problems)
    values: dict[str, Any] = {}
    env: dict[str, str] = {}
    for key, value in flat.items():
        spec = _SCHEMA.get(key)
        if spec is None:
            close = [k for k in _SCHEMA if k.rsplit(".", 1)[-1] == key.rsplit(".", 1)[-1]]
            hint = f" (did you mean {close[0]}?)" if close else f" (known keys: {', '.join(sorted(_SCHEMA))})"
            problems.append(f"{key}: unknown key{hint}")
            continue
        validate, target = spec
        try:
            checked = validate(key, value)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        if target.startswith("env:"):
            env[target.removeprefix("env:")] = str(checked)
        else:
            values[target] = checked
    if problems:
        raise ConfigError(f"config file {path}: " + "; ".join(problems))
    return FileConfig(nccl_env=env, **values)
