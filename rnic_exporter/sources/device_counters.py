"""One device registration's counter files: its `CounterPlan` (made again with its shape), the
judgement of its last counter pass, and the failed reads nobody took yet.

Counters are read per consumer (`sources/counters.py`), on whatever thread asks, under the
device's gate like its state (`sources/device_reader.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import cast

from rnic_exporter.model.host import CounterValue, Device, ReadError
from rnic_exporter.sources import availability
from rnic_exporter.sources.counters import CounterPlan
from rnic_exporter.sources.discovery import Shape
from rnic_exporter.sources.read_context import ReadContext
from rnic_exporter.sources.sysfs import FdCache, SysfsRoot

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
        self.plan = CounterPlan(self.name, groups, self.context.clock, wants)
        self._plan_read = False

    def job(self) -> None:
        plan = self.plan
        if plan is None:
            return
        refresh_errors = plan.refresh(self.fds)
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
