"""The `--config FILE` (TOML or YAML): parsed strictly, every problem named with file, key and reason.

Precedence, as documented in the README: a flag given on the command line or through its
environment variable beats the file; the file beats the built-in default. NCCL settings: the NCCL_*
environment beats the file's `[nccl]`, which beats NCCL's own config files (`config/nccl_conf.py`).

    poll_interval_seconds = 5
    [collector.infiniband]
    device_include = "^mlx5_"
    device_exclude = "^mlx5_bond"
    [collector.hw_counters]       # driver counters (hw_counters/); names anchored: ^(?:REGEX)$
    enabled = true
    include = "out_of_sequence|local_ack_timeout_err|np_.*|rp_.*"
    exclude = "rx_.*_requests"
    [nccl]
    ib_gid_index = 3              # what your jobs set NCCL_IB_GID_INDEX to (-1 = auto)
    ib_addr_family = "AF_INET"
    ib_addr_range = "10.0.0.0/8"
    ib_roce_version_num = 2
    [collector.consumers]
    enabled = true                # who holds each RNIC open (off by default)
    interval_seconds = 30
    [collector.wire]              # the wire below RoCE netdevs (--collector.wire): read intervals
    module_interval_seconds = 60  # optics: a firmware register access per page; 60 s or slower
    fec_interval_seconds = 60
    pause_interval_seconds = 60   # 802.3x statistics; pause and PFC strings: gstats_interval_seconds
    link_state_interval_seconds = 60  # while down: why (a port event asks at once)
    link_state_up_interval_seconds = 600  # while up: only a flap too short for the carrier shows
    gstats_interval_seconds = 60
    [inventory]
    expected_devices = 8          # check and alerts: fewer present is a problem
    [flapping]
    transitions = 4               # up/down transitions within window_seconds make a port flapping
    window_seconds = 300
    clear_after_seconds = 900     # quiet time before it counts as stable again
    [addresses]
    forget_after_seconds = 86400  # an expected address missing this long stops being expected
    [link_health]                 # error-counter thresholds (detect/link_health.py says their sources)
    symbol_error_ber = 1e-12      # IBTA lane BER limit; also errors_per_hour = 120 (NVSentinel)
    retransmission_ratio = 1e-4   # RoCE retransmissions and sequence errors per packet
    check_window_seconds = 3      # check: seconds between its two counter reads
    window_seconds = 60           # the daemon's degrading/recovered events: window judged
    clear_after_seconds = 900     # quiet time before a degrading port is recovered
    [[rated]]                     # expectations; all given match keys must agree; last match wins
    match = { hca_type = "MT4129" }   # keys: device, pci_address, hca_type, board_id
    port_rate_gbps = 400
    port_width = 4
    netdev_speed_gbps = 400
    pcie_speed_gts = 32
    pcie_width = 16
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from rnic_exporter.config.bounds import (
    CLEAR_AFTER,
    DEVICES,
    FORGET_AFTER,
    GBPS,
    GTS,
    LINK_HEALTH,
    POLL_INTERVAL,
    TRANSITIONS,
    WIDTH,
    WINDOW,
    Bound,
    check_number,
    show,
    within,
)
from rnic_exporter.config.nccl_conf import NcclConf, read_nccl_conf, under
from rnic_exporter.config.nccl_env import gid_index_from_env, nccl_environment, nccl_settings
from rnic_exporter.detect.settings import MATCH_KEYS, DetectionSettings, FlapSettings, RatedExpectation
from rnic_exporter.errors import ConfigError
from rnic_exporter.sources.address_risks import HostPaths
from rnic_exporter.sources.counter_filter import CounterFilter
from rnic_exporter.sources.reader import ReaderSettings

# -- consumers (--collector.consumers): who holds each RNIC -------------------------------------
DEFAULT_INTERVAL_S = 30.0
# --collector.consumers.interval and the file's collector.consumers.interval_seconds: below a
# second a scan of a big process table would run back to back.
CONSUMER_INTERVAL = Bound(1.0, 3600.0, unit=" s", duration=True)
# A scan of 10,000 processes stays well below this; beyond it the host is in trouble (a /proc
# read blocked on a process in D state) and the scan is abandoned, not waited for.
DEFAULT_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class ConsumerSettings:
    enabled: bool = False  # --collector.consumers
    interval_s: float = DEFAULT_INTERVAL_S  # --collector.consumers.interval
    timeout_s: float = DEFAULT_TIMEOUT_S


# -- the wire (--collector.wire): its read intervals (sources/wire.py WireSettings' defaults) ---------
# A module page is a firmware register access on mlx5 (rnic-linux-facts §7): never below a minute.
MODULE_INTERVAL = Bound(60.0, 86400.0, unit=" s", duration=True)
WIRE_INTERVAL = Bound(1.0, 86400.0, unit=" s", duration=True)


@dataclass(frozen=True, slots=True)
class WireIntervals:
    """`[collector.wire]`'s read intervals, in seconds; pure data (the reader loads pyroute2)."""

    module_s: float = 60.0
    fec_s: float = 60.0
    pause_s: float = 60.0
    link_state_s: float = 60.0
    link_state_up_s: float = 600.0
    gstats_s: float = 60.0


