"""One judgment explained for a human: every problem present now, what it means and what to do.

Used by `rnic-exporter check` (job prologues, on-call). The wording names the device, port and
values so the output can be pasted into a ticket as is. Every problem has a severity (critical: a job
on this node fails; warning: it may fail or run slow) and a short stable `reason` for scripts.
What a driver does not provide is no problem at all: `check` lists it among its notes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from rnic_exporter.catalog.events import Severity
from rnic_exporter.detect.conditions import GIDS_MISSING, NCCL_GID_FILES, HostConditions, PortView
from rnic_exporter.detect.diff import RISK_TEXT
from rnic_exporter.model.host import ReadError, Snapshot
from rnic_exporter.model.nccl import (
    AF_INET,
    LINK_LOCAL,
    NO_GID,
    OUT_OF_RANGE,
    PICK_PROBLEMS,
    WRONG_ROCE_VERSION,
    NcclSettings,
)

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
FAIL_ON = ("critical", "warning")  # `check --fail-on`: the least severe problem that fails the check


@dataclass(frozen=True, slots=True)
class Problem:
    code: str
    severity: Severity
    where: str
    what: str
    meaning: str
    fix: str
    reason: str = ""  # the cause in one stable token (errno name, link_local...); "" = the code says it all
    # Where, for scripts (`where` is the same for people): None where it does not apply (a host-wide
    # problem has no device, a device's none of the others).
    device: str | None = None
    port: int | None = None
    netdev: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["reason"] = self.reason or self.code
        return out


def fails(problems: tuple[Problem, ...] | list[Problem], fail_on: str) -> bool:
    """True when a problem is at least as severe as `fail_on` (`critical` or `warning`)."""
    limit = SEVERITY_ORDER[fail_on]
    return any(SEVERITY_ORDER[p.severity] <= limit for p in problems)


_FIX_ADDRESS = (
    "configure the address with a method that keeps it on link loss (ifupdown's networking service, "
    "or systemd-networkd with KeepConfiguration=), then restart jobs that use this port"
)
# Refused by permissions, not failed by the driver: who reads is the cause, not the NIC.
_PERMISSION = frozenset({"EACCES", "EPERM"})
_PERMISSION_FIX = (
    "a permission problem, not the driver: run check as root or as the exporter's own user (the unit's "
    "User=, or the DaemonSet's securityContext), or make the file readable to the user check runs as"
)
_FIX_SPEED = "check the cable and transceiver (ethtool, ibstat); reseat or replace them, then confirm the rate"


def find_problems(
    cur: HostConditions,
    errors: tuple[ReadError, ...] = (),
    nccl: NcclSettings | None = None,
    index_source: str = "",
    state_file: str = "",
) -> list[Problem]:
    """`index_source`: the file (and line) that set NCCL_IB_GID_INDEX, named beside its value so that
    the fix goes where the value is (`DetectionSettings.nccl_gid_index_source`). `state_file`: the
    inventory judged against, named where the fix is to delete it."""
    out: list[Problem] = []
    for dev in sorted(cur.devices.values(), key=lambda d: d.name):
        if not dev.present:
            out.append(
                Problem(
                    "device_missing",
                    "critical",
                    f"{dev.name} ({dev.pci_address or '-'})",
                    "a device of the inventory is not present",
                    "jobs scheduled on this node with all RNICs will fail or run without this one",
                    "look for PCIe or firmware errors (dmesg, lspci -vv); reseat or replace the NIC; "
                    f"delete the state file{f' ({state_file})' if state_file else ''} only if the device was "
                    "removed on purpose",
                    device=dev.name,
                )
            )
    if cur.expected_devices is not None and cur.present_devices < cur.expected_devices:
        out.append(
            Problem(
                "device_count",
                "critical",
                "host",
                f"{cur.present_devices} RDMA devices present, {cur.expected_devices} expected",
                "a NIC is missing: collectives across this node fail or slow down",
                "look for PCIe or driver errors (dmesg, lspci -vv); reseat or replace the NIC",
            )
        )
    for view in sorted(cur.ports.values(), key=lambda v: v.key):
        located = (
            replace(p, device=view.device, port=view.port, netdev=view.netdev)
            for p in _port_problems(view, nccl or NcclSettings(), index_source)
        )
        out.extend(located)
    # A port whose GID table could not be read has that one problem, not one per file as well.
    told = {v.key for v in cur.ports.values() if v.gid_table_unreadable is not None}
    for err in errors:
        if err.port is not None and (err.device, err.port) in told and err.attribute.startswith(NCCL_GID_FILES):
            continue
        where = err.device if err.port is None else f"{err.device} port {err.port}"
        err_view = cur.ports.get((err.device, err.port)) if err.port is not None else None
        out.append(
            Problem(
                "attribute_unreadable",
                "warning",
                where,
                f"{err.attribute}: {err.reason}",
                "this value is not monitored until it can be read again",
                _PERMISSION_FIX
                if err.kind in _PERMISSION
                else "check the driver and firmware (dmesg); a value that stays unreadable is a driver bug",
                err.kind,
                err.device,
                err.port,
                err_view.netdev if err_view is not None else None,
            )
        )
    out.sort(key=lambda p: (SEVERITY_ORDER[p.severity], p.where, p.code))
    return out


def _index(index: int | None, source: str) -> str:
    """`NCCL_IB_GID_INDEX=3`, and where a file set it: `NCCL_IB_GID_INDEX=3 (from /etc/nccl.conf line 2)`."""
    return f"NCCL_IB_GID_INDEX={index}" + (f" (from {source})" if source else "")


def _port_problems(view: PortView, nccl: NcclSettings, index_source: str = "") -> list[Problem]:
    where = view.where
    out = []
    if view.up is False:
        out.append(
            Problem(
                "port_down",
                "warning",
                where,
                f"port is not ACTIVE/LinkUp ({view.state_text})",
                "no RDMA traffic can use this port",
                "check the cable, the switch port and ibstat",
                "port_down",
            )
        )
    for judgement in view.links:
        if judgement.below:
            out.append(
                Problem(
                    f"{judgement.link}_below_rated",
                    "warning",
                    where,
                    f"{judgement.link} link runs at {judgement.active}, rated {judgement.rated}",
                    "collectives run at the speed of the slowest link",
                    "reseat the NIC or move it to a full-width slot (lspci -vv)"
                    if judgement.link == "pcie"
                    else _FIX_SPEED,
                )
            )
    if view.configured_index_valid is False:
        wanted = nccl.wanted_gid
        out.append(
            Problem(
                "nccl_gid_index_invalid",
                "critical",
                where,
                f"{_index(view.configured_index, index_source)} points at {view.configured_index_fault} "
                f"({view.configured_index_content})",
                "NCCL init hangs or fails with 'Got completion with error 4'",
                f"set NCCL_IB_GID_INDEX to the {wanted} index shown by `rnic-exporter gids` "
                f"({_v2_hint(view, nccl)}) or unset it to let NCCL auto-select",
            )
        )
    if view.gid_table_unreadable is not None:
        # Failed reads are a warning; a tree without gids/ at all (nothing failed: a partial capture,
        # a masked sysfs) cannot be checked either, but that is information, not a fault of the host.
        missing = view.gid_table_unreadable == GIDS_MISSING
        denied = any(f"({name})" in view.gid_table_unreadable for name in _PERMISSION)
        out.append(
            Problem(
                "gid_table_unreadable",
                "info" if missing else "warning",
                where,
                f"the GID table could not be read: {view.gid_table_unreadable}",
                "which GID NCCL would use on this port is unknown, so it cannot be checked",
                _PERMISSION_FIX
                if denied
                else "look for driver or firmware errors (dmesg); make sure --path.sysfs is the host's sysfs; "
                "compare with show_gids or `rdma link show`",
                "gids_missing" if missing else "unreadable",
            )
        )
    if view.link_layer == "InfiniBand" and view.up is not False and nccl.routable_flid_gid_index < 0:
        index = nccl.routable_flid_gid_index
        out.append(
            Problem(
                "nccl_gid_unusable",
                "critical",
                where,
                f"NCCL_IB_ROUTABLE_FLID_GID_INDEX={index}: NCCL queries GID index {index} on this InfiniBand "
                "port, which fails",
                "NCCL cannot set up connections over this port (ncclIbGetGidIndex returns an error)",
                "unset NCCL_IB_ROUTABLE_FLID_GID_INDEX (default 1) or set it to a GID index of 0 or more",
                "flid_index_negative",
            )
        )
    pick = view.judged_pick
    if pick is not None and not pick.usable:
        how = _index(pick.index, index_source) if pick.configured else "NCCL's auto-selection"
        out.append(_unusable_pick(view, pick.problem or NO_GID, how, pick.configured, pick.content, nccl))
    if pick is not None and pick.usable and pick.differs_from_auto is not None:
        out.append(_family_differs(view, pick.index, pick.content, pick.differs_from_auto, index_source))
    for address, present in sorted(view.expected.items()):
        if not present:
            out.append(
                Problem(
                    "address_missing",
                    "critical",
                    where,
                    f"expected address {address} is missing",
                    "its GIDs are gone; when it returns its RoCE v2 GID may sit at a higher index",
                    _FIX_ADDRESS,
                )
            )
    for risk in sorted(view.risks):
        out.append(
            Problem(
                f"risk_{risk}",
                "warning",
                where,
                RISK_TEXT[risk],
                "a port flap can remove the address and shift the GID index under running jobs",
                _FIX_ADDRESS
                if risk == "networkmanager"
                else "sysctl -w net.ipv6.conf.<netdev>.keep_addr_on_down=1 (persist it in sysctl.d)",
            )
        )
    return out


def _v2_hint(view: PortView, nccl: NcclSettings) -> str:
    if nccl.address_family != AF_INET:
        return "its IPv6 rows"  # the view indexes IPv4 GIDs only
    if not view.v2_ipv4_index:
        return "none on this port"
    return ", ".join(f"{a} at {i}" for a, i in sorted(view.v2_ipv4_index.items()))


def _unusable_pick(
    view: PortView, problem: str, how: str, configured: bool, content: str, nccl: NcclSettings
) -> Problem:
    what = f"{how} uses {PICK_PROBLEMS[problem]} ({content})"
    netdev = view.netdev or "the port's netdev"
    if configured:
        fix = (
            f"point NCCL_IB_GID_INDEX at the RoCE v2 GID of the address jobs use (`rnic-exporter gids`: "
            f"{_v2_hint(view, nccl)}), or unset it to let NCCL auto-select"
        )
    elif problem == OUT_OF_RANGE:
        fix = f"give {netdev} an address inside NCCL_IB_ADDR_RANGE={nccl.address_range}, or correct NCCL_IB_ADDR_RANGE"
    elif problem == WRONG_ROCE_VERSION:
        fix = (
            f"the fabric needs RoCE v{nccl.roce_version}: check that {netdev}'s address has its RoCE "
            f"v{nccl.roce_version} GID (`rnic-exporter gids`), or set NCCL_IB_ROCE_VERSION_NUM to what the "
            "fabric runs"
        )
    elif nccl.family_name == "AF_INET" and problem in (LINK_LOCAL, NO_GID):
        fix = (
            f"give {netdev} its IPv4 address back (ip addr add <address>/<prefix> dev {netdev}, or restart its "
            "address manager), or set NCCL_IB_ADDR_FAMILY=AF_INET6 if the fabric routes IPv6"
        )
    else:
        fix = f"give {netdev} a routable {nccl.family_name} address, or set NCCL_IB_ADDR_FAMILY to the family it has"
    return Problem(
        "nccl_gid_unusable",
        "critical",
        view.where,
        what,
        "NCCL connections across nodes over this port fail (the job hangs at init or times out)",
        fix,
        problem,
    )


def _family_differs(view: PortView, index: int | None, content: str, auto: str, index_source: str) -> Problem:
    """A pin of another family than NCCL's own choice, where nobody stated the family: the incident
    of a pin on an IPv6 GID where the fabric routes IPv4 RoCE v2, or of a pin copied from an IPv6
    fabric. A warning, not critical: an IPv6 fabric pinning its ULA GID is right."""
    return Problem(
        "nccl_gid_family_differs",
        "warning",
        view.where,
        f"{_index(index, index_source)} uses another address family ({content}) than NCCL's own choice "
        f"on this port ({auto}), and no NCCL_IB_ADDR_FAMILY or NCCL_IB_ADDR_RANGE says which the fabric routes",
        "cross-node connections over this port work only if the fabric routes the pinned GID's family; "
        "if it does not, jobs hang at init",
        "state the family the fabric routes (NCCL_IB_ADDR_FAMILY, or the config's [nccl] ib_addr_family) so "
        "check can judge the pin, or point NCCL_IB_GID_INDEX at NCCL's choice, or unset it",
        "family_differs",
    )


def aer_problems(snap: Snapshot) -> list[Problem]:
    """PCIe AER errors each RNIC function reported since boot: a fatal one is critical (the link was
    reset under whatever ran on it), a non-fatal one a warning. Correctable errors are the link's own
    retries: their rate is the daemon's alert (RnicPcieAerCorrectableRising), not a one-shot verdict."""
    out = []
    for dev in snap.devices:
        link = snap.pcie.get(dev.pci_address) if dev.pci_address else None
        if link is None:
            continue
        where = f"{dev.name} ({dev.pci_address})"
        fatal, nonfatal = link.aer("fatal"), link.aer("nonfatal")
        if fatal:
            out.append(
                Problem(
                    "pcie_aer_fatal",
                    "critical",
                    where,
                    f"the PCI function reported {fatal} fatal PCIe error(s) since boot (aer_dev_fatal)",
                    "the link was reset under any job using the NIC; it can happen again mid-job",
                    f"drain the node; look at dmesg (AER) and /sys/bus/pci/devices/{dev.pci_address}/aer_dev_fatal, "
                    "reseat or replace the card or riser, then reboot",
                    device=dev.name,
                )
            )
        if nonfatal:
            out.append(
                Problem(
                    "pcie_aer_nonfatal",
                    "warning",
                    where,
                    f"the PCI function reported {nonfatal} non-fatal uncorrectable PCIe error(s) since boot "
                    "(aer_dev_nonfatal)",
                    "PCIe transactions were lost and recovered; jobs can see timeouts, and these precede fatal errors",
                    f"look at dmesg (AER) and /sys/bus/pci/devices/{dev.pci_address}/aer_dev_nonfatal; "
                    "reseat the card and update its firmware if they recur",
                    device=dev.name,
                )
            )
    return out
