"""Threshold blocks: four 16-bit limits in the order both SFF-8636 and CMIS store them.

Each block is high alarm, low alarm, high warning, low warning (SFF-8636 page 03h Table 6-26,
CMIS page 02h Table 8-62), in the unit of the value they bound.
"""

from __future__ import annotations

from collections.abc import Callable

from rnic_exporter.model.optics import Monitor, Thresholds

Reader = Callable[[bytes, int], float]


def block(page: bytes | None, offset: int, read: Reader) -> Thresholds | None:
    """The four limits at `offset`, or None when the page was not read or holds no usable set."""
    if page is None:
        return None
    found = Thresholds(
        high_alarm=read(page, offset),
        low_alarm=read(page, offset + 2),
        high_warning=read(page, offset + 4),
        low_warning=read(page, offset + 6),
    )
    return found if found.usable else None


def monitor(value: float | None, limits: Thresholds | None) -> Monitor | None:
    return None if value is None else Monitor(value=value, thresholds=limits)
