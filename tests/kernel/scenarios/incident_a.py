"""Incident 1 (GID index shift) on the real kernel: a port flap under NetworkManager while a job
holds an RC QP on the IPv4 GID, the exporter watching, versus the same flap with the address
configured with `ip`. Also the helpers of scenario `incident_a_holders` (which users of a GID keep
its slot past an `ip addr del`: `holders()` below). Kernel source lines behind each outcome:
docs/gid-index-moves.md.

`run`: a real NetworkManager (its own D-Bus system bus, a keyfile profile with a static IPv4, a
static IPv6 and NetworkManager's own link-local) manages va; an ib_send_bw client connected to
rxe1 on the IPv4 GID's index is stopped (a live job whose QP is idle); the link partner's carrier
is dropped until NetworkManager removes the addresses, then restored. The exporter runs beside it
(`serve` with a state dir, `gids --json`, `check` with NCCL_IB_GID_INDEX at the old index). A flap
shorter than NetworkManager's carrier grace follows, then the fix: NetworkManager told not to manage
va, the addresses configured with `ip`, the same flap again.

Needs (Debian): rdma-core ibverbs-providers ibverbs-utils perftest python3-pyverbs iproute2
network-manager dbus.
"""

from __future__ import annotations

import configparser
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.kernel.lab import (
    NETNS,
    SYS_IB,
    SYS_NET,
    VA,
    VA_ADDR,
    VB,
    VB_ADDR,
    Lab,
    LabError,
    Serve,
    ipv4_gid,
    read_attr,
)

PORT = SYS_IB / "rxe0" / "ports" / "1"
V4 = ipv4_gid(VA_ADDR)
PEER_V4 = ipv4_gid(VB_ADDR)
ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"
V6, V6_PEER = "fd77::1", "fd77::2"
V6_GID = "fd77:0000:0000:0000:0000:0000:0000:0001"
SLOTS = 16  # rxe has 1024; the lab never uses more than the first few
HOLDER = Path(__file__).with_name("incident_a_holders.py")
PYVERBS_KINDS = ("qp_init", "qp_rtr", "qp_rts", "ah", "cm_id", "cm_listen")
NM_CONF = """\
[main]
plugins=keyfile
no-auto-default=*
auth-polkit=false
dns=none
rc-manager=unmanaged

[keyfile]
path={conns}

[logging]
level=INFO
domains=DEVICE,IP4,IP6,PLATFORM,CORE
"""
MON_LINE = re.compile(r"^\[(?P<ts>[^\]]+)\]\s+(?P<deleted>Deleted )?\d+: (?P<dev>[\w.@-]+?)(?:@\S+)?:?\s+(?P<rest>.*)$")


# -- reading the GID table ----------------------------------------------------------------------


def _attr(path: Path) -> str:
    try:
        return read_attr(path).strip()
    except OSError as exc:
        return "EINVAL" if exc.errno == 22 else f"errno {exc.errno}"


def slots() -> dict[int, dict[str, str]]:
    """Populated slots of rxe0 port 1 among the first SLOTS: {index: {gid, type, ndev}}."""
    out: dict[int, dict[str, str]] = {}
    for i in range(SLOTS):
        gid = _attr(PORT / "gids" / str(i))
        if gid == ZERO:
            continue
        out[i] = {
            "gid": gid,
            "type": _attr(PORT / "gid_attrs" / "types" / str(i)),
            "ndev": _attr(PORT / "gid_attrs" / "ndevs" / str(i)),
        }
    return out


def slot(i: int) -> dict[str, str]:
    """One slot as sysfs shows it, empty or not (an empty or pending-delete slot: zero GID, EINVAL)."""
    return {
        "gid": _attr(PORT / "gids" / str(i)),
        "type": _attr(PORT / "gid_attrs" / "types" / str(i)),
        "ndev": _attr(PORT / "gid_attrs" / "ndevs" / str(i)),
    }


def index_of(gid: str) -> int | None:
    for i in range(SLOTS):
        if _attr(PORT / "gids" / str(i)) == gid:
            return i
    return None


def table_text(table: dict[int, dict[str, str]]) -> dict[str, str]:
    return {str(i): f"{e['gid']} {e['type']} {e['ndev']}" for i, e in sorted(table.items())}


