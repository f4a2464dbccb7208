"""The HTTP front under abuse: a well-behaved scraper's latency and the exporter's memory during attacks.

Runs `rnic-exporter serve` over a simulated host with TLS and basic auth (bcrypt cost 10), then,
all on loopback:
- a scraper (its own process) scrapes every 0.1 s over one keep-alive HTTPS connection, as
  Prometheus does, and also over a fresh connection each time;
- an attacker process holds (and re-opens when closed) N slowloris connections (TLS handshake
  done, then a header byte every few seconds), M idle TCP connections, silent TLS clients (half a
  ClientHello, then nothing) and K clients sending wrong passwords (a new guess each request).
It prints the scraper's p50/p99/max before and during the attack, failed scrapes, and the
exporter's RSS, threads and descriptors. Bounded: fixed durations and counts.

    python bench/abuse.py                      # this tree
    python bench/abuse.py --tree ../other/tree # the same bench against another checkout's code
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import http.client
import json
import os
import random
import re
import resource
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import free_port

USER, PASSWORD = "prometheus", "correct horse battery staple"
DAEMONSET_LIMIT_MIB = 160  # packaging/kubernetes/daemonset.yaml, exporter container
RECONNECT_AFTER = 2.0  # seconds an attacker waits before replacing a closed connection
RAMP_UP = 5.0  # seconds the attack runs before the scrapes under attack are counted
INTERVAL = 0.1  # seconds between a scraper's scrapes (Prometheus: 15 to 60; faster gives more samples)


def raise_nofile(wanted: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(wanted, hard) if hard != resource.RLIM_INFINITY else wanted
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def proc_status(pid: int) -> dict[str, int]:
    text = Path(f"/proc/{pid}/status").read_text()
    rss = re.search(r"VmRSS:\s+(\d+) kB", text)
    threads = re.search(r"Threads:\s+(\d+)", text)
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return {"rss_kb": int(rss[1]) if rss else 0, "threads": int(threads[1]) if threads else 0, "fds": fds}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def make_certs(directory: Path) -> None:
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(directory / "server.key"), "-out", str(directory / "server.crt")],
        check=True, capture_output=True)  # fmt: skip


def auth_header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def client_context(cafile: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(cafile))
    ctx.check_hostname = False
    return ctx


# -- scraper role (own process, so the attacker's event loop does not skew its clock) ---------


def scrape_role(port: int, cafile: Path, seconds: float, out: Path, mode: str) -> None:
    ctx = client_context(cafile)
    headers = {"Authorization": auth_header(USER, PASSWORD), "Accept-Encoding": "gzip"}
    done: list[tuple[float, float]] = []  # (when it started, how long it took), monotonic clock
    failed: list[float] = []  # when it started
    phases: list[tuple[float, float, float, float]] = []  # fresh: (when, connect, TLS, request) seconds
    conn: http.client.HTTPSConnection | None = None

    def one(c: http.client.HTTPSConnection) -> None:
        c.request("GET", "/metrics", headers=headers)
        response = c.getresponse()
        response.read()
        if response.status != 200:
            raise OSError(f"status {response.status}")

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.monotonic()
        if mode == "keep_alive":
            try:
                if conn is None:
                    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=ctx)
                one(conn)
                done.append((started, time.monotonic() - started))
            except (OSError, http.client.HTTPException):
                failed.append(started)
                if conn is not None:
                    conn.close()
                conn = None
        else:
            fresh_conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=ctx)
            try:
                # Where a fresh scrape waits: TCP connect (the kernel answers it, also for a connection
                # left in the listen backlog), accept and TLS (a backlogged connection waits here), the answer.
                raw = socket.create_connection(("127.0.0.1", port), timeout=10)
                connected = time.monotonic()
                fresh_conn.sock = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
                handshaken = time.monotonic()
                one(fresh_conn)
                done.append((started, time.monotonic() - started))
                phases.append((started, connected - started, handshaken - connected, time.monotonic() - handshaken))
            except (OSError, http.client.HTTPException):
                failed.append(started)
            finally:
                fresh_conn.close()
        time.sleep(max(0.0, INTERVAL - (time.monotonic() - started)))
    out.write_text(json.dumps({"done": done, "failed": failed, "phases": phases}))


# -- attacker role ------------------------------------------------------------------------------


class Attack:
    def __init__(self, port: int, cafile: Path, deadline: float, addresses: int = 0) -> None:
        self.port = port
        self.addresses = addresses
        self.ctx = client_context(cafile)
        self.deadline = deadline
        self.open = {"slowloris": 0, "idle": 0, "silent_tls": 0, "wrong_password": 0}
        self.peak = dict(self.open)
        self.opened = dict(self.open)
        self.statuses: dict[str, int] = {}

    def _source(self, index: int) -> tuple[str, int] | None:
        """The attacker's own address for its `index`th connection: 127.0.0.2 and up (0: the scraper's)."""
        if not self.addresses:
            return None
        return (f"127.0.0.{2 + index % self.addresses}", 0)

    def _up(self, kind: str) -> None:
        self.open[kind] += 1
        self.opened[kind] += 1
        self.peak[kind] = max(self.peak[kind], self.open[kind])

    async def _hold(self, kind: str, index: int) -> None:
        await asyncio.sleep(random.random() * 3)  # ramp up over 3 s
        while time.monotonic() < self.deadline:
            writer = None
            source = self._source(index)
            try:
                if kind == "idle":
                    reader, writer = await asyncio.open_connection("127.0.0.1", self.port, local_addr=source)
                    self._up(kind)
                    await reader.read(1)  # returns when the server closes
                elif kind == "silent_tls":
                    reader, writer = await asyncio.open_connection("127.0.0.1", self.port, local_addr=source)
                    self._up(kind)
                    writer.write(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # the start of a ClientHello
                    await reader.read(1)
                elif kind == "slowloris":
                    reader, slow = await asyncio.wait_for(
                        asyncio.open_connection("127.0.0.1", self.port, ssl=self.ctx, local_addr=source), 30
                    )
                    writer = slow
                    self._up(kind)
                    slow.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                    while time.monotonic() < self.deadline:
                        await asyncio.sleep(4)
                        slow.write(b"X")
                        await slow.drain()
                        if reader.at_eof():
                            break
                else:
                    await self._guess(index)
            except (TimeoutError, OSError, ssl.SSLError, EOFError):
                pass
            finally:
                if writer is not None:
                    self.open[kind] -= 1
                    writer.close()
            # Then come back, as slowloris does when it re-creates its sockets (every 15 s there).
            await asyncio.sleep(float(os.environ.get("ABUSE_RECONNECT_AFTER", RECONNECT_AFTER)))

    async def _guess(self, index: int) -> None:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", self.port, ssl=self.ctx, local_addr=self._source(index)), 30
        )
        self._up("wrong_password")
        try:
            while time.monotonic() < self.deadline:
                guess = f"guess-{index}-{random.random()}"
                writer.write(
                    f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: {auth_header(USER, guess)}\r\n\r\n".encode()
                )
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
                status = head.split(b" ", 2)[1].decode()
                self.statuses[status] = self.statuses.get(status, 0) + 1
                length = re.search(rb"(?i)content-length:\s*(\d+)", head)
                await reader.readexactly(int(length[1]) if length else 0)
                if b"onnection: close" in head:
                    return
        finally:
            self.open["wrong_password"] -= 1
            writer.close()


async def attack_main(
    port: int, cafile: Path, seconds: float, counts: dict[str, int], out: Path, addresses: int
) -> None:
    attack = Attack(port, cafile, time.monotonic() + seconds, addresses)
    tasks = [asyncio.create_task(attack._hold(kind, i)) for kind, n in counts.items() for i in range(n)]
    await asyncio.wait(tasks, timeout=seconds + 40)
    out.write_text(json.dumps({"peak_open": attack.peak, "opened": attack.opened, "statuses": attack.statuses}))
    os._exit(0)  # leftover tasks and sockets: the process is done


def attack_role(
    port: int, cafile: Path, seconds: float, counts: dict[str, int], out: Path, nice: int, addresses: int
) -> None:
    raise_nofile(sum(counts.values()) * 2 + 1024)
    if set(counts) != {"wrong_password"} and nice:
        # A real attacker's CPU is on other machines; here the client side of thousands of TLS
        # handshakes shares the cores with the exporter and the scrapers. A nice value keeps it
        # from starving them, but on a busy machine it then cannot open its connections at all.
        os.nice(nice)
    asyncio.run(attack_main(port, cafile, seconds, counts, out, addresses))


# -- orchestration -------------------------------------------------------------------------------


def percentiles(samples: list[float]) -> str:
    if len(samples) < 2:
        return f"n={len(samples)}"
    ms = sorted(s * 1000 for s in samples)
    p99 = statistics.quantiles(ms, n=100, method="inclusive")[98]
    return f"n={len(ms)} p50={statistics.median(ms):.1f} ms p99={p99:.1f} ms max={ms[-1]:.1f} ms"


def role(name: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, __file__, "--role", name, *args])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--tree",
        type=Path,
        default=Path(__file__).resolve().parent.parent,
        help="checkout whose rnic_exporter to run (default: this one)",
    )
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--slowloris", type=int, default=4000)
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--wrong-password", type=int, default=60)
    parser.add_argument("--silent-tls", type=int, default=200)
    parser.add_argument("--baseline-seconds", type=float, default=5)
    parser.add_argument("--attack-seconds", type=float, default=25)
    parser.add_argument(
        "--attacker-nice",
        type=int,
        default=0,
        help="nice value of the connection attacker (its TLS client work shares the cores)",
    )
    parser.add_argument(
        "--attacker-addresses",
        type=int,
        default=4,
        help="loopback addresses the attackers connect from (127.0.0.2 and up; the scrapers use 127.0.0.1, "
        "as Prometheus has an address of its own); 0: the attackers share the scrapers' address",
    )
    parser.add_argument(
        "--exporter-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for `serve`, e.g. --exporter-arg=--web.max-connections=1024",
    )
    parser.add_argument("--role", choices=["scrape", "attack"], help=argparse.SUPPRESS)
    parser.add_argument("args", nargs="*", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.role == "scrape":
        scrape_role(int(opts.args[0]), Path(opts.args[1]), float(opts.args[2]), Path(opts.args[3]), opts.args[4])
        return
    if opts.role == "attack":
        attack_role(
            int(opts.args[0]),
            Path(opts.args[1]),
            float(opts.args[2]),
            json.loads(opts.args[3]),
            Path(opts.args[4]),
            int(opts.args[5]),
            int(opts.args[6]),
        )
        return

    import bcrypt

    from rnic_exporter.sim import SimHost

    # A stopped bench still stops its exporter (the finally blocks below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))

    work = Path(tempfile.mkdtemp(prefix="rnic-abuse-"))
    try:
        SimHost.build(work / "sys", roce=opts.devices, gid_table_size=255)
        make_certs(work)
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()
        (work / "web.yml").write_text(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
            f"basic_auth_users:\n  {USER}: '{hashed}'\n"
        )
        port = free_port()
        env = tree_env(opts.tree)
        args = [
            sys.executable,
            "-S",
            "-m",
            "rnic_exporter",
            "serve",
            "--path.sysfs",
            str(work / "sys"),
            "--web.listen-address",
            f"127.0.0.1:{port}",
            "--state.dir",
            str(work / "state"),
            "--web.config.file",
            str(work / "web.yml"),
            "--log.level",
            "error",
            "--no-watch.netlink",
            "--no-watch.udev",
            "--no-collector.ethtool",
            *opts.exporter_arg,
        ]
        # A container's descriptor limit is usually far above a login shell's 1024; give the
        # exporter room so what is measured is its own behaviour, not EMFILE.
        server = subprocess.Popen(
            args,
            env=env,
            cwd=work,
            stderr=subprocess.DEVNULL,
            preexec_fn=lambda: raise_nofile(16384),  # noqa: PLW1509 (before any thread)
        )
        try:
            run(opts, server, port, work)
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(15)
            except subprocess.TimeoutExpired:
                server.kill()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def tree_env(tree: Path) -> dict[str, str]:
    """Run `tree`'s rnic_exporter even when another checkout is installed in editable mode.

    With -S no .pth file runs, so the editable install's import hook does not win; the
    dependencies still come from this interpreter's site-packages, given as a plain path.
    """
    import site

    paths = [str(tree.resolve()), *site.getsitepackages()]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def wait_ready(port: int, cafile: Path, server: subprocess.Popen[bytes]) -> None:
    ctx = client_context(cafile)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the exporter exited with {server.returncode}")
        try:
            conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=ctx)
            conn.request("GET", "/metrics", headers={"Authorization": auth_header(USER, PASSWORD)})
            response = conn.getresponse()
            if response.status == 200 and b"\n" in response.read():
                return
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(0.1)
    raise SystemExit("the exporter did not serve metrics within 60 s")


def window(result: dict[str, Any], start: float, end: float) -> str:
    samples = [took for when, took in result["done"] if start <= when < end]
    failed = sum(1 for when in result["failed"] if start <= when < end)
    return f"{percentiles(samples)}, failed {failed}"


def sample_for(seconds: float, pid: int, peak: dict[str, int]) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for key, value in proc_status(pid).items():
            peak[key] = max(peak.get(key, 0), value)
        time.sleep(0.25)


def sample_while(proc: subprocess.Popen[bytes], pid: int, peak: dict[str, int]) -> None:
    while proc.poll() is None:
        for key, value in proc_status(pid).items():
            peak[key] = max(peak.get(key, 0), value)
        time.sleep(0.25)


def run(opts: Any, server: subprocess.Popen[bytes], port: int, work: Path) -> None:
    cafile = work / "server.crt"
    wait_ready(port, cafile, server)
    version = subprocess.run(
        [sys.executable, "-S", "-c", "import rnic_exporter; print(rnic_exporter.__file__)"],
        env=tree_env(opts.tree),
        cwd=work,
        capture_output=True,
        text=True,
    ).stdout.strip()
    print(f"exporter code: {version}")
    idle = proc_status(server.pid)
    print(f"exporter at rest: RSS {idle['rss_kb'] / 1024:.1f} MiB, {idle['threads']} threads, {idle['fds']} fds")

    # The keep-alive scraper connects before the attack, as Prometheus' connection would exist;
    # the fresh-connection one opens a new connection for every scrape.
    total = opts.baseline_seconds + RAMP_UP + opts.attack_seconds
    scrapers = {
        mode: role("scrape", str(port), str(cafile), str(total), str(work / f"{mode}.json"), mode)
        for mode in ("keep_alive", "fresh")
    }
    started = time.monotonic()
    peak: dict[str, int] = {}
    sample_for(opts.baseline_seconds, server.pid, {})
    counts = {
        "slowloris": opts.slowloris,
        "idle": opts.idle,
        "silent_tls": opts.silent_tls,
        "wrong_password": opts.wrong_password,
    }
    attack_start = time.monotonic()
    cpu_before = cpu_seconds(server.pid)
    groups = {
        "connections": {k: v for k, v in counts.items() if k != "wrong_password"},
        "guesses": {"wrong_password": counts["wrong_password"]},
    }
    attackers = [
        role(
            "attack",
            str(port),
            str(cafile),
            str(RAMP_UP + opts.attack_seconds + 5),
            json.dumps(group),
            str(work / f"attack-{name}.json"),
            str(opts.attacker_nice),
            str(opts.attacker_addresses),
        )
        for name, group in groups.items()
    ]
    sample_for(RAMP_UP, server.pid, peak)
    measured = time.monotonic()
    for proc in scrapers.values():
        sample_while(proc, server.pid, peak)
    measured_end = time.monotonic()
    cpu = cpu_seconds(server.pid) - cpu_before
    attacker_cpu = sum(cpu_seconds(attacker.pid) for attacker in attackers if attacker.poll() is None)
    for attacker in attackers:
        attacker.wait(120)
    results = {mode: json.loads((work / f"{mode}.json").read_text()) for mode in scrapers}
    attack: dict[str, dict[str, int]] = {"peak_open": {}, "opened": {}, "statuses": {}}
    for name in groups:
        path = work / f"attack-{name}.json"
        for key, values in (json.loads(path.read_text()) if path.exists() else {}).items():
            for kind, n in values.items():
                attack[key][kind] = attack[key].get(kind, 0) + n
    for mode, result in results.items():
        print(f"no attack, {mode} scrape: {window(result, started, attack_start)}")
    sources = (
        f"from {opts.attacker_addresses} addresses of their own (127.0.0.2 and up)"
        if opts.attacker_addresses
        else "from the scrapers' address"
    )
    print(f"attack: {counts}, {sources}, measured after a {RAMP_UP:.0f} s ramp-up")
    print(
        f"attackers' concurrent connections at peak (as they saw them): {attack.get('peak_open')}; "
        f"opened in all: {attack.get('opened')}; wrong-password answers by status: {attack.get('statuses')}"
    )
    for mode, result in results.items():
        print(f"under attack, {mode} scrape: {window(result, measured, measured_end)}")
        phases = [p for p in result.get("phases", []) if measured <= p[0] < measured_end]
        for i, phase in enumerate(("TCP connect", "accept + TLS handshake", "request")):
            if phases:
                print(f"  {phase}: {percentiles([p[i + 1] for p in phases])}")
    print(
        f"exporter under attack: peak RSS {peak.get('rss_kb', 0) / 1024:.1f} MiB (DaemonSet limit "
        f"{DAEMONSET_LIMIT_MIB} MiB), peak {peak.get('threads')} threads, peak {peak.get('fds')} fds, "
        f"{cpu / (measured_end - attack_start) * 100:.0f}% of a core"
    )
    # The attackers share this machine's cores: what they burn (reconnecting after the exporter
    # closes them costs them TLS handshakes) is taken from the exporter and the scrapers too.
    print(f"attackers' own CPU: {attacker_cpu / (measured_end - attack_start) * 100:.0f}% of a core")
    if server.poll() is not None:
        print(f"the exporter died: exit {server.returncode}")


if __name__ == "__main__":
    main()
