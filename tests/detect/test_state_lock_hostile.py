"""The lock file is never opened through a link nor truncated when it is not ours, and one that
cannot be written (a full disk) is held all the same (issue 33, items 4 and 5)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from rnic_exporter.detect.state import (
    LOCK_FILE,
    StateLock,
)
from rnic_exporter.errors import ConfigError

# -- item 4: the lock file ----------------------------------------------------------------------


def test_the_lock_is_never_opened_through_a_symlink(tmp_path: Path) -> None:
    decoy = tmp_path / "decoy"
    decoy.write_text("precious\n")
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / LOCK_FILE).symlink_to(decoy)
    with pytest.raises(ConfigError, match=r"refusing to use .*state\.lock: it is a symbolic link"):
        StateLock.acquire(tmp_path / "state")
    assert decoy.read_text() == "precious\n"


def test_a_hard_linked_lock_is_not_truncated(tmp_path: Path) -> None:
    decoy = tmp_path / "decoy"
    decoy.write_text("precious\n")
    (tmp_path / "state").mkdir()
    os.link(decoy, tmp_path / "state" / LOCK_FILE)
    with pytest.raises(ConfigError, match="hard link"):
        StateLock.acquire(tmp_path / "state")
    assert decoy.read_text() == "precious\n"


def test_a_fifo_in_place_of_the_lock_is_refused_without_hanging(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    os.mkfifo(tmp_path / "state" / LOCK_FILE)
    with pytest.raises(ConfigError, match="not a regular file"):
        StateLock.acquire(tmp_path / "state")


# -- item 5: a full disk ------------------------------------------------------------------------


def test_a_lock_that_cannot_be_written_is_held_and_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", full)
    lock = StateLock.acquire(tmp_path / "state")
    try:
        assert lock.held and lock.problem is not None and "No space left on device" in lock.problem
        monkeypatch.undo()
        with pytest.raises(ConfigError, match="in use by another rnic-exporter"):
            StateLock.acquire(tmp_path / "state")
    finally:
        lock.release()
