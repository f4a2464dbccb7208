"""The daemon's settings (`serve`): its flags, and one frozen record built from them and the environment
(the config file goes on top in `daemon/serve.py`, at start and on each SIGHUP); `check`'s the same way."""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import click

from rnic_exporter.config import otlp
from rnic_exporter.config.bounds import COUNTER_WAIT, POLL_INTERVAL, NumberParam
from rnic_exporter.config.file import ConsumerSettings, Resolved, WireIntervals, reader_settings, resolve
from rnic_exporter.config.nccl_conf import read_nccl_conf
from rnic_exporter.config.nccl_env import gid_index_from_env, gid_index_given
from rnic_exporter.config.otlp import OtlpSettings
from rnic_exporter.detect.settings import DetectionSettings
from rnic_exporter.detect.state import DEFAULT_STATE_DIR
from rnic_exporter.sources.address_risks import HostPaths
from rnic_exporter.sources.counter_filter import CounterFilter
from rnic_exporter.sources.counters import SLOW_PMA_S
from rnic_exporter.sources.read_thread import DEFAULT_DEADLINE_S
from rnic_exporter.sources.reader import IB_GIDS_S, PCIE_S, SAFETY_S, ReaderSettings

Decorator = Callable[[Any], Any]  # a click option
DEFAULT_COUNTER_WAIT_S = 2.0  # above the read deadline: a scrape still gets the other devices' fresh counters

# Prometheus' exporter port range 9100-9999 is fully allocated and its guide asks unlisted
# exporters to stay out of it; 19879 is outside it, below the ephemeral range, and no well-known
# service's, so we run beside node_exporter (9100) and dcgm-exporter (9400).
DEFAULT_PORT = 19879
DEFAULT_LISTEN = f":{DEFAULT_PORT}"


@dataclass(frozen=True, slots=True)
class ServeConfig:
    sysfs: Path = Path("/sys")
    listen: tuple[str, ...] = (DEFAULT_LISTEN,)
    telemetry_path: str = "/metrics"
    web_config_file: Path | None = None
    web_max_connections: int = 512
    web_max_requests: int = 40
    poll_interval_s: float = 5.0
    # While netlink works, what an event announces is re-read on the event and this often anyway
    # (--poll.safety-interval); each poll reads only what nothing announces (sources/reader.py).
    safety_interval_s: float = SAFETY_S
    # What nothing announces, at the period of its detection-latency budget (sources/watch_tiers.py):
    # the PCIe links' speed, width and AER counts (--poll.pcie-interval), InfiniBand GID tables
    # (--poll.gid-interval). An InfiniBand port's state and rate are read every --poll.interval.
    pcie_interval_s: float = PCIE_S
    gid_interval_s: float = IB_GIDS_S
    reader: ReaderSettings = field(default_factory=ReaderSettings)
    config_file: Path | None = None
    state_dir: Path | None = DEFAULT_STATE_DIR  # None keeps the inventory in memory only
    host_paths: HostPaths = field(default_factory=HostPaths)
    detection: DetectionSettings = field(default_factory=DetectionSettings)
    watch_netlink: bool = True
    watch_udev: bool = True
    ethtool: bool = True  # advertised link modes as a rated source (loads pyroute2's ethtool module)
    otlp: OtlpSettings | None = None  # None: OTLP off, OpenTelemetry never imported
    counter_wait_s: float = DEFAULT_COUNTER_WAIT_S  # --web.counter-wait
    read_deadline_s: float = DEFAULT_DEADLINE_S
    consumers: ConsumerSettings = field(default_factory=ConsumerSettings)  # --collector.consumers
    wire: bool = True  # --collector.wire: optics, FEC, link-down reason, pause on their own timers
    wire_intervals: WireIntervals = field(default_factory=WireIntervals)  # the config file's [collector.wire]

    @property
    def detection_settings(self) -> DetectionSettings:
        """Detection judges NCCL's pick with the NCCL settings the reader selects with."""
        return replace(self.detection, nccl=self.reader.nccl)


