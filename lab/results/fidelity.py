"""How well an emulated run (A) predicts a hardware run or a published table (B): the fidelity
section of `lab compare EMULATED HARDWARE`.

- per case and metric: ratio emulated/hardware and its log error ln(ratio) (0 = exact; +0.41 =
  the emulation 1.5x too high, -0.41 = 1.5x too low);
- per test label, condition, point and metric: the ranking of profiles in each run and Kendall's
  tau-b between them (ties counted as in tau-b; None when a run ranks fewer than two profiles or
  ties them all);
- decision flips: two profiles the emulation ranks one way and the hardware the other way, where
  the hardware difference is beyond noise: |hw_p - hw_q| > 2 * sqrt(sd_p^2/n_p + sd_q^2/n_q)
  (two combined standard errors of the hardware means). A hardware figure's noise is known when
  n >= 2 and sd is given (a measured run's repetitions, or n and sd from an imported table);
  otherwise the pair is listed as "noise unknown", never as beyond noise.

Only the metrics the tests declare are compared (not the monitor's CPU columns). docs/results.md,
"Fidelity".
"""

from __future__ import annotations

import math
from itertools import combinations
from collections.abc import Mapping

from lab.measure import TESTS, metric_columns
from lab.model.stats import kendall_tau_b
from lab.results.doc import Doc, Primary, fmt_value, lower_is_better, primary
from lab.results.rundir import to_csv
from lab.core.state import write_text_atomic

#: a hardware difference is beyond noise above this many combined standard errors
NOISE_SE = 2.0

GROUP = ("test_label", "impairment", "point", "metric")
CASE_COLUMNS = [
    "profile",
    "impairment",
    "test_label",
    "point",
    "metric",
    "test",
    "emulated",
    "hardware",
    "ratio",
    "log_error",
]
RANK_COLUMNS = [*GROUP, "test", "profiles", "emulated_ranking", "hardware_ranking", "tau_b"]
FLIP_COLUMNS = [
    *GROUP,
    "test",
    "emulated_above",
    "emulated_below",
    "emulated_better",
    "emulated_worse",
    "hardware_better",
    "hardware_worse",
    "hardware_margin",
    "hardware_diff",
    "noise_2se",
    "status",
]


def higher_is_better(metric: str, p: Primary) -> bool:
    """Is a larger `metric` the better one? `p`: the main metric of the metric's test entry."""
    if p.column == metric:
        return p.higher_is_better
    return not lower_is_better(metric)


def duplicates(test: str) -> set[str]:
    """Columns of `test` that repeat its primary metric (tcp's receiver_bps is read from the same
    record key as its throughput_bps): left out so one figure is not ranked twice."""
    t = TESTS.get(test)
    if t is None:
        return set()
    keys = {m.name: m.key for m in t.metrics}
    main = primary(test).column
    return {m for m, k in keys.items() if m != main and main in keys and k == keys[main]}


def ranking(values: dict[str, float], higher: bool) -> list[tuple[int, str]]:
    """[(rank, profile)], best first; equal values share a rank (1, 2, 2, 4)."""
    order = sorted(values, key=lambda p: -values[p] if higher else values[p])
    out: list[tuple[int, str]] = []
    for i, p in enumerate(order):
        same = out and values[out[-1][1]] == values[p]
        out.append((out[-1][0] if same else i + 1, p))
    return out


def _ranked(ranks: list[tuple[int, str]]) -> str:
    """'a > b = c': best first, '=' between profiles sharing a rank."""
    out = ranks[0][1]
    for (r0, _), (r1, p) in zip(ranks, ranks[1:], strict=False):
        out += f" {'=' if r1 == r0 else '>'} {p}"
    return out


def _noise(n: int | None, sd: float | None) -> float | None:
    """Squared standard error of a mean, None when the figure's noise is unknown."""
    if not n or n < 2 or sd is None:
        return None
    return sd * sd / n


