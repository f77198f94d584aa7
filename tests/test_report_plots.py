"""The report's plots against results.jsonl (issue 21): every plot keeps the numbers it draws in
plots/<name>.json, and these tests recompute them from results.jsonl on their own (no root)."""

from __future__ import annotations

import json
import re
import statistics

import pytest

from lab.results.report import generate

from .test_results import make_run

CORE_SHARE = 0.25  # host cores per pi4 core in the fixture's manifest


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """make_run's synthetic run, with iperf3 intervals, 25 RTT samples per ping and a calibrated
    pi4 cap on both nodes; the report generated once."""
    r = make_run(tmp_path_factory.mktemp("plots") / "run")
    lines = [json.loads(x) for x in r.results.read_text().splitlines()]
    for e in lines:
        rec = e["records"][0]
        if e["test"] in ("tcp", "udp") and e["ok"]:
            rec["intervals"] = [
                {"start": i, "end": i + 1.0, "bps": rec["receiver_bps"] * (0.9 + 0.1 * i)}
                for i in range(3)
            ]
        if e["test"] == "ping":
            base = rec["rtt_avg_ms"] + (e["impairment"]["value"] or 0)
            rec["rtts"] = [{"seq": i, "rtt_ms": base + 0.01 * (i % 7)} for i in range(25)]
    r.results.write_text("".join(json.dumps(e) + "\n" for e in lines))
    m = r.manifest()
    pi4 = {"profile": "pi4", "calibrated": True, "core_share": CORE_SHARE, "cores": CORE_SHARE,
           "emulated_cores": 1.0, "board_cores": 4}  # fmt: skip
    m["cpu"] = {"client": pi4, "server": pi4}
    r.file("manifest.json").write_text(json.dumps(m))
    generate(r.path)
    return r


def _results(run):
    return [json.loads(x) for x in run.results.read_text().splitlines()]


