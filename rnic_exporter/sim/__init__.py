"""A kernel-faithful simulated sysfs tree for tests, the demo and the benchmark."""

from rnic_exporter.sim.host import SimDevice, SimHost

__all__ = ["SimDevice", "SimHost"]