@dataclass(frozen=True, slots=True)
class FileConfig:
    """What a config file may set; None means "not set in the file"."""

    poll_interval_seconds: float | None = None
    device_include: str | None = None
    device_exclude: str | None = None
    hw_counters: bool | None = None
    hw_counters_include: str | None = None
    hw_counters_exclude: str | None = None
    nccl_env: Mapping[str, str] = field(default_factory=dict)  # NCCL_* names -> values, as NCCL reads them
    nccl_gid_index: int | None = None
    expected_devices: int | None = None
    flap_transitions: int | None = None
    flap_window_seconds: float | None = None
    flap_clear_after_seconds: float | None = None
    address_forget_after_seconds: float | None = None
    link_health: Mapping[str, float] = field(default_factory=dict)  # [link_health] key -> value
    rated: tuple[RatedExpectation, ...] = ()
    consumers_enabled: bool | None = None
    consumers_interval_seconds: float | None = None
    wire_module_interval_seconds: float | None = None
    wire_fec_interval_seconds: float | None = None
    wire_pause_interval_seconds: float | None = None
    wire_link_state_interval_seconds: float | None = None
    wire_link_state_up_interval_seconds: float | None = None
    wire_gstats_interval_seconds: float | None = None

    def wire(self, base: WireIntervals) -> WireIntervals:
        """`base` with what the file sets (no flag sets these)."""
        given = {
            "module_s": self.wire_module_interval_seconds,
            "fec_s": self.wire_fec_interval_seconds,
            "pause_s": self.wire_pause_interval_seconds,
            "link_state_s": self.wire_link_state_interval_seconds,
            "link_state_up_s": self.wire_link_state_up_interval_seconds,
            "gstats_s": self.wire_gstats_interval_seconds,
        }
        return replace(base, **{k: v for k, v in given.items() if v is not None})

    def detection(
        self, base: DetectionSettings, keep_gid_index: bool = False, path: Path | None = None
    ) -> DetectionSettings:
        """`base` (built-in defaults, flags) overlaid with what this file (`path`) sets. `keep_gid_index`:
        base's NCCL index came from --nccl-gid-index or NCCL_IB_GID_INDEX, which beat the file."""
        from_file = not keep_gid_index and self.nccl_gid_index is not None
        flap = FlapSettings(
            transitions=self.flap_transitions or base.flap.transitions,
            window_s=self.flap_window_seconds or base.flap.window_s,
            clear_after_s=self.flap_clear_after_seconds or base.flap.clear_after_s,
        )
        return replace(
            base,
            rated=self.rated or base.rated,
            flap=flap,
            expected_devices=self.expected_devices if self.expected_devices is not None else base.expected_devices,
            nccl_gid_index=self.nccl_gid_index if from_file else base.nccl_gid_index,
            nccl_gid_index_source=f"{path or 'the config file'} [nccl] ib_gid_index"
            if from_file
            else base.nccl_gid_index_source,
            address_forget_after_s=self.address_forget_after_seconds or base.address_forget_after_s,
            link_health=base.link_health.with_overrides(self.link_health),
        )


