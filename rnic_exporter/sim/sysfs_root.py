"""A `SysfsRoot` over a simulated tree that answers errnos where a plain file cannot.

On a real kernel `gid_attrs/{types,ndevs}/<i>` of an empty GID slot answer EINVAL; the simulator writes them
as empty files and lists them, with the faults it injects, in `SimHost.errno_overlay`. This root raises those
errnos, on one-shot reads and listings and on the held-descriptor batches alike, so the product's read loop
carries no test hook.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from pathlib import Path

from rnic_exporter.sources.sysfs import FdCache, Raw, ReadBatch, SysfsRoot


class SimSysfsRoot(SysfsRoot):
    """`SysfsRoot` whose reads of a path in `errno_overlay` fail with that errno.

    `errno_overlay` is the simulator's at the time it was taken (`SimHost.errno_overlay` is a copy): a root
    kept across changes of the host takes it again.
    """

    def __init__(
        self, mount: Path | str, *, hold_fds: bool = False, errno_overlay: Mapping[str, int] | None = None
    ) -> None:
        super().__init__(mount, hold_fds=hold_fds)
        self.errno_overlay: Mapping[str, int] = errno_overlay if errno_overlay is not None else {}

    def _check_overlay(self, rel: str) -> None:
        code = self.errno_overlay.get(rel)
        if code is not None:
            raise OSError(code, os.strerror(code), str(self.mount / rel))

    def read_bytes(self, rel: str) -> bytes:
        self._check_overlay(rel)
        return super().read_bytes(rel)

    def listdir(self, rel: str) -> list[str]:
        self._check_overlay(rel)
        return super().listdir(rel)

    def cache(self) -> FdCache:
        cache = SimFdCache(self)
        self._register(cache)
        return cache


class SimFdCache(FdCache):
    """Held descriptors, except for the overlay's paths: those answer their errno and are never opened."""

    __slots__ = ()

    def read_batch(self, batch: ReadBatch, skip: Collection[int] = ()) -> list[Raw]:
        root = self.root
        assert isinstance(root, SimSysfsRoot)
        overlay = root.errno_overlay
        failing = {i: overlay[rel] for i, rel in enumerate(batch.rels) if rel in overlay}
        if not failing:
            return super().read_batch(batch, skip)
        out = super().read_batch(batch, {*skip, *failing})
        self.reads += len([i for i in failing if i not in skip])  # a failed read is a read
        for i, code in failing.items():
            if i not in skip:
                out[i] = code
        return out
