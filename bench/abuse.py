"""The HTTP front under abuse: a well-behaved scraper's latency and the exporter's memory during attacks.

Runs `rnic-exporter serve` over a simulated host with TLS and basic auth (bcrypt cost 10), then,
all on loopback:
- a scraper (its own process) scrapes every 0.1 s over one keep-alive HTTPS connection, as
  Prometheus does, and also over a fresh connection each time;
- an attacker process holds (and re-opens when closed) N slowloris connections (TLS handshake
  done, then a header byte every few seconds), M idle TCP connections, silent TLS clients (half a
  ClientHello, then nothing) and K clients sending wrong passwords (a new guess each request),
  from loopback addresses of their own (127.0.0.2 and up; the scrapers use 127.0.0.1).
In three phases, printed side by side: `quiet` (no attack), `floor` (the same attack on a second,
decoy exporter of the same code and config, while the scrapers scrape the first: what the
attackers and the server side of their connections cost this machine's cores, which no exporter
can give back) and `attack` (the attack on the scraped exporter). The difference between the last
two is what the exporter's handling of the attack costs its scrapers. Also printed: where a fresh
scrape's time goes on the client's clock (TCP connect, TLS, the answer), failed scrapes, the
exporter's peak RSS, threads and descriptors, the load average. Bounded: fixed durations and counts.

    python bench/abuse.py                      # this tree
    python bench/abuse.py --tree ../other/tree # the same bench against another checkout's code
    python bench/abuse.py --phases attack      # only the attack (no floor)
    python bench/abuse.py --phases quiet,attack --tree A --tree B --rounds 2
                                               # A, B, A, B in one window, then one line per run
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import cpu_seconds

from tests.support.processes import free_port
from tests.support.serve import serve_args

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


def scrape_role(port: int, cafile: Path, seconds: float, out: Path, mode: str, phase: str) -> None:
    ctx = client_context(cafile)
    headers = {"Authorization": auth_header(USER, PASSWORD), "Accept-Encoding": "gzip"}
    done: list[tuple[float, float]] = []  # (when it started, how long it took), monotonic clock
    failed: list[float] = []  # when it started
    # Per scrape, its timeline (monotonic): started, TCP connected, TLS done (fresh only), request
    # sent, response read.
    timeline: dict[str, dict[str, float]] = {}
    conn: http.client.HTTPSConnection | None = None
    count = 0

    def one(c: http.client.HTTPSConnection, marks: dict[str, float]) -> None:
        marks["sent"] = time.monotonic()
        c.request("GET", "/metrics", headers=headers)
        response = c.getresponse()
        response.read()
        marks["received"] = time.monotonic()
        if response.status != 200:
            raise OSError(f"status {response.status}")

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.monotonic()
        count += 1
        scrape_id = f"{phase}/{mode}/{count}"
        marks = {"started": started}
        if mode == "keep_alive":
            try:
                if conn is None:
                    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=ctx)
                one(conn, marks)
                done.append((started, time.monotonic() - started))
                timeline[scrape_id] = marks
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
                marks["connected"] = time.monotonic()
                fresh_conn.sock = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
                marks["tls"] = time.monotonic()
                one(fresh_conn, marks)
                done.append((started, time.monotonic() - started))
                timeline[scrape_id] = marks
            except (OSError, http.client.HTTPException):
                failed.append(started)
            finally:
                fresh_conn.close()
        time.sleep(max(0.0, INTERVAL - (time.monotonic() - started)))
    out.write_text(json.dumps({"done": done, "failed": failed, "timeline": timeline}))


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

    async def hold(self, kind: str, index: int) -> None:
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
    tasks = [asyncio.create_task(attack.hold(kind, i)) for kind, n in counts.items() for i in range(n)]
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


def quantiles(samples: list[float]) -> tuple[float, float, float]:
    """p50, p99 and max of `samples` (seconds), in ms."""
    ms = sorted(x * 1000 for x in samples)
    p99 = statistics.quantiles(ms, n=100, method="inclusive")[98] if len(ms) > 1 else ms[0]
    return statistics.median(ms), p99, ms[-1]


def percentiles(samples: list[float]) -> str:
    if len(samples) < 2:
        return f"n={len(samples)}"
    p50, p99, top = quantiles(samples)
    return f"n={len(samples)} p50={p50:.1f} ms p99={p99:.1f} ms max={top:.1f} ms"


def role(name: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, __file__, "--role", name, *args])


PHASES = {
    "quiet": "no attack",
    "floor": "the attack on a decoy exporter (same code, same config) on this machine: the machine's cost",
    "attack": "the attack on the scraped exporter",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--tree",
        type=Path,
        action="append",
        help="checkout whose rnic_exporter to run (default: this one); repeat to compare trees, alternating",
    )
    parser.add_argument("--rounds", type=int, default=1, help="runs of each tree, alternating (default 1)")
    parser.add_argument("--json", type=Path, help=argparse.SUPPRESS)  # one run's summary, for --rounds
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--slowloris", type=int, default=4000)
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--wrong-password", type=int, default=60)
    parser.add_argument("--silent-tls", type=int, default=200)
    parser.add_argument("--baseline-seconds", type=float, default=5, help="the quiet phase's measured seconds")
    parser.add_argument("--attack-seconds", type=float, default=25, help="each attack phase's measured seconds")
    parser.add_argument(
        "--phases",
        default="quiet,floor,attack",
        help="comma-separated, in this order: " + "; ".join(f"{k}: {v}" for k, v in PHASES.items()),
    )
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
        scrape_role(
            int(opts.args[0]), Path(opts.args[1]), float(opts.args[2]), Path(opts.args[3]), opts.args[4], opts.args[5]
        )
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
    phases = [p for p in opts.phases.split(",") if p]
    if not phases or set(phases) - set(PHASES):
        raise SystemExit(f"--phases: choose from {', '.join(PHASES)}")
    opts.tree = opts.tree or [Path(__file__).resolve().parent.parent]
    if len(opts.tree) > 1 or opts.rounds > 1:
        alternate(opts, sys.argv[1:])
        return
    opts.tree = opts.tree[0]

    import bcrypt

    from rnic_exporter.sim import SimHost

    # A stopped bench still stops its exporters (the finally blocks below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))

    work = Path(tempfile.mkdtemp(prefix="rnic-abuse-"))
    servers: dict[str, Exporter] = {}
    try:
        SimHost.build(work / "sys", roce=opts.devices, gid_table_size=255)
        make_certs(work)
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()
        (work / "web.yml").write_text(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
            f"basic_auth_users:\n  {USER}: '{hashed}'\n"
        )
        servers["target"] = Exporter.start(opts, work, "target")
        if "floor" in phases:
            servers["decoy"] = Exporter.start(opts, work, "decoy")
        run(opts, servers, work, phases)
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


class Exporter:
    """One `rnic-exporter serve` over the simulated host, TLS and basic auth."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int) -> None:
        self.proc = proc
        self.port = port
        self.pid = proc.pid

    @classmethod
    def start(cls, opts: Any, work: Path, name: str) -> Exporter:
        port = free_port()
        env = tree_env(opts.tree)
        args = [
            sys.executable,
            "-S",
            "-m",
            "rnic_exporter",
            *serve_args(work / "sys", port, state_dir=work / f"state-{name}"),
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
        proc = subprocess.Popen(
            args,
            env=env,
            cwd=work,
            stderr=subprocess.DEVNULL,
            preexec_fn=lambda: raise_nofile(16384),  # noqa: PLW1509 (before any thread)
        )
        return cls(proc, port)

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


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


def sample_while(procs: list[subprocess.Popen[bytes]], pid: int, peak: dict[str, int]) -> None:
    while any(proc.poll() is None for proc in procs):
        for key, value in proc_status(pid).items():
            peak[key] = max(peak.get(key, 0), value)
        time.sleep(0.25)


@dataclass
class PhaseRun:
    name: str
    start: float = 0.0  # when its measured window opens (after the ramp-up), monotonic
    end: float = 0.0
    results: dict[str, Any] = field(default_factory=dict)  # scraper mode -> its JSON
    attack: dict[str, dict[str, int]] = field(default_factory=dict)
    peak: dict[str, int] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)  # process -> share of a core over the window
    loadavg: str = ""