# -- processes that hold references ---------------------------------------------------------------


def system_env() -> dict[str, str]:
    """The environment without the lab driver's staged-interpreter settings (PYTHONHOME, PYTHONPATH):
    a system Python started with them would not find its own dist-packages, where pyverbs is."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


def pyverbs_python() -> str | None:
    """A Python that can import pyverbs (Debian installs it for the system's python3 only)."""
    candidates = [shutil.which("python3", path=os.defpath), sys.executable]
    for py in [c for c in candidates if c]:
        probe = subprocess.run([py, "-c", "import pyverbs.device"], capture_output=True, timeout=120, env=system_env())
        if probe.returncode == 0:
            return py
    return None


def rdma_res(lab: Lab, what: str) -> list[dict[str, Any]]:
    proc = lab.sh(f"rdma -j res show {what}", check=False)
    try:
        data = json.loads(proc.stdout or "[]")
    except ValueError:
        return []
    return [e for e in data if isinstance(e, dict)]


def qp_of(lab: Lab, pid: int) -> dict[str, Any] | None:
    for qp in rdma_res(lab, "qp link rxe0/1"):
        if qp.get("pid") == pid and qp.get("type") in ("RC", "UD"):
            return qp
    return None


def owns_nothing(lab: Lab, pid: int) -> bool:
    """No QP, PD or cm_id of `pid` left on any RDMA device (its uverbs objects are destroyed)."""
    return not any(e.get("pid") == pid for what in ("qp", "pd", "cm_id") for e in rdma_res(lab, what))


@dataclass
class Proc:
    name: str
    proc: subprocess.Popen[str]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="backslashreplace") if self.log.exists() else ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> int | None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(20)
        return self.proc.returncode


def spawn(lab: Lab, name: str, argv: list[str], netns: str | None = None, env: dict[str, str] | None = None) -> Proc:
    log = lab.out / f"{name}.log"
    full = argv if netns is None else ["ip", "netns", "exec", netns, *argv]
    with open(log, "w") as f:
        proc = subprocess.Popen(full, stdout=f, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL, env=env)
    return Proc(name, proc, log)


@contextlib.contextmanager
def processes() -> Iterator[list[Proc]]:
    procs: list[Proc] = []
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()


def start_holder(lab: Lab, procs: list[Proc], python: str, kind: str, index: int) -> Proc:
    argv = [python, str(HOLDER), kind, str(index), PEER_V4, VA_ADDR, VB_ADDR]
    p = spawn(lab, f"holder-{kind}", argv, env=system_env())
    procs.append(p)

    def ready() -> bool:
        if not p.alive():
            raise LabError(f"holder {kind} exited {p.proc.returncode}: {p.text()}")
        return "READY" in p.text()

    lab.wait_until(ready, 120, f"holder {kind} ready", poll_s=0.2)
    return p


def start_send_bw(lab: Lab, procs: list[Proc], index: int, tag: str) -> Proc:
    """ib_send_bw RC: server on rxe1 in netns b, client on rxe0 with -x INDEX; returns the client
    once its RC QP is in RTS (traffic is running)."""
    server = spawn(lab, f"{tag}-server", ["ib_send_bw", "-d", "rxe1", "-x", "1", "-D", "120"], netns=NETNS)
    procs.append(server)
    lab.wait_until(
        lambda: server.alive() and ":18515" in lab.sh("ss -Hltn", netns=NETNS, check=False).stdout,
        60,
        "ib_send_bw server listening on 18515",
        poll_s=0.2,
    )
    client = spawn(lab, f"{tag}-client", ["ib_send_bw", "-d", "rxe0", "-x", str(index), "-D", "120", VB_ADDR])
    procs.append(client)

    def connected() -> bool:
        if not client.alive():
            raise LabError(f"ib_send_bw client exited {client.proc.returncode}: {client.text()}")
        qp = qp_of(lab, client.proc.pid)
        return qp is not None and qp.get("state") == "RTS"

    lab.wait_until(connected, 120, "ib_send_bw client QP in RTS", poll_s=0.2)
    return client


# -- address churn ---------------------------------------------------------------------------------


