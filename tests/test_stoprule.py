"""lab.model.stoprule on hand-computed series, the segment loop of lab.measure.adaptive with a fake
iperf3, the plan key `adaptive` and the repetition rule (issue 17). No root, no tools."""

from __future__ import annotations

import math

import pytest

from lab.core.errors import ConfigError
from lab.measure.adaptive import combine, receiver_rates, run_segments
from lab.campaign.load import load_plan
from lab.campaign.repstop import converged
from lab.model.stats import t_quantile
from lab.model.stoprule import (
    Rule,
    batch_means,
    evaluate,
    loss_decision,
    mean_interval,
    mser5,
    packets_for_loss,
    repetitions,
    wilson,
)


def test_t_quantiles_match_the_tables():
    assert t_quantile(0.975, 1) == pytest.approx(12.706, abs=1e-3)
    assert t_quantile(0.975, 4) == pytest.approx(2.776, abs=1e-3)
    assert t_quantile(0.975, 10) == pytest.approx(2.228, abs=1e-3)
    assert t_quantile(0.95, 20) == pytest.approx(1.725, abs=1e-3)
    with pytest.raises(ValueError):
        t_quantile(0.4, 5)


def test_mean_interval_by_hand():
    # mean 3, sd sqrt(2.5), t(0.975, 4) = 2.7764: half = 2.7764 * 1.5811 / sqrt(5) = 1.9632
    iv = mean_interval([1, 2, 3, 4, 5])
    assert iv.mean == 3 and iv.n == 5
    assert iv.half_width == pytest.approx(1.9632, abs=1e-4)
    assert iv.rel == pytest.approx(1.9632 / 3, abs=1e-4)
    assert mean_interval([7.0]) is None


def test_mser5_drops_the_ramp_and_nothing_of_a_flat_series():
    # batch means 0,10,10,10,10: keeping all gives 80/25 = 3.2, dropping the first 0
    assert mser5([0.0] * 5 + [10.0] * 20) == 5
    assert mser5([10.0] * 25) == 0
    assert mser5([1.0, 2.0, 3.0]) == 0  # fewer than two batches: nothing to choose
    assert batch_means([1, 2, 3, 4, 5], 2) == [1.5, 3.5]


FLAT = Rule(warmup_s=0.0)


def test_steady_series_stops_on_the_interval_after_the_minimum():
    series = [100.0, 102.0] * 6  # every 2 s batch is 101: zero spread
    early = evaluate(series[:8], FLAT, cap_s=300)
    assert not early.stop and early.reason == "continue" and early.more_s == 2.0
    d = evaluate(series, FLAT, cap_s=300)
    assert d.stop and d.reason == "ci" and d.batches == 6 and d.interval.half_width == 0


def test_noisy_series_asks_for_the_seconds_it_needs_or_stops_at_the_cap():
    series = [90.0, 90.0, 110.0, 110.0] * 2 + [90.0, 90.0]  # batches 90,110,90,110,90
    d = evaluate(series, FLAT, cap_s=300)
    # mean 98, sd sqrt(120) = 10.954, half = 2.7764 * 10.954 / sqrt(5) = 13.60 (13.9 %)
    assert not d.stop
    assert d.interval.rel == pytest.approx(13.60 / 98, abs=1e-3)
    # batches needed: (10.954 * 1.96 / (0.05 * 98))^2 = 19.2 -> 20; 15 more of 2 s
    assert d.more_s == 30.0
    capped = evaluate(series, FLAT, cap_s=10)
    assert capped.stop and capped.reason == "cap"


def test_wilson_interval_by_hand():
    lo, hi = wilson(0, 100)  # z^2 / (n + z^2) = 3.8415 / 103.8415
    assert lo == 0 and hi == pytest.approx(0.036994, abs=1e-5)
    lo, hi = wilson(5, 100)
    assert lo == pytest.approx(0.0215, abs=1e-4) and hi == pytest.approx(0.1118, abs=1e-4)


def test_packets_for_loss_are_computed():
    # no loss: z^2 / (2 (n + z^2)) <= 0.001  ->  n >= 1920.7 - 3.84 = 1916.9
    assert packets_for_loss(0.0, Rule()) == 1917
    # 0.5 % loss: target max(5 % of 0.005, 0.001) = 0.001; normal approximation
    # z^2 p (1 - p) / h^2 = 3.8415 * 0.004975 / 1e-6 = 19111; Wilson needs a little more
    n = packets_for_loss(0.005, Rule())
    assert 19111 <= n <= 19111 * 1.02
    met, more, info = loss_decision(0, 1000, Rule())
    assert not met and more == 917 and info["packets_needed"] == 1917
    assert loss_decision(3, 10, Rule(loss_abs=None))[0]  # recorded only


