"""NCCL's own config files, read as NCCL reads them (`setEnvFile` / `initEnvFunc`, src/misc/param.cc).

Why: jobs get NCCL_* variables not only from their environment but from `NCCL_CONF_FILE` (else
`$HOME/.nccl.conf`) and `/etc/nccl.conf`. A site that pins `NCCL_IB_GID_INDEX` in /etc/nccl.conf
and is judged on the environment alone gets a `check` that passes on a node where every job hangs.

NCCL applies each line with `setenv(name, value, 0)`: the environment beats the user file, which
beats /etc/nccl.conf, and within one file the first line for a name wins. A line is what `fgets`
gives into a 4096-byte buffer (a longer line is split, its rest read as a line of its own), less
one trailing `\\n` then one `\\r`; `#` in the first column is a comment; the name is everything
before the first `=` and the value everything after it, each cut to 1023 bytes, neither stripped
nor unquoted. Modelled on NCCL 2.30 (master): 2.26-2.29 read with getline (no split, a trailing
`\\r` kept in the value), before 2.26 `#` was no comment, before 2.23.4 NCCL_CONF_FILE is ignored.

Nothing here is an error, as nothing is for NCCL: a missing or unreadable file is no file. Where a
line reads other than it looks for one of the variables deciding the GID (`NCCL_VARIABLES`), a note
says how; `check` prints the notes.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from rnic_exporter.config.nccl_env import NCCL_VARIABLES

log = logging.getLogger(__name__)

LINE_BUFFER = 4096  # char line[4096]: fgets reads at most 4095 bytes
FIELD_MAX = 1023  # char envVar[1024], envValue[1024]
PATH_MAX = 1023  # snprintf into char confFilePath[1024]
# More than any config file holds; a bound so that NCCL_CONF_FILE=/dev/zero-like files cannot
# exhaust the exporter's memory (NCCL would read on; the first lines are the ones that count).
READ_LIMIT = 1 << 20
ETC_CONF = "etc/nccl.conf"


@dataclass(frozen=True, slots=True)
class Setting:
    """One value a file gives a variable, and where: jobs and `check` name the line."""

    value: str
    path: str
    line: int

    @property
    def where(self) -> str:
        return f"{self.path} line {self.line}"


@dataclass(frozen=True, slots=True)
class ConfFile:
    """One file as NCCL reads it: every name it sets (the first line for each) and the notes."""

    path: str
    values: Mapping[str, Setting]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NcclConf:
    """What NCCL's config files give the jobs on this host: the NCCL_* names the environment does not
    set, each from the file and line NCCL takes it from (`values`), in the order NCCL reads them."""

    values: Mapping[str, Setting] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    read: tuple[ConfFile, ...] = ()  # the files that could be read, in NCCL's order
    environment: frozenset[str] = frozenset()  # the GID variables the environment sets: no file's count

    def env(self) -> dict[str, str]:
        """The values as an environment (the lowest layer under the config file and the environment)."""
        return {name: setting.value for name, setting in self.values.items()}


def _fgets_lines(data: bytes) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, chunk, continuation) as repeated fgets(line, 4096) returns them: a chunk ends
    after a newline or at 4095 bytes; a chunk that is the rest of a longer line is a continuation."""
    pos, number, continuation = 0, 1, False
    while pos < len(data):
        end = data.find(b"\n", pos, pos + LINE_BUFFER - 1)
        chunk = data[pos : end + 1] if end >= 0 else data[pos : pos + LINE_BUFFER - 1]
        yield number, chunk, continuation
        pos += len(chunk)
        continuation = not chunk.endswith(b"\n")
        number += not continuation


def _meant(name: str) -> str | None:
    """The GID variable a name that NCCL never reads looks like: surrounding whitespace, or a shell
    `export ` in front (NCCL takes the whole text before `=` as the name)."""
    stripped = name.strip()
    if stripped.startswith("export") and stripped[6:7].isspace():
        stripped = stripped[6:].strip()
    return stripped if stripped != name and stripped in NCCL_VARIABLES else None


def _quoted(value: str) -> bool:
    return len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'"


def parse(data: bytes, path: str) -> ConfFile:
    """`data`, the bytes of `path`, as setEnvFile applies them: the first value of each name, and notes
    for the GID variables' lines that NCCL reads other than they look."""
    values: dict[str, Setting] = {}
    notes: list[str] = []
    for number, chunk, continuation in _fgets_lines(data):
        line = chunk.split(b"\0", 1)[0]  # strlen: a NUL ends the C string
        line = line.removesuffix(b"\n")
        crlf = line.endswith(b"\r")
        line = line.removesuffix(b"\r")
        if line.startswith(b"#"):
            continue
        raw_name, equals, raw_value = line.partition(b"=")
        if not equals:
            continue
        name = os.fsdecode(raw_name[:FIELD_MAX])  # as os.environ decodes: undecodable bytes survive
        value = os.fsdecode(raw_value[:FIELD_MAX])
        where = f"{path} line {number}"
        if name in NCCL_VARIABLES:
            notes.extend(_line_notes(where, name, value, continuation, crlf, values.get(name)))
        elif (meant := _meant(name)) is not None:
            how = "no 'export'" if "export" in name else "no spaces around '='"
            notes.append(
                f"{where}: {name!r} is not {meant}: NCCL sets a variable of that name and never reads it "
                f"(write {meant}={value.strip()}: {how})"
            )
        if name and name not in values:  # setenv(name, value, 0); an empty name fails (EINVAL)
            values[name] = Setting(value, path, number)
    return ConfFile(path, values, tuple(notes))


