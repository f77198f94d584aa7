"""Turn a run directory into tables, plots (PNG + SVG) and report.md / report.html.

Everything is computed from results.jsonl, timeline.jsonl and manifest.json, so `lab report
RUN_DIR` regenerates the same report at any time (also for a run that was interrupted). This
module puts the report in order and writes its results: the headline, the tables per test, the
CPU table and the failed cases. The sections before the results are lab.results.preamble, the
Recommendation lab.results.ranking, the plots lab.results.plots and lab.results.series, the
document and its statistics lab.results.doc. What a test's tables and plots look like is what
the test declares (Test.plots, Test.ranks), never its name.
"""

from __future__ import annotations

from pathlib import Path

from lab.core.state import write_text_atomic
from lab.model import dilation
from lab.model.cpuwords import capacity_words, host_cores_words, usage_words
from lab.results.doc import (
    Doc,
    cells,
    draws,
    entry_primary,
    failed_mark,
    fmt_value,
    host_ncores,
    label_primaries,
    mean_of,
    labelled,
    metric_name,
    in_order,
    primary,
    rows_where,
    stat_cell,
    stats_of,
)
from lab.results.handshakes import (
    ESTABLISHMENT_STATUS,
    REKEY_STATUS,
    establishment_table,
    measured,
    rekey_table,
)
from lab.results.loadtables import loss_notes, rrul_table
from lab.results.plots import make_plots
from lab.results.preamble import (
    budget_section,
    conditions_section,
    setup_section,
    throttling_section,
    warnings_section,
    what_ran_section,
)
from lab.results.ranking import recommendation_section, summary_section
from lab.results.directions import point_directions
from lab.results.rundir import RunDir, imported_figure, write_tables
from lab.results.timebudget import time_budget
from lab.results.series import UNSETTLED_SHARE, unsettled


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
    doc.link("results.csv", "one row per repetition")
    doc.link("summary.csv", "statistics per case and metric")
    doc.link("results.jsonl", "everything measured, with series")
    doc.link("raw/", "tool output per case")
    doc.link("report.md", "this report as Markdown")
    if (d := dilation.factor(manifest.get("dilation"))) != 1.0:
        doc.p(dilation.report_line(d, (manifest.get("kernel") or {}).get("cpus")))
    warnings_section(doc, results, manifest)
    summary_section(doc, table, profiles, points, plan, manifest)
    what_ran_section(doc, plan, results)
    setup_section(doc, run, manifest, plan)
    conditions_section(doc, results, points)
    throttling_section(doc, results)
    budget_section(doc, budget, len(results), sum(1 for r in results if r.get("ok")))
    _results_tables(doc, table, profiles, points, labels, plan, results, manifest)
    recommendation_section(doc, table, profiles, points, labels, manifest)
    doc.warnings_here()
    if plots:
        doc.h("Plots")
        for rel, alt in plots:
            doc.img(rel, alt)
    _failures(doc, results)
    write_text_atomic(run.file("report.md"), doc.markdown())
    write_text_atomic(run.file("report.html"), doc.html(base=run.path))
    return {
        "report": str(run.file("report.md")),
        "html": str(run.file("report.html")),
        "headline": headline(table, profiles, points, labels, plan),
        "plots": [p for p, _ in plots],
        "budget": budget,
        "cases": len(results),
        "failed": sum(1 for r in results if not r.get("ok")),
    }


