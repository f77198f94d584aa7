"""The run's plots (PNG + SVG under plots/, the numbers drawn in plots/<name>.json), computed
from the results table, results.jsonl, the manifest and the plan. The plots of series (RTT, time,
CDF, swept values) are in lab.results.series."""

from __future__ import annotations

import json

from lab.results.series import NO_BAR, condition_legend, drawn_err, series_plots, style_axis
from lab.results.doc import rows_where, mean_of, in_order, stats_of, board_cores, draws
from lab.results.rundir import RunDir
from lab.core.state import write_text_atomic

FORMATS = ("png", "svg")


def load_pyplot():
    """matplotlib's pyplot with the Agg back end (no display)."""
    # here, not at the top: the back end must be chosen before pyplot loads, and a report
    # without plots (or `lab` commands that import this module) need not load matplotlib
    import matplotlib  # ~0.15 s: see above

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"), by matplotlib's rule

    return plt


def save_figure(fig, run: RunDir, name: str, data: dict | None = None) -> str:
    """Write the figure as PNG and SVG, and the numbers it draws as plots/<name>.json."""
    d = run.path / "plots"
    d.mkdir(exist_ok=True)
    if data is not None:
        write_text_atomic(d / f"{name}.json", json.dumps(data, indent=1, default=str) + "\n")
    for ext in FORMATS:
        tmp = d / f".{name}.tmp.{ext}"
        fig.savefig(tmp, format=ext, dpi=110, bbox_inches="tight")
        tmp.replace(d / f"{name}.{ext}")
    load_pyplot().close(fig)
    return f"plots/{name}.png"


def _err(s: dict, scale: float, mode: str) -> tuple[float | None, float | None]:
    """The error bar of one mean below and above it; none (None, None) for one value, whose
    spread is unknown (a bar of 0 would claim none)."""
    if s["n"] < 2:
        return (None, None)
    if mode == "minmax":
        return ((s["mean"] - s["min"]) * scale, (s["max"] - s["mean"]) * scale)
    return (s["sd"] * scale, s["sd"] * scale)


