"""CMIS (QSFP-DD 0x18, OSFP 0x19, QSFP+ with CMIS 0x1e): identity, monitors, own thresholds.

Memory used (OIF-CMIS 5.x):
  lower page   2       bit 7 "flat memory": only page 00h exists (passive copper)
               14-15   temperature            16-17  supply voltage
               86-117  applications 1-8, 4 bytes each: host interface (0xff ends the list), media
                       interface, host lanes (high nibble) and media lanes (low nibble) per instance,
                       host lane assignment options (bit n set = an instance may start on host lane n+1)
  page 00h     129-144 vendor name   145-147 OUI   148-163 part number   164-165 revision
               166-181 serial        182-189 date code
  page 01h     151     bit 4: Rx power is average (else OMA)
               160     lane monitors: bit 0 Tx bias, bit 1 Tx power, bit 2 Rx power;
                       bits 4-3 Tx bias multiplier (x1, x2, x4)
               176-183 media lane assignment options of applications 1-8: bit n set = an
                       instance may start on media lane n+1
  page 02h     128 temperature, 136 voltage, 176 Tx power, 184 Tx bias, 192 Rx power thresholds
  page 10h     130     Tx disable, bit n = media lane n+1 (written by the host)
  page 11h     128-131 data path state, 4 bits per host lane, lane 1 in the low nibble of 128:
                       1 deactivated, 4 activated, 2/3/5/6/7 on the way between; 0, 8-15 reserved
               154 Tx power, 170 Tx bias, 186 Rx power, lanes 1-8 of bank 0

Only bank 0 is read (lanes 1-8): an 800G OSFP has 8 media lanes, more banks only on line cards.
A temperature of 0 is what modules without monitors report, as in SFF-8636.

Dark lanes: a twin-port module (2x400G, 2x200G, a breakout) of which the host uses one port, or a
lane the host has deactivated, receives and sends no light on purpose. A lane is judged only while
its data path is activated; deactivated or between states (values meaningless), its monitors are
reported but not judged (`Level.NOT_IN_USE`), and a disabled transmitter leaves Tx power and bias
unjudged. Data path state is per host lane, monitors per media lane: host lanes map to media lanes
in proportion (`feeding_host_lanes`), which is exact for every application whose instances sit in
lane order with one host:media ratio (1:1 DR4/FR4/SR8, 8:4 400GAUI-8 to DR4, 2:1 breakouts). A
module mixing ratios across instances could be mapped loosely, so a media lane goes dark only when
every host lane that may feed it reports a non-activated state; any activated or unknown (reserved
code) host lane keeps it judged, as before this was read.
"""

from __future__ import annotations

from collections.abc import Callable

from rnic_exporter.model.optics import Lane, ModuleReading, Monitor, Thresholds
from rnic_exporter.sources.optics import memory as mem
from rnic_exporter.sources.optics.thresholds import Reader, block, monitor

_FLAT_MEMORY = 0x80  # lower page byte 2
_RX_POWER_AVERAGE = 0x10  # page 01h byte 151
_TX_BIAS, _TX_POWER, _RX_POWER = 0x01, 0x02, 0x04  # page 01h byte 160
_BIAS_MULTIPLIER = {0x00: 1, 0x08: 2, 0x10: 4}
LANES_PER_BANK = 8
_APPLICATIONS = range(86, 118, 4)  # lower page, application descriptors 1-8
_END_OF_APPLICATIONS = 0xFF  # host interface code that ends the list (SFF-8024)
_MEDIA_LANE_OPTIONS = 176  # page 01h, one byte per application
_TX_DISABLE = 130  # page 10h
_DATA_PATH_STATE = 128  # page 11h, 4 bytes
_DP_ACTIVATED = 0x4
_DP_NOT_ACTIVATED = frozenset({0x1, 0x2, 0x3, 0x5, 0x6, 0x7})  # deactivated and the states between

UPPER = 128
IDENTITY = mem.IdentityLayout(vendor=129, oui=145, part_number=148, revision=164, serial_number=166, date_code=182)


def pages_to_read(lower: bytes) -> list[mem.PageKey]:
    """00h always; 01h (advertisements), 02h (thresholds), 10h (Tx disable) and 11h (data path
    state, lane monitors) when paged."""
    return [(0, 0)] if lower[2] & _FLAT_MEMORY else [(0, 0), (1, 0), (2, 0), (0x10, 0), (0x11, 0)]


def media_lanes(lower: bytes, page01: bytes | None = None) -> int:
    """The media lanes the module has: the furthest lane any advertised application reaches.

    An application's lane count is per instance: a 2x400G-DR4 OSFP advertises 400GBASE-DR4 on 4
    media lanes, startable on lane 1 or lane 5 (page 01h byte 176 = 0x11), so it has 8 live
    lanes, not 4. Without page 01h (flat memory) an application counts once. By form factor
    when the module advertises none.
    """
    return _lanes_reached(
        lower,
        lambda index, offset: (
            lower[offset + 2] & 0x0F,
            page01[_MEDIA_LANE_OPTIONS - UPPER + index] if page01 is not None else 0,
        ),
    )


