"""One device registration's counter files: its `CounterPlan` (made again with its shape), the
judgement of its last counter pass, and the failed reads nobody took yet.

Counters are read per consumer (`sources/counters.py`), on whatever thread asks, under the
device's gate like its state (`sources/device_reader.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import cast

from rnic_exporter.model.host import CounterValue, Device, ReadError
from rnic_exporter.sources import availability
from rnic_exporter.sources.counters import CounterPlan, slow_pma
from rnic_exporter.sources.discovery import Shape
from rnic_exporter.sources.nldev import PortCounters, Unavailable
from rnic_exporter.sources.read_context import ReadContext
from rnic_exporter.sources.read_path import ReadPath, choose_read_path
from rnic_exporter.sources.sysfs import FdCache, SysfsRoot

log = logging.getLogger("rnic_exporter.sources")

# After RDMA netlink failed a device (or was refused when asked), it is asked again this long after.
NETLINK_RETRY_S = 300.0
# Reads per kind (rnic_exporter_reads_total{kind}): a CounterGroup's kind -> the label.
_READ_KINDS = {"counters": "pma_file", "hw": "hw_counters_file"}
NETLINK_STAT = "netlink_stat"
DISABLED = ReadPath("-", "sysfs", "RDMA netlink turned off (--no-collector.rdma-netlink)", "disabled")
NOT_LIVE = ReadPath("-", "sysfs", "a tree that is not a sysfs mount: no kernel behind it to ask", "not_live_sysfs")

# Errnos a read gets when the device itself is being removed (see `Registration.leaving`).
_GONE_ERRNOS = frozenset({"ENOENT", "ENODEV"})


@dataclass(frozen=True, slots=True)
class Registration:
    """One registration of a device: its class directory and the identity (inode, ctime) it had
    when its reader was made. A value, not a back-reference: a retired reader leaves no cycle."""

    root: SysfsRoot
    base: str
    ident: tuple[int, int]

    def gone(self) -> bool:
        """This registration is gone (or replaced) since the reader was made: one stat."""
        return self.root.identity(self.base) != self.ident

    def leaving(self, errors: Sequence[ReadError]) -> bool:
        """ENOENT (a path looked up afresh) or ENODEV (a held descriptor of a removed kernfs node)
        may mean the device is going away under us; one stat says whether it is gone."""
        return any(e.kind in _GONE_ERRNOS for e in errors) and self.gone()


class DeviceCounters:
    """The counter side of one `DeviceReader`: every method runs under its gate."""

    def __init__(self, name: str, registration: Registration, fds: FdCache, context: ReadContext) -> None:
        self.name = name
        self.base = registration.base
        self.fds = fds
        self.context = context
        self._registration = registration
        self.plan: CounterPlan | None = None
        self.failed: tuple[ReadError, ...] = ()
        self.unsupported: tuple[ReadError, ...] = ()
        self.gone = False  # the last counter pass found the device unregistered under it
        self._reads = availability.FirstReads()
        self._plan_read = False
        self._errors: list[ReadError] = []
        self._merged: tuple[Device, tuple[int, ...], Device] | None = None
        self.read_path: ReadPath | None = None  # how the hw counters are read (None: no plan yet)
        self.reads: dict[str, int] = {}  # reads so far per kind (pma_file, hw_counters_file, netlink_stat)
        self._nl_index = -1  # the device's RDMA netlink index while read_path is netlink
        self._nl_retry_at: float | None = None  # (clock) when netlink is asked again

    def take_errors(self) -> list[ReadError]:
        out, self._errors = self._errors, []
        return out

    def replan(self, shape: Shape) -> None:
        """A plan of the files of a shape learned (again), with the settings' collector filter."""
        groups: list[tuple[str, int | None, str, Sequence[str]]] = [
            ("hw", None, f"{self.base}/hw_counters", shape.hw_names)
        ]
        for port in shape.ports:
            port_dir = f"{self.base}/ports/{port.number}"
            groups.append(("counters", port.number, f"{port_dir}/counters", port.counter_names))
            groups.append(("hw", port.number, f"{port_dir}/hw_counters", port.hw_names))
        counters = self.context.settings.counters
        wants = None if counters.everything else counters.wants
        settings = self.context.settings
        self.plan = CounterPlan(self.name, groups, self.context.clock, wants, slow_pma, settings.pma_slow_s)
        self._plan_read = False
        self._choose_path(self.plan)

    def _choose_path(self, plan: CounterPlan) -> None:
        """RDMA netlink for the ports' hw counters where STAT_GET answers every one of them
        (`choose_read_path`), else the sysfs files; one probe per port."""
        netlink = self.context.netlink if self.context.settings.rdma_netlink else None
        self._nl_retry_at = None
        names = {g.port or 0: frozenset(g.names) for g in plan.groups if g.kind == "hw" and g.names}
        probes: dict[int, PortCounters | Unavailable] = {}
        if netlink is None:
            path = replace(DISABLED if not self.context.settings.rdma_netlink else NOT_LIVE, device=self.name)
        else:
            if any(names.values()) and not names.get(0):  # else sysfs whatever netlink says
                index = netlink.index_of(self.name)
                for port in names:
                    if isinstance(index, Unavailable):
                        probes[port] = index
                        continue
                    probes[port] = netlink.port_counters(index, port)
                    self.reads[NETLINK_STAT] = self.reads.get(NETLINK_STAT, 0) + 1  # a probe costs one too
                self._nl_index = -1 if isinstance(index, Unavailable) else index
            path = choose_read_path(self.name, names, probes)
            if path.path == "sysfs" and probes:
                self._nl_retry_at = self.context.clock() + NETLINK_RETRY_S
        before, self.read_path = self.read_path, path
        plan.feed_ports(names if path.path == "netlink" else ())
        if before is None or (before.path, before.code) != (path.path, path.code):
            log.info(
                "%s: hw counters read through %s (%s)",
                self.name,
                path.path,
                path.reason,
                extra={"fields": {"device": self.name, "path": path.path, "reason": path.code}},
            )

    def _netlink_values(self, plan: CounterPlan) -> list[int] | None:
        """The fed ports' hw counters, one STAT_GET each, in the plan's order; None when netlink
        failed the device (it is read from sysfs from this pass on, and netlink asked again later)."""
        netlink = self.context.netlink
        values: list[int] = []
        for port, names in plan.fed_names():
            got = netlink.port_counters(self._nl_index, port) if netlink is not None else None
            self.reads[NETLINK_STAT] = self.reads.get(NETLINK_STAT, 0) + 1
            if isinstance(got, PortCounters) and all(n in got.values for n in names):
                values.extend(got.values[n] for n in names)
                continue
            why = got if isinstance(got, Unavailable) else Unavailable("malformed", "the reply lacks a counter")
            self.read_path = ReadPath(self.name, "sysfs", f"port {port}: netlink {why}", f"netlink_{why.reason}")
            log.warning(
                "%s: RDMA netlink failed the hw counters of port %s (%s); reading them from sysfs",
                self.name,
                port,
                why,
                extra={"fields": {"device": self.name, "port": port, "reason": why.reason}},
            )
            plan.feed_ports(())
            self._nl_retry_at = self.context.clock() + NETLINK_RETRY_S
            if netlink is not None:
                netlink.failed()
            return None
        return values

    def scrape_job(self) -> None:
        """A consumer's pass (a scrape, an OTLP export): the slow PMA files only when due."""
        self.job(every_file=False)

    def job(self, every_file: bool = True) -> None:
        """One counter pass; `every_file` (a one-shot read): the slow PMA files too."""
        plan = self.plan
        if plan is None:
            return
        if self._nl_retry_at is not None and self.context.clock() >= self._nl_retry_at:
            self._choose_path(plan)
        path = self.read_path
        fed = self._netlink_values(plan) if path is not None and path.path == "netlink" else None
        refresh_errors = plan.refresh(self.fds, fed, every_file=every_file)
        for kind, n in plan.last_reads.items():
            label = _READ_KINDS[kind]
            self.reads[label] = self.reads.get(label, 0) + n
        # The device went away under held descriptors (`rdma link delete`, a NIC off the bus: the
        # kernel answers ENODEV): its failed reads stay in a one-shot read's snapshot (what was and was
        # not read), but the daemon's counter view leaves them out (`counter_judgements`): the next
        # state pass sees the device gone, which is the news, not a warning per counter file (the
        # kernel lab logged 15 of them before "disappeared").
        self.gone = self._registration.leaving(refresh_errors)
        first = () if self._plan_read else [plan.slot_label(i) for i in range(len(plan.rels))]
        self._plan_read = True
        judged = self._reads.judge(plan.errors, first, present=not self.gone)
        self.failed, self.unsupported = judged.failed, judged.unsupported
        if not self.gone:
            # rnic_exporter_read_errors_total counts failures: a file the driver never provided (a
            # restricted function's `N/A (no PMA)`, EINVAL since the first read) is not one.
            lacking = {(e.port, e.attribute) for e in judged.unsupported}
            self._errors.extend(e for e in refresh_errors if (e.port, e.attribute) not in lacking)

    def with_counters(self, device: Device) -> Device:
        """`device` with its counters (one-shot reads); the same object while nothing changed."""
        plan = self.plan
        if plan is None:
            return device
        versions = tuple(g.version for g in plan.groups)
        merged = self._merged
        if merged is not None and merged[0] is device and merged[1] == versions:
            return merged[2]
        ports = []
        for port in device.ports:
            counters, hw = plan.group("counters", port.number), plan.group("hw", port.number)
            ports.append(
                replace(
                    port,
                    counters=cast(Mapping[str, CounterValue], counters.as_mapping()) if counters else {},
                    hw_counters=cast(Mapping[str, int], hw.as_mapping()) if hw else {},
                )
            )
        hw_device = plan.group("hw", None)
        out = replace(
            device, ports=tuple(ports), hw_counters=cast(Mapping[str, int], hw_device.as_mapping()) if hw_device else {}
        )
        self._merged = (device, versions, out)
        return out
