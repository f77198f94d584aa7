"""Two runs side by side: per case and metric, both means and the ratio B/A, as CSV, Markdown and
a plot, and what differs between the runs (topology, CPU profile, versions, data planes,
impairment backend: read from the two manifests) so a ratio has its context. Typical use: the
same plan emulated here (A) and run on the real boards or imported from a published table (B);
the fidelity section (lab.results.fidelity) says how well A predicts B.
"""

from __future__ import annotations

import json
from pathlib import Path

from lab.results import fidelity
from lab.results.plots import load_pyplot, save_figure
from lab.results.doc import Doc, Primary, label_primaries, stat_cell, metric_name, primary
from lab.results.rundir import RunDir, rows, summarize, to_csv
from lab.core.state import write_text_atomic

KEY = ("profile", "impairment", "test_label", "point", "metric")
COLUMNS = [
    *KEY,
    "test",
    "n_a",
    "mean_a",
    "sd_a",
    "n_b",
    "mean_b",
    "sd_b",
    "ratio_b_over_a",
]


def _summary(run: RunDir) -> dict[tuple, dict]:
    return {tuple(s[k] for k in KEY): s for s in summarize(rows(run.name, run.load_results()))}


def _mains(ra: RunDir, rb: RunDir) -> dict[str, Primary]:
    """Each test label's main metric (doc.label_primaries: a rekey-only handshake entry's is its
    rekey recovery), A's plan over B's where both have the label."""
    return {**label_primaries(rb.plan_json()), **label_primaries(ra.plan_json())}


def main_metric(r: dict, mains: dict[str, Primary]) -> Primary:
    """The main metric of a compare row's test entry; its test's where no plan names the label."""
    return mains.get(r["test_label"]) or primary(r["test"])


def compare(a: Path, b: Path, out: Path | None = None) -> dict:
    ra, rb = RunDir(Path(a)).check(), RunDir(Path(b)).check()
    mains = _mains(ra, rb)
    out = Path(out) if out is not None else rb.path / f"compare-{ra.name}"
    out.mkdir(parents=True, exist_ok=True)
    sa, sb = _summary(ra), _summary(rb)
    table = []
    for key in [*sa, *(k for k in sb if k not in sa)]:
        x, y = sa.get(key), sb.get(key)
        base = x or y
        ratio = y["mean"] / x["mean"] if x and y and x["mean"] else None
        table.append(
            {
                **dict(zip(KEY, key, strict=True)),
                "test": base["test"],
                "n_a": x["n"] if x else 0,
                "mean_a": x["mean"] if x else None,
                "sd_a": x["sd"] if x else None,
                "n_b": y["n"] if y else 0,
                "mean_b": y["mean"] if y else None,
                "sd_b": y["sd"] if y else None,
                "ratio_b_over_a": ratio,
            }
        )
    only_a = [k for k in sa if k not in sb]
    write_text_atomic(out / "compare.csv", to_csv(table, COLUMNS))

    main = [r for r in table if main_metric(r, mains).column == r["metric"]]
    doc = Doc(f"{rb.name} (B) compared with {ra.name} (A)")
    differs = differences(ra, rb)
    doc.h("What differs between the runs")
    if differs["rows"]:
        doc.table(["aspect", "what", f"A ({ra.name})", f"B ({rb.name})"], differs["rows"])
    else:
        doc.p("Nothing the two manifests record differs.")
    if differs["same"]:
        doc.p("The same in both runs: " + ", ".join(differs["same"]) + ".")
    doc.h("Main metric per case")
    doc.p("Main metric of every case: mean ± sd (n = successful repetitions) in each run and the "
          "ratio of the means B/A. Every metric is in `compare.csv`.")  # fmt: skip
    doc.table(
        ["profile", "impairment", "test", "point", "metric", "unit", "A", "B", "B/A"],
        [
            [r["profile"], r["impairment"], r["test_label"], r["point"], metric_name(r["metric"]),
             main_metric(r, mains).unit.split()[0], _side(r, "a", mains), _side(r, "b", mains),
             f"{r['ratio_b_over_a']:.3f}" if r.get("ratio_b_over_a") is not None else "-"]
            for r in main
        ],
    )  # fmt: skip
    plot = _plot(out, ra.name, rb.name, main, mains)
    if plot:
        doc.img(plot, "A vs B")
    fid = fidelity.analyse(table, mains)
    fidelity.write(out, fid)
    fidelity.section(doc, fid, ra.name, rb.name)
    write_text_atomic(out / "compare.md", doc.markdown())
    write_text_atomic(out / "compare.html", doc.html(out))
    write_text_atomic(out / "differs.json", json.dumps(differs, indent=1) + "\n")
    return {"out": str(out), "rows": len(table), "matched": sum(1 for r in table if r["n_a"]
            and r["n_b"]), "only_a": len(only_a), "only_b": len([k for k in sb if k not in sa]),
            "fidelity": fid["summary"], "differs": len(differs["rows"])}  # fmt: skip


