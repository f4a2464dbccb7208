"""Link health: the error-counter signals judged, and their limits, declared once.

`detect/link_health.py` judges with them; the host dashboard and the alert rules are built from
and tested against them (`tests/dashboards/test_link_health_alerts.py`).

Thresholds and where they come from (`LinkHealthThresholds`, configurable in the config file's
`[link_health]`):

- `symbol_error`: a bit-error-rate estimate, BER = errors / bits carried in the window, with
  bits = the port's `rate` Gb/s (lanes x per-lane data rate, e.g. 4X NDR = 4 x 100) x 1e9 x
  seconds. The limit is 1e-12, the lane BER the IBTA Architecture Specification Vol. 2 (physical
  layer) requires of SDR to EDR links; FEC-protected HDR/NDR links count in `symbol_error` what
  the FEC did not correct, and the same 1e-12 is kept for them (our choice: stricter than any
  pre-FEC figure). NVIDIA NVSentinel flags `symbol_error` above 120 an hour as an IBTA BER
  violation; 120/h is 1e-12 at 33 Gb/s (a QDR 4X link), so on faster links it is the stricter of
  the two and both apply. The estimate uses the data rate, not the raw line rate, so it reads
  slightly high (conservative). A window needs `min_errors` (3) errors before either applies: on
  a few-second window one stray error would otherwise "exceed" 1e-12 (at BER 1e-12 on 100 Gb/s,
  3 errors in 3 s happen with probability 0.4%).
- `link_error_recovery`, `link_downed`, `local_link_integrity_errors`,
  `excessive_buffer_overrun_errors`: any increase is degrading. A healthy link never retrains or
  drops while up; the last two already count threshold crossings (IBTA PortCounters: local
  physical errors beyond LocalPhyErrors, overrun periods beyond OverrunErrors), and they are 4-bit
  counters that saturate at 15.
- `port_rcv_errors`, `port_rcv_remote_physical_errors`: damaged packets; the NVSentinel ceiling
  (120/h) with `min_errors`, as for symbol errors.
- `port_xmit_discards`, `port_xmit_wait`, `np_ecn_marked_roce_packets`, `np_cnp_sent`,
  `rp_cnp_handled`: congestion, shown, never a fault.
- RoCE retransmissions and sequence errors (`out_of_sequence`, `packet_seq_err`,
  `implied_nak_seq_err`, `roce_adp_retrans`, `local_ack_timeout_err`, `rnr_nak_retry_err`; rxe's
  `rcvd_seq_err`, `out_of_seq_request`, `comp_retry`): degrading above 1e-4 of the port's packets
  (both directions), with at least 10 in the window; where no packet counter exists, above 1 per
  second. Reasoning: a lossless RoCE fabric retransmits next to never; one go-back-N
  retransmission resends up to a window of packets, so 1e-4 already costs about a percent of
  goodput and is far above the sporadic reordering of a healthy busy port (MiaAI-Lab PR #115's
  hung AllReduce showed thousands).
- `req_transport_retries_exceeded` (rxe: `retry_exceeded_err`): any increase is critical: a QP
  exhausted its retries (IBV_WC_RETRY_EXC_ERR) and the job using it is failing now.
- The daemon's events (`rnic.port.degrading` / `rnic.port.recovered`) judge windows of
  `window_seconds` (60 s: long enough that `min_errors` is not one burst, short enough to warn
  minutes before the alerts' 5-minute rates) and call a port recovered after
  `clear_after_seconds` (900 s) without a bad window, as the flap detector does.
- Receive drops `out_of_buffer`, `rx_discards_phy`: degrading above 1e-3 of received packets with
  at least 100 in the window. `out_of_buffer` also counts a receiver that did not post buffers in
  time (an application matter), hence the laxer ratio than retransmissions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Literal

Kind = Literal["ber", "event", "errors", "congestion", "transport", "fatal", "drops"]


@dataclass(frozen=True, slots=True)
class LinkHealthThresholds:
    """The limits, each named as its `[link_health]` key in the config file."""

    symbol_error_ber: float = 1e-12  # IBTA Vol. 2 lane BER, SDR..EDR
    errors_per_hour: float = 120.0  # NVSentinel's symbol_error ceiling; also rcv/remote physical errors
    min_errors: int = 3  # errors a window needs before a rate is judged
    retransmission_ratio: float = 1e-4  # retransmissions per packet (both directions)
    retransmissions_per_second: float = 1.0  # where the port has no packet counter
    min_retransmissions: int = 10
    drop_ratio: float = 1e-3  # receive drops per received packet
    min_drops: int = 100
    check_window_seconds: float = 3.0  # `check`: seconds between its two counter reads
    window_seconds: float = 60.0  # the daemon's events: counters judged over windows this long
    clear_after_seconds: float = 900.0  # and a degrading port recovered after this long without a bad one

    def with_overrides(self, overrides: Mapping[str, float]) -> LinkHealthThresholds:
        """These thresholds with the config file's values; unknown keys are the file parser's problem."""
        values: dict[str, float | int] = {f.name: getattr(self, f.name) for f in fields(self)}
        for key, value in overrides.items():
            if key in values:
                values[key] = int(value) if key.startswith("min_") else float(value)
        return LinkHealthThresholds(**values)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Signal:
    name: str  # the verdict's name: the first of `counters`
    kind: Kind
    counters: tuple[str, ...]  # kernel file names, the first present is read (driver aliases after it)
    pma: bool  # counters/ (PMA) rather than hw_counters/


def _s(kind: Kind, pma: bool, *counters: str) -> Signal:
    return Signal(counters[0], kind, counters, pma)


SIGNALS: tuple[Signal, ...] = (
    _s("ber", True, "symbol_error"),
    _s("event", True, "link_error_recovery"),
    _s("event", True, "link_downed"),
    _s("errors", True, "port_rcv_errors"),
    _s("event", True, "local_link_integrity_errors"),
    _s("event", True, "excessive_buffer_overrun_errors"),
    _s("errors", True, "port_rcv_remote_physical_errors"),
    _s("congestion", True, "port_xmit_discards"),
    _s("congestion", True, "port_xmit_wait"),
    _s("transport", False, "out_of_sequence", "out_of_seq_request"),
    _s("transport", False, "packet_seq_err", "rcvd_seq_err"),
    _s("transport", False, "implied_nak_seq_err"),
    _s("transport", False, "roce_adp_retrans", "comp_retry"),
    _s("transport", False, "local_ack_timeout_err"),
    _s("transport", False, "rnr_nak_retry_err"),
    _s("fatal", False, "req_transport_retries_exceeded", "retry_exceeded_err"),
    _s("drops", False, "out_of_buffer"),
    _s("drops", False, "rx_discards_phy"),
    _s("congestion", False, "np_ecn_marked_roce_packets"),
    _s("congestion", False, "np_cnp_sent"),
    _s("congestion", False, "rp_cnp_handled"),
)
SIGNAL_NAMES: tuple[str, ...] = tuple(s.name for s in SIGNALS)
