"""Link health judged from two counter samples: table tests with real numbers.

Rates are the ones of real ports: a 400 Gb/s (4X NDR) port carries 4e11 bit/s, about 12 million
4 KiB packets a second at line rate; a 100 Gb/s RoCE port about 3 million."""

from __future__ import annotations

import pytest

from rnic_exporter.catalog.link_health import SIGNAL_NAMES, LinkHealthThresholds
from rnic_exporter.detect.link_health import CounterSample, PortFacts, judge_port
from rnic_exporter.model.host import CounterValue, Device, LinkRate, NumberedState, Port

NDR = PortFacts("mlx5_0", 1, "ibp1s0", "InfiniBand", 400.0, 4, True)
ROCE_100 = PortFacts("mlx5_1", 1, "ens1f1np1", "Ethernet", 100.0, 4, True)
DOWN = PortFacts("mlx5_0", 1, None, "InfiniBand", None, None, False)

# A busy healthy mlx5 port: 36M packets each way in 3 s (4 KiB at ~400 Gb/s), congestion marks,
# a little reordering, the odd stray symbol error. Every signal the driver has, none failing.
BUSY_PMA = {
    "symbol_error": 1,
    "link_error_recovery": 0,
    "link_downed": 0,
    "port_rcv_errors": 0,
    "local_link_integrity_errors": 0,
    "excessive_buffer_overrun_errors": 0,
    "port_rcv_remote_physical_errors": 0,
    "port_xmit_discards": 12,
    "port_xmit_wait": 918_000,
    "port_xmit_packets": 36_000_000,
    "port_rcv_packets": 36_000_000,
}
BUSY_HW = {
    "out_of_sequence": 40,
    "packet_seq_err": 2,
    "implied_nak_seq_err": 0,
    "roce_adp_retrans": 3,
    "local_ack_timeout_err": 0,
    "rnr_nak_retry_err": 0,
    "req_transport_retries_exceeded": 0,
    "out_of_buffer": 5,
    "np_ecn_marked_roce_packets": 52_000,
    "np_cnp_sent": 9_100,
    "rp_cnp_handled": 8_700,
}
BASE_PMA = {k: 1_000 for k in BUSY_PMA} | {"local_link_integrity_errors": 2, "excessive_buffer_overrun_errors": 0}
BASE_HW = {k: 500_000 for k in BUSY_HW} | {"req_transport_retries_exceeded": 0}


def _samples(
    pma: dict[str, int], hw: dict[str, int], seconds: float = 3.0, base_pma: dict[str, int] | None = None
) -> tuple[CounterSample, CounterSample]:
    start_pma = dict(BASE_PMA if base_pma is None else base_pma)
    start_hw = {k: BASE_HW.get(k, 100) for k in hw}
    prev = CounterSample(1000.0, {k: start_pma.get(k, 0) for k in pma}, start_hw)
    cur = CounterSample(
        1000.0 + seconds,
        {k: start_pma.get(k, 0) + v for k, v in pma.items()},
        {k: start_hw[k] + v for k, v in hw.items()},
    )
    return prev, cur


def _busy(**changes: int) -> tuple[dict[str, int], dict[str, int]]:
    pma, hw = dict(BUSY_PMA), dict(BUSY_HW)
    for name, value in changes.items():
        (pma if name in pma else hw)[name] = value
    return pma, hw


def test_a_healthy_busy_port_stays_silent() -> None:
    health = judge_port(*_samples(*_busy()), NDR)
    assert health is not None
    assert not health.degrading, health.summary()
    assert health.level == "congested"  # ECN, CNPs, xmit wait: busy, not broken
    assert {v.signal for v in health.at("congested")} == {
        "port_xmit_discards",
        "port_xmit_wait",
        "np_ecn_marked_roce_packets",
        "np_cnp_sent",
        "rp_cnp_handled",
    }
    assert health.at("unsupported") == (health.verdict("rx_discards_phy"),)  # mlx5 sysfs has no such file
    assert health.summary() == ""


def test_a_healthy_busy_port_over_five_minutes_stays_silent() -> None:
    # The daemon's window: 5 min of the same traffic, 9 stray symbol errors (108/h, BER 7.5e-14).
    pma, hw = _busy(symbol_error=9)
    pma = {k: v * 100 if k.endswith("packets") or k == "port_xmit_wait" else v for k, v in pma.items()}
    health = judge_port(*_samples(pma, hw, seconds=300.0), NDR)
    assert health is not None
    assert not health.degrading, health.summary()


