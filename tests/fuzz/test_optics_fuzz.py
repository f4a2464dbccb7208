"""Module memory decoders on arbitrary bytes: a reading, an unsupported module or a ModuleDecodeError,
nothing else, and every value finite in its base unit (a module's EEPROM is outside our control)."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rnic_exporter.model.optics import Level, ModuleReading, UnsupportedModule
from rnic_exporter.sources.optics.decode import decode, pages_to_read
from rnic_exporter.sources.optics.memory import ModuleDecodeError, ModuleMemory

PAGE = st.binary(min_size=128, max_size=128)
IDENTIFIER = st.sampled_from([0x0D, 0x11, 0x18, 0x19, 0x1E, 0x03, 0x00, 0xFF])
PAGES = st.dictionaries(
    st.sampled_from([(0, 0), (1, 0), (2, 0), (3, 0), (0x10, 0), (0x11, 0)]), st.binary(max_size=160)
)


@settings(max_examples=300, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(IDENTIFIER, PAGE, PAGES, st.booleans())
def test_decoders_give_a_reading_or_a_reason(
    identifier: int, lower: bytes, upper: dict[tuple[int, int], bytes], identity: bool
) -> None:
    lower = bytes([identifier]) + lower[1:]
    if identity:
        upper = {**upper, (0, 0): bytes(128)}
    memory = ModuleMemory(lower=lower, upper=upper)
    assert isinstance(pages_to_read(lower), list)
    try:
        result = decode(memory)
    except ModuleDecodeError:
        return
    assert isinstance(result, (ModuleReading, UnsupportedModule))
    if isinstance(result, ModuleReading):
        for _, _, monitor in result.monitors():
            assert math.isfinite(monitor.value)
            assert monitor.level is not None
        assert result.worst is not None
        for lane in result.lanes:  # a lane the host keeps dark is never judged, whatever it reads
            dark = (
                [lane.rx_power_watts, lane.tx_power_watts, lane.tx_bias_amperes]
                if lane.data_path_active is False
                else []
            )
            dark += [lane.tx_power_watts, lane.tx_bias_amperes] if lane.tx_disabled else []
            assert all(mon.level is Level.NOT_IN_USE for mon in dark if mon is not None)
