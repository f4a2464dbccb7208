"""SFF-8636 and CMIS decoders: real module dumps against an independent decode, then the rules.

Real dumps (tests/fixtures/modules/*/SOURCE.md): 30 QSFP+/QSFP28 modules of 15 vendors from
OpenNetworkLinux's module database and its successor bigcode's, compared with that database's own
decode of each; one Mellanox QSFP28 with its page 03h, compared with the `ethtool -m` lines
published with it. CMIS: QSFP-DD modules of Amphenol and INNOLIGHT (bigcode) and Mellanox (a
SONiC test), identity compared with those decoders; an Arista QSFP-DD and OSFP with pages 01h,
02h and 11h (FBOSS's test data), part numbers compared with FBOSS's decoder and the QSFP-DD's
thresholds with ethtool's print of the same part. No real CMIS dump comes with an independent
decode of its own lane monitors: those are checked against FBOSS's decoder on its made-up vector,
and against the spec on constructed pages below.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from rnic_exporter.catalog.metrics import MODULE_LANE_ACTIVE, MODULE_MONITOR_LEVEL, MODULE_RX_POWER
from rnic_exporter.commands.check import optic_problems
from rnic_exporter.model.optics import Level, ModuleReading, Thresholds, UnsupportedModule, watts_to_dbm
from rnic_exporter.model.wire import NetdevWire
from rnic_exporter.sinks.wire_samples import module_samples
from rnic_exporter.sources.optics import cmis, sff8636
from rnic_exporter.sources.optics.decode import decode, pages_to_read
from rnic_exporter.sources.optics.memory import ModuleDecodeError, ModuleMemory, ascii_field, from_linear
from tests.support.modules import MODULES, parse_ethtool_hex

ONL = json.loads((MODULES / "onl-sff-db" / "sff_db_qsfp.json").read_text())["entries"]
BIGCODE = json.loads((MODULES / "bigcode-sff-db" / "sff_db_new_entries.json").read_text())["entries"]
SONIC_MLX = json.loads((MODULES / "sonic-xcvr-qsfp-dd-mellanox" / "test_xcvr_eeprom.json").read_text())
FBOSS = json.loads((MODULES / "fboss-arista-xdr4" / "eeprom_pages.json").read_text())
FBOSS_FR4 = json.loads((MODULES / "fboss-synthetic-cmis-200g-fr4" / "cmis_200g_fr4.json").read_text())
MLX = MODULES / "mlxsw-qsfp28-mellanox"


def _reading(memory: ModuleMemory) -> ModuleReading:
    result = decode(memory)
    assert isinstance(result, ModuleReading)
    return result


@pytest.mark.parametrize("entry", ONL, ids=[f"line{e['line']}" for e in ONL])
def test_onl_module_identity_equals_onl_decode(entry: dict[str, Any]) -> None:
    data = bytes.fromhex(entry["eeprom"])
    got = _reading(ModuleMemory(lower=data[:128], upper={(0, 0): data[128:]})).identity
    want = (entry["vendor"].strip(), entry["model"].strip(), entry["serial"].strip(), entry["sfp_type"])
    assert (got.vendor, got.part_number, got.serial_number, got.type) == want


# bigcode's module types name their lane count last: 400G-CR8 is eight copper pairs, 400G-DR4 four fibres
_BIGCODE_LANES = {"SFF_400G_CR8_PROPERTIES": 8, "SFF_400G_DR4_PROPERTIES": 4}


@pytest.mark.parametrize("entry", BIGCODE, ids=[f"line{e['line']}" for e in BIGCODE])
def test_bigcode_module_identity_equals_bigcode_decode(entry: dict[str, Any]) -> None:
    data = bytes.fromhex(entry["eeprom"])
    reading = _reading(ModuleMemory(lower=data[:128], upper={(0, 0): data[128:]}))
    got = reading.identity
    want = (entry["vendor"].strip(), entry["model"].strip(), entry["serial"].strip(), entry["sfp_type"])
    assert (got.vendor, got.part_number, got.serial_number, got.type) == want
    if data[0] == 0x18:
        assert got.memory_map == "cmis"
        assert cmis.media_lanes(data[:128]) == _BIGCODE_LANES[entry["properties"]]
        # lower page and page 00h only: no lane monitors and no thresholds, never zeros
        assert reading.lanes == () and not reading.thresholds_published


def test_bigcode_fixture_holds_two_cmis_vendors() -> None:
    cmis_vendors = {e["vendor"].strip() for e in BIGCODE if bytes.fromhex(e["eeprom"])[0] == 0x18}
    assert cmis_vendors == {"Amphenol", "INNOLIGHT"}


def test_mellanox_qsfp_dd_equals_sonic_xcvr_decode() -> None:
    """SONiC's CMIS decoder on the same 256 bytes: every field both of us decode."""
    data = bytes.fromhex(SONIC_MLX["eeprom"])
    assert len(data) == 256
    want = SONIC_MLX["admin_info"]
    reading = _reading(ModuleMemory(lower=data[:128], upper={(0, 0): data[128:]}))
    got = reading.identity
    assert got.type == want["Identifier Abbreviation"] and got.memory_map == "cmis"
    assert got.vendor == want["VendorName"].strip()
    assert got.part_number == want["VendorPN"].strip()
    assert got.serial_number == want["VendorSN"].strip()
    assert got.revision == want["VendorRev"]
    assert got.oui == want["VendorOUI"].replace("-", ":")
    # sonic_xcvr prints the YYMMDD date code as 20YY-MM-DD followed by the lot code
    assert f"20{got.date_code[:2]}-{got.date_code[2:4]}-{got.date_code[4:6]}" == want["VendorDate"].strip()
    assert cmis.media_lanes(data[:128]) == want["MediaLaneCount"]
    # a passive cable (flat memory, no monitors): identity only, nothing judged
    assert want["ModuleMediaType"] == "passive_copper_media_interface"
    assert cmis.pages_to_read(data[:128]) == [(0, 0)]
    assert reading.temperature_celsius is None and reading.supply_voltage_volts is None
    assert reading.lanes == () and not reading.thresholds_published


