"""The plots read from results.jsonl's own series: RTT per profile and condition, each swept
metric against the swept value (one line per profile), throughput over time per case (iperf3's
intervals), the CDF of RTT samples, and rrul's flows over time and RTT idle against loaded.

Every plot keeps the numbers it draws in `plots/<name>.json` next to its PNG/SVG
(`{"title", "xlabel", "ylabel", "panels": {panel: {series: {"x": [...], "y": [...]}}}}`, with
"err" where there are error bars), so a reader or a test can check a figure against the results
without reading pixels.
"""

from __future__ import annotations

from lab.results.doc import in_order, stats_of, draws
from lab.results import drawing
from lab.results.drawing import NO_BAR
from lab.results.rundir import RunDir

#: unit of a swept parameter's value (lab.model.impairment.presets.SWEEP_PARAMETERS)
SWEEP_UNITS = {
    "delay": "ms",
    "jitter": "ms",
    "loss": "%",
    "duplicate": "%",
    "corrupt": "%",
    "reorder": "%",
    "rate": "Mbit/s",
}

#: a CDF needs this many RTT samples per profile and condition to say more than the mean does
CDF_MIN_SAMPLES = 20

#: throughput-over-time panels at most (one per network condition, 'none' first)
MAX_TIME_PANELS = 8


def _first_record(entry: dict) -> dict:
    recs = entry.get("records") or []
    return recs[0] if recs else {}


def _ok(results: list[dict]) -> list[dict]:
    return [r for r in results if r.get("ok")]


def _point(r: dict) -> str:
    return (r.get("impairment") or {}).get("name") or "none"


def throughput_bps(entry: dict) -> float | None:
    """A throughput test's rate as results.csv's `throughput_bps` has it (receiver, else rate)."""
    rec = _first_record(entry)
    v = rec.get("receiver_bps")
    return v if v is not None else rec.get("rate_bps")


def rtt_avg_ms(entry: dict) -> float | None:
    return _first_record(entry).get("rtt_avg_ms")


#: the metrics drawn against a swept value: (plot kind the tests declare, file stem, axis
#: label, value of an entry)
SWEEP_METRICS = [
    ("throughput", "throughput", "Throughput (Mbit/s)", lambda e: _scaled(throughput_bps(e))),
    ("rtt", "rtt", "Mean RTT (ms)", rtt_avg_ms),
]


def _scaled(bps: float | None) -> float | None:
    return None if bps is None else bps * 1e-6


def rtt_by_condition(results: list[dict], plan: dict) -> dict:
    """Mean RTT +- sd per profile (x) and network condition (series), per ping label (panel);
    sweep points are left to the swept-value plots."""
    profiles = plan.get("profiles", [])
    points = [p["name"] for p in plan.get("impairments", [])]
    panels: dict[str, dict] = {}
    for t in plan.get("tests", []):
        if not draws(t["test"], "rtt"):
            continue
        every = [
            r
            for r in results
            if r.get("label") == t["label"] and not (r.get("impairment") or {}).get("parameter")
        ]
        rs = _ok(every)
        if not rs:
            continue
        panel = {}
        for cond in in_order([_point(r) for r in every], points):
            xs, ys, errs, failed = [], [], [], []
            for p in profiles:
                s = stats_of([rtt_avg_ms(r) for r in rs if r["profile"] == p and _point(r) == cond])
                if s:
                    xs.append(p)
                    ys.append(s["mean"])
                    errs.append(s["sd"] if s["n"] > 1 else None)
                elif any(r["profile"] == p and _point(r) == cond for r in every):
                    failed.append(p)  # every repetition failed: said on the plot, not left blank
            if xs or failed:
                panel[cond] = {"x": xs, "y": ys, "err": errs, "failed": failed}
        if panel:
            panels[t["label"]] = panel
    return {
        "title": f"Mean RTT per profile and network condition (error bars: sd; {NO_BAR})",
        "xlabel": "Profile",
        "ylabel": "Mean RTT (ms)",
        "panels": panels,
    }


