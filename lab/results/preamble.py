"""The report's sections before its results: the warnings at the top, the set-up (machine, CPU
caps and their calibration, shards, profiles, tool versions), the network conditions in force,
throttling and the time budget. lab.results.report puts them in order."""

from __future__ import annotations

from lab.model.cpucalibration import fit_quality
from lab.results.doc import Doc, in_order
from lab.results.rundir import RunDir
from lab.substrate.local.monitor import host_contention_warning, host_held_nodes
from lab.substrate.registry import report_rows, report_warnings


def setup_section(doc: Doc, run: RunDir, m: dict, plan: dict) -> None:
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
    rows += calibration_rows(m)
    rows += shard_rows(m)
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


def what_ran_section(doc: Doc, plan: dict, results: list[dict]) -> None:
    """What really ran, from plan.json (the plan after its `-o` overrides) and the records: the
    overrides, and per test its parameters, repetitions and the wall time of its cases. The
    plan file's description is quoted as written, so it is marked when overrides changed it."""
    overrides = [str(o) for o in plan.get("overrides") or []]
    doc.h("What ran")
    if plan.get("description"):
        doc.p(
            ("Plan description, as the plan file has it (the overrides below change it): "
             if overrides else "Plan description: ")
            + plan["description"]
        )  # fmt: skip
    for n in plan.get("notes") or []:
        doc.p(f"**Note:** {n}")
    doc.p(
        "Overridden on the command line: " + " ".join(f"`-o {o}`" for o in overrides) + "."
        if overrides
        else "No `-o` overrides: the plan file as written."
    )
    rows = []
    for t in plan.get("tests", []):
        params = t.get("params") or {}
        shown = ", ".join(
            f"{k}={v}" for k, v in params.items() if k != "port" and not k.startswith("adaptive_")
        )
        rs = [r for r in results if r.get("label") == t["label"]]
        secs = [r["seconds"] for r in rs if r.get("seconds") is not None]
        reps = (
            f"{t['reps']} per condition"
            if t.get("reps") is not None
            else f"{plan.get('reps')} unimpaired, {plan.get('impaired_reps')} impaired"
        )
        rows.append(
            [
                t["label"],
                t["test"],
                shown or "-",
                reps,
                f"{len(rs)} ({sum(1 for r in rs if r.get('ok'))} ok)",
                f"{sum(secs) / len(secs):.1f} s" if secs else "-",
            ]
        )
    if rows:
        doc.table(
            ["test", "kind", "parameters as run", "repetitions", "cases recorded",
             "wall time per case"],
            rows,
        )  # fmt: skip


def shard_rows(m: dict) -> list[list[str]]:
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


def warnings_section(doc: Doc, results: list[dict], m: dict) -> None:
    """What makes the figures below mean less than they seem, at the top of the report."""
    cpus = [c for c in (m.get("cpu") or {}).values() if c]
    lab_warnings = [str(w) for w in m.get("lab_warnings") or []]
    # the lab's own warning names the profile and why (stale, never run): the generic one would
    # repeat it
    if any(c.get("calibrated") is False for c in cpus) and not any(
        "uncalibrated" in w for w in lab_warnings
    ):
        doc.warn(UNCALIBRATED, "Set-up")
    for c in cpus:
        if c.get("not_applied"):
            doc.warn(
                f"CPU cap of profile {c.get('profile')} not applied ({c['not_applied']}).",
                "Set-up",
            )
        fit = (c.get("calibration") or {}).get("fit") or {}
        if fit.get("warning"):
            doc.warn(fit["warning"], "Set-up")
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
            "cases. Their cells show '[N failed]'.",
            "Failed cases",
        )
    throttled = sum(
        1
        for r in results
        if (((r.get("monitor") or {}).get("host") or {}).get("vcgencmd") or {}).get("throttled")
    )
    if throttled:
        doc.warn(f"{throttled} test(s) ran throttled by the Pi firmware (see Set-up).", "Set-up")
    if contended := host_contention_warning(results):
        held = [(r["case"], host_held_nodes(r.get("monitor") or {})) for r in results]
        doc.warn(
            contended,
            details="The tests: "
            + ", ".join(f"`{case}` (nodes {', '.join(nodes)})" for case, nodes in held if nodes)
            + ".",
        )


def calibration_rows(m: dict) -> list[list[str]]:
    """Per calibrated CPU profile of the run: how well its fitted cap imitates the board on this
    host (residual per primitive against the threshold), and the poor-fit warning if any."""
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


def conditions_section(doc: Doc, results: list[dict], points: list[str]) -> None:
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
            for name in in_order(list(rows), points)
        ],
    )
    for how in sorted(set().union(*(r["how"] for r in rows.values()))):
        doc.p(f"Wire packets: {how}.")
    for name in in_order(list(rows), points):
        for w in sorted(rows[name].get("warnings", ())):
            doc.p(f"**Warning ({name}):** {w}")
            doc.warn(f"impairment point {name}: {w}", "Network conditions in force")


def throttling_section(doc: Doc, results: list[dict]) -> None:
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
        f"a slowed board. {names}. Column `firmware_throttled` in results.csv."
    )


def budget_section(doc: Doc, b: dict, cases: int, ok: int) -> None:
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