def make_plots(run: RunDir, table: list[dict], plan: dict) -> list[tuple[str, str]]:
    if not table:
        return []
    plt = load_pyplot()
    out: list[tuple[str, str]] = []
    profiles = plan.get("profiles", [])
    tests = {t["label"]: t["test"] for t in plan.get("tests", [])}
    mode = plan.get("error_bars", "sd")
    thr_labels = [lb for lb, t in tests.items() if draws(t, "throughput")]
    unimp = [r for r in table if not r["impairment_spec"] and r["ok"]]
    points = [p["name"] for p in plan.get("impairments", [])]

    # 1. throughput per implementation, no impairment, with error bars
    labels = [lb for lb in thr_labels if rows_where(unimp, test_label=lb)]
    if labels:
        fig, axes = plt.subplots(
            1,
            len(labels),
            figsize=(max(5, 3.2 * len(labels)), 4),
            squeeze=False,
            layout="constrained",
        )
        data = {
            "title": f"Throughput per implementation, no impairment (error bars: {mode}; {NO_BAR})",
            "xlabel": "Profile",
            "ylabel": "Throughput (Mbit/s)",
            "panels": {},
        }
        for ax, lb in zip(axes[0], labels, strict=True):
            xs, ys, errs = [], [], [[], []]
            for p in profiles:
                s = stats_of(
                    [r["throughput_bps"] for r in rows_where(unimp, test_label=lb, profile=p)]
                )
                if s:
                    lo, hi = _err(s, 1e-6, mode)
                    xs.append(p)
                    ys.append(s["mean"] * 1e-6)
                    errs[0].append(lo)
                    errs[1].append(hi)
            data["panels"][lb] = {"none": {"x": xs, "y": ys, "err": errs}}
            ax.bar(range(len(xs)), ys, yerr=drawn_err(errs), capsize=4, color="tab:blue")
            ax.set_xticks(range(len(xs)), xs, rotation=30, ha="right")
            ax.set_title(f"{lb} ({tests[lb]})")
            style_axis(ax, ys, "Throughput (Mbit/s)")
            ax.grid(axis="y", alpha=0.3)
        fig.suptitle(data["title"])
        out.append((save_figure(fig, run, "throughput", data), "throughput per implementation"))

    # 2. throughput per network condition (presets, explicit specs; sweeps: lab.results.series)
    conds = in_order([r["impairment"] for r in table if not r["sweep_parameter"]], points)
    labels = [lb for lb in thr_labels if rows_where(table, test_label=lb, ok=True)]
    if len(conds) >= 2 and labels:
        fig, axes = plt.subplots(
            1,
            len(labels),
            figsize=(max(6, 4.5 * len(labels)), 4),
            squeeze=False,
            layout="constrained",
        )
        data = {
            "title": f"Throughput per network condition (error bars: {mode}; {NO_BAR})",
            "xlabel": "Profile",
            "ylabel": "Throughput (Mbit/s)",
            "panels": {},
        }
        width = 0.8 / max(1, len(conds))
        for ax, lb in zip(axes[0], labels, strict=True):
            panel = data["panels"].setdefault(lb, {})
            for j, c in enumerate(conds):
                xs, ys, errs, failed = [], [], [[], []], []
                for i, p in enumerate(profiles):
                    s = stats_of(
                        [
                            r["throughput_bps"]
                            for r in rows_where(
                                table, test_label=lb, profile=p, impairment=c, ok=True
                            )
                        ]
                    )
                    if not s:
                        if rows_where(table, test_label=lb, profile=p, impairment=c):
                            failed.append(i + j * width)  # every repetition failed: say so
                            panel.setdefault(c, {"x": [], "y": [], "err": [[], []]})
                            panel[c].setdefault("failed", []).append(p)
                        continue
                    lo, hi = _err(s, 1e-6, mode)
                    xs.append(i + j * width)
                    ys.append(s["mean"] * 1e-6)
                    errs[0].append(lo)
                    errs[1].append(hi)
                    panel.setdefault(c, {"x": [], "y": [], "err": [[], []]})
                    panel[c]["x"].append(p)
                    panel[c]["y"].append(ys[-1])
                    panel[c]["err"][0].append(lo)
                    panel[c]["err"][1].append(hi)
                ax.bar(xs, ys, width, yerr=drawn_err(errs), capsize=3, label=c, color=f"C{j % 10}")
                for x in failed:
                    ax.text(x, 0.02, "all failed", rotation=90, ha="center", va="bottom",
                            fontsize=7, color=f"C{j % 10}",
                            transform=ax.get_xaxis_transform())  # fmt: skip
            ax.set_xticks(
                [i + width * (len(conds) - 1) / 2 for i in range(len(profiles))],
                profiles,
                rotation=30,
                ha="right",
            )
            style_axis(ax, [y for s in panel.values() for y in s["y"]], "Throughput (Mbit/s)")
            ax.set_title(f"{lb} per network condition")
            ax.grid(axis="y", alpha=0.3)
            condition_legend(ax, conds, len(profiles), width)
        fig.suptitle(data["title"])
        out.append(
            (save_figure(fig, run, "throughput_by_condition", data), "throughput per condition")
        )

    # 3. CPU per implementation: nodes in board cores, the host separately
    labels = [lb for lb in thr_labels if rows_where(unimp, test_label=lb)]
    if labels:
        data = cpu_data(run, unimp, profiles, labels)
        fig, axes = plt.subplots(
            2,
            len(labels),
            figsize=(max(6, 4.8 * len(labels)), 7.5),
            squeeze=False,
            layout="constrained",
        )
        for k, lb in enumerate(labels):
            for row, key in ((0, f"{lb}: nodes"), (1, f"{lb}: host")):
                ax, panel = axes[row][k], data["panels"][key]
                width = 0.8 / max(1, len(panel))
                for j, (name, s) in enumerate(panel.items()):
                    ax.bar(
                        [profiles.index(x) + j * width for x in s["x"]], s["y"], width, label=name
                    )
                ax.set_xticks(
                    [i + width * (len(panel) - 1) / 2 for i in range(len(profiles))],
                    profiles,
                    rotation=30,
                    ha="right",
                )
                ax.set_ylabel(data["ylabels"][key])
                ax.set_ylim(bottom=0)
                ax.set_title(key)
                ax.grid(axis="y", alpha=0.3)
                ax.legend(fontsize=7)
        fig.suptitle(data["title"])
        out.append((save_figure(fig, run, "cpu", data), "CPU per implementation per node"))

    # 4. UDP: target vs achieved rate and packets/s
    sweep_labels = [lb for lb, t in tests.items() if draws(t, "rate-sweep")]
    udp_labels = [lb for lb, t in tests.items() if draws(t, "rate-target")]
    for lb in sweep_labels:
        rs = [r for r in unimp if r["test_label"] == lb] or rows_where(
            table, test_label=lb, ok=True
        )
        if not rs:
            continue
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
        rates = sorted({r["rate_mbit"] for r in rs})
        a1.plot(rates, rates, "k--", lw=0.8, label="target")
        for p in profiles:
            pr = rows_where(rs, profile=p)
            if not pr:
                continue
            ach = [mean_of([r["receiver_bps"] for r in pr if r["rate_mbit"] == x]) for x in rates]
            a1.plot(rates, [(y or 0) * 1e-6 for y in ach], marker="o", label=p)
            sent = [mean_of([r["sent_pps"] for r in pr if r["rate_mbit"] == x]) for x in rates]
            recv = [mean_of([r["received_pps"] for r in pr if r["rate_mbit"] == x]) for x in rates]
            line = a2.plot(rates, [s or 0 for s in sent], marker="^", label=f"{p} sent")
            a2.plot(
                rates,
                [v or 0 for v in recv],
                marker="o",
                ls=":",
                color=line[0].get_color(),
                label=f"{p} received",
            )
        a1.set_xlabel("Target rate (Mbit/s)")
        a1.set_ylabel("Achieved rate (Mbit/s)")
        a1.set_title(f"{lb}: target vs achieved")
        a2.set_xlabel("Target rate (Mbit/s)")
        a2.set_ylabel("Packets per second")
        a2.set_title("sent vs received packets/s (sender- vs receiver-bound)")
        for a in (a1, a2):
            a.grid(alpha=0.3)
            a.legend(fontsize=7)
        out.append((save_figure(fig, run, f"udp_sweep_{lb}"), f"UDP sweep {lb}"))
    labels = [lb for lb in udp_labels if rows_where(unimp, test_label=lb)]
    if labels:
        fig, axes = plt.subplots(
            2,
            len(labels),
            figsize=(max(6, 4.5 * len(labels)), 7),
            squeeze=False,
            layout="constrained",
        )
        for k, lb in enumerate(labels):
            rs = rows_where(unimp, test_label=lb)
            x = range(len(profiles))
            tgt = [mean_of([r["rate_mbit"] for r in rows_where(rs, profile=p)]) for p in profiles]
            ach = [
                mean_of([r["receiver_bps"] for r in rows_where(rs, profile=p)]) for p in profiles
            ]
            snt = [mean_of([r["sent_pps"] for r in rows_where(rs, profile=p)]) for p in profiles]
            rcv = [
                mean_of([r["received_pps"] for r in rows_where(rs, profile=p)]) for p in profiles
            ]
            tpp = [mean_of([r["target_pps"] for r in rows_where(rs, profile=p)]) for p in profiles]
            a1, a2 = axes[0][k], axes[1][k]
            a1.bar([i - 0.2 for i in x], [t or 0 for t in tgt], 0.4, label="target")
            a1.bar([i + 0.2 for i in x], [(a or 0) * 1e-6 for a in ach], 0.4, label="achieved")
            a1.set_ylabel("Rate (Mbit/s)")
            a1.set_title(f"{lb}: target vs achieved rate")
            w = 0.27
            a2.bar([i - w for i in x], [t or 0 for t in tpp], w, label="target pps")
            a2.bar(list(x), [s or 0 for s in snt], w, label="sent pps")
            a2.bar([i + w for i in x], [r or 0 for r in rcv], w, label="received pps")
            a2.set_ylabel("Packets per second")
            a2.set_title(f"{lb}: packets/s")
            for a in (a1, a2):
                a.set_xticks(list(x), profiles, rotation=30, ha="right")
                a.grid(axis="y", alpha=0.3)
                a.legend(fontsize=7)
        out.append((save_figure(fig, run, "udp"), "UDP target vs achieved rate and packets/s"))
    out += series_plots(run, plan, lambda fig, name, data: save_figure(fig, run, name, data), plt)
    return out