def delete_v4(lab: Lab, at: int) -> dict[str, Any]:
    lab.sh(f"ip addr del {VA_ADDR}/24 dev {VA}")
    lab.wait_until(lambda: _attr(PORT / "gids" / str(at)) != V4, 20, f"GID {at} no longer {VA_ADDR}")
    return {"slot": slot(at), "table": table_text(slots())}


def add_v4(lab: Lab) -> int:
    lab.sh(f"ip addr add {VA_ADDR}/24 dev {VA}")
    lab.wait_until(lambda: index_of(V4) is not None, 20, f"GID of {VA_ADDR} back")
    found = index_of(V4)
    assert found is not None
    return found


def churn(lab: Lab) -> dict[str, Any]:
    """Delete and re-add the IPv4 address of va; what the GID table showed at each step."""
    before = index_of(V4)
    if before is None:
        raise LabError(f"no GID of {VA_ADDR} before the delete: {slots()}")
    table_before = table_text(slots())
    deleted = delete_v4(lab, before)
    after = add_v4(lab)
    return {
        "index_before": before,
        "table_before": table_before,
        "while_deleted": deleted,
        "index_after": after,
        "table_after": table_text(slots()),
        "old_slot_after": slot(before),
    }


def release_and_churn(lab: Lab, p: Proc) -> dict[str, Any]:
    """Kill the holder, wait until its RDMA objects are gone, churn again: where the address lands now."""
    p.kill()
    lab.wait_until(lambda: owns_nothing(lab, p.proc.pid), 30, f"{p.name}'s RDMA objects destroyed")
    return churn(lab)


def holders(lab: Lab) -> dict[str, Any]:
    """Part 1: which users of a GID keep its slot past an `ip addr del`."""
    lab.rxe_pair()
    out: dict[str, Any] = {"cases": {}}
    cases: dict[str, Any] = out["cases"]
    cases["none"] = churn(lab)
    python = pyverbs_python()
    out["pyverbs_python"] = python
    with processes() as procs:
        for kind in PYVERBS_KINDS:
            if python is None:
                cases[kind] = {"error": "no Python with pyverbs (Debian python3-pyverbs)"}
                continue
            at = index_of(V4)
            assert at is not None
            holder = start_holder(lab, procs, python, kind, at)
            case = churn(lab)
            case["qps"] = [q for q in rdma_res(lab, "qp link rxe0/1") if q.get("pid") == holder.proc.pid]
            case["after_release"] = release_and_churn(lab, holder)
            cases[kind] = case

        # ib_send_bw with traffic running: the delete makes rxe fail the next send (the GID index
        # of the QP's address vector no longer resolves), the client dies and destroys its QP.
        at = index_of(V4)
        assert at is not None
        client = start_send_bw(lab, procs, at, "sendbw-running")
        t0 = time.monotonic()
        deleted = delete_v4(lab, at)
        lab.wait_until(lambda: not client.alive(), 60, "ib_send_bw client exits after the delete")
        exit_s = time.monotonic() - t0
        lab.wait_until(lambda: owns_nothing(lab, client.proc.pid), 30, "ib_send_bw client's QP destroyed")
        after = add_v4(lab)
        cases["ib_send_bw_running"] = {
            "index_before": at,
            "while_deleted": deleted,
            "client_exit_code": client.proc.returncode,
            "client_exit_after_delete_s": round(exit_s, 3),
            "client_log_tail": client.text()[-600:],
            "index_after": after,
            "table_after": table_text(slots()),
        }
        for p in list(procs):
            p.kill()
        procs.clear()
        # Back to back (no wait between delete and add), as a script or an address manager would.
        at = index_of(V4)
        assert at is not None
        client = start_send_bw(lab, procs, at, "sendbw-backtoback")
        lab.sh(f"ip addr del {VA_ADDR}/24 dev {VA} && ip addr add {VA_ADDR}/24 dev {VA}")
        lab.wait_until(lambda: index_of(V4) is not None, 20, f"GID of {VA_ADDR} back")
        cases["ib_send_bw_running_backtoback"] = {
            "index_before": at,
            "index_after": index_of(V4),
            "client_alive_after_readd": client.alive(),
            "table_after": table_text(slots()),
        }
        for p in list(procs):
            p.kill()
        procs.clear()
        if index_of(V4) != at:
            churn(lab)

        # The same client stopped (SIGSTOP) once connected: a live process that holds its QP idle,
        # as a training job between collectives.
        at = index_of(V4)
        assert at is not None
        client = start_send_bw(lab, procs, at, "sendbw-stopped")
        os.kill(client.proc.pid, signal.SIGSTOP)
        case = churn(lab)
        os.kill(client.proc.pid, signal.SIGCONT)
        try:
            lab.wait_until(lambda: not client.alive(), 60, "ib_send_bw client exits once continued")
        except LabError:  # still sending 60 s on: what the host test is about, not a broken lab
            case["client_alive_60s_after_continue"] = True
        case["client_exit_code_after_continue"] = client.proc.returncode  # None: still running
        case["client_log_tail"] = client.text()[-600:]
        case["after_release"] = release_and_churn(lab, client)
        cases["ib_send_bw_stopped"] = case
    return out