def test_onl_fixture_spans_vendors_and_both_sff8636_types() -> None:
    vendors = {e["vendor"].strip().rstrip(".") for e in ONL}
    assert len(ONL) == 29 and len(vendors) >= 14
    assert {bytes.fromhex(e["eeprom"])[0] for e in ONL} == {0x0D, 0x11}


# ethtool's qsfp.c prints bias in mA (%.3f), power in mW (%.4f), temperature (%.2f), voltage (%.4f)
_ETHTOOL_LINE = re.compile(r"^(?P<name>.+?)\s+:\s+(?P<value>-?[\d.]+) (?P<unit>mA|mW|degrees C|V)\b")
_NAMES = {
    "Laser bias current": "tx_bias",
    "Laser output power": "tx_power",
    "Laser rx power": "rx_power",
    "Module temperature": "temperature",
    "Module voltage": "supply_voltage",
}
_SCALE = {"mA": 1e3, "mW": 1e3, "degrees C": 1.0, "V": 1.0}
_DIGITS = {"mA": 3, "mW": 4, "degrees C": 2, "V": 4}


def _published_thresholds(decoded: Path) -> list[tuple[str, str, str, str]]:
    """(value name, limit attribute, printed value, unit) of every threshold line published."""
    out = []
    for line in decoded.read_text().splitlines():
        if "threshold" not in line:
            continue
        match = _ETHTOOL_LINE.match(line)
        assert match is not None, line
        words = match["name"].split()
        base = " ".join(words[:3]) if words[0] == "Laser" else " ".join(words[:2])
        limit = "_".join(match["name"].removeprefix(base).split()[:2])  # "high alarm" -> high_alarm
        out.append((_NAMES[base], limit, match["value"], match["unit"]))
    return out


