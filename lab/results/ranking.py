"""The report's Recommendation (study D): per network condition, the best VPN profile by what the
plan's tests declare they rank (lab.measure.base.RANKS: throughput, RTT), with the runner-up,
the margin and the no-VPN baseline for reference."""

from __future__ import annotations

from lab.results.doc import fmt_value, in_order, mean_of, ranks, rows_where, stats_of


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
        "margin show whether the difference is within the spread (marked 'within 1 sd')."
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
            ranked = sorted(
                (
                    (m, p)
                    for p in vpns
                    if (
                        m := mean_of(
                            [
                                r["throughput_bps"]
                                for r in rows_where(
                                    table, test_label=thr, profile=p, impairment=pt, ok=True
                                )
                            ]
                        )
                    )
                    is not None
                ),
                reverse=True,
            )
            if ranked:
                best = ranked[0]
                ru = ranked[1] if len(ranked) > 1 else None
                margin = f"{100 * (best[0] / ru[0] - 1):.0f} %" if ru and ru[0] else "-"
                sd = stats_of(
                    [
                        r["throughput_bps"]
                        for r in rows_where(
                            table, test_label=thr, profile=best[1], impairment=pt, ok=True
                        )
                    ]
                )["sd"]
                if ru and sd and best[0] - sd <= ru[0]:
                    margin += " (within 1 sd)"
                row += [best[1], fmt_value(best[0] / 1e6), ru[1] if ru else "-", margin]
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
