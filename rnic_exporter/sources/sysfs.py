"""The one place that touches the sysfs mount: reading attributes, listing, resolving links.

No reader spells `/sys`; every path is relative to a `SysfsRoot`, so tests and the simulator pass
their own tree (`--path.sysfs`).
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import threading
import weakref
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TypeVar, cast

from rnic_exporter.errors import ConfigError
from rnic_exporter.model.host import ReadError
from rnic_exporter.sources.availability import EMPTY_READ, NO_PMA_READ, is_no_pma
from rnic_exporter.sources.read_thread import progress

T = TypeVar("T")
log = logging.getLogger("rnic_exporter.sources")

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


class EmptyValueError(MalformedValueError):
    """A free-text attribute that is an empty line: the driver has no value for it (availability's
    `empty`), which is unsupported when it holds from the first read and a failure after a value."""


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

    __slots__ = ("complete", "fds", "generation", "rels")

    def __init__(self, rels: list[str]) -> None:
        self.rels = rels  # may grow until the first read
        self.fds: list[int] = []
        self.generation = -1  # the cache's descriptor generation `fds` was taken at
        self.complete = False  # every descriptor in `fds` is held


class SysfsRoot:
    """A sysfs mount (`/sys`, or a captured or simulated tree).

    The root itself holds nothing: one-shot reads open, read and close. Descriptors are held by an
    `FdCache`, one per owner (a device registration), when `hold_fds` is set.
    """

    def __init__(self, mount: Path | str, *, hold_fds: bool = False) -> None:
        self.mount = Path(mount)
        self._mount_str = f"{self.mount}/"
        if not self.mount.is_dir():
            raise ConfigError(f"--path.sysfs {self.mount} is not a directory; point it at the host's sysfs mount")
        self.hold_fds = hold_fds
        if hold_fds:
            raise_open_file_limit()
        self.limited = False  # the descriptor limit was hit: GID files are no longer held
        self._caches: weakref.WeakSet[FdCache] = weakref.WeakSet()
        self._caches_lock = threading.Lock()
        self._reads = 0  # one-shot reads; each cache counts its own

    def descriptor_limit_hit(self) -> None:
        """Say so once, and from now on read GID table files (most of what is held) without holding them."""
        with self._caches_lock:
            first, self.limited = not self.limited, True
        if first:
            log.warning(
                "the open-file limit is below what holding every sysfs descriptor needs; GID table "
                "files are read without holding descriptors from now on (raise LimitNOFILE to avoid "
                "the cost)",
                extra={"fields": {"held": self.held_fds, "limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}},
            )

    def cache(self) -> FdCache:
        """A new set of held descriptors for one owner."""
        cache = FdCache(self)
        self._register(cache)
        return cache

    def _register(self, cache: FdCache) -> None:
        with self._caches_lock:
            self._caches.add(cache)

    def read_text(self, rel: str) -> str:
        """The attribute's value without its one trailing newline. Raises OSError."""
        return decode(self.read_bytes(rel))

    def read_bytes(self, rel: str) -> bytes:
        """The attribute's raw bytes in one read (open, read, close). Raises OSError."""
        self._reads += 1
        fd = os.open(self._mount_str + rel, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return os.read(fd, _PAGE)
        finally:
            os.close(fd)

    def read_many(self, rels: Sequence[str]) -> list[Raw]:
        """Each attribute's raw bytes, or the errno its read failed with (one-shot reads)."""
        return [self._read_or_errno(rel) for rel in rels]

    def _read_or_errno(self, rel: str) -> Raw:
        try:
            return self.read_bytes(rel)
        except OSError as exc:
            return exc.errno or -1

    def listdir(self, rel: str) -> list[str]:
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

    def _live_caches(self) -> list[FdCache]:
        with self._caches_lock:
            return list(self._caches)

    @property
    def reads(self) -> int:
        """Attribute reads issued (one-shot and through every cache), for the benchmark and tests."""
        return self._reads + sum(c.reads for c in self._live_caches())

    @property
    def held_fds(self) -> int:
        return sum(c.held for c in self._live_caches())

    def holds(self, rel: str) -> bool:
        """Some cache holds a descriptor of `rel`."""
        return any(c.holds(rel) for c in self._live_caches())

    def close(self) -> None:
        """Close every cache's descriptors; only at exit, when no read of them can be under way."""
        for cache in self._live_caches():
            cache.close()


class FdCache:
    """The held descriptors of one owner (one device registration).

    Only the thread reading that owner touches them (the reader's per-device lock), so a
    descriptor is never closed while another thread may be blocked reading it: the number could
    be reused by the next open, and that read would then return another file's bytes. Owners
    never share descriptors, even for a file both read (an upstream PCIe port).

    Attributes are re-read with `os.pread`: the kernel regenerates the value at offset 0 on each
    pread, at a fifth of the cost of open+read+close. A held descriptor of a removed device fails
    with ENODEV/ENOENT; it is closed then, and the next read reopens.
    """

    __slots__ = ("__weakref__", "_closed", "_fds", "_generation", "_shed", "reads", "root")

    def __init__(self, root: SysfsRoot) -> None:
        self.root = root
        self._closed = False
        self._fds: dict[str, int] = {}
        self._generation = 0  # bumped whenever a held descriptor is closed: batches look theirs up again
        self._shed = False
        self.reads = 0

    @property
    def mount(self) -> Path:
        return self.root.mount

    @property
    def held(self) -> int:
        return len(self._fds)

    def holds(self, rel: str) -> bool:
        return rel in self._fds

    def listdir(self, rel: str) -> list[str]:
        return self.root.listdir(rel)

    def identity(self, rel: str) -> tuple[int, int] | None:
        return self.root.identity(rel)

    def exists(self, rel: str) -> bool:
        return self.root.exists(rel)

    def realpath(self, rel: str) -> str:
        return self.root.realpath(rel)

    def _read_or_errno(self, rel: str) -> Raw:
        return self.read_many((rel,))[0]

    def read_many(self, rels: Sequence[str]) -> list[Raw]:
        return self.read_batch(ReadBatch(list(rels)))

    def read_batch(self, batch: ReadBatch, skip: Collection[int] = ()) -> list[Raw]:
        """Each attribute's raw bytes, or the errno its read failed with, in one tight pass: one
        `pread` per attribute and no Python object per read beyond the bytes. Indices in `skip`
        are not read (backed-off attributes) and answer EAGAIN."""
        progress()  # to a read worker's deadline (sources/read_thread.py): the last batch answered
        rels = batch.rels
        root = self.root
        if root.limited and not self._shed:
            self.shed()  # each cache sheds on its own next read, under its own device's lock
        if not root.hold_fds:
            self.reads += len(rels) - len(skip)
            return [errno.EAGAIN if skip and i in skip else root._read_or_errno(rel) for i, rel in enumerate(rels)]
        if batch.generation != self._generation or len(batch.fds) != len(rels):
            held = self._fds
            batch.fds = [held.get(rel, -1) for rel in rels]
            batch.generation = self._generation
            batch.complete = False
        self.reads += len(rels) - len(skip)
        fds = batch.fds
        pread = os.pread
        if not skip and batch.complete:
            # Every descriptor held, nothing to skip: the usual pass, one comprehension. A failure
            # (a device going away) falls through to the loop below, which sorts it out per file.
            try:
                fast = [pread(fd, _FIRST, 0) for fd in fds]
                if max(map(len, fast), default=0) >= _FIRST:
                    fast = [pread(fd, _PAGE, 0) if len(d) == _FIRST else d for fd, d in zip(fds, fast, strict=True)]
            except OSError:
                batch.complete = False
            else:
                return cast(list[Raw], fast)
        out: list[Raw] = []
        append = out.append
        for i, known in enumerate(fds):
            if not i & 31 and i:
                progress()  # this path opens files (a new registration: hundreds, each a lookup)
            if skip and i in skip:
                append(errno.EAGAIN)
                continue
            try:
                fd = known if known >= 0 else self._hold(rels[i])
                if fd < 0:  # not held (over the descriptor limit): one open-read-close
                    append(root._read_or_errno(rels[i]))
                    continue
                fds[i] = fd
                data = pread(fd, _FIRST, 0)
                if len(data) == _FIRST:
                    data = pread(fd, _PAGE, 0)
            except OSError as exc:
                self._drop(rels[i])
                if exc.errno in _OUT_OF_DESCRIPTORS:
                    root.descriptor_limit_hit()
                    self.shed()
                    append(root._read_or_errno(rels[i]))
                    continue
                append(exc.errno or -1)
                continue
            append(data)
        batch.complete = batch.generation == self._generation and min(fds, default=0) >= 0
        return out

    def shed(self) -> None:
        """Close the held descriptors of GID table files: they are most of what a device holds."""
        self._shed = True
        for rel in [r for r in self._fds if _unheld_when_limited(r)]:
            self._drop(rel)

    def _hold(self, rel: str) -> int:
        """The held descriptor of `rel`, opened now if need be; -1 when it is not to be held."""
        fd = self._fds.get(rel)
        if fd is None:
            if self._closed or (self.root.limited and _unheld_when_limited(rel)):
                return -1
            fd = self._fds[rel] = os.open(self.root._mount_str + rel, os.O_RDONLY | os.O_CLOEXEC)
        return fd

    def forget(self, prefix: str) -> None:
        """Close held descriptors under `prefix` (a netdev that went or was re-created)."""
        for rel in [r for r in self._fds if r.startswith(prefix)]:
            self._drop(rel)

    def _drop(self, rel: str) -> None:
        fd = self._fds.pop(rel, None)
        if fd is not None:
            os.close(fd)
            self._generation += 1

    def close(self) -> None:
        """Close every held descriptor, for good: a job of a retired registration still queued
        behind a hung read (a counter pass) reads without holding. It used to reopen its files
        into a cache nobody would close again (the hung-read soak leaked 49 descriptors twice)."""
        self._closed = True
        self.forget("")


_OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE})