def _assert_thresholds_print_as_published(reading: ModuleReading, decoded: Path, count: int) -> None:
    """Every published threshold line equals ours rounded as ethtool prints it."""
    limits: dict[str, Thresholds | None] = {
        name: mon.thresholds for name, lane, mon in reading.monitors() if lane in (None, 1)
    }
    published = _published_thresholds(decoded)
    assert len(published) == count
    for name, limit, printed, unit in published:
        found = limits[name]
        assert found is not None, name
        value = getattr(found, limit) * _SCALE[unit]
        assert f"{value:.{_DIGITS[unit]}f}" == printed, (name, limit)


def test_mellanox_thresholds_equal_ethtool_decode() -> None:
    data = parse_ethtool_hex((MLX / "ethtool-m-hex.txt").read_text())
    assert len(data) == 640
    reading = _reading(from_linear(data, [0, 1, 2, 3]))
    _assert_thresholds_print_as_published(reading, MLX / "ethtool-m-decoded.txt", 14)
    assert reading.identity.vendor == "Mellanox" and reading.identity.oui == "00:02:c9"
    assert reading.thresholds_published


def _fboss(name: str) -> ModuleMemory:
    module = next(m for m in FBOSS["modules"] if m["name"] == name)
    upper = {(int(page, 16), 0): bytes.fromhex(data) for page, data in module["upper"].items()}
    return ModuleMemory(lower=bytes.fromhex(module["lower"]), upper=upper)


@pytest.mark.parametrize(
    ("name", "type_", "part_number"),
    [("qsfp-dd-400g-xdr4", "QSFP-DD", "QDD-400G-XDR4"), ("osfp-2x400g-xdr4", "OSFP", "FB-P800G-2XDR4-1")],
)
def test_arista_cmis_identity_equals_fboss_decode(name: str, type_: str, part_number: str) -> None:
    """FBOSS's CmisTest reads these part numbers from these bytes, as a QSFP-DD and an OSFP."""
    memory = _fboss(name)
    assert cmis.pages_to_read(memory.lower) == [(0, 0), (1, 0), (2, 0), (0x10, 0), (0x11, 0)]
    ident = _reading(memory).identity
    assert (ident.type, ident.memory_map, ident.vendor, ident.part_number) == (
        type_,
        "cmis",
        "Arista Networks",
        part_number,
    )


def test_arista_osfp_identity_equals_fboss_description() -> None:
    # FakeTransceiverImpl.cpp: "Arista Networks FB-P800G-2XDR4-1, serial XKT242913953"
    ident = _reading(_fboss("osfp-2x400g-xdr4")).identity
    assert (ident.vendor, ident.part_number, ident.serial_number) == (
        "Arista Networks",
        "FB-P800G-2XDR4-1",
        "XKT242913953",
    )


def test_arista_qsfp_dd_thresholds_equal_ethtool_decode_of_the_same_part() -> None:
    """Page 02h of a real module against ethtool's print of another unit of the same part and revision.

    Thresholds are a per-part table, so all 20 agree; this checks page 02h offsets and units on real
    bytes, not one module's bytes against their own decode (see the two SOURCE.md files).
    """
    reading = _reading(_fboss("qsfp-dd-400g-xdr4"))
    published = (MODULES / "netdev-arista-qdd-400g-xdr4" / "ethtool-m-decoded.txt").read_text()
    ident = reading.identity
    for label, ours in (("Vendor PN", ident.part_number), ("Vendor rev", ident.revision), ("Vendor OUI", ident.oui)):
        assert re.search(rf"^{label}\s+: {re.escape(ours)}$", published, re.MULTILINE), label
    _assert_thresholds_print_as_published(
        reading, MODULES / "netdev-arista-qdd-400g-xdr4" / "ethtool-m-decoded.txt", 20
    )
    # ethtool applies no bias multiplier here because the module advertises x1 (page 01h byte 160 bits 4-3)
    assert reading.lanes[0].tx_bias_amperes is not None
    assert reading.lanes[0].tx_bias_amperes.thresholds == Thresholds(0.130, 0.010, 0.125, 0.015)


