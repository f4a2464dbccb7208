"""Host side of the kernel lab: find the tools, stage the code, boot Debian's kernel once, run scenarios.

One boot runs every selected scenario in one in-VM driver process (tests/kernel/driver.py). Python
over 9p under TCG emulation is the expensive part, so before booting the host stages the package,
the lab code and the runtime closure of the `rnic-exporter` distribution into one tar with
precompiled bytecode; the guest unpacks it into its tmpfs and imports from there (one 9p read
instead of hundreds of stat/open round trips). Every step has a deadline and the VM (its whole
process group) is killed when one passes.
"""

from __future__ import annotations

import compileall
import contextlib
import glob
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[2]
LAB_DIR = Path(__file__).resolve().parent
SCENARIO_DIR = LAB_DIR / "scenarios"
BOOT_DEADLINE_S = 300.0  # qemu start to the driver's first word: ~35 s on a quiet host (TCG), 150 s seen under load 10
SCENARIO_DEADLINE_S = 300.0
TOTAL_DEADLINE_S = 20 * 60.0
KVM_PROBE_DEADLINE_S = 25.0
LAUNCH_ATTEMPTS = 2  # a launcher that exits before the guest's first word is tried once more (`_launch`)
GUEST_STAGE = "/tmp/kernel-lab-stage"  # the guest's /tmp is a tmpfs-backed overlay
ACCEL_ENV = "RNIC_KERNEL_LAB_ACCEL"  # auto (default), kvm or tcg
KERNEL_ENV = "RNIC_KERNEL_LAB_KERNEL"  # a version (6.12.118+deb12-amd64) or a prefix of one (6.12)
# The second kernel runs these (the rest only on the first): what differs across kernels is the
# RDMA core's and rxe's behaviour (sysfs, netlink, events), which these cover; the incident replays
# (NetworkManager, QP holders, renames) are about userspace and ~6 min more per kernel under TCG.
# wire_ethtool is the driver's ethtool ops and the ethtool netlink core (12-22 s a kernel),
# netlink_serve the daemon's counter path over RDMA netlink (38-42 s a kernel).
SECOND_KERNEL_SCENARIOS = ("healthy", "events", "nldev", "tap_speed", "wire_ethtool", "netlink_serve")
# Scenarios that need an emulated NIC with real ethtool operations (link state, `ethtool -S`,
# pause): QEMU's e1000e (igb needs QEMU 8.0) behind user-mode networking, which gives it carrier.
# The boot adds it only when one of them is selected; the guest sees it once e1000e is loaded.
NIC_SCENARIOS = ("wire_ethtool",)
NIC_QEMU_OPTS = "-device e1000e,netdev=labnic -netdev user,id=labnic"
PACKAGES = {
    "qemu-system-x86_64": "qemu-system-x86",
    "vng": "virtme-ng (pip install virtme-ng into the venv, and put its bin/ on PATH)",
    "kernel": "linux-image-amd64",
    "kernel2": "linux-image-6.12-amd64 (bookworm-security)",
    "rdma": "iproute2 (rdma tool)",
    "ethtool": "ethtool",
    "modprobe": "kmod",
    "ibv_devices": "ibverbs-utils (with rdma-core and ibverbs-providers)",
    "busybox": "busybox-static",
}


class LabSetupError(RuntimeError):
    """The lab cannot run here: the message names the missing Debian or pip package."""


@dataclass
class Tools:
    vng: str
    qemu: str
    kernel: Path
    python: Path


def all_scenarios() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.py") if not p.name.startswith("_"))


def _venv_bin() -> Path:
    return Path(sys.executable).parent


def lab_kernels() -> list[Path]:
    """Every installed /boot/vmlinuz-* whose modules have rdma_rxe, oldest first."""
    found = sorted(glob.glob("/boot/vmlinuz-*"), key=_kernel_sort_key)
    return [Path(k) for k in found if _has_rxe(Path(k))]