@pytest.mark.parametrize(
    "facts, seconds, errors, level, ber",
    [
        (NDR, 3.0, 40, "degrading", 40 / 1.2e12),  # 3.3e-11: 33x the IBTA limit
        (NDR, 3.0, 2, "ok", 2 / 1.2e12),  # below min_errors: one or two strays prove nothing
        (NDR, 300.0, 11, "degrading", 11 / 1.2e14),  # 132/h > NVSentinel's 120/h, BER 9e-14 within IBTA
        (NDR, 300.0, 10, "ok", 10 / 1.2e14),  # 120/h exactly: not above
        (PortFacts("mlx4_0", 1, None, "InfiniBand", 40.0, 4, True), 3600.0, 150, "degrading", 150 / 1.44e14),
        (DOWN, 3.0, 5, "degrading", None),  # no rate to weigh against: the per-hour ceiling alone
    ],
)
def test_symbol_error_as_a_bit_error_rate(
    facts: PortFacts, seconds: float, errors: int, level: str, ber: float | None
) -> None:
    health = judge_port(*_samples({"symbol_error": errors}, {}, seconds=seconds), facts)
    assert health is not None
    verdict = health.verdict("symbol_error")
    assert verdict is not None and verdict.level == level and verdict.increase == errors
    assert verdict.ratio == (pytest.approx(ber) if ber is not None else None)


def test_the_ber_limit_is_configurable() -> None:
    strict = LinkHealthThresholds().with_overrides({"symbol_error_ber": 1e-14, "errors_per_hour": 1e9})
    prev, cur = _samples({"symbol_error": 3}, {}, seconds=60.0)  # BER 1.25e-13 on 400 Gb/s
    default = judge_port(prev, cur, NDR, LinkHealthThresholds().with_overrides({"errors_per_hour": 1e9}))
    tight = judge_port(prev, cur, NDR, strict)
    assert default is not None and tight is not None
    assert (default.level, tight.level) == ("ok", "degrading")
    assert strict.min_errors == 3 and isinstance(strict.min_errors, int)


@pytest.mark.parametrize(
    "signal", ["link_error_recovery", "link_downed", "local_link_integrity_errors", "excessive_buffer_overrun_errors"]
)
def test_one_link_event_is_degrading(signal: str) -> None:
    health = judge_port(*_samples(*_busy(**{signal: 1})), NDR)
    assert health is not None and health.degrading
    assert [v.signal for v in health.at("degrading")] == [signal]


@pytest.mark.parametrize("signal", ["port_rcv_errors", "port_rcv_remote_physical_errors"])
def test_damaged_packets_over_the_ceiling(signal: str) -> None:
    few = judge_port(*_samples(*_busy(**{signal: 2})), NDR)
    many = judge_port(*_samples(*_busy(**{signal: 30})), NDR)  # 36,000/h
    assert few is not None and not few.degrading
    assert many is not None and [v.signal for v in many.at("degrading")] == [signal]


def test_miaai_hang_is_critical_with_retransmissions_degrading() -> None:
    # MiaAI-Lab PR #115: an AllReduce hung with packet_seq_err +4830, out_of_sequence +5057,
    # roce_adp_retrans +498, req_transport_retries_exceeded at 8. Over 60 s of 100 Gb/s RoCE
    # traffic slowed to a crawl: 2.4M packets each way.
    pma = {"port_xmit_packets": 2_400_000, "port_rcv_packets": 2_400_000}
    hw = {
        "packet_seq_err": 4830,
        "out_of_sequence": 5057,
        "roce_adp_retrans": 498,
        "req_transport_retries_exceeded": 8,
    }
    health = judge_port(*_samples(pma, hw, seconds=60.0), ROCE_100)
    assert health is not None and health.level == "critical"
    assert [v.signal for v in health.at("critical")] == ["req_transport_retries_exceeded"]
    assert {v.signal for v in health.at("degrading")} == {"packet_seq_err", "out_of_sequence", "roce_adp_retrans"}
    seq = health.verdict("packet_seq_err")
    assert seq is not None and seq.ratio == pytest.approx(4830 / 4_800_000)


def test_retransmissions_without_a_packet_counter_are_judged_per_second() -> None:
    # rxe: no counters/, its own names in hw_counters/.
    rxe = PortFacts("rxe0", 1, "veth0", "Ethernet", 10.0, 1, True)
    slow = judge_port(*_samples({}, {"rcvd_seq_err": 5, "comp_retry": 2}, seconds=10.0), rxe)
    lossy = judge_port(*_samples({}, {"rcvd_seq_err": 800, "comp_retry": 300, "retry_exceeded_err": 0}), rxe)
    assert slow is not None and not slow.degrading
    assert lossy is not None and {v.signal for v in lossy.at("degrading")} == {"packet_seq_err", "roce_adp_retrans"}
    comp = lossy.verdict("roce_adp_retrans")
    assert comp is not None and comp.counter == "comp_retry" and comp.ratio is None


