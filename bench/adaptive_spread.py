"""The adaptive TCP stop against the spread of fixed-length connections (issue 33 item 5).

    .venv/bin/python bench/adaptive_tcp.py --spread FILE [FILE ...]

bench/adaptive_tcp.py's first check puts each adaptive result inside ONE fixed connection's
95 % interval, the batch-means interval of that connection's own per-second rates. That interval
says where that connection's long-run rate lies, not where another connection's does: two
connections of the same case differ by more (the sender's congestion history, this shared
machine's other work), and the adaptive leg is another connection. So this check asks what the
fixed method itself would give: does an adaptive result lie where a further fixed connection of
the same case would?

Every fixed and adaptive leg of every FILE is pooled per case (profile, point): legs of one
run (`--pairs K`) and of separate runs of the same bench. Figures are taken as logarithms (a
relative spread, the same across cases of 2 and of 600 Mbit/s). Then:

- **fixed spread**: the pooled within-case variance of the fixed legs' log figures,
  s_f^2 = sum over cases of (n_f - 1) var_f / sum (n_f - 1) (cases with two or more fixed legs;
  its degrees of freedom are that denominator). A case whose fixed legs do not vary (a window-
  limited flow: the same rate to the bit) pools a zero and narrows everyone's interval.
- **inside**: each adaptive leg's log figure within the 95 % prediction interval of one more
  fixed leg of its case: mean_f +- t(df) s_f sqrt(1 + 1/n_f). The count is the analogue of
  the first check's 9-of-10 goal; with an unbiased rule about 95 % land inside.
- **bias**: the mean over cases of (mean log adaptive - mean log fixed), with its t interval
  over the cases (df = cases - 1): a rule that stops in a phase that is systematically fast or
  slow shows here, as a ratio.
- **dispersion**: the adaptive legs' pooled within-case variance s_a^2 against s_f^2; an
  F-test's one-sided p-value that adaptive results scatter more than fixed ones (a rule that
  stops early on a lucky stretch scatters more). Needs cases with two or more adaptive legs.

Assumptions, stated: the cases share one relative spread (pooling); legs of separate runs are
as independent as legs of one run (the machine's load between runs adds to both kinds alike);
the fixed leg's figure is its interval's mean (after its warm-up), the adaptive leg's its
receiver rate after the rule's warm-up, as in the first check.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

from scipy import stats

from lab.measure.tcpsender import CYCLE_END_S, MIN_EPOCHS, Cycles, timeouts_settled
from lab.model.stoprule import Rule, evaluate, mean_interval


def figure(leg: dict, mode: str) -> float:
    """A leg's figure in bit/s: tcp's fixed leg its interval's mean (after its warm-up), tcp's
    adaptive leg its receiver rate; an scp copy (bench/adaptive_scp.py) its rate_bps."""
    if "receiver_bps" not in leg:
        return leg["rate_bps"]
    return leg["adaptive"]["interval"]["mean"] if mode == "fixed" else leg["receiver_bps"]


def legs(doc: dict) -> dict[tuple[str, str], dict[str, list[float]]]:
    """Per (profile, point): the fixed and adaptive legs' figures in bit/s of one bench file."""
    out: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(
        lambda: {"fixed": [], "adaptive": []}
    )
    for case in doc["cases"]:
        key = (case["row"]["profile"], case["row"]["condition"])
        for pair in [{"fixed": case["fixed"], "adaptive": case["adaptive"]}, *case.get("more", [])]:
            for mode in ("fixed", "adaptive"):
                out[key][mode].append(figure(pair[mode], mode))
    return out


def pooled_var(groups: list[list[float]]) -> tuple[float, int]:
    """(pooled within-group variance, its degrees of freedom) over groups of two or more."""
    ss, df = 0.0, 0
    for g in groups:
        if len(g) >= 2:
            m = sum(g) / len(g)
            ss += sum((x - m) ** 2 for x in g)
            df += len(g) - 1
    return (ss / df if df else math.nan), df


