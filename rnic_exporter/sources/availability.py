"""Unsupported or failed: why an attribute has no value, from a small documented set.

A driver that never provides an attribute is not broken: an iWARP port, an mlx4 virtual function or
a ConnectX-7 restricted function has a `counters/` directory whose every file answers
`N/A (no PMA)` (kernels before about 4.20) or EINVAL (later kernels), on a perfectly healthy port.
Such an attribute is *unsupported*: said once (`show`, an info metric, one log line), never a
`check` problem, never an alert. An attribute that was readable and stopped being so has *failed*
and keeps the full treatment (a warning, `rnic_attribute_unavailable`, the alert).

Unsupported, each only when it holds from the attribute's first read in this device registration:

- `absent`: the file did not exist (ENOENT) when the device registered; the driver does not create it.
- `no_pma`: a PMA counter reads `N/A (no PMA)`: the port's performance-management agent does not
  answer MADs, so the kernel prints this text instead of a number.
- `not_supported`: the read fails with EINVAL or EOPNOTSUPP: the driver's show handler refuses it
  (a PMA that does not answer on newer kernels, a rate width the core cannot name).
- `empty`: a free-text attribute reads as an empty line: the driver has no value for it. rxe, EFA and
  hns print `fw_ver` this way on healthy hosts (ib_core's `fw_ver_show` prints whatever the driver's
  `get_dev_fw_str` filled in, and these drivers fill in nothing or have no such callback).

Failed: anything else, keeping the reason it has today (the errno name, or `malformed`): EIO (a
firmware command failed), ETIMEDOUT (the firmware did not answer), ENODEV (the device went away under a
held descriptor), bytes that do not parse, and any unsupported symptom of an attribute that had been
read before (the PMA answered once, so its silence now is a fault).

Pure: the reading layer hands it the ReadErrors of a poll; one `FirstReads` per device registration
remembers which attributes have been unreadable since their first read.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from rnic_exporter.model.host import ReadError

ABSENT = "absent"
NO_PMA = "no_pma"
NOT_SUPPORTED = "not_supported"
EMPTY = "empty"

UNSUPPORTED_REASONS: Mapping[str, str] = MappingProxyType(
    {
        ABSENT: "the file does not exist: the driver does not provide it",
        NO_PMA: "reads 'N/A (no PMA)': the port's performance-management agent does not answer",
        NOT_SUPPORTED: "EINVAL or EOPNOTSUPP from the first read on: the driver does not implement it",
        EMPTY: "an empty line from the first read on: the driver has no value for it",
    }
)

# The kernel's text for a PMA that does not answer, and the ReadError reason the reader gives it
# (instead of "malformed": the bytes are what the kernel prints on purpose).
NO_PMA_TEXT = "N/A (no PMA)"
NO_PMA_READ = f"{NO_PMA}: {NO_PMA_TEXT}"
EMPTY_READ = f"{EMPTY}: the driver prints an empty line"

_SYMPTOMS: Mapping[str, str] = MappingProxyType(
    {
        errno.errorcode[errno.ENOENT]: ABSENT,
        errno.errorcode[errno.EINVAL]: NOT_SUPPORTED,
        "EOPNOTSUPP": NOT_SUPPORTED,
        "ENOTSUP": NOT_SUPPORTED,  # the same number on Linux; errno.errorcode names it either way
        NO_PMA: NO_PMA,
        EMPTY: EMPTY,
    }
)

# (port, attribute) as ReadErrors name them; unique within one device.
Key = tuple[int | None, str]


def is_no_pma(text: str) -> bool:
    """The counter text old kernels print when the PMA MAD fails (`show_pma_counter`)."""
    return text.startswith(NO_PMA_TEXT)


def symptom(error: ReadError) -> str | None:
    """The unsupported reason a read failure stands for when it holds from the first read on; None
    for one that is a failure whenever it happens (EIO, ETIMEDOUT, ENODEV, malformed...)."""
    return _SYMPTOMS.get(error.kind)


@dataclass(frozen=True, slots=True)
class Judged:
    failed: tuple[ReadError, ...]
    unsupported: tuple[ReadError, ...]  # reason `<unsupported reason>: <what was seen>`, kind the reason


_NOTHING = Judged((), ())


class FirstReads:
    """One device registration's memory of first reads (a re-registered device starts afresh:
    new firmware may answer what the old one did not)."""

    __slots__ = ("_seen", "_unsupported")

    def __init__(self) -> None:
        self._seen: set[Key] = set()  # attributes read at least once, successfully or not
        self._unsupported: set[Key] = set()  # unreadable, with an unsupported symptom, since their first read

    def judge(self, errors: Sequence[ReadError], read: Iterable[Key] = (), *, present: bool = True) -> Judged:
        """Split this poll's errors of one device. `read`: attributes read this poll for the first
        time whatever their outcome (a fresh read plan's slots); everything in `errors` counts as read.
        `present`: False when the device itself went away during the read, which explains every
        missing file: then nothing is unsupported."""
        seen = self._seen
        if not errors and not self._unsupported:  # the usual poll: nothing unreadable, nothing to forget
            seen.update(read)
            return _NOTHING
        failed: list[ReadError] = []
        unsupported: list[ReadError] = []
        still: set[Key] = set()
        for err in errors:
            key = (err.port, err.attribute)
            why = symptom(err) if present else None
            if why is not None and (key not in seen or key in self._unsupported):
                still.add(key)
                reason = err.reason if err.kind == why else f"{why}: {err.reason}"
                unsupported.append(ReadError(err.device, err.port, err.attribute, reason))
            else:
                failed.append(err)
            seen.add(key)
        seen.update(read)
        self._unsupported = still
        return Judged(tuple(failed), tuple(unsupported))


def summarize(unsupported: Iterable[ReadError]) -> list[str]:
    """One line per device, port, directory and reason: `mlx5_0 port 1: counters/* (21 files): no_pma`."""
    groups: dict[tuple[str, int | None, str, str], list[str]] = {}
    for err in unsupported:
        directory, _, name = err.attribute.rpartition("/")
        groups.setdefault((err.device, err.port, directory, err.kind), []).append(name)
    lines = []
    for (device, port, directory, kind), names in sorted(
        groups.items(), key=lambda item: (item[0][0], item[0][1] or 0, item[0][2], item[0][3])
    ):
        where = device if port is None else f"{device} port {port}"
        if len(names) == 1:
            what = f"{directory}/{names[0]}" if directory else names[0]
        else:
            what = f"{directory}/* ({len(names)} files)" if directory else ", ".join(sorted(names))
        lines.append(f"{where}: {what}: {kind}")
    return lines
