"""The state directory: the inventory, learned baselines and expected addresses, kept across restarts.

One JSON file, written atomically (temp file, fsync, rename, fsync of the directory), carrying a
format name and version. A corrupt or foreign file is moved aside and rebuilt, never fatal: the
exporter's job is to keep reporting, and the inventory re-learns itself on the next poll.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import math
import os
import socket
import stat
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rnic_exporter.errors import ConfigError
from rnic_exporter.model.host import Device

log = logging.getLogger(__name__)

STATE_FORMAT = "rnic-exporter-state"
STATE_VERSION = 1
STATE_FILE = "state.json"
LOCK_FILE = "state.lock"
DEFAULT_STATE_DIR = Path("/var/lib/rnic-exporter")


_ZERO_GUID = "0000:0000:0000:0000"

# The most a state file of this exporter holds: an entry is ~100 bytes and a port keeps at most 32
# expected addresses (detect/expected.py), so 4 MiB is some 40,000 entries, more than a thousand
# devices need. A bigger file is not one this exporter wrote: decoding it would cost ~8 bytes of
# memory per byte and seconds before the first scrape (a valid 50 MB file: 30 s and 445 MB).
MAX_STATE_BYTES = 4 << 20


def device_key(device: Device) -> str:
    """What stays when a device is renamed: its PCI address when it has one (names are not stable:
    renames, LAG; slots are), else its node GUID (a soft device such as rxe: `rdma dev set rxe0 name
    rxe9` in the kernel lab keeps the GUID, and keying by name read the rename as a lost NIC), else,
    for a driver that reports no GUID (EFA prints zeros), its name."""
    if device.pci_address:
        return device.pci_address
    if device.node_guid and device.node_guid != _ZERO_GUID:
        return f"guid:{device.node_guid}"
    return f"name:{device.name}"


def same_device(known: KnownDevice, device: Device) -> bool:
    """Whether an inventory entry under another key than `device_key(device)` is that device all
    the same: the same node GUID, where one of the two has no PCI address because its `device` link
    failed to read (at discovery, or now). A card moved to another slot has both and stays two."""
    guid = device.node_guid
    return (
        bool(guid)
        and guid != _ZERO_GUID
        and known.node_guid == guid
        and (known.pci_address is None or device.pci_address is None)
    )


def _rekeyed(key: str, known: KnownDevice) -> str:
    """A state file written before soft devices were keyed by node GUID kept them as `name:<name>`:
    the same device read now must not look new (and the old entry missing)."""
    if key.startswith("name:") and known.pci_address is None and known.node_guid and known.node_guid != _ZERO_GUID:
        return f"guid:{known.node_guid}"
    return key


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
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "devices": {k: asdict(v) for k, v in sorted(self.devices.items())},
            "baselines": {k: asdict(v) for k, v in sorted(self.baselines.items())},
            "addresses": {k: {a: asdict(s) for a, s in sorted(v.items())} for k, v in sorted(self.addresses.items())},
        }

    @classmethod
    def from_json(cls, data: Any) -> State:
        """Raise ValueError (naming the first thing wrong) for anything that is not our current
        format, checked against the schema in full: a wrong type or an impossible number in one
        record would otherwise break detection on every poll, or silently switch a judgement off."""
        if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
            raise ValueError(f"not an rnic-exporter state file (format {_field(data, 'format')!r})")
        if data.get("version") != STATE_VERSION:
            raise ValueError(f"state version {_field(data, 'version')!r}, this exporter reads {STATE_VERSION}")
        unknown = sorted(set(data) - _TOP_LEVEL)
        if unknown:
            raise ValueError(f"unknown top-level key {unknown[0][:40]!r}")
        return cls(
            devices={
                _rekeyed(k, known): known
                for k, v in _table("devices", data.get("devices")).items()
                for known in (KnownDevice(**_record(f"devices.{k}", v, _DEVICE_FIELDS)),)
            },
            baselines={
                k: Baseline(**_record(f"baselines.{k}", v, _BASELINE_FIELDS))
                for k, v in _table("baselines", data.get("baselines")).items()
            },
            addresses={
                k: {
                    a: KnownAddress(**_record(f"addresses.{k}.{a}", r, _ADDRESS_FIELDS))
                    for a, r in _table(f"addresses.{k}", v).items()
                }
                for k, v in _table("addresses", data.get("addresses")).items()
            },
        )


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a state file holds")


def _one_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


def _field(data: Any, name: str) -> Any:
    return data.get(name) if isinstance(data, dict) else type(data).__name__


# -- the schema: one checker per field; each returns the value or raises ValueError ---------------

Check = Callable[[str, Any], Any]
_MAX_TIME = 1e11  # seconds since the epoch: year 5138; beyond is no clock reading
# 12 lanes of XDR are 2.4 Tb/s = 3e11 B/s: a baseline a thousand times that is no measurement.
_MAX_RATE = 3e14
_MAX_LANES = 32
_MAX_GID_INDEX = 1 << 16


def _text(where: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected a string, got {_kind(value)}")
    return value


def _optional_text(where: str, value: Any) -> str | None:
    return None if value is None else _text(where, value)


def _number(where: str, value: Any, low: float, high: float, *, exclusive_low: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where}: expected a number, got {_kind(value)}")
    if isinstance(value, int) and not -(1 << 63) <= value < (1 << 63):
        raise ValueError(f"{where}: {str(value)[:20]}... is out of range")
    number = float(value)
    if not math.isfinite(number) or number < low or number > high or (exclusive_low and number == low):
        raise ValueError(f"{where}: {value!r} is not within {low:g}..{high:g}")
    return number


def _time(where: str, value: Any) -> float:
    return _number(where, value, 0.0, _MAX_TIME)


def _rate(where: str, value: Any) -> float:
    return _number(where, value, 0.0, _MAX_RATE, exclusive_low=True)


def _integer(where: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: expected an integer, got {_kind(value)}")
    if not low <= value <= high:
        raise ValueError(f"{where}: {str(value)[:20]} is not within {low}..{high}")
    return value


def _lanes(where: str, value: Any) -> int:
    return _integer(where, value, 1, _MAX_LANES)


def _gid_index(where: str, value: Any) -> int | None:
    return None if value is None else _integer(where, value, 0, _MAX_GID_INDEX)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


_TOP_LEVEL = frozenset({"format", "version", "devices", "baselines", "addresses"})
# field -> (checker, required)
_DEVICE_FIELDS: Mapping[str, tuple[Check, bool]] = {
    "name": (_text, True),
    "pci_address": (_optional_text, True),
    "node_guid": (_optional_text, False),
    "hca_type": (_optional_text, False),
    "board_id": (_optional_text, False),
    "first_seen": (_time, False),
    "last_seen": (_time, False),
}
_BASELINE_FIELDS: Mapping[str, tuple[Check, bool]] = {
    "rate_bytes_per_second": (_rate, True),
    "lanes": (_lanes, True),
}
_ADDRESS_FIELDS: Mapping[str, tuple[Check, bool]] = {
    "netdev": (_text, True),
    "last_seen": (_time, True),
    "v2_index": (_gid_index, False),
}


def _table(where: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected a table, got {_kind(value)}")
    return value


def _record(where: str, value: Any, fields: Mapping[str, tuple[Check, bool]]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected a table, got {_kind(value)}")
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise ValueError(f"{where}: unknown field {unknown[0]!r}")
    out = {}
    for name, (check, required) in fields.items():
        if name not in value:
            if required:
                raise ValueError(f"{where}: {name} is missing")
            continue
        out[name] = check(f"{where}.{name}", value[name])
    return out


@dataclass(frozen=True, slots=True)
class LoadResult:
    state: State
    problem: str | None = None  # why the file was rebuilt; None when it loaded or did not exist
    reason: str | None = None  # low-cardinality label: corrupt | foreign | unreadable


class StateFileError(ValueError):
    """Why a state file's bytes are not a state; `reason` is the label (corrupt | foreign)."""

    def __init__(self, problem: str, reason: str) -> None:
        super().__init__(problem)
        self.reason = reason


