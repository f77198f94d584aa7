"""The report's Summary and Recommendation (study D): per network condition, the best VPN profile
by what the plan's tests declare they rank (lab.measure.base.RANKS: throughput, RTT), with the
runner-up, the margin, whether it is beyond the noise (the Welch test of `lab check`) and the
no-VPN baseline for reference."""

from __future__ import annotations

from lab.model.stats import welch_worse
from lab.results.doc import fmt_value, in_order, mean_of, primary, ranks, rows_where
from lab.results.expect import DEFAULT_ALPHA


def recommendation_section(doc, table, profiles, points, labels, manifest) -> None:
    """Best profile per network condition (study D): the highest mean of the main throughput
    test, the lowest mean RTT; the no-VPN baseline is shown for reference but not ranked."""
    tests = {r["test_label"]: r["test"] for r in table}
    thr = next((lb for lb in labels if ranks(tests.get(lb, "")) == "throughput"), None)
    lat = next((lb for lb in labels if ranks(tests.get(lb, "")) == "rtt"), None)
    if thr is None and lat is None:
        return
    drivers = {p: (manifest.get("profiles") or {}).get(p, {}).get("driver") for p in profiles}
    # the no-VPN baseline is never ranked, not even when it is the only profile
    vpns = [p for p in profiles if drivers.get(p) not in ("none", None)]
    base = [p for p in profiles if drivers.get(p) == "none"]
    if not vpns:
        return
    doc.h("Recommendation")
    ranked_by = " and ".join(
        ([f"the highest mean throughput in `{thr}`"] if thr else [])
        + ([f"the lowest mean RTT in `{lat}`"] if lat else [])
    )
    doc.p(
        f"For each network condition, the VPN profile with {ranked_by}. The runner-up and the "
        "margin say how far ahead it is; a margin within the noise (the Welch test of the "
        "Summary) or measured once is marked so."
        + (f" The no-VPN {base[0]} is shown for reference and not ranked." if base else "")
    )
    header = ["condition"]
    if thr:
        header += ["best throughput", "Mbit/s", "runner-up", "margin"]
    if lat:
        header += ["lowest RTT", "ms"]
    if base:
        header += [f"{base[0]} Mbit/s"]
    rows = []
    for pt in in_order([r["impairment"] for r in table], points):
        row = [pt]
        if thr:
            c = contest(table, thr, tests[thr], vpns, pt)
            if c is not None:
                margin = f"{c['margin_pct']:.0f} %" if c.get("margin_pct") is not None else "-"
                if c["verdict"] == "within the noise":
                    margin += f" (within the noise, Welch p = {c['p']:.2g})"
                elif c["verdict"] == "one repetition":
                    margin += " (n=1: no winner declared)"
                row += [c["best"], fmt_value(c["best_mean"] / 1e6), c["runner_up"] or "-", margin]
            else:
                row += ["-", "-", "-", "-"]
        if lat:
            ranked = sorted(
                (m, p)
                for p in vpns
                if (
                    m := mean_of(
                        [
                            r["rtt_avg_ms"]
                            for r in rows_where(
                                table, test_label=lat, profile=p, impairment=pt, ok=True
                            )
                        ]
                    )
                )
                is not None
            )
            row += [ranked[0][1], fmt_value(ranked[0][0])] if ranked else ["-", "-"]
        if base:
            b = (
                mean_of(
                    [
                        r["throughput_bps"]
                        for r in rows_where(
                            table, test_label=thr, profile=base[0], impairment=pt, ok=True
                        )
                    ]
                )
                if thr
                else None
            )
            row.append(fmt_value(b / 1e6) if b else "-")
        rows.append(row)
    doc.table(header, rows)


# ---------------------------------------------------------------------- the summary


def _vals(table, label, col, prof, pt) -> list[float]:
    return [
        r[col]
        for r in rows_where(table, test_label=label, profile=prof, impairment=pt, ok=True)
        if r[col] is not None
    ]