def run(opts: Any, servers: dict[str, Exporter], work: Path, phases: list[str]) -> None:
    cafile = work / "server.crt"
    target = servers["target"]
    for server in servers.values():
        wait_ready(server.port, cafile, server.proc)
    version = subprocess.run(
        [sys.executable, "-S", "-c", "import rnic_exporter; print(rnic_exporter.__file__)"],
        env=tree_env(opts.tree),
        cwd=work,
        capture_output=True,
        text=True,
    ).stdout.strip()
    print(f"exporter code: {version}")
    idle = proc_status(target.pid)
    print(f"exporter at rest: RSS {idle['rss_kb'] / 1024:.1f} MiB, {idle['threads']} threads, {idle['fds']} fds")
    counts = {
        "slowloris": opts.slowloris,
        "idle": opts.idle,
        "silent_tls": opts.silent_tls,
        "wrong_password": opts.wrong_password,
    }
    sources = (
        f"from {opts.attacker_addresses} addresses of their own (127.0.0.2 and up)"
        if opts.attacker_addresses
        else "from the scrapers' address"
    )
    print(f"attack: {counts}, {sources}; each phase measured after a {RAMP_UP:.0f} s ramp-up")
    runs = [run_phase(opts, name, target, servers.get("decoy"), counts, work) for name in phases]
    report(runs)
    if opts.json:
        opts.json.write_text(json.dumps(summary(runs)))


