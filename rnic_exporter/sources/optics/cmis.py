"""CMIS (QSFP-DD 0x18, OSFP 0x19, QSFP+ with CMIS 0x1e): identity, monitors, own thresholds.

Memory used (OIF-CMIS 5.x):
  lower page   2       bit 7 "flat memory": only page 00h exists (passive copper)
               14-15   temperature            16-17  supply voltage
               86-117  applications 1-8, 4 bytes each: host interface (0xff ends the list), media
                       interface, host lanes (high nibble) and media lanes (low nibble) per instance
  page 00h     129-144 vendor name   145-147 OUI   148-163 part number   164-165 revision
               166-181 serial        182-189 date code
  page 01h     151     bit 4: Rx power is average (else OMA)
               160     lane monitors: bit 0 Tx bias, bit 1 Tx power, bit 2 Rx power;
                       bits 4-3 Tx bias multiplier (x1, x2, x4)
               176-183 media lane assignment options of applications 1-8: bit n set = an
                       instance may start on media lane n+1
  page 02h     128 temperature, 136 voltage, 176 Tx power, 184 Tx bias, 192 Rx power thresholds
  page 11h     154 Tx power, 170 Tx bias, 186 Rx power, lanes 1-8 of bank 0

Only bank 0 is read (lanes 1-8): an 800G OSFP has 8 media lanes, more banks only on line cards.
A temperature of 0 is what modules without monitors report, as in SFF-8636.
"""

from __future__ import annotations

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

UPPER = 128
IDENTITY = mem.IdentityLayout(vendor=129, oui=145, part_number=148, revision=164, serial_number=166, date_code=182)


def pages_to_read(lower: bytes) -> list[mem.PageKey]:
    """00h always; 01h (advertisements), 02h (thresholds) and 11h (lane monitors) when paged."""
    return [(0, 0)] if lower[2] & _FLAT_MEMORY else [(0, 0), (1, 0), (2, 0), (0x11, 0)]


def media_lanes(lower: bytes, page01: bytes | None = None) -> int:
    """The media lanes the module has: the furthest lane any advertised application reaches.

    An application's lane count is per instance: a 2x400G-DR4 OSFP advertises 400GBASE-DR4 on 4
    media lanes, startable on lane 1 or lane 5 (page 01h byte 176 = 0x11), so it has 8 live
    lanes, not 4. Without page 01h (flat memory) an application counts once. By form factor
    when the module advertises none.
    """
    found = 0
    for index, offset in enumerate(_APPLICATIONS):
        if lower[offset] == _END_OF_APPLICATIONS:
            break
        count = lower[offset + 2] & 0x0F
        if not 1 <= count <= LANES_PER_BANK:
            continue
        options = page01[_MEDIA_LANE_OPTIONS - UPPER + index] if page01 is not None else 0
        starts = [lane for lane in range(LANES_PER_BANK) if options >> lane & 1]
        found = max(found, min(LANES_PER_BANK, max((start + count for start in starts), default=count)))
    if found:
        return found
    return 4 if lower[0] == 0x1E else LANES_PER_BANK


def decode(memory: mem.ModuleMemory) -> ModuleReading:
    lower, page00 = memory.lower, memory.identity_page("CMIS")
    flat = bool(lower[2] & _FLAT_MEMORY)
    page01 = None if flat else memory.page(1)
    page02 = None if flat else memory.page(2)
    page11 = None if flat else memory.page(0x11)

    monitored = mem.u16(lower, 14) not in (0x0000, 0xFFFF)
    temperature = monitor(mem.celsius(lower, 14) if monitored else None, block(page02, 128 - UPPER, mem.celsius))
    voltage = monitor(mem.volts(lower, 16) if monitored else None, block(page02, 136 - UPPER, mem.volts))

    lanes: tuple[Lane, ...] = ()
    if page01 is not None and page11 is not None:
        lanes = _lanes(lower, page01, page02, page11)
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


def _lanes(lower: bytes, page01: bytes, page02: bytes | None, page11: bytes) -> tuple[Lane, ...]:
    advertised = page01[160 - UPPER]
    multiplier = _BIAS_MULTIPLIER.get(advertised & 0x18, 1)

    def bias(page: bytes, offset: int) -> float:
        return mem.amperes(page, offset, multiplier)

    tx_limits = block(page02, 176 - UPPER, mem.watts)
    bias_limits = block(page02, 184 - UPPER, bias)
    rx_limits = block(page02, 192 - UPPER, mem.watts)

    def lane_monitor(flag: int, offset: int, read: Reader, limits: Thresholds | None) -> Monitor | None:
        return Monitor(read(page11, offset - UPPER), limits) if advertised & flag else None

    return tuple(
        Lane(
            number=i + 1,
            rx_power_watts=lane_monitor(_RX_POWER, 186 + 2 * i, mem.watts, rx_limits),
            tx_power_watts=lane_monitor(_TX_POWER, 154 + 2 * i, mem.watts, tx_limits),
            tx_bias_amperes=lane_monitor(_TX_BIAS, 170 + 2 * i, bias, bias_limits),
        )
        for i in range(media_lanes(lower, page01))
    )