# -- NetworkManager -------------------------------------------------------------------------------


class Monitor:
    """`ip -ts monitor address link` on the root netns, parsed into (time, op, family, address) rows."""

    def __init__(self, lab: Lab, procs: list[Proc]) -> None:
        self.p = spawn(lab, "ip-monitor", ["ip", "-ts", "monitor", "address", "link"])
        procs.append(self.p)

    def events(self) -> list[dict[str, str]]:
        rows: list[dict[str, str]] = []
        for line in self.p.text().splitlines():
            m = MON_LINE.match(line)
            if not m or not m.group("dev").startswith(VA):
                continue
            rest = m.group("rest")
            am = re.match(r"(inet6?) (\S+)", rest)
            if am:
                scope = "link" if "scope link" in rest else "global"
                rows.append(
                    {
                        "ts": m.group("ts"),
                        "op": "del" if m.group("deleted") else "add",
                        "family": am.group(1),
                        "address": am.group(2),
                        "scope": scope,
                        "tentative": str("tentative" in rest).lower(),
                    }
                )
            elif "<" in rest:
                carrier = "NO-CARRIER" not in rest and "LOWER_UP" in rest
                rows.append({"ts": m.group("ts"), "op": "link", "carrier": str(carrier).lower()})
        return rows


def nm_device_file(ifindex: int) -> dict[str, str] | None:
    path = Path(f"/run/NetworkManager/devices/{ifindex}")
    if not path.exists():
        return None
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(path.read_text())
    return {f"{s}.{k}": v for s in parser.sections() for k, v in parser.items(s)}