def headline(table, profiles, points, labels, plan) -> dict:
    """The figures `lab run` ends with: per profile and network condition, each test's primary
    metric as mean ± sd (n) over the successful repetitions (the one its parameters measure:
    doc.entry_primary); a test whose records are several points (a bidir test's directions,
    mtu's families) has a column per point, named as its table is."""
    tests = {t["label"]: t["test"] for t in plan.get("tests", [])}
    prims = label_primaries(plan)
    cols = []  # (label, point)
    header = ["profile", "condition"]
    for lb in labels:
        rows_l = rows_where(table, test_label=lb)
        if draws(tests.get(lb, ""), "rate-sweep") or not rows_l:
            continue
        col, unit, _, _ = prims[lb]
        npoints = sorted({r["point"] for r in rows_l})
        for pidx in npoints:
            which = _point_words(rows_l, pidx, len(npoints))
            name = labelled(lb, metric_name(col)) + (f", {which}" if which else "")
            header.append(f"{name} ({unit.split()[0]})")
            cols.append((lb, pidx))
    rows = []
    for prof in profiles:
        for pt in in_order([r["impairment"] for r in table], points):
            cells = []
            for lb, pidx in cols:
                col, _, scale, _ = prims[lb]
                all_rs = rows_where(table, test_label=lb, profile=prof, impairment=pt, point=pidx)
                rs = [r for r in all_rs if r["ok"]]
                failed = len(all_rs) - len(rs)
                st = stats_of([r[col] for r in rs])
                na = st is None and rs and all(r.get("not_applicable") for r in rs)
                cells.append(
                    ("n/a" if na else stat_cell(st, scale))
                    + (f" [{failed} failed]" if failed else "")
                )
            if any(c != "-" for c in cells):
                rows.append([prof, pt] + cells)
    return {"header": header, "rows": rows}


def _results_tables(doc, table, profiles, points, labels, plan, results, manifest) -> None:
    doc.h("Results")
    doc.p(
        "Mean ± sample standard deviation (n = successful repetitions) per profile and "
        "network condition; a cell of n=1 is one value, whose spread is unknown, so it has no "
        "± (nor its bar an error bar). Full per-repetition data in `results.csv`, statistics per "
        "case and metric in `summary.csv`."
    )
    _unsettled(doc, results, plan)
    tests = {t["label"]: t["test"] for t in plan.get("tests", [])}
    entries = {t["label"]: t for t in plan.get("tests", [])}
    present_points = in_order([r["impairment"] for r in table], points)
    for label in labels:
        test = tests[label]
        col, unit, scale, _ = entry_primary(entries[label])
        rows_l = rows_where(table, test_label=label)
        if not rows_l:
            continue
        npoints = sorted({r["point"] for r in rows_l})
        if draws(test, "rate-sweep"):
            rates = sorted({r["rate_mbit"] for r in rows_l if r["rate_mbit"] is not None})
            header = ["profile", "impairment"] + [f"{r:g} Mbit/s" for r in rates]
            out = []
            for prof in profiles:
                for pt in present_points:
                    rs = rows_where(rows_l, profile=prof, impairment=pt, ok=True)
                    if not rs and not rows_where(rows_l, profile=prof, impairment=pt):
                        continue
                    out.append(
                        [prof, pt]
                        + [
                            stat_cell(
                                stats_of([r[col] for r in rs if r["rate_mbit"] == rate]), scale
                            )
                            for rate in rates
                        ]
                    )
            doc.p(f"**{label}** ({test}): received rate ({unit.split()[0]}) per target rate")
            doc.table(header, out)
            continue
        if draws(
            test, "load-latency"
        ):  # latency under load: a row per case, its figures side by side
            rrul_table(doc, label, test, rows_l, profiles, present_points)
            continue
        # set-up and rekey (handshake): a table of its own for each part its rows measured
        cold = draws(test, "establishment") and measured(rows_l, ESTABLISHMENT_STATUS)
        if cold:
            establishment_table(doc, label, test, rows_l, profiles, present_points, results)
        if draws(test, "rekey") and measured(rows_l, REKEY_STATUS):
            rekey_table(doc, label, test, rows_l, profiles, present_points)
            _not_applicable_note(doc, rows_l)
            continue
        if cold:
            continue
        extras = [
            c
            for c in SIDE_METRICS
            if c != col and any(r.get(c) is not None for r in rows_l if r["ok"])
        ]
        if extras:  # a datagram test: loss and jitter beside the rate, one row per case
            _side_by_side(doc, label, test, rows_l, profiles, present_points, extras)
            loss_notes(doc, label, test, rows_l, results, profiles, present_points)
            continue
        header = ["profile"] + present_points
        for pidx in npoints:
            out = []
            for prof in profiles:
                row = [prof]
                for pt in present_points:
                    all_rs = rows_where(rows_l, profile=prof, impairment=pt, point=pidx)
                    rs = [r for r in all_rs if r["ok"]]
                    st, fig = stats_of([r[col] for r in rs]), imported_figure(rs, col)
                    if st is not None and fig is not None:  # lab import: the source's n and sd
                        st = {**st, "n": fig["n"], "sd": fig["sd"]}
                    if st is not None and st["sd"] is None:
                        c = f"{fmt_value(st['mean'] * scale)} (n={st['n']}, sd not given)"
                    elif st is None and all_rs and all(r.get("not_applicable") for r in all_rs):
                        c = "n/a"
                    else:
                        c = stat_cell(st, scale)
                    failed = len(all_rs) - len(rs)
                    row.append(c + (f" [{failed} failed]" if failed else ""))
                out.append(row)
            which = _point_words(rows_l, pidx, len(npoints))
            what = f", {which}" if point_directions(rows_l) else f" ({which})" if which else ""
            doc.p(f"**{label}** ({test}{what}): {metric_name(col)} ({unit.split()[0]})")
            doc.table(header, out)
            _not_applicable_note(doc, rows_where(rows_l, point=pidx))
    _cpu_table(doc, table, profiles, labels, tests, results, manifest)


