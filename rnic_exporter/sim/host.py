"""A simulated host: writes a sysfs tree with RNICs laid out and formatted as the kernel does.

Layout (as on a real mlx5 host):

    devices/pci0000:BB/0000:BB:00.0/                 upstream (root) port: max_link_*
    devices/pci0000:BB/0000:BB:00.0/0000:SS:00.0/    the RNIC's PCI function: *_link_*
        infiniband/mlx5_N/{node_guid,...,device -> ../../../0000:SS:00.0, ports/1/...}
        net/<netdev>/{address,speed,operstate,...,device -> ../../../0000:SS:00.0}
    class/infiniband/mlx5_N -> ../../devices/.../infiniband/mlx5_N
    class/net/<netdev>      -> ../../devices/.../net/<netdev>
    bus/pci/devices/<bdf>   -> ../../../devices/.../<bdf>

Values are rewritten in place (same inode), as sysfs regenerates a value on each read, so a
reader holding file descriptors sees every change. Two things a plain file cannot do are modelled:
`gid_attrs/{types,ndevs}/<i>` of an empty slot answer EINVAL on a real kernel; here they are
empty files on disk, and `errno_overlay` lists them so an in-process `SimSysfsRoot` can raise the
real EINVAL. Fault methods inject the failures rnic-exporter exists for, and `without_pma`,
`ipv6_only`, `drop_gid_table` and `drop_state_file` give a port the shapes real hosts have that
are not faults of the exporter's making (a port whose PMA does not answer, an IPv6-only RoCE table,
a capture without a GID table or a `state` file).

`driver="rxe"` lays a device out as Debian's 6.1 kernel showed soft-RoCE in the kernel lab
(tests/kernel/, tests/fixtures/kernel-rxe-6.1): a virtual device (`devices/virtual/infiniband/`,
no `device` link, no PCI function) with a `parent` file naming its netdev, an empty `fw_ver`, no
`hca_type`/`hw_rev`/`board_id`, no `counters/` (no PMA), rxe's own `hw_counters/` names, a RoCE v2
only GID table of 1024 slots (link-local default at 0), a rate derived from the netdev speed by
`ib_get_width_and_speed` that does not change when the link goes down (`1: DOWN`, `2: Polling`), and
a veth netdev that reads `lowerlayerdown` while its peer is down.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rnic_exporter.catalog.metrics import PMA_ERROR_COUNTER_NAMES
from rnic_exporter.model.host import ROCE_V1, ROCE_V2, ZERO_GID
from rnic_exporter.sim.gid_table import GidTable, format_gid, mac_default_gid
from rnic_exporter.sources.infiniband import LANE_GBPS

MLX5_HW_COUNTERS = (
    "rx_write_requests",
    "rx_read_requests",
    "rx_atomic_requests",
    "rx_dct_connect",
    "out_of_buffer",
    "out_of_sequence",
    "duplicate_request",
    "rnr_nak_retry_err",
    "packet_seq_err",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "resp_local_length_error",
    "resp_cqe_error",
    "req_cqe_error",
    "req_remote_invalid_request",
    "req_remote_access_errors",
    "resp_remote_access_errors",
    "resp_cqe_flush_error",
    "req_cqe_flush_error",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
    "rp_cnp_ignored",
    "rp_cnp_handled",
    "np_ecn_marked_roce_packets",
    "np_cnp_sent",
)
# rxe's hw_counters/ (rxe_hw_counters.c on 6.1), as the kernel lab listed them; `lifespan` aside.
RXE_HW_COUNTERS = (
    "sent_pkts",
    "rcvd_pkts",
    "duplicate_request",
    "out_of_seq_request",
    "rcvd_rnr_err",
    "send_rnr_err",
    "rcvd_seq_err",
    "ack_deferred",
    "retry_exceeded_err",
    "retry_rnr_exceeded_err",
    "completer_retry_err",
    "send_err",
    "link_downed",
    "rdma_sends",
    "rdma_recvs",
)
# hw_counters/lifespan: the stats' cache lifetime in jiffies as the driver sets it (10 ms on mlx5);
# rxe leaves the core's default of 10 ms, printed in jiffies: 12 at HZ=250 (Debian's kernel).
HW_LIFESPAN = {"mlx5": 10, "rxe": 12}
PMA_EXTENDED_COUNTERS = (
    *PMA_ERROR_COUNTER_NAMES,
    "port_xmit_wait",
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_packets",
    "port_rcv_packets",
    "unicast_xmit_packets",
    "unicast_rcv_packets",
    "multicast_xmit_packets",
    "multicast_rcv_packets",
)

# Ethernet speed (Gb/s) -> the IB width/speed mlx5 reports for it (translate_eth_*_proto_oper).
ETH_RATE_NAMES = {
    1: (1, "SDR"),
    5: (1, "DDR"),
    10: (1, "QDR"),
    25: (1, "EDR"),
    40: (4, "QDR"),
    50: (2, "EDR"),
    56: (4, "FDR"),
    100: (4, "EDR"),
    200: (4, "HDR"),
    400: (4, "NDR"),
    800: (8, "NDR"),
    1600: (8, "XDR"),
}
# Per-lane Gb/s of each IB speed name: the reader's table, so writer and parser cannot disagree.
IB_LANE_GBPS = LANE_GBPS


def rate_text(lanes: int, speed: str) -> str:
    """As rate_show prints it: integer Gb/s, `.5` when the tenths digit is set."""
    total = IB_LANE_GBPS[speed] * lanes
    whole = int(total)
    return f"{whole}{'.5' if total != whole else ''} Gb/sec ({lanes}X {speed})"


def ethernet_rate_text(gbps: int) -> str:
    if gbps == 1:
        return "2.5 Gb/sec (1X SDR)"  # 1G maps onto 1X SDR, which prints 2.5
    lanes, speed = ETH_RATE_NAMES[gbps]
    return rate_text(lanes, speed)


def rxe_rate_text(netdev_mbps: int) -> str:
    """The rate rxe reports for its netdev's speed: `ib_get_width_and_speed` of 6.1 (verbs.c), which
    knows no width or speed beyond 4X EDR, so every netdev from 50G up reads 100 Gb/sec."""
    for ceiling, lanes, speed in (
        (1000, 1, "SDR"),
        (10000, 1, "FDR10"),
        (20000, 4, "DDR"),
        (25000, 1, "EDR"),
        (40000, 4, "FDR10"),
    ):
        if netdev_mbps <= ceiling:
            return rate_text(lanes, speed)
    return rate_text(4, "EDR")


def pcie_speed_text(gts: float) -> str:
    return f"{gts:.1f} GT/s PCIe"


# The named error bits of drivers/pci/pcie/aer.c, in bit order (aer_*_error_string).
_CORRECTABLE = ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr", "HeaderOF")
_UNCORRECTABLE = (
    "Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt", "RxOF", "MalfTLP", "ECRC",
    "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP", "AtomicOpBlocked", "TLPBlockedErr", "PoisonTLPBlocked",
)  # fmt: skip
AER_ERROR_NAMES = {"correctable": _CORRECTABLE, "nonfatal": _UNCORRECTABLE, "fatal": _UNCORRECTABLE}
_AER_TOTAL = {"correctable": "COR", "nonfatal": "NONFATAL", "fatal": "FATAL"}


@dataclass
class SimDevice:
    """One single-port RNIC (one PCI function, one port, as mlx5 lays them out)."""

    name: str
    number: int
    link_layer: str  # "Ethernet" (RoCE) or "InfiniBand"
    gbps: int  # Ethernet speed, or for IB lanes x lane speed
    lanes: int = 4
    ib_speed: str = "NDR"
    netdev: str = ""
    mac: str = ""
    addresses: list[str] = field(default_factory=list)
    gid_table: GidTable = field(default_factory=lambda: GidTable(255))
    pcie_max: tuple[float, int] = (32.0, 16)
    pcie_current: tuple[float, int] = (32.0, 16)
    up: bool = True
    hca_type: str = "MT4129"
    fw_ver: str = "28.39.2048"
    board_id: str = "MT_0000000970"
    carrier_up: int = 1
    carrier_down: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    hw_counters: dict[str, int] = field(default_factory=dict)
    pma: str = "ok"  # "ok", "text" (`N/A (no PMA)`, kernels < ~4.20) or "einval" (later kernels)
    has_gid_table: bool = True  # False: no gids/ or gid_attrs/ under the port
    has_state_file: bool = True  # False: no ports/1/state
    driver: str = "mlx5"  # "mlx5" (a PCI function, mlx5's files) or "rxe" (soft-RoCE on a veth)

    @property
    def soft(self) -> bool:
        """A software device (rxe): virtual, no PCI function, no PMA."""
        return self.driver == "rxe"

    # PCIe AER errors by (severity, error name), as aer_dev_* count them; None: AER off (no files).
    aer: dict[tuple[str, str], int] | None = field(default_factory=dict)

    @property
    def bus(self) -> int:
        # Each RNIC behind its own root port, as on GPU servers; room for 29 devices.
        return 0x11 + self.number * 0x08

    @property
    def root_port(self) -> str:
        return f"0000:{self.bus - 1:02x}:00.0"

    @property
    def pci_address(self) -> str:
        return f"0000:{self.bus:02x}:00.0"

    @property
    def function_dir(self) -> str:
        return f"devices/pci0000:{self.bus - 1:02x}/{self.root_port}/{self.pci_address}"

    @property
    def node_guid(self) -> str:
        if self.soft:  # rxe: the netdev's MAC as EUI-64 (rxe_init_device_param)
            return mac_default_gid(self.mac)[20:]
        h = f"0c42a10300{self.number:02x}c7a8"
        return ":".join(h[i : i + 4] for i in range(0, 16, 4))

    @property
    def port_gid(self) -> str:
        """IB port GID: subnet prefix fe80:: + port GUID (node GUID + 1 on mlx5)."""
        guid = int(self.node_guid.replace(":", ""), 16) + 1
        return format_gid(b"\xfe\x80" + bytes(6) + guid.to_bytes(8, "big"))

    @property
    def uverbs(self) -> str:
        """Its verbs character device's name, under /dev/infiniband and class/infiniband_verbs."""
        return f"uverbs{self.number}"

    @property
    def roce(self) -> bool:
        return self.link_layer == "Ethernet"

    @property
    def rate(self) -> str:
        if self.soft:
            return rxe_rate_text(self.gbps * 1000)
        if not self.roce:
            return rate_text(self.lanes, self.ib_speed)
        return ethernet_rate_text(self.gbps) if self.up else "40 Gb/sec (4X QDR)"


