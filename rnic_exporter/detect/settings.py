"""What detection is told by the operator: rated expectations, thresholds, the NCCL index in use."""

from __future__ import annotations

from dataclasses import dataclass, field

from rnic_exporter.catalog.link_health import LinkHealthThresholds
from rnic_exporter.model.host import Device
from rnic_exporter.model.nccl import NcclSettings

MATCH_KEYS = ("device", "pci_address", "hca_type", "board_id")


@dataclass(frozen=True, slots=True)
class RatedExpectation:
    """A configured rating for the devices it matches (all given match keys must agree)."""

    match: tuple[tuple[str, str], ...]  # (key in MATCH_KEYS, value)
    port_rate_gbps: float | None = None
    port_width: int | None = None
    netdev_speed_gbps: float | None = None
    pcie_speed_gts: float | None = None
    pcie_width: int | None = None

    def matches(self, device: Device) -> bool:
        values = {
            "device": device.name,
            "pci_address": device.pci_address,
            "hca_type": device.hca_type,
            "board_id": device.board_id,
        }
        return all(values[key] == want for key, want in self.match)


@dataclass(frozen=True, slots=True)
class FlapSettings:
    transitions: int = 4  # up/down transitions within the window that make a port "flapping"
    window_s: float = 300.0
    clear_after_s: float = 900.0  # stays flapping until this long without a transition (sticky)


@dataclass(frozen=True, slots=True)
class DetectionSettings:
    rated: tuple[RatedExpectation, ...] = ()
    flap: FlapSettings = field(default_factory=FlapSettings)
    expected_devices: int | None = None
    nccl_gid_index: int | None = None  # the NCCL_IB_GID_INDEX jobs use; None or -1 = auto-selection
    # Where a file set that index ("/etc/nccl.conf line 2"): check names it; "" for a flag, the
    # environment or nothing.
    nccl_gid_index_source: str = field(default="", compare=False)
    nccl: NcclSettings = field(default_factory=NcclSettings)  # the rest of NCCL's GID settings (the reader's)
    address_forget_after_s: float = 86400.0  # an expected address missing this long is forgotten
    link_health: LinkHealthThresholds = field(default_factory=LinkHealthThresholds)  # [link_health]

    def expectation_for(self, device: Device) -> RatedExpectation | None:
        """The last matching expectation wins, so specific entries go after general ones."""
        found = None
        for expectation in self.rated:
            if expectation.matches(device):
                found = expectation
        return found

    @property
    def configured_gid_index(self) -> int | None:
        return None if self.nccl_gid_index is None or self.nccl_gid_index < 0 else self.nccl_gid_index
