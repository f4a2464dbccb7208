"""A kernel-faithful simulated sysfs tree for tests, the demo and the benchmark."""

from rnic_exporter.sim.host import SimDevice, SimHost
from rnic_exporter.sim.procfs import SimProcfs

__all__ = ["SimDevice", "SimHost", "SimProcfs"]