def decode_state(raw: bytes) -> State:
    """The state in a file's bytes, or StateFileError saying why not (one line); nothing else escapes."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StateFileError(f"corrupt (not UTF-8 at byte {exc.start})", "corrupt") from None
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise StateFileError(f"corrupt ({exc.msg} at line {exc.lineno})", "corrupt") from None
    except (ValueError, RecursionError) as exc:  # NaN/Infinity, numbers beyond int(), nesting
        raise StateFileError(f"corrupt ({_one_line(exc)})", "corrupt") from None
    try:
        return State.from_json(data)
    except ValueError as exc:
        reason = "corrupt" if isinstance(data, dict) and data.get("format") == STATE_FORMAT else "foreign"
        raise StateFileError(_one_line(exc), reason) from None


class StateWithheldError(OSError):
    """The state file exists but could not be read: saving would overwrite what it holds."""


def merge(base: State, learned: State) -> State:
    """`base` (a file read late) with what `learned` knows that it does not: devices and addresses it
    lacks, and the better of two baselines. Used when an unreadable file reads again."""
    devices = {**learned.devices, **base.devices}
    baselines = dict(base.baselines)
    for key, best in learned.baselines.items():
        have = baselines.get(key)
        if have is None or (best.rate_bytes_per_second, best.lanes) > (have.rate_bytes_per_second, have.lanes):
            baselines[key] = best
    addresses = {key: dict(seen) for key, seen in base.addresses.items()}
    for key, seen in learned.addresses.items():
        for address, known in seen.items():
            addresses.setdefault(key, {}).setdefault(address, known)
    return State(devices, baselines, addresses)


class StateStore:
    """Loads and saves the state file in `directory`; `None` keeps state in memory only.

    `read_only` (the `check` command, a job prologue's diagnosis): a corrupt or foreign file is
    reported and left where it is for the daemon, which owns it, to move aside."""

    def __init__(self, directory: Path | None, *, read_only: bool = False) -> None:
        self.directory = directory
        self.read_only = read_only
        self._last_written: str | None = None
        # Why saving is held back: the file exists but could not be read (see load); None otherwise.
        self.withheld: str | None = None

    @property
    def path(self) -> Path | None:
        return None if self.directory is None else self.directory / STATE_FILE

    def load(self) -> LoadResult:
        path = self.path
        if path is None:
            return LoadResult(State())
        try:
            with path.open("rb") as file:
                size = os.fstat(file.fileno()).st_size
                raw = file.read(MAX_STATE_BYTES + 1)  # never more than the bound into memory
        except (FileNotFoundError, NotADirectoryError):  # no such file (ENOTDIR: nor can there be)
            self.withheld = None
            return LoadResult(State())
        except OSError as exc:
            # A read error is not "no file": the inventory and baselines are still in it (EACCES, EIO,
            # a directory in its place), so it is not written over until it reads again.
            self.withheld = f"cannot read {path}: {exc.strerror or type(exc).__name__}"
            return LoadResult(
                State(),
                f"{self.withheld}; judged without its inventory, and not written over until it reads again",
                "unreadable",
            )
        self.withheld = None
        if len(raw) > MAX_STATE_BYTES:
            size_text = f"{max(size, len(raw))} bytes"
            why = f"over the {MAX_STATE_BYTES >> 20} MiB a state file of this exporter holds"
            return self._rebuild(path, f"{path}: {size_text}, {why}", "corrupt")
        try:
            state = decode_state(raw)
        except StateFileError as exc:
            return self._rebuild(path, f"{path}: {exc}", exc.reason)
        self._last_written = raw.decode("utf-8")
        return LoadResult(state)

    def _rebuild(self, path: Path, problem: str, reason: str) -> LoadResult:
        if self.read_only:
            return LoadResult(State(), problem + "; left in place (judged without its inventory)", reason)
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
        if self.withheld is not None:
            raise StateWithheldError(self.withheld)
        # One line, no indent: only then does json use its C encoder. The indenting one is pure
        # Python whose closures form a reference cycle on every call; saved on most polls of a
        # churning host, those outlived the young generations and held ~4 MB an hour until a full
        # collection (bench/soak.py --memtrace-census). `jq . state.json` reads it.
        text = json.dumps(state.to_json(), sort_keys=True) + "\n"
        if text == self._last_written:
            return
        if len(text) > MAX_STATE_BYTES:  # never write what load would refuse
            raise OSError(errno.EFBIG, f"the state is {len(text)} bytes, over {MAX_STATE_BYTES >> 20} MiB")
        path.parent.mkdir(parents=True, exist_ok=True)
        # A name of its own (O_EXCL, random): two containers are both PID 1, so a pid is not unique.
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        tmp = Path(tmp_name)
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


_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY


class StateLock:
    """An exclusive `flock` on `<dir>/state.lock`, held by the one daemon that owns the directory.

    Two daemons writing one state file overwrite each other's inventory, so the second one must
    not start: `acquire` raises ConfigError (one line, exit 2) naming the holder, whose pid and
    host name are in the lock file. The kernel drops the lock when the holder dies, so a stale
    file never blocks. `check` only reads the file and takes no lock.
    """

    def __init__(self, fd: int | None) -> None:
        self._fd = fd
        self.problem: str | None = None  # the lock is held but its file could not be written

    @classmethod
    def acquire(cls, directory: Path | None) -> StateLock:
        if directory is None:
            return cls(None)
        path = directory / LOCK_FILE
        try:
            directory.mkdir(parents=True, exist_ok=True)
            # Never through a link (whoever can write the directory could point it at any file, and
            # the pid line below would overwrite it), never blocking on a FIFO put in its place.
            fd = os.open(path, _LOCK_FLAGS, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ConfigError(_not_ours(path, "a symbolic link")) from None
            # A read-only state dir: saving will fail and be counted; reading goes on.
            log.warning("state directory not locked", extra={"fields": {"path": str(path), "err": exc.strerror}})
            return cls(None)
        refused = _foreign(fd)
        if refused is not None:
            os.close(fd)
            raise ConfigError(_not_ours(path, refused))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _holder(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise ConfigError(
                    f"--state.dir {directory} is in use by another rnic-exporter ({holder}); "
                    "give each daemon its own state directory"
                ) from None
            log.warning("state directory not locked", extra={"fields": {"path": str(path), "err": exc.strerror}})
            return cls(None)
        lock = cls(fd)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        except OSError as exc:
            # A full disk (ENOSPC) or quota: the flock is held all the same, only the holder's name
            # is missing; the state is optional for serving, so this is logged and counted, not fatal.
            lock.problem = f"cannot write {path}: {exc.strerror or exc}"
            log.warning(
                "state lock held without its holder line", extra={"fields": {"path": str(path), "err": lock.problem}}
            )
        return lock

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the last descriptor drops the flock

    def __del__(self) -> None:
        self.release()


def _foreign(fd: int) -> str | None:
    """Why the opened lock file is not one this exporter may truncate, None when it is: a regular
    file of our user with no other name (a hard link would make the truncation reach its target)."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if info.st_uid != os.geteuid():
        return f"owned by uid {info.st_uid}, not this exporter's {os.geteuid()}"
    if info.st_nlink != 1:
        return f"a file with {info.st_nlink} names (a hard link)"
    return None


def _not_ours(path: Path, why: str) -> str:
    return (
        f"refusing to use {path}: it is {why}, not a lock file this exporter created; "
        "remove it (and check who can write the state directory)"
    )


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text.splitlines()[0] if text else "holder unknown"
