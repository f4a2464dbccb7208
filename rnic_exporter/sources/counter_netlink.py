"""The host's RDMA netlink client for hw counters, shared by its devices' counter jobs.

Counter jobs may run on several threads at once (`sources/read_thread.py`) and the client is one
request at a time: each request holds a lock. Made only where the reader reads a sysfs mount
(`sources/live_tree.py`): a captured or simulated tree has no kernel behind it, and the running
kernel's RDMA devices may bear the same names as the tree's.
"""

from __future__ import annotations

import threading

from rnic_exporter.sources.nldev import PortCounters, RdmaNetlink, Unavailable


class HwNetlink:
    def __init__(self, client: RdmaNetlink | None = None) -> None:
        self._client = client or RdmaNetlink()
        self._lock = threading.Lock()
        # Requests of a device read through netlink that failed (the device fell back to its files):
        # rnic_exporter_event_source_errors_total{source="rdma_netlink"}. A refusal when the path is
        # chosen is not one: a kernel without RDMA netlink is unsupported, not broken.
        self.failures = 0

    def failed(self) -> None:
        with self._lock:
            self.failures += 1

    def index_of(self, device: str) -> int | Unavailable:
        """The device's RDMA netlink index (one device dump), or why there is none."""
        with self._lock:
            listed = self._client.devices()
        if isinstance(listed, Unavailable):
            return listed
        for found in listed:
            if found.name == device:
                return found.index
        return Unavailable("no_device", f"{device} is not in the RDMA netlink device dump")

    def port_counters(self, index: int, port: int) -> PortCounters | Unavailable:
        with self._lock:
            return self._client.port_counters(index, port)

    def close(self) -> None:
        with self._lock:
            self._client.close()


__all__ = ["HwNetlink"]