def metric(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return None


def nccl_check(lab: Lab, state_dir: str, index: int) -> dict[str, Any]:
    old = os.environ.get("NCCL_IB_GID_INDEX")
    os.environ["NCCL_IB_GID_INDEX"] = str(index)
    try:
        code, stdout, stderr = lab.cli("check", "--state.dir", state_dir, "--fail-on", "critical", "--json")
    finally:
        if old is None:
            os.environ.pop("NCCL_IB_GID_INDEX", None)
        else:
            os.environ["NCCL_IB_GID_INDEX"] = old
    try:
        parsed: Any = json.loads(stdout)
    except ValueError:
        parsed = None
    return {
        "nccl_ib_gid_index": index,
        "code": code,
        "json": parsed,
        "stdout": stdout[-4000:],
        "stderr": stderr[-2000:],
    }


def gids_cli(lab: Lab) -> dict[str, Any]:
    code, stdout, stderr = lab.cli("gids", "--json", "--device", "rxe0")
    try:
        parsed: Any = json.loads(stdout)
    except ValueError:
        parsed = None
    v4 = [g["index"] for g in (parsed or {}).get("gids", []) if g.get("ipv4") == VA_ADDR]
    return {"code": code, "json": parsed, "stderr": stderr[-2000:], "v4_indices": v4}


def scrape(lab: Lab, serve: Serve, name: str) -> dict[str, Any]:
    text = serve.scrape()
    lab.write(f"metrics-{name}.txt", text)
    moved = metric(text, "rnic_events_total", event="rnic.gid.address_moved", device="rxe0", port="1")
    return {
        "v4_index": metric(text, "rnic_gid_roce_v2_ipv4_index", device="rxe0", port="1", address=VA_ADDR),
        "address_moved_total": moved,
        "table_changes_total": metric(text, "rnic_gid_table_changes_total", device="rxe0", port="1"),
        "risk_networkmanager": metric(text, "rnic_netdev_address_loss_risk", device="rxe0", reason="networkmanager"),
        "v4_present": metric(text, "rnic_netdev_address_present", device="rxe0", address=VA_ADDR),
        "nccl_gid_index": metric(text, "rnic_nccl_gid_index", device="rxe0", port="1"),
    }


def carrier(dev: str) -> str:
    try:
        return read_attr(SYS_NET / dev / "carrier").strip()
    except OSError:
        return "?"


def flap(lab: Lab, hold_s: float | None) -> dict[str, Any]:
    """Drop the peer's carrier. With hold_s None: until the GID of VA_ADDR leaves the table (what
    NetworkManager does), else for hold_s seconds exactly (an observation window: nothing is expected
    to happen). Then restore it and wait for the carrier, and for the GID when it had left."""
    t0 = time.monotonic()
    lab.sh(f"ip -n {NETNS} link set {VB} down")
    lab.wait_until(lambda: carrier(VA) == "0", 20, f"{VA} carrier lost")
    removed_s: float | None = None
    if hold_s is None:
        lab.wait_until(lambda: index_of(V4) is None, 60, f"GID of {VA_ADDR} removed after carrier loss", poll_s=0.1)
        removed_s = time.monotonic() - t0
        during = table_text(slots())
    else:
        end = t0 + hold_s
        while time.monotonic() < end:  # observation window of a fixed length: the flap itself
            time.sleep(0.2)
        during = table_text(slots())
    lab.sh(f"ip -n {NETNS} link set {VB} up")
    t_up = time.monotonic()
    lab.wait_until(lambda: carrier(VA) == "1", 20, f"{VA} carrier back")
    lab.wait_until(lambda: index_of(V4) is not None, 60, f"GID of {VA_ADDR} present after the flap")
    readd_s = time.monotonic() - t_up
    return {
        "removed_after_carrier_loss_s": None if removed_s is None else round(removed_s, 3),
        "v4_back_after_carrier_s": round(readd_s, 3),
        "table_during": during,
        "index_after": index_of(V4),
    }


def wait_full_table(lab: Lab, expect: list[str]) -> None:
    lab.wait_until(lambda: all(index_of(g) is not None for g in expect), 60, f"GIDs {expect} present")


def networkmanager(lab: Lab) -> dict[str, Any]:
    """Part 2: NetworkManager's port flap with an RC QP on the IPv4 GID, the exporter watching; then the fix."""
    out: dict[str, Any] = {}
    if not shutil.which("NetworkManager") or not shutil.which("dbus-daemon"):
        return {"error": "NetworkManager or dbus-daemon not installed (Debian network-manager dbus)"}
    lab.modprobe_rxe()
    lab.sh(f"ip netns add {NETNS}")
    lab.sh(f"ip link add {VA} type veth peer name {VB} && ip link set {VB} netns {NETNS}")
    lab.sh(f"ip -n {NETNS} link set {VB} up && ip -n {NETNS} link set lo up && ip link set {VA} up")
    # The flap is an admin down of the peer (va sees carrier loss only); the peer keeps its own IPv6.
    lab.sh(f"sysctl -qw net.ipv6.conf.{VB}.keep_addr_on_down=1", netns=NETNS)
    lab.sh(f"ip -n {NETNS} addr add {VB_ADDR}/24 dev {VB} && ip -n {NETNS} addr add {V6_PEER}/64 dev {VB}")
    lab.rdma_link_add("rxe0", VA)
    lab.rdma_link_add("rxe1", VB, netns=NETNS)
    lab.wait_until(lambda: index_of(V4) is None and bool(slots()), 20, "rxe0 has its default GID only")
    ifindex = int(read_attr(SYS_NET / VA / "ifindex"))
    work = Path(tempfile.mkdtemp(prefix="nm-"))
    (work / "conns").mkdir()
    conf = work / "NetworkManager.conf"
    conf.write_text(NM_CONF.format(conns=work / "conns"))
    state_dir = str(lab.out / "exporter-state")
    mounted = dbus_pid = None
    t0 = time.monotonic()
    marks: dict[str, float] = {}
    out["marks_s"] = marks  # seconds since the scenario's start at which each step ended

    def mark(step: str) -> None:
        marks[step] = round(time.monotonic() - t0, 1)

    with processes() as procs:
        try:
            mon = Monitor(lab, procs)
            # NetworkManager writes secret_key and timestamps here; the guest's root is the host's, read only.
            lab.sh("mount -t tmpfs tmpfs /var/lib/NetworkManager")
            mounted = "/var/lib/NetworkManager"
            if not Path("/run/dbus/system_bus_socket").exists():
                lab.sh("mkdir -p /run/dbus")
                dbus_pid = int(lab.sh("dbus-daemon --system --fork --print-pid").stdout.split()[0])
            nm = spawn(
                lab,
                "NetworkManager",
                ["NetworkManager", "--no-daemon", "--debug", f"--config={conf}", f"--state-file={work}/nm.state"],
            )
            procs.append(nm)
            lab.wait_until(
                lambda: "running" in lab.sh("nmcli -t -f RUNNING general", check=False).stdout,
                90,
                "NetworkManager running",
                poll_s=0.5,
            )
            mark("networkmanager_running")
            out["nm_version"] = lab.sh("NetworkManager --version").stdout.strip()
            out["device_before_managed"] = lab.sh("nmcli -t -f DEVICE,STATE device status", check=False).stdout
            lab.sh(f"nmcli device set {VA} managed yes")  # udev's 85-nm-unmanaged.rules leaves veths unmanaged
            lab.sh(
                f"nmcli connection add type ethernet ifname {VA} con-name incident-a "
                f"ipv4.method manual ipv4.addresses {VA_ADDR}/24 "
                f"ipv6.method manual ipv6.addresses {V6}/64 connection.autoconnect yes"
            )
            lab.sh("nmcli connection up incident-a", timeout=120)
            wait_full_table(lab, [V4, V6_GID])
            lab.wait_until(lambda: len(slots()) >= 4, 60, "default, IPv4, IPv6 and NetworkManager's link-local GIDs")
            out["addr_gen_mode"] = read_attr(f"/proc/sys/net/ipv6/conf/{VA}/addr_gen_mode").strip()
            out["nm_device_file"] = nm_device_file(ifindex)
            out["table_initial"] = table_text(slots())
            mark("profile_active")
            old = index_of(V4)
            assert old is not None
            out["index_initial"] = old

            serve = lab.serve("--state.dir", state_dir, "--poll.interval", "1")
            lab.wait_until(
                lambda: (
                    metric(serve.scrape(), "rnic_gid_roce_v2_ipv4_index", device="rxe0", address=VA_ADDR) is not None
                ),
                120,
                "serve exports the IPv4 GID index",
                poll_s=1.0,
            )
            mark("serve_ready")
            out["serve_before"] = scrape(lab, serve, "before")
            out["gids_before"] = gids_cli(lab)
            out["check_before"] = nccl_check(lab, state_dir, old)

            mark("exporter_before")
            client = start_send_bw(lab, procs, old, "nm-sendbw")
            mark("job_connected")
            os.kill(client.proc.pid, signal.SIGSTOP)  # a live job whose RC QP is idle
            out["flap_nm"] = flap(lab, None)
            mark("flap_nm")
            lab.wait_until(lambda: len(slots()) >= 4, 60, "all GIDs back after the flap")
            out["table_after_flap"] = table_text(slots())
            new = index_of(V4)
            out["index_after_flap"] = new
            out["old_slot_after_flap"] = slot(old)
            out["events_nm_flap"] = mon.events()

            moved_seen = True
            try:
                lab.wait_until(
                    lambda: (
                        metric(serve.scrape(), "rnic_gid_roce_v2_ipv4_index", device="rxe0", address=VA_ADDR) == new
                    ),
                    60,
                    "serve exports the new IPv4 GID index",
                    poll_s=1.0,
                )
            except LabError as exc:
                moved_seen = False
                out["serve_wait_error"] = str(exc)
            out["serve_saw_new_index"] = moved_seen
            out["serve_after"] = scrape(lab, serve, "after")
            out["gids_after"] = gids_cli(lab)
            out["check_old_index_after"] = nccl_check(lab, state_dir, old)
            mark("exporter_after")
            out["serve_log_events"] = [
                line for line in serve.log_text().splitlines() if "rnic.gid." in line or "rnic.address." in line
            ][-40:]

            os.kill(client.proc.pid, signal.SIGCONT)
            lab.wait_until(lambda: not client.alive(), 60, "the job's ib_send_bw exits once continued")
            out["job_exit_code"] = client.proc.returncode
            out["job_log_tail"] = client.text()[-600:]
            for p in [p for p in procs if p.name.startswith("nm-sendbw")]:
                p.kill()
            lab.wait_until(lambda: owns_nothing(lab, client.proc.pid), 30, "the job's QP destroyed")

            # A flap shorter than NetworkManager's carrier grace period: nothing is removed.
            n_events = len(mon.events())
            out["flap_nm_short"] = flap(lab, 2.0)
            mark("flap_nm_short")
            out["flap_nm_short"]["address_events"] = [e for e in mon.events()[n_events:] if e["op"] != "link"]

            # The fix: NetworkManager no longer manages va, the addresses are configured with ip.
            lab.sh(f"nmcli device set {VA} managed no")
            lab.wait_until(
                lambda: (nm_device_file(ifindex) or {}).get("device.managed", "") in ("false", "0"),
                30,
                "NetworkManager's device file says unmanaged",
                poll_s=0.5,
            )
            out["nm_device_file_unmanaged"] = nm_device_file(ifindex)
            out["addresses_after_unmanage"] = lab.sh(f"ip -o addr show dev {VA}").stdout
            lab.sh(f"ip addr flush dev {VA} scope global")
            lab.sh(f"ip addr add {VA_ADDR}/24 dev {VA} && ip addr add {V6}/64 dev {VA}")
            wait_full_table(lab, [V4, V6_GID])
            # IPv6 duplicate address detection ends with one more announcement of the address
            # (tentative -> valid, ~1-2 s): let it come before the flap's events are counted.
            lab.wait_until(
                lambda: "tentative" not in lab.sh(f"ip -o -6 addr show dev {VA}").stdout,
                30,
                f"{V6} past duplicate address detection",
                poll_s=0.2,
            )
            fixed = index_of(V4)
            assert fixed is not None
            out["fix_index_initial"] = fixed
            out["fix_table_initial"] = table_text(slots())
            client = start_send_bw(lab, procs, fixed, "fix-sendbw")
            os.kill(client.proc.pid, signal.SIGSTOP)
            n_events = len(mon.events())
            mark("fix_job_connected")
            # As long as NetworkManager's flap took to remove the addresses, and a little more.
            removed = out["flap_nm"]["removed_after_carrier_loss_s"] or 8.0
            out["flap_fix"] = flap(lab, float(removed) + 2.0)
            mark("flap_fix")
            out["flap_fix"]["address_events"] = [e for e in mon.events()[n_events:] if e["op"] != "link"]
            out["fix_table_after"] = table_text(slots())
            lab.wait_until(
                lambda: metric(serve.scrape(), "rnic_netdev_address_present", device="rxe0", address=VA_ADDR) == 1,
                60,
                "serve sees the address present after the fix's flap",
                poll_s=1.0,
            )
            out["serve_fix"] = scrape(lab, serve, "fix")
            os.kill(client.proc.pid, signal.SIGCONT)
            out["fix_job_alive_after_continue"] = client.alive()
            out["nm_log_carrier"] = [
                line
                for line in nm.text().splitlines()
                if re.search(r"carrier|state change: (activated|unavailable|disconnected|prepare)", line)
            ][-40:]
        finally:
            for p in procs:
                p.kill()
            if dbus_pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(dbus_pid, signal.SIGTERM)
            if mounted:
                lab.sh(f"umount {mounted}", check=False)
            shutil.rmtree(work, ignore_errors=True)
    return out


def run(lab: Lab) -> dict[str, Any]:
    t0 = time.monotonic()
    result = networkmanager(lab)
    result["kernel"] = os.uname().release
    result["dmesg_tail"] = lab.sh("dmesg | tail -n 40", check=False).stdout.splitlines()
    result["seconds"] = round(time.monotonic() - t0, 1)
    return result
