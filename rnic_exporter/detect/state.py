"""The state directory: the inventory, learned baselines and expected addresses, kept across restarts.

One JSON file, written atomically (temp file, fsync, rename, fsync of the directory), carrying a
format name and version. A corrupt or foreign file is moved aside and rebuilt, never fatal: the
exporter's job is to keep reporting, and the inventory re-learns itself on the next poll.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rnic_exporter.model import Device

STATE_FORMAT = "rnic-exporter-state"
STATE_VERSION = 1
STATE_FILE = "state.json"
DEFAULT_STATE_DIR = Path("/var/lib/rnic-exporter")


def device_key(device: Device) -> str:
    """PCI address when there is one: device names are not stable (renames, LAG), slots are."""
    return device.pci_address or f"name:{device.name}"


def port_key(device: str, port: int) -> str:
    return f"{device}/{port}"


@dataclass(slots=True)
class KnownDevice:
    name: str
    pci_address: str | None
    node_guid: str | None = None
    hca_type: str | None = None
    board_id: str | None = None
    first_seen: float = 0.0
    last_seen: float = 0.0


@dataclass(slots=True)
class Baseline:
    """Best rate and width seen while the port was ACTIVE."""

    rate_bytes_per_second: float
    lanes: int


@dataclass(slots=True)
class KnownAddress:
    netdev: str
    last_seen: float
    v2_index: int | None = None  # index of its RoCE v2 GID when last seen


@dataclass(slots=True)
class State:
    devices: dict[str, KnownDevice] = field(default_factory=dict)  # device_key -> device
    baselines: dict[str, Baseline] = field(default_factory=dict)  # port_key -> baseline
    addresses: dict[str, dict[str, KnownAddress]] = field(default_factory=dict)  # port_key -> address -> seen

    def to_json(self) -> dict[str, Any]:
        return {"format": STATE_FORMAT, "version": STATE_VERSION,
                "devices": {k: asdict(v) for k, v in sorted(self.devices.items())},
                "baselines": {k: asdict(v) for k, v in sorted(self.baselines.items())},
                "addresses": {k: {a: asdict(s) for a, s in sorted(v.items())}
                              for k, v in sorted(self.addresses.items())}}

    @classmethod
    def from_json(cls, data: Any) -> State:
        """Raise ValueError (naming what is wrong) for anything that is not our current format."""
        if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
            raise ValueError(f"not an rnic-exporter state file (format {_field(data, 'format')!r})")
        if data.get("version") != STATE_VERSION:
            raise ValueError(f"state version {_field(data, 'version')!r}, this exporter reads {STATE_VERSION}")
        try:
            return cls(
                devices={str(k): KnownDevice(**v) for k, v in data["devices"].items()},
                baselines={str(k): Baseline(**v) for k, v in data["baselines"].items()},
                addresses={str(k): {str(a): KnownAddress(**s) for a, s in v.items()}
                           for k, v in data["addresses"].items()},
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed state content: {exc!r}") from None


def _field(data: Any, name: str) -> Any:
    return data.get(name) if isinstance(data, dict) else type(data).__name__


@dataclass(frozen=True, slots=True)
class LoadResult:
    state: State
    problem: str | None = None  # why the file was rebuilt; None when it loaded or did not exist
    reason: str | None = None  # low-cardinality label: corrupt | foreign | unreadable


class StateStore:
    """Loads and saves the state file in `directory`; `None` keeps state in memory only."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self._last_written: str | None = None

    @property
    def path(self) -> Path | None:
        return None if self.directory is None else self.directory / STATE_FILE

    def load(self) -> LoadResult:
        path = self.path
        if path is None:
            return LoadResult(State())
        try:
            text = path.read_text()
        except FileNotFoundError:
            return LoadResult(State())
        except OSError as exc:
            return LoadResult(State(), f"cannot read {path}: {exc.strerror}; starting with an empty inventory",
                              "unreadable")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            return self._rebuild(path, f"{path} is corrupt ({exc.msg} at line {exc.lineno})", "corrupt")
        try:
            state = State.from_json(data)
        except ValueError as exc:
            reason = "corrupt" if isinstance(data, dict) and data.get("format") == STATE_FORMAT else "foreign"
            return self._rebuild(path, f"{path}: {exc}", reason)
        self._last_written = text
        return LoadResult(state)

    def _rebuild(self, path: Path, problem: str, reason: str) -> LoadResult:
        aside = path.with_name(f"{path.name}.{reason}-{int(time.time())}")
        with contextlib.suppress(OSError):
            path.rename(aside)
            problem += f"; moved aside to {aside.name}"
        return LoadResult(State(), problem + "; rebuilding the inventory from what is present now", reason)

    def save(self, state: State) -> None:
        """Write if changed. Raises OSError (the caller counts and logs it; the exporter goes on)."""
        path = self.path
        if path is None:
            return
        text = json.dumps(state.to_json(), indent=1, sort_keys=True) + "\n"
        if text == self._last_written:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # one writer per process: the pid suffices
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "w") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self._last_written = text
