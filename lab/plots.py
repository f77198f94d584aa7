"""The run's plots (PNG + SVG under plots/), computed from the results table and the plan."""

from __future__ import annotations

from .reportdoc import _group, _mean, _order, _stats
from .results import RunDir

THROUGHPUT_TESTS = ("tcp", "udp", "scp", "contention")
FORMATS = ("png", "svg")


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