def serve_flags(log: Sequence[Decorator] = ()) -> list[Decorator]:
    """serve's own flags, in --help order, keyed as `serve_config` reads them; `log`: the logging
    flags, placed among them."""
    return [
        click.option(
            "--web.listen-address",
            "listen",
            multiple=True,
            default=[DEFAULT_LISTEN],
            metavar="[HOST]:PORT",
            help="Address to listen on; repeat for several. 19879 is outside "
            "Prometheus' allocated exporter range 9100-9999.",
        ),
        click.option("--web.telemetry-path", "telemetry_path", default="/metrics", help="Path of the metrics."),
        click.option(
            "--web.counter-wait",
            "counter_wait",
            type=NumberParam(COUNTER_WAIT),
            default=2.0,
            help="Time (2s, 500ms, or seconds) a scrape waits for its counter read; then it serves the last values and "
            "sets rnic_exporter_counters_stale (a hung firmware read must not hang the scrape).",
        ),
        click.option(
            "--web.config.file",
            "web_config",
            default=None,
            metavar="FILE",
            type=click.Path(dir_okay=False, path_type=Path),
            help="exporter-toolkit web config (TLS, basic auth), as node_exporter uses.",
        ),
        click.option(
            "--web.max-connections",
            "web_max_connections",
            type=click.IntRange(min=1),
            default=512,
            help="Open HTTP connections at most; at the cap the one waiting longest without a "
            "request is closed, and new clients wait in the listen backlog when none is.",
        ),
        click.option(
            "--web.max-requests",
            "web_max_requests",
            type=click.IntRange(min=0),
            default=40,
            help="Concurrent scrapes at most (0: no limit); more get 503 at once.",
        ),
        click.option(
            "--config",
            "config_file",
            default=None,
            metavar="FILE",
            type=click.Path(dir_okay=False, path_type=Path),
            help="Config file (TOML, or YAML by .yml/.yaml). Flags beat the file; SIGHUP reloads it.",
        ),
        click.option(
            "--poll.interval",
            "poll_interval",
            type=NumberParam(POLL_INTERVAL),
            default=5.0,
            help="Time between sysfs polls of what needs the fast pass (InfiniBand port state and rate; "
            "everything when netlink is off or failing): a Prometheus duration (500ms, 5s, 1m) or seconds, "
            "0.05 s to 1h. Scrapes are served from the last poll.",
        ),
        click.option(
            "--poll.safety-interval",
            "safety_interval",
            type=NumberParam(POLL_INTERVAL),
            default=60.0,
            help="While netlink works: how often what an event announces (a RoCE port's netdev, state, "
            "rate and GIDs) is re-read anyway; every --poll.interval reads only what nothing announces "
            "(InfiniBand port state and rate, PCIe link). Netlink off or failing: everything every "
            "--poll.interval (rnic_exporter_poll_fallback).",
        ),
        click.option(
            "--poll.pcie-interval",
            "pcie_interval",
            type=NumberParam(POLL_INTERVAL),
            default=PCIE_S,
            help="While netlink works: how often each RNIC's PCIe link speed, width and AER counts are "
            "read (a downtrained link is seen within it). A host of RoCE ports only sleeps this long "
            "between polls; an announcement wakes it at once.",
        ),
        click.option(
            "--poll.gid-interval",
            "gid_interval",
            type=NumberParam(POLL_INTERVAL),
            default=IB_GIDS_S,
            help="While netlink works: how often InfiniBand ports' GID tables are read, every slot "
            "(RoCE ports' are announced by rtnetlink). InfiniBand port state and rate: every --poll.interval.",
        ),
        *log,  # logging's, defined by the CLI: daemon/logsetup.py sits above config
        click.option(
            "--watch.netlink/--no-watch.netlink",
            "watch_netlink",
            default=True,
            help="Re-read at once on rtnetlink address and link events (and track addresses).",
        ),
        click.option(
            "--watch.udev/--no-watch.udev",
            "watch_udev",
            default=True,
            help="Re-read at once when udev reports RDMA, net or PCI devices added or removed.",
        ),
        click.option(
            "--collector.ethtool/--no-collector.ethtool",
            "ethtool",
            default=True,
            help="Use the link modes RoCE netdevs advertise (ethtool netlink) as their rated speed.",
        ),
        click.option(
            "--collector.wire/--no-collector.wire",
            "wire",
            default=True,
            help="Read the wire below RoCE netdevs on its own timers, never per scrape: module (optics) "
            "health and thresholds every minute, FEC, pause and PFC, why a link is down, mlx5 hwmon "
            "temperatures (ethtool netlink and ethtool -S; default on).",
        ),
        click.option(
            "--collector.rdma-netlink/--no-collector.rdma-netlink",
            "rdma_netlink",
            default=True,
            help="Read each port's hw counters with one RDMA netlink request (STAT_GET) where the kernel "
            "answers it, instead of a file (and firmware command on mlx5) per counter; sysfs where it "
            "does not (rnic_exporter_read_path_info). With --collector.consumers, also where the holders of "
            "each device come from (the kernel's verbs contexts) instead of reading every process's descriptors.",
        ),
        click.option(
            "--collector.pma.slow-interval",
            "pma_slow_interval",
            type=NumberParam(POLL_INTERVAL),
            default=SLOW_PMA_S,
            help="Time between reads of the PMA counters no per-scrape rate needs (the error counters, "
            "unicast/multicast; each a firmware command on mlx5), served from their last read between; "
            "throughput, packets and port_xmit_wait are read every scrape.",
        ),
    ]