def _point_words(rows_l: list[dict], pidx: int, npoints: int) -> str:
    """What a point of a test is: its direction where the points are directions (a bidir test),
    'IPv6' for a point whose rows all probed one family other points do not (mtu's families),
    else 'point N'; '' for a test of one point."""
    if npoints < 2:
        return ""
    if dirs := point_directions(rows_l):
        return dirs[pidx]
    ips = {r["ip"] for r in rows_where(rows_l, point=pidx)}
    if len(ips) == 1 and len({r["ip"] for r in rows_l}) > 1:
        return f"IPv{ips.pop()}"
    return f"point {pidx}"


def _not_applicable_note(doc: Doc, rows_p: list[dict]) -> None:
    """Why the n/a cells of a table do not apply, once per reason, with the profiles."""
    why: dict[str, list[str]] = {}
    for r in rows_p:
        if r.get("not_applicable"):
            profs = why.setdefault(r["not_applicable"], [])
            if r["profile"] not in profs:
                profs.append(r["profile"])
    for reason, profs in why.items():
        doc.p(f"n/a ({', '.join(profs)}): not applicable, {reason}.")


#: the metrics a test's table shows beside its primary one when its records have them
SIDE_METRICS = {"loss_pct": "%", "jitter_ms": "ms"}


def _side_by_side(doc, label, test, rows_l, profiles, points, extras) -> None:
    col, unit, scale, _ = primary(test)
    dirs = point_directions(rows_l)  # a bidir test: a row per direction
    header = ["profile", "condition"] + (["direction"] if dirs else [])
    header += [f"{metric_name(col)} ({unit.split()[0]})"] + [
        f"{metric_name(c)} ({SIDE_METRICS[c]})" for c in extras
    ]
    out = []
    for prof, pt, rs, failed, pidx in cells(
        rows_l, profiles, points, sorted(dirs) if dirs else [0]
    ):
        where = [prof, pt] + ([dirs[pidx]] if dirs else [])
        if not failed and all(r.get("not_applicable") for r in rs):
            out.append(where + ["n/a"] + ["n/a" for _ in extras])
            continue
        out.append(
            where
            + [stat_cell(stats_of([r[col] for r in rs]), scale) + failed_mark(failed)]
            + [stat_cell(stats_of([r[c] for r in rs]), 1.0) for c in extras]
        )
    doc.p(
        f"**{label}** ({test}): {metric_name(col)} ({unit.split()[0]}) with "
        + " and ".join(metric_name(c) for c in extras)
    )
    doc.table(header, out)
    _not_applicable_note(doc, rows_l)


def _unsettled(doc, results, plan) -> None:
    """Flag the tests too short to settle: their throughput still rising or falling at the end."""
    hit = unsettled(results, plan)
    if not hit:
        return
    doc.warn(
        f"{len(hit)} test(s) too short to settle: throughput still rising or falling when they "
        "ended",
        "Results",
    )
    doc.p(
        "**Tests too short to settle** (their throughput's last half differs from its first half "
        f"by more than {UNSETTLED_SHARE:.0%}; a longer `duration_s`, or more RTTs per test, "
        "measures the steady state):"
    )
    doc.table(
        ["case", "throughput", "over", "RTT (ping)"],
        [
            [
                f"`{u['case']}`",
                f"{u['trend']}: {fmt_value(u['from_mbit'])} -> {fmt_value(u['to_mbit'])} Mbit/s",
                f"{u['seconds']:g} s",
                f"{fmt_value(u['rtt_ms'])} ms ({u['seconds'] * 1000 / u['rtt_ms']:.0f} RTTs)"
                if u["rtt_ms"]
                else "-",
            ]
            for u in hit
        ],
    )