def pick_kernel(which: str | None = None) -> Path | None:
    """`which`: "first" (default: the oldest, Debian's `linux-image-amd64`, the lab's reference),
    "second" (the newest, when it is another one), or a version or its prefix ("6.12");
    RNIC_KERNEL_LAB_KERNEL gives the default. None when no installed kernel fits."""
    kernels = lab_kernels()
    choice = which or os.environ.get(KERNEL_ENV) or "first"
    if not kernels:
        return None
    if choice == "first":
        return kernels[0]
    if choice == "second":
        return kernels[-1] if len(kernels) > 1 else None
    matching = [k for k in kernels if k.name.removeprefix("vmlinuz-").startswith(choice)]
    return matching[-1] if matching else None


def find_tools(kernel: str | None = None) -> Tools:
    """Everything the lab needs on the host, or LabSetupError naming the package that brings it."""
    missing: list[str] = []
    path = os.pathsep.join([str(_venv_bin()), os.environ.get("PATH", "")])
    found: dict[str, str] = {}
    for tool in ("qemu-system-x86_64", "vng", "rdma", "ethtool", "modprobe", "ibv_devices", "busybox"):
        where = shutil.which(tool, path=path)
        if where is None:
            missing.append(f"{tool}: install {PACKAGES[tool]}")
        else:
            found[tool] = where
    chosen = pick_kernel(kernel)
    if chosen is None:
        have = ", ".join(k.name for k in lab_kernels()) or "none"
        package = PACKAGES["kernel2"] if kernel == "second" else PACKAGES["kernel"]
        missing.append(f"a kernel with rdma_rxe ({kernel or 'first'}; installed: {have}): install {package}")
    if missing:
        raise LabSetupError("the kernel lab cannot run:\n  " + "\n  ".join(missing))
    assert chosen is not None
    return Tools(found["vng"], found["qemu-system-x86_64"], chosen, Path(sys.executable))


def _kernel_sort_key(path: str) -> list[int | str]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path)]


def _has_rxe(kernel: Path) -> bool:
    version = kernel.name.removeprefix("vmlinuz-")
    return bool(glob.glob(f"/lib/modules/{version}/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko*"))


# -- staging ------------------------------------------------------------------------------------


def _requirement_names(dist: metadata.Distribution) -> list[str]:
    names = []
    for req in dist.requires or []:
        if "extra ==" in req:
            continue
        m = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req)
        if m:
            names.append(m.group(0))
    return names


def runtime_closure(root: str = "rnic-exporter") -> list[metadata.Distribution]:
    """The installed distributions `rnic-exporter` needs at run time (its requirements, recursively, no extras)."""
    seen: dict[str, metadata.Distribution] = {}
    todo = [root]
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen[name] = dist
        todo.extend(_requirement_names(dist))
    seen.pop("rnic-exporter", None)  # the package itself is staged from the work tree
    return list(seen.values())


def _site_files(dists: Iterable[metadata.Distribution]) -> list[tuple[Path, str]]:
    purelib = Path(sysconfig.get_paths()["purelib"]).resolve()
    files: list[tuple[Path, str]] = []
    for dist in dists:
        for f in dist.files or []:
            src = Path(str(dist.locate_file(f))).resolve()
            try:
                rel = src.relative_to(purelib)
            except ValueError:
                continue  # scripts in bin/ and the like
            if "__pycache__" in rel.parts or rel.parts[0].endswith((".dist-info", ".pth")) or not src.is_file():
                continue
            files.append((src, f"site/{rel}"))
    return files


def _repo_files() -> list[tuple[Path, str]]:
    files: list[tuple[Path, str]] = []
    for top in ("rnic_exporter", "tests/kernel"):
        for src in sorted((REPO / top).rglob("*")):
            if src.is_file() and "__pycache__" not in src.parts and not src.name.endswith(".pyc"):
                files.append((src, f"repo/{src.relative_to(REPO)}"))
    files.append((REPO / "tests/__init__.py", "repo/tests/__init__.py"))
    return files


