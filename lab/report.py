"""Turn a run directory into tables, plots (PNG + SVG) and report.md / report.html.

Everything is computed from results.jsonl, timeline.jsonl and manifest.json, so `lab report
RUN_DIR` regenerates the same report at any time (also for a run that was interrupted).
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .measure import TESTS, Primary
from .results import RunDir, time_budget, write_tables
from .state import write_text_atomic

#: the primary metric of a test that declares none (or is not registered any more)
DEFAULT_PRIMARY = Primary("throughput_bps", "Mbit/s", 1e-6, True)


def primary(test: str) -> Primary:
    """(metric column, label, scale, higher is better) the report ranks `test` by: its own."""
    t = TESTS.get(test)
    return (t.primary if t is not None else None) or DEFAULT_PRIMARY


THROUGHPUT_TESTS = ("tcp", "udp", "scp", "contention")
FORMATS = ("png", "svg")


# ---------------------------------------------------------------------- document blocks


@dataclass
class Doc:
    """A report as blocks rendered both to Markdown and to HTML."""

    title: str
    blocks: list[tuple[str, Any]] = field(default_factory=list)

    def h(self, text: str) -> None:
        self.blocks.append(("h", text))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def table(self, header: list[str], rows: list[list[Any]]) -> None:
        self.blocks.append(("table", (header, rows)))

    def img(self, path: str, alt: str) -> None:
        self.blocks.append(("img", (path, alt)))

    def pre(self, summary: str, text: str) -> None:
        self.blocks.append(("pre", (summary, text)))

    def markdown(self) -> str:
        out = [f"# {self.title}", ""]
        for kind, v in self.blocks:
            if kind == "h":
                out += [f"## {v}", ""]
            elif kind == "p":
                out += [v, ""]
            elif kind == "table":
                header, rows = v
                out.append("| " + " | ".join(header) + " |")
                out.append("|" + "---|" * len(header))
                out += ["| " + " | ".join(_md(c) for c in r) + " |" for r in rows]
                out.append("")
            elif kind == "img":
                out += [f"![{v[1]}]({v[0]})", ""]
            elif kind == "pre":
                out += [f"**{v[0]}**", "", "```", v[1].rstrip(), "```", ""]
        return "\n".join(out)

    def html(self) -> str:
        e = html.escape
        out = [
            "<!doctype html><html><head><meta charset='utf-8'>",
            f"<title>{e(self.title)}</title><style>",
            "body{font-family:sans-serif;max-width:1100px;margin:auto;padding:1em}",
            "table{border-collapse:collapse;margin:0.5em 0}td,th{border:1px solid #ccc;",
            "padding:2px 8px;text-align:right}th{background:#eee}td:first-child{text-align:left}",
            "img{max-width:100%}pre{background:#f6f6f6;padding:0.5em;overflow:auto}",
            f"</style></head><body><h1>{e(self.title)}</h1>",
        ]
        for kind, v in self.blocks:
            if kind == "h":
                out.append(f"<h2>{e(v)}</h2>")
            elif kind == "p":
                out.append(f"<p>{_inline_html(v)}</p>")
            elif kind == "table":
                header, rows = v
                out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>")
                for r in rows:
                    out.append("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>")
                out.append("</table>")
            elif kind == "img":
                out.append(f"<p><img src='{e(v[0])}' alt='{e(v[1])}'></p>")
            elif kind == "pre":
                out.append(f"<details><summary>{e(v[0])}</summary><pre>{e(v[1])}</pre></details>")
        out.append("</body></html>")
        return "\n".join(out)


def _md(c: Any) -> str:
    return str(c).replace("|", "\\|").replace("\n", " ")


def _inline_html(text: str) -> str:
    # the report's paragraphs use `code` and **bold** only
    import re

    t = html.escape(text)
    t = re.sub(r"`([^`]+)`", r"<code>\1</code>", t)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", t)


# ---------------------------------------------------------------------- statistics


def _stats(vals: list[float]) -> dict | None:
    vals = [v for v in vals if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return None
    n = len(vals)
    mean = sum(vals) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else 0.0
    return {"n": n, "mean": mean, "sd": sd, "min": min(vals), "max": max(vals)}


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    dec = max(0, digits - 1 - mag)
    return f"{x:.{dec}f}"


def _cell(s: dict | None, scale: float) -> str:
    if s is None:
        return "-"
    out = f"{_fmt(s['mean'] * scale)}"
    if s["n"] > 1:
        out += f" ± {_fmt(s['sd'] * scale, 2)}"
    return out + f" (n={s['n']})"


def _order(values: list, ref: list) -> list:
    return sorted(set(values), key=lambda v: (ref.index(v) if v in ref else len(ref), str(v)))


# ---------------------------------------------------------------------- report


def generate(run_path: Path) -> dict:
    """Write results.csv, summary.csv, the plots and report.md/.html; returns a short summary."""
    run = RunDir(Path(run_path)).check()
    table, _ = write_tables(run)
    results = run.load_results()
    budget = time_budget(results, run.load_timeline())
    manifest = run.manifest()
    plan = run.plan_json()
    profiles = plan.get("profiles", [])
    points = [p["name"] for p in plan.get("impairments", [])]
    labels = [t["label"] for t in plan.get("tests", [])]
    plots = make_plots(run, table, plan)

    doc = Doc(f"Run {run.name}: plan {plan.get('name')}")
    if plan.get("description"):
        doc.p(plan["description"])
    for n in plan.get("notes") or []:
        doc.p(f"**Note:** {n}")
    _facts(doc, run, manifest, plan)
    _conditions(doc, results, points)
    _throttling(doc, results)
    _budget(doc, budget, len(results), sum(1 for r in results if r.get("ok")))
    _results_tables(doc, table, profiles, points, labels, plan)
    _recommendation(doc, table, profiles, points, labels, manifest)
    if plots:
        doc.h("Plots")
        for rel, alt in plots:
            doc.img(rel, alt)
    _failures(doc, results)
    write_text_atomic(run.file("report.md"), doc.markdown())
    write_text_atomic(run.file("report.html"), doc.html())
    return {
        "report": str(run.file("report.md")),
        "plots": [p for p, _ in plots],
        "budget": budget,
        "cases": len(results),
        "failed": sum(1 for r in results if not r.get("ok")),
    }


def _facts(doc: Doc, run: RunDir, m: dict, plan: dict) -> None:
    doc.h("Set-up")
    topo = plan.get("topology", {})
    cpu = {
        n: f"{(c or {}).get('profile') or (c or {}).get('cores')}"
        + (f" (cap not applied: {c['not_applied']})" if (c or {}).get("not_applied") else "")
        if (c or {}).get("profile") or (c or {}).get("cores")
        else None
        for n, c in (m.get("cpu") or {}).items()
    }
    calibrated = {(c or {}).get("calibrated") for c in (m.get("cpu") or {}).values() if c}
    k = m.get("kernel") or {}
    rows = [
        ["run", run.name],
        ["lab", f"{m.get('lab_version')} ({m.get('git_revision')})"],
        [
            "kernel",
            f"{k.get('release')} {k.get('machine')} on {k.get('hostname')}, {k.get('cpus')} CPUs",
        ],
        ["topology", f"{topo.get('file')} {topo.get('params')}"],
        ["CPU per node", ", ".join(f"{n}: {c or 'uncapped'}" for n, c in cpu.items()) or "-"],
        ["placement", plan.get("placement") or "lab default"],
        ["repetitions", f"{plan.get('reps')} unimpaired, {plan.get('impaired_reps')} impaired"],
    ]
    sub = m.get("substrate") or {}
    if sub.get("kind") == "vm":
        rows.append(
            [
                "substrate",
                f"full-kernel VM, kernel {sub.get('kernel')}, accelerator "
                f"{str(sub.get('accelerator')).upper()} on host kernel {sub.get('host_kernel')}",
            ]
        )
        if sub.get("evidence") == "functional":
            rows.append(["warning", str(sub.get("note"))])
    if False in calibrated:
        rows.append(["warning", "CPU profile uncalibrated on this machine (`lab calibrate`)"])
    rows += _calibration_rows(m)
    doc.table(["", ""], rows)
    prof_rows = []
    for name, p in (m.get("profiles") or {}).items():
        d = p.get("describe") or {}
        prof_rows.append(
            [
                name,
                p.get("driver"),
                p.get("path"),
                d.get("version", "-"),
                d.get("cipher", "-"),
                d.get("mtu", "-"),
                (p.get("configs") or {}).get("config_hash", "-"),
            ]
        )
    if prof_rows:
        doc.table(
            ["profile", "driver", "data path", "version", "cipher", "MTU", "config hash"], prof_rows
        )
    tools = {k2: v for k2, v in (m.get("tool_versions") or {}).items() if v}
    if tools:
        doc.table(["tool", "version"], [[k2, v] for k2, v in tools.items()])


def _calibration_rows(m: dict) -> list[list[str]]:
    """Per calibrated CPU profile of the run: how well its fitted cap imitates the board on this
    host (residual per primitive against the threshold), and the poor-fit warning if any."""
    from .cpuprofile import fit_quality

    cals: dict[str, dict] = {}
    for c in (m.get("cpu") or {}).values():
        if (c or {}).get("calibration") and not c.get("not_applied"):
            cals.setdefault(str(c.get("profile")), c["calibration"])
    rows = []
    for prof, cal in cals.items():
        # a manifest written before fit quality was recorded still has the residuals
        fit = cal.get("fit") or fit_quality(cal.get("residuals") or {}, profile=prof)
        res = ", ".join(f"{p} {r:+.1%}" for p, r in fit["residuals"].items()) or "none recorded"
        verdict = (
            f"max |residual| {fit['max_abs_residual']:.1%} ({fit['worst']}) "
            f"{'above' if fit['above_threshold'] else 'within'} the {fit['threshold']:.0%} "
            "threshold"
            if fit["worst"]
            else "fit quality unknown"
        )
        rows.append(
            [
                "CPU calibration",
                f"{prof} ({cal.get('mode')}, {cal.get('created')}): residuals {res}; {verdict}",
            ]
        )
        if fit["warning"]:
            rows.append(["warning", fit["warning"]])
    return rows


def _conditions(doc: Doc, results: list[dict], points: list[str]) -> None:
    """The network condition of every impaired point as read back from the engine or qdisc while
    its cases ran (queue limit included, in wire packets), and how per-packet models saw wire
    packets (docs/impairment.md)."""
    rows: dict[str, dict] = {}
    for r in results:
        imp, applied = r.get("impairment") or {}, r.get("impairment_applied") or {}
        if not imp.get("spec") or not isinstance(applied.get("applied"), dict):
            continue
        row = rows.setdefault(imp["name"], {"spec": imp["spec"], "read": set(), "how": set()})
        for v in applied["applied"].values():
            row["read"].update(v.values() if isinstance(v, dict) else [str(v)])
        if applied.get("wire_packets"):
            row["how"].add(f"{applied.get('backend')}: {applied['wire_packets']}")
        for w in applied.get("warnings") or []:
            row.setdefault("warnings", set()).add(w)
    if not rows:
        return
    doc.h("Network conditions in force")
    doc.p(
        "Read back from the impairment engine or the kernel qdisc before each point's cases ran; "
        "each point is exactly its own spec (no parameter of an earlier point). `limit` counts "
        "wire packets; without one in the plan the lab uses twice what the delay holds at the "
        "link rate, at least 1000 (docs/impairment.md)."
    )
    doc.table(
        ["point", "plan spec", "in force (per direction)"],
        [
            [name, rows[name]["spec"], " | ".join(sorted(rows[name]["read"]))]
            for name in _order(list(rows), points)
        ],
    )
    for how in sorted(set().union(*(r["how"] for r in rows.values()))):
        doc.p(f"Wire packets: {how}.")
    for name in _order(list(rows), points):
        for w in sorted(rows[name].get("warnings", ())):
            doc.p(f"**Warning ({name}):** {w}")


def _throttling(doc: Doc, results: list[dict]) -> None:
    """A warning when the Pi firmware throttled (vcgencmd) during any test."""
    hit = [
        r
        for r in results
        if (((r.get("monitor") or {}).get("host") or {}).get("vcgencmd") or {}).get("throttled")
    ]
    if not hit:
        return
    temps = [
        t
        for r in hit
        if (t := ((r["monitor"]["host"].get("temperature_c") or {}).get("max"))) is not None
    ]
    hottest = f"; hottest sensor {max(temps):.1f} °C" if temps else ""
    names = ", ".join(f"`{r['case']}`" for r in hit[:5]) + (" ..." if len(hit) > 5 else "")
    doc.p(
        f"**Warning: {len(hit)} of {len(results)} tests ran throttled** (firmware clock cap, "
        f"throttling or under-voltage, `vcgencmd get_throttled`{hottest}): their numbers reflect "
        f"a slowed board. {names}. Column `throttled` in results.csv."
    )


def _budget(doc: Doc, b: dict, cases: int, ok: int) -> None:
    doc.h("Time budget")
    share = b.get("outside_share")
    doc.p(
        f"**Time outside measurement: {share * 100:.1f} % of the run** "
        f"({b['outside_s']:.1f} s of {b['wall_s']:.1f} s; set-up, teardown, impairment changes "
        "and waits; the goal for the quick plan is < 10 %)."
        if share is not None
        else "No timing recorded."
    )
    doc.table(
        ["part", "seconds", "share"],
        [
            [
                k.replace("_s", ""),
                f"{b[k]:.1f}",
                f"{100 * b[k] / b['wall_s']:.1f} %" if b["wall_s"] else "-",
            ]
            for k in ("measurement_s", "setup_s", "teardown_s", "impairment_s", "other_s", "wall_s")
        ],
    )
    doc.p(
        f"{cases} case repetitions recorded, {ok} ok, {cases - ok} failed; "
        f"{b['sessions']} session(s)."
    )


def _group(table: list[dict], **match) -> list[dict]:
    return [r for r in table if all(r.get(k) == v for k, v in match.items())]


def _results_tables(doc, table, profiles, points, labels, plan) -> None:
    doc.h("Results")
    doc.p(
        "Mean ± sample standard deviation (n = successful repetitions) per profile and "
        "network condition; full per-repetition data in `results.csv`, statistics per case and "
        "metric in `summary.csv`."
    )
    tests = {t["label"]: t["test"] for t in plan.get("tests", [])}
    present_points = _order([r["impairment"] for r in table], points)
    for label in labels:
        test = tests[label]
        col, unit, scale, _ = primary(test)
        rows_l = _group(table, test_label=label)
        if not rows_l:
            continue
        npoints = sorted({r["point"] for r in rows_l})
        if test == "udp-sweep":
            rates = sorted({r["rate_mbit"] for r in rows_l if r["rate_mbit"] is not None})
            header = ["profile", "impairment"] + [f"{r:g} Mbit/s" for r in rates]
            out = []
            for prof in profiles:
                for pt in present_points:
                    rs = _group(rows_l, profile=prof, impairment=pt, ok=True)
                    if not rs and not _group(rows_l, profile=prof, impairment=pt):
                        continue
                    out.append(
                        [prof, pt]
                        + [
                            _cell(_stats([r[col] for r in rs if r["rate_mbit"] == rate]), scale)
                            for rate in rates
                        ]
                    )
            doc.p(f"**{label}** ({test}): received {unit} per target rate")
            doc.table(header, out)
            continue
        header = ["profile"] + present_points
        for pidx in npoints:
            out = []
            for prof in profiles:
                row = [prof]
                for pt in present_points:
                    all_rs = _group(rows_l, profile=prof, impairment=pt, point=pidx)
                    rs = [r for r in all_rs if r["ok"]]
                    c = _cell(_stats([r[col] for r in rs]), scale)
                    failed = len(all_rs) - len(rs)
                    row.append(c + (f" [{failed} failed]" if failed else ""))
                out.append(row)
            what = f" (point {pidx})" if len(npoints) > 1 else ""
            doc.p(f"**{label}** ({test}{what}): {col.replace('_', ' ')} in {unit}")
            doc.table(header, out)
    cpu_rows = []
    for label in labels:
        if tests[label] not in THROUGHPUT_TESTS:
            continue
        for prof in profiles:
            rs = _group(table, test_label=label, profile=prof, ok=True)
            rs = [r for r in rs if not r["impairment_spec"]]
            if not rs:
                continue
            cpu_rows.append(
                [label, prof]
                + [
                    _fmt(_mean([r[c] for r in rs]))
                    for c in (
                        "cpu_vpn_client_pct",
                        "cpu_vpn_server_pct",
                        "cpu_traffic_client_pct",
                        "cpu_traffic_server_pct",
                        "daemon_cpu_pct",
                        "host_busy_pct",
                        "host_softirq_pct",
                    )
                ]
            )
    if cpu_rows:
        doc.p(
            "**CPU during the throughput tests without impairment** (node cgroups in % of one "
            "host core; host columns are host-wide shares of all cores, shared with anything "
            "else running on this machine)."
        )
        doc.table(
            [
                "test",
                "profile",
                "VPN client node",
                "VPN server node",
                "traffic client",
                "traffic server",
                "VPN daemons",
                "host busy",
                "host softirq",
            ],
            cpu_rows,
        )


def _mean(vals) -> float | None:
    s = _stats(vals)
    return s["mean"] if s else None


def _recommendation(doc, table, profiles, points, labels, manifest) -> None:
    """Best profile per network condition (study D): the highest mean of the main throughput
    test, the lowest mean RTT; the no-VPN baseline is shown for reference but not ranked."""
    tests = {r["test_label"]: r["test"] for r in table}
    thr = next((lb for lb in labels if tests.get(lb) in ("tcp", "udp", "scp")), None)
    lat = next((lb for lb in labels if tests.get(lb) == "ping"), None)
    if thr is None and lat is None:
        return
    drivers = {p: (manifest.get("profiles") or {}).get(p, {}).get("driver") for p in profiles}
    vpns = [p for p in profiles if drivers.get(p) not in ("none", None)] or profiles
    base = [p for p in profiles if drivers.get(p) == "none"]
    doc.h("Recommendation")
    doc.p(
        "Best VPN profile per network condition"
        + (f" by mean `{thr}` throughput" if thr else "")
        + (f" and by mean `{lat}` RTT" if lat else "")
        + "; runner-up and margin "
        "given so a difference within the spread is visible. The no-VPN baseline is not "
        "ranked."
    )
    header = ["condition"]
    if thr:
        header += ["best throughput", "Mbit/s", "runner-up", "margin"]
    if lat:
        header += ["lowest RTT", "ms"]
    if base:
        header += [f"{base[0]} Mbit/s"]
    rows = []
    for pt in _order([r["impairment"] for r in table], points):
        row = [pt]
        if thr:
            ranked = sorted(
                (
                    (m, p)
                    for p in vpns
                    if (
                        m := _mean(
                            [
                                r["throughput_bps"]
                                for r in _group(
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
                sd = _stats(
                    [
                        r["throughput_bps"]
                        for r in _group(
                            table, test_label=thr, profile=best[1], impairment=pt, ok=True
                        )
                    ]
                )["sd"]
                if ru and sd and best[0] - sd <= ru[0]:
                    margin += " (within 1 sd)"
                row += [best[1], _fmt(best[0] / 1e6), ru[1] if ru else "-", margin]
            else:
                row += ["-", "-", "-", "-"]
        if lat:
            ranked = sorted(
                (m, p)
                for p in vpns
                if (
                    m := _mean(
                        [
                            r["rtt_avg_ms"]
                            for r in _group(
                                table, test_label=lat, profile=p, impairment=pt, ok=True
                            )
                        ]
                    )
                )
                is not None
            )
            row += [ranked[0][1], _fmt(ranked[0][0])] if ranked else ["-", "-"]
        if base:
            b = (
                _mean(
                    [
                        r["throughput_bps"]
                        for r in _group(
                            table, test_label=thr, profile=base[0], impairment=pt, ok=True
                        )
                    ]
                )
                if thr
                else None
            )
            row.append(_fmt(b / 1e6) if b else "-")
        rows.append(row)
    doc.table(header, rows)


def _failures(doc: Doc, results: list[dict]) -> None:
    failed = [r for r in results if not r.get("ok")]
    if not failed:
        return
    doc.h("Failed cases")
    doc.table(["case", "error"], [[r["case"], (r.get("error") or "")[:300]] for r in failed])
    for r in failed[:50]:
        tails = r.get("raw_tail") or {}
        if tails:
            text = "\n".join(f"==> {f} <==\n{t}" for f, t in tails.items())
            doc.pre(f"raw output of {r['case']}", text)


# ---------------------------------------------------------------------- plots


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, run: RunDir, name: str) -> str:
    d = run.path / "plots"
    d.mkdir(exist_ok=True)
    for ext in FORMATS:
        tmp = d / f".{name}.tmp.{ext}"
        fig.savefig(tmp, format=ext, dpi=110, bbox_inches="tight")
        tmp.replace(d / f"{name}.{ext}")
    _plt().close(fig)
    return f"plots/{name}.png"


def _err(s: dict, scale: float, mode: str) -> tuple[float, float]:
    if mode == "minmax":
        return ((s["mean"] - s["min"]) * scale, (s["max"] - s["mean"]) * scale)
    return (s["sd"] * scale, s["sd"] * scale)


def make_plots(run: RunDir, table: list[dict], plan: dict) -> list[tuple[str, str]]:
    if not table:
        return []
    plt = _plt()
    out: list[tuple[str, str]] = []
    profiles = plan.get("profiles", [])
    tests = {t["label"]: t["test"] for t in plan.get("tests", [])}
    mode = plan.get("error_bars", "sd")
    thr_labels = [lb for lb, t in tests.items() if t in THROUGHPUT_TESTS]
    unimp = [r for r in table if not r["impairment_spec"] and r["ok"]]
    points = [p["name"] for p in plan.get("impairments", [])]

    # 1. throughput per implementation, no impairment, with error bars
    labels = [lb for lb in thr_labels if _group(unimp, test_label=lb)]
    if labels:
        fig, axes = plt.subplots(
            1, len(labels), figsize=(max(5, 3.2 * len(labels)), 4), squeeze=False
        )
        for ax, lb in zip(axes[0], labels, strict=True):
            xs, ys, errs = [], [], [[], []]
            for p in profiles:
                s = _stats([r["throughput_bps"] for r in _group(unimp, test_label=lb, profile=p)])
                if s:
                    lo, hi = _err(s, 1e-6, mode)
                    xs.append(p)
                    ys.append(s["mean"] * 1e-6)
                    errs[0].append(lo)
                    errs[1].append(hi)
            ax.bar(range(len(xs)), ys, yerr=errs, capsize=4, color="tab:blue")
            ax.set_xticks(range(len(xs)), xs, rotation=30, ha="right")
            ax.set_title(f"{lb} ({tests[lb]})")
            ax.set_ylabel("throughput (Mbit/s)")
            ax.grid(axis="y", alpha=0.3)
        fig.suptitle(f"Throughput per implementation, no impairment (error bars: {mode})")
        out.append((_save(fig, run, "throughput"), "throughput per implementation"))

    # 2a. throughput vs each swept parameter, log y
    sweeps = sorted({r["sweep_parameter"] for r in table if r["sweep_parameter"]})
    units = {
        "delay": "ms",
        "jitter": "ms",
        "loss": "%",
        "duplicate": "%",
        "corrupt": "%",
        "reorder": "%",
        "rate": "Mbit/s",
    }
    for par in sweeps:
        rs = [r for r in table if r["sweep_parameter"] == par and r["ok"]]
        labels = [lb for lb in thr_labels if _group(rs, test_label=lb)]
        if not labels or len({r["sweep_value"] for r in rs}) < 2:
            continue
        fig, axes = plt.subplots(
            1, len(labels), figsize=(max(5.5, 4.5 * len(labels)), 4), squeeze=False
        )
        for ax, lb in zip(axes[0], labels, strict=True):
            for p in profiles:
                pts = sorted({r["sweep_value"] for r in _group(rs, test_label=lb, profile=p)})
                ys = [
                    _mean(
                        [
                            r["throughput_bps"]
                            for r in _group(rs, test_label=lb, profile=p)
                            if r["sweep_value"] == v
                        ]
                    )
                    for v in pts
                ]
                xs_ys = [(x, y * 1e-6) for x, y in zip(pts, ys, strict=True) if y]
                if xs_ys:
                    ax.plot(*zip(*xs_ys, strict=True), marker="o", label=p)
            ax.set_yscale("log")
            ax.set_xlabel(f"{par} ({units.get(par, '')})")
            ax.set_ylabel("throughput (Mbit/s, log)")
            ax.set_title(f"{lb} vs {par}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        out.append((_save(fig, run, f"throughput_vs_{par}"), f"throughput vs {par}"))

    # 2b. throughput per network condition (presets, explicit specs), log y
    conds = _order([r["impairment"] for r in table if not r["sweep_parameter"]], points)
    labels = [lb for lb in thr_labels if _group(table, test_label=lb, ok=True)]
    if len(conds) >= 2 and labels:
        fig, axes = plt.subplots(
            1, len(labels), figsize=(max(6, 4.5 * len(labels)), 4), squeeze=False
        )
        width = 0.8 / max(1, len(conds))
        for ax, lb in zip(axes[0], labels, strict=True):
            for j, c in enumerate(conds):
                ys, errs = [], [[], []]
                for p in profiles:
                    s = _stats(
                        [
                            r["throughput_bps"]
                            for r in _group(table, test_label=lb, profile=p, impairment=c, ok=True)
                        ]
                    )
                    ys.append(s["mean"] * 1e-6 if s else 0)
                    lo, hi = _err(s, 1e-6, mode) if s else (0, 0)
                    errs[0].append(min(lo, ys[-1] * 0.999))  # a log axis cannot reach 0
                    errs[1].append(hi)
                ax.bar(
                    [i + j * width for i in range(len(profiles))],
                    ys,
                    width,
                    yerr=errs,
                    capsize=3,
                    label=c,
                )
            ax.set_xticks(
                [i + width * (len(conds) - 1) / 2 for i in range(len(profiles))],
                profiles,
                rotation=30,
                ha="right",
            )
            ax.set_yscale("log")
            ax.set_ylabel("throughput (Mbit/s, log)")
            ax.set_title(f"{lb} per network condition")
            ax.grid(axis="y", which="both", alpha=0.3)
            ax.legend(fontsize=7)
        out.append((_save(fig, run, "throughput_by_condition"), "throughput per condition"))

    # 3. CPU per implementation per node
    labels = [lb for lb in thr_labels if _group(unimp, test_label=lb)]
    if labels:
        results = {r["case"]: r for r in run.load_results()}
        fig, axes = plt.subplots(
            1, len(labels), figsize=(max(6, 4.8 * len(labels)), 4), squeeze=False
        )
        for ax, lb in zip(axes[0], labels, strict=True):
            entries = {
                p: [results[r["case"]] for r in _group(unimp, test_label=lb, profile=p, point=0)]
                for p in profiles
            }
            nodes = sorted(
                {
                    n
                    for es in entries.values()
                    for e in es
                    for n in (e.get("monitor") or {}).get("nodes", {})
                }
            )
            series: dict[str, list[float | None]] = {}
            for n in nodes:
                series[f"node {n}"] = [
                    _mean(
                        [
                            (((e.get("monitor") or {}).get("nodes") or {}).get(n) or {})
                            .get("total", {})
                            .get("mean")
                            for e in entries[p]
                        ]
                    )
                    for p in profiles
                ]
            # host-wide softirq in the same unit: % of one core (share of all cores x cores)
            series["host softirq (host-wide)"] = [
                _mean(
                    [
                        ((e.get("monitor") or {}).get("host") or {})
                        .get("softirq_pct", {})
                        .get("mean", 0)
                        * ((e["monitor"].get("host") or {}).get("ncores") or 1)
                        for e in entries[p]
                        if e.get("monitor")
                    ]
                )
                for p in profiles
            ]
            width = 0.8 / max(1, len(series))
            for j, (key, vals) in enumerate(series.items()):
                ax.bar(
                    [i + j * width for i in range(len(profiles))],
                    [v or 0 for v in vals],
                    width,
                    label=key,
                )
            ax.set_xticks(
                [i + width * (len(series) - 1) / 2 for i in range(len(profiles))],
                profiles,
                rotation=30,
                ha="right",
            )
            ax.set_ylabel("CPU (% of one host core)")
            ax.set_title(f"CPU during {lb}")
            ax.grid(axis="y", alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle("CPU per implementation per node (cgroup), softirq host-wide")
        out.append((_save(fig, run, "cpu"), "CPU per implementation per node"))

    # 4. UDP: target vs achieved rate and packets/s
    sweep_labels = [lb for lb, t in tests.items() if t == "udp-sweep"]
    udp_labels = [lb for lb, t in tests.items() if t == "udp"]
    for lb in sweep_labels:
        rs = [r for r in unimp if r["test_label"] == lb] or _group(table, test_label=lb, ok=True)
        if not rs:
            continue
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
        rates = sorted({r["rate_mbit"] for r in rs})
        a1.plot(rates, rates, "k--", lw=0.8, label="target")
        for p in profiles:
            pr = _group(rs, profile=p)
            if not pr:
                continue
            ach = [_mean([r["receiver_bps"] for r in pr if r["rate_mbit"] == x]) for x in rates]
            a1.plot(rates, [(y or 0) * 1e-6 for y in ach], marker="o", label=p)
            sent = [_mean([r["sent_pps"] for r in pr if r["rate_mbit"] == x]) for x in rates]
            recv = [_mean([r["received_pps"] for r in pr if r["rate_mbit"] == x]) for x in rates]
            line = a2.plot(rates, [s or 0 for s in sent], marker="^", label=f"{p} sent")
            a2.plot(
                rates,
                [v or 0 for v in recv],
                marker="o",
                ls=":",
                color=line[0].get_color(),
                label=f"{p} received",
            )
        a1.set_xlabel("target (Mbit/s)")
        a1.set_ylabel("achieved (Mbit/s)")
        a1.set_title(f"{lb}: target vs achieved")
        a2.set_xlabel("target (Mbit/s)")
        a2.set_ylabel("packets/s")
        a2.set_title("sent vs received packets/s (sender- vs receiver-bound)")
        for a in (a1, a2):
            a.grid(alpha=0.3)
            a.legend(fontsize=7)
        out.append((_save(fig, run, f"udp_sweep_{lb}"), f"UDP sweep {lb}"))
    labels = [lb for lb in udp_labels if _group(unimp, test_label=lb)]
    if labels:
        fig, axes = plt.subplots(
            2, len(labels), figsize=(max(6, 4.5 * len(labels)), 7), squeeze=False
        )
        for k, lb in enumerate(labels):
            rs = _group(unimp, test_label=lb)
            x = range(len(profiles))
            tgt = [_mean([r["rate_mbit"] for r in _group(rs, profile=p)]) for p in profiles]
            ach = [_mean([r["receiver_bps"] for r in _group(rs, profile=p)]) for p in profiles]
            snt = [_mean([r["sent_pps"] for r in _group(rs, profile=p)]) for p in profiles]
            rcv = [_mean([r["received_pps"] for r in _group(rs, profile=p)]) for p in profiles]
            tpp = [_mean([r["target_pps"] for r in _group(rs, profile=p)]) for p in profiles]
            a1, a2 = axes[0][k], axes[1][k]
            a1.bar([i - 0.2 for i in x], [t or 0 for t in tgt], 0.4, label="target")
            a1.bar([i + 0.2 for i in x], [(a or 0) * 1e-6 for a in ach], 0.4, label="achieved")
            a1.set_ylabel("Mbit/s")
            a1.set_title(f"{lb}: target vs achieved rate")
            w = 0.27
            a2.bar([i - w for i in x], [t or 0 for t in tpp], w, label="target pps")
            a2.bar(list(x), [s or 0 for s in snt], w, label="sent pps")
            a2.bar([i + w for i in x], [r or 0 for r in rcv], w, label="received pps")
            a2.set_ylabel("packets/s")
            a2.set_title(f"{lb}: packets/s")
            for a in (a1, a2):
                a.set_xticks(list(x), profiles, rotation=30, ha="right")
                a.grid(axis="y", alpha=0.3)
                a.legend(fontsize=7)
        out.append((_save(fig, run, "udp"), "UDP target vs achieved rate and packets/s"))
    return out