def analyse(table: list[dict], mains: Mapping[str, Primary] | None = None) -> dict:
    """compare()'s rows (A = emulated, B = hardware) -> {cases, ranks, flips, summary}.
    `mains`: each test label's main metric (compare's: a rekey-only handshake entry's is its
    rekey recovery); a label not in it goes by its test's. A case says whether its metric is
    its entry's main one (`main`)."""

    def main(r: dict) -> Primary:
        return (mains or {}).get(r["test_label"]) or primary(r["test"])

    declared = metric_columns()
    both = [
        r
        for r in table
        if r["metric"] in declared
        and r["metric"] not in duplicates(r["test"])
        and r["n_a"]
        and r["n_b"]
        and r["mean_a"] is not None
        and r["mean_b"] is not None
    ]
    cases = []
    for r in both:
        ratio = r["mean_a"] / r["mean_b"] if r["mean_b"] else None
        cases.append(
            {
                **{k: r[k] for k in ("profile", "impairment", "test_label", "point", "metric")},
                "test": r["test"],
                "emulated": r["mean_a"],
                "hardware": r["mean_b"],
                "ratio": ratio,
                "log_error": math.log(ratio) if ratio and ratio > 0 else None,
                "main": main(r).column == r["metric"],
            }
        )
    groups: dict[tuple, list[dict]] = {}
    for r in both:
        groups.setdefault(tuple(r[k] for k in GROUP), []).append(r)
    ranks, flips = [], []
    for key, rs in groups.items():
        if len(rs) < 2:
            continue
        test, metric = rs[0]["test"], key[3]
        hib = higher_is_better(metric, main(rs[0]))
        a = {r["profile"]: r["mean_a"] for r in rs}
        b = {r["profile"]: r["mean_b"] for r in rs}
        profs = list(a)
        ranks.append(
            {
                **dict(zip(GROUP, key, strict=True)),
                "test": test,
                "profiles": len(profs),
                "emulated_ranking": _ranked(ranking(a, hib)),
                "hardware_ranking": _ranked(ranking(b, hib)),
                "tau_b": kendall_tau_b([a[p] for p in profs], [b[p] for p in profs]),
            }
        )
        by = {r["profile"]: r for r in rs}
        for p, q in combinations(profs, 2):
            de, dh = a[p] - a[q], b[p] - b[q]
            if de * dh >= 0:  # same order, or a tie on one side: no decision changes
                continue
            # `up` is the profile the emulation ranks above the other
            up, down = (p, q) if (de > 0) == hib else (q, p)
            vp, vq = (_noise(by[x]["n_b"], by[x]["sd_b"]) for x in (up, down))
            noise = NOISE_SE * math.sqrt(vp + vq) if vp is not None and vq is not None else None
            diff = abs(dh)
            lo = min(b[up], b[down])
            flips.append(
                {
                    **dict(zip(GROUP, key, strict=True)),
                    "test": test,
                    "emulated_above": up,
                    "emulated_below": down,
                    "emulated_better": a[up],
                    "emulated_worse": a[down],
                    "hardware_better": b[down],
                    "hardware_worse": b[up],
                    "hardware_margin": max(b[up], b[down]) / lo - 1 if lo > 0 else None,
                    "hardware_diff": diff,
                    "noise_2se": noise,
                    "status": "noise unknown"
                    if noise is None
                    else ("beyond noise" if diff > noise else "within noise"),
                }
            )
    logs = [c["log_error"] for c in cases if c["log_error"] is not None]
    taus = [r["tau_b"] for r in ranks if r["tau_b"] is not None]
    summary = {
        "cases": len(cases),
        "mean_abs_log_error": sum(abs(x) for x in logs) / len(logs) if logs else None,
        "within_1_5x": sum(1 for x in logs if abs(x) <= math.log(1.5)),
        "rankings": len(ranks),
        "mean_tau_b": sum(taus) / len(taus) if taus else None,
        "flips": len(flips),
        "flips_beyond_noise": sum(1 for f in flips if f["status"] == "beyond noise"),
    }
    return {"cases": cases, "ranks": ranks, "flips": flips, "summary": summary}


def _display(metric: str) -> tuple[float, str]:
    col = metric_columns().get(metric)
    unit = col.unit if col is not None else ""
    if unit == "bit/s":
        return 1e-6, "Mbit/s"
    return 1.0, unit or ""


