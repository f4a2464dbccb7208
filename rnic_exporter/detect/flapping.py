"""Port flap detection: N up/down transitions within a window make a port flapping; it stays so
until it has been quiet for a while, so one alert covers a burst instead of one per bounce."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from rnic_exporter.detect.settings import FlapSettings


@dataclass(slots=True)
class _PortHistory:
    up: bool | None = None
    transitions: deque[float] = field(default_factory=deque)
    last_transition: float | None = None
    flapping: bool = False


class FlapTracker:
    """Fed each observed up/down state with its time; answers whether the port is flapping."""

    def __init__(self, settings: FlapSettings) -> None:
        self.settings = settings
        self._ports: dict[tuple[str, int], _PortHistory] = {}

    def observe(self, key: tuple[str, int], up: bool | None, now: float) -> bool:
        history = self._ports.setdefault(key, _PortHistory())
        if up is not None and history.up is not None and up != history.up:
            history.transitions.append(now)
            history.last_transition = now
        if up is not None:
            history.up = up
        while history.transitions and now - history.transitions[0] > self.settings.window_s:
            history.transitions.popleft()
        if len(history.transitions) >= self.settings.transitions:
            history.flapping = True
        elif (
            history.flapping
            and history.last_transition is not None
            and (now - history.last_transition >= self.settings.clear_after_s)
        ):
            history.flapping = False
        return history.flapping

    def forget(self, keep: set[tuple[str, int]]) -> None:
        for key in set(self._ports) - keep:
            del self._ports[key]
