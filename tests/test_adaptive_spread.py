"""bench/adaptive_spread.py: the adaptive TCP stop checked against fixed connections' spread."""

from __future__ import annotations

import random

from bench.adaptive_spread import analyse, pooled_var


def _doc(cases: dict[tuple[str, str], list[tuple[float, float]]]) -> dict:
    """A bench/adaptive_tcp.py file: per case, (fixed, adaptive) figures of its pairs."""
    out = []
    for (profile, point), pairs in cases.items():
        legs = [
            {
                # tcp's fixed leg: its interval's mean counts, not its whole-run rate
                "fixed": {"receiver_bps": 0.5 * f, "adaptive": {"interval": {"mean": f}}},
                "adaptive": {"receiver_bps": a, "adaptive": {"interval": {"mean": 2 * a}}},
            }
            for f, a in pairs
        ]
        out.append({"row": {"profile": profile, "condition": point}, **legs[0], "more": legs[1:]})
    return {"cases": out}


def _draw(bias: float, seed: int) -> dict:
    rnd = random.Random(seed)
    cases = {}
    for i in range(10):
        level = 10e6 * (i + 1)
        cases[(f"p{i}", "x")] = [
            (level * rnd.lognormvariate(0, 0.08), bias * level * rnd.lognormvariate(0, 0.08))
            for _ in range(3)
        ]
    return _doc(cases)


def test_pooled_variance_skips_single_legs():
    var, df = pooled_var([[1.0, 3.0], [5.0], [2.0, 2.0, 2.0]])
    assert df == 3
    assert var == 2.0 / 3


def test_an_unbiased_rule_lands_inside_and_shows_no_bias():
    x = analyse([_draw(1.0, 1)])
    assert x["legs"] == 30
    assert x["inside"] >= 26
    assert x["bias_low"] < 1.0 < x["bias_high"]


def test_a_rule_that_stops_30_percent_high_is_caught():
    x = analyse([_draw(1.3, 1)])
    assert x["inside"] <= 10
    assert x["bias_low"] > 1.15


def test_a_rule_that_scatters_more_is_caught():
    rnd = random.Random(2)
    cases = {
        (f"p{i}", "x"): [
            (1e8 * rnd.lognormvariate(0, 0.05), 1e8 * rnd.lognormvariate(0, 0.25)) for _ in range(3)
        ]
        for i in range(10)
    }
    x = analyse([_doc(cases)])
    assert x["dispersion_p"] < 0.01


def test_files_pool_per_case():
    a = _doc({("wg", "d"): [(100e6, 101e6)]})
    b = _doc({("wg", "d"): [(110e6, 104e6)], ("base", "d"): [(5e6, 5e6)]})
    x = analyse([a, b])
    rows = {(r["profile"], r["point"]): r for r in x["rows"]}
    assert [round(v) for v in rows[("wg", "d")]["fixed_mbit"]] == [100, 110]
    assert x["fixed_df"] == 1


def test_scp_legs_are_their_rates():
    doc = {"cases": [{
        "row": {"profile": "wg", "condition": "d"},
        "fixed": {"rate_bps": 50e6}, "adaptive": {"rate_bps": 52e6, "projected": True},
        "more": [{"fixed": {"rate_bps": 54e6}, "adaptive": {"rate_bps": 51e6}}],
    }]}  # fmt: skip
    [row] = analyse([doc])["rows"]
    assert [round(v, 6) for v in row["fixed_mbit"] + row["adaptive_mbit"]] == [50, 54, 52, 51]


def _leg(rates: list[float], events: list[float]) -> dict:
    return {
        "server_intervals": [
            {"start": float(i), "end": float(i + 1), "bps": r} for i, r in enumerate(rates)
        ],
        "adaptive": {"cycles": {"events_at_s": events, "timeouts_at_s": []}},
        "receiver_bps": sum(rates) / len(rates),
        "measured_s": float(len(rates)),
        "wall_s": len(rates) + 2.0,
    }