def sentence(f: dict) -> str:
    """One flip in plain words."""
    scale, unit = _display(f["metric"])
    u = f" {unit}" if unit else ""
    where = f"`{f['test_label']}` {f['metric']}, condition {f['impairment']}" + (
        f" point {f['point']}" if f["point"] else ""
    )
    em = f["emulated_better"] / f["emulated_worse"] - 1 if f["emulated_worse"] else None
    hm = f["hardware_margin"]
    s = (
        f"{where}: the dry-run ranks {f['emulated_above']} above {f['emulated_below']} "
        f"({fmt_value(f['emulated_better'] * scale)} vs {fmt_value(f['emulated_worse'] * scale)}{u}"
        + (f", {abs(em) * 100:.0f} % apart" if em is not None else "")
        + "); the hardware ranks them the other way"
        + (f" by {hm * 100:.0f} %" if hm is not None else "")
        + f" ({fmt_value(f['hardware_better'] * scale)} vs {fmt_value(f['hardware_worse'] * scale)}{u})"
    )
    if f["status"] == "beyond noise":
        s += (
            f", beyond noise (difference {fmt_value(f['hardware_diff'] * scale)}{u} > 2 combined "
            f"standard errors {fmt_value(f['noise_2se'] * scale)}{u})."
        )
    elif f["status"] == "within noise":
        s += (
            f", within noise (difference {fmt_value(f['hardware_diff'] * scale)}{u} <= 2 combined "
            f"standard errors {fmt_value(f['noise_2se'] * scale)}{u}): not a decision flip."
        )
    else:
        s += ": the hardware figures give no noise estimate (n < 2 or no sd), so it cannot be "
        s += "called beyond noise."
    return s


def write(out, result: dict) -> list[str]:
    """fidelity.csv, fidelity-ranks.csv, fidelity-flips.csv into `out`; returns their names."""

    files = {
        "fidelity.csv": (result["cases"], CASE_COLUMNS),
        "fidelity-ranks.csv": (result["ranks"], RANK_COLUMNS),
        "fidelity-flips.csv": (result["flips"], FLIP_COLUMNS),
    }
    for name, (rows_, cols) in files.items():
        write_text_atomic(out / name, to_csv(rows_, cols))
    return list(files)


def section(doc: Doc, result: dict, name_a: str, name_b: str) -> None:
    """The fidelity section of compare.md/.html: A taken as the emulation, B as the hardware."""
    s = result["summary"]
    doc.h("Fidelity")
    doc.p(
        f"{name_a} (A) read as the emulation, {name_b} (B) as the hardware. Ratio = A/B, log "
        "error = ln(ratio) (0 exact, ±0.41 = 1.5x off). Per test, condition and metric: the "
        "profiles ranked best first in each run and Kendall's tau-b between the rankings (1 = "
        "same order, -1 = reversed). A decision flip is a pair ranked one way by A and the "
        "other way by B where B's difference exceeds 2 combined standard errors of B's means. "
        "Files: `fidelity.csv`, `fidelity-ranks.csv`, `fidelity-flips.csv`."
    )
    if not s["cases"]:
        doc.p("No case and metric is in both runs: nothing to compare.")
        return
    beyond = [f for f in result["flips"] if f["status"] == "beyond noise"]
    doc.p(
        f"**{s['cases']} case metrics in both runs; {s['within_1_5x']} within 1.5x; mean |log "
        f"error| {fmt_value(s['mean_abs_log_error'])}"
        + (
            f" (a typical factor of {math.exp(s['mean_abs_log_error']):.2f}x)"
            if s["mean_abs_log_error"] is not None
            else ""
        )
        + f". {s['rankings']} rankings, mean tau-b "
        + (f"{s['mean_tau_b']:.2f}" if s["mean_tau_b"] is not None else "-")
        + f"; {len(beyond)} decision flip(s) beyond noise, "
        f"{s['flips'] - len(beyond)} other reversed pair(s).**"
    )
    for f in beyond:
        doc.p(f"**Decision flip:** {sentence(f)}")
    for f in result["flips"]:
        if f["status"] != "beyond noise":
            doc.p(sentence(f))
    if result["ranks"]:
        doc.table(
            ["test", "condition", "point", "metric", "A ranking", "B ranking", "tau-b"],
            [
                [r["test_label"], r["impairment"], r["point"], r["metric"],
                 r["emulated_ranking"], r["hardware_ranking"],
                 f"{r['tau_b']:.2f}" if r["tau_b"] is not None else "-"]
                for r in result["ranks"]
            ],
        )  # fmt: skip
    main = [c for c in result["cases"] if c["main"]]
    if main:
        doc.p("Main metric of every case: A/B and its log error (every metric in `fidelity.csv`).")
        doc.table(
            ["profile", "condition", "test", "point", "metric", "A", "B", "A/B", "ln(A/B)"],
            [
                [c["profile"], c["impairment"], c["test_label"], c["point"],
                 f"{c['metric']} ({_display(c['metric'])[1]})",
                 fmt_value(c["emulated"] * _display(c["metric"])[0]),
                 fmt_value(c["hardware"] * _display(c["metric"])[0]),
                 f"{c['ratio']:.3f}" if c["ratio"] is not None else "-",
                 f"{c['log_error']:+.3f}" if c["log_error"] is not None else "-"]
                for c in main
            ],
        )  # fmt: skip