def _log_interval(values: list[float]) -> tuple[float, float, float]:
    """(mean, 95 % t half-width, sd) of log figures (lab.model.stoprule.mean_interval); nan
    where there are too few."""
    if not values:
        return math.nan, math.nan, math.nan
    iv = mean_interval(values)
    if iv is None:
        return values[0], math.nan, math.nan
    return iv.mean, iv.half_width, statistics.stdev(values)


def analyse(docs: list[dict], fixed_only: list[dict] = ()) -> dict:
    """The check's figures over the pooled legs of `docs` (see the module's docstring);
    `fixed_only` adds its files' fixed legs alone (earlier runs of the same cases, whose
    adaptive legs ran another rule)."""
    cases: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(
        lambda: {"fixed": [], "adaptive": []}
    )
    for doc in docs:
        for key, got in legs(doc).items():
            cases[key]["fixed"] += got["fixed"]
            cases[key]["adaptive"] += got["adaptive"]
    for doc in fixed_only:
        for key, got in legs(doc).items():
            cases[key]["fixed"] += got["fixed"]
    logs = {
        k: {m: [math.log(x) for x in v[m] if x > 0] for m in ("fixed", "adaptive")}
        for k, v in cases.items()
    }
    var_f, df_f = pooled_var([v["fixed"] for v in logs.values()])
    var_a, df_a = pooled_var([v["adaptive"] for v in logs.values()])
    t = stats.t.ppf(0.975, df_f) if df_f else math.nan
    rows, diffs = [], []
    for (profile, point), v in logs.items():
        f, ad = v["fixed"], v["adaptive"]
        if not f or not ad:
            continue
        mf = sum(f) / len(f)
        half = t * math.sqrt(var_f * (1 + 1 / len(f))) if df_f else math.nan
        inside = [abs(x - mf) <= half for x in ad]
        diffs.append(sum(ad) / len(ad) - mf)
        rows.append({
            "profile": profile, "point": point,
            "fixed_mbit": [math.exp(x) / 1e6 for x in f],
            "adaptive_mbit": [math.exp(x) / 1e6 for x in ad],
            "low_mbit": math.exp(mf - half) / 1e6, "high_mbit": math.exp(mf + half) / 1e6,
            "inside": inside,
        })  # fmt: skip
    bias, bh, _ = _log_interval(diffs)
    f_p = stats.f.sf(var_a / var_f, df_a, df_f) if df_a and df_f and var_f > 0 else math.nan
    return {
        "rows": rows,
        "fixed_rel_sd": math.sqrt(var_f) if df_f else math.nan,
        "fixed_df": df_f,
        "adaptive_rel_sd": math.sqrt(var_a) if df_a else math.nan,
        "adaptive_df": df_a,
        "dispersion_p": f_p,
        "bias_ratio": math.exp(bias),
        "bias_low": math.exp(bias - bh),
        "bias_high": math.exp(bias + bh),
        "inside": sum(sum(r["inside"]) for r in rows),
        "legs": sum(len(r["inside"]) for r in rows),
    }