def run_phase(
    opts: Any, name: str, target: Exporter, decoy: Exporter | None, counts: dict[str, int], work: Path
) -> PhaseRun:
    cafile = work / "server.crt"
    seconds = opts.baseline_seconds if name == "quiet" else opts.attack_seconds
    phase = PhaseRun(name)
    # The keep-alive scraper connects before the attack, as Prometheus' connection would exist;
    # the fresh-connection one opens a new connection for every scrape.
    scrapers = {
        mode: role("scrape", str(target.port), str(cafile), str(RAMP_UP + seconds), str(work / f"{name}-{mode}.json"),
                   mode, name)
        for mode in ("keep_alive", "fresh")
    }  # fmt: skip
    attackers: list[subprocess.Popen[bytes]] = []
    if name != "quiet":
        attacked = target if name == "attack" else decoy
        assert attacked is not None
        groups = {
            "connections": {k: v for k, v in counts.items() if k != "wrong_password"},
            "guesses": {"wrong_password": counts["wrong_password"]},
        }
        attackers = [
            role(
                "attack",
                str(attacked.port),
                str(cafile),
                str(RAMP_UP + seconds + 5),
                json.dumps(group),
                str(work / f"{name}-attack-{group_name}.json"),
                str(opts.attacker_nice),
                str(opts.attacker_addresses),
            )
            for group_name, group in groups.items()
        ]
    time.sleep(RAMP_UP)
    phase.start = time.monotonic()
    cpu_before = {"exporter": cpu_seconds(target.pid)}
    if decoy is not None:
        cpu_before["decoy"] = cpu_seconds(decoy.pid)
    sample_while(list(scrapers.values()), target.pid, phase.peak)
    phase.end = time.monotonic()
    window = phase.end - phase.start
    phase.cpu = {"exporter": (cpu_seconds(target.pid) - cpu_before["exporter"]) / window}
    if decoy is not None:
        phase.cpu["decoy"] = (cpu_seconds(decoy.pid) - cpu_before["decoy"]) / window
    # The attackers share this machine's cores: what they burn (reconnecting after the exporter
    # closes them costs them TLS handshakes) is taken from the exporter and the scrapers too.
    phase.cpu["attackers"] = sum(cpu_seconds(a.pid) for a in attackers if a.poll() is None) / (RAMP_UP + window)
    phase.loadavg = Path("/proc/loadavg").read_text().split(" ", 1)[0]  # 1-min
    for attacker in attackers:
        attacker.wait(120)
    phase.results = {mode: json.loads((work / f"{name}-{mode}.json").read_text()) for mode in scrapers}
    phase.attack = {"peak_open": {}, "opened": {}, "statuses": {}}
    for path in work.glob(f"{name}-attack-*.json"):
        for key, values in json.loads(path.read_text()).items():
            for kind, n in values.items():
                phase.attack[key][kind] = phase.attack[key].get(kind, 0) + n
    if attackers:  # let the attacked exporter close what the attackers left before the next phase
        time.sleep(2)
    return phase


# Where a fresh scrape's time goes, on the client's clock.
STAGES = [("TCP connect", "started", "connected"), ("TLS", "connected", "tls"), ("the answer", "sent", "received")]


def measured(phase: PhaseRun, mode: str) -> tuple[list[float], int]:
    """A scraper's scrape times in the phase's window, and how many failed there."""
    result = phase.results[mode]
    samples = [took for when, took in result["done"] if phase.start <= when < phase.end]
    return samples, sum(1 for when in result["failed"] if phase.start <= when < phase.end)


