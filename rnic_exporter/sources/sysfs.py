"""The one place that touches the sysfs mount: reading attributes, listing, resolving links.

No reader spells `/sys`; every path is relative to a `SysfsRoot`, so tests and the simulator pass
their own tree (`--path.sysfs`).
"""

from __future__ import annotations

import errno
import os
import resource
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from rnic_exporter.errors import ConfigError
from rnic_exporter.model import ReadError
from rnic_exporter.sources.availability import NO_PMA_READ, is_no_pma

T = TypeVar("T")

# The driver or kernel does not have this attribute at all: "not exposed", not a fault.
NOT_EXPOSED = frozenset({errno.ENOENT, errno.EOPNOTSUPP})

# sysfs attributes are at most one page; st_size always says 4096, so never trust it.
_PAGE = 4096
# Nearly every value fits in this; asking for a page makes Python allocate and shrink 4 KiB per
# read. A read that fills it is repeated with a page (the kernel regenerates the value at offset 0).
_FIRST = 128

# A batch read's outcome for one attribute: its bytes, or the errno the read failed with.
Raw = bytes | int


class MalformedValueError(ValueError):
    """A parser's complaint about a sysfs value; the message becomes the ReadError reason."""


def raise_open_file_limit() -> None:
    """Held descriptors number about 340 per RNIC with 255-slot GID tables, and systemd gives a
    service a soft limit of 1024: lift the soft limit to the hard one, as Go's runtime does for
    node_exporter. Without it a 16-RNIC host reads every attribute past the 1024th as EMFILE."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = hard if hard != resource.RLIM_INFINITY else 1 << 20
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        pass  # a container may forbid it; reads past the limit then report EMFILE


class ReadBatch:
    """Attributes read together every poll; keeps their held descriptors in a list, so a poll does
    not look each one up by path (a quarter of a pass over warm page cache)."""

    __slots__ = ("fds", "generation", "rels")

    def __init__(self, rels: list[str]) -> None:
        self.rels = rels  # may grow until the first read
        self.fds: list[int] = []
        self.generation = -1  # the root's descriptor generation `fds` was taken at


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
        if hold_fds:
            raise_open_file_limit()
        self.errno_overlay: Mapping[str, int] = errno_overlay if errno_overlay is not None else {}
        self._fds: dict[str, int] = {}
        self._generation = 0  # bumped whenever a held descriptor is closed: batches look theirs up again
        self.reads = 0  # attribute reads issued, for the benchmark

    def _check_overlay(self, rel: str) -> None:
        code = self.errno_overlay.get(rel)
        if code is not None:
            raise OSError(code, os.strerror(code), str(self.mount / rel))

    def read_text(self, rel: str) -> str:
        """The attribute's value without its one trailing newline. Raises OSError."""
        return decode(self.read_bytes(rel))

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

    def read_many(self, rels: Sequence[str]) -> list[Raw]:
        """Each attribute's raw bytes, or the errno its read failed with, in one tight pass.

        With held descriptors this is one `pread` per attribute and no Python object per read
        beyond the bytes. A subclass that overrides `read_bytes` (a test's fault injector) still
        sees every read.
        """
        return self.read_batch(ReadBatch(list(rels)))

    def read_batch(self, batch: ReadBatch) -> list[Raw]:
        """`read_many` of the batch's attributes, through the descriptors it remembers."""
        rels = batch.rels
        if not self.hold_fds or type(self).read_bytes is not SysfsRoot.read_bytes:
            return [self._read_or_errno(rel) for rel in rels]
        if batch.generation != self._generation or len(batch.fds) != len(rels):
            held = self._fds
            batch.fds = [held.get(rel, -1) for rel in rels]
            batch.generation = self._generation
        self.reads += len(rels)
        overlay = self.errno_overlay  # empty outside tests; kept in this loop so tests exercise it
        fds = batch.fds
        pread = os.pread
        out: list[Raw] = []
        append = out.append
        for i, known in enumerate(fds):
            if overlay and rels[i] in overlay:
                append(overlay[rels[i]])
                continue
            try:
                fd = known if known >= 0 else self._hold(rels[i])
                fds[i] = fd
                data = pread(fd, _FIRST, 0)
                if len(data) == _FIRST:
                    data = pread(fd, _PAGE, 0)
            except OSError as exc:
                self._drop(rels[i])
                append(exc.errno or -1)
                continue
            append(data)
        return out

    def _hold(self, rel: str) -> int:
        fd = self._fds.get(rel)
        if fd is None:
            fd = self._fds[rel] = os.open(self._mount_str + rel, os.O_RDONLY | os.O_CLOEXEC)
        return fd

    def _read_or_errno(self, rel: str) -> Raw:
        try:
            return self.read_bytes(rel)
        except OSError as exc:
            return exc.errno or -1

    def listdir(self, rel: str) -> list[str]:
        if self.errno_overlay:
            self._check_overlay(rel)
        return os.listdir(self._mount_str + rel)

    def identity(self, rel: str) -> tuple[int, int] | None:
        """(inode, ctime) of what `rel` leads to, None when it is gone: a re-registered device or
        re-created netdev gets a new kernfs node, so this changes although the name does not."""
        try:
            st = os.stat(self._mount_str + rel)
        except OSError:
            return None
        return st.st_ino, st.st_ctime_ns

    def exists(self, rel: str) -> bool:
        return os.path.lexists(self.mount / rel)

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
            self._generation += 1

    def close(self) -> None:
        self.forget("")

    @property
    def held_fds(self) -> int:
        return len(self._fds)


def errno_reason(exc: OSError) -> str:
    if exc.errno is not None and exc.errno in errno.errorcode:
        return errno.errorcode[exc.errno]
    return type(exc).__name__


def errno_name(code: int) -> str:
    return errno.errorcode.get(code, "OSError")


def decode(raw: bytes) -> str:
    """The attribute's text without its one trailing newline."""
    text = raw.decode("utf-8", errors="replace")
    return text[:-1] if text.endswith("\n") else text


def interpret(raw: Raw, parse: Callable[[str], T], quiet: frozenset[int]) -> tuple[T | None, str | None]:
    """(value, None), or (None, ReadError reason); an errno in `quiet` is (None, None): no value, no fault."""
    if isinstance(raw, int):
        return None, (None if raw in quiet else errno_name(raw))
    try:
        return parse(decode(raw)), None
    except ValueError as exc:
        if is_no_pma(decode(raw)):  # the kernel's own text for a PMA that does not answer: see availability
            return None, NO_PMA_READ
        return None, f"malformed: {exc}"


def quiet_errnos(optional: bool = False, expected: frozenset[int] = frozenset()) -> frozenset[int]:
    """`optional`: a missing file means the driver does not expose it. `expected`: errnos that carry
    a meaning for this file (EINVAL on `speed` of an admin-down netdev), so they are no fault."""
    return expected | NOT_EXPOSED if optional else expected


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
        value, reason = interpret(self.root._read_or_errno(f"{base}/{attribute}"), parse,
                                  quiet_errnos(optional, expected))
        if reason is not None:
            self.add(device, port, label_prefix + attribute, reason)
        return value

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