def test_replay_stops_at_a_cycles_end_and_sooner_at_a_wider_target():
    from bench.adaptive_spread import replay_leg
    from lab.model.stoprule import Rule

    rnd = random.Random(3)
    rates = [100e6 * rnd.uniform(0.8, 1.2) for _ in range(120)]
    events = [float(e) for e in range(4, 121, 4)]  # a congestion event every 4 s
    wide = replay_leg(_leg(rates, events), Rule(rel_half_width=0.10), 300)
    narrow = replay_leg(_leg(rates, events), Rule(rel_half_width=0.05), 300)
    assert wide is not None and narrow is not None and wide[1] < narrow[1]
    # each stop within a second of the last event before it (an event read at e s falls in
    # the rate of second e - 1)
    for _, t in (wide, narrow):
        last = max(int(e) - 1 for e in events if int(e) - 1 < t)
        assert t - 1 - last <= 1
    # no event at all in a swinging stream: never stopped (its window is not known to be steady)
    assert replay_leg(_leg(rates, []), Rule(rel_half_width=0.10), 300) is None


def _fixed_leg(rates_mbit: list[float], whole_mbit: float, events: list[float]) -> dict:
    """A fixed leg as bench/adaptive_tcp.py keeps it: the server's seconds, the whole-run
    rate, the congestion events the sender's readings saw."""
    return {
        "server_intervals": [
            {"start": i, "end": i + 1.0, "bps": r * 1e6, "omitted": False}
            for i, r in enumerate(rates_mbit)
        ],
        "receiver_bps": whole_mbit * 1e6,
        "adaptive": {"cycles": {"events_at_s": events, "timeouts_at_s": []}},
    }


def _sawtooth(seconds: int, period: int) -> tuple[list[float], list[float]]:
    """A cubic-like flow: each cycle ramps from 70 to 100 Mbit/s, a congestion event at its end."""
    rates = [70 + 30 * (i % period) / (period - 1) for i in range(seconds)]
    return rates, [float(t) + 0.1 for t in range(period, seconds + 1, period)]


def test_self_check_finds_no_bias_on_whole_cycles():
    from bench.adaptive_spread import self_check

    rates, events = _sawtooth(120, 12)
    leg = _fixed_leg(rates, sum(rates) / len(rates), events)
    doc = {"cases": [{"row": {"profile": "p", "condition": "x"}, "fixed": leg, "more": []}]}
    x = self_check([doc])
    assert x["stopped"] == 1
    # the stop comes at a cycle's end, so it keeps whole ramps: the run's mean
    assert abs(x["rows"][0]["ratio"] - 1) < 0.03


def test_self_check_compares_with_the_whole_run_not_with_itself():
    from bench.adaptive_spread import self_check

    rates, events = _sawtooth(120, 12)
    legs = [_fixed_leg(rates, 0.6 * sum(rates) / len(rates), events) for _ in range(3)]
    doc = {
        "cases": [
            {"row": {"profile": "p", "condition": "x"}, "fixed": legs[0],
             "more": [{"fixed": leg} for leg in legs[1:]]}
        ]
    }  # fmt: skip
    x = self_check([doc])
    assert x["stopped"] == 3
    assert x["low"] > 1.5


def test_replay_applies_the_live_cycle_rule_to_recorded_readings():
    """With the sender's readings kept, the replay asks lab.measure.tcpsender's own rule: a flow
    whose window keeps growing without a congestion event never stops, however steady its
    rates look (the stand-in for older records would have stopped it)."""
    from bench.adaptive_spread import replay_leg
    from lab.measure.tcpsender import Cycles, SenderState
    from lab.model.stoprule import Rule

    rates = [100.0] * 60
    leg = _fixed_leg(rates, 100.0, [])
    growing = Cycles()
    for i in range(60):
        growing.add(i + 1.1, SenderState("cubic", 100 + 10 * i, None, None, None))
    leg["adaptive"]["cycles"]["sender_readings"] = growing.record(0.0)
    assert replay_leg(leg, Rule(min_s=10), cap_s=60.0) is None
    steady = Cycles()
    for i in range(60):
        steady.add(i + 1.1, SenderState("cubic", 500, None, None, None))
    leg["adaptive"]["cycles"]["sender_readings"] = steady.record(0.0)
    got = replay_leg(leg, Rule(min_s=10), cap_s=60.0)
    assert got is not None and got[1] < 30
    assert Cycles.from_record(steady.record(0.0)).readings[3][1].cwnd == 500


def test_fixed_legs_of_other_runs_widen_the_pool_but_not_the_adaptive_legs():
    new = _draw(1.0, 3)
    for case in new["cases"]:
        case["more"] = []  # one pair per case: no fixed spread of its own
    assert analyse([new])["fixed_df"] == 0
    x = analyse([new], [_draw(1.0, 4)])
    assert x["fixed_df"] == 30  # 10 cases x (1 + 3 - 1)
    assert x["legs"] == 10  # only the new file's adaptive legs are judged