def summary(runs: list[PhaseRun]) -> dict[str, Any]:
    """Per phase: each scraper's p99 (ms) and failures, peak RSS (MiB), load average."""
    out: dict[str, Any] = {}
    for phase in runs:
        row: dict[str, Any] = {"rss_mib": phase.peak.get("rss_kb", 0) / 1024, "load": phase.loadavg}
        for mode in ("keep_alive", "fresh"):
            samples, failed = measured(phase, mode)
            row[mode] = {"p99_ms": quantiles(samples)[1] if len(samples) > 1 else None, "failed": failed}
        out[phase.name] = row
    return out


def report(runs: list[PhaseRun]) -> None:
    print("\n## a well-behaved scraper (every 0.1 s) by phase: p50 / p99 / max in ms")
    for phase in runs:
        print(f"  {phase.name}: {PHASES[phase.name]}; load average (1 min) at its end {phase.loadavg}")
    print(f"  {'scrape':<11} " + " ".join(f"{p.name:>26}" for p in runs))
    for mode in ("keep_alive", "fresh"):
        cells = []
        for phase in runs:
            samples, failed = measured(phase, mode)
            if len(samples) < 2:
                cells.append(f"{'n=' + str(len(samples)):>26}")
                continue
            p50, p99, top = quantiles(samples)
            cells.append(f"{p50:7.1f} {p99:7.1f} {top:7.1f}" + (f" F{failed}" if failed else "   "))
        print(f"  {mode:<11} " + " ".join(f"{c:>26}" for c in cells))
    for phase in runs:
        if phase.attack.get("peak_open"):
            print(
                f"  {phase.name}: attackers' connections at peak (as they saw them) {phase.attack['peak_open']}; "
                f"opened {phase.attack['opened']}; wrong-password answers {phase.attack['statuses']}"
            )
    print("\n## where a fresh scrape's time goes (p50 / p99 / max ms, the client's clock)")
    for phase in runs:
        marks = [m for m in phase.results["fresh"]["timeline"].values() if phase.start <= m["started"] < phase.end]
        parts = []
        for label, a, b in STAGES:
            spans = [m[b] - m[a] for m in marks if a in m and b in m]
            if len(spans) > 1:
                parts.append("{} {:.1f} / {:.1f} / {:.1f}".format(label, *quantiles(spans)))
        print(f"  {phase.name}: " + "; ".join(parts))
    print("\n## the scraped exporter by phase")
    for phase in runs:
        cpu = ", ".join(f"{k} {v * 100:.0f}%" for k, v in phase.cpu.items())
        print(
            f"  {phase.name:<7} peak RSS {phase.peak.get('rss_kb', 0) / 1024:5.1f} MiB (DaemonSet limit "
            f"{DAEMONSET_LIMIT_MIB} MiB), peak {phase.peak.get('threads')} threads, {phase.peak.get('fds')} fds; "
            f"CPU (of one core): {cpu}"
        )


def alternate(opts: Any, argv: list[str]) -> None:
    """Each tree in turn, `--rounds` times, each run in a process of its own; then one line per run."""
    rows = []
    passed: list[str] = []
    skip = False
    for arg in argv:  # the same arguments less --tree and --rounds (as `--flag value` or `--flag=value`)
        if not skip and not arg.startswith(("--tree", "--rounds")):
            passed.append(arg)
        skip = arg in ("--tree", "--rounds")
    for round_ in range(1, opts.rounds + 1):
        for tree in opts.tree:
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                print(f"\n# {tree} (round {round_})", flush=True)
                args = [sys.executable, __file__, *passed, "--tree", str(tree), "--json", out.name]
                subprocess.run(args, check=False)
                result = json.loads(Path(out.name).read_text() or "{}")
            rows.append((tree, round_, result))
    print("\n## runs in order: p99 ms (failed) per scraper, peak RSS MiB, 1-min load at the phase's end")
    for tree, round_, result in rows:
        cells = [
            f"{name}: keep-alive {fmt(row['keep_alive'])}, fresh {fmt(row['fresh'])}, "
            f"RSS {row['rss_mib']:.1f}, load {row['load']}"
            for name, row in result.items()
        ]
        print(f"  {tree} #{round_}: " + " | ".join(cells or ["failed"]))


def fmt(scraper: dict[str, Any]) -> str:
    p99 = "n/a" if scraper["p99_ms"] is None else f"{scraper['p99_ms']:.1f}"
    return p99 + (f" (F{scraper['failed']})" if scraper["failed"] else "")


if __name__ == "__main__":
    main()