def host_lanes(lower: bytes) -> int:
    """The host lanes the module has, as `media_lanes` (host lane options are in the lower page)."""
    return _lanes_reached(lower, lambda _index, offset: (lower[offset + 2] >> 4, lower[offset + 3]))


def _lanes_reached(lower: bytes, count_and_options: Callable[[int, int], tuple[int, int]]) -> int:
    found = 0
    for index, offset in enumerate(_APPLICATIONS):
        if lower[offset] == _END_OF_APPLICATIONS:
            break
        count, options = count_and_options(index, offset)
        if not 1 <= count <= LANES_PER_BANK:
            continue
        starts = [lane for lane in range(LANES_PER_BANK) if options >> lane & 1]
        found = max(found, min(LANES_PER_BANK, max((start + count for start in starts), default=count)))
    if found:
        return found
    return 4 if lower[0] == 0x1E else LANES_PER_BANK


def feeding_host_lanes(media_lane: int, media: int, host: int) -> range:
    """The host lanes (0-based) that may feed `media_lane` (0-based), in proportion.

    1:1 is direct; 8 host lanes to 4 media lanes (400GAUI-8 to DR4) gives media lane k host lanes
    2k and 2k+1; 4 host to 8 media gives media lanes 2k and 2k+1 host lane k.
    """
    first = media_lane * host // media
    end = max(first + 1, -(-(media_lane + 1) * host // media))
    return range(first, min(end, host))


def data_path_active(page11: bytes, hosts: range) -> bool | None:
    """True when any of `hosts` is activated, False when all are known not to be, else None."""
    states = [page11[_DATA_PATH_STATE - UPPER + lane // 2] >> (4 * (lane % 2)) & 0x0F for lane in hosts]
    if any(state == _DP_ACTIVATED for state in states):
        return True
    if states and all(state in _DP_NOT_ACTIVATED for state in states):
        return False
    return None


def decode(memory: mem.ModuleMemory) -> ModuleReading:
    lower, page00 = memory.lower, memory.identity_page("CMIS")
    flat = bool(lower[2] & _FLAT_MEMORY)
    page01 = None if flat else memory.page(1)
    page02 = None if flat else memory.page(2)
    page10 = None if flat else memory.page(0x10)
    page11 = None if flat else memory.page(0x11)

    monitored = mem.u16(lower, 14) not in (0x0000, 0xFFFF)
    temperature = monitor(mem.celsius(lower, 14) if monitored else None, block(page02, 128 - UPPER, mem.celsius))
    voltage = monitor(mem.volts(lower, 16) if monitored else None, block(page02, 136 - UPPER, mem.volts))

    lanes: tuple[Lane, ...] = ()
    if page01 is not None and page11 is not None:
        lanes = _lanes(lower, page01, page02, page10, page11)
    return ModuleReading(
        identity=mem.read_identity(lower[0], page00, "cmis", IDENTITY),
        temperature_celsius=temperature,
        supply_voltage_volts=voltage,
        lanes=lanes,
        rx_power_kind="oma" if page01 is not None and not page01[151 - UPPER] & _RX_POWER_AVERAGE else "average",
        thresholds_published=any(
            block(page02, off - UPPER, read) is not None
            for off, read in ((128, mem.celsius), (136, mem.volts), (192, mem.watts))
        ),
    )


def _lanes(lower: bytes, page01: bytes, page02: bytes | None, page10: bytes | None, page11: bytes) -> tuple[Lane, ...]:
    advertised = page01[160 - UPPER]
    multiplier = _BIAS_MULTIPLIER.get(advertised & 0x18, 1)

    def bias(page: bytes, offset: int) -> float:
        return mem.amperes(page, offset, multiplier)

    tx_limits = block(page02, 176 - UPPER, mem.watts)
    bias_limits = block(page02, 184 - UPPER, bias)
    rx_limits = block(page02, 192 - UPPER, mem.watts)

    def lane_monitor(flag: int, offset: int, read: Reader, limits: Thresholds | None, in_use: bool) -> Monitor | None:
        return Monitor(read(page11, offset - UPPER), limits, in_use) if advertised & flag else None

    media, host = media_lanes(lower, page01), host_lanes(lower)
    out = []
    for i in range(media):
        active = data_path_active(page11, feeding_host_lanes(i, media, host))
        tx_disabled = bool(page10[_TX_DISABLE - UPPER] >> i & 1) if page10 is not None else None
        lit = active is not False  # unknown state: judged, as before the state was read
        out.append(
            Lane(
                number=i + 1,
                rx_power_watts=lane_monitor(_RX_POWER, 186 + 2 * i, mem.watts, rx_limits, lit),
                tx_power_watts=lane_monitor(_TX_POWER, 154 + 2 * i, mem.watts, tx_limits, lit and not tx_disabled),
                tx_bias_amperes=lane_monitor(_TX_BIAS, 170 + 2 * i, bias, bias_limits, lit and not tx_disabled),
                data_path_active=active,
                tx_disabled=tx_disabled,
            )
        )
    return tuple(out)