STDLIB_SKIP = {"test", "tests", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "distutils", "pydoc_data"}


def base_python() -> Path:
    """The interpreter behind the venv (the guest runs it with PYTHONHOME pointing at the staged stdlib)."""
    return Path(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))


def _stdlib_files() -> list[tuple[Path, str]]:
    """The interpreter's stdlib (.py, their non-optimised .pyc, lib-dynload), minus tests, GUI and build tools."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    dest = f"home/lib/{stdlib.name}"
    files: list[tuple[Path, str]] = []
    for dirpath, dirnames, filenames in os.walk(stdlib):
        here = Path(dirpath)
        rel = here.relative_to(stdlib)
        dirnames[:] = [
            d for d in dirnames if d not in STDLIB_SKIP and d != "site-packages" and not d.startswith("config-")
        ]
        for name in filenames:
            if here.name == "__pycache__" and (".opt-" in name or not name.endswith(".pyc")):
                continue
            if here.name != "__pycache__" and not name.endswith((".py", ".so")) and rel.parts[:1] != ("lib-dynload",):
                continue
            files.append((here / name, f"{dest}/{rel / name}"))
    return files


def stage(workdir: Path) -> tuple[Path, dict[str, float]]:
    """Write workdir/stage.tar: repo/ (package + lab), site/ (runtime closure) and home/ (the stdlib), with bytecode."""
    t0 = time.monotonic()
    staged = workdir / "stage"
    if staged.exists():
        shutil.rmtree(staged)
    for src, rel in _repo_files() + _site_files(runtime_closure()) + _stdlib_files():
        dest = staged / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest)
    t1 = time.monotonic()
    ok = all(compileall.compile_dir(str(staged / part), quiet=2, workers=0) for part in ("repo", "site"))
    if not ok:
        raise LabSetupError(f"compileall failed in {staged} (a syntax error in the package or a scenario?)")
    t2 = time.monotonic()
    tar = workdir / "stage.tar"
    with tarfile.open(tar, "w") as tf:
        tf.add(staged, arcname=".")
    shutil.rmtree(staged)
    t3 = time.monotonic()
    figures = {"copy_s": t1 - t0, "compile_s": t2 - t1, "tar_s": t3 - t2, "tar_mb": tar.stat().st_size / 1e6}
    return tar, {k: round(v, 3) for k, v in figures.items()}


# -- booting ------------------------------------------------------------------------------------


def _vng_argv(
    tools: Tools, outdir: Path, exec_cmd: str, kvm: bool, cpus: int, memory: str, nic: bool = False
) -> list[str]:
    argv = [tools.vng, "--run", str(tools.kernel), "--user", "root", "--memory", memory, "--cpus", str(cpus)]
    argv += ["--rwdir", str(outdir), "--cwd", str(REPO)]
    if not kvm:
        argv.append("--disable-kvm")
    if nic:
        argv.append(f"--qemu-opts={NIC_QEMU_OPTS}")  # vng hands it on through a shell: no quoting needed
    argv += ["--exec", exec_cmd]
    return argv


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(_venv_bin()), env.get("PATH", "")])
    return env


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """Kill the VM: vng and its qemu run in their own process group, started by us."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _cache_file() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "rnic-exporter-kernel-lab" / "kvm-probe.json"