def test_arista_2x400g_osfp_has_eight_live_media_lanes() -> None:
    """Its application 1 (400GBASE-DR4) is 4 media lanes per instance, startable on lane 1 or 5.

    Lane counts are per instance (CMIS lower page byte 88 with page 01h byte 176): reading only the
    first application's count would drop lanes 5-8, which this module reports live.
    """
    memory = _fboss("osfp-2x400g-xdr4")
    page01 = memory.page(1)
    assert page01 is not None and page01[176 - 128] == 0x11 and memory.lower[88] & 0x0F == 4
    assert cmis.media_lanes(memory.lower, page01) == 8
    reading = _reading(memory)
    assert [lane.number for lane in reading.lanes] == list(range(1, 9))
    for lane in reading.lanes:
        tx, rx = lane.tx_power_watts, lane.rx_power_watts
        assert tx is not None and rx is not None
        assert tx.value > 1e-3 and rx.value > 1e-3  # over 1 mW both ways on every lane: all eight are live
        assert tx.level is Level.NORMAL and rx.level is Level.NORMAL
    # the 400G QSFP-DD of the same family advertises its DR4 application on lane 1 only: 4 lanes
    qsfp_dd = _fboss("qsfp-dd-400g-xdr4")
    assert cmis.media_lanes(qsfp_dd.lower, qsfp_dd.page(1)) == 4 and len(_reading(qsfp_dd).lanes) == 4


def _osfp_with_port_2(state: int, watts: bool = False) -> ModuleMemory:
    """The real 2x400G OSFP dump with only these bytes edited, as when the host leaves its second
    port unused: page 11h data path state of host lanes 5-8 set to `state` (bytes 130-131, one
    nibble each) and, unless `watts`, lanes 5-8's Tx power, Tx bias and Rx power set to 0, the
    reading of a dark lane. Nothing else of the dump changes."""
    memory = _fboss("osfp-2x400g-xdr4")
    page11 = bytearray(memory.upper[(0x11, 0)])
    assert page11[0:4] == bytes([0x44] * 4)  # the real dump: every host lane's data path activated
    page11[130 - 128 : 132 - 128] = bytes([state << 4 | state] * 2)
    if not watts:
        for base in (154, 170, 186):  # Tx power, Tx bias, Rx power of lanes 5-8
            page11[base + 8 - 128 : base + 16 - 128] = bytes(8)
    return ModuleMemory(lower=memory.lower, upper={**memory.upper, (0x11, 0): bytes(page11)})


ND = ("mlx5_0", "1", "eth2")


def _judged_lanes(reading: ModuleReading) -> dict[str, set[int]]:
    """monitor -> the lanes `rnic_module_monitor_level` has a series for (what the alerts can see)."""
    out: dict[str, set[int]] = {}
    for spec, labels, _ in module_samples(ND, reading):
        if spec is MODULE_MONITOR_LEVEL and labels[-1]:
            out.setdefault(labels[-2], set()).add(int(labels[-1]))
    return out


def test_arista_osfp_both_ports_lit_every_lane_is_judged_normal() -> None:
    reading = _reading(_fboss("osfp-2x400g-xdr4"))
    assert [(lane.data_path_active, lane.tx_disabled) for lane in reading.lanes] == [(True, False)] * 8
    assert {mon.level for _, lane, mon in reading.monitors() if lane is not None} == {Level.NORMAL}
    assert _judged_lanes(reading) == {m: set(range(1, 9)) for m in ("rx_power", "tx_power", "tx_bias")}
    assert optic_problems({"eth2": ND}, {"eth2": NetdevWire(module=reading)}) == []
    # the QSFP-DD: 8 host lanes (400GAUI-8) onto 4 media lanes, all activated
    qsfp_dd = _reading(_fboss("qsfp-dd-400g-xdr4"))
    assert [lane.data_path_active for lane in qsfp_dd.lanes] == [True] * 4
    assert {mon.level for _, lane, mon in qsfp_dd.monitors() if lane is not None} == {Level.NORMAL}


