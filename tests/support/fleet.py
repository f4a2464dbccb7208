"""A simulated fleet in a real Prometheus: N hosts x R RNICs written as OpenMetrics, loaded with promtool.

`Fleet.write` streams every sample, series by series, of the families the fleet dashboard, the recording
rules and the alerts read, with the values the exporter exposes (names from the catalogue; `up` is what
Prometheus records per scrape). A few hosts carry each failure of incidents.md, and a PCIe AER fault of each
severity, at a known time (`faults`):

- gid_shift (incident 1): NetworkManager manages the host's netdevs; the port goes down for a minute, its
  address is gone for two, and it comes back with its RoCE v2 GID at index 5 instead of 3;
- speed (incident 2): a 400G port renegotiates to 200G, its error and retransmission counters start to grow;
- pcie (incident 2): the device's PCIe link trains at Gen4 instead of Gen5;
- gone (incident 2): the NIC falls off the bus; the inventory keeps it at present 0, its ports vanish;
- nccl (incident 3): NCCL_IB_GID_INDEX=0 is configured; every port judges it invalid;
- aer_fatal: the device's PCI function reports one fatal AER error;
- aer_nonfatal: it reports a non-fatal AER error, and another one `NONFATAL_APART_S` later;
- aer_correctable: it reports `CORRECTABLE_PER_MINUTE` correctable AER errors a minute from then on.

The wire (`--collector.wire`): every RoCE port has a module with four lanes at `RX_POWER_W` and the module's
low warning at `RX_LOW_WARNING_W`, corrected FEC blocks counting, no uncorrectable ones, and some PFC pause:
- optic_low: lane `FADING_LANE`'s Rx power falls below its module's low warning (a dirty connector);
- optic_drift: it falls to `RX_DRIFTED_W`, still above the warning but below half its median: a drift;
- optic_dark: the host takes lanes `DARK_LANES` dark on purpose (the unused port of a twin-port module):
  their Rx power goes to 0 W, their level series ends, `rnic_module_lane_active` says 0; nothing may fire;
- fec: uncorrectable FEC blocks count `UNCORRECTABLE_PER_SECOND` from then on;
- pause: the port sends pause on `STORM_PRIORITY` for `STORM_SHARE` of each second: a pause storm.

Every device exposes its three AER counters; on every twelfth host they hold a few errors (`OLD_AER`) counted
before the exporter started and constant since, as after a reboot's link training: no alert may fire on those.

`loaded` backfills it (`promtool tsdb create-blocks-from openmetrics`), evaluates the recording rules into
blocks (`promtool tsdb create-blocks-from rules`) and serves both from a real Prometheus on loopback,
everything under a temporary directory removed on exit, also on failure.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from rnic_exporter import __version__
from rnic_exporter.catalog import metrics as c
from rnic_exporter.catalog.metrics import MetricSpec
from rnic_exporter.dashboards import recording
from rnic_exporter.sources.pci import AER_SEVERITIES
from tests.support.processes import Prometheus, http_get, require_binary

REPO = Path(__file__).resolve().parents[2]
JOB = "rnic-exporter"
KINDS = (
    "nccl",
    "pcie",
    "speed",
    "gid_shift",
    "gone",
    "aer_fatal",
    "aer_nonfatal",
    "aer_correctable",
    "optic_low",
    "optic_drift",
    "optic_dark",
    "fec",
    "pause",
)
# When each kind starts, as a fraction of the time range (snapped to whole minutes).
_AT = {
    "nccl": 1 / 6,
    "pcie": 1 / 4,
    "speed": 1 / 3,
    "gid_shift": 1 / 2,
    "gone": 2 / 3,
    "aer_fatal": 7 / 20,
    "aer_nonfatal": 3 / 5,
    "aer_correctable": 1 / 5,
    "optic_low": 5 / 12,
    "optic_drift": 1 / 4,
    "optic_dark": 3 / 10,
    "fec": 1 / 2,
    "pause": 13 / 20,
}
RATE = 50e9  # 400 Gb/s in bytes per second
PCIE_GEN5, PCIE_GEN4 = 32e9, 16e9
FEW_ERRORS = ("symbol_error", "port_rcv_errors", "link_downed")
FEW_RETRANSMISSIONS = ("out_of_sequence", "local_ack_timeout_err")
ALL_RETRANSMISSIONS = tuple(recording.RETRANSMISSION_COUNTERS.split("|"))
# How fast the counters of a port with a degraded link grow, per second.
GROWING = {"symbol_error": 2.0, "port_rcv_errors": 1.0, "local_ack_timeout_err": 0.5}
PORT_DOWN_S, ADDRESS_GONE_S = 60, 120  # the gid_shift flap
INDEX_BEFORE, INDEX_AFTER, NCCL_WHILE_GONE = 3, 5, 1
# The severity label's values, as the exporter reads them from aer_dev_{correctable,nonfatal,fatal}.
AER_CORRECTABLE = AER_SEVERITIES["aer_dev_correctable"]
AER_NONFATAL = AER_SEVERITIES["aer_dev_nonfatal"]
AER_FATAL = AER_SEVERITIES["aer_dev_fatal"]
NONFATAL_APART_S = 180  # the aer_nonfatal fault's second error
CORRECTABLE_PER_MINUTE = 20  # the aer_correctable stream: above RnicPcieAerCorrectableRising's 1 a minute
# Errors counted before the exporter started, on every device of every twelfth host (and constant since).
OLD_AER = {AER_CORRECTABLE: 40, AER_NONFATAL: 2, AER_FATAL: 1}
OLD_AER_EVERY = 12
LANES = 4
RX_POWER_W, RX_LOW_WARNING_W, RX_DRIFTED_W = 0.9e-3, 0.1445e-3, 0.4e-3
FADING_LANE = 2
DARK_LANES = (3, 4)
RX_FADED_W = 0.12e-3  # optic_low: below the low warning, so the module's level is -1 (warning low)
CORRECTED_PER_SECOND, UNCORRECTABLE_PER_SECOND = 50.0, 0.2
PAUSE_SHARE, STORM_SHARE, STORM_PRIORITY = 0.01, 0.8, 3  # seconds paused a second: healthy PFC, then a storm


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    host: int
    device: int
    at: int  # unix seconds


@dataclass(frozen=True)
class Fleet:
    hosts: int
    start: int  # unix seconds, a multiple of 60
    duration: int  # seconds
    step: int  # seconds between samples (the scrape interval); divides 60
    rnics: int = 8
    per_kind: int = 3  # hosts carrying each fault
    all_counters: bool = False  # every error/retransmission counter the rules read, or a few
    faults: tuple[Fault, ...] = field(init=False)

    def __post_init__(self) -> None:
        # Faults fall on whole minutes; a step of more than a minute (the benchmark) may skip the short flap.
        assert (60 % self.step == 0 or self.step % 60 == 0) and self.start % 60 == 0, "step and start: minutes"
        assert self.hosts >= 2 * len(KINDS) * self.per_kind, "too few hosts to spread the faults"
        n = len(KINDS) * self.per_kind
        spread = [(i + 1) * self.hosts // (n + 1) for i in range(n)]  # distinct hosts, spread over the fleet
        faults = []
        for k, kind in enumerate(KINDS):
            at = self.start + int(self.duration * _AT[kind]) // 60 * 60
            for i in range(self.per_kind):
                faults.append(Fault(kind, spread[k * self.per_kind + i], k % self.rnics, at))
        object.__setattr__(self, "faults", tuple(faults))

    @property
    def end(self) -> int:
        return self.start + self.duration

    @property
    def times(self) -> range:
        return range(self.start, self.end + 1, self.step)

    def of(self, kind: str) -> list[Fault]:
        return [f for f in self.faults if f.kind == kind]

    def at(self, kind: str) -> int:
        return self.of(kind)[0].at

    def instance(self, host: int) -> str:
        return f"node{host:05d}:19879"

    def device(self, device: int) -> str:
        return f"mlx5_{device}"

    def pci(self, device: int) -> str:
        return f"0000:{0x1A + device:02x}:00.0"

    def netdev(self, device: int) -> str:
        return f"ens{device + 1}np0"

    def address(self, host: int, device: int) -> str:
        return f"10.{device}.{host // 256}.{host % 256}"

    def nccl_configured(self, host: int) -> bool:
        """Hosts whose exporter sees NCCL_IB_GID_INDEX: every tenth (set right) and the nccl faults."""
        return host % 10 == 0 or any(f.host == host for f in self.of("nccl"))

    @property
    def error_counters(self) -> tuple[str, ...]:
        return c.PMA_ERROR_COUNTER_NAMES if self.all_counters else FEW_ERRORS

    @property
    def retransmission_counters(self) -> tuple[str, ...]:
        return ALL_RETRANSMISSIONS if self.all_counters else FEW_RETRANSMISSIONS

    def write(self, out: IO[str]) -> int:
        """Stream the fleet as OpenMetrics into `out`; returns the number of samples."""
        return _Writer(self, out).run()


class _Writer:
    """One family at a time (OpenMetrics wants them contiguous), each series with all its samples in order."""

    def __init__(self, fleet: Fleet, out: IO[str]) -> None:
        self.fleet = fleet
        self.out = out
        self.times = list(fleet.times)
        self.suffixes = [f" {t}\n" for t in self.times]
        self.samples = 0
        self.by_device: dict[tuple[int, int], list[Fault]] = {}
        self.by_host: dict[int, list[Fault]] = {}
        for f in fleet.faults:
            self.by_device.setdefault((f.host, f.device), []).append(f)
            self.by_host.setdefault(f.host, []).append(f)

    def run(self) -> int:
        fl = self.fleet
        self._family("up", "gauge")
        for h in range(fl.hosts):
            self._const(f'up{{instance="{fl.instance(h)}",job="{JOB}"}}', "1")
        self._family(c.BUILD_INFO.family_name, "info")
        for h in range(fl.hosts):
            labels = f'version="{__version__}",python_version="3.11.2"'
            self._const(self._name(c.BUILD_INFO, h, labels), "1")
        self._family(c.DEVICES.name, "gauge")
        for h in range(fl.hosts):
            gone = [f.at for f in self.by_host.get(h, []) if f.kind == "gone"]
            self._steps(self._name(c.DEVICES, h, ""), [(fl.start, fl.rnics), *((at, fl.rnics - 1) for at in gone)])
        self._family(c.LAST_POLL.name, "gauge")
        for h in range(fl.hosts):
            name = self._name(c.LAST_POLL, h, "")
            self.out.write("".join(f"{name} {t - 1}{s}" for t, s in zip(self.times, self.suffixes, strict=True)))
            self.samples += len(self.times)
        self._device_families()
        self._port_families()
        self._wire_families()
        self.out.write("# EOF\n")
        return self.samples

    # --- device level ---------------------------------------------------------------------------------

    def _device_families(self) -> None:
        fl = self.fleet
        self._family(c.DEVICE_PRESENT.name, "gauge")
        for h, d in self._devices():
            labels = f'device="{fl.device(d)}",pci_address="{fl.pci(d)}"'
            self._steps(
                self._name(c.DEVICE_PRESENT, h, labels), [(fl.start, 1), *((at, 0) for at in self._at(h, d, "gone"))]
            )
        self._family(c.DEVICE_READ_STUCK.name, "gauge")
        for h, d in self._devices():
            self._steps(
                self._name(c.DEVICE_READ_STUCK, h, f'device="{fl.device(d)}"'), [(fl.start, 0)], self._gone(h, d)
            )
        for spec in (c.PCIE_LINK_SPEED, c.PCIE_LINK_WIDTH):
            self._family(spec.name, "gauge")
            for h, d in self._devices():
                for link in ("current", "max", "upstream_max"):
                    labels = f'device="{fl.device(d)}",pci_address="{fl.pci(d)}",link="{link}"'
                    steps: list[tuple[int, float | None]]
                    if spec is c.PCIE_LINK_WIDTH:
                        steps = [(fl.start, 16)]
                    else:
                        downtrained = self._at(h, d, "pcie") if link == "current" else []
                        steps = [(fl.start, PCIE_GEN5), *((at, PCIE_GEN4) for at in downtrained)]
                    self._steps(self._name(spec, h, labels), steps, self._gone(h, d))
        spec = c.PCIE_AER_ERRORS
        self._family(spec.family_name, spec.kind)
        for h, d in self._devices():
            for severity in AER_SEVERITIES.values():
                labels = self._labels(spec, fl.device(d), fl.pci(d), severity)
                self._steps(self._name(spec, h, labels), self._aer_steps(h, d, severity), self._gone(h, d))

    # --- port level -----------------------------------------------------------------------------------

    def _port_families(self) -> None:
        fl = self.fleet
        gauges: list[tuple[MetricSpec, str, Any]] = [
            (c.PORT_UP, "", lambda h, d: [(fl.start, 1), *self._flap(h, d, (0, 0), (1, PORT_DOWN_S))]),
            (c.PORT_FLAPPING, "", lambda h, d: [(fl.start, 0)]),
            (c.PORT_ACTIVE_RATE, "", self._rate_steps),
            (c.PORT_RATED_RATE, 'source="baseline"', lambda h, d: [(fl.start, RATE)]),
            (c.NETDEV_SPEED, "netdev=%N", self._rate_steps),
            (c.LINK_BELOW_RATED, 'link="port"', self._below("speed")),
            (c.LINK_BELOW_RATED, 'link="netdev"', self._below("speed")),
            (c.LINK_BELOW_RATED, 'link="pcie"', self._below("pcie")),
            (c.GID_TABLE_HASH, "", self._hash_steps),
            (
                c.NCCL_GID_INDEX,
                "",
                lambda h, d: [
                    (fl.start, INDEX_BEFORE),
                    *self._flap(h, d, (NCCL_WHILE_GONE, 0), (INDEX_AFTER, ADDRESS_GONE_S)),
                ],
            ),
            (c.NCCL_GID_USABLE, "", lambda h, d: [(fl.start, 1), *self._flap(h, d, (0, 0), (1, ADDRESS_GONE_S))]),
            (
                c.NETDEV_ADDRESS_PRESENT,
                "netdev=%N,address=%A",
                lambda h, d: [(fl.start, 1), *self._flap(h, d, (0, 0), (1, ADDRESS_GONE_S))],
            ),
            (
                c.NETDEV_ADDRESS_LOSS_RISK,
                'netdev=%N,reason="networkmanager"',
                lambda h, d: [(fl.start, int(self._nm(h)))],
            ),
            (c.NETDEV_ADDRESS_LOSS_RISK, 'netdev=%N,reason="ipv6_keep_addr_on_down_off"', lambda h, d: [(fl.start, 0)]),
        ]
        for spec in dict.fromkeys(spec for spec, _, _ in gauges):
            self._family(spec.family_name, spec.kind)
            for same, extra, steps_of in gauges:
                if same is not spec:
                    continue
                for h, d in self._devices():
                    self._steps(self._port(spec, h, d, extra), steps_of(h, d), self._gone(h, d))
        # The address's RoCE v2 index: absent while the address is gone, then at its new index.
        self._family(c.GID_V2_IPV4_INDEX.name, "gauge")
        for h, d in self._devices():
            steps: list[tuple[int, float | None]] = [(fl.start, INDEX_BEFORE)]
            steps += self._flap(h, d, (None, 0), (INDEX_AFTER, ADDRESS_GONE_S))
            self._steps(self._port(c.GID_V2_IPV4_INDEX, h, d, "address=%A"), steps, self._gone(h, d))
        self._family(c.NCCL_CONFIGURED_GID_INDEX_VALID.name, "gauge")
        for h, d in self._devices():
            if fl.nccl_configured(h):
                wrong = [f.at for f in self.by_host.get(h, []) if f.kind == "nccl"]
                steps = [(fl.start, 1), *((at, 0) for at in wrong)]
                self._steps(self._port(c.NCCL_CONFIGURED_GID_INDEX_VALID, h, d, ""), steps, self._gone(h, d))
        for spec, names in ((c.PORT_PMA, fl.error_counters), (c.PORT_HW_STAT, fl.retransmission_counters)):
            self._family(spec.family_name, "counter")
            for h, d in self._devices():
                degraded = self._at(h, d, "speed")
                for counter in names:
                    per_second = GROWING.get(counter, 0.0)
                    since = degraded[0] if degraded and per_second else None
                    self._counter(self._port(spec, h, d, f'counter="{counter}"'), 0.0, per_second, since, h, d)
        for spec, bytes_per_second in ((c.PORT_DATA_RECEIVED, 2e9), (c.PORT_DATA_TRANSMITTED, 1e9)):
            self._family(spec.family_name, "counter")
            for h, d in self._devices():
                rate = bytes_per_second * (1 + (h + d) % 4)
                self._counter(self._port(spec, h, d, ""), rate, 0.0, None, h, d)

    # --- the wire below each RoCE port -------------------------------------------------------------------

    def _wire_families(self) -> None:
        fl = self.fleet
        self._family(c.MODULE_RX_POWER.family_name, "gauge")
        for h, d in self._devices():
            for lane in range(1, LANES + 1):
                series = self._port(c.MODULE_RX_POWER, h, d, f'netdev=%N,lane="{lane}"')
                self._steps(series, self._rx_steps(h, d, lane), self._gone(h, d))
        self._family(c.MODULE_MONITOR_LEVEL.family_name, "gauge")
        for h, d in self._devices():
            for lane in range(1, LANES + 1):
                series = self._port(c.MODULE_MONITOR_LEVEL, h, d, f'netdev=%N,monitor="rx_power",lane="{lane}"')
                low = self._at(h, d, "optic_low") if lane == FADING_LANE else []
                dark = self._at(h, d, "optic_dark") if lane in DARK_LANES else []  # a dark lane is not judged
                steps = [(fl.start, 0), *((at, -1) for at in low), *((at, None) for at in dark)]
                self._steps(series, steps, self._gone(h, d))
        self._family(c.MODULE_LANE_ACTIVE.family_name, "gauge")
        for h, d in self._devices():
            for lane in range(1, LANES + 1):
                series = self._port(c.MODULE_LANE_ACTIVE, h, d, f'netdev=%N,lane="{lane}"')
                dark = self._at(h, d, "optic_dark") if lane in DARK_LANES else []
                self._steps(series, [(fl.start, 1), *((at, 0) for at in dark)], self._gone(h, d))
        self._family(c.MODULE_RX_POWER_THRESHOLD.family_name, "gauge")
        for h, d in self._devices():
            series = self._port(c.MODULE_RX_POWER_THRESHOLD, h, d, 'netdev=%N,limit="low_warning"')
            self._steps(series, [(fl.start, RX_LOW_WARNING_W)], self._gone(h, d))
        for spec, rate, kind in (
            (c.FEC_CORRECTED_BLOCKS, CORRECTED_PER_SECOND, ""),
            (c.FEC_UNCORRECTABLE_BLOCKS, 0.0, "fec"),
        ):
            self._family(spec.family_name, "counter")
            for h, d in self._devices():
                since = self._at(h, d, kind) if kind else []
                extra = UNCORRECTABLE_PER_SECOND if since else 0.0
                self._counter(self._port(spec, h, d, "netdev=%N"), rate, extra, since[0] if since else None, h, d)
        self._family(c.PRIORITY_PAUSE_DURATION.family_name, "counter")
        for h, d in self._devices():
            for direction in ("received", "sent"):
                labels = f'netdev=%N,direction="{direction}",priority="{STORM_PRIORITY}"'
                storm = self._at(h, d, "pause") if direction == "sent" else []
                extra = STORM_SHARE - PAUSE_SHARE if storm else 0.0
                series = self._port(c.PRIORITY_PAUSE_DURATION, h, d, labels)
                self._counter(series, PAUSE_SHARE, extra, storm[0] if storm else None, h, d)
        self._family(c.PAUSE_STORM_EVENTS.family_name, "counter")
        for h, d in self._devices():
            series = self._port(c.PAUSE_STORM_EVENTS, h, d, 'netdev=%N,stage="warning"')
            self._steps(series, [(fl.start, 0)], self._gone(h, d))

    def _rx_steps(self, h: int, d: int, lane: int) -> list[tuple[int, float | None]]:
        steps: list[tuple[int, float | None]] = [(self.fleet.start, RX_POWER_W)]
        if lane == FADING_LANE:
            steps += [(at, RX_FADED_W) for at in self._at(h, d, "optic_low")]
            steps += [(at, RX_DRIFTED_W) for at in self._at(h, d, "optic_drift")]
        if lane in DARK_LANES:
            steps += [(at, 0.0) for at in self._at(h, d, "optic_dark")]
        return steps

    # --- fault timing -----------------------------------------------------------------------------------

    def _at(self, h: int, d: int, kind: str) -> list[int]:
        return [f.at for f in self.by_device.get((h, d), []) if f.kind == kind]

    def _gone(self, h: int, d: int) -> int | None:
        """When the device's own series stop: the exporter no longer reads a NIC that left the bus."""
        gone = self._at(h, d, "gone")
        return gone[0] if gone else None

    def _nm(self, h: int) -> bool:
        return any(f.kind == "gid_shift" for f in self.by_host.get(h, []))

    def _flap(
        self, h: int, d: int, during: tuple[float | None, int], after: tuple[float | None, int | None]
    ) -> list[tuple[int, float | None]]:
        """Steps of a gid_shift: `during` (value, from s after the flap), `after` (value, from s; None: never)."""
        out: list[tuple[int, float | None]] = []
        for at in self._at(h, d, "gid_shift"):
            out.append((at + during[1], during[0]))
            if after[1] is not None:
                out.append((at + after[1], after[0]))
        return out

    def _rate_steps(self, h: int, d: int) -> list[tuple[int, float | None]]:
        return [(self.fleet.start, RATE), *((at, RATE / 2) for at in self._at(h, d, "speed"))]

    def _below(self, kind: str) -> Any:
        return lambda h, d: [(self.fleet.start, 0), *((at, 1) for at in self._at(h, d, kind))]

    def _aer_steps(self, h: int, d: int, severity: str) -> list[tuple[int, float | None]]:
        """The device's AER count of `severity`: what it counted before the exporter started, then its faults."""
        fl = self.fleet
        base = OLD_AER[severity] if h % OLD_AER_EVERY == 0 else 0
        steps: list[tuple[int, float | None]] = [(fl.start, base)]
        if severity == AER_FATAL:
            steps += [(at, base + 1) for at in self._at(h, d, "aer_fatal")]
        elif severity == AER_NONFATAL:
            for at in self._at(h, d, "aer_nonfatal"):
                steps += [(at, base + 1), (at + NONFATAL_APART_S, base + 2)]
        elif severity == AER_CORRECTABLE:
            for at in self._at(h, d, "aer_correctable"):  # counted at each sample: the errors of the time since
                steps += [(t, base + CORRECTABLE_PER_MINUTE * (t - at) // 60) for t in self.times if t > at]
        return steps

    def _hash_steps(self, h: int, d: int) -> list[tuple[int, float | None]]:
        base = float(1_000_003 * h + 7 * d + 1)
        return [(self.fleet.start, base), *self._flap(h, d, (base + 1, 0), (base + 2, ADDRESS_GONE_S))]

    # --- writing ------------------------------------------------------------------------------------------

    def _devices(self) -> Iterator[tuple[int, int]]:
        for h in range(self.fleet.hosts):
            for d in range(self.fleet.rnics):
                yield h, d

    def _family(self, name: str, kind: str) -> None:
        self.out.write(f"# TYPE {name} {kind}\n")

    def _name(self, spec: MetricSpec, h: int, labels: str) -> str:
        sep = "," if labels else ""
        return f'{spec.name}{{instance="{self.fleet.instance(h)}",job="{JOB}"{sep}{labels}}}'

    @staticmethod
    def _labels(spec: MetricSpec, *values: str) -> str:
        """`spec`'s labels (instance and job are Prometheus') set to `values`, in the catalogue's order."""
        return ",".join(f'{name}="{value}"' for name, value in zip(spec.labels, values, strict=True))

    def _port(self, spec: MetricSpec, h: int, d: int, extra: str) -> str:
        fl = self.fleet
        extra = extra.replace("%N", f'"{fl.netdev(d)}"').replace("%A", f'"{fl.address(h, d)}"')
        labels = f'device="{fl.device(d)}",port="1"' + (f",{extra}" if extra else "")
        return self._name(spec, h, labels)

    def _const(self, series: str, value: str) -> None:
        head = f"{series} {value}"
        self.out.write(head + head.join(self.suffixes))
        self.samples += len(self.times)

    def _steps(self, series: str, steps: Sequence[tuple[int, float | None]], until: int | None = None) -> None:
        """A gauge that takes each (since, value) in turn (None: absent), written until `until` (exclusive)."""
        ordered = sorted(steps, key=lambda s: s[0])
        if len(ordered) == 1 and until is None:
            self._const(series, _fmt(ordered[0][1]))
            return
        i, value = 0, ordered[0][1]
        parts: list[str] = []
        for t, suffix in zip(self.times, self.suffixes, strict=True):
            if until is not None and t >= until:
                break
            while i < len(ordered) and ordered[i][0] <= t:
                value = ordered[i][1]
                i += 1
            if value is not None:
                parts.append(f"{series} {_fmt(value)}{suffix}")
        self.out.write("".join(parts))
        self.samples += len(parts)

    def _counter(self, series: str, rate: float, extra: float, since: int | None, h: int, d: int) -> None:
        """A counter growing at `rate` per second, and by `extra` per second from `since` on."""
        until = self._gone(h, d)
        start = self.fleet.start
        parts = []
        for t, suffix in zip(self.times, self.suffixes, strict=True):
            if until is not None and t >= until:
                break
            value = rate * (t - start) + (extra * (t - since) if since is not None and t > since else 0.0)
            parts.append(f"{series} {_fmt(value)}{suffix}")
        self.out.write("".join(parts))
        self.samples += len(parts)


def _fmt(value: float | None) -> str:
    assert value is not None
    return str(int(value)) if float(value).is_integer() and abs(value) < 2**53 else repr(float(value))


# --- into a real Prometheus ---------------------------------------------------------------------------


@dataclass
class Timings:
    """Wall seconds of each loading stage, and the sample count; the benchmark prints them."""

    samples: int = 0
    generate_s: float = 0.0
    openmetrics_bytes: int = 0
    promtool_openmetrics_s: float = 0.0
    promtool_rules_s: float = 0.0
    prometheus_start_s: float = 0.0


def _run(args: list[str], timeout: float) -> None:
    result = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(args[:4])} failed ({result.returncode}): {result.stderr[-2000:]}")


@contextmanager
def loaded(fleet: Fleet, *, timeout: float = 600, workdir: Path | None = None) -> Iterator[tuple[Prometheus, Timings]]:
    """A real Prometheus serving `fleet` and its recorded series; everything removed on exit."""
    promtool = require_binary("promtool")
    timings = Timings()
    with tempfile.TemporaryDirectory(prefix="rnic-fleet-", dir=workdir) as tmp:
        work = Path(tmp)
        data = work / "prom" / "data"
        om = work / "fleet.om"
        began = time.monotonic()
        with om.open("w", buffering=1 << 20) as out:
            timings.samples = fleet.write(out)
        timings.generate_s = time.monotonic() - began
        timings.openmetrics_bytes = om.stat().st_size
        began = time.monotonic()
        _run([promtool, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(om), str(data)], timeout)
        timings.promtool_openmetrics_s = time.monotonic() - began
        om.unlink()  # the text is 10-20 times the blocks; free the disk before Prometheus starts
        config = {"global": {"evaluation_interval": "1m"}}
        with Prometheus(work / "prom", config) as prom:
            began = time.monotonic()
            _run(
                [
                    promtool,
                    "tsdb",
                    "create-blocks-from",
                    "rules",
                    "--quiet",
                    f"--url={prom.url}",
                    f"--start={fleet.start}",
                    f"--end={fleet.end}",
                    "--eval-interval=60s",
                    f"--output-dir={work / 'rules'}",
                    str(REPO / "alerts" / recording.FILENAME),
                ],
                timeout,
            )
            timings.promtool_rules_s = time.monotonic() - began
        for block in (work / "rules").iterdir():
            shutil.move(str(block), data / block.name)
        began = time.monotonic()
        with Prometheus(work / "prom", config) as prom:
            timings.prometheus_start_s = time.monotonic() - began
            yield prom, timings


def query(prom: Prometheus, promql: str, at: float) -> list[dict[str, Any]]:
    """An instant query at unix time `at`; fails with Prometheus' error."""
    url = f"{prom.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql, "time": str(at)})
    status, _, body = http_get(url, timeout=60)
    data = json.loads(body)
    if status != 200 or data.get("status") != "success":
        raise AssertionError(f"{promql}: {data.get('error', body[:300])}")
    result: list[dict[str, Any]] = data["data"]["result"]
    return result


def query_range(prom: Prometheus, promql: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    url = f"{prom.url}/api/v1/query_range?" + urllib.parse.urlencode(
        {"query": promql, "start": str(start), "end": str(end), "step": str(step)}
    )
    status, _, body = http_get(url, timeout=120)
    data = json.loads(body)
    if status != 200 or data.get("status") != "success":
        raise AssertionError(f"{promql}: {data.get('error', body[:300])}")
    result: list[dict[str, Any]] = data["data"]["result"]
    return result