def metric_vs_sweep(results: list[dict], plan: dict, par: str, kind: str, value) -> dict:
    """Mean +- sd of a metric against the swept value of `par`, one line per profile, one panel
    per test label whose test declares the plot `kind`."""
    profiles = plan.get("profiles", [])
    panels: dict[str, dict] = {}
    for t in plan.get("tests", []):
        if not draws(t["test"], kind):
            continue
        rs = [
            r
            for r in _ok(results)
            if r.get("label") == t["label"] and (r.get("impairment") or {}).get("parameter") == par
        ]
        panel = {}
        for p in profiles:
            xs, ys, errs = [], [], []
            for v in sorted({r["impairment"]["value"] for r in rs if r["profile"] == p}):
                s = stats_of(
                    [value(r) for r in rs if r["profile"] == p and r["impairment"]["value"] == v]
                )
                if s:
                    xs.append(v)
                    ys.append(s["mean"])
                    errs.append(s["sd"] if s["n"] > 1 else None)
            if xs:
                panel[p] = {"x": xs, "y": ys, "err": errs}
        if panel and len({x for s in panel.values() for x in s["x"]}) >= 2:
            panels[t["label"]] = panel
    return {"panels": panels}


def throughput_over_time(results: list[dict], plan: dict, label: str) -> dict:
    """iperf3's per-interval rate of every repetition of `label`: one panel per network
    condition (at most MAX_TIME_PANELS, in plan order), one line per profile and repetition."""
    profiles = plan.get("profiles", [])
    points = [p["name"] for p in plan.get("impairments", [])]
    rs = [r for r in _ok(results) if r.get("label") == label and _first_record(r).get("intervals")]
    panels: dict[str, dict] = {}
    datagrams = False
    for cond in in_order([_point(r) for r in rs], points)[:MAX_TIME_PANELS]:
        panel = {}
        for p in profiles:
            for r in sorted(
                (r for r in rs if r["profile"] == p and _point(r) == cond), key=lambda r: r["rep"]
            ):
                panel[f"{p} #{r['rep']}"] = received_over_time(_first_record(r))
                datagrams |= "loss_pct" in panel[f"{p} #{r['rep']}"]
        if panel:
            panels[cond] = panel
    return {
        "title": f"{label}: received rate over time per case (the receiver's intervals where "
        "recorded, else its mean over the test; loss in the JSON)"
        if datagrams
        else f"{label}: throughput over time per case (iperf3 intervals, at their ends)",
        "xlabel": "Time since start (s)",
        "ylabel": "Received rate (Mbit/s)" if datagrams else "Throughput (Mbit/s)",
        "panels": panels,
    }


def received_over_time(rec: dict) -> dict:
    """One case's series: iperf3's intervals, but what was received. A datagram test's client
    intervals (they count `packets`) are what the sender sent: its receiver's intervals are
    drawn where recorded (`server_intervals`), else the rate it received over the whole test, at
    each interval's end; `loss_pct` comes with it."""
    ivs = [iv for iv in rec.get("intervals") or [] if not iv.get("omitted")]
    if not any("packets" in iv for iv in ivs):
        return {"x": [iv["end"] for iv in ivs], "y": [iv["bps"] * 1e-6 for iv in ivs]}
    out: dict = {"loss_pct": rec.get("loss_pct")}
    srv = [iv for iv in rec.get("server_intervals") or [] if not iv.get("omitted")]
    if srv:
        out.update(x=[iv["end"] for iv in srv], y=[iv["bps"] * 1e-6 for iv in srv])
    else:
        got = rec.get("receiver_bps")
        out.update(x=[iv["end"] for iv in ivs], y=[(got or 0.0) * 1e-6 for _ in ivs])
    return out


#: a throughput series whose last half differs from its first half by more than this share of
#: it is still rising or falling when the test ends: the test is too short to settle
UNSETTLED_SHARE = 0.25


def unsettled(results: list[dict], plan: dict) -> list[dict]:
    """The cases of tests drawing throughput over time whose iperf3 intervals were still rising
    or falling when the test ended (last half against first half, omitted intervals left out),
    with the mean RTT that ping measured for the same profile and condition if any: a test too
    short for its RTT (TCP's window still growing, or a queue still filling)."""
    tests = {t["label"]: t["test"] for t in plan.get("tests", [])}
    rtts: dict[tuple, list[float]] = {}
    for r in _ok(results):
        if draws(tests.get(r.get("label"), r["test"]), "rtt") and rtt_avg_ms(r) is not None:
            rtts.setdefault((r["profile"], _point(r)), []).append(rtt_avg_ms(r))
    out = []
    for r in _ok(results):
        if not draws(tests.get(r.get("label"), r["test"]), "throughput-time"):
            continue
        ivs = [iv for iv in _first_record(r).get("intervals") or [] if not iv.get("omitted")]
        if len(ivs) < 3:
            continue
        ys = [iv["bps"] for iv in ivs]
        half = len(ys) // 2
        first, last = sum(ys[:half]) / half, sum(ys[-half:]) / half
        if first <= 0 or abs(last / first - 1) <= UNSETTLED_SHARE:
            continue
        rtt = rtts.get((r["profile"], _point(r)))
        out.append(
            {
                "case": r["case"],
                "label": r.get("label"),
                "trend": "rising" if last > first else "falling",
                "from_mbit": ys[0] * 1e-6,
                "to_mbit": ys[-1] * 1e-6,
                "seconds": ivs[-1]["end"],
                "rtt_ms": sum(rtt) / len(rtt) if rtt else None,
            }
        )
    return out