def test_arista_osfp_with_its_second_port_deactivated_raises_nothing() -> None:
    """Lanes 5-8 dark on purpose (data path deactivated, 0 W): reported, never judged."""
    reading = _reading(_osfp_with_port_2(state=0x1))
    dark = reading.lanes[4:]
    assert [lane.data_path_active for lane in reading.lanes] == [True] * 4 + [False] * 4
    for lane in dark:
        for mon in (lane.rx_power_watts, lane.tx_power_watts, lane.tx_bias_amperes):
            assert mon is not None and mon.value == 0.0 and mon.level is Level.NOT_IN_USE
            assert mon.thresholds is not None and mon.thresholds.judge(mon.value) is Level.ALARM_LOW
    assert reading.worst is Level.NORMAL  # lanes 1-4 and the module values, all normal
    samples = {(spec.name, labels): value for spec, labels, value in module_samples(ND, reading)}
    assert all(samples[(MODULE_RX_POWER.name, (*ND, str(n)))] == 0.0 for n in range(5, 9))  # values stay
    assert not any(v < 0 for (name, _), v in samples.items() if name == MODULE_MONITOR_LEVEL.name)
    assert _judged_lanes(reading) == {m: {1, 2, 3, 4} for m in ("rx_power", "tx_power", "tx_bias")}
    active = {labels[-1]: v for (name, labels), v in samples.items() if name == MODULE_LANE_ACTIVE.name}
    assert active == {str(n): float(n <= 4) for n in range(1, 9)}
    assert optic_problems({"eth2": ND}, {"eth2": NetdevWire(module=reading)}) == []


def test_the_same_dark_lanes_with_their_data_path_activated_are_alarms() -> None:
    """What the data path state prevents: 0 W on an activated lane is below the module's low alarm."""
    reading = _reading(_osfp_with_port_2(state=0x4))
    assert {lane.rx_power_watts.level for lane in reading.lanes[4:] if lane.rx_power_watts} == {Level.ALARM_LOW}
    problems = optic_problems({"eth2": ND}, {"eth2": NetdevWire(module=reading)})
    assert {(p.code, p.severity) for p in problems} >= {("optic_rx_power_alarm_low", "warning")}
    assert len([p for p in problems if p.code == "optic_rx_power_alarm_low"]) == 4


@pytest.mark.parametrize(
    ("state", "judged"),
    [(0x2, False), (0x3, False), (0x5, False), (0x6, False), (0x7, False), (0x0, True), (0x8, True), (0xF, True)],
)
def test_lanes_between_states_are_not_judged_and_reserved_codes_are(state: int, judged: bool) -> None:
    """DPInit, DPDeinit, DPTxTurnOn/Off, DPInitialized: on the way, values meaningless. A reserved
    code says nothing: judged as before the state was read (a real low lane must not hide)."""
    reading = _reading(_osfp_with_port_2(state=state))
    assert {lane.data_path_active for lane in reading.lanes[4:]} == {None if judged else False}
    levels = {lane.rx_power_watts.level for lane in reading.lanes[4:] if lane.rx_power_watts}
    assert levels == ({Level.ALARM_LOW} if judged else {Level.NOT_IN_USE})


def test_a_disabled_transmitter_leaves_tx_unjudged_and_rx_judged() -> None:
    memory = _osfp_with_port_2(state=0x4, watts=True)  # every lane lit, as dumped
    page10, page11 = bytearray(memory.upper[(0x10, 0)]), bytearray(memory.upper[(0x11, 0)])
    page10[130 - 128] = 0x04  # Tx disable of media lane 3
    page11[154 + 4 - 128 : 154 + 6 - 128] = bytes(2)  # its Tx power 0 W
    page11[170 + 4 - 128 : 170 + 6 - 128] = bytes(2)  # its bias 0 A
    reading = _reading(ModuleMemory(memory.lower, {**memory.upper, (0x10, 0): bytes(page10), (0x11, 0): bytes(page11)}))
    lane3 = reading.lanes[2]
    assert lane3.tx_disabled is True and lane3.data_path_active is True
    assert lane3.tx_power_watts is not None and lane3.tx_power_watts.level is Level.NOT_IN_USE
    assert lane3.tx_bias_amperes is not None and lane3.tx_bias_amperes.level is Level.NOT_IN_USE
    assert lane3.rx_power_watts is not None and lane3.rx_power_watts.level is Level.NORMAL
    assert [lane.tx_disabled for lane in reading.lanes] == [False, False, True] + [False] * 5