def _plot(run, name):
    assert (run.path / "plots" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    return json.loads((run.path / "plots" / f"{name}.json").read_text())


def test_rtt_per_profile_and_condition(run):
    data = _plot(run, "rtt")
    want: dict = {}
    for e in _results(run):
        if e["test"] == "ping" and e["ok"] and not e["impairment"]["parameter"]:
            key = (e["impairment"]["name"], e["profile"])
            want.setdefault(key, []).append(e["records"][0]["rtt_avg_ms"])
    got = {
        (cond, p): (y, err)
        for cond, s in data["panels"]["ping"].items()
        for p, y, err in zip(s["x"], s["y"], s["err"], strict=True)
    }
    assert set(got) == set(want) and want
    for k, vals in want.items():
        assert got[k][0] == pytest.approx(statistics.mean(vals))
        assert got[k][1] == pytest.approx(statistics.stdev(vals))
    assert "RTT" in data["ylabel"] and "ms" in data["ylabel"]


@pytest.mark.parametrize(
    "name,tests,value",
    [
        ("throughput_vs_delay", ("tcp", "udp"), lambda rec: rec["receiver_bps"] / 1e6),
        ("rtt_vs_delay", ("ping",), lambda rec: rec["rtt_avg_ms"]),
    ],
)
def test_metric_against_the_swept_value_one_line_per_profile(run, name, tests, value):
    data = _plot(run, name)
    want: dict = {}
    for e in _results(run):
        if e["test"] in tests and e["ok"] and e["impairment"]["parameter"] == "delay":
            key = (e["label"], e["profile"], e["impairment"]["value"])
            want.setdefault(key, []).append(value(e["records"][0]))
    got = {
        (label, p, x): y
        for label, panel in data["panels"].items()
        for p, s in panel.items()
        for x, y in zip(s["x"], s["y"], strict=True)
    }
    assert got == pytest.approx({k: statistics.mean(v) for k, v in want.items()})
    assert {p for panel in data["panels"].values() for p in panel} == {"baseline", "wireguard"}
    assert data["xlabel"] == "Delay (ms)"


def test_throughput_over_time_per_case(run):
    data = _plot(run, "time_tcp")
    want = {
        (e["impairment"]["name"], f"{e['profile']} #{e['rep']}"): (
            [iv["end"] for iv in e["records"][0]["intervals"]],
            [iv["bps"] / 1e6 for iv in e["records"][0]["intervals"]],
        )
        for e in _results(run)
        if e["label"] == "tcp" and e["ok"]
    }
    got = {
        (cond, name): (s["x"], pytest.approx(s["y"]))
        for cond, panel in data["panels"].items()
        for name, s in panel.items()
    }
    assert got == want
    assert data["ylabel"] == "Throughput (Mbit/s)"


def test_rtt_cdf_pools_every_sample(run):
    data = _plot(run, "rtt_cdf_ping")
    for cond, panel in data["panels"].items():
        for prof, s in panel.items():
            samples = sorted(
                x["rtt_ms"]
                for e in _results(run)
                if e["label"] == "ping" and e["ok"] and e["profile"] == prof
                and e["impairment"]["name"] == cond
                for x in e["records"][0]["rtts"]
            )  # fmt: skip
            assert s["x"] == samples
            assert s["y"][-1] == 1.0 and s["y"] == sorted(s["y"])
    assert len(data["panels"]["none"]["baseline"]["x"]) == 3 * 25


def test_cpu_in_board_cores_and_host_shares_as_in_the_table(run):
    data = _plot(run, "cpu")
    nodes, host = data["panels"]["tcp: nodes"], data["panels"]["tcp: host"]
    # the fixture's monitor: client 20 %, server 25 % of one host core; host softirq 5 % of
    # all 2 host cores = 0.1 host cores (docs/cpu.md "Board cores and host cores")
    assert nodes["node client"]["y"] == pytest.approx([20 / 100 / CORE_SHARE] * 2)
    assert nodes["node server"]["y"] == pytest.approx([25 / 100 / CORE_SHARE] * 2)
    assert host["host softirq"]["y"] == pytest.approx([5.0 / 100 * 2] * 2)
    assert "board cores" in data["ylabels"]["tcp: nodes"]
    assert data["ylabels"]["tcp: host"] == "Host CPU (host cores, of 2)"
    md = run.file("report.md").read_text()
    assert "0.80 of 1 board core = 0.20 host cores" in md
    assert "| 0.10 of 2 host cores |" in md  # the table's host softirq is the plot's


def test_axes_are_linear_unless_the_range_demands_log():
    from lab.results.plots import load_pyplot
    from lab.results.drawing import style_axis

    plt = load_pyplot()
    fig, (a, b) = plt.subplots(1, 2)
    style_axis(a, [50.0, 900.0], "throughput (Mbit/s)")
    style_axis(b, [0.05, 80.0], "mean RTT (ms)")
    assert a.get_yscale() == "linear" and a.get_ylabel() == "throughput (Mbit/s)"
    assert b.get_yscale() == "log" and b.get_ylabel() == "mean RTT (ms), log scale"
    fig.canvas.draw()
    ticks = [t.get_text() for t in b.get_yticklabels() if t.get_text()]
    assert "10" in ticks and not any("^" in t or "times" in t for t in ticks)
    plt.close(fig)


def test_html_is_self_contained_with_warnings_contents_and_links(run):
    html = run.file("report.html").read_text()
    top = html[: html.index("<h2")]
    # warnings before the first section: the failed case of the fixture
    assert "class='warn'" in top and "failed" in top
    for f in ("results.csv", "summary.csv", "raw/"):
        assert f"href='{f}'" in top
    assert "href='#results'" in top and "id='results'" in html  # table of contents
    assert "src='plots/" not in html and html.count("src='data:image/png;base64,") >= 5
    assert "<th></th>" not in html  # the set-up table has no empty header row
    # text cells left-aligned (the default), figures right-aligned
    assert "<td>wireguard</td>" in html and re.search(r"<td class='num'>[\d.]+ ± ", html)
    md = run.file("report.md").read_text()
    assert md.index("**Warning:**") < md.index("## Set-up")


def test_recommendation_never_ranks_the_baseline(run, tmp_path):
    md = run.file("report.md").read_text()
    rec = md[md.index("## Recommendation") :].split("\n## ")[0]
    assert rec.split("\n")[2].startswith("For each network condition, the VPN profile with")
    assert "| none | wireguard |" in rec and "not ranked" in rec
    alone = make_run(tmp_path / "alone", profiles=("baseline",))
    generate(alone.path)
    assert "## Recommendation" not in alone.file("report.md").read_text()


def test_a_profile_keeps_its_colour_and_its_repetitions_differ_by_line_style():
    from lab.results.plots import load_pyplot
    from lab.results.drawing import lines as _lines

    plt = load_pyplot()
    line = {"x": [1.0, 2.0], "y": [1.0, 2.0]}
    names = [f"{p} #{r}" for p in ("baseline", "wireguard") for r in range(3)]
    data = {"title": "t", "xlabel": "x", "ylabel": "y",
            "panels": {"none": {n: line for n in names}, "delay": {"wireguard #0": line}}}  # fmt: skip
    fig = _lines(plt, data)
    a, b = fig.axes[:2]
    style = {ln.get_label(): (ln.get_color(), ln.get_linestyle()) for ln in a.get_lines()}
    assert len({style[f"baseline #{r}"][0] for r in range(3)}) == 1
    assert len({style[f"baseline #{r}"][1] for r in range(3)}) == 3
    assert style["baseline #0"][0] != style["wireguard #0"][0]
    assert b.get_lines()[0].get_color() == style["wireguard #0"][0]  # the same in every panel
    plt.close(fig)


def test_a_condition_whose_pings_all_failed_is_marked_not_left_blank(run):
    from lab.results.plots import load_pyplot
    from lab.results.drawing import bars as _bars
    from lab.results.series import rtt_by_condition

    results = _results(run)
    for e in results:
        if e["profile"] == "wireguard" and e["test"] == "ping":
            e["ok"] = False
    data = rtt_by_condition(results, json.loads(run.file("plan.json").read_text()))
    none = data["panels"]["ping"]["none"]
    assert none["x"] == ["baseline"] and none["failed"] == ["wireguard"]
    plt = load_pyplot()
    fig = _bars(plt, data)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["baseline", "wireguard"]
    assert [t.get_text() for t in ax.texts] == ["all failed"]
    assert ax.texts[0].get_position()[0] < ax.get_xlim()[1]  # inside the axes
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["none"]
    plt.close(fig)


def test_throughput_per_condition_marks_a_profile_whose_cases_all_failed(tmp_path):
    from lab.results.plots import make_plots
    from lab.results.rundir import rows

    r = make_run(tmp_path / "run")
    plan = json.loads(r.file("plan.json").read_text())
    plan["impairments"][1].update(parameter=None, value=None)  # delay-10ms: a plain condition
    plan["tests"] = [{"label": "tcp", "test": "tcp"}]  # keeps the test short
    results = [e for e in _results(r) if e["label"] == "tcp"]
    for e in results:
        e["impairment"] = next(
            p for p in plan["impairments"] if p["name"] == e["impairment"]["name"]
        )
        if e["profile"] == "wireguard" and e["impairment"]["name"] == "delay-10ms":
            e["ok"] = False
    make_plots(r, rows(r.name, results), plan)
    panel = _plot(r, "throughput_by_condition")["panels"]["tcp"]
    assert panel["delay-10ms"]["x"] == ["baseline"] and panel["delay-10ms"]["failed"] == [
        "wireguard"
    ]
    assert "failed" not in panel["none"]


def _rrul_entry(profile: str, rep: int, link: bool) -> dict:
    """An rrul case of 6 RTT samples a phase: the tunnel's at 10 + i ms idle and 50 + i ms loaded,
    and where `link`, the underlay ping's beside them at 1 + i and 20 + i ms."""
    rec = {
        "test": "rrul",
        "ok": True,
        "rtts_idle": [{"seq": i, "rtt_ms": 10.0 + i} for i in range(6)],
        "rtts_loaded": [{"seq": i, "rtt_ms": 50.0 + i} for i in range(6)],
    }
    if link:
        rec["link_rtts_idle"] = [{"seq": i, "rtt_ms": 1.0 + i} for i in range(6)]
        rec["link_rtts_loaded"] = [{"seq": i, "rtt_ms": 20.0 + i} for i in range(6)]
    return {"case": f"{profile}|none|load|{rep}", "profile": profile, "test": "rrul",
            "label": "load", "rep": rep, "ok": True, "impairment": {"name": "none"},
            "records": [rec]}  # fmt: skip


def test_rrul_rtt_cdf_draws_the_underlay_ping_dashed_beside_the_tunnels():
    """The link's ping (rrul's link_rtts_*) is drawn as dashed lines in the colour of the
    tunnel's same phase; a profile recorded without it (no tunnel, older runs) keeps its two."""
    from lab.results.plots import load_pyplot
    from lab.results.series import rrul_rtt_cdf, series_plots

    results = [_rrul_entry("wireguard", rep, True) for rep in range(2)]
    results += [_rrul_entry("baseline", 0, False)]
    plan = {"tests": [{"label": "load", "test": "rrul"}], "profiles": ["baseline", "wireguard"],
            "impairments": [{"name": "none"}]}  # fmt: skip

    class Run:
        def load_results(self):
            return results

    drawn = {}

    def save(fig, name, data):
        drawn[name] = fig
        return name

    plt = load_pyplot()
    series_plots(Run(), plan, save, plt)
    fig = drawn["rtt_load_cdf_load"]
    try:
        [ax] = [a for a in fig.axes if a.get_visible()]
        lines = {ln.get_label(): ln for ln in ax.get_lines()}
        assert list(lines) == ["baseline idle", "baseline loaded", "wireguard idle",
                               "wireguard loaded", "wireguard link idle",
                               "wireguard link loaded"]  # fmt: skip
        for phase, first in (("idle", 1.0), ("loaded", 20.0)):
            link, tunnel = lines[f"wireguard link {phase}"], lines[f"wireguard {phase}"]
            xs = sorted([first + i for i in range(6)] * 2)  # two repetitions pooled
            assert list(link.get_xdata()) == xs
            assert link.get_linestyle() == "--" and tunnel.get_linestyle() == "-"
            assert link.get_color() == tunnel.get_color()
        assert lines["baseline idle"].get_linestyle() == "-"
        assert "dashed" in fig.get_suptitle()
        leg = [t.get_text() for t in ax.get_legend().get_texts()]
        assert "wireguard link loaded" in leg
    finally:
        plt.close(fig)
    old = rrul_rtt_cdf([_rrul_entry("baseline", 0, False)], plan, "load")
    assert list(old["panels"]["none"]) == ["baseline idle", "baseline loaded"]
    assert "dashed" not in old["title"]