class SimHost:
    """Builds and mutates a simulated sysfs tree rooted at `root` (what `--path.sysfs` names)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.devices: dict[str, SimDevice] = {}
        self.removed: set[str] = set()
        self._overlay_extra: dict[str, int] = {}
        # Held by whoever mutates the host from another thread (the netlink follower, its tests).
        self.lock = threading.RLock()
        # What each GID slot's three files hold on disk, per device: a table change rewrites only
        # the slots that changed (a full 255-slot rewrite costs ~50 ms, far above the kernel's
        # work-queue hop the follower imitates).
        self._gids_on_disk: dict[str, dict[int, tuple[str, str | None, str | None]]] = {}
        # Counters that grow with time on a failing link (`degrade_link`), per device, per second;
        # `add_traffic` advances them, carrying the fractions from call to call.
        self.growing: dict[str, dict[str, float]] = {}
        self._carry: dict[tuple[str, str], float] = {}

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        root: Path,
        *,
        roce: int = 4,
        infiniband: int = 0,
        gid_table_size: int = 255,
        ethernet_gbps: int = 400,
        ib_speed: str = "NDR",
        ib_lanes: int = 4,
        name_prefix: str | None = None,
        driver: str = "mlx5",
    ) -> SimHost:
        """`driver="rxe"`: the RoCE devices are soft-RoCE ones as the kernel lab showed them (veth
        netdevs named `veth<n>`, 1024-slot RoCE v2 tables whatever `gid_table_size` says)."""
        if driver not in ("mlx5", "rxe"):
            raise ValueError(f"driver {driver!r}: 'mlx5' or 'rxe'")
        host = cls(root)
        prefix = name_prefix if name_prefix is not None else ("rxe" if driver == "rxe" else "mlx5_")
        for n in range(roce + infiniband):
            is_roce = n < roce
            soft = driver == "rxe" and is_roce
            name = f"{prefix}{n}"
            dev = SimDevice(
                name=name,
                number=n,
                link_layer="Ethernet" if is_roce else "InfiniBand",
                gbps=ethernet_gbps if is_roce else int(IB_LANE_GBPS[ib_speed] * ib_lanes),
                lanes=ib_lanes,
                ib_speed=ib_speed,
                netdev=(f"veth{n}" if soft else f"ens{n + 1}f0np0") if is_roce else f"ibp{0x10 + n * 0x10}s0",
                mac=f"0c:42:a1:41:{n:02x}:36",
                addresses=[f"10.0.{n}.1"] if is_roce else [],
                gid_table=(
                    GidTable(1024, roce=True, types=(ROCE_V2,))
                    if soft
                    else GidTable(gid_table_size if is_roce else min(gid_table_size, 128), roce=is_roce)
                ),
                driver="rxe" if soft else "mlx5",
                hca_type="" if soft else "MT4129",
                fw_ver="" if soft else "28.39.2048",
                board_id="" if soft else "MT_0000000970",
            )
            host.add_device(dev)
        return host

    def add_device(self, dev: SimDevice) -> None:
        if dev.roce:
            dev.gid_table.set_defaults(mac_default_gid(dev.mac), dev.netdev)
            for address in dev.addresses:
                dev.gid_table.add_address(address, dev.netdev)
        else:
            dev.gid_table.set_defaults(dev.port_gid, None)
        if not dev.soft:  # rxe has no PMA: no counters/ at all
            for i, name in enumerate(PMA_EXTENDED_COUNTERS):
                dev.counters.setdefault(name, 1000 * (i + 1) if "data" in name or "packets" in name else 0)
        for name in RXE_HW_COUNTERS if dev.soft else MLX5_HW_COUNTERS:
            dev.hw_counters.setdefault(name, 0)
        self.devices[dev.name] = dev
        self._write_device(dev)

    # -- writing -----------------------------------------------------------------------------

    def _write(self, rel: str, value: str | int) -> None:
        """Write in place (same inode) so held descriptors see the new value, like sysfs."""
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = f"{value}\n".encode()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)

    def _write_empty(self, rel: str) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.ftruncate(fd, 0)
        os.close(fd)

    def _link(self, rel: str, target: str) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            path.unlink()
        path.symlink_to(target)

    def _ib_dir(self, dev: SimDevice) -> str:
        if dev.soft:
            return f"devices/virtual/infiniband/{dev.name}"
        return f"{dev.function_dir}/infiniband/{dev.name}"

    def _port_dir(self, dev: SimDevice) -> str:
        return f"{self._ib_dir(dev)}/ports/1"

    def _net_dir(self, dev: SimDevice) -> str:
        if dev.soft:
            return f"devices/virtual/net/{dev.netdev}"
        return f"{dev.function_dir}/net/{dev.netdev}"

    def _write_soft_device(self, dev: SimDevice) -> None:
        """rxe as 6.1 lays it out (tests/fixtures/kernel-rxe-6.1): see the module docstring."""
        ib = self._ib_dir(dev)
        self._write(f"{ib}/node_type", "1: CA")
        self._write(f"{ib}/node_guid", dev.node_guid)
        self._write(f"{ib}/sys_image_guid", dev.node_guid)
        self._write(f"{ib}/fw_ver", dev.fw_ver)  # "": the driver has no firmware string
        self._write(f"{ib}/node_desc", "rxe")
        self._write(f"{ib}/parent", dev.netdev)
        self._link(f"class/infiniband/{dev.name}", f"../../{ib}")
        self._write_verbs(dev, f"devices/virtual/infiniband_verbs/{dev.uverbs}")

    def _write_device(self, dev: SimDevice) -> None:
        if dev.soft:
            self._write_soft_device(dev)
            self._write_port_and_netdev(dev)
            return
        upstream = os.path.dirname(dev.function_dir)
        self._write(f"{upstream}/max_link_speed", pcie_speed_text(dev.pcie_max[0]))
        self._write(f"{upstream}/max_link_width", dev.pcie_max[1])
        self._write(f"{upstream}/current_link_speed", pcie_speed_text(dev.pcie_max[0]))
        self._write(f"{upstream}/current_link_width", dev.pcie_max[1])
        fn = dev.function_dir
        self._write(f"{fn}/vendor", "0x15b3")
        self._write(f"{fn}/device", "0x1021")
        self._write(f"{fn}/class", "0x020000" if dev.roce else "0x020700")
        self._write(f"{fn}/max_link_speed", pcie_speed_text(dev.pcie_max[0]))
        self._write(f"{fn}/max_link_width", dev.pcie_max[1])
        self._write_pcie_current(dev)
        self._write_aer(dev)
        self._link(f"bus/pci/devices/{dev.pci_address}", f"../../../{fn}")

        ib = self._ib_dir(dev)
        self._write(f"{ib}/node_type", "1: CA")
        self._write(f"{ib}/node_guid", dev.node_guid)
        self._write(f"{ib}/sys_image_guid", dev.node_guid)
        self._write(f"{ib}/fw_ver", dev.fw_ver)
        self._write(f"{ib}/node_desc", f"gpu-node-01 {dev.name}")
        self._write(f"{ib}/hca_type", dev.hca_type)
        self._write(f"{ib}/hw_rev", "0")
        self._write(f"{ib}/board_id", dev.board_id)
        self._link(f"{ib}/device", f"../../../{dev.pci_address}")
        self._link(f"class/infiniband/{dev.name}", f"../../{ib}")
        verbs = f"{fn}/infiniband_verbs/{dev.uverbs}"
        self._write_verbs(dev, verbs)
        self._link(f"{verbs}/device", f"../../../{dev.pci_address}")

    def _write_verbs(self, dev: SimDevice, verbs: str) -> None:
        """The verbs character device every verbs user holds open (/dev/infiniband/uverbsN): the
        kernel numbers them in registration order, minors from 192 (major 231)."""
        self._write(f"{verbs}/ibdev", dev.name)
        self._write(f"{verbs}/abi_version", 1)
        self._write(f"{verbs}/dev", f"231:{192 + dev.number}")
        self._link(f"class/infiniband_verbs/{dev.uverbs}", f"../../{verbs}")
        self._write("class/infiniband_verbs/abi_version", 6)
        self._write_port_and_netdev(dev)

    def _write_port_and_netdev(self, dev: SimDevice) -> None:
        port = self._port_dir(dev)
        self._write(f"{port}/link_layer", dev.link_layer)
        self._write(f"{port}/lid", "0x0" if dev.roce else f"0x{dev.number + 1:x}")
        self._write(f"{port}/sm_lid", "0x0" if dev.roce else "0x1")
        self._write(f"{port}/lid_mask_count", 0)
        self._write(f"{port}/sm_sl", 0)
        self._write(f"{port}/cap_mask", "0x00010000" if dev.roce else "0x2651e84a")
        self._write_port_state(dev)
        self._write(f"{port}/pkeys/0", "0xffff")
        self._write(f"{port}/hw_counters/lifespan", HW_LIFESPAN[dev.driver])
        self._write_counters(dev)
        self._gids_on_disk.pop(dev.name, None)  # a (re)built device gets every slot written
        self._write_gid_table(dev)

        net = self._net_dir(dev)
        self._write(f"{net}/address", dev.mac if dev.roce else self._ipoib_hwaddr(dev))
        self._write(f"{net}/ifindex", 10 + dev.number)
        self._write(f"{net}/mtu", 9000 if dev.roce else 4092)
        self._write(f"{net}/type", 1 if dev.roce else 32)
        self._write(f"{net}/dev_port", 0)
        self._write(f"{net}/flags", "0x1003")
        if not dev.soft:  # a veth is virtual: no device link
            self._link(f"{net}/device", f"../../../{dev.pci_address}")
        self._link(f"class/net/{dev.netdev}", f"../../{net}")
        self._write_netdev_state(dev)

    def _ipoib_hwaddr(self, dev: SimDevice) -> str:
        raw = bytes.fromhex("00001087") + bytes.fromhex(dev.port_gid.replace(":", ""))
        return ":".join(f"{b:02x}" for b in raw)

    def _write_pcie_current(self, dev: SimDevice) -> None:
        self._write(f"{dev.function_dir}/current_link_speed", pcie_speed_text(dev.pcie_current[0]))
        self._write(f"{dev.function_dir}/current_link_width", dev.pcie_current[1])

    def _write_aer(self, dev: SimDevice) -> None:
        """aer_dev_{correctable,nonfatal,fatal} as drivers/pci/pcie/aer.c prints them: every named
        error bit `NAME COUNT`, then `TOTAL_ERR_<SEVERITY> N`. A soft device has no PCI function."""
        if dev.aer is None or dev.soft:
            return
        for severity, names in AER_ERROR_NAMES.items():
            lines = [f"{name} {dev.aer.get((severity, name), 0)}" for name in names]
            total = sum(n for (sev, _), n in dev.aer.items() if sev == severity)
            lines.append(f"TOTAL_ERR_{_AER_TOTAL[severity]} {total}")
            self._write(f"{dev.function_dir}/aer_dev_{severity}", "\n".join(lines))

    def inject_aer(self, name: str, severity: str, error: str | None = None, count: int = 1) -> None:
        """The function reports `count` AER errors of `severity` (correctable, nonfatal, fatal)."""
        dev = self.devices[name]
        if dev.aer is None:
            dev.aer = {}
        key = (severity, error or AER_ERROR_NAMES[severity][0])
        dev.aer[key] = dev.aer.get(key, 0) + count
        self._write_aer(dev)

    def _write_port_state(self, dev: SimDevice) -> None:
        port = self._port_dir(dev)
        if dev.up:
            state, phys = "4: ACTIVE", "5: LinkUp"
        elif dev.soft:
            state, phys = "1: DOWN", "2: Polling"  # rxe_query_port: Polling whenever not LinkUp
        elif dev.roce:
            state, phys = "1: DOWN", "3: Disabled"  # mlx5 RoCE never shows Polling
        else:
            state, phys = "1: DOWN", "2: Polling"
        if dev.has_state_file:
            self._write(f"{port}/state", state)
        self._write(f"{port}/phys_state", phys)
        self._write(f"{port}/rate", dev.rate)

    def _write_netdev_state(self, dev: SimDevice) -> None:
        net = self._net_dir(dev)
        if dev.soft:  # a veth whose peer went down: lower layer down, speed kept
            self._write(f"{net}/operstate", "up" if dev.up else "lowerlayerdown")
        else:
            self._write(f"{net}/operstate", "up" if dev.up else "down")
        self._write(f"{net}/carrier", 1 if dev.up else 0)
        self._write(f"{net}/speed", dev.gbps * 1000 if dev.up or dev.soft else -1)
        self._write(f"{net}/duplex", "full" if dev.up else "unknown")
        self._write(f"{net}/carrier_changes", dev.carrier_up + dev.carrier_down)
        self._write(f"{net}/carrier_up_count", dev.carrier_up)
        self._write(f"{net}/carrier_down_count", dev.carrier_down)

    def _write_counters(self, dev: SimDevice) -> None:
        port = self._port_dir(dev)
        for name, value in dev.counters.items():
            self._write(f"{port}/counters/{name}", "N/A (no PMA)" if dev.pma == "text" else value)
        for name, value in dev.hw_counters.items():
            self._write(f"{port}/hw_counters/{name}", value)

    def _write_gid_table(self, dev: SimDevice) -> None:
        port = self._port_dir(dev)
        if not dev.has_gid_table:
            return
        table = dev.gid_table
        on_disk = self._gids_on_disk.setdefault(dev.name, {})
        for index in range(table.size):
            slot = table.visible(index)
            content = (ZERO_GID, None, None) if slot is None else (slot.gid, slot.type, slot.netdev)
            if on_disk.get(index) == content:
                continue
            on_disk[index] = content
            self._write(f"{port}/gids/{index}", content[0])
            if slot is None:
                self._write_empty(f"{port}/gid_attrs/types/{index}")
                self._write_empty(f"{port}/gid_attrs/ndevs/{index}")
            else:
                self._write(f"{port}/gid_attrs/types/{index}", slot.type)
                if slot.netdev is None:
                    self._write_empty(f"{port}/gid_attrs/ndevs/{index}")
                else:
                    self._write(f"{port}/gid_attrs/ndevs/{index}", slot.netdev)

    @property
    def errno_overlay(self) -> dict[str, int]:
        """Paths a kernel answers with an errno (EINVAL for empty GID attrs) plus injected faults."""
        overlay: dict[str, int] = {}
        for dev in self.devices.values():
            if dev.name in self.removed:
                continue
            port = f"class/infiniband/{dev.name}/ports/1"
            if dev.pma == "einval":
                overlay.update({f"{port}/counters/{name}": errno.EINVAL for name in dev.counters})
            for index in range(dev.gid_table.size if dev.has_gid_table else 0):
                slot = dev.gid_table.visible(index)
                if slot is None:
                    overlay[f"{port}/gid_attrs/types/{index}"] = errno.EINVAL
                if slot is None or slot.netdev is None:
                    overlay[f"{port}/gid_attrs/ndevs/{index}"] = errno.EINVAL
        overlay.update(self._overlay_extra)
        return overlay

    # -- faults and changes ------------------------------------------------------------------

    def device(self, name: str) -> SimDevice:
        return self.devices[name]

    def set_port_up(self, name: str, up: bool) -> None:
        """Carrier gained or lost. GIDs stay (roce_gid_mgmt ignores carrier)."""
        dev = self.devices[name]
        if dev.up == up:
            return
        dev.up = up
        if up:
            dev.carrier_up += 1
        else:
            dev.carrier_down += 1
            if "link_downed" in dev.counters:  # the PMA's; rxe has none
                dev.counters["link_downed"] = min(dev.counters["link_downed"] + 1, 255)
        self._write_port_state(dev)
        self._write_netdev_state(dev)
        self._write_counters(dev)

    def hold_gid(self, name: str, address: str) -> int:
        """A running job's QPs reference the address's RoCE v2 GID; returns that index."""
        dev = self.devices[name]
        index = dev.gid_table.index_of(address, ROCE_V2)
        if index is None:
            raise KeyError(f"{address} has no RoCE v2 GID on {name}")
        dev.gid_table.held.add(index)
        return index

    def release_gids(self, name: str) -> None:
        """The job ended: pending-delete slots are freed."""
        dev = self.devices[name]
        for index in list(dev.gid_table.held):
            dev.gid_table.release(index)
        self._write_gid_table(dev)

    def remove_address(self, name: str, address: str) -> None:
        dev = self.devices[name]
        if address in dev.addresses:
            dev.addresses.remove(address)
        dev.gid_table.delete_address(address, dev.netdev)
        self._write_gid_table(dev)

    def add_address(self, name: str, address: str) -> list[int]:
        dev = self.devices[name]
        if address not in dev.addresses:
            dev.addresses.append(address)
        placed = dev.gid_table.add_address(address, dev.netdev)
        self._write_gid_table(dev)
        return placed

    def gid_shift(self, name: str) -> tuple[int, int]:
        """Incident 1: a job holds the v2 GID, NetworkManager drops and restores the address.

        Returns (old index, new index) of the address's RoCE v2 GID.
        """
        dev = self.devices[name]
        address = dev.addresses[0]
        old = self.hold_gid(name, address)
        self.set_port_up(name, False)
        self.remove_address(name, address)
        self.set_port_up(name, True)
        self.add_address(name, address)
        new = dev.gid_table.index_of(address, ROCE_V2)
        assert new is not None
        return old, new

    def set_speed(self, name: str, gbps: int, *, lanes: int | None = None, ib_speed: str | None = None) -> None:
        """The port renegotiated: RoCE to `gbps` Ethernet, IB to `lanes` x `ib_speed`."""
        dev = self.devices[name]
        if dev.roce:
            dev.gbps = gbps
        else:
            dev.lanes = lanes or dev.lanes
            dev.ib_speed = ib_speed or dev.ib_speed
            dev.gbps = int(IB_LANE_GBPS[dev.ib_speed] * dev.lanes)
        self._write_port_state(dev)
        self._write_netdev_state(dev)

    def set_pcie(self, name: str, speed_gts: float, width: int) -> None:
        dev = self.devices[name]
        dev.pcie_current = (speed_gts, width)
        self._write_pcie_current(dev)

    def remove_device(self, name: str) -> None:
        """The NIC fell off the bus: its PCI function and every class link vanish."""
        dev = self.devices[name]
        self.removed.add(name)
        self._gids_on_disk.pop(name, None)
        if dev.soft:  # `rdma link delete`: the device goes, its netdev stays
            for rel in (f"class/infiniband/{name}", f"class/infiniband_verbs/{dev.uverbs}"):
                (self.root / rel).unlink(missing_ok=True)
            shutil.rmtree(self.root / self._ib_dir(dev), ignore_errors=True)
            shutil.rmtree(self.root / f"devices/virtual/infiniband_verbs/{dev.uverbs}", ignore_errors=True)
            return
        for rel in (
            f"class/infiniband/{name}",
            f"class/infiniband_verbs/{dev.uverbs}",
            f"class/net/{dev.netdev}",
            f"bus/pci/devices/{dev.pci_address}",
        ):
            path = self.root / rel
            if path.is_symlink():
                path.unlink()
        shutil.rmtree(self.root / dev.function_dir, ignore_errors=True)

    def rename_device(self, name: str, new: str) -> None:
        """`rdma dev set NAME name NEW`: the device directory and its class link take the new name;
        its GUID, PCI function and netdev stay."""
        dev = self.devices.pop(name)
        old_dir = self.root / self._ib_dir(dev)
        (self.root / f"class/infiniband/{name}").unlink()
        dev.name = new
        old_dir.rename(self.root / self._ib_dir(dev))
        self._link(f"class/infiniband/{new}", f"../../{self._ib_dir(dev)}")
        self._write(f"{'devices/virtual' if dev.soft else dev.function_dir}/infiniband_verbs/{dev.uverbs}/ibdev", new)
        self._gids_on_disk[new] = self._gids_on_disk.pop(name, {})
        self.devices[new] = dev

    def restore_device(self, name: str) -> None:
        self.removed.discard(name)
        self._write_device(self.devices[name])

    def corrupt(self, name: str, rel: str, text: str) -> None:
        """Write `text` into `class/infiniband/<name>/<rel>` (a malformed value)."""
        dev = self.devices[name]
        self._gids_on_disk.pop(name, None)  # `rel` may be a GID file: rewrite them all next time
        path = self.root / self._ib_dir(dev) / rel
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            data = text.encode()
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)

    def without_pma(self, name: str, style: str = "text") -> None:
        """The port's PMA does not answer MADs (iWARP-like firmware, an mlx4 VF, a ConnectX-7
        restricted function): every `counters/` file reads `N/A (no PMA)` (style "text", kernels
        before ~4.20) or fails with EINVAL (style "einval", later kernels; in-process readers only,
        through `errno_overlay`). The port itself stays ACTIVE."""
        if style not in ("text", "einval"):
            raise ValueError(f"style {style!r}: 'text' or 'einval'")
        dev = self.devices[name]
        dev.pma = style
        self._write_counters(dev)

    def ipv6_only(self, name: str, addresses: tuple[str, ...] = ("fd00:0:0:{n}::1",)) -> None:
        """The netdev lost its IPv4 addresses and carries IPv6 ones (`{n}` is the device number):
        the table holds the link-local defaults at 0/1 and the IPv6 GIDs after them, which is what
        NCCL's default AF_INET auto-selection leaves at index 0."""
        dev = self.devices[name]
        for address in [a for a in dev.addresses if ":" not in a]:
            self.remove_address(name, address)
        for address in addresses:
            self.add_address(name, address.format(n=dev.number))

    def drop_gid_table(self, name: str) -> None:
        """The port has no `gids/` or `gid_attrs/` directory at all (a broken capture, a sysfs
        mount that hides them): the table cannot be read."""
        dev = self.devices[name]
        dev.has_gid_table = False
        self._gids_on_disk.pop(name, None)
        port = self.root / self._port_dir(dev)
        shutil.rmtree(port / "gids", ignore_errors=True)
        shutil.rmtree(port / "gid_attrs", ignore_errors=True)

    def drop_state_file(self, name: str) -> None:
        """`ports/1/state` is missing: the port's logical state is unknown, not "down"."""
        dev = self.devices[name]
        dev.has_state_file = False
        (self.root / self._port_dir(dev) / "state").unlink(missing_ok=True)

    def fail_with(self, rel: str, code: int) -> None:
        """Make reads of `rel` (relative to the mount) fail with `code` (in-process readers)."""
        self._overlay_extra[rel] = code

    def heal(self) -> None:
        """Reads fail only as the kernel's would again: every `fail_with` is undone."""
        self._overlay_extra.clear()

    def set_verbs_rdev(self, name: str, major: int, minor: int) -> None:
        """Give the device's verbs node another number in `dev` (a test's own device node, made
        with the number of a device that opens without a verbs driver); until it is rebuilt."""
        dev = self.devices[name]
        self._write(f"{dev.function_dir}/infiniband_verbs/{dev.uverbs}/dev", f"{major}:{minor}")

    def degrade_link(self, name: str, per_second: Mapping[str, float]) -> None:
        """A cable going bad: from now on `add_traffic` also advances these counters of `name` at
        these rates (symbol errors, retrains, RoCE retransmissions...); an empty mapping heals it."""
        dev = self.devices[name]
        unknown = [c for c in per_second if c not in dev.counters and c not in dev.hw_counters]
        if unknown:
            raise KeyError(f"{name} has no counter {unknown[0]!r} (driver {dev.driver})")
        if per_second:
            self.growing[name] = dict(per_second)
        else:
            self.growing.pop(name, None)

    def _grow(self, seconds: float) -> None:
        for name, rates in self.growing.items():
            if name in self.removed:
                continue
            counts = {}
            for counter, rate in rates.items():
                total = self._carry.get((name, counter), 0.0) + rate * seconds
                counts[counter] = int(total)
                self._carry[(name, counter)] = total - int(total)
            self.add_counts(name, counts)

    def add_traffic(self, seconds: float, utilisation: float = 0.5) -> None:
        """Advance data counters as a busy port would (for the demo and rate graphs), and the
        error counters of a link going bad (`degrade_link`)."""
        self._grow(seconds)
        for dev in self.devices.values():
            if dev.name in self.removed or not dev.up:
                continue
            octets = int(dev.gbps * 1e9 / 8 * utilisation * seconds)
            words = octets // 4  # port_*_data count 4-octet words
            packets = octets // 4096
            if dev.soft:  # no PMA: rxe counts packets in hw_counters/
                dev.hw_counters["sent_pkts"] += packets
                dev.hw_counters["rcvd_pkts"] += packets
                self._write_counters(dev)
                continue
            for direction in ("xmit", "rcv"):
                dev.counters[f"port_{direction}_data"] += words
                dev.counters[f"port_{direction}_packets"] += packets
                dev.counters[f"unicast_{direction}_packets"] += packets
            self._write_counters(dev)

    def add_counts(self, name: str, counts: Mapping[str, int]) -> None:
        """Advance the named counters of `name`'s port (PMA or hw_counters, wherever the driver has
        the file) as errors would: a cable going bad, a lossy path. A name the driver lacks is
        refused, so a story cannot invent a file the kernel never writes."""
        dev = self.devices[name]
        for counter, step in counts.items():
            if counter in dev.counters:
                dev.counters[counter] += step
            elif counter in dev.hw_counters:
                dev.hw_counters[counter] += step
            else:
                raise KeyError(f"{name} has no counter {counter!r} (driver {dev.driver})")
        self._write_counters(dev)


__all__ = ["ROCE_V1", "ROCE_V2", "SimDevice", "SimHost", "ethernet_rate_text", "rate_text", "rxe_rate_text"]