def test_rxe_packets_make_the_ratio() -> None:
    rxe = PortFacts("rxe0", 1, "veth0", "Ethernet", 10.0, 1, True)
    health = judge_port(*_samples({}, {"rcvd_seq_err": 800, "sent_pkts": 4_000_000, "rcvd_pkts": 4_000_000}), rxe)
    assert health is not None and not health.degrading  # 1e-4 exactly: not above
    verdict = health.verdict("packet_seq_err")
    assert verdict is not None and verdict.ratio == pytest.approx(1e-4)


def test_receive_drops() -> None:
    ok = judge_port(*_samples(*_busy(out_of_buffer=3_000)), NDR)  # 8e-5 of 36M received
    bad = judge_port(*_samples(*_busy(out_of_buffer=90_000)), NDR)  # 2.5e-3
    assert ok is not None and not ok.degrading
    assert bad is not None and [v.signal for v in bad.at("degrading")] == ["out_of_buffer"]


def test_a_reset_or_a_wrap_is_not_a_burst() -> None:
    prev = CounterSample(10.0, {"symbol_error": 65_000, "link_downed": 7}, {"out_of_sequence": 4_294_967_000})
    cur = CounterSample(13.0, {"symbol_error": 0, "link_downed": 0}, {"out_of_sequence": 296})
    health = judge_port(prev, cur, NDR)
    assert health is not None and health.level == "ok"
    for signal in ("symbol_error", "link_downed", "out_of_sequence"):
        verdict = health.verdict(signal)
        assert verdict is not None and verdict.increase is None and verdict.note == "reset"


def test_a_saturated_counter_has_no_rate() -> None:
    prev = CounterSample(10.0, {"symbol_error": 65_535}, {})
    cur = CounterSample(13.0, {"symbol_error": 65_535}, {}, saturated=frozenset({"symbol_error"}))
    health = judge_port(prev, cur, NDR)
    assert health is not None
    verdict = health.verdict("symbol_error")
    assert verdict is not None and (verdict.level, verdict.note) == ("ok", "saturated")


def test_a_driver_without_the_counters_is_unsupported_never_an_error() -> None:
    health = judge_port(CounterSample(0.0, {}, {}), CounterSample(5.0, {}, {}), ROCE_100)
    assert health is not None
    assert health.level == "unsupported" and not health.degrading
    assert {v.signal for v in health.verdicts} == set(SIGNAL_NAMES)
    appeared = judge_port(CounterSample(0.0, {}, {}), CounterSample(5.0, {"symbol_error": 9}, {}), NDR)
    assert appeared is not None and appeared.level == "ok"


def test_no_window_no_judgement() -> None:
    sample = CounterSample(5.0, {"symbol_error": 1}, {})
    assert judge_port(sample, sample, NDR) is None
    assert judge_port(CounterSample(6.0, {}, {}), sample, NDR) is None  # clock went back


def test_context_joins_rate_aer_and_consumers() -> None:
    facts = PortFacts(
        "mlx5_0",
        1,
        "ibp1s0",
        "InfiniBand",
        200.0,
        4,
        True,
        below_rated=("port 200 Gb/s x4, rated 400 Gb/s x4 (config)",),
        aer_errors=17,
        consumers=("Slurm job 4242",),
    )
    health = judge_port(*_samples({"symbol_error": 400, "link_error_recovery": 2}, {}), facts)
    assert health is not None and health.degrading
    assert health.context == (
        "also below rated: port 200 Gb/s x4, rated 400 Gb/s x4 (config)",
        "its NIC reported 17 PCIe AER error(s) since boot",
        "used by Slurm job 4242",
    )
    assert health.summary().startswith("symbol_error +400 in 3 s (133/s, BER 6.7e-10), above BER 1e-12 or 120/h; ")


def test_samples_and_facts_from_the_model() -> None:
    port = Port(
        "mlx5_0",
        1,
        "InfiniBand",
        NumberedState(4, "ACTIVE"),
        NumberedState(5, "LinkUp"),
        LinkRate(400.0, 4, "NDR"),
        1,
        counters={"symbol_error": CounterValue(65_535, True), "link_downed": CounterValue(3)},
        hw_counters={"out_of_sequence": 7},
    )
    device = Device("mlx5_0", None, None, None, None, None, None, None, None, None, (port,), {"rx_icrc": 1})
    sample = CounterSample.of(device, port, 42.0)
    assert sample.pma == {"symbol_error": 65_535, "link_downed": 3}
    assert sample.hw == {"rx_icrc": 1, "out_of_sequence": 7}
    assert sample.saturated == {"symbol_error"}
    facts = PortFacts.of(device, port, aer_errors=2)
    assert (facts.rate_gbps, facts.lanes, facts.up, facts.aer_errors) == (400.0, 4, True, 2)