def spread(docs: list[dict], names: list[str], fixed_only: list[dict] = (),
           fixed_names: list[str] = ()) -> int:  # fmt: skip
    """Print the check over the pooled legs of `docs` (bench/adaptive_tcp.py --spread)."""
    x = analyse(docs, fixed_only)
    print(f"pooled: {', '.join(names)}")
    if fixed_names:
        print(f"fixed legs also from: {', '.join(fixed_names)}")
    print(
        "| profile | point | fixed legs, Mbit/s | where one more fixed leg lands (95 %) "
        "| adaptive legs, Mbit/s | inside |"
    )
    print("|---|---|---|---|---|---|")
    for r in x["rows"]:
        fx = ", ".join(f"{v:.4g}" for v in r["fixed_mbit"])
        ad = ", ".join(f"{v:.4g}" for v in r["adaptive_mbit"])
        print(
            f"| {r['profile']} | {r['point']} | {fx} | [{r['low_mbit']:.4g}, "
            f"{r['high_mbit']:.4g}] | {ad} | {sum(r['inside'])}/{len(r['inside'])} |"
        )
    print(
        f"\ninside: {x['inside']}/{x['legs']} adaptive legs within where one more fixed leg of "
        f"their case lands (95 %); the fixed legs' relative spread {100 * x['fixed_rel_sd']:.1f} % "
        f"(df {x['fixed_df']}), the adaptive legs' {100 * x['adaptive_rel_sd']:.1f} % "
        f"(df {x['adaptive_df']}); p(adaptive scatters more) = {x['dispersion_p']:.2f}; "
        f"adaptive / fixed = x{x['bias_ratio']:.3f} [{x['bias_low']:.3f}, {x['bias_high']:.3f}]"
    )
    return 0


# ------------------------------------------------------------------ replay at another target


def _leg_cycles(leg: dict) -> dict:
    ad = leg["adaptive"]
    return ad.get("stopped_early_because") or ad.get("cycles") or {}


def replay_leg(leg: dict, rule: Rule, cap_s: float) -> tuple[float, int] | None:
    """(the figure in bit/s, the seconds) tcp's streaming stop at `rule` would have given on
    this leg's receiver seconds, or None when it would not have stopped within them (the
    leg's own figure and seconds then stand). Replayed, not run: the interval on iperf3's whole server seconds
    (standing in for the live ss rates), and the sender's conditions from what the leg kept
    (`sender_readings`: the live rules themselves, lab.measure.tcpsender.Cycles.settled and
    whole_cycles, the regenerative interval over whole cycles included; a record
    from before them has `events_at_s`: two events in the kept seconds, the stop within
    CYCLE_END_S of the last, none only where the kept rates are steady, a relative sd under
    2 %, standing in for the window the live rule reads), `timeouts_at_s` for the timeout rule
    as live."""
    from bench.adaptive_tcp import whole_seconds

    rates = [iv["bps"] for iv in whole_seconds(leg["server_intervals"])]
    cyc = _leg_cycles(leg)
    events = [int(e) - 1 for e in cyc.get("events_at_s") or []]
    rtos = [int(e) - 1 for e in cyc.get("timeouts_at_s") or []]
    readings = cyc.get("sender_readings")
    for t in range(1, len(rates) + 1):
        d = evaluate(rates[:t], rule, cap_s=cap_s)
        if not (d.stop and d.reason == "ci"):
            continue
        w = d.warmup_samples
        kept = rates[w:t]
        ev = [i for i in events if w <= i < t]
        first = w
        if readings:
            # the live rule on the readings up to second t (a reading at s ends second int(s)-1)
            cycles = Cycles.from_record([r for r in readings if r[0] < t + 1])
            if not cycles.settled(float(w))[0]:
                continue
            whole = cycles.whole_cycles(rates[:t], [i + 1.0 for i in range(t)], w, rule)
            if whole is not None:
                if not whole[0]:
                    continue
                first = whole[1]
        elif len(ev) >= MIN_EPOCHS:
            if t - 1 - ev[-1] > CYCLE_END_S:
                continue
        elif ev:
            continue
        else:
            m = sum(kept) / len(kept)
            sd = math.sqrt(sum((x - m) ** 2 for x in kept) / max(len(kept) - 1, 1))
            if not m or sd / m >= 0.02:
                continue
        ok, _ = timeouts_settled(kept, [i - w for i in rtos if w <= i < t], rule=rule)
        if ok:
            kept = rates[first:t]  # from the first whole cycle's start where cycles decided
            return sum(kept) / len(kept), t
    return None


