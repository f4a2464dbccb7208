"""The daemon's settings (`serve`): one frozen record, from flags, the config file and the environment."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from rnic_exporter.config.file import ConsumerSettings
from rnic_exporter.config.otlp import OtlpSettings
from rnic_exporter.detect.settings import DetectionSettings
from rnic_exporter.detect.state import DEFAULT_STATE_DIR
from rnic_exporter.sources.address_risks import HostPaths
from rnic_exporter.sources.read_thread import DEFAULT_DEADLINE_S
from rnic_exporter.sources.reader import SAFETY_S, ReaderSettings

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

    @property
    def detection_settings(self) -> DetectionSettings:
        """Detection judges NCCL's pick with the NCCL settings the reader selects with."""
        return replace(self.detection, nccl=self.reader.nccl)