def cpu_data(run: RunDir, unimp: list[dict], profiles: list[str], labels: list[str]) -> dict:
    """Mean CPU per profile during each throughput test without impairment (repetitions
    averaged): each node's cgroup in board cores of its CPU profile (% of one host core for an
    uncapped node), and the host's busy and softirq shares of all its cores, as the report's
    table gives them."""
    results = {r["case"]: r for r in run.load_results()}
    cpu = run.manifest().get("cpu") or {}
    capped = all(board_cores(100, cpu.get(n)) is not None for n in cpu) and bool(cpu)
    node_unit = "board cores" if capped else "% of one host core"
    data: dict = {
        "title": "CPU during the throughput tests without impairment: nodes (cgroup) and host",
        "ylabels": {},
        "panels": {},
    }
    for lb in labels:
        entries = {
            p: [results[r["case"]] for r in rows_where(unimp, test_label=lb, profile=p, point=0)]
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
        nodes_panel, host_panel = {}, {}
        for n in nodes:
            xs, ys = [], []
            for p in profiles:
                pct = mean_of(
                    [
                        (
                            (((e.get("monitor") or {}).get("nodes") or {}).get(n) or {}).get(
                                "total"
                            )
                            or {}
                        ).get("mean")
                        for e in entries[p]
                    ]
                )
                if pct is None:
                    continue
                xs.append(p)
                ys.append(board_cores(pct, cpu.get(n)) if capped else pct)
            nodes_panel[f"node {n}"] = {"x": xs, "y": ys}
        for key, name in (("busy_pct", "host busy"), ("softirq_pct", "host softirq")):
            xs, ys = [], []
            for p in profiles:
                v = mean_of(
                    [
                        (((e.get("monitor") or {}).get("host") or {}).get(key) or {}).get("mean")
                        for e in entries[p]
                    ]
                )
                if v is not None:
                    xs.append(p)
                    ys.append(v)
            host_panel[name] = {"x": xs, "y": ys}
        data["panels"][f"{lb}: nodes"] = nodes_panel
        data["panels"][f"{lb}: host"] = host_panel
        data["ylabels"][f"{lb}: nodes"] = f"Node CPU ({node_unit})"
        data["ylabels"][f"{lb}: host"] = "Host CPU (% of all host cores)"
    return data