def _line_notes(
    where: str, name: str, value: str, continuation: bool, crlf: bool, earlier: Setting | None
) -> Iterator[str]:
    """How NCCL reads a line setting one of the GID variables, when that is not how it looks."""
    if earlier is not None:
        yield f"{where}: {name}={value} is ignored: NCCL keeps the first, {earlier.where} ({name}={earlier.value})"
        return
    if continuation:
        yield (
            f"{where} is longer than {LINE_BUFFER - 1} bytes: NCCL reads its rest as a line of its own, "
            f"which sets {name}"
        )
    if _quoted(value):
        yield f"{where}: {name}={value}: NCCL keeps the quotes, the value is {value!r} (write {name}={value[1:-1]})"
    if crlf:
        yield f"{where} ends in CR LF: NCCL 2.26 to 2.29 keep the CR in {name}'s value (2.30 drops it)"


def _read(path: bytes) -> tuple[bytes | None, str]:
    """The file's first READ_LIMIT bytes, or None and why not (NCCL: fopen fails, nothing read).
    Opened without blocking: a FIFO or a device is not a config file and must not hang serve."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return None, exc.strerror or type(exc).__name__
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, "not a regular file"
        chunks: list[bytes] = []
        size = 0
        while size <= READ_LIMIT and (chunk := os.read(fd, READ_LIMIT + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks), ""
    except OSError as exc:
        return None, exc.strerror or type(exc).__name__
    finally:
        os.close(fd)


def conf_paths(environ: Mapping[str, str], rootfs: Path = Path("/")) -> list[str]:
    """The files initEnvFunc reads, in its order: NCCL_CONF_FILE when set and not empty, else
    $HOME/.nccl.conf when HOME is set; then /etc/nccl.conf. The first two as this process sees them,
    the last under `rootfs` (the host's, from a container)."""
    user = environ.get("NCCL_CONF_FILE") or None
    if user is None and "HOME" in environ:
        user = f"{environ['HOME']}/.nccl.conf"
    paths = [] if user is None else [os.fsdecode(os.fsencode(user)[:PATH_MAX])]  # snprintf's cut
    return [*paths, str(rootfs / ETC_CONF)]


def read_nccl_conf(environ: Mapping[str, str] | None = None, rootfs: Path = Path("/")) -> NcclConf:
    """The NCCL_* values NCCL's config files give jobs whose environment is `environ` (default: this
    process's), with where each comes from and the notes of every file read. Never raises."""
    environ = os.environ if environ is None else environ
    values: dict[str, Setting] = {}
    notes: list[str] = []
    read: list[ConfFile] = []
    for path in conf_paths(environ, rootfs):
        data, why = _read(os.fsencode(path))
        if data is None:
            log.debug("NCCL config file not read", extra={"fields": {"file": path, "reason": why}})
            continue
        parsed = parse(data[:READ_LIMIT], path)
        if len(data) > READ_LIMIT:
            parsed = replace(
                parsed, notes=(*parsed.notes, f"{path} is larger than {READ_LIMIT} bytes: only its start was read")
            )
        read.append(parsed)
        notes.extend(parsed.notes)
        for name, setting in parsed.values.items():
            # setenv(..., 0): the environment (even an empty value) and earlier files win.
            if name.startswith("NCCL_") and name not in environ and name not in values:
                values[name] = setting
        log.debug(
            "NCCL config file read",
            extra={"fields": {"file": path, "sets": ",".join(n for n in parsed.values if n in NCCL_VARIABLES)}},
        )
    return NcclConf(values, tuple(notes), tuple(read), frozenset(n for n in NCCL_VARIABLES if n in environ))


def under(conf: NcclConf, overridden: Mapping[str, str]) -> tuple[dict[str, str], tuple[str, ...]]:
    """The files' GID variables as the lowest layer of what the exporter judges with: all but the
    `overridden` ones (name -> what the exporter uses instead, e.g. `--nccl-gid-index`). And the
    notes: for each file read, what it gives jobs (so that `check` says which files it read and
    where a value came from), then its lines NCCL reads other than they look."""
    env = {name: value for name, value in conf.env().items() if name in NCCL_VARIABLES and name not in overridden}
    notes = []
    for read in conf.read:
        given = [_given(conf, read, name, overridden) for name in read.values if name in NCCL_VARIABLES]
        notes.append(f"read {read.path}: {', '.join(given) or 'sets none of the variables that decide the GID'}")
        notes.extend(read.notes)
    return env, tuple(notes)


def _given(conf: NcclConf, read: ConfFile, name: str, overridden: Mapping[str, str]) -> str:
    """`NAME=value (line N)` when jobs get it from this file, else why not."""
    setting = read.values[name]
    if conf.values.get(name) is setting:
        instead = f", overridden by {overridden[name]}" if name in overridden else ""
        return f"{name}={setting.value} (line {setting.line}{instead})"
    winner = "the environment's" if name in conf.environment else f"{conf.values[name].where}'s"
    return f"{name} (line {setting.line}, not used: {winner} wins)"