def _plot(out: Path, name_a: str, name_b: str, main: list[dict], mains) -> str | None:
    labels = list(dict.fromkeys(r["test_label"] for r in main if r["n_a"] and r["n_b"]))
    if not labels:
        return None
    plt = load_pyplot()
    fig, axes = plt.subplots(1, len(labels), figsize=(max(6, 4.5 * len(labels)), 4.5),
                             squeeze=False, layout="constrained")  # fmt: skip
    for ax, lb in zip(axes[0], labels, strict=True):
        rs = [r for r in main if r["test_label"] == lb and r["n_a"] and r["n_b"]]
        unit = main_metric(rs[0], mains)
        scale = unit.scale
        xs = [f"{r['profile']}\n{r['impairment']}" + (f" #{r['point']}" if r["point"] else "")
              for r in rs]  # fmt: skip
        pos = range(len(rs))
        ax.bar([i - 0.2 for i in pos], [r["mean_a"] * scale for r in rs], 0.4, label=f"A {name_a}")
        ax.bar([i + 0.2 for i in pos], [r["mean_b"] * scale for r in rs], 0.4, label=f"B {name_b}")
        for i, r in zip(pos, rs, strict=True):
            if r["ratio_b_over_a"] is not None:
                top = max(r["mean_a"], r["mean_b"]) * scale
                ax.annotate(f"{r['ratio_b_over_a']:.2f}x", (i, top), ha="center", va="bottom",
                            fontsize=7)  # fmt: skip
        ax.set_xticks(list(pos), xs, rotation=45, ha="right", fontsize=7)
        name = metric_name(rs[0]["metric"])
        ax.set_ylabel(f"{name[:1].upper()}{name[1:]} ({unit.unit.split()[0]})")  # RTT stays RTT
        ax.set_title(lb)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    return save_figure(fig, RunDir(out), "compare")


def _side(r: dict, side: str, mains: dict[str, Primary]) -> str:
    """One run's figure of a case in the metric's unit: 'mean ± sd (n=N)'."""
    n, mean = r[f"n_{side}"], r[f"mean_{side}"]
    if not n or mean is None:
        return "-"
    scale = main_metric(r, mains).scale
    return stat_cell({"n": n, "mean": mean, "sd": r[f"sd_{side}"] or 0.0}, scale)


# ---------------------------------------------------------------------- what differs

NOT_RECORDED = "not recorded"
#: an item the other run has and this one lacks altogether (a profile it did not run, a node)
ABSENT = "not in this run"


def _text(v) -> str:
    if v is None or v == {} or v == []:
        return NOT_RECORDED
    return v if isinstance(v, str) else json.dumps(v, sort_keys=True)


def _cpu_text(c: dict | None) -> str:
    """A node's CPU profile as the run applied it: name, calibration, cap."""
    if not c or not c.get("profile"):
        return "no CPU profile (uncapped)"
    text = str(c["profile"])
    if c.get("not_applied"):
        return text + f", cap not applied ({c['not_applied']})"
    text += ", calibrated" if c.get("calibrated") else ", uncalibrated (placeholder cap)"
    if c.get("core_share"):
        text += f", a board core = {c['core_share']:.3g} host core"
    if c.get("emulated_cores"):
        text += f", {c['emulated_cores']:g} of {c.get('board_cores') or '?'} board cores"
    if (c.get("dilation") or 1.0) != 1.0:  # lab.model.dilation: the run slowed down, figures back
        text += f", time-dilated x{c['dilation']:g}"
    if c.get("period_us"):  # the CFS period the quotas were handed out in (docs/cpu.md)
        text += f", CFS period {c['period_us'] / 1000:g} ms"
    return text


def _nic_text(rec: dict | None) -> str:
    """The boards' per-hop NIC latency as the run applied it (manifest nic_latency)."""
    if not rec:
        return NOT_RECORDED
    if rec.get("text"):  # the substrate's own words (boards: their own NICs)
        return rec["text"]
    each = ", ".join(f"{k} {v.get('us', 0):g} us" for k, v in sorted((rec.get("directions") or
                     {}).items()))  # fmt: skip
    state = f"applied ({rec.get('backend')})" if rec.get("applied") else "not applied"
    if rec.get("applied") not in (True, False, None):  # a side path: some tests only
        state = f"applied to {rec['applied']} ({', '.join(rec.get('tests') or [])}; side path)"
    return f"{rec.get('mode')}: {each or 'none'}, {state}"


