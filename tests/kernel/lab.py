"""In-VM helper library of the kernel lab (stdlib only, plus `rnic_exporter.cli`).

Runs inside the QEMU guest as root, in the one driver process (tests/kernel/driver.py) that runs
every scenario of a boot. A scenario gets a `Lab` and builds what it needs with it: rxe devices on
a veth pair across network namespaces or on a tap device, in-process CLI calls, a `serve`
subprocess, sysfs subtree dumps. `reset()` removes all of it so the next scenario starts clean.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import os
import re
import socket
import struct
import subprocess
import sys
import time
import traceback
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SYS_IB = Path("/sys/class/infiniband")
SYS_NET = Path("/sys/class/net")
NETNS = "b"
VA, VB = "va", "vb"
VA_ADDR, VB_ADDR = "10.77.0.1", "10.77.0.2"
SH_TIMEOUT_S = 60.0
TUNSETIFF, IFF_TAP, IFF_NO_PI = 0x400454CA, 0x0002, 0x1000

TreeEntry = dict[str, str]
Tree = dict[str, TreeEntry]


def measured(result: dict[str, Any], body: Callable[[], None]) -> dict[str, Any]:
    """A scenario's `run`: `body` records into `result` as it goes, so a failure partway keeps what
    was measured (the host test fails on "error", with the traceback); adds the wall time."""
    t0 = time.monotonic()
    try:
        body()
    except Exception:
        result["error"] = traceback.format_exc()
    result["seconds"] = round(time.monotonic() - t0, 1)
    return result


class LabError(RuntimeError):
    """A lab step failed: the message says which command or condition, and what it printed."""


def in_lab_vm() -> bool:
    """True inside a virtme-ng guest (the lab's VM), where scenarios may change the network freely."""
    try:
        with open("/proc/cmdline") as f:
            return "virtme" in f.read()
    except OSError:
        return False


def uptime() -> float:
    """Seconds since the guest kernel booted (the boot-time figure of the lab)."""
    with open("/proc/uptime") as f:
        return float(f.read().split()[0])


def errno_name(code: int | None) -> str:
    return errno.errorcode.get(code or 0, f"E{code}")


def read_attr(path: str | Path) -> str:
    """One sysfs attribute in one read(), raw (trailing newline kept)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 65536).decode(errors="backslashreplace")
    finally:
        os.close(fd)


def tree(path: str | Path) -> Tree:
    """Dump a sysfs subtree: {relpath: {"kind": "file"|"dir"|"link", "value"|"errno"|"target": ...}}.

    Every file is read (raw text, newline kept); a read that fails records its errno name (EINVAL for
    an empty GID slot's gid_attrs). Symlinks are recorded with their target, never followed; the
    root itself is resolved first (class/infiniband/rxe0 is a link into devices/virtual).
    """
    root = Path(os.path.realpath(path))
    out: Tree = {}

    def walk(directory: Path, rel: str) -> None:
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as exc:
            out[rel or "."] = {"kind": "dir", "errno": errno_name(exc.errno)}
            return
        for entry in entries:
            sub = f"{rel}/{entry.name}" if rel else entry.name
            if entry.is_symlink():
                out[sub] = {"kind": "link", "target": os.readlink(entry.path)}
            elif entry.is_dir(follow_symlinks=False):
                out[sub] = {"kind": "dir"}
                walk(Path(entry.path), sub)
            else:
                try:
                    out[sub] = {"kind": "file", "value": read_attr(entry.path)}
                except OSError as exc:
                    out[sub] = {"kind": "file", "errno": errno_name(exc.errno)}

    walk(root, "")
    return out


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "stdout": self.stdout, "stderr": self.stderr, "seconds": round(self.seconds, 3)}


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    return 1  # SystemExit("message"): Python prints it and exits 1


def call_cli(args: tuple[str, ...]) -> CliResult:
    """`rnic-exporter ARGS` in this process, stdout/stderr captured, exit code as the real CLI's.

    click's own exceptions are mapped as `standalone_mode=True` would (ClickException: its message
    and code, Abort: 1, Exit: its code); SystemExit gives its code; a ConfigError escaping the group
    becomes a one-line error with exit 2, as `rnic_exporter.cli.run` does; anything else is a crash:
    traceback on stderr, exit 1, as Python would.
    """
    import click

    from rnic_exporter.cli import main

    out, err = io.StringIO(), io.StringIO()
    start = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = _exit_code(main(list(args), prog_name="rnic-exporter", standalone_mode=False))
        except click.exceptions.Exit as exc:
            code = exc.exit_code
        except click.ClickException as exc:
            exc.show()
            code = exc.exit_code
        except click.exceptions.Abort:
            print("Aborted!", file=sys.stderr)
            code = 1
        except SystemExit as exc:
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
            code = _exit_code(exc.code)
        except Exception as exc:
            if type(exc).__name__ == "ConfigError":
                print(f"rnic-exporter: error: {exc}", file=sys.stderr)
                code = 2
            else:
                traceback.print_exc()
                code = 1
    return CliResult(code, out.getvalue(), err.getvalue(), time.monotonic() - start)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Serve:
    """A `rnic-exporter serve` subprocess on 127.0.0.1:port (in-process cannot run a daemon)."""

    proc: subprocess.Popen[str]
    port: int
    log: Path

    def scrape(self, path: str = "/metrics", timeout_s: float = 10.0) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=timeout_s) as resp:
            body: bytes = resp.read()
            return body.decode()

    def answers(self) -> bool:
        if self.proc.poll() is not None:
            raise LabError(f"serve exited with {self.proc.returncode} before answering:\n{self.log_text()}")
        try:
            self.scrape("/-/healthy", timeout_s=2.0)
        except OSError:
            return False
        return True

    def log_text(self) -> str:
        return self.log.read_text(errors="backslashreplace") if self.log.exists() else ""

    def stop(self, deadline_s: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(deadline_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


@dataclass
class Lab:
    """What a scenario works with. `out` is its output directory (on the host, through --rwdir)."""

    out: Path
    made: list[str] = field(default_factory=list)
    _serves: list[Serve] = field(default_factory=list)
    _fds: list[int] = field(default_factory=list)

    # -- commands --------------------------------------------------------------------------

    def sh(
        self, cmd: str, check: bool = True, netns: str | None = None, timeout: float = SH_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        """Run `cmd` with sh (in network namespace `netns` if given); raise LabError on failure when check."""
        argv = ["sh", "-c", cmd] if netns is None else ["ip", "netns", "exec", netns, "sh", "-c", cmd]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise LabError(f"timed out after {timeout:.0f} s: {cmd}") from exc
        if check and proc.returncode != 0:
            raise LabError(f"exit {proc.returncode}: {cmd}\nstdout: {proc.stdout}\nstderr: {proc.stderr}")
        return proc

    def cli(self, *args: str) -> tuple[int, str, str]:
        """`rnic-exporter ARGS` in process: (exit code, stdout, stderr)."""
        r = call_cli(args)
        return r.code, r.stdout, r.stderr

    def cli_result(self, *args: str) -> CliResult:
        """As `cli`, with the call's wall time."""
        return call_cli(args)

    def wait_until(self, predicate: Callable[[], object], deadline_s: float, what: str, poll_s: float = 0.05) -> float:
        """Poll `predicate` until it is truthy; return the seconds it took. Raise LabError naming `what`."""
        start = time.monotonic()
        last_exc: BaseException | None = None
        while True:
            try:
                if predicate():
                    return time.monotonic() - start
                last_exc = None
            except LabError:
                raise
            except Exception as exc:  # a file not there yet, a port not open yet
                last_exc = exc
            if time.monotonic() - start > deadline_s:
                detail = f" (last error: {type(last_exc).__name__}: {last_exc})" if last_exc else ""
                raise LabError(f"not within {deadline_s:.0f} s: {what}{detail}")
            time.sleep(poll_s)

    # -- RDMA setups -----------------------------------------------------------------------

    def modprobe_rxe(self) -> None:
        self.sh("modprobe rdma_rxe")
        self.made.append("module rdma_rxe")

    def veth_pair(self) -> None:
        """va (10.77.0.1/24, root netns) <-> vb (10.77.0.2/24, netns b), both up, carrier waited for."""
        self.sh(f"ip netns add {NETNS}")
        self.made.append(f"netns {NETNS}")
        self.sh(f"ip link add {VA} type veth peer name {VB} && ip link set {VB} netns {NETNS}")
        self.made.append(f"link {VA}")
        self.sh(f"ip link set {VA} up && ip -n {NETNS} link set {VB} up && ip -n {NETNS} link set lo up")
        self.sh(f"ip addr add {VA_ADDR}/24 dev {VA} && ip -n {NETNS} addr add {VB_ADDR}/24 dev {VB}")
        self.wait_until(lambda: read_attr(SYS_NET / VA / "operstate").strip() == "up", 20, f"{VA} operstate up")

    def rdma_link_add(self, name: str, netdev: str, netns: str | None = None) -> None:
        self.sh(f"rdma link add {name} type rxe netdev {netdev}", netns=netns)
        self.made.append(f"rdma {name}")
        self.wait_until((SYS_IB / name / "ports/1/state").exists, 20, f"{name} registered in sysfs")

    def wait_gid(self, dev: str, index: int, gid_prefix: str, deadline_s: float = 20) -> float:
        """Until ports/1/gids/INDEX of DEV starts with `gid_prefix` (GID updates are a work-queue hop behind)."""
        path = SYS_IB / dev / "ports/1/gids" / str(index)
        return self.wait_until(
            lambda: read_attr(path).startswith(gid_prefix), deadline_s, f"{dev} GID {index} starts with {gid_prefix}"
        )

    def gid_of(self, dev: str, gid: str) -> int | None:
        """The index of GID `gid` (full %pI6 text) in DEV's table, or None."""
        gids = SYS_IB / dev / "ports/1/gids"
        for entry in os.scandir(gids):
            if read_attr(entry.path).strip() == gid:
                return int(entry.name)
        return None

    def rxe_pair(self) -> None:
        """rxe0 on va (root netns) and rxe1 on vb (created in netns b), both ACTIVE, IPv4 GIDs present."""
        self.modprobe_rxe()
        self.veth_pair()
        self.rdma_link_add("rxe0", VA)
        self.rdma_link_add("rxe1", VB, netns=NETNS)
        for dev in ("rxe0", "rxe1"):
            self.wait_until(self._state_is(dev, "4: ACTIVE"), 20, f"{dev} ACTIVE")
        for dev, addr in (("rxe0", VA_ADDR), ("rxe1", VB_ADDR)):
            self.wait_until(self._has_gid(dev, ipv4_gid(addr)), 20, f"{dev} has the GID of {addr}")

    def _state_is(self, dev: str, state: str) -> Callable[[], bool]:
        return lambda: read_attr(SYS_IB / dev / "ports/1/state").strip() == state

    def _has_gid(self, dev: str, gid: str) -> Callable[[], bool]:
        return lambda: self.gid_of(dev, gid) is not None

    def rxe_tap(self, tap: str = "tap0", name: str = "rxe2", speed_mbps: int = 25000, attach: bool = True) -> None:
        """A tap device whose ethtool speed is set (the tun driver stores it) with rxe on it.

        attach: this process opens the tap (TUNSETIFF), which gives it carrier, so the port is
        ACTIVE; without it nothing reads the tap, it has no carrier and the port is DOWN.
        """
        if not (Path("/sys/module/rdma_rxe").exists()):
            self.modprobe_rxe()
        self.sh("modprobe tun")  # /dev/net/tun appears (devtmpfs) once the module is in
        self.wait_until(Path("/dev/net/tun").exists, 10, "/dev/net/tun")
        self.sh(f"ip tuntap add dev {tap} mode tap")
        self.made.append(f"link {tap}")
        self.sh(f"ethtool -s {tap} speed {speed_mbps} duplex full && ip link set {tap} up")
        if attach:
            fd = os.open("/dev/net/tun", os.O_RDWR)
            fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", tap.encode(), IFF_TAP | IFF_NO_PI))
            self._fds.append(fd)
            self.wait_until(lambda: read_attr(SYS_NET / tap / "carrier").strip() == "1", 20, f"{tap} carrier")
        self.rdma_link_add(name, tap)

    def renegotiate(self, tap: str, speed_mbps: int) -> None:
        """A link renegotiating to another speed, as a NIC does: the carrier drops, the speed changes,
        the carrier returns (both announced by rtnetlink). The tun driver alone stores an
        `ethtool -s` speed silently, which no real link does; the exporter polls what rtnetlink
        announces only on the announcement (and at its safety sweep)."""
        self.sh(f"ip link set {tap} carrier off")
        self.wait_until(lambda: read_attr(SYS_NET / tap / "carrier").strip() == "0", 20, f"{tap} carrier off")
        self.sh(f"ethtool -s {tap} speed {speed_mbps} duplex full")
        self.sh(f"ip link set {tap} carrier on")
        self.wait_until(lambda: read_attr(SYS_NET / tap / "carrier").strip() == "1", 20, f"{tap} carrier on")

    @contextlib.contextmanager
    def send_bw_loopback(
        self, dev: str = "rxe0", seconds: int = 20, tcp_port: int = 18611
    ) -> Iterator[tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]]:
        """ib_send_bw RC traffic in loopback on DEV (server and client both on it, 10.77.0.1: rxe in
        the root namespace loops it back), until the block ends or `seconds` pass; yields (server,
        client) once the client runs. Their output goes to send_bw_{server,client}.log in `out`."""
        common = ["ib_send_bw", "-d", dev, "-x", "1", "-s", "4096", "-D", str(seconds), "-p", str(tcp_port)]
        procs: list[subprocess.Popen[bytes]] = []
        with open(self.out / "send_bw_server.log", "w") as slog, open(self.out / "send_bw_client.log", "w") as clog:
            try:
                server = subprocess.Popen(common, stdout=slog, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
                procs.append(server)
                self.wait_until(
                    lambda: server.poll() is not None or f":{tcp_port}" in self.sh("ss -Hltn", check=False).stdout,
                    30,
                    f"ib_send_bw server listening on {tcp_port}",
                    poll_s=0.1,
                )
                client = subprocess.Popen(
                    [*common, VA_ADDR], stdout=clog, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
                )
                procs.append(client)
                yield server, client
            finally:
                for proc in reversed(procs):
                    if proc.poll() is None:
                        proc.kill()
                    proc.wait()

    # -- the exporter as a daemon ----------------------------------------------------------

    def serve(self, *args: str, deadline_s: float = 120.0) -> Serve:
        """Start `rnic-exporter serve ARGS --web.listen-address 127.0.0.1:PORT`; return once it answers."""
        port = free_port()
        log = self.out / f"serve-{port}.log"
        argv = [sys.executable]
        if sys.flags.no_site:
            argv.append("-S")
        argv += ["-m", "rnic_exporter", "serve", *args, "--web.listen-address", f"127.0.0.1:{port}"]
        with open(log, "w") as f:
            proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, text=True)
        serve = Serve(proc, port, log)
        self._serves.append(serve)
        self.wait_until(serve.answers, deadline_s, f"serve answering on 127.0.0.1:{port}", poll_s=0.2)
        return serve

    # -- output ------------------------------------------------------------------------------

    def tree(self, path: str | Path) -> Tree:
        return tree(path)

    def write(self, name: str, data: object) -> Path:
        """Write `data` (JSON, or text if a str) into the scenario's output dir."""
        path = self.out / name
        path.write_text(data if isinstance(data, str) else json.dumps(data, indent=1, sort_keys=True))
        return path

    # -- cleanup -----------------------------------------------------------------------------

    def reset(self) -> list[str]:
        """Remove everything a scenario made: serve processes, rdma links, netns, links, the rxe module.

        Only inside the lab VM (it deletes every netns and RDMA link it finds)."""
        if not in_lab_vm():
            raise LabError("refusing to reset: not inside the kernel lab VM (no virtme in /proc/cmdline)")
        done: list[str] = []
        for serve in self._serves:
            serve.stop()
        self._serves.clear()
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
        links = self.sh("rdma -j link show", check=False).stdout
        try:
            names = [str(e["ifname"]) for e in json.loads(links or "[]")]
        except ValueError:
            names = []
        for name in names:
            self.sh(f"rdma link delete {name}", check=False)
            done.append(f"rdma {name}")
        netns = [line.split()[0] for line in self.sh("ip netns list", check=False).stdout.splitlines() if line.strip()]
        for ns in netns:
            self.sh(f"ip netns delete {ns}", check=False)
            done.append(f"netns {ns}")
        for link in os.listdir(SYS_NET):
            if link in (VA, VB) or re.fullmatch(r"(tap|veth|lab)\d+", link):
                self.sh(f"ip link delete {link}", check=False)
                done.append(f"link {link}")
        if Path("/sys/module/rdma_rxe").exists():
            self.sh("modprobe -r rdma_rxe", check=False)
            done.append("module rdma_rxe")
        self.wait_until(lambda: not SYS_IB.exists() or not os.listdir(SYS_IB), 30, "no RDMA devices left")
        self.wait_until(lambda: not Path("/sys/module/rdma_rxe").exists(), 30, "rdma_rxe unloaded")
        self.made.clear()
        return done


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def samples(scrape: str, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    """The samples of metric `name` in a Prometheus text scrape whose labels include `labels`."""
    out: list[tuple[dict[str, str], float]] = []
    for line in scrape.splitlines():
        m = _SAMPLE.match(line)
        if not m or m.group(1) != name:
            continue
        got = dict(_LABEL.findall(m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            out.append((got, float(m.group(3))))
    return out


def sample(scrape: str, name: str, **labels: str) -> float | None:
    """The value of the one sample of `name` with `labels` (None when absent; LabError when several)."""
    found = samples(scrape, name, **labels)
    if len(found) > 1:
        raise LabError(f"{len(found)} samples of {name} match {labels}: {found}")
    return found[0][1] if found else None


def ipv4_gid(address: str) -> str:
    """10.77.0.1 -> 0000:0000:0000:0000:0000:ffff:0a4d:0001 (the IPv4-mapped GID as %pI6 prints it)."""
    a, b, c, d = (int(x) for x in address.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


def eui64_gid(mac: str) -> str:
    """MAC -> fe80:: + EUI-64, as the kernel's default GID."""
    b = bytes.fromhex(mac.replace(":", ""))
    eui = bytes([b[0] ^ 0x02]) + b[1:3] + b"\xff\xfe" + b[3:6]
    h = (b"\xfe\x80" + bytes(6) + eui).hex()
    return ":".join(h[i : i + 4] for i in range(0, 32, 4))


@contextlib.contextmanager
def timed(times: dict[str, float], key: str) -> Iterator[None]:
    start = time.monotonic()
    try:
        yield
    finally:
        times[key] = round(time.monotonic() - start, 3)


__all__ = [
    "CliResult",
    "Lab",
    "LabError",
    "Serve",
    "Tree",
    "call_cli",
    "eui64_gid",
    "ipv4_gid",
    "sample",
    "samples",
    "tree",
    "uptime",
]
