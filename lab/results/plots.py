"""The run's plots (PNG + SVG under plots/, the numbers drawn in plots/<name>.json), computed
from the results table, results.jsonl, the manifest and the plan. The plots of series (RTT, time,
CDF, swept values) are in lab.results.series."""

from __future__ import annotations

import json

from lab.results.drawing import NO_BAR, condition_legend, drawn_err, style_axis
from lab.results.series import series_plots
from lab.model.cpuwords import board_cores
from lab.results.doc import rows_where, mean_of, in_order, stats_of, draws, host_ncores
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
    labels = [lb for lb in udp_labels if rows_where(table, test_label=lb, ok=True)]
    if labels:
        data = rate_target_data(table, labels, profiles, points)
        fig, axes = plt.subplots(
            2,
            len(labels),
            figsize=(max(6, 4.8 * len(labels)), 7),
            squeeze=False,
            layout="constrained",
        )
        for k, lb in enumerate(labels):
            for row, (key, ylabel) in enumerate(
                (("received", "Received rate (Mbit/s)"), ("loss", "Loss (% of datagrams sent)"))
            ):
                ax, panel = axes[row][k], data["panels"][f"{lb}: {key}"]
                conds = list(panel)
                width = 0.8 / max(1, len(conds))
                for j, c in enumerate(conds):
                    xs = [profiles.index(p) + j * width for p in panel[c]["x"]]
                    ax.bar(xs, panel[c]["y"], width, yerr=drawn_err(panel[c]["err"]),
                           capsize=3, label=c, color=f"C{j % 10}")  # fmt: skip
                if key == "received" and data["target"].get(lb):
                    ax.axhline(data["target"][lb], color="k", ls="--", lw=0.8)
                    ax.text(0.01, data["target"][lb], f" target {data['target'][lb]:g} Mbit/s",
                            va="bottom", fontsize=7, transform=ax.get_yaxis_transform())  # fmt: skip
                ax.set_xticks(
                    [i + width * (len(conds) - 1) / 2 for i in range(len(profiles))],
                    profiles,
                    rotation=30,
                    ha="right",
                )
                ax.set_ylabel(ylabel)
                ax.set_ylim(bottom=0)
                ax.set_title(f"{lb}: {ylabel.split(' (')[0].lower()} per condition")
                ax.grid(axis="y", alpha=0.3)
                condition_legend(ax, conds, len(profiles), width)
        fig.suptitle(data["title"])
        out.append((save_figure(fig, run, "udp", data), "UDP received rate and loss per condition"))
    out += series_plots(run, plan, lambda fig, name, data: save_figure(fig, run, name, data), plt)
    return out


def rate_target_data(table, labels, profiles, points) -> dict:
    """Per test that sends at a target rate: the received rate and the loss (mean, sd; no bar
    for one value) per profile (x) and network condition (series), and the target."""
    data: dict = {
        "title": f"Received rate against the target, and loss, per condition (error bars: sd; "
        f"{NO_BAR})",
        "xlabel": "Profile",
        "panels": {},
        "target": {},
    }
    for lb in labels:
        rs = rows_where(table, test_label=lb, ok=True, point=0)
        conds = in_order([r["impairment"] for r in rs], points)
        for key, col, scale in (("received", "receiver_bps", 1e-6), ("loss", "loss_pct", 1.0)):
            panel = data["panels"].setdefault(f"{lb}: {key}", {})
            for c in conds:
                xs, ys, err = [], [], []
                for p in profiles:
                    st = stats_of([r[col] for r in rows_where(rs, profile=p, impairment=c)])
                    if st:
                        xs.append(p)
                        ys.append(st["mean"] * scale)
                        err.append(st["sd"] * scale if st["n"] > 1 else None)
                if xs:
                    panel[c] = {"x": xs, "y": ys, "err": err}
        data["target"][lb] = mean_of([r["rate_mbit"] for r in rs])
    return data


def cpu_data(run: RunDir, unimp: list[dict], profiles: list[str], labels: list[str]) -> dict:
    """Mean CPU per profile during each throughput test without impairment (repetitions
    averaged): each node's cgroup in board cores of its CPU profile (host cores for an
    uncapped node), and the host's busy and softirq time in host cores (% of all its cores
    where the run did not record how many it has), as the report's table gives them."""
    results = {r["case"]: r for r in run.load_results()}
    cpu = run.manifest().get("cpu") or {}
    capped = all(board_cores(100, cpu.get(n)) is not None for n in cpu) and bool(cpu)
    node_unit = "board cores" if capped else "host cores"
    ncores = host_ncores(results.values())
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
                ys.append(board_cores(pct, cpu.get(n)) if capped else pct / 100)
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
                    ys.append(v / 100 * ncores if ncores else v)
            host_panel[name] = {"x": xs, "y": ys}
        data["panels"][f"{lb}: nodes"] = nodes_panel
        data["panels"][f"{lb}: host"] = host_panel
        data["ylabels"][f"{lb}: nodes"] = f"Node CPU ({node_unit})"
        data["ylabels"][f"{lb}: host"] = (
            f"Host CPU (host cores, of {ncores})" if ncores else "Host CPU (% of all host cores)"
        )
    return data
