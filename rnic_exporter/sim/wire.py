"""Simulated wire for RoCE netdevs: pluggable modules, FEC, link state, pause, `ethtool -S`.

`SimWire` keeps, per netdev, what a real mlx5e port would answer over ethtool netlink and GSTATS:
module memory as 128-byte pages laid out as SFF-8636 or CMIS (`SimModule.memory()`), FEC block
counters per lane, the extended link state while down, 802.3x and per-priority pause counters
with mlx5e's `ethtool -S` names. `SimEthtool` answers `EthtoolNetlink`'s requests from it with the
attributes the kernel sends (encoded and decoded by pyroute2, so the real reply parsers run), and
EOPNOTSUPP where the kernel says so: a netdev without a module cage or FEC/pause ops (IPoIB,
veth) is registered with `supported=False`.

Fault methods tell the stories the exporter exists for: `fade_rx_power` (an optic whose Rx power
falls through its warning threshold before the link renegotiates), `fec_errors`, `pause_storm`,
`link_down` with a reason; and one it must stay quiet on, `dark_lanes` (lanes the host keeps off).
"""

from __future__ import annotations

import errno
import struct
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

from rnic_exporter.sources import ethtool_netlink as en
from rnic_exporter.sources.optics.memory import PAGE_SIZE, ModuleMemory

SIM_LANES = 4
_DP_ACTIVATED, _DP_DEACTIVATED = 0x4, 0x1  # CMIS page 11h data path states


def _put(page: bytearray, offset: int, value: float, scale: float, signed: bool = False) -> None:
    raw = round(value / scale)
    raw = max(-0x8000, min(0x7FFF, raw)) if signed else max(0, min(0xFFFF, raw))
    page[offset : offset + 2] = raw.to_bytes(2, "big", signed=signed)


def _ascii(page: bytearray, offset: int, text: str, length: int) -> None:
    page[offset : offset + length] = text.encode("ascii")[:length].ljust(length, b" ")


