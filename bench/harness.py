"""Helpers shared by the benchmarks: processes, CPU and memory from /proc, HTTP clients, load with wrk,
a writer process that keeps a simulated host busy, and a count of the sysfs files a process reads."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import http.client
import multiprocessing
import multiprocessing.synchronize
import os
import re
import select
import shutil
import struct
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rnic_exporter.sim import SimHost
from rnic_exporter.sources.live_tree import filesystem_of

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process (all threads, also those that have exited), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


_cpuacct: list[Path | None] = []


def cpuacct_root() -> Path | None:
    """The cgroup v1 cpuacct hierarchy, or None. `ip netns exec` mounts a fresh /sys without the cgroup
    mounts: then (as root) the hierarchy is mounted on a directory of our own, unmounted at exit."""
    if not _cpuacct:
        root: Path | None = Path("/sys/fs/cgroup/cpuacct")
        if root is None or not (root / "cpuacct.usage").exists():
            root = Path(tempfile.mkdtemp(prefix="rnic-cpuacct-"))
            mounted = subprocess.run(
                ["mount", "-t", "cgroup", "-o", "cpuacct", "cpuacct", str(root)], capture_output=True
            )
            if mounted.returncode == 0:
                atexit.register(subprocess.run, ["umount", "-l", str(root)], capture_output=True)
            else:
                root.rmdir()
                root = None
        _cpuacct.append(root)
    return _cpuacct[0]


class ProcessCpu:
    """CPU time of one process, every thread counted, also those that exit: from a cpuacct cgroup of its
    own (nanoseconds) where the cgroup v1 cpuacct controller is writable (root), else from
    /proc/<pid>/stat (10 ms ticks). `ticks()` is always the plain /proc reading, to check against."""

    def __init__(self, pid: int, name: str) -> None:
        self.pid = pid
        self._group: Path | None = None
        self._root = cpuacct_root()
        if self._root is None:
            return
        group = self._root / f"rnic-bench-{os.getpid()}-{re.sub(r'[^a-z0-9]+', '-', name.lower())}-{pid}"
        try:
            group.mkdir()
            (group / "cgroup.procs").write_text(f"{pid}\n")
            self._group = group
        except OSError:
            if group.exists():
                group.rmdir()

    @property
    def precise(self) -> bool:
        return self._group is not None

    def seconds(self) -> float:
        if self._group is not None:
            return int((self._group / "cpuacct.usage").read_text()) / 1e9
        return cpu_seconds(self.pid)

    def ticks(self) -> int:
        return round(cpu_seconds(self.pid) * CLK_TCK)

    def close(self) -> None:
        """Remove the cgroup (a process still in it goes back to the root group first)."""
        group, self._group = self._group, None
        if group is None:
            return
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):  # exited meanwhile
                (group.parent / "cgroup.procs").write_text(f"{pid}\n")
        group.rmdir()


def _status_mb(pid: int, key: str) -> float:
    m = re.search(rf"{key}:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(m[1]) / 1024 if m else float("nan")


def rss_mb(pid: int) -> float:
    return _status_mb(pid, "VmRSS")


def peak_rss_mb(pid: int) -> float:
    return _status_mb(pid, "VmHWM")


def load_average() -> float:
    """The 1-minute load average: the machine is shared, so every figure is printed beside it."""
    return float(Path("/proc/loadavg").read_text().split()[0])


# What Prometheus 2.x sends on every scrape (scrape.scrapeAcceptHeader), and it always asks for gzip.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


@dataclass(frozen=True, slots=True)
class Client:
    """How a scraper talks: its headers, and whether it keeps its connection open between scrapes."""

    name: str
    headers: Mapping[str, str]
    keep_alive: bool


PROMETHEUS_LIKE = Client("Prometheus-like", {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"}, True)
PLAIN = Client("plain", {}, False)  # curl-like: a new connection per scrape, identity, no Accept


class Scraper:
    """One client scraping one URL, with a connection kept open when the client keeps alive."""

    def __init__(self, url: str, client: Client) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host, self.port, self.path = parts.hostname or "127.0.0.1", parts.port or 80, parts.path or "/"
        self.client = client
        self.scrapes = 0
        self._conn: http.client.HTTPConnection | None = None

    def scrape(self) -> bytes:
        headers = dict(self.client.headers)
        if not self.client.keep_alive:
            headers["Connection"] = "close"
        for attempt in (1, 2):  # a kept-alive connection the server closed is reopened once
            conn = self._conn or http.client.HTTPConnection(self.host, self.port, timeout=30)
            try:
                conn.request("GET", self.path, headers=headers)
                response = conn.getresponse()
                body = response.read()
            except (ConnectionError, http.client.HTTPException):
                conn.close()
                self._conn = None
                if attempt == 2:
                    raise
                continue
            if response.status != 200:
                raise SystemExit(f"{self.path} answered {response.status}")
            self._conn = conn if self.client.keep_alive and not response.will_close else None
            if self._conn is None:
                conn.close()
            self.scrapes += 1
            return body
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


MEMORY_TMP = Path("/dev/shm")


def tree_dir(prefix: str, on_disk: bool = False) -> tuple[Path, str]:
    """A fresh directory for a simulated sysfs tree, and where it lives. sysfs is in memory (kernfs):
    on a disk filesystem every read of a file rewritten since its last read also writes its atime
    to the journal, and a page the machine dropped from its cache is read from disk, costs no sysfs
    read has (a profile of the idle daemon on a tree under /tmp on ext4 had virtio disk requests
    and ext4 journal work in its reading threads). So the tree goes on tmpfs (/dev/shm) where
    there is one; `on_disk` keeps the old place, to measure what that costs."""
    if not on_disk and filesystem_of(MEMORY_TMP) == "tmpfs" and os.access(MEMORY_TMP, os.W_OK):
        return Path(tempfile.mkdtemp(prefix=prefix, dir=MEMORY_TMP)), f"tmpfs ({MEMORY_TMP})"
    where = Path(tempfile.mkdtemp(prefix=prefix))
    why = "" if on_disk else ": no tmpfs at /dev/shm"
    return where, f"{filesystem_of(where) or 'unknown filesystem'} ({where.parent}){why}"


def require(binary: str, package: str) -> str:
    path = shutil.which(binary)
    if path is None:
        raise SystemExit(f"{binary} missing: apt-get install {package}")
    return path


@dataclass(frozen=True, slots=True)
class Latency:
    p50_ms: float
    p99_ms: float
    requests: int
    failed: int  # answers other than 2xx/3xx (node_exporter answers 503 beyond --web.max-requests)


def wrk_latency(url: str, connections: int, seconds: int, headers: Mapping[str, str] | None = None) -> Latency:
    """Latency percentiles over `seconds` of closed-loop keep-alive load on loopback."""
    header_args = [arg for k, v in (headers or {}).items() for arg in ("-H", f"{k}: {v}")]
    out = subprocess.run(
        [
            require("wrk", "wrk"),
            f"-t{min(2, connections)}",
            f"-c{connections}",
            f"-d{seconds}s",
            "--timeout",
            "10s",
            "--latency",
            *header_args,
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout

    def pct(p: str) -> float:
        m = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        if m is None:
            raise SystemExit(f"could not read the {p}th percentile from wrk:\n{out}")
        return float(m[1]) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m[2]]

    requests = re.search(r"^\s*(\d+) requests in", out, re.M)
    failed = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return Latency(pct("50"), pct("99"), int(requests[1]) if requests else 0, int(failed[1]) if failed else 0)


def node_exporter_binary() -> str:
    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if binary is None:
        raise SystemExit("node_exporter missing: apt-get install prometheus-node-exporter")
    return binary


def node_exporter_args(sysfs: Path, port: int, *extra: str) -> list[str]:
    """node_exporter with only the collectors that read what we read, on the same tree."""
    return [
        node_exporter_binary(),
        "--collector.disable-defaults",
        "--collector.infiniband",
        "--collector.netclass",
        f"--path.sysfs={sysfs}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.disable-exporter-metrics",
        *extra,
    ]


# -- a busy host: a separate process rewrites every counter file, so its CPU is nobody's --------------------


def bump_every_counter(host: SimHost, seconds: float) -> None:
    """Every counter file of every port gets a new value, as on a training node (values are not kept
    within the PMA widths: this measures what reading costs, not what the values mean)."""
    for dev in host.devices.values():
        for values in (dev.counters, dev.hw_counters):
            for name in values:
                values[name] += 1
    host.add_traffic(seconds)  # advances the data counters and writes every counter file of every up port


def _writer_main(
    root: str,
    devices: int,
    gid_slots: int,
    period: float,
    ready: multiprocessing.synchronize.Event,
    busy: multiprocessing.synchronize.Event,
    stop: multiprocessing.synchronize.Event,
    infiniband: int = 0,
) -> None:
    host = SimHost.build(Path(root), roce=devices, infiniband=infiniband, gid_table_size=gid_slots)
    ready.set()
    while not stop.is_set():
        if busy.is_set():
            bump_every_counter(host, period)
        stop.wait(period)


class BusyWriter:
    """Builds the simulated host in its own process, which rewrites every counter file every `period`
    seconds while `busy` is on (its CPU is not any exporter's)."""

    def __init__(self, root: Path, devices: int, gid_slots: int, period: float = 0.25, infiniband: int = 0) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._ready, self._busy, self._stop = ctx.Event(), ctx.Event(), ctx.Event()
        self._proc = ctx.Process(
            target=_writer_main,
            daemon=True,
            args=(str(root), devices, gid_slots, period, self._ready, self._busy, self._stop, infiniband),
        )
        self._proc.start()
        if not self._ready.wait(120):
            raise SystemExit("the simulated host was not built within 120 s")

    def busy(self, on: bool) -> None:
        if on:
            self._busy.set()
        else:
            self._busy.clear()

    def close(self) -> None:
        self._stop.set()
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()


# -- which sysfs files a process reads: inotify IN_ACCESS, which reads of any filesystem raise ---------------

_IN_ACCESS, _IN_ISDIR, _IN_Q_OVERFLOW, _IN_NONBLOCK, _IN_CLOEXEC = 0x1, 0x40000000, 0x4000, 0o4000, 0o2000000
_EVENT = struct.Struct("iIII")


@dataclass
class ReadCounts:
    pma_files: int = 0  # counters/: on mlx5 every read is a MAD_IFC firmware command
    hw_files: int = 0  # hw_counters/: one firmware query per `lifespan` (10 ms), shared by the files read
    gid_files: int = 0  # gids/ and gid_attrs/ (the kernel's cache)
    other_files: int = 0
    listings: int = 0  # directory listings
    overflowed: bool = False

    @property
    def files(self) -> int:
        return self.pma_files + self.hw_files + self.gid_files + self.other_files

    def per(self, n: float) -> ReadCounts:
        return ReadCounts(
            round(self.pma_files / n),
            round(self.hw_files / n),
            round(self.gid_files / n),
            round(self.other_files / n),
            round(self.listings / n),
            self.overflowed,
        )


@dataclass
class FileReads:
    """Counts reads under a tree while it is unchanged in shape. The kernel raises IN_ACCESS for every read
    that returns data, whoever reads (so count one reader at a time) and whatever the path (class/ links
    resolve to the watched devices/ directories). A read at end of file or failing raises none: empty GID
    attribute files are not counted. Identical events in a row not yet drained merge into one."""

    root: Path
    counts: ReadCounts = field(default_factory=ReadCounts)

    def __post_init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self._fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self._dirs: dict[int, str] = {}
        for dirpath, _, _ in os.walk(self.root):
            wd = libc.inotify_add_watch(self._fd, os.fsencode(dirpath), _IN_ACCESS)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {dirpath}")
            self._dirs[wd] = dirpath
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, name="inotify", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self._fd], [], [], 0.1)
            if not ready:
                continue
            try:
                data = os.read(self._fd, 1 << 20)
            except BlockingIOError:
                continue
            with self._lock:
                self._count(data)

    def _count(self, data: bytes) -> None:
        offset = 0
        while offset < len(data):
            wd, mask, _, length = _EVENT.unpack_from(data, offset)
            offset += _EVENT.size + length
            if mask & _IN_Q_OVERFLOW:
                self.counts.overflowed = True
            elif mask & _IN_ISDIR or length == 0:
                self.counts.listings += 1
            else:
                directory = self._dirs.get(wd, "")
                if directory.endswith("/counters"):
                    self.counts.pma_files += 1
                elif directory.endswith("/hw_counters"):
                    self.counts.hw_files += 1
                elif "/gids" in directory or "/gid_attrs/" in directory:
                    self.counts.gid_files += 1
                else:
                    self.counts.other_files += 1

    def take(self) -> ReadCounts:
        """What was read since the last take (after the kernel's queue is drained)."""
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            r, _, _ = select.select([self._fd], [], [], 0)
            if not r:
                break
            time.sleep(0.02)
        with self._lock:
            counts, self.counts = self.counts, ReadCounts()
        return counts

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(2)
        os.close(self._fd)
