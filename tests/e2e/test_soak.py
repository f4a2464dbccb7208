"""The soak, two and a half minutes of it: a real `serve` under flaps, GID shifts, rate and PCIe drops, and devices
falling off the bus and coming back, every event seen exactly once and no growth of memory, descriptors
or threads. Run it alone with `pytest -m soak`; `bench/soak.py` is the hour-long version."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from rnic_exporter.catalog import events as ev
from tests.support import soak
from tests.support.serve import Ours

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.soak
def test_two_minute_soak_sees_every_event_once_and_does_not_grow(tmp_path: Path) -> None:
    # Warm-up covers the daemon's longest own period (a full re-read and a detection pass every 60 s,
    # and the garbage gen 0 holds up to its 50,000 threshold) so a one-time step is not read as growth.
    config = soak.SoakConfig(
        seconds=150, devices=4, gid_slots=32, poll_s=1.0, sample_s=10, warmup_s=75, ours=Ours(src=ROOT)
    )
    lines: list[str] = []
    result = soak.run_soak(config, lines.append, work=tmp_path)
    soak.report(result, lines.append)
    text = "\n".join(lines)
    assert not result.failures, text
    # Not vacuous: the whole cycle ran on every device, more than once, and was seen.
    assert all(result.steps[step] >= 2 * config.devices for step in soak.STEPS if step != "release"), text
    assert result.seen == result.expected and sum(result.seen.values()) > 200, text
    assert sum(n for (event, _, _), n in result.seen.items() if event == ev.PORT_FLAPPING.name) >= config.devices
    growth = result.growth
    assert set(growth) == {"rss_mb", "fds", "threads"} and not any(grew for _, _, grew in growth.values()), text
    assert len([s for s in result.samples if s.at_s >= config.warmup_s]) >= 6, text
    assert result.exit_code == 0 and result.stop_s < 5, text


def test_a_second_sighting_of_an_event_is_a_failure(tmp_path: Path) -> None:
    run = soak.Soak(soak.SoakConfig(devices=2, gid_slots=8), tmp_path, lambda _: None)
    run.t0 = 0.0
    key = (ev.DEVICE_DISCOVERED.name, "mlx5_0", "")
    run.on_event(key)
    assert not run.result.failures
    run.on_event(key)
    assert len(run.result.failures) == 1 and "seen 2 times, expected 1" in run.result.failures[0]
    run.on_event((ev.NCCL_GID_INDEX_CHANGED.name, "mlx5_0", ""))  # derived: counted, never a failure
    assert len(run.result.failures) == 1 and run.result.derived == Counter({ev.NCCL_GID_INDEX_CHANGED.name: 1})


def test_growth_after_warm_up_is_a_failure() -> None:
    config = soak.SoakConfig(warmup_s=10)
    flat = soak.Result(config, samples=[soak.Sample(t, 40.0, 500, 4) for t in range(0, 100, 10)])
    assert flat.growth and not any(grew for _, _, grew in flat.growth.values())
    # a device's worth of descriptors coming and going is not growth
    churn = soak.Result(config, samples=[soak.Sample(t, 40.0, 500 + 100 * (t // 10 % 2), 4) for t in range(0, 100, 10)])
    assert not churn.growth["fds"][2]
    leaking = soak.Result(config, samples=[soak.Sample(t, 40.0, 500 + 5 * t, 4 + t // 10) for t in range(0, 100, 10)])
    assert leaking.growth["fds"][2] and leaking.growth["threads"][2] and not leaking.growth["rss_mb"][2]
    warm_up_only = soak.Result(config, samples=[soak.Sample(0, 30.0, 100, 2), *flat.samples[1:]])
    assert not any(grew for _, _, grew in warm_up_only.growth.values())


def test_rss_that_keeps_rising_is_growth_and_rss_that_levelled_off_is_not() -> None:
    config = soak.SoakConfig(warmup_s=600)
    minutes = range(0, 3600, 60)
    rising = soak.Result(config, samples=[soak.Sample(t, 45.0 + 3.0 * t / 3600, 500, 4) for t in minutes])
    assert rising.growth["rss_mb"][2] and rising.rss_slopes[1] > 2.5
    # +1.7 MB between the thirds, but none of it in the last half: a long warm-up
    levelled = soak.Result(config, samples=[soak.Sample(t, 45.0 + min(t, 2100) / 600, 500, 4) for t in minutes])
    assert levelled.growth["rss_mb"][1] - levelled.growth["rss_mb"][0] > 1.5
    assert not levelled.growth["rss_mb"][2] and abs(levelled.rss_slopes[1]) < 0.5
    # too few samples in the last half for a fit: the medians alone decide
    samples = [soak.Sample(t, 40.0 + t / 10, 500, 4) for t in range(0, 50, 10)]
    short = soak.Result(soak.SoakConfig(warmup_s=10), samples=samples)
    assert short.growth["rss_mb"][2]