def _probe_key(tools: Tools) -> str:
    qemu = subprocess.run([tools.qemu, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    cpu = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name")), "")
    return f"{platform.release()}|{tools.kernel.name}|{qemu}|{cpu}"


def kvm_works(tools: Tools, log: list[str]) -> bool:
    """Can a KVM guest boot here? A cached answer per host kernel/qemu/CPU, else a probe boot with a short deadline."""
    choice = os.environ.get(ACCEL_ENV, "auto")
    if choice in ("kvm", "tcg"):
        log.append(f"accelerator forced by {ACCEL_ENV}={choice}")
        return choice == "kvm"
    try:
        fd = os.open("/dev/kvm", os.O_RDWR)
        os.close(fd)
    except OSError as exc:
        log.append(f"KVM: /dev/kvm unusable ({exc.strerror}): TCG")
        return False
    key = _probe_key(tools)
    cache = _cache_file()
    known: dict[str, bool] = {}
    try:
        cached = json.loads(cache.read_text())
        # one answer per host kernel/qemu/CPU/guest kernel (two guest kernels alternate in a run)
        known = {str(k): bool(v) for k, v in cached.get("probes", {}).items()}
        if "key" in cached:
            known.setdefault(str(cached["key"]), bool(cached["works"]))
        if key in known:
            log.append(f"KVM: cached probe result {known[key]} ({cache}; delete it to probe again)")
            return known[key]
    except (OSError, ValueError, AttributeError):
        pass
    probe_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"kernel-lab-kvm-probe-{os.getpid()}"
    probe_dir.mkdir(parents=True, exist_ok=True)
    marker = probe_dir / "ok"
    argv = _vng_argv(tools, probe_dir, f"touch {shlex.quote(str(marker))}", True, 1, "512M")
    start = time.monotonic()
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=_env()
    )
    while proc.poll() is None and not marker.exists() and time.monotonic() - start < KVM_PROBE_DEADLINE_S:
        time.sleep(0.2)
    works = marker.exists()
    _kill(proc)
    shutil.rmtree(probe_dir, ignore_errors=True)
    log.append(f"KVM: probe boot {'succeeded' if works else 'failed or hung'} in {time.monotonic() - start:.1f} s")
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"probes": {**known, key: works}}))
    return works


@dataclass
class RunReport:
    outdir: Path
    accel: str
    scenarios: list[str]
    figures: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    failure: str | None = None
    kernel: str = ""

    def result(self, name: str) -> Any:
        path = self.outdir / name / "result.json"
        if not path.exists():
            return None
        return json.loads(path.read_text())

    def scenario_seconds(self) -> dict[str, float]:
        return {e["name"]: e["seconds"] for e in self.events if e["event"] == "scenario_end"}

    def summary(self) -> str:
        accel = f"{self.accel.upper()} ({'KVM' if self.accel == 'kvm' else 'emulation, no KVM'})"
        lines = [f"kernel lab: {self.kernel or 'kernel ?'}, {accel}"]
        lines += [f"  {line}" for line in self.log]
        for key, value in self.figures.items():
            lines.append(f"  {key}: {value}")
        for name, seconds in self.scenario_seconds().items():
            lines.append(f"  scenario {name}: {seconds:.1f} s")
        if self.failure:
            lines.append(f"  FAILED: {self.failure}")
        return "\n".join(lines)


def _read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue  # a line being written
    return events


