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
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rnic_exporter.errors import ConfigError


@dataclass(frozen=True, slots=True)
class FileConfig:
    """What a config file may set; None means "not set in the file"."""

    poll_interval_seconds: float | None = None
    device_include: str | None = None
    device_exclude: str | None = None
    nccl_env: Mapping[str, str] = field(default_factory=dict)  # NCCL_* names -> values, as NCCL reads them
    nccl_gid_index: int | None = None


def _number(path: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"{path}: expected a positive number of seconds, got {value!r}")
    return float(value)


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