def serve_config(
    flags: Mapping[str, Any], explicit: Collection[str], environ: Mapping[str, str] | None = None
) -> tuple[ServeConfig, frozenset[str]]:
    """`serve`'s settings from its flags (keyed by click's parameter names) and the environment
    (NCCL_IB_GID_INDEX, OTEL_*), and the names the operator gave: `explicit` (flags and their
    variables) plus the NCCL index when the environment sets it. Those beat the config file, which
    `daemon/serve.py` lays on top at start and on every SIGHUP (`file.apply_file`), so a reload starts
    from these again."""
    env = os.environ if environ is None else environ
    state_dir = flags["state_dir"]
    config = ServeConfig(
        sysfs=Path(flags["sysfs"]),
        listen=tuple(flags["listen"]),
        telemetry_path=flags["telemetry_path"],
        web_config_file=flags["web_config"],
        web_max_connections=flags["web_max_connections"],
        web_max_requests=flags["web_max_requests"],
        poll_interval_s=flags["poll_interval"],
        safety_interval_s=flags["safety_interval"],
        pcie_interval_s=flags["pcie_interval"],
        gid_interval_s=flags["gid_interval"],
        reader=replace(
            reader_settings(
                flags["device_include"],
                flags["device_exclude"],
                counters=CounterFilter.build(
                    flags["hw_counters"], flags["hw_counters_include"], flags["hw_counters_exclude"]
                ),
            ),
            rdma_netlink=flags.get("rdma_netlink", True),
            pma_slow_s=flags.get("pma_slow_interval", SLOW_PMA_S),
        ),
        config_file=flags["config_file"],
        state_dir=Path(state_dir) if state_dir else None,
        host_paths=HostPaths(procfs=Path(flags["procfs"]), rootfs=Path(flags["rootfs"])),
        detection=DetectionSettings(nccl_gid_index=gid_index_from_env(env)),
        watch_netlink=flags["watch_netlink"],
        watch_udev=flags["watch_udev"],
        ethtool=flags["ethtool"],
        otlp=otlp.resolve(flags, env),
        counter_wait_s=flags["counter_wait"],
        consumers=ConsumerSettings(enabled=flags["consumers"], interval_s=flags["consumers_interval"]),
        wire=flags["wire"],
    )
    return config, frozenset(explicit) | ({"nccl_gid_index"} if gid_index_given(None, env) else frozenset())


def check_config(
    config_file: Path | None,
    rootfs: Path,
    *,
    device_include: str | None = None,
    device_exclude: str | None = None,
    nccl_gid_index: int | None = None,
    expected_devices: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> Resolved:
    """`check`'s settings, resolved as serve's are: the flag beats NCCL_IB_GID_INDEX, which beats the
    config file's [nccl], which beats NCCL's own config files (/etc/nccl.conf under `rootfs`)."""
    env = os.environ if environ is None else environ
    given = {"device_include": device_include, "device_exclude": device_exclude, "expected_devices": expected_devices}
    explicit = {name for name, value in given.items() if value is not None}
    if gid_index_given(nccl_gid_index, env):
        explicit.add("nccl_gid_index")
    index = nccl_gid_index if nccl_gid_index is not None else gid_index_from_env(env)
    return resolve(
        config_file,
        device_include=device_include,
        device_exclude=device_exclude,
        detection=DetectionSettings(nccl_gid_index=index, expected_devices=expected_devices),
        explicit=explicit,
        nccl_conf=read_nccl_conf(rootfs=rootfs),
    )