def run_lab(
    scenarios: list[str],
    outdir: Path,
    *,
    shell: bool = False,
    boot_deadline_s: float = BOOT_DEADLINE_S,
    scenario_deadline_s: float = SCENARIO_DEADLINE_S,
    total_deadline_s: float = TOTAL_DEADLINE_S,
    cpus: int = 2,
    memory: str = "1536M",
    echo: bool = False,
    kernel: str | None = None,
) -> RunReport:
    """Boot once, run `scenarios` in the driver, return the report (results stay in outdir).
    `kernel`: see `pick_kernel` (default: the first, oldest, installed kernel with rdma_rxe)."""
    t_start = time.monotonic()
    tools = find_tools(kernel)
    unknown = [s for s in scenarios if s not in all_scenarios()]
    if unknown:
        raise LabSetupError(f"no such scenario(s): {', '.join(unknown)} (have: {', '.join(all_scenarios())})")
    outdir = outdir.resolve()
    outdir.mkdir(parents=True, exist_ok=True)
    for stale in [outdir / "progress.jsonl", outdir / "console.log", *[outdir / s for s in scenarios]]:
        if stale.is_dir():
            shutil.rmtree(stale)
        elif stale.exists():
            stale.unlink()
    log: list[str] = [f"kernel {tools.kernel}", f"vng {tools.vng}"]
    tar, stage_figures = stage(outdir)
    kvm = kvm_works(tools, log)
    report = RunReport(outdir, "kvm" if kvm else "tcg", scenarios, log=log, kernel=tools.kernel.name)
    report.figures.update({f"stage_{k}": v for k, v in stage_figures.items()})
    site = Path(sysconfig.get_paths()["purelib"])
    stdlib = sysconfig.get_paths()["stdlib"]
    # Staged copies first; the host's own trees (over 9p, slow) only as a fallback for anything not staged.
    pythonpath = f"{GUEST_STAGE}/repo:{GUEST_STAGE}/site:{REPO}:{site}:{stdlib}:{stdlib}/lib-dynload"
    env_vars = f"PYTHONHOME={GUEST_STAGE}/home PYTHONPATH={pythonpath} PYTHONDONTWRITEBYTECODE=1"
    guest_script = outdir / "guest.sh"
    driver = (
        f"{env_vars} exec {shlex.quote(str(base_python()))} -S "
        f"-m tests.kernel.driver --out {shlex.quote(str(outdir))} --deadline {scenario_deadline_s:.0f} "
        + " ".join(shlex.quote(s) for s in scenarios)
    )
    guest_script.write_text(
        "set -e\n"
        f"echo '{{\"event\": \"guest_up\", \"uptime\": '$(cut -d' ' -f1 /proc/uptime)'}}' >> {outdir}/progress.jsonl\n"
        f"mkdir -p {GUEST_STAGE} && tar -xf {shlex.quote(str(tar))} -C {GUEST_STAGE}\n"
        f"echo '{{\"event\": \"staged\", \"uptime\": '$(cut -d' ' -f1 /proc/uptime)'}}' >> {outdir}/progress.jsonl\n"
        + f"cd {GUEST_STAGE}/repo\n"  # sys.path[0] of `-m` is the cwd: keep it off 9p
        + (
            f"export {env_vars}\n"
            f"echo 'kernel lab shell; run scenarios with:'\n"
            f"echo '  {base_python()} -S -m tests.kernel.driver --out {outdir} NAME'\n"
            "exec bash -i\n"
            if shell
            else driver + "\n"
        )
    )
    nic = any(s in NIC_SCENARIOS for s in scenarios)
    argv = _vng_argv(tools, outdir, f"sh {shlex.quote(str(guest_script))}", kvm, cpus, memory, nic)
    if shell:
        proc_shell = subprocess.Popen(argv, env=_env(), start_new_session=False)
        proc_shell.wait()
        return report
    _launch(report, argv, scenario_deadline_s, boot_deadline_s, total_deadline_s, t_start, echo)
    _figures(report, t_start)
    return report


def _launch(
    report: RunReport,
    argv: list[str],
    scenario_deadline_s: float,
    boot_deadline_s: float,
    total_deadline_s: float,
    t_start: float,
    echo: bool,
    attempts: int = LAUNCH_ATTEMPTS,
) -> None:
    """Run the VM (`_watch`), launched again when the launcher exits before the guest's first word.

    A CI run once saw vng exit 255 at once with an empty console: nothing booted, nothing of ours
    ran, and every scenario of that kernel failed at setup; a second launch in the same clone
    passed. A VM that came up and then failed is never launched again: that is a result."""
    console_path = report.outdir / "console.log"
    for attempt in range(1, attempts + 1):
        with open(console_path, "wb") as console:
            died_unborn = _watch(
                report, argv, console, scenario_deadline_s, boot_deadline_s, total_deadline_s, t_start, echo
            )
        if not died_unborn or attempt == attempts:
            return
        kept = report.outdir / f"console-launch-{attempt}.log"
        console_path.replace(kept)
        report.log.append(
            f"launch {attempt}: {report.failure} before the guest's first word (console kept in {kept.name}); "
            "launching again"
        )
        report.figures["vm_launches"] = attempt + 1
        report.failure = None