def _unheld_when_limited(rel: str) -> bool:
    return "/gids/" in rel or "/gid_attrs/" in rel


# What the readers read through: the root (one-shot reads) or a device's held descriptors.
Tree = SysfsRoot | FdCache


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
    except EmptyValueError:
        return None, EMPTY_READ
    except ValueError as exc:
        if is_no_pma(decode(raw)):  # the kernel's own text for a PMA that does not answer: see availability
            return None, NO_PMA_READ
        return None, f"malformed: {exc}"


class ErrorLog:
    """Reads one attribute at a time and turns every failure into a `ReadError`.

    `read` never raises: an OSError or a parser's ValueError costs that one attribute.
    """

    def __init__(self, root: Tree) -> None:
        self.root = root
        self.errors: list[ReadError] = []

    def add(self, device: str, port: int | None, attribute: str, reason: str) -> None:
        self.errors.append(ReadError(device, port, attribute, reason))

    def read(
        self, base: str, attribute: str, parse: Callable[[str], T], *, device: str, port: int | None = None
    ) -> T | None:
        """Read `base/attribute` and parse it; a failure is recorded and gives None."""
        value, reason = interpret(self.root._read_or_errno(f"{base}/{attribute}"), parse, frozenset())
        if reason is not None:
            self.add(device, port, attribute, reason)
        return value

    def listdir(
        self, rel: str, *, device: str, port: int | None = None, attribute: str, optional: bool = False
    ) -> list[str]:
        try:
            return self.root.listdir(rel)
        except OSError as exc:
            if optional and exc.errno in NOT_EXPOSED:
                return []
            self.add(device, port, attribute, errno_reason(exc))
            return []

    def numbered_entries(
        self, rel: str, *, device: str, port: int | None, attribute: str, what: str, optional: bool = False
    ) -> list[int]:
        """Sorted numeric entries of a directory (`ports/`, `gids/`); any other name is recorded."""
        numbers = []
        for entry in self.listdir(rel, device=device, port=port, attribute=attribute, optional=optional):
            if entry.isdigit():
                numbers.append(int(entry))
            else:
                self.add(device, port, f"{attribute}/{entry}", f"malformed: not a {what}")
        return sorted(numbers)
