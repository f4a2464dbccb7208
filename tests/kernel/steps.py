"""Reading a daemon scenario's recorded steps on the host: a step's scrape, its events and `check`'s
problems (incident_b1, incident_b2)."""

from __future__ import annotations

from typing import Any

from tests.kernel.lab import samples

# What may stay of a gone device: the inventory's 0 and the event counters.
KEPT_FOR_GONE = {"rnic_device_present", "rnic_events_total"}


def step(res: dict[str, Any], name: str) -> dict[str, Any]:
    assert name in res["steps"], res.get("error")
    found: dict[str, Any] = res["steps"][name]
    return found


def scrape(st: dict[str, Any]) -> str:
    return "\n".join(st["scrape"])


def events(st: dict[str, Any], event: str, device: str) -> float:
    return sum(v for _, v in samples(scrape(st), "rnic_events_total", event=event, device=device))


def problems(st: dict[str, Any], device: str, code: str | None = None) -> list[dict[str, Any]]:
    check = st["check"]
    assert "problems" in check, check
    return [p for p in check["problems"] if p["where"].split(" ")[0] == device and code in (None, p["code"])]


def stale(st: dict[str, Any], device: str) -> list[str]:
    return [ln for ln in st["scrape"] if f'device="{device}"' in ln and ln.split("{")[0] not in KEPT_FOR_GONE]
