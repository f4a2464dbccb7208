"""The one place that touches the sysfs mount: reading attributes, listing, resolving links.

No reader spells `/sys`; every path is relative to a `SysfsRoot`, so tests and the simulator pass
their own tree (`--path.sysfs`).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from rnic_exporter.errors import ConfigError
from rnic_exporter.model import ReadError

T = TypeVar("T")

# The driver or kernel does not have this attribute at all: "not exposed", not a fault.
NOT_EXPOSED = frozenset({errno.ENOENT, errno.EOPNOTSUPP})

# sysfs attributes are at most one page; st_size always says 4096, so never trust it.
_PAGE = 4096


class MalformedValueError(ValueError):
    """A parser's complaint about a sysfs value; the message becomes the ReadError reason."""


class SysfsRoot:
    """A sysfs mount (`/sys`, or a captured or simulated tree).

    Attributes are re-read with `os.pread` on a held file descriptor when `hold_fds` is set: the
    kernel regenerates the value at offset 0 on each pread, at a fifth of the cost of
    open+read+close. A held descriptor of a removed device fails with ENODEV/ENOENT; the caller
    then calls `forget` for that device and the next read reopens.

    `errno_overlay` maps relative paths to the errno a read should fail with. It exists because a
    plain file cannot answer EINVAL the way `gid_attrs/types/<i>` of an empty GID slot does; the
    simulator fills it for in-process use. It is never loaded from the tree itself.
    """

    def __init__(
        self,
        mount: Path | str,
        *,
        hold_fds: bool = False,
        errno_overlay: Mapping[str, int] | None = None,
    ) -> None:
        self.mount = Path(mount)
        self._mount_str = f"{self.mount}/"
        if not self.mount.is_dir():
            raise ConfigError(
                f"--path.sysfs {self.mount} is not a directory; point it at the host's sysfs mount"
            )
        self.hold_fds = hold_fds
        self.errno_overlay: Mapping[str, int] = errno_overlay if errno_overlay is not None else {}
        self._fds: dict[str, int] = {}
        self.reads = 0  # attribute reads issued, for the benchmark

    def path(self, rel: str) -> Path:
        return self.mount / rel

    def _check_overlay(self, rel: str) -> None:
        code = self.errno_overlay.get(rel)
        if code is not None:
            raise OSError(code, os.strerror(code), str(self.mount / rel))

    def read_text(self, rel: str) -> str:
        """The attribute's value without its one trailing newline. Raises OSError."""
        text = self.read_bytes(rel).decode("utf-8", errors="replace")
        return text[:-1] if text.endswith("\n") else text

    def read_bytes(self, rel: str) -> bytes:
        """The attribute's raw bytes in one read. Raises OSError."""
        self.reads += 1
        if self.errno_overlay:
            self._check_overlay(rel)
        if self.hold_fds:
            fd = self._fds.get(rel)
            if fd is None:
                fd = os.open(self._mount_str + rel, os.O_RDONLY | os.O_CLOEXEC)
                self._fds[rel] = fd
            try:
                data = os.pread(fd, _PAGE, 0)
            except OSError:
                self._drop(rel)
                raise
        else:
            fd = os.open(self.mount / rel, os.O_RDONLY | os.O_CLOEXEC)
            try:
                data = os.read(fd, _PAGE)
            finally:
                os.close(fd)
        return data

    def listdir(self, rel: str) -> list[str]:
        if self.errno_overlay:
            self._check_overlay(rel)
        return os.listdir(self.mount / rel)

    def exists(self, rel: str) -> bool:
        return os.path.lexists(self.mount / rel)

    def is_dir(self, rel: str) -> bool:
        return os.path.isdir(self.mount / rel)

    def realpath(self, rel: str) -> str:
        """The link's target resolved inside the mount; raises OSError (EINVAL if not a link)."""
        os.readlink(self.mount / rel)  # a plain file where a link belongs is EINVAL, not a path
        return os.path.realpath(self.mount / rel)

    def forget(self, prefix: str) -> None:
        """Close held descriptors under `prefix` (a device that vanished or was re-registered)."""
        for rel in [r for r in self._fds if r.startswith(prefix)]:
            self._drop(rel)

    def _drop(self, rel: str) -> None:
        fd = self._fds.pop(rel, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        self.forget("")

    @property
    def held_fds(self) -> int:
        return len(self._fds)


def errno_reason(exc: OSError) -> str:
    if exc.errno is not None and exc.errno in errno.errorcode:
        return errno.errorcode[exc.errno]
    return type(exc).__name__


class ErrorLog:
    """Reads one attribute at a time and turns every failure into a `ReadError`.

    `read` never raises: an OSError or a parser's ValueError costs that one attribute.
    """

    def __init__(self, root: SysfsRoot) -> None:
        self.root = root
        self.errors: list[ReadError] = []

    def add(self, device: str, port: int | None, attribute: str, reason: str) -> None:
        self.errors.append(ReadError(device, port, attribute, reason))

    def read(
        self,
        base: str,
        attribute: str,
        parse: Callable[[str], T],
        *,
        device: str,
        port: int | None = None,
        optional: bool = False,
        expected: frozenset[int] = frozenset(),
        label_prefix: str = "",
    ) -> T | None:
        """Read `base/attribute` and parse it.

        `optional`: a missing file means the driver does not expose it (no error).
        `expected`: errnos that carry a meaning for this file (EINVAL on `speed` of an admin-down
        netdev) and are therefore not faults.
        """
        try:
            text = self.root.read_text(f"{base}/{attribute}")
        except OSError as exc:
            code = exc.errno
            if code in expected or (optional and code in NOT_EXPOSED):
                return None
            self.add(device, port, label_prefix + attribute, errno_reason(exc))
            return None
        try:
            return parse(text)
        except ValueError as exc:
            self.add(device, port, label_prefix + attribute, f"malformed: {exc}")
            return None

    def listdir(self, rel: str, *, device: str, port: int | None = None, attribute: str,
                optional: bool = False) -> list[str]:
        try:
            return self.root.listdir(rel)
        except OSError as exc:
            if optional and exc.errno in NOT_EXPOSED:
                return []
            self.add(device, port, attribute, errno_reason(exc))
            return []

    def numbered_entries(self, rel: str, *, device: str, port: int | None, attribute: str, what: str,
                         optional: bool = False) -> list[int]:
        """Sorted numeric entries of a directory (`ports/`, `gids/`); any other name is recorded."""
        numbers = []
        for entry in self.listdir(rel, device=device, port=port, attribute=attribute, optional=optional):
            if entry.isdigit():
                numbers.append(int(entry))
            else:
                self.add(device, port, f"{attribute}/{entry}", f"malformed: not a {what}")
        return sorted(numbers)