def test_qsfp_dd_media_lane_goes_dark_only_when_both_its_host_lanes_do() -> None:
    """The real QSFP-DD: 400GAUI-8 (8 host lanes) onto 400GBASE-DR4 (4 media lanes), so media lane
    4 is fed by host lanes 7 and 8. One of them activated keeps it judged."""
    memory = _fboss("qsfp-dd-400g-xdr4")
    assert (cmis.host_lanes(memory.lower), cmis.media_lanes(memory.lower, memory.page(1))) == (8, 4)

    def lane4(byte131: int) -> bool | None:
        page11 = bytearray(memory.upper[(0x11, 0)])
        page11[131 - 128] = byte131  # host lanes 7 (low nibble) and 8 (high nibble)
        reading = _reading(ModuleMemory(memory.lower, {**memory.upper, (0x11, 0): bytes(page11)}))
        assert [lane.data_path_active for lane in reading.lanes[:3]] == [True] * 3
        return reading.lanes[3].data_path_active

    assert lane4(0x11) is False
    assert lane4(0x14) is True and lane4(0x41) is True  # one host lane still activated
    assert lane4(0x01) is None  # host lane 8 reads reserved 0: not clearly deactivated


def test_host_to_media_lane_mapping() -> None:
    assert [cmis.feeding_host_lanes(m, 8, 8) for m in range(8)] == [range(m, m + 1) for m in range(8)]
    assert [cmis.feeding_host_lanes(m, 4, 8) for m in range(4)] == [range(2 * m, 2 * m + 2) for m in range(4)]
    assert [cmis.feeding_host_lanes(m, 8, 4) for m in range(8)] == [range(m // 2, m // 2 + 1) for m in range(8)]
    assert [cmis.feeding_host_lanes(m, 4, 4) for m in range(4)] == [range(m, m + 1) for m in range(4)]
    assert [cmis.feeding_host_lanes(m, 3, 8) for m in range(3)] == [range(0, 3), range(2, 6), range(5, 8)]


def test_mellanox_dark_lanes_are_judged_against_the_modules_own_limits() -> None:
    reading = _reading(from_linear(parse_ethtool_hex((MLX / "ethtool-m-hex.txt").read_text()), [0, 1, 2, 3]))
    temperature = reading.temperature_celsius
    assert temperature is not None and temperature.level is Level.NORMAL  # 39.5 C within 0..70
    assert len(reading.lanes) == 4
    # every lane reads 0 W and 0 A in this dump: below the module's own low alarm
    assert {lane.rx_power_watts.level for lane in reading.lanes if lane.rx_power_watts} == {Level.ALARM_LOW}
    assert reading.worst is Level.ALARM_LOW


def test_cmis_lane_monitors_equal_fboss_decode_of_its_synthetic_vector() -> None:
    """FBOSS's CMIS decoder on its made-up 200G-FR4 pages: our page 11h, temperature and voltage agree."""
    assert FBOSS_FR4["synthetic"] is True  # not a real module: see its SOURCE.md
    want = FBOSS_FR4["fboss_expects"]
    upper = {(int(page, 16), 0): bytes.fromhex(data) for page, data in FBOSS_FR4["upper"].items()}
    reading = _reading(ModuleMemory(lower=bytes.fromhex(FBOSS_FR4["lower"]), upper=upper))
    assert reading.identity.vendor == want["vendor"]
    assert reading.temperature_celsius is not None and reading.supply_voltage_volts is not None
    assert reading.temperature_celsius.value == want["temperature_celsius"]
    assert reading.supply_voltage_volts.value == pytest.approx(want["supply_voltage_volts"], rel=1e-12)
    assert len(reading.lanes) == want["media_lanes"]
    for lane in reading.lanes:
        i = lane.number - 1
        assert lane.tx_bias_amperes is not None and lane.tx_power_watts is not None and lane.rx_power_watts
        assert lane.tx_bias_amperes.value * 1e3 == pytest.approx(want["tx_bias_milliamperes"][i], rel=1e-12)
        assert lane.tx_power_watts.value * 1e3 == pytest.approx(want["tx_power_milliwatts"][i], rel=1e-12)
        assert lane.rx_power_watts.value * 1e3 == pytest.approx(want["rx_power_milliwatts"][i], rel=1e-12)


def test_thresholds_judgement_boundaries() -> None:
    t = Thresholds(high_alarm=4.0, low_alarm=1.0, high_warning=3.0, low_warning=2.0)
    assert [t.judge(v) for v in (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5)] == [
        Level.ALARM_LOW,
        Level.WARNING_LOW,
        Level.WARNING_LOW,
        Level.NORMAL,
        Level.NORMAL,
        Level.NORMAL,
        Level.WARNING_HIGH,
        Level.WARNING_HIGH,
        Level.ALARM_HIGH,
    ]
    assert t.judge(math.nan) is Level.UNKNOWN
    assert Thresholds(0.0, 0.0, 0.0, 0.0).judge(1.0) is Level.UNKNOWN  # a module that publishes none


def test_unsupported_identifiers_are_not_errors() -> None:
    for identifier in (0x00, 0x03, 0x0C, 0x7F):
        lower = bytes([identifier]) + bytes(127)
        assert pages_to_read(lower) == []
        result = decode(ModuleMemory(lower=lower))
        assert isinstance(result, UnsupportedModule) and result.identifier == identifier


@pytest.mark.parametrize("size", [0, 1, 127])
def test_short_lower_page_is_a_decode_error(size: int) -> None:
    with pytest.raises(ModuleDecodeError):
        decode(ModuleMemory(lower=bytes([0x11]) + bytes(max(size - 1, 0))))


def test_missing_identity_page_is_a_decode_error() -> None:
    for identifier in (0x11, 0x18):
        with pytest.raises(ModuleDecodeError, match="00h"):
            decode(ModuleMemory(lower=bytes([identifier]) + bytes(127)))


def test_sff8636_flat_memory_reads_no_threshold_page() -> None:
    paged = bytes([0x11, 0, 0x00]) + bytes(125)
    flat = bytes([0x11, 0, 0x04]) + bytes(125)
    assert sff8636.pages_to_read(paged) == [(0, 0), (3, 0)]
    assert sff8636.pages_to_read(flat) == [(0, 0)]


def _put(page: bytearray, offset: int, value: int) -> None:
    page[offset : offset + 2] = value.to_bytes(2, "big", signed=value < 0)


def _cmis_memory(flat: bool = False, bias_multiplier_bits: int = 0x08) -> ModuleMemory:
    """A constructed QSFP-DD (no real CMIS dump is vendored): values at CMIS 5 offsets."""
    lower = bytearray(128)
    lower[0] = 0x18
    lower[2] = 0x80 if flat else 0x00
    _put(lower, 14, 0x4680)  # 70.5 C
    _put(lower, 16, 32186)  # 3.2186 V
    lower[88] = 0x44  # first application: 4 host lanes, 4 media lanes
    page00 = bytearray(b" " * 128)
    page00[1:17] = b"Arista Networks "
    page00[17:20] = bytes([0x00, 0x1C, 0x73])
    page00[20:36] = b"QDD-400G-XDR4   "
    page00[36:38] = b"41"
    page00[38:54] = b"XKT242211481    "
    page00[54:62] = b"240531  "
    page01 = bytearray(128)
    page01[151 - 128] = 0x10  # average Rx power
    page01[160 - 128] = 0x07 | bias_multiplier_bits
    page02 = bytearray(128)
    for off, values in (
        (128, (75 * 256, -5 * 256, 70 * 256, 0)),
        (136, (36300, 30500, 34650, 31350)),
        (176, (35481, 4074, 28184, 5129)),
        (184, (32500, 2500, 31250, 3750)),  # x2 multiplier: 130, 10, 125, 15 mA
        (192, (35481, 1000, 28184, 2000)),
    ):
        for i, v in enumerate(values):
            _put(page02, off - 128 + 2 * i, v)
    page11 = bytearray(128)
    for lane, (tx, bias, rx) in enumerate(((15975, 20951, 22489), (16486, 20469, 18629))):
        _put(page11, 154 - 128 + 2 * lane, tx)
        _put(page11, 170 - 128 + 2 * lane, bias)
        _put(page11, 186 - 128 + 2 * lane, rx)
    upper = {(0, 0): bytes(page00), (1, 0): bytes(page01), (2, 0): bytes(page02), (0x11, 0): bytes(page11)}
    return ModuleMemory(lower=bytes(lower), upper=upper)


def test_cmis_offsets_units_and_bias_multiplier() -> None:
    reading = _reading(_cmis_memory())
    ident = reading.identity
    assert (ident.vendor, ident.part_number, ident.serial_number, ident.revision, ident.oui, ident.date_code) == (
        "Arista Networks",
        "QDD-400G-XDR4",
        "XKT242211481",
        "41",
        "00:1c:73",
        "240531",
    )
    assert ident.type == "QSFP-DD" and ident.memory_map == "cmis"
    temperature, voltage = reading.temperature_celsius, reading.supply_voltage_volts
    assert temperature is not None and temperature.value == 70.5 and temperature.level is Level.WARNING_HIGH
    assert voltage is not None and voltage.value == pytest.approx(3.2186)
    assert len(reading.lanes) == 4 and reading.rx_power_kind == "average"
    first = reading.lanes[0]
    assert first.tx_bias_amperes is not None and first.tx_bias_amperes.value == pytest.approx(83.804e-3)
    assert first.tx_bias_amperes.thresholds == Thresholds(130e-3, 10e-3, 125e-3, 15e-3)
    assert first.tx_power_watts is not None and first.tx_power_watts.value == pytest.approx(1.5975e-3)
    assert first.rx_power_watts is not None and first.rx_power_watts.value == pytest.approx(2.2489e-3)
    assert round(watts_to_dbm(first.rx_power_watts.value), 2) == 3.52
    assert reading.lanes[3].rx_power_watts is not None and reading.lanes[3].rx_power_watts.level is Level.ALARM_LOW
    # page 11h's data path state reads 0 (reserved) and page 10h was not read: unknown, judged as before
    assert {(lane.data_path_active, lane.tx_disabled) for lane in reading.lanes} == {(None, None)}


def test_cmis_flat_memory_has_identity_and_module_monitors_only() -> None:
    memory = _cmis_memory(flat=True)
    assert cmis.pages_to_read(memory.lower) == [(0, 0)]
    reading = _reading(memory)
    assert reading.lanes == () and not reading.thresholds_published
    assert reading.temperature_celsius is not None and reading.temperature_celsius.level is Level.UNKNOWN


def test_cmis_paged_module_reads_five_pages() -> None:
    # 10h (Tx disable) as ethtool's own CMIS decoder reads it for every paged module
    assert cmis.pages_to_read(_cmis_memory().lower) == [(0, 0), (1, 0), (2, 0), (0x10, 0), (0x11, 0)]


def test_non_ascii_identity_bytes_do_not_crash() -> None:
    memory = _cmis_memory()
    page00 = bytearray(memory.upper[(0, 0)])
    page00[1:17] = bytes(range(0xF0, 0x100))
    reading = _reading(ModuleMemory(lower=memory.lower, upper={**memory.upper, (0, 0): bytes(page00)}))
    assert reading.identity.vendor == "?" * 16


def test_ascii_fields_drop_nul_and_space_padding_and_mark_garbage() -> None:
    """Real modules pad with NULs where the specs say spaces (a blank revision, a short date code):
    padding is empty, not '??'; a stray byte inside the text is still shown as '?'."""
    page = b"A2\x00\x00" + b"\x00\x00\x00\x00" + b"MT\x01X    " + b"180703\x00\x00"
    assert ascii_field(page, 0, 4) == "A2"
    assert ascii_field(page, 4, 4) == ""
    assert ascii_field(page, 8, 8) == "MT?X"
    assert ascii_field(page, 16, 8) == "180703"