def rtt_samples(entry: dict) -> list[float]:
    return [s["rtt_ms"] for s in _first_record(entry).get("rtts") or [] if "rtt_ms" in s]


def _cdf_panels(results: list[dict], plan: dict, label: str, lines: dict, least: int) -> dict:
    """The panels of an empirical CDF of `label`'s samples, repetitions pooled: one panel per
    network condition (plan order), one line per profile and entry of `lines` (a suffix of the
    line's name, "" for none, and the function that reads an entry's samples), where the line
    has at least `least` samples."""
    profiles = plan.get("profiles", [])
    points = [p["name"] for p in plan.get("impairments", [])]
    rs = [r for r in _ok(results) if r.get("label") == label]
    panels: dict[str, dict] = {}
    for cond in in_order([_point(r) for r in rs], points):
        panel = {}
        for p in profiles:
            for suffix, samples in lines.items():
                xs = sorted(
                    v for r in rs if r["profile"] == p and _point(r) == cond for v in samples(r)
                )
                if len(xs) >= least:
                    name = f"{p} {suffix}" if suffix else p
                    panel[name] = {"x": xs, "y": [(i + 1) / len(xs) for i in range(len(xs))]}
        if panel:
            panels[cond] = panel
    return panels


def rtt_cdf(results: list[dict], plan: dict, label: str) -> dict:
    """Empirical CDF of every RTT sample of `label` (all repetitions pooled) per profile (line)
    and network condition (panel), where a profile has at least CDF_MIN_SAMPLES samples."""
    return {
        "title": f"{label}: CDF of RTT samples (repetitions pooled)",
        "xlabel": "RTT (ms)",
        "ylabel": "Share of samples",
        "panels": _cdf_panels(results, plan, label, {"": rtt_samples}, CDF_MIN_SAMPLES),
    }


#: an rrul RTT CDF needs this many samples in a phase (a profile and condition, repetitions
#: pooled): its idle phase is short (a few seconds at 5 echoes/s)
RRUL_CDF_MIN_SAMPLES = 5


def rrul_flows_over_time(results: list[dict], plan: dict, label: str) -> dict:
    """Each flow's rate over time in the first repetition of `label` per profile and network
    condition (one panel each, at most MAX_TIME_PANELS, in plan order): the client's view of
    iperf3's per-stream intervals, what it sent on a client-to-server flow and received on a
    server-to-client one."""
    profiles = plan.get("profiles", [])
    points = [p["name"] for p in plan.get("impairments", [])]
    rs = [r for r in _ok(results) if r.get("label") == label and _first_record(r).get("flows")]
    panels: dict[str, dict] = {}
    for cond in in_order([_point(r) for r in rs], points):
        for p in profiles:
            mine = sorted((r for r in rs if r["profile"] == p and _point(r) == cond),
                          key=lambda r: r["rep"])  # fmt: skip
            if not mine or len(panels) >= MAX_TIME_PANELS:
                continue
            panel: dict[str, dict] = {}
            counts: dict[str, int] = {}
            for f in _first_record(mine[0])["flows"]:
                way = "up" if f["direction"] == "client-to-server" else "down"
                counts[way] = counts.get(way, 0) + 1
                ivs = [iv for iv in f.get("intervals") or [] if not iv.get("omitted")]
                panel[f"{way} {counts[way]}"] = {
                    "x": [iv["end"] for iv in ivs],
                    "y": [iv["bps"] * 1e-6 for iv in ivs],
                }
            panels[f"{p}, {cond} #{mine[0]['rep']}"] = panel
    return {
        "title": f"{label}: each flow's throughput over time (up: client to server, down: "
        "server to client; the client's per-stream iperf3 intervals)",
        "xlabel": "Time since start (s)",
        "ylabel": "Throughput (Mbit/s)",
        "panels": panels,
    }


