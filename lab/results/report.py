"""Turn a run directory into tables, plots (PNG + SVG) and report.md / report.html.

Everything is computed from results.jsonl, timeline.jsonl and manifest.json, so `lab report
RUN_DIR` regenerates the same report at any time (also for a run that was interrupted).
The document and its statistics live in lab.results.doc, the plots in lab.results.plots; their names stay
importable from here.
"""

from __future__ import annotations

from pathlib import Path

from lab.model import dilation
from lab.results.plots import THROUGHPUT_TESTS, make_plots
from lab.results.doc import (
    Doc,
    _cell,
    _fmt,
    _group,
    _mean,
    _order,
    _stats,
    primary,
)
from lab.results.doc import board_cpu_text, metric_name
from lab.substrate.local.monitor import host_contention_warning
from lab.substrate.registry import report_rows, report_warnings
from lab.results.rundir import RunDir, imported_figure, time_budget, write_tables
from lab.core.state import write_text_atomic


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
    _warnings(doc, results, manifest)
    if plan.get("description"):
        doc.p(plan["description"])
    for n in plan.get("notes") or []:
        doc.p(f"**Note:** {n}")
    _facts(doc, run, manifest, plan)
    _conditions(doc, results, points)
    _throttling(doc, results)
    _budget(doc, budget, len(results), sum(1 for r in results if r.get("ok")))
    _results_tables(doc, table, profiles, points, labels, plan, results, manifest)
    _recommendation(doc, table, profiles, points, labels, manifest)
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
    metric as mean ± sd (n) over the successful repetitions of its first record."""
    tests = {t["label"]: t["test"] for t in plan.get("tests", [])}
    cols = [lb for lb in labels if tests.get(lb) != "udp-sweep" and _group(table, test_label=lb)]
    header = ["profile", "condition"]
    for lb in cols:
        col, unit, _, _ = primary(tests[lb])
        header.append(f"{lb} {metric_name(col)} ({unit.split()[0]})")
    rows = []
    for prof in profiles:
        for pt in _order([r["impairment"] for r in table], points):
            cells = []
            for lb in cols:
                col, _, scale, _ = primary(tests[lb])
                all_rs = _group(table, test_label=lb, profile=prof, impairment=pt, point=0)
                rs = [r for r in all_rs if r["ok"]]
                failed = len(all_rs) - len(rs)
                cells.append(
                    _cell(_stats([r[col] for r in rs]), scale)
                    + (f" [{failed} failed]" if failed else "")
                )
            if any(c != "-" for c in cells):
                rows.append([prof, pt] + cells)
    return {"header": header, "rows": rows}


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
    rows += report_rows(m.get("substrate"))
    if False in calibrated:
        rows.append(["warning", UNCALIBRATED])
    rows += _calibration_rows(m)
    rows += _shard_rows(m)
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


def _shard_rows(m: dict) -> list[list[str]]:
    """A shard's place in its plan, or the machines a merged run came from (docs/scale.md)."""
    if m.get("shard"):
        return [["shard", f"{m['shard']['index']}/{m['shard']['count']} (lab merge joins them)"]]
    rows = []
    for x in m.get("merged_from") or []:
        cal = x.get("calibration") or {}
        fits = ", ".join(
            f"{n} core_share {c.get('core_share'):.3g}"
            if c.get("calibrated")
            else f"{n} uncalibrated"
            for n, c in (cal.get("profiles") or {}).items()
        )
        sh = x.get("shard") or {}
        rows.append(
            [
                f"shard {sh.get('index')}/{sh.get('count')}",
                f"{x.get('hostname')}, {cal.get('host_cpu_model')}" + (f"; {fits}" if fits else ""),
            ]
        )
    return rows


UNCALIBRATED = (
    "CPU profile uncalibrated on this machine: node CPU caps are placeholders, so throughput and "
    "CPU figures do not stand for the board (`lab calibrate PROFILE`)"
)


def _warnings(doc: Doc, results: list[dict], m: dict) -> None:
    """What makes the figures below mean less than they seem, at the top of the report."""
    cpus = [c for c in (m.get("cpu") or {}).values() if c]
    lab_warnings = [str(w) for w in m.get("lab_warnings") or []]
    # the lab's own warning names the profile and why (stale, never run): the generic one would
    # repeat it
    if any(c.get("calibrated") is False for c in cpus) and not any(
        "uncalibrated" in w for w in lab_warnings
    ):
        doc.warn(UNCALIBRATED)
    for c in cpus:
        if c.get("not_applied"):
            doc.warn(f"CPU cap of profile {c.get('profile')} not applied ({c['not_applied']}).")
        fit = (c.get("calibration") or {}).get("fit") or {}
        if fit.get("warning"):
            doc.warn(fit["warning"])
    for w in report_warnings(m.get("substrate")):
        doc.warn(w)
    for w in lab_warnings:
        doc.warn(w)
    failed = [r for r in results if not r.get("ok")]
    if failed:
        names = ", ".join(f"`{r['case']}`" for r in failed[:5]) + (
            " ..." if len(failed) > 5 else ""
        )
        doc.warn(
            f"{len(failed)} of {len(results)} case repetitions failed ({names}); see Failed "
            "cases. Their cells show '[N failed]'."
        )
    throttled = sum(
        1
        for r in results
        if (((r.get("monitor") or {}).get("host") or {}).get("vcgencmd") or {}).get("throttled")
    )
    if throttled:
        doc.warn(f"{throttled} test(s) ran throttled by the Pi firmware (see Set-up).")
    if contended := host_contention_warning(results):
        doc.warn(contended)


