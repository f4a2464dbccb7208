"""Fuzz targets shared by the bounded run (tests/fuzz/test_fuzz.py) and the long one (bench/fuzz.py).

Each target is a Hypothesis strategy and a check. The invariant is the exporter's promise: every
input gives a value, or a reason the value is unavailable (the module's own error type carrying a
one-line message); nothing else escapes. A check returns normally for an allowed outcome and lets
anything else propagate: that is an "escape".
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from rnic_exporter.catalog import metrics as catalog
from rnic_exporter.config import file as config_module
from rnic_exporter.detect import state as state_module
from rnic_exporter.errors import ConfigError
from rnic_exporter.model.host import (
    CounterValue,
    GidEntry,
    LinkRate,
    Netdev,
    NumberedState,
    PcieLink,
    Port,
    ReadError,
    Snapshot,
    gid_table_hash,
    pcie_generation,
)
from rnic_exporter.sinks.samples import ExporterStats, Family, Published
from rnic_exporter.sources import gids, infiniband, netclass, pci
from rnic_exporter.sources.sysfs import MalformedValueError, interpret
from tests.support.agents import CarriedCounters
from tests.support.exposition import Renderer


@dataclass(frozen=True)
class Target:
    name: str
    strategy: st.SearchStrategy[Any]
    check: Callable[[Any], None]


# -- inputs -----------------------------------------------------------------------------------

_NASTY = [
    "",
    " ",
    "\n",
    "\x00",
    "-",
    "+1",
    "0x",
    "0x" + "f" * 40,
    "9" * 400,
    "9" * 5000,
    "1e400",
    "nan",
    "inf",
    "-inf",
    "NaN",
    "\u0663\u0664",
    "\ufffd",
    "N/A (no PMA)",
    "4: ACTIVE",
    "5: LinkUp",
    "400 Gb/sec (4X NDR)",
    "2.5 Gb/sec (1X SDR)",
    "16.0 GT/s PCIe",
    "8 GT/s",
    "Unknown",
    "63",
    "0",
    "-1",
    str(1 << 64),
    str((1 << 64) - 1),
    str(1 << 31),
    "fe80:0000:0000:0000:0e42:a1ff:fe41:2d36",
    "ens1f0np0",
    "ib\ufffd0",
    "RoCE v2",
    "IB/RoCE v1",
    "0c42:a103:0065:c7a8",
    "aa:bb:cc:dd:ee:ff",
    "Ethernet",
    "up",
    "1",
]

_DIGITS = st.from_regex(r"-?[0-9]{0,420}(\.[0-9]{0,420})?", fullmatch=True)
_TEMPLATES = st.builds(
    lambda template, fill: template.format(fill),
    st.sampled_from(
        [
            "{} Gb/sec (4X NDR)",
            "400 Gb/sec ({}X NDR)",
            "{}: ACTIVE",
            "0x{}",
            "{} GT/s PCIe",
            "{}\n",
            " {} ",
            "{}.5 Gb/sec (1X SDR)",
            "fe80:{}",
            "{}:0000:0000:0000:0000:0000:0000:0000",
        ]
    ),
    st.one_of(_DIGITS, st.text(max_size=20), st.sampled_from(_NASTY)),
)
TEXT = st.one_of(
    st.text(max_size=80),
    _DIGITS,
    _TEMPLATES,
    st.sampled_from(_NASTY),
    st.lists(st.sampled_from(_NASTY), max_size=4).map(" ".join),
)
RAW = st.one_of(
    st.binary(max_size=80),
    TEXT.map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.integers(min_value=-5, max_value=200),
)  # an errno stands in for a failed read

PARSERS: dict[str, Callable[[str], object]] = {
    "infiniband.parse_rate": infiniband.parse_rate,
    "infiniband.parse_numbered_state": infiniband.parse_numbered_state,
    "infiniband.parse_guid": infiniband.parse_guid,
    "infiniband.parse_lid": infiniband.parse_lid,
    "infiniband.parse_link_layer": infiniband.parse_link_layer,
    "infiniband.parse_string": infiniband.parse_string,
    "infiniband.parse_counter": infiniband.parse_counter,
    "netclass.parse_int": netclass.parse_int,
    "netclass.parse_bool01": netclass.parse_bool01,
    "netclass.parse_operstate": netclass.parse_operstate,
    "netclass.parse_mac": netclass.parse_mac,
    "pci.parse_link_speed": pci.parse_link_speed,
    "pci.parse_link_width": pci.parse_link_width,
    "gids.parse_gid": gids.parse_gid,
    "gids.parse_gid_type": gids.parse_gid_type,
    "gids.parse_netdev_name": gids.parse_netdev_name,
}


def _representable(value: object) -> None:
    """A parsed value must be one the sinks can carry: finite floats, ints within u64 (x4 for data)."""
    if isinstance(value, float):
        assert math.isfinite(value), value
    elif isinstance(value, int) and not isinstance(value, bool):
        assert -(1 << 63) <= value < (1 << 64), value
    elif isinstance(value, LinkRate):
        assert math.isfinite(value.bits_per_second) and value.lanes > 0
    elif isinstance(value, NumberedState):
        assert 0 <= value.number <= 255


def parser_check(parse: Callable[[str], object]) -> Callable[[Any], None]:
    def check(raw: bytes | int) -> None:
        if isinstance(raw, bytes):
            try:
                value = parse(raw.decode("utf-8", "replace"))
            except MalformedValueError as exc:
                assert str(exc)  # a reason, for the ReadError
            else:
                _representable(value)
        # The reading layer's wrapper: never raises, whatever the bytes or errno.
        value, reason = interpret(raw, parse, frozenset())
        assert value is None or reason is None
        if value is not None:
            _representable(value)

    return check


# -- model ------------------------------------------------------------------------------------

_ANY_INT = st.one_of(st.integers(min_value=-(1 << 70), max_value=1 << 70), st.sampled_from([10**400, -(10**400)]))
_ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True)
_ANY_NUMBER = st.one_of(_ANY_INT, _ANY_FLOAT)
_NAME = st.one_of(st.text(max_size=20), st.sampled_from(["ens1f0np0", "ib\udcff0", "mlx5_0", ""]))
_GID_TEXT = st.one_of(
    st.sampled_from(
        [
            "0000:0000:0000:0000:0000:ffff:0a00:0001",
            "fe80:0000:0000:0000:0e42:a1ff:fe41:2d36",
            "0000:0000:0000:0000:0000:ffff:zzzz:zzzz",
        ]
    ),
    st.text(max_size=50),
)
_GID_ENTRY = st.builds(
    GidEntry, st.integers(), _GID_TEXT, st.one_of(st.none(), _NAME, st.just("RoCE v2")), st.one_of(st.none(), _NAME)
)


def _model_input() -> st.SearchStrategy[Any]:
    netdev = st.builds(
        Netdev,
        _NAME,
        st.one_of(st.none(), _ANY_INT),
        st.one_of(st.none(), _NAME),
        st.one_of(st.none(), _ANY_INT),
        st.one_of(st.none(), _ANY_INT),
        st.one_of(st.none(), _NAME),
        st.one_of(st.none(), st.booleans()),
        st.one_of(st.none(), _ANY_INT),
        st.one_of(st.none(), _ANY_INT),
        st.one_of(st.none(), _ANY_INT),
        st.one_of(st.none(), _NAME),
    )
    rate = st.builds(LinkRate, _ANY_FLOAT, _ANY_INT, _NAME)
    state = st.builds(NumberedState, _ANY_INT, _NAME)
    link = st.builds(PcieLink, _NAME, *(st.one_of(st.none(), _ANY_NUMBER) for _ in range(6)))
    port = st.builds(
        Port,
        _NAME,
        _ANY_INT,
        st.one_of(st.none(), _NAME),
        st.one_of(st.none(), state),
        st.one_of(st.none(), state),
        st.one_of(st.none(), rate),
        st.one_of(st.none(), _ANY_INT),
        st.dictionaries(_NAME, st.builds(CounterValue, _ANY_INT, st.booleans()), max_size=2),
        st.dictionaries(_NAME, _ANY_INT, max_size=2),
        st.lists(_GID_ENTRY, max_size=3).map(tuple),
        _ANY_INT,
        st.lists(_NAME, max_size=2).map(tuple),
        st.one_of(st.none(), _ANY_INT),
    )
    error = st.builds(ReadError, _NAME, st.one_of(st.none(), _ANY_INT), _NAME, _NAME)
    return st.tuples(netdev, rate, state, link, port, error, st.one_of(st.none(), _ANY_FLOAT))


def model_check(drawn: tuple[Any, ...]) -> None:
    netdev, rate, state, link, port, error, gts = drawn
    _ = netdev.speed_bytes_per_second
    _ = (rate.per_lane_gbps, rate.bits_per_second, rate.bytes_per_second, str(state))
    _ = (link.expected_speed_gts, link.expected_width, pcie_generation(gts))
    _ = (port.is_up, port.netdev, port.gid_hash, port.gid(0), error.kind, error.where())
    for entry in port.gids:
        _ = (entry.ipv4, entry.address, entry.is_link_local, entry.roce_version, entry.version_label)
    assert 0 <= gid_table_hash(port.gids) < (1 << 53)


# -- renderer (text 0.0.4 and OpenMetrics) and OTLP encoding ------------------------------------

_LABEL = st.one_of(st.text(max_size=12), st.sampled_from(['a"b', "a\\b", "a\nb", "ib\udcff0", "\ud800", "", "é"]))
_VALUE = st.one_of(_ANY_FLOAT, _ANY_INT)
_SPECS = [spec for spec in catalog.METRICS]


def _family(spec: catalog.MetricSpec) -> st.SearchStrategy[Family]:
    sample = st.tuples(st.tuples(*([_LABEL] * len(spec.labels))), _VALUE)
    return st.lists(sample, max_size=3).map(lambda samples: Family(spec, samples))


# One strategy per metric, built once: a flatmap would build and validate a new one at every draw.
_ANY_FAMILY = st.one_of(*(_family(spec) for spec in _SPECS))
_FAMILIES = st.lists(_ANY_FAMILY, min_size=1, max_size=3)


@st.composite
def _successive(draw: st.DrawFn) -> tuple[list[Family], list[Family]]:
    """Two successive publications, as a sink sees them: the second keeps each series (label set)
    of the first with its value (the cached line) or a new one (the moved-value line), may lose a
    family (the layout changes) and may gain new families (new series)."""
    first = draw(_FAMILIES)
    second = []
    for family in first:
        if draw(st.integers(min_value=0, max_value=7)) == 0:
            continue
        samples = [(labels, value if draw(st.booleans()) else draw(_VALUE)) for labels, value in family.samples]
        second.append(Family(family.spec, samples))
    second += draw(st.lists(_ANY_FAMILY, max_size=2))
    return first, second


def renderer_check(drawn: tuple[list[Family], list[Family]]) -> None:
    renderer = Renderer()
    for families in drawn:  # twice: the second call takes the cached-line path
        text, om = renderer.render(_unique(families))
        text.decode("utf-8")  # strict: the exposition is valid UTF-8
        om.decode("utf-8")
        assert om.endswith(b"# EOF\n")


def _unique(families: list[Family]) -> list[Family]:
    """One family per metric and one sample per label set, as the sinks hand them over."""
    seen: dict[str, Family] = {}
    for family in families:
        if family.spec.name not in seen:
            labels: dict[tuple[str, ...], float] = {}
            for key, value in family.samples:
                labels.setdefault(key, value)
            seen[family.spec.name] = Family(family.spec, list(labels.items()))
    return list(seen.values())


class OtlpEncoder:
    """The SDK path the OTLP sink takes: its observer, a MeterProvider holding every instrument the
    sink registers (same kinds, units, descriptions, View and resource), the proto encoder.

    A fresh provider and observer per example: with cumulative temporality the SDK keeps every
    attribute set an instrument has ever seen and visits each at every collection, so one provider
    for a whole run made each collection cost more than the last (a long run averaged 8 examples/s
    over 19,061) and, past the cardinality limit, folded new label sets into the overflow point, so
    they never reached the encoder. Both publications of an example go through the same provider: the second collection
    takes the cumulative path over the first's points. Building one costs about a millisecond.
    """

    def __init__(self) -> None:
        from opentelemetry.exporter.otlp.proto.common._internal.metrics_encoder import encode_metrics
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        from rnic_exporter.sinks import otel

        # The SDK warns once per non-finite observation and drops it (documented); not an escape.
        logging.getLogger("opentelemetry").setLevel(logging.ERROR)
        self._otel = otel
        self._encode = encode_metrics
        self._reader_class = InMemoryMetricReader
        # Built once, as the sink does: a provider without one makes its own, in a thread per provider.
        self._resource = otel.resource(machine_id_files=())
        self._empty = Snapshot(devices=(), netdevs={}, pcie={}, errors=(), taken_at=0.0)

    def check(self, drawn: tuple[list[Family], list[Family]]) -> None:
        observer = self._otel._Observer(CarriedCounters())  # an empty host's counter passes
        reader = self._reader_class()
        provider = self._otel.meter_provider(self._resource, reader, observer)  # kept alive below
        for families in drawn:
            observer.state = Published(self._empty, (), ExporterStats(), tuple(_otlp_shaped(families)))
            # The SDK logs and swallows a callback's exception (the instrument goes missing from the
            # batch): build the observations here first, so an exception in them is an escape.
            observer.observations()
            data = reader.get_metrics_data()
            if data is not None:
                self._encode(data).SerializeToString()
        provider.shutdown()


def _is_nan(value: float) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _otlp_shaped(families: list[Family]) -> list[Family]:
    """Families as the OTLP sink receives them: counters never negative (the SDK drops those with a
    warning of its own) and each value of the kind its family has."""
    out = []
    for family in _unique(families):
        samples = [
            (labels, abs(value) if family.spec.kind == "counter" and not _is_nan(value) else value)
            for labels, value in family.samples
        ]
        out.append(Family(family.spec, samples))
    return out


# -- the state loader and both config loaders ------------------------------------------------------

_JSON_LEAF = st.one_of(st.none(), st.booleans(), _ANY_INT, _ANY_FLOAT, st.text(max_size=12))
_JSON = st.recursive(
    _JSON_LEAF,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8,
)
_GOOD_STATE = state_module.State(
    devices={
        "0000:11:00.0": state_module.KnownDevice(
            "mlx5_0", "0000:11:00.0", "0c42:a103:0065:c7a8", "MT4129", "MT_0000000838", 1.0e9, 1.7e9
        )
    },
    baselines={"mlx5_0/1": state_module.Baseline(50e9, 4)},
    addresses={"mlx5_0/1": {"10.0.0.1": state_module.KnownAddress("ens1f0np0", 1.7e9, 3)}},
).to_json()
_STATE_PATHS = [("devices", "0000:11:00.0", f) for f in _GOOD_STATE["devices"]["0000:11:00.0"]] + [
    ("baselines", "mlx5_0/1", "rate_bytes_per_second"),
    ("baselines", "mlx5_0/1", "lanes"),
    ("addresses", "mlx5_0/1", "10.0.0.1", "netdev"),
    ("addresses", "mlx5_0/1", "10.0.0.1", "last_seen"),
    ("addresses", "mlx5_0/1", "10.0.0.1", "v2_index"),
    ("addresses", "mlx5_0/1"),
    ("devices",),
    ("version",),
    ("format",),
    ("extra",),
]


def _mutated_state(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(json.dumps(_GOOD_STATE))
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


def _state_bytes() -> st.SearchStrategy[bytes]:
    mutated = st.builds(_mutated_state, st.sampled_from(_STATE_PATHS), _JSON).map(
        lambda d: json.dumps(d, allow_nan=True).encode()
    )
    nested = st.integers(min_value=1, max_value=200_000).map(lambda n: b"[" * n + b"]" * n)
    spliced = st.tuples(mutated, st.binary(min_size=1, max_size=4), st.integers(min_value=0)).map(
        lambda t: t[0][: t[2] % (len(t[0]) + 1)] + t[1] + t[0][t[2] % (len(t[0]) + 1) :]
    )
    return st.one_of(
        mutated, spliced, nested, st.binary(max_size=64), _JSON.map(lambda d: json.dumps(d, allow_nan=True).encode())
    )


def state_check(raw: bytes) -> None:
    try:
        state = state_module.decode_state(raw)
    except state_module.StateFileError as exc:
        assert exc.reason in ("corrupt", "foreign") and "\n" not in str(exc)
        return
    text = json.dumps(state.to_json(), allow_nan=False)  # what save() writes: finite, no NaN
    assert state_module.decode_state(text.encode()).to_json() == state.to_json()


_KEYS = [*config_module._SCHEMA, "collector.infiniband", "nccl", "x", "rated", "poll_interval_seconds"]


def _toml_value(value: Any, depth: int = 0) -> str:
    if isinstance(value, Deep):
        return value.text()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v, depth + 1) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v, depth + 1)}" for k, v in value.items()) + "}"
    return '""'


@dataclass(frozen=True)
class Deep:
    """An array nested `depth` levels: written as brackets, never built (the dumpers would recurse)."""

    depth: int

    def text(self) -> str:
        return "[" * self.depth + "1" + "]" * self.depth


_CONFIG_VALUE = st.one_of(_JSON.filter(lambda v: v is not None), st.integers(min_value=1, max_value=3000).map(Deep))


def _toml_doc() -> st.SearchStrategy[bytes]:
    line = st.tuples(st.sampled_from(_KEYS), _CONFIG_VALUE).map(lambda kv: f"{kv[0]} = {_toml_value(kv[1])}\n")
    doc = st.lists(line, max_size=4).map("".join)
    return st.one_of(
        doc.map(str.encode),
        st.text(max_size=60).map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.binary(max_size=40),
        st.tuples(doc, st.binary(max_size=3)).map(lambda t: t[0].encode() + t[1]),
    )


def _yaml_doc() -> st.SearchStrategy[bytes]:
    def dump(pairs: list[tuple[str, Any]]) -> bytes:
        lines = []
        for key, value in pairs:
            nested: Any = f"@@{value.depth}@@" if isinstance(value, Deep) else value
            for part in reversed(key.split(".")[1:]):
                nested = {part: nested}
            lines.append(
                json.dumps({key.split(".")[0]: nested}, allow_nan=True)[1:-1]
                .replace("NaN", ".nan")
                .replace("-Infinity", "-.inf")
                .replace("Infinity", ".inf")
            )
        text = "{" + ", ".join(lines) + "}\n"
        for _key, value in pairs:
            if isinstance(value, Deep):
                text = text.replace(f'"@@{value.depth}@@"', value.text())
        return text.encode()

    doc = st.lists(st.tuples(st.sampled_from(_KEYS), _CONFIG_VALUE), max_size=4).map(dump)
    nasty = st.sampled_from(
        [
            b"a: &a [1]\nb: *a\n",
            b"1: 2\n",
            b"? [a]\n: 1\n",
            b"x: !!python/name:os.system\n",
            b"poll_interval_seconds: 5\npoll_interval_seconds: 6\n",
            b"- 1\n- 2\n",
            b"\xff",
            b"x: " + b"[" * 600 + b"]" * 600,
        ]
    )
    return st.one_of(
        doc, nasty, st.text(max_size=60).map(lambda t: t.encode("utf-8", "surrogatepass")), st.binary(max_size=40)
    )


def config_check(suffix: str) -> Callable[[bytes], None]:
    path = Path(f"fuzz.{suffix}")

    def check(raw: bytes) -> None:
        try:
            loaded = config_module.parse_file(path, raw)
        except ConfigError as exc:
            assert "\n" not in str(exc) and len(str(exc)) < 5000
            return
        for number in (
            loaded.poll_interval_seconds,
            loaded.flap_window_seconds,
            loaded.flap_clear_after_seconds,
            loaded.address_forget_after_seconds,
        ):
            assert number is None or math.isfinite(number)

    return check


def parsers_check(raw: bytes | int) -> None:
    """Every parser on the same input: each of them sees every example."""
    for name, parse in PARSERS.items():
        try:
            parser_check(parse)(raw)
        except Exception as exc:
            raise AssertionError(f"{name}: {type(exc).__name__}: {exc}") from exc


def targets() -> list[Target]:
    out = [Target(f"parsers ({len(PARSERS)}, each on every input)", RAW, parsers_check)]
    out.append(Target("model", _model_input(), model_check))
    out.append(Target("render", _successive(), renderer_check))
    out.append(Target("otlp", _successive(), OtlpEncoder().check))
    out.append(Target("state", _state_bytes(), state_check))
    out.append(Target("config:toml", _toml_doc(), config_check("toml")))
    out.append(Target("config:yaml", _yaml_doc(), config_check("yml")))
    return out