def _regex(path: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{path}: expected a regular expression string, got {show(value)}")
    try:
        re.compile(value)
    except (re.error, RecursionError, OverflowError) as exc:
        raise ValueError(f"{path}: {show(value)} is not a valid regular expression ({exc})") from None
    return value


# A [[rated]] table's values (RatedExpectation fields), in the order the error message lists them.
_RATED_VALUES: Mapping[str, Callable[[str, Any], Any]] = {
    "port_rate_gbps": within(GBPS),
    "port_width": within(WIDTH),
    "netdev_speed_gbps": within(GBPS),
    "pcie_speed_gts": within(GTS),
    "pcie_width": within(WIDTH),
}


def _rated(path: str, value: Any) -> tuple[RatedExpectation, ...]:
    if not isinstance(value, list):
        raise ValueError(f"{path}: expected a list of tables ([[rated]] in TOML, a list in YAML), got {show(value)}")
    out = []
    problems = []
    for i, item in enumerate(value):
        where = f"{path}[{i}]"
        if not isinstance(item, Mapping):
            problems.append(f"{where}: expected a table, got {show(item)}")
            continue
        match = item.get("match")
        if not isinstance(match, Mapping) or not match:
            problems.append(f"{where}.match: expected a table of {', '.join(MATCH_KEYS)}")
            continue
        bad = [k for k in match if k not in MATCH_KEYS or not isinstance(match[k], str)]
        if bad:
            problems.append(
                f"{where}.match: unknown key or non-string value {show(bad[0])} (keys: {', '.join(MATCH_KEYS)})"
            )
            continue
        values: dict[str, Any] = {}
        for key, raw in item.items():
            if key == "match":
                continue
            validate = _RATED_VALUES.get(key) if isinstance(key, str) else None
            if validate is None:
                problems.append(f"{where}.{show(key)}: unknown key ({', '.join(_RATED_VALUES)}, match)")
                continue
            try:
                values[key] = validate(f"{where}.{key}", raw)
            except ValueError as exc:
                problems.append(str(exc))
        if not values:
            problems.append(f"{where}: sets no rated value")
            continue
        out.append(RatedExpectation(match=tuple(sorted((str(k), str(v)) for k, v in match.items())), **values))
    if problems:
        raise ValueError("; ".join(problems))
    return tuple(out)


def _bool(path: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{path}: expected true or false, got {show(value)}")
    return value


def _str(path: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{path}: expected a string, got {show(value)}")
    return value


def _nccl_text(path: str, value: Any) -> str:
    """An `[nccl]` value: what jobs put in the NCCL_* variable, read later the way NCCL reads it
    (model/nccl.py), so any integer or string NCCL runs with is accepted."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{path}: expected an integer or a string, got {show(value)}")
    return str(value)


def _nccl_gid_index(path: str, value: Any) -> int:
    from rnic_exporter.config.nccl_env import nccl_param

    return nccl_param({"NCCL_IB_GID_INDEX": _nccl_text(path, value)}, "NCCL_IB_GID_INDEX")[0]


# key path -> (validator, FileConfig field or NCCL env name)
_SCHEMA: Mapping[str, tuple[Callable[[str, Any], Any], str]] = {
    "poll_interval_seconds": (within(POLL_INTERVAL), "poll_interval_seconds"),
    "collector.infiniband.device_include": (_regex, "device_include"),
    "collector.infiniband.device_exclude": (_regex, "device_exclude"),
    "collector.hw_counters.enabled": (_bool, "hw_counters"),
    "collector.hw_counters.include": (_regex, "hw_counters_include"),
    "collector.hw_counters.exclude": (_regex, "hw_counters_exclude"),
    "nccl.ib_gid_index": (_nccl_gid_index, "nccl_gid_index"),
    "nccl.ib_addr_family": (_str, "env:NCCL_IB_ADDR_FAMILY"),
    "nccl.ib_addr_range": (_str, "env:NCCL_IB_ADDR_RANGE"),
    "nccl.ib_roce_version_num": (_nccl_text, "env:NCCL_IB_ROCE_VERSION_NUM"),
    "nccl.ib_routable_flid_gid_index": (_nccl_text, "env:NCCL_IB_ROUTABLE_FLID_GID_INDEX"),
    "inventory.expected_devices": (within(DEVICES), "expected_devices"),
    "flapping.transitions": (within(TRANSITIONS), "flap_transitions"),
    "flapping.window_seconds": (within(WINDOW), "flap_window_seconds"),
    "flapping.clear_after_seconds": (within(CLEAR_AFTER), "flap_clear_after_seconds"),
    "addresses.forget_after_seconds": (within(FORGET_AFTER), "address_forget_after_seconds"),
    "rated": (_rated, "rated"),
    "collector.consumers.enabled": (_bool, "consumers_enabled"),
    "collector.consumers.interval_seconds": (within(CONSUMER_INTERVAL), "consumers_interval_seconds"),
    **{f"link_health.{key}": (within(bound), f"health:{key}") for key, bound in LINK_HEALTH.items()},
    "collector.wire.module_interval_seconds": (within(MODULE_INTERVAL), "wire_module_interval_seconds"),
    "collector.wire.fec_interval_seconds": (within(WIRE_INTERVAL), "wire_fec_interval_seconds"),
    "collector.wire.pause_interval_seconds": (within(WIRE_INTERVAL), "wire_pause_interval_seconds"),
    "collector.wire.link_state_interval_seconds": (within(WIRE_INTERVAL), "wire_link_state_interval_seconds"),
    "collector.wire.link_state_up_interval_seconds": (
        within(WIRE_INTERVAL),
        "wire_link_state_up_interval_seconds",
    ),
    "collector.wire.gstats_interval_seconds": (within(WIRE_INTERVAL), "wire_gstats_interval_seconds"),
}
_SECTIONS = {key.rsplit(".", 1)[0] for key in _SCHEMA if "." in key} | {"collector"}


def _flatten(data: Mapping[str, Any], prefix: str, out: dict[str, Any], problems: list[str]) -> None:
    for key, value in data.items():
        if not isinstance(key, str):  # YAML allows `1: x` or `null: x`
            problems.append(f"{prefix}{show(key)}: keys must be strings")
            continue
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            if path not in _SECTIONS:
                problems.append(f"{path}: unknown section")
                continue
            _flatten(value, path + ".", out, problems)
        else:
            out[path] = value


def load(path: Path) -> FileConfig:
    """Parse and validate `path`; raise ConfigError listing every problem at once."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read it: {exc.strerror}") from None
    return parse_file(path, raw)


def parse_file(path: Path, raw: bytes) -> FileConfig:
    """The FileConfig in `raw`, the bytes of `path` (TOML, or YAML by suffix); ConfigError only."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path}: not UTF-8 (byte {raw[exc.start]:#04x} at offset {exc.start})") from None
    data = parse_text(path, text)
    if not isinstance(data, Mapping):
        raise ConfigError(f"config file {path}: the top level must be a table/mapping of keys")
    flat: dict[str, Any] = {}
    problems: list[str] = []
    _flatten(data, "", flat, problems)
    values: dict[str, Any] = {}
    env: dict[str, str] = {}
    health: dict[str, float] = {}
    for key, value in flat.items():
        spec = _SCHEMA.get(key)
        if spec is None:
            close = [k for k in _SCHEMA if k.rsplit(".", 1)[-1] == key.rsplit(".", 1)[-1]]
            listed = any("(known keys: " in p for p in problems)  # the list once, not per unknown key
            hint = (
                f" (did you mean {close[0]}?)"
                if close
                else ""
                if listed
                else f" (known keys: {', '.join(sorted(_SCHEMA))})"
            )
            problems.append(f"{key}: unknown key{hint}")
            continue
        validate, target = spec
        try:
            checked = validate(key, value)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        if target.startswith("env:"):
            env[target.removeprefix("env:")] = str(checked)
        elif target.startswith("health:"):
            health[target.removeprefix("health:")] = checked
        else:
            values[target] = checked
    if problems:
        shown = problems[:_SHOWN_PROBLEMS] + (
            [f"and {len(problems) - _SHOWN_PROBLEMS} more problem(s)"] if len(problems) > _SHOWN_PROBLEMS else []
        )
        raise ConfigError(one_line(f"config file {path}: " + "; ".join(shown)))
    return FileConfig(nccl_env=env, link_health=health, **values)


_SHOWN_PROBLEMS = 8  # a message is read by a person: the first few problems, and how many more


def one_line(message: str) -> str:
    """A message as the one line the README promises (YAML's marks span several)."""
    return " ".join(message.split())


def parse_text(path: Path, text: str) -> Any:
    """The document in `text`, TOML or YAML by `path`'s suffix; every failure is one ConfigError.

    YAML is read with the strict loader the web config uses (a duplicate key is an error, not
    "the last one wins"). Both parsers recurse: a 500-deep nested array is a RecursionError, and
    TOML's int() refuses numbers of more than 4,300 digits with a ValueError; both are "not valid".
    """
    # Parsers only when a config file is given: PyYAML costs ~1.4 MB of resident memory.
    import tomllib

    import yaml

    from rnic_exporter.config.yaml import strict_loader, yaml_error

    is_yaml = path.suffix in (".yml", ".yaml")
    kind = "YAML" if is_yaml else "TOML (use .yml/.yaml for YAML)"
    try:
        if is_yaml:
            return yaml.load(text, Loader=strict_loader()) or {}  # a SafeLoader subclass
        return tomllib.loads(text)
    except RecursionError:
        raise ConfigError(f"config file {path}: not valid {kind}: nested too deeply") from None
    except (yaml.YAMLError, tomllib.TOMLDecodeError, ValueError) as exc:
        detail = yaml_error(exc, path) if isinstance(exc, yaml.YAMLError) else str(exc)
        raise ConfigError(one_line(f"config file {path}: not valid {kind}: {detail}")[:2000]) from None


# -- precedence: one resolver for serve and check ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Resolved:
    poll_interval_s: float
    reader: ReaderSettings
    detection: DetectionSettings
    consumers: ConsumerSettings = field(default_factory=ConsumerSettings)
    wire: WireIntervals = field(default_factory=WireIntervals)


def resolve(
    config_file: Path | None,
    *,
    poll_interval_s: float = 5.0,
    device_include: str | None = None,
    device_exclude: str | None = None,
    counters: CounterFilter | None = None,
    detection: DetectionSettings | None = None,
    explicit: Collection[str] = (),
    consumers: ConsumerSettings | None = None,
    nccl_conf: NcclConf | None = None,
) -> Resolved:
    """Flags and environment, the config file, built-in defaults: in that order, for serve and check.

    The keyword arguments are what the flags (or their environment variables) and the built-in
    defaults say; `explicit` names those the operator gave (`poll_interval`, `device_include`,
    `device_exclude`, `hw_counters`, `hw_counters_include`, `hw_counters_exclude`, `nccl_gid_index`,
    `expected_devices`): those beat the file, defaults lose to it. NCCL_IB_GID_INDEX in the
    environment counts as given (it is what jobs get). Below the config file's `[nccl]`, NCCL's own
    config files (`nccl_conf`, read by `config.nccl_conf.read_nccl_conf`; None: none read). Every
    number goes through `check_number`, whether it came from a flag or the file. Raises ConfigError only.
    """
    given = detection or DetectionSettings()
    try:
        check_number("--poll.interval", poll_interval_s, POLL_INTERVAL)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    loaded = load(config_file) if config_file is not None else FileConfig()

    def pick(name: str, flag: Any, file: Any) -> Any:
        return flag if name in explicit or file is None else file

    merged = loaded.detection(given, keep_gid_index="nccl_gid_index" in explicit, path=config_file)
    if "expected_devices" in explicit:
        merged = replace(merged, expected_devices=given.expected_devices)
    conf = nccl_conf or NcclConf()
    overridden = _overridden(loaded, config_file, "nccl_gid_index" in explicit)
    merged = _index_from_nccl_conf(merged, conf, overridden)
    flags = counters or CounterFilter()
    reader = reader_settings(
        pick("device_include", device_include, loaded.device_include),
        pick("device_exclude", device_exclude, loaded.device_exclude),
        loaded.nccl_env,
        CounterFilter.build(
            pick("hw_counters", flags.hw_counters, loaded.hw_counters),
            pick("hw_counters_include", _pattern(flags.hw_include), loaded.hw_counters_include),
            pick("hw_counters_exclude", _pattern(flags.hw_exclude), loaded.hw_counters_exclude),
        ),
        under(conf, overridden) if nccl_conf is not None else None,
    )
    wanted = consumers or ConsumerSettings()  # names "consumers", "consumers_interval" in `explicit`
    return Resolved(
        poll_interval_s=pick("poll_interval", poll_interval_s, loaded.poll_interval_seconds),
        reader=reader,
        detection=replace(merged, nccl=reader.nccl),  # judged as the reader picks
        consumers=replace(
            wanted,
            enabled=pick("consumers", wanted.enabled, loaded.consumers_enabled),
            interval_s=pick("consumers_interval", wanted.interval_s, loaded.consumers_interval_seconds),
        ),
        wire=loaded.wire(WireIntervals()),
    )


def _pattern(compiled: re.Pattern[str] | None) -> str | None:
    return None if compiled is None else compiled.pattern


def _overridden(loaded: FileConfig, path: Path | None, index_given: bool) -> dict[str, str]:
    """The GID variables the exporter takes from above NCCL's config files, and from where: the
    config file's `[nccl]`, and for the index --nccl-gid-index (NCCL_IB_GID_INDEX in the
    environment: the files do not set it at all, as for NCCL)."""
    section = f"{path or 'the config file'} [nccl]"
    out = dict.fromkeys(loaded.nccl_env, section)
    if loaded.nccl_gid_index is not None:
        out["NCCL_IB_GID_INDEX"] = section
    if index_given:
        out["NCCL_IB_GID_INDEX"] = "--nccl-gid-index"
    return out


def _index_from_nccl_conf(
    detection: DetectionSettings, conf: NcclConf, overridden: Mapping[str, str]
) -> DetectionSettings:
    """NCCL_IB_GID_INDEX from NCCL's config files when nothing above them sets it, read as NCCL reads
    it, with the file and line `check` names."""
    setting = conf.values.get("NCCL_IB_GID_INDEX")
    if setting is None or "NCCL_IB_GID_INDEX" in overridden:
        return detection
    index = gid_index_from_env({"NCCL_IB_GID_INDEX": setting.value})
    return replace(detection, nccl_gid_index=index, nccl_gid_index_source=setting.where if index is not None else "")


class Configurable(Protocol):
    """What `apply_file` overlays: the daemon's ServeConfig (config/serve.py, which imports this module)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def poll_interval_s(self) -> float: ...
    @property
    def reader(self) -> ReaderSettings: ...
    @property
    def detection(self) -> DetectionSettings: ...
    @property
    def config_file(self) -> Path | None: ...
    @property
    def consumers(self) -> ConsumerSettings: ...
    @property
    def host_paths(self) -> HostPaths: ...
    @property
    def wire_intervals(self) -> WireIntervals: ...


C = TypeVar("C", bound=Configurable)


def apply_file(config: C, explicit: Collection[str]) -> C:
    """`config` (flags and defaults) with the config file and NCCL's config files (read now, under
    --path.rootfs for /etc/nccl.conf) resolved onto it, by `resolve`: serve calls it at start and on
    every reload, so an edited /etc/nccl.conf counts from the next SIGHUP."""
    reader = config.reader
    resolved = resolve(
        config.config_file,
        poll_interval_s=config.poll_interval_s,
        device_include=_pattern(reader.device_include),
        device_exclude=_pattern(reader.device_exclude),
        counters=reader.counters,
        detection=config.detection,
        explicit=explicit,
        consumers=config.consumers,
        nccl_conf=read_nccl_conf(rootfs=config.host_paths.rootfs),
    )
    return replace(
        config,
        poll_interval_s=resolved.poll_interval_s,
        # flags only
        reader=replace(resolved.reader, rdma_netlink=config.reader.rdma_netlink, pma_slow_s=config.reader.pma_slow_s),
        detection=resolved.detection,
        consumers=resolved.consumers,
        wire_intervals=resolved.wire,
    )


def reader_settings(
    device_include: str | None = None,
    device_exclude: str | None = None,
    nccl_env: Mapping[str, str] | None = None,
    counters: CounterFilter | None = None,
    nccl_files: tuple[Mapping[str, str], tuple[str, ...]] | None = None,
) -> ReaderSettings:
    """From flag values; NCCL settings from `nccl_files` (NCCL's own config files: their values and
    notes, by `nccl_conf.under`), `nccl_env` (a config file's `[nccl]`) beating them, the
    environment beating both. The files' notes come first among the NCCL notes check prints."""
    conf_env, conf_notes = nccl_files or ({}, ())
    nccl = nccl_settings(nccl_environment(nccl_env, conf_env=conf_env))
    return ReaderSettings(
        device_include=_compile("--collector.infiniband.device-include", device_include),
        device_exclude=_compile("--collector.infiniband.device-exclude", device_exclude),
        nccl=replace(nccl, notes=(*conf_notes, *nccl.notes)) if conf_notes else nccl,
        counters=counters or CounterFilter(),
    )


def _compile(flag: str, pattern: str | None) -> re.Pattern[str] | None:
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"{flag} {pattern!r} is not a valid regular expression: {exc}") from None