def _calibration_rows(m: dict) -> list[list[str]]:
    """Per calibrated CPU profile of the run: how well its fitted cap imitates the board on this
    host (residual per primitive against the threshold), and the poor-fit warning if any."""
    from lab.model.cpucalibration import fit_quality

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
            doc.warn(f"impairment point {name}: {w}")


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


def _results_tables(doc, table, profiles, points, labels, plan, results, manifest) -> None:
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
            doc.p(f"**{label}** ({test}): received rate ({unit.split()[0]}) per target rate")
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
                    st, fig = _stats([r[col] for r in rs]), imported_figure(rs, col)
                    if st is not None and fig is not None:  # lab import: the source's n and sd
                        st = {**st, "n": fig["n"], "sd": fig["sd"]}
                    if st is not None and st["sd"] is None:
                        c = f"{_fmt(st['mean'] * scale)} (n={st['n']}, sd not given)"
                    else:
                        c = _cell(st, scale)
                    failed = len(all_rs) - len(rs)
                    row.append(c + (f" [{failed} failed]" if failed else ""))
                out.append(row)
            what = f" (point {pidx})" if len(npoints) > 1 else ""
            doc.p(f"**{label}** ({test}{what}): {metric_name(col)} ({unit.split()[0]})")
            doc.table(header, out)
    _cpu_table(doc, table, profiles, labels, tests, results, manifest)


NODE_ROLES = ("vpn_client", "vpn_server", "traffic_client", "traffic_server")


def _cpu_table(doc, table, profiles, labels, tests, results, manifest) -> None:
    """CPU during the unimpaired throughput tests: each node in board cores of its CPU profile
    (and % of the board), the host's busy and softirq shares of all its cores separately."""
    roles = next((r["roles"] for r in results if r.get("roles")), {})
    cpu = manifest.get("cpu") or {}
    cpu_rows = []
    for label in labels:
        if tests[label] not in THROUGHPUT_TESTS:
            continue
        for prof in profiles:
            rs = _group(table, test_label=label, profile=prof, ok=True)
            rs = [r for r in rs if not r["impairment_spec"]]
            if not rs:
                continue
            nodes = [
                board_cpu_text(_mean([r[f"cpu_{role}_pct"] for r in rs]), cpu.get(roles.get(role)))
                for role in NODE_ROLES
            ]
            host = [
                f"{v:.1f} %" if (v := _mean([r[c] for r in rs])) is not None else "-"
                for c in ("host_busy_pct", "host_softirq_pct")
            ]
            daemons = _mean([r["daemon_cpu_pct"] for r in rs])
            cpu_rows.append(
                [label, prof]
                + nodes
                + [f"{_fmt(daemons)} % host core" if daemons is not None else "-"]
                + host
            )
    if not cpu_rows:
        return
    ncores = next(
        (n for r in results if (n := ((r.get("monitor") or {}).get("host") or {}).get("ncores"))),
        None,
    )
    doc.p(
        "**CPU during the throughput tests without impairment.** Nodes: the node's cgroup in "
        "cores of its board's CPU profile (1.00 of 1 = the node's cap is saturated), and the share "
        "of the whole board; an uncapped node in % of one host core. VPN daemons: % of one host "
        "core. Host busy and host softirq: shares of all "
        + (f"{ncores} " if ncores else "")
        + "host cores, shared with anything else on this machine; kernel data planes "
        "(WireGuard, XFRM) work mostly in softirq, which no node's cgroup is charged for."
    )
    doc.table(
        [
            "test",
            "profile",
            "VPN client node",
            "VPN server node",
            "traffic client node",
            "traffic server node",
            "VPN daemons",
            "host busy",
            "host softirq",
        ],
        cpu_rows,
    )


def _recommendation(doc, table, profiles, points, labels, manifest) -> None:
    """Best profile per network condition (study D): the highest mean of the main throughput
    test, the lowest mean RTT; the no-VPN baseline is shown for reference but not ranked."""
    tests = {r["test_label"]: r["test"] for r in table}
    thr = next((lb for lb in labels if tests.get(lb) in ("tcp", "udp", "scp")), None)
    lat = next((lb for lb in labels if tests.get(lb) == "ping"), None)
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