def _phase_samples(key: str):
    """What reads an rrul entry's RTT samples under `key` ("rtts_idle", "rtts_loaded", the
    underlay ping's "link_rtts_idle", "link_rtts_loaded"), every record's."""

    def samples(entry: dict) -> list[float]:
        recs = entry.get("records") or []
        return [s["rtt_ms"] for rec in recs for s in rec.get(key) or []]

    return samples


#: rrul's phases, as its records' RTT sample keys name them
RRUL_PHASES = ("idle", "loaded")


def rrul_rtt_cdf(results: list[dict], plan: dict, label: str) -> dict:
    """Empirical CDF of the RTT samples of `label` idle and under load (repetitions pooled):
    one panel per network condition, two lines per profile with at least RRUL_CDF_MIN_SAMPLES
    samples in the phase, and where rrul pinged the server's underlay address beside the
    tunnel (link_rtts_*: records since that probe), that ping's two as dashed lines in the
    colour of the tunnel's same phase ("PROFILE link idle")."""
    lines = {phase: _phase_samples(f"rtts_{phase}") for phase in RRUL_PHASES}
    lines |= {f"link {phase}": _phase_samples(f"link_rtts_{phase}") for phase in RRUL_PHASES}
    panels = _cdf_panels(results, plan, label, lines, RRUL_CDF_MIN_SAMPLES)
    link = False
    for panel in panels.values():
        for p in plan.get("profiles", []):
            for phase in RRUL_PHASES:
                if s := panel.get(f"{p} link {phase}"):
                    s.update(linestyle="--", colour_of=f"{p} {phase}")
                    link = True
    return {
        "title": f"{label}: CDF of ping RTT idle and under load (repetitions pooled"
        + ("; dashed: the link, a ping outside the tunnel)" if link else ")"),
        "xlabel": "RTT (ms)",
        "ylabel": "Share of samples",
        "panels": panels,
    }


# ---------------------------------------------------------------------- drawing


def series_plots(run: RunDir, plan: dict, save, plt) -> list[tuple[str, str]]:
    """Draw every plot of this module that the run has data for; `save(fig, name, data)` writes
    the figure and its data and returns the PNG's path relative to the run."""
    results = run.load_results()
    tests = {t["label"]: t["test"] for t in plan.get("tests", [])}
    out: list[tuple[str, str]] = []

    data = rtt_by_condition(results, plan)
    if data["panels"]:
        out.append(
            (save(drawing.bars(plt, data), "rtt", data), "mean RTT per profile and condition")
        )

    swept = in_order(
        [
            (r.get("impairment") or {}).get("parameter")
            for r in results
            if (r.get("impairment") or {}).get("parameter")
        ],
        [],
    )
    for par in swept:
        unit = SWEEP_UNITS.get(par, "")
        for kind, stem, ylabel, value in SWEEP_METRICS:
            data = metric_vs_sweep(results, plan, par, kind, value)
            if not data["panels"]:
                continue
            data.update(
                title=f"{ylabel.split(' (')[0]} against {par}, one line per profile "
                f"(error bars: sd; {NO_BAR})",
                xlabel=f"{par.capitalize()} ({unit})" if unit else par.capitalize(),
                ylabel=ylabel,
            )
            name = f"{stem}_vs_{par}"
            out.append((save(drawing.lines(plt, data), name, data), f"{stem} against {par}"))

    for label, test in tests.items():
        if draws(test, "throughput-time"):
            data = throughput_over_time(results, plan, label)
            if data["panels"]:
                fig = drawing.lines(plt, data, errors=False, marker=".", x0=0)
                out.append(
                    (save(fig, f"time_{label}", data), f"{label} throughput over time per case")
                )
        if draws(test, "load-latency"):
            data = rrul_flows_over_time(results, plan, label)
            if data["panels"]:
                fig = drawing.lines(plt, data, errors=False, marker=".", x0=0)
                out.append((save(fig, f"flows_{label}", data), f"{label} throughput per flow"))
            data = rrul_rtt_cdf(results, plan, label)
            if data["panels"]:
                fig = drawing.lines(plt, data, step=True)
                out.append(
                    (save(fig, f"rtt_load_cdf_{label}", data), f"{label} CDF of RTT idle/loaded")
                )
        if draws(test, "rtt"):
            data = rtt_cdf(results, plan, label)
            if data["panels"]:
                fig = drawing.lines(plt, data, step=True)
                out.append((save(fig, f"rtt_cdf_{label}", data), f"{label} CDF of RTT samples"))
    return out