def _watch(
    report: RunReport,
    argv: list[str],
    console: IO[bytes],
    scenario_deadline_s: float,
    boot_deadline_s: float,
    total_deadline_s: float,
    t_start: float,
    echo: bool,
) -> bool:
    """Run the VM until the driver is done or a deadline passes; the VM is killed either way.
    True when the launcher exited before the guest said a word (`guest_up`): worth one more launch."""
    outdir = report.outdir
    t_boot = time.monotonic()
    proc = subprocess.Popen(
        argv, stdout=console, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=_env()
    )
    progress = outdir / "progress.jsonl"
    seen = 0
    unborn = False
    try:
        while True:
            events = _read_events(progress)
            for e in events[seen:]:
                if echo:
                    print(f"  [{e.get('uptime', 0):7.1f} s guest] {e['event']} {e.get('name', '')}", flush=True)
            seen = len(events)
            now = time.monotonic()
            names = {e["event"] for e in events}
            if "driver_done" in names:
                break
            if proc.poll() is not None:
                events = _read_events(progress)  # the guest's last words, written before it exited
                unborn = not any(e["event"] == "guest_up" for e in events)
                report.failure = (
                    f"the VM exited ({proc.returncode}) before the driver finished; see {outdir}/console.log"
                )
                break
            if "driver_ready" not in names and now - t_boot > boot_deadline_s:
                report.failure = f"boot + driver start took over {boot_deadline_s:.0f} s: VM killed"
                break
            starts = [e for e in events if e["event"] in ("scenario_start", "scenario_end")]
            if starts and starts[-1]["event"] == "scenario_start":
                started_wall = starts[-1]["wall"]
                if time.time() - started_wall > scenario_deadline_s + 60:
                    report.failure = f"scenario {starts[-1]['name']} passed its deadline and the driver did not stop it"
                    break
            if now - t_start > total_deadline_s:
                report.failure = f"the whole lab run passed its {total_deadline_s:.0f} s deadline: VM killed"
                break
            time.sleep(0.25)
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline and report.failure is None:
            time.sleep(0.2)  # the VM powers off after the driver returns
    finally:
        _kill(proc)
    report.figures["vm_wall_s"] = round(time.monotonic() - t_boot, 1)
    return unborn


def _figures(report: RunReport, t_start: float) -> None:
    outdir = report.outdir
    events = _read_events(outdir / "progress.jsonl")
    report.events = events
    by = {e["event"]: e for e in events}
    report.figures["total_wall_s"] = round(time.monotonic() - t_start, 1)
    if "guest_up" in by:
        report.figures["boot_s (guest uptime at exec)"] = by["guest_up"]["uptime"]
    if "staged" in by and "guest_up" in by:
        report.figures["unpack_stage_s"] = round(by["staged"]["uptime"] - by["guest_up"]["uptime"], 2)
    if "driver_ready" in by:
        ready = by["driver_ready"]
        report.figures["driver_ready_s (guest uptime)"] = ready["uptime"]
        report.figures["driver_import_s (lab.py)"] = ready["import_s"]
        report.figures["cli_import_s (rnic_exporter.cli)"] = ready.get("cli_import_s")
        report.figures["first_cli_call_s (--version)"] = ready.get("first_cli_s")
        if "staged" in by:
            report.figures["python_start_and_import_s"] = round(ready["uptime"] - by["staged"]["uptime"], 2)
    missing = [s for s in report.scenarios if not (outdir / s / "result.json").exists()]
    if missing and report.failure is None:
        report.failure = f"no result from {', '.join(missing)}; see {outdir}/console.log"


__all__ = [
    "NIC_SCENARIOS",
    "SECOND_KERNEL_SCENARIOS",
    "LabSetupError",
    "RunReport",
    "Tools",
    "all_scenarios",
    "find_tools",
    "lab_kernels",
    "pick_kernel",
    "run_lab",
    "stage",
]