def replayed(doc: dict, rel_pct: float, min_s: float = 10.0) -> dict:
    """`doc` with every adaptive leg's figure replaced by replay_leg's at +-rel_pct (a leg
    that would not have stopped keeps its own figure)."""
    rule = Rule(rel_half_width=rel_pct / 100, min_s=min_s)
    cap = doc.get("cap_s", 300.0)
    out = []
    for case in doc["cases"]:
        new = dict(case)
        for pair in [new, *(new.get("more") or [])]:
            leg = dict(pair["adaptive"])
            got = replay_leg(leg, rule, cap)
            if got is not None:
                overhead = max(0.0, leg["wall_s"] - leg["measured_s"])
                leg.update(receiver_bps=got[0], measured_s=float(got[1]), stop_reason="ci",
                           wall_s=got[1] + overhead)  # fmt: skip
            pair["adaptive"] = leg
        new["more"] = [dict(p) for p in new.get("more") or []]
        out.append(new)
    return {**doc, "cases": out}


# ------------------------------------------------------------------ the rule on one connection


def self_check(docs: list[dict], rel_pct: float = 5.0, min_s: float = 10.0) -> dict:
    """The stop rule replayed on each FIXED leg's own seconds (replay_leg), against the same
    connection's whole-run rate: a paired check, free of the spread between connections that
    `analyse` has to allow for. Where a rule stops in a phase of the sender's cycle that is
    systematically fast or slow, the ratios lean one way; only the leg's own length limits
    it (a 60-s leg holds two or three cycles of a delayed cubic flow, a 300-s leg a dozen).

    Per leg: the figure where the rule would have stopped, its seconds, the connection's
    whole-run receiver rate (the figure the study reports) and the ratio; overall the mean
    log ratio over the legs that stopped, with its t interval (legs as independent)."""
    rule = Rule(rel_half_width=rel_pct / 100, min_s=min_s)
    rows, logs = [], []
    for doc in docs:
        for case in doc["cases"]:
            for pair in [case, *(case.get("more") or [])]:
                leg = pair["fixed"]
                n = len(leg.get("server_intervals") or [])
                got = replay_leg(leg, rule, cap_s=float(n)) if n else None
                whole = leg["receiver_bps"]
                row = {
                    "profile": case["row"]["profile"], "point": case["row"]["condition"],
                    "seconds": n, "whole_mbit": whole / 1e6,
                    "stopped_s": got[1] if got else None,
                    "stopped_mbit": got[0] / 1e6 if got else None,
                    "ratio": got[0] / whole if got and whole else None,
                }  # fmt: skip
                rows.append(row)
                if row["ratio"]:
                    logs.append(math.log(row["ratio"]))
    m, h, sd = _log_interval(logs)
    return {
        "rows": rows, "stopped": len(logs), "legs": len(rows), "ratio": math.exp(m),
        "low": math.exp(m - h), "high": math.exp(m + h), "rel_sd": sd,
    }  # fmt: skip


def print_self_check(docs: list[dict], names: list[str], rel_pct: float) -> int:
    """Print self_check (bench/adaptive_tcp.py --self)."""
    x = self_check(docs, rel_pct)
    print(f"the rule at +-{rel_pct:g} % replayed on the fixed legs of: {', '.join(names)}")
    print("| profile | point | leg s | whole-run Mbit/s | rule stops at s | there Mbit/s | ratio |")
    print("|---|---|---|---|---|---|---|")
    for r in x["rows"]:
        at = "-" if r["stopped_s"] is None else f"{r['stopped_s']}"
        fig = "-" if r["stopped_mbit"] is None else f"{r['stopped_mbit']:.4g}"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        print(f"| {r['profile']} | {r['point']} | {r['seconds']} | {r['whole_mbit']:.4g} | {at} "
              f"| {fig} | {ratio} |")  # fmt: skip
    print(
        f"\n{x['stopped']} of {x['legs']} legs stopped before their end; stopped / whole run = "
        f"x{x['ratio']:.3f} [{x['low']:.3f}, {x['high']:.3f}] (95 %, t over the legs), "
        f"relative sd {100 * x['rel_sd']:.1f} %"
    )
    return 0