def test_repetitions_stop_on_their_interval_or_at_the_maximum():
    # [100, 101]: half = 12.706 * 0.7071 / sqrt(2) = 6.35 (6.3 %) -> go on
    assert repetitions([100.0, 101.0], Rule(), max_reps=5).reason == "continue"
    # [100, 101, 100.5]: half = 4.303 * 0.5 / sqrt(3) = 1.24 (1.2 %) -> stop
    assert repetitions([100.0, 101.0, 100.5], Rule(), max_reps=5).reason == "ci"
    assert repetitions([100.0, 120.0], Rule(), max_reps=2).reason == "cap"


def _part(rates: list[float], *, sent: int = 0, lost: int = 0) -> dict:
    ivs = [
        {"start": float(i), "end": i + 1.0, "bps": r, "omitted": False} for i, r in enumerate(rates)
    ]
    out = {
        "sender_bps": sum(rates) / len(rates),
        "receiver_bps": sum(rates) / len(rates),
        "retransmits": 1,
        "duration_s": len(rates),
        "intervals": ivs,
    }
    if sent:
        n = len(rates)
        out.update(packets_sent=sent, packets_lost=lost, packets_received=sent - lost)
        out.update(jitter_ms=0.1, sent_pps=sent / n, received_pps=(sent - lost) / n)
    return out