NODE_ROLES = ("vpn_client", "vpn_server", "traffic_client", "traffic_server")
ROLE_WORDS = {
    "vpn_client": "VPN client",
    "vpn_server": "VPN server",
    "traffic_client": "traffic client",
    "traffic_server": "traffic server",
}


def cpu_columns(roles: dict) -> list[tuple[str | None, list[str]]]:
    """The node columns of the CPU table: (node, its roles in NODE_ROLES order), a node with
    several roles (the VPN client is often the traffic client too) once; a role whose node the
    results do not name gets a column of its own, node None."""
    cols: dict[str, tuple[str | None, list[str]]] = {}
    for role in NODE_ROLES:
        node = roles.get(role)
        cols.setdefault(node or f"?{role}", (node, []))[1].append(role)
    return list(cols.values())


def cpu_column_header(node: str | None, node_roles: list[str]) -> str:
    words = ", ".join(ROLE_WORDS[r] for r in node_roles)
    return f"{node} ({words})" if node else f"{words} node"


def _cpu_table(doc, table, profiles, labels, tests, results, manifest) -> None:
    """CPU during the unimpaired throughput tests: each node once (with its roles) in board
    cores of its CPU profile and in host cores, the VPN daemons and the host's busy and softirq
    time in host cores, so that every figure can be set against the others (docs/cpu.md "Board
    cores and host cores")."""
    roles = next((r["roles"] for r in results if r.get("roles")), {})
    cpu = manifest.get("cpu") or {}
    columns = cpu_columns(roles)
    ncores = host_ncores(results)

    def host_share(pct: float | None) -> str:  # % of all host cores -> host cores
        if pct is None:
            return "-"
        if not ncores:
            return f"{pct:.1f} % of all host cores"
        return host_cores_words(pct / 100 * ncores, of=ncores)

    cpu_rows = []
    for label in labels:
        if not draws(tests[label], "throughput"):
            continue
        for prof in profiles:
            rs = rows_where(table, test_label=label, profile=prof, ok=True)
            rs = [r for r in rs if not r["impairment_spec"]]
            if not rs:
                continue
            nodes = [
                usage_words(mean_of([r[f"cpu_{rr[0]}_pct"] for r in rs]), cpu.get(node))
                for node, rr in columns
            ]
            daemons = mean_of([r["daemon_cpu_pct"] for r in rs])
            cpu_rows.append(
                [label, prof]
                + nodes
                + [host_cores_words(daemons / 100) if daemons is not None else "-"]
                + [
                    host_share(mean_of([r[c] for r in rs]))
                    for c in ("host_busy_pct", "host_softirq_pct")
                ]
            )
    if not cpu_rows:
        return
    capacity = {}
    for node, _ in columns:
        if node and cpu.get(node) and (words := capacity_words(cpu.get(node))) != "-":
            capacity.setdefault(words, []).append(node)
    has = "; ".join(f"{', '.join(nodes)}: {words}" for words, nodes in capacity.items())
    doc.p(
        "**CPU during the throughput tests without impairment.** One column per node, named "
        "with its roles; a node capped by a CPU profile in board cores of the cores it has "
        "(1.00 of 1 = its cap is saturated) and in host cores, an uncapped node in host cores"
        + (f" ({has})" if has else "")
        + ". VPN daemons: the tunnel's daemons at both ends together, in host cores (inside "
        "the nodes' figures). Host busy and host softirq: every process and the kernel on this "
        "machine, "
        + (f"in host cores of the {ncores} it has" if ncores else "in % of all its cores")
        + ", so host busy is at least the nodes' and daemons' sum up to sampling; "
        "kernel data planes (WireGuard, XFRM) work mostly in softirq, which no node's cgroup is "
        'charged for (docs/cpu.md "Board cores and host cores").'
    )
    doc.table(
        ["test", "profile"]
        + [cpu_column_header(node, rr) for node, rr in columns]
        + ["VPN daemons", "host busy", "host softirq"],
        cpu_rows,
    )


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