def _link_text(link: dict) -> str:
    opts = {k: v for k, v in link.items() if k not in ("index", "node1", "node2", "intf1",
            "intf2") and v is not None}  # fmt: skip
    return ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in
                     sorted(opts.items())) or "no options"  # fmt: skip


def aspects(m: dict, plan: dict) -> dict[str, dict[str, str]]:
    """What a run ran on, from its manifest (and plan): aspect -> item -> text. An imported
    run's manifest records little; what it lacks reads 'not recorded'."""
    topo = m.get("topology") or {}
    out: dict[str, dict[str, str]] = {
        "topology": {
            "file": Path(
                str(topo.get("source") or (plan.get("topology") or {}).get("file") or "")
            ).name
            or NOT_RECORDED,
            "parameters": _text(topo.get("params") or (plan.get("topology") or {}).get("params")),
            "nodes": ", ".join(sorted(topo.get("nodes") or {})) or NOT_RECORDED,
            **{
                f"link {lk.get('node1')}-{lk.get('node2')}": _link_text(lk)
                for lk in topo.get("links") or []
            },
        },  # fmt: skip
        "CPU profile": {f"node {n}": _cpu_text(c) for n, c in sorted((m.get("cpu") or {}).items())},
        "boards' NICs": {"per-hop latency": _nic_text(m.get("nic_latency"))},
        "versions": {},
        "data plane": {},
        "impairment backend": {},
        "substrate": {},
    }
    cal = m.get("calibration") or {}
    out["CPU profile"]["host CPU model"] = _text(cal.get("host_cpu_model"))
    for name in sorted({c["profile"] for c in (m.get("cpu") or {}).values() if c and
                        c.get("profile")}):  # fmt: skip
        pc = (cal.get("profiles") or {}).get(name)
        out["CPU profile"][f"{name} calibration"] = (
            NOT_RECORDED if pc is None
            else f"core_share {pc.get('core_share'):.3g}, fitted {pc.get('created', '?')}"
            if pc.get("calibrated") else f"none: {pc.get('reason')}"
        )  # fmt: skip
    v = out["versions"]
    v["lab"] = _text(m.get("lab_version"))
    v["git revision"] = _text(m.get("git_revision"))
    kernel = m.get("kernel")
    v["kernel"] = _text(kernel.get("release") if isinstance(kernel, dict) else kernel)
    for tool, ver in sorted((m.get("tool_versions") or {}).items()):
        v[tool] = _text(ver)
    # what boards and nodes of another architecture ran (lab.campaign.setup.node_tool_versions)
    for node, tools in sorted((m.get("node_tool_versions") or {}).items()):
        for tool, ver in sorted((tools or {}).items()):
            v[f"{tool} on {node}"] = _text(ver)
    for prof, e in sorted((m.get("profiles") or {}).items()):
        d = e.get("describe") or {}
        if d.get("version"):
            v[f"{prof} ({d.get('implementation', e.get('driver'))})"] = str(d["version"])
        out["data plane"][prof] = _text(e.get("path"))
    # every impaired point of the plan: a point none of whose cases ran records no backend
    impaired = [p["name"] for p in plan.get("impairments") or [] if p.get("spec")]
    for point in dict.fromkeys([*impaired, *(m.get("impairment") or {})]):
        per = (m.get("impairment") or {}).get(point) or {}
        backends = sorted({str(a.get("backend")) for a in per.values() if a and a.get("backend")})
        if backends or point in impaired:
            out["impairment backend"][point] = ", ".join(backends) or NOT_RECORDED
    sub = m.get("substrate") or {}
    out["substrate"]["kind"] = _text(sub.get("kind") or m.get("kind"))
    if sub.get("evidence"):
        out["substrate"]["evidence"] = str(sub["evidence"])
    return out


def differences(ra: RunDir, rb: RunDir) -> dict:
    """The rows [aspect, item, A, B] where the two runs' manifests differ, and the aspects that
    are the same in both."""
    a, b = (aspects(r.manifest(), r.plan_json()) for r in (ra, rb))
    rows, same = [], []
    for aspect in a:
        items = list(dict.fromkeys([*a[aspect], *b[aspect]]))
        diff = [
            [aspect, item, a[aspect].get(item, ABSENT), b[aspect].get(item, ABSENT)]
            for item in items
            if a[aspect].get(item, ABSENT) != b[aspect].get(item, ABSENT)
        ]
        rows += diff
        if items and not diff:
            same.append(aspect)
    return {"rows": rows, "same": same}