def contest(table, label: str, test: str, profs: list[str], pt: str) -> dict | None:
    """The best and the runner-up of `profs` on `label` under condition `pt` by the test's
    primary metric, and whether the winner is ahead beyond the noise: `lab check`'s rule, a
    one-sided Welch t-test over the repetitions (lab.model.stats.welch_worse) at its default
    alpha. None when no profile measured anything."""
    col, _, _, hib = primary(test)
    got = [(p, v) for p in profs if (v := _vals(table, label, col, p, pt))]
    if not got:
        return None
    got.sort(key=lambda pv: mean_of(pv[1]), reverse=hib)
    (best, bv), ru = got[0], (got[1] if len(got) > 1 else None)
    out = {"best": best, "best_mean": mean_of(bv), "n": len(bv), "runner_up": None}
    if ru is None:
        out["verdict"] = "alone"
        return out
    rv = ru[1]
    out.update(runner_up=ru[0], runner_up_mean=mean_of(rv), runner_up_n=len(rv))
    out["margin_pct"] = (
        100 * abs(out["best_mean"] / out["runner_up_mean"] - 1) if out["runner_up_mean"] else None
    )
    if len(bv) < 2 or len(rv) < 2:
        out["verdict"] = "one repetition"
        return out
    w = welch_worse(bv, rv, hib)
    out["p"] = w.p
    out["verdict"] = "beyond the noise" if w.p < DEFAULT_ALPHA else "within the noise"
    return out


def _verdict_text(c: dict) -> str:
    v = c["verdict"]
    if v == "beyond the noise":
        return f"{c['best']} wins: beyond the noise (Welch p = {c['p']:.2g} < {DEFAULT_ALPHA:g})"
    if v == "within the noise":
        return f"no winner: within the noise (Welch p = {c['p']:.2g})"
    if v == "one repetition":
        return "no winner declared: one repetition, no spread to judge the difference by"
    return f"{c['best']} (the only VPN profile measured)"


def summary_section(doc, table, profiles, points, plan, manifest) -> None:
    """The answer first: per network condition and ranked test, which VPN profile is ahead, by
    how much, and whether the difference is beyond the noise (the rule `lab check` uses); with
    one repetition no winner is declared. The no-VPN baseline is shown, not ranked."""
    tests = {t["label"]: t["test"] for t in plan.get("tests", [])}
    labels = [lb for lb, t in tests.items() if ranks(t) and rows_where(table, test_label=lb)]
    drivers = {p: (manifest.get("profiles") or {}).get(p, {}).get("driver") for p in profiles}
    vpns = [p for p in profiles if drivers.get(p) not in ("none", None)]
    base = next((p for p in profiles if drivers.get(p) == "none"), None)
    # swept points are drawn against their value (plots), not ranked one by one
    conds = in_order([r["impairment"] for r in table if not r["sweep_parameter"]], points)
    if not labels or not vpns or not conds:
        return
    rows, single = [], False
    for pt in conds:
        for lb in labels:
            c = contest(table, lb, tests[lb], vpns, pt)
            if c is None:
                continue
            _, unit, scale, hib = primary(tests[lb])
            unit = unit.split()[0]
            ahead = f"{c['best']} {fmt_value(c['best_mean'] * scale)}"
            if c["runner_up"]:
                ahead += (
                    f" vs {c['runner_up']} {fmt_value(c['runner_up_mean'] * scale)}"
                    + (f" ({c['margin_pct']:.0f} % {'ahead' if hib else 'lower'})"
                       if c["margin_pct"] is not None else "")
                )  # fmt: skip
            single |= c["verdict"] == "one repetition"
            ref = "-"
            if base and (bv := _vals(table, lb, primary(tests[lb]).column, base, pt)):
                bm = mean_of(bv)
                ref = fmt_value(bm * scale)
                if (c["best_mean"] > bm) if hib else (c["best_mean"] < bm):
                    ref += " (the VPN did better than no VPN: noise, or a disturbed baseline)"
            rows.append([pt, f"{lb} ({unit})", ahead, _verdict_text(c)] + ([ref] if base else []))
    if not rows:
        return
    doc.h("Summary")
    doc.p(
        "Per network condition and test, the VPN profile ahead on the test's main metric, the "
        "runner-up and the margin, and whether the difference is beyond the noise: the rule "
        f"`lab check` uses, a one-sided Welch t-test over the repetitions (p < {DEFAULT_ALPHA:g})."
        + (f" The no-VPN {base} is shown for reference and not ranked." if base else "")
    )
    if single:
        doc.p(
            "**No winner is declared where a profile ran once:** one repetition has no spread, "
            "so a difference of any size may be noise. Run at least 3 repetitions (`reps`) to "
            "decide."
        )
    doc.table(
        ["condition", "test", "ahead (mean)", "verdict"] + ([f"{base} (no VPN)"] if base else []),
        rows,
    )
