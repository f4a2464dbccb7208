"""SFF-8636 (QSFP+ 0x0d, QSFP28 0x11): identity, monitors and the module's own thresholds.

Memory used (SFF-8636 rev 2.10a):
  lower page   2       status: bit 2 "flat memory" = no upper pages but 00h (no thresholds)
               22-23   temperature            26-27  supply voltage
               34-41   Rx power, lanes 1-4    42-49  Tx bias, lanes 1-4    50-57  Tx power, lanes 1-4
  page 00h     148-163 vendor name   165-167 OUI   168-183 part number   184-185 revision
               196-211 serial        212-219 date code
               220     diagnostic type: bit 3 Rx power is average (else OMA), bit 2 Tx power measured
  page 03h     128 temperature, 144 voltage, 176 Rx power, 184 Tx bias, 192 Tx power thresholds

The standard has no "monitors implemented" bit: a module without monitors (a passive copper
cable) reads 0 (or 0xffff) as its temperature, and ethtool takes a valid temperature as the sign
that the lane monitors exist too. We do the same, so a DAC yields identity only, not zeros.
"""

from __future__ import annotations

from rnic_exporter.model.optics import Lane, ModuleReading, Monitor
from rnic_exporter.sources.optics import memory as mem
from rnic_exporter.sources.optics.thresholds import block, monitor

LANES = 4
_FLAT_MEMORY = 0x04  # lower page byte 2
_RX_POWER_AVERAGE = 0x08  # page 00h byte 220
_TX_POWER_MEASURED = 0x04

UPPER = 128  # upper-page offsets below are as in the standard (128-255); pages are stored 0-127
IDENTITY = mem.IdentityLayout(vendor=148, oui=165, part_number=168, revision=184, serial_number=196, date_code=212)


def pages_to_read(lower: bytes) -> list[mem.PageKey]:
    """The upper pages worth one request each: 00h always, 03h unless the memory is flat."""
    return [(0, 0)] if lower[2] & _FLAT_MEMORY else [(0, 0), (3, 0)]


def decode(memory: mem.ModuleMemory) -> ModuleReading:
    lower, page00 = memory.lower, memory.identity_page("SFF-8636")
    page03 = None if lower[2] & _FLAT_MEMORY else memory.page(3)
    identity = mem.read_identity(lower[0], page00, "sff8636", IDENTITY)

    raw_temperature = mem.u16(lower, 22)
    monitored = raw_temperature not in (0x0000, 0xFFFF)
    temperature = monitor(mem.celsius(lower, 22) if monitored else None, block(page03, 128 - UPPER, mem.celsius))
    voltage = monitor(mem.volts(lower, 26) if monitored else None, block(page03, 144 - UPPER, mem.volts))

    lanes: tuple[Lane, ...] = ()
    if monitored:
        rx_limits = block(page03, 176 - UPPER, mem.watts)
        bias_limits = block(page03, 184 - UPPER, mem.amperes)
        tx_limits = block(page03, 192 - UPPER, mem.watts)
        tx_measured = bool(page00[220 - UPPER] & _TX_POWER_MEASURED)
        lanes = tuple(
            Lane(
                number=i + 1,
                rx_power_watts=Monitor(mem.watts(lower, 34 + 2 * i), rx_limits),
                tx_power_watts=Monitor(mem.watts(lower, 50 + 2 * i), tx_limits) if tx_measured else None,
                tx_bias_amperes=Monitor(mem.amperes(lower, 42 + 2 * i), bias_limits),
            )
            for i in range(LANES)
        )
    return ModuleReading(
        identity=identity,
        temperature_celsius=temperature,
        supply_voltage_volts=voltage,
        lanes=lanes,
        rx_power_kind="average" if page00[220 - UPPER] & _RX_POWER_AVERAGE else "oma",
        thresholds_published=any(
            block(page03, off - UPPER, read) is not None
            for off, read in ((128, mem.celsius), (144, mem.volts), (176, mem.watts))
        ),
    )