@dataclass
class SimModule:
    """A module with typical 100G/400G SR optics limits; values in base units, as in the model."""

    memory_map: Literal["sff8636", "cmis"] = "sff8636"
    vendor: str = "Mellanox"
    part_number: str = "MMA1B00-C100D"
    serial_number: str = "MT2118FT01234"
    temperature_celsius: float = 45.0
    supply_voltage_volts: float = 3.3
    rx_power_watts: list[float] = field(default_factory=lambda: [0.9e-3] * SIM_LANES)
    tx_power_watts: list[float] = field(default_factory=lambda: [1.0e-3] * SIM_LANES)
    tx_bias_amperes: list[float] = field(default_factory=lambda: [7.5e-3] * SIM_LANES)
    # CMIS page 11h: the host has every lane's data path activated, as on a port in use
    data_path_active: list[bool] = field(default_factory=lambda: [True] * SIM_LANES)
    # (high alarm, low alarm, high warning, low warning)
    temperature_limits: tuple[float, float, float, float] = (75.0, -5.0, 70.0, 0.0)
    voltage_limits: tuple[float, float, float, float] = (3.63, 2.97, 3.465, 3.135)
    rx_power_limits: tuple[float, float, float, float] = (3.4673e-3, 0.0724e-3, 1.7378e-3, 0.1445e-3)
    tx_power_limits: tuple[float, float, float, float] = (3.4673e-3, 0.0724e-3, 1.7378e-3, 0.1445e-3)
    tx_bias_limits: tuple[float, float, float, float] = (15e-3, 2e-3, 13e-3, 3e-3)

    def memory(self) -> ModuleMemory:
        return self._sff8636() if self.memory_map == "sff8636" else self._cmis()

    def _limits(self, page: bytearray, offset: int, limits: tuple[float, ...], scale: float, signed: bool) -> None:
        for i, value in enumerate(limits):
            _put(page, offset + 2 * i, value, scale, signed)

    def _sff8636(self) -> ModuleMemory:
        lower, page00, page03 = bytearray(PAGE_SIZE), bytearray(PAGE_SIZE), bytearray(PAGE_SIZE)
        lower[0] = page00[0] = 0x11  # QSFP28; byte 2 = 0: paged memory, page 03h present
        _put(lower, 22, self.temperature_celsius, 1 / 256, signed=True)
        _put(lower, 26, self.supply_voltage_volts, 100e-6)
        for i in range(SIM_LANES):
            _put(lower, 34 + 2 * i, self.rx_power_watts[i], 1e-7)
            _put(lower, 42 + 2 * i, self.tx_bias_amperes[i], 2e-6)
            _put(lower, 50 + 2 * i, self.tx_power_watts[i], 1e-7)
        _ascii(page00, 148 - 128, self.vendor, 16)
        page00[165 - 128 : 168 - 128] = bytes([0x00, 0x02, 0xC9])
        _ascii(page00, 168 - 128, self.part_number, 16)
        _ascii(page00, 184 - 128, "A2", 2)
        _ascii(page00, 196 - 128, self.serial_number, 16)
        _ascii(page00, 212 - 128, "210504", 8)
        page00[220 - 128] = 0x0C  # average Rx power, Tx power measured
        self._limits(page03, 0, self.temperature_limits, 1 / 256, True)
        self._limits(page03, 144 - 128, self.voltage_limits, 100e-6, False)
        self._limits(page03, 176 - 128, self.rx_power_limits, 1e-7, False)
        self._limits(page03, 184 - 128, self.tx_bias_limits, 2e-6, False)
        self._limits(page03, 192 - 128, self.tx_power_limits, 1e-7, False)
        return ModuleMemory(bytes(lower), {(0, 0): bytes(page00), (3, 0): bytes(page03)})

    def _cmis(self) -> ModuleMemory:
        lower = bytearray(PAGE_SIZE)
        page00, page01, page02, page11 = (bytearray(PAGE_SIZE) for _ in range(4))
        lower[0] = page00[0] = 0x18  # QSFP-DD; byte 2 bit 7 clear: paged
        lower[1] = 0x50  # CMIS 5.0
        _put(lower, 14, self.temperature_celsius, 1 / 256, signed=True)
        _put(lower, 16, self.supply_voltage_volts, 100e-6)
        lower[86:90] = bytes([0x4F, 0x1C, 0x44, 0x01])  # 400GAUI-4 / 400GBASE-DR4, 4 host and 4 media lanes
        _ascii(page00, 129 - 128, self.vendor, 16)
        page00[145 - 128 : 148 - 128] = bytes([0x00, 0x02, 0xC9])
        _ascii(page00, 148 - 128, self.part_number, 16)
        _ascii(page00, 164 - 128, "A0", 2)
        _ascii(page00, 166 - 128, self.serial_number, 16)
        _ascii(page00, 182 - 128, "230101", 8)
        page01[151 - 128] = 0x10  # average Rx power
        page01[160 - 128] = 0x07  # Tx bias, Tx power, Rx power monitored; bias multiplier x1
        self._limits(page02, 0, self.temperature_limits, 1 / 256, True)
        self._limits(page02, 136 - 128, self.voltage_limits, 100e-6, False)
        self._limits(page02, 176 - 128, self.tx_power_limits, 1e-7, False)
        self._limits(page02, 184 - 128, self.tx_bias_limits, 2e-6, False)
        self._limits(page02, 192 - 128, self.rx_power_limits, 1e-7, False)
        for i in range(SIM_LANES):
            _put(page11, 154 - 128 + 2 * i, self.tx_power_watts[i], 1e-7)
            _put(page11, 170 - 128 + 2 * i, self.tx_bias_amperes[i], 2e-6)
            _put(page11, 186 - 128 + 2 * i, self.rx_power_watts[i], 1e-7)
        for i in range(SIM_LANES):  # data path state per host lane, lane 1 in the low nibble
            state = _DP_ACTIVATED if self.data_path_active[i] else _DP_DEACTIVATED
            page11[i // 2] |= state << (4 * (i % 2))
        page10 = bytearray(PAGE_SIZE)  # byte 130, Tx disable: 0, every transmitter enabled
        upper = {
            (0, 0): bytes(page00),
            (1, 0): bytes(page01),
            (2, 0): bytes(page02),
            (0x10, 0): bytes(page10),
            (0x11, 0): bytes(page11),
        }
        return ModuleMemory(bytes(lower), upper)


@dataclass
class SimPort:
    supported: bool = True  # False: IPoIB/veth-like, every op but link state is EOPNOTSUPP
    module: SimModule | None = field(default_factory=SimModule)
    link_up: bool = True
    ext_state: int | None = None  # enum ethtool_link_ext_state while down
    ext_substate: int | None = None
    down_count: int = 0
    fec_mode: int = 50  # ETHTOOL_LINK_MODE_FEC_RS_BIT
    fec_corrected: list[int] = field(default_factory=lambda: [0] * SIM_LANES)
    fec_uncorrectable: list[int] = field(default_factory=lambda: [0] * SIM_LANES)
    # the RS-FEC codeword histogram of 6.18+ kernels, {(low, high): codewords}; None: an older kernel
    fec_histogram: dict[tuple[int, int], int] | None = None
    pause_rx_frames: int = 0
    pause_tx_frames: int = 0
    gstats: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.gstats and not self.supported:  # IPoIB: its own few strings, no pause or PFC
            self.gstats = {"rx_packets": 0, "tx_packets": 0}
        if not self.gstats:
            for way in ("rx", "tx"):
                for prio in range(8):
                    for what in ("pause", "pause_duration", "pause_transition"):
                        self.gstats[f"{way}_prio{prio}_{what}"] = 0
            for prio in range(8):
                self.gstats[f"rx_prio{prio}_buf_discard"] = 0
                self.gstats[f"rx_prio{prio}_cong_discard"] = 0
            for name in ("rx_pause_ctrl_phy", "tx_pause_ctrl_phy", "rx_discards_phy", "rx_out_of_buffer"):
                self.gstats[name] = 0
            for name in ("tx_pause_storm_warning_events", "tx_pause_storm_error_events"):
                self.gstats[name] = 0
            for name in ("module_unplug", "module_bus_stuck", "module_high_temp", "module_bad_shorted"):
                self.gstats[name] = 0
            self.gstats["rx_vport_unicast_packets"] = 0  # one of the many strings the parser skips


class SimWire:
    """Per-netdev wire state; thread-safe: the daemon reads while a test injects."""

    def __init__(self) -> None:
        self.ports: dict[str, SimPort] = {}
        self.lock = threading.Lock()

    def add(self, netdev: str, port: SimPort | None = None) -> SimPort:
        with self.lock:
            self.ports[netdev] = port or SimPort()
            return self.ports[netdev]

    # -- stories ----------------------------------------------------------------------------

    def fade_rx_power(self, netdev: str, lane: int, watts: float) -> None:
        """Rx power of `lane` (1-based) drops to `watts`: a dirty connector, a bent fibre."""
        with self.lock:
            module = self.ports[netdev].module
            assert module is not None, f"{netdev} has no module"
            module.rx_power_watts[lane - 1] = watts

    def dark_lanes(self, netdev: str, lanes: list[int]) -> None:
        """The host deactivates the data path of `lanes` (1-based; CMIS modules): they go dark on
        purpose, 0 W both ways and no bias, as the unused port of a twin-port module."""
        with self.lock:
            module = self.ports[netdev].module
            assert module is not None and module.memory_map == "cmis", f"{netdev} has no CMIS module"
            for lane in lanes:
                module.data_path_active[lane - 1] = False
                module.rx_power_watts[lane - 1] = module.tx_power_watts[lane - 1] = 0.0
                module.tx_bias_amperes[lane - 1] = 0.0

    def fec_errors(
        self, netdev: str, corrected: int, uncorrectable: int = 0, lane: int = 1, bit_errors: int = 1
    ) -> None:
        """`corrected` codewords with `bit_errors` errors each (counted in the histogram's bin that
        holds that many, where the port has one) and `uncorrectable` ones, on `lane` (1-based)."""
        with self.lock:
            port = self.ports[netdev]
            port.fec_corrected[lane - 1] += corrected
            port.fec_uncorrectable[lane - 1] += uncorrectable
            if port.fec_histogram is not None:
                for low, high in port.fec_histogram:
                    if low <= bit_errors <= high:
                        port.fec_histogram[low, high] += corrected

    def pause_storm(self, netdev: str, priority: int, frames: int, duration_us: int, storm: bool = False) -> None:
        """Our receive side is behind: we send pause on `priority` (and the device flags a storm)."""
        with self.lock:
            stats = self.ports[netdev].gstats
            stats[f"tx_prio{priority}_pause"] += frames
            stats[f"tx_prio{priority}_pause_duration"] += duration_us
            stats[f"tx_prio{priority}_pause_transition"] += 1
            if storm:
                stats["tx_pause_storm_warning_events"] += 1

    def link_down(self, netdev: str, ext_state: int | None = 5, ext_substate: int | None = None) -> None:
        """Carrier lost; the driver says why (default: 5, cable issue)."""
        with self.lock:
            port = self.ports[netdev]
            port.link_up, port.ext_state, port.ext_substate = False, ext_state, ext_substate
            port.down_count += 1

    def link_up(self, netdev: str) -> None:
        with self.lock:
            port = self.ports[netdev]
            port.link_up, port.ext_state, port.ext_substate = True, None, None

    def gstats(self, netdev: str) -> dict[str, int]:
        """`ethtool -S`: the driver's strings and values (EOPNOTSUPP-free: every netdev has GSTATS)."""
        with self.lock:
            port = self.ports.get(netdev)
            if port is None:  # the ioctl on a name the namespace does not have
                raise OSError(errno.ENODEV, "No such device")
            return dict(port.gstats)


class SimEthtool(en.EthtoolNetlink):
    """`EthtoolNetlink` answered by a `SimWire`, in the kernel's attribute layout."""

    def __init__(self, wire: SimWire) -> None:
        super().__init__()
        self.wire = wire

    def _get(
        self,
        operation: str,
        msg_class: Any,
        cmd: int,
        ifname: str,
        flags: int = 0,
        attrs: list[tuple[str, int]] | None = None,
    ) -> Any:
        self.requests[operation] = self.requests.get(operation, 0) + 1
        with self.wire.lock:
            port = self.wire.ports.get(ifname)
            if port is None:
                raise en._NetlinkError(errno.ENODEV)
            reply = self._answer(port, cmd, dict(attrs or []))
        return kernel_encoded(msg_class, reply)

    def present(self, ifname: str) -> bool:
        with self.wire.lock:
            return ifname in self.wire.ports

    def _answer(self, port: SimPort, cmd: int, request: dict[str, int]) -> list[tuple[str, Any]]:
        if cmd == en.MSG_LINKSTATE_GET:
            out: list[tuple[str, Any]] = [("ETHTOOL_A_LINKSTATE_LINK", int(port.link_up))]
            if not port.link_up and port.ext_state is not None:
                out.append(("ETHTOOL_A_LINKSTATE_EXT_STATE", port.ext_state))
                if port.ext_substate is not None:
                    out.append(("ETHTOOL_A_LINKSTATE_EXT_SUBSTATE", port.ext_substate))
            out.append(("ETHTOOL_A_LINKSTATE_EXT_DOWN_CNT", port.down_count))
            return out
        if not port.supported:
            raise en._NetlinkError(errno.EOPNOTSUPP)
        if cmd == en.MSG_FEC_GET:
            stats: list[tuple[str, Any]] = [
                ("ETHTOOL_A_FEC_STAT_CORRECTED", _u64s([sum(port.fec_corrected), *port.fec_corrected])),
                ("ETHTOOL_A_FEC_STAT_UNCORR", _u64s([sum(port.fec_uncorrectable), *port.fec_uncorrectable])),
            ]
            for (low, high), codewords in (port.fec_histogram or {}).items():
                value = struct.pack("=I" if codewords < 1 << 32 else "=Q", codewords)  # NLA_UINT, as the kernel puts it
                hist = [("ETHTOOL_A_FEC_HIST_BIN_LOW", low), ("ETHTOOL_A_FEC_HIST_BIN_HIGH", high)]
                stats.append(("ETHTOOL_A_FEC_STAT_HIST", {"attrs": [*hist, ("ETHTOOL_A_FEC_HIST_BIN_VAL", value)]}))
            return [("ETHTOOL_A_FEC_ACTIVE", port.fec_mode), ("ETHTOOL_A_FEC_STATS", {"attrs": stats})]
        if cmd == en.MSG_PAUSE_GET:
            pause_stats: list[tuple[str, Any]] = [
                ("ETHTOOL_A_PAUSE_STAT_TX_FRAMES", port.pause_tx_frames),
                ("ETHTOOL_A_PAUSE_STAT_RX_FRAMES", port.pause_rx_frames),
            ]
            return [
                ("ETHTOOL_A_PAUSE_AUTONEG", 0),
                ("ETHTOOL_A_PAUSE_RX", 1),
                ("ETHTOOL_A_PAUSE_TX", 1),
                ("ETHTOOL_A_PAUSE_STATS", {"attrs": pause_stats}),
            ]
        if cmd == en.MSG_MODULE_EEPROM_GET:
            if port.module is None:
                raise en._NetlinkError(errno.ENODEV)  # an empty cage
            memory = port.module.memory()
            offset = request["ETHTOOL_A_MODULE_EEPROM_OFFSET"]
            data = (
                memory.lower
                if offset < PAGE_SIZE
                else memory.upper.get(
                    (request["ETHTOOL_A_MODULE_EEPROM_PAGE"], request["ETHTOOL_A_MODULE_EEPROM_BANK"])
                )
            )
            if data is None:
                raise en._NetlinkError(errno.EINVAL)  # a page the module does not have
            return [("ETHTOOL_A_MODULE_EEPROM_DATA", data)]
        raise en._NetlinkError(errno.EOPNOTSUPP)


def _u64s(values: list[int]) -> bytes:
    return b"".join(v.to_bytes(8, sys.byteorder) for v in values)  # netlink arrays are host order


def kernel_encoded(msg_class: Any, attrs: list[tuple[str, Any]]) -> Any:
    """The reply as bytes on the wire and back: what `nlm_request` hands the parsers."""
    msg = msg_class()
    msg["cmd"] = 0
    msg["version"] = en.GENL_VERSION
    msg["attrs"] = attrs
    msg.encode()
    parsed = msg_class(msg.data)
    parsed.decode()
    return parsed


__all__ = ["SIM_LANES", "SimEthtool", "SimModule", "SimPort", "SimWire", "kernel_encoded"]