def test_segments_steady_one_noisy_several_capped():
    calls: list[float] = []

    def steady(seconds: float) -> dict:
        calls.append(seconds)
        return _part([100.0] * int(seconds))

    metrics, info = run_segments(steady, Rule(), cap_s=300)
    assert calls == [15.0] and info["reason"] == "ci" and info["measured_s"] == 15.0
    assert metrics["receiver_bps"] == 100.0 and metrics["retransmits"] == 1

    calls.clear()

    def noisy(seconds: float) -> dict:
        calls.append(seconds)
        n = 4 * math.ceil(seconds / 4)
        return _part([50.0, 50.0, 150.0, 150.0] * (n // 4), sent=100 * n)

    _, info = run_segments(noisy, Rule(), cap_s=40, udp=True)
    assert info["reason"] == "cap" and sum(calls) == 40.0 and len(calls) >= 2


def test_unsettled_tcp_runs_once_more_as_one_connection_of_the_full_length():
    """A new TCP connection starts faster than a loss-bound stream: segments would sum high.
    A first segment that does not settle is followed by one fixed-length run, which alone
    counts."""
    calls: list[float] = []

    def lossy(seconds: float) -> dict:
        calls.append(seconds)
        if len(calls) == 1:
            return _part([50.0, 50.0, 150.0, 150.0] * math.ceil(seconds / 4))
        return _part([3.0] * 5 + [2.0, 3.0] * int((seconds - 5) / 2))

    metrics, info = run_segments(lossy, Rule(), cap_s=40)
    assert calls == [15.0, 40.0]
    assert info["reason"] == "cap" and info["segments"] == 1 and info["fixed_after_s"] == 15.0
    # only the full run: (5 x 3 + 17 x (2 + 3)) / 40 s
    assert metrics["receiver_bps"] == pytest.approx((5 * 3 + 17 * 5) / 39)


def test_udp_segments_wait_for_the_packets_the_loss_interval_needs():
    calls: list[float] = []

    def udp(seconds: float) -> dict:
        calls.append(seconds)  # 100 packets/s, none lost: 1917 packets needed
        return _part([1e6] * int(seconds), sent=100 * int(seconds))

    metrics, info = run_segments(udp, Rule(), cap_s=60, udp=True)
    assert info["reason"] == "ci" and info["loss"]["packets"] >= 1917
    assert calls[0] == 15.0 and sum(calls) == 20.0  # 1500 sent, 417 more = 5 s
    assert metrics["packets_sent"] == 2000 and metrics["loss_pct"] == 0.0


def test_combine_weights_rates_by_seconds_and_sums_counts():
    m = combine([_part([10.0] * 2, sent=20, lost=2), _part([40.0] * 8, sent=80, lost=0)])
    assert m["receiver_bps"] == pytest.approx((10 * 2 + 40 * 8) / 10)
    assert m["packets_sent"] == 100 and m["loss_pct"] == 2.0 and m["retransmits"] == 2
    assert [iv["segment"] for iv in m["intervals"]] == [0, 0] + [1] * 8
    assert m["intervals"][-1]["end"] == 10.0


def test_plan_key_adaptive():
    fixed = load_plan("quick")
    assert all(not t.params.get("adaptive") for t in fixed.tests)
    assert load_plan("quick", ["adaptive=false"]).digest() == fixed.digest()
    on = load_plan("quick", ["adaptive=true"])
    by = {t.test: t.params for t in on.tests}
    assert by["tcp"]["adaptive"] and by["udp"]["adaptive"] and by["ping"]["adaptive"]
    assert "adaptive" not in by["mtu"]
    assert on.digest() != fixed.digest()
    with pytest.raises(ConfigError) as e:
        load_plan("quick", ["adaptive=maybe"])
    assert e.value.field == "adaptive" and "true, false" in str(e.value)


def test_repetition_rule_on_result_lines():
    plan = load_plan("quick", ["adaptive=true", "impairments=none", "profiles=baseline"])
    cases = [c for c in plan.cases() if c.test.test == "tcp"]
    assert [c.rep for c in cases] == [0, 1, 2]

    def line(rep: int, bps: float) -> dict:
        c = cases[rep]
        return {
            "profile": c.profile,
            "impairment": c.point.to_json(),
            "label": c.test.label,
            "ip": 4,
            "rep": rep,
            "ok": True,
            "records": [{"receiver_bps": bps}],
        }

    agree = [line(0, 100e6), line(1, 100.5e6)]
    info = converged(lambda: agree, cases[2], max_reps=3)
    assert info["reason"] == "ci" and info["values"] == [100e6, 100.5e6]
    apart = [line(0, 100e6), line(1, 150e6)]
    assert converged(lambda: apart, cases[2], max_reps=3) is None
    assert converged(lambda: agree[:1], cases[1], max_reps=3) is None  # at least two


def test_the_rule_reads_the_receivers_rates():
    client = [{"bps": 100.0, "omitted": False}]  # a UDP sender: its target rate
    server = [{"bps": 90.0, "omitted": False}, {"bps": 1.0, "omitted": True}]
    part = {"direction": "client-to-server", "intervals": client, "server_intervals": server}
    assert receiver_rates(part) == [90.0]
    assert receiver_rates({**part, "direction": "server-to-client"}) == [100.0]
    assert receiver_rates({"direction": "client-to-server", "intervals": client}) == [100.0]


def test_regenerative_interval_by_hand():
    from lab.model.stoprule import regenerative_interval

    rates = [9, 9, 1, 1, 2, 3, 1, 2, 4, 1, 2, 3]
    # cuts at 2, 5, 8, 11: cycles [1, 2, 3], [1, 2, 4], [1, 2, 3] (the samples before 2 and
    # the one at it belong to no whole cycle)
    iv = regenerative_interval(rates, [2, 5, 8, 11])
    assert iv.n == 3
    assert iv.mean == pytest.approx(19 / 9)
    # s^2 = ((6 - 19/3)^2 + (7 - 19/3)^2 + (6 - 19/3)^2) / 2 = 1/3; t(2) = 4.3027
    assert iv.half_width == pytest.approx(
        4.302653 * math.sqrt(1 / 3) / (3 * math.sqrt(3)), rel=1e-5
    )
    assert regenerative_interval(rates, [2, 5, 8]) is None  # two cycles: fewer than MIN_CYCLES


def test_regenerative_interval_is_wide_where_batches_inside_long_cycles_look_narrow():
    """Cycles of 20 s whose levels differ by 20 %: 2-s batch means over 60 s give a narrow
    interval (neighbouring batches of one ramp agree), the cycles a wide one."""
    from lab.model.stoprule import regenerative_interval

    rates, cuts = [], []
    for level in (200.0, 250.0, 210.0):
        rates += [level * (0.7 + 0.3 * i / 19) for i in range(20)]
        cuts.append(len(rates) - 1)
    batches = evaluate(rates, Rule(min_s=10, warmup_s=0), cap_s=300)
    regen = regenerative_interval(rates, [-1, *cuts])
    assert regen.n == 3
    assert regen.rel > 3 * batches.interval.rel
