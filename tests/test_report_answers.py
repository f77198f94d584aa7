"""The report answers the question first (issue 32, items 3-9), on small synthetic runs (no root):
the Summary's verdicts by `lab check`'s rule, UDP loss and jitter beside the rate, no error bars
for n=1, tests too short for their RTT, what really ran, received-rate plots, short warnings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.results.report import generate
from lab.results.rundir import RunDir

DRIVERS = {
    "baseline": "none",
    "ipsec": "strongswan",
    "openvpn": "openvpn",
    "wireguard": "wireguard",
}


def tiny_run(path: Path, values: dict, *, tests=(("tcp", "tcp"),), plan_extra=None,
             record=None, entry=None) -> RunDir:  # fmt: skip
    """A run whose `values[(profile, condition, label)]` are the primary metric of each
    repetition (bit/s for throughput, ms for RTT); conditions other than 'none' are impaired
    with `delay 40ms`. `record(profile, cond, label, rep, value)` adds to each record,
    `entry(...)` to each results.jsonl line."""
    path.mkdir(parents=True)
    profiles = list(dict.fromkeys(k[0] for k in values))
    conds = list(dict.fromkeys(k[1] for k in values))
    points = {
        c: {"name": c, "spec": "" if c == "none" else "delay 40ms", "group": c,
            "parameter": None, "value": None}
        for c in conds
    }  # fmt: skip
    plan = {
        "name": "tiny", "profiles": profiles, "impairments": list(points.values()),
        "tests": [{"label": lb, "test": t, "reps": None, "params": {"duration_s": 10.0}}
                  for lb, t in tests],
        "reps": 3, "impaired_reps": 3, "error_bars": "sd", "overrides": [],
        "topology": {"file": "topologies/pi_pair.py", "params": {}},
        **(plan_extra or {}),
    }  # fmt: skip
    (path / "plan.json").write_text(json.dumps(plan))
    (path / "manifest.json").write_text(json.dumps(
        {"profiles": {p: {"driver": DRIVERS.get(p, p), "path": p} for p in profiles}}
    ))  # fmt: skip
    run = RunDir(path)
    run.event({"t": 0.0, "session": "s1", "event": "session-start"})
    test_of = dict(tests)
    for (prof, cond, label), vals in values.items():
        for rep, v in enumerate(vals):
            test = test_of[label]
            rec = {"test": test, "ok": True}
            if test == "ping":
                rec["rtt_avg_ms"] = v
            else:
                rec["receiver_bps"] = v
            rec.update((record or (lambda *a: {}))(prof, cond, label, rep, v))
            e = {"case": f"{prof}|{cond}|{label}|{rep}", "session": "s1", "profile": prof,
                 "vpn": {"driver": DRIVERS.get(prof, prof), "path": prof},
                 "impairment": points[cond], "test": test, "label": label, "rep": rep,
                 "ok": True, "seconds": 10.5, "records": [rec]}  # fmt: skip
            e.update((entry or (lambda *a: {}))(prof, cond, label, rep, v))
            run.add_result(e)
    run.event({"t": 100.0, "session": "s1", "event": "session-end"})
    return run


def _md(run: RunDir) -> str:
    generate(run.path)
    return run.file("report.md").read_text()


def _section(md: str, title: str) -> str:
    return md[md.index(f"## {title}") :].split("\n## ")[0]


def test_summary_declares_no_winner_from_one_repetition(tmp_path):
    """Issue 32: under network1 with n=1 the recommendation picked IPsec at 10.1 Mbit/s while
    the no-VPN baseline got 4.6: noise, unflagged."""
    run = tiny_run(tmp_path / "r", {
        ("baseline", "network1", "tcp"): [4.6e6],
        ("ipsec", "network1", "tcp"): [10.1e6],
        ("wireguard", "network1", "tcp"): [8.0e6],
    })  # fmt: skip
    md = _md(run)
    assert md.index("## Summary") < md.index("## Set-up") < md.index("## Results")
    s = _section(md, "Summary")
    assert "No winner is declared where a profile ran once" in s
    assert (
        "| network1 | tcp (Mbit/s) | ipsec 10.1 vs wireguard 8.00 (26 % ahead) | no winner "
        "declared: one repetition" in s
    )
    assert "4.60 (the VPN did better than no VPN: noise, or a disturbed baseline)" in s
    rec = _section(md, "Recommendation")
    assert "26 % (n=1: no winner declared)" in rec


def test_summary_uses_the_welch_rule_of_lab_check(tmp_path):
    run = tiny_run(tmp_path / "r", {
        ("baseline", "none", "tcp"): [100e6, 101e6, 99e6],
        ("ipsec", "none", "tcp"): [50e6, 51e6, 49e6],
        ("wireguard", "none", "tcp"): [80e6, 81e6, 79e6],
        ("ipsec", "lossy", "tcp"): [20e6, 30e6, 25e6],
        ("wireguard", "lossy", "tcp"): [22e6, 31e6, 26e6],
    })  # fmt: skip
    s = _section(_md(run), "Summary")
    assert (
        "| none | tcp (Mbit/s) | wireguard 80.0 vs ipsec 50.0 (60 % ahead) | wireguard wins: "
        "beyond the noise (Welch p = " in s
    )
    assert (
        "| lossy | tcp (Mbit/s) | wireguard 26.3 vs ipsec 25.0 (5 % ahead) | no winner: "
        "within the noise (Welch p = " in s
    )
    assert "No winner is declared where a profile ran once" not in s


def _udp(prof, cond, label, rep, v):
    """network1 of issue 32: 100 Mbit/s sent, loss by profile, reordering counted."""
    loss = {"openvpn": 67.6, "ipsec": 23.7, "wireguard": 0.5}[prof]
    return {"rate_mbit": 100, "target_pps": 9615, "sent_pps": 9600, "received_pps": 9600 * (
        1 - loss / 100), "loss_pct": loss, "jitter_ms": 0.8, "out_of_order": 120}  # fmt: skip


def test_udp_tables_show_loss_and_jitter_and_where_loss_comes_from(tmp_path):
    run = tiny_run(tmp_path / "r", {
        ("openvpn", "network1", "udp"): [31.4e6],
        ("ipsec", "network1", "udp"): [73.9e6],
        ("wireguard", "network1", "udp"): [96.8e6],
    }, tests=(("udp", "udp"),), record=_udp)  # fmt: skip
    run.file("plan.json").write_text(
        run.file("plan.json").read_text().replace('"delay 40ms"', '"delay 40ms 10ms loss 0.5%"')
    )
    lines = [json.loads(x) for x in run.results.read_text().splitlines()]
    for e in lines:
        e["impairment"]["spec"] = "delay 40ms 10ms loss 0.5%"
    run.results.write_text("".join(json.dumps(e) + "\n" for e in lines))
    res = _section(_md(run), "Results")
    assert "| profile | condition | throughput (Mbit/s) | loss (%) | jitter (ms) |" in res
    assert "| openvpn | network1 | 31.4 (n=1) | 67.6 (n=1) | 0.800 (n=1) |" in res
    assert "**Where udp's loss comes from.**" in res and "replay window" in res
    row = "| openvpn | network1 | 67.6 % | 0.5 % (`delay 40ms 10ms loss 0.5%`) | 67.1 % | 100 % | 120 |"
    assert row in res
    assert "| wireguard | network1 | 0.5 %" not in res  # below the condition's own: nothing to say


def test_no_spread_claimed_for_one_value_and_short_tests_flagged(tmp_path):
    """Issue 32: no "± sd" or error bar for n=1; a 3 s TCP test at 80 ms falling from 25 to
    5 Mbit/s is flagged, with its RTT from ping."""

    def falling(prof, cond, label, rep, v):
        if label != "tcp":
            return {}
        ys = [25e6, 15e6, 5e6] if prof == "wireguard" else [v, v, v]
        return {"intervals": [{"start": i, "end": i + 1.0, "bps": y} for i, y in enumerate(ys)]}

    run = tiny_run(tmp_path / "r", {
        ("baseline", "network1", "tcp"): [20e6],
        ("wireguard", "network1", "tcp"): [15e6],
        ("baseline", "network1", "ping"): [80.0],
        ("wireguard", "network1", "ping"): [80.4],
    }, tests=(("tcp", "tcp"), ("ping", "ping")), record=falling)  # fmt: skip
    md = _md(run)
    res = _section(md, "Results")
    assert "| wireguard | 15.0 (n=1) |" in res and "±" not in res.split("**tcp**")[1]
    assert "**Tests too short to settle**" in res
    assert (
        "| `wireguard|network1|tcp|0` | falling: 25.0 -> 5.00 Mbit/s | 3 s | 80.4 ms (37 RTTs) |"
        in res.replace("\\|", "|")
    )
    assert "`baseline|network1|tcp|0`" not in res.replace("\\|", "|")
    top = md[: md.index("## ")]
    assert "1 test(s) too short to settle" in top and "([Results](#results))" in top
    rtt = json.loads((run.path / "plots" / "rtt.json").read_text())
    assert rtt["panels"]["ping"]["network1"]["err"] == [None, None]
    assert "none where n = 1" in rtt["title"]
    from lab.results.plots import _err

    assert _err({"n": 1, "mean": 5.0, "sd": 0.0, "min": 5.0, "max": 5.0}, 1.0, "sd") == (None, None)


def test_the_report_states_what_really_ran(tmp_path):
    """Issue 32: after `-o reps=1 -o duration=3` the description still said "TCP 5 s ... 3
    repetitions"; the report shows the effective values."""
    run = tiny_run(tmp_path / "r", {
        ("baseline", "none", "tcp"): [900e6],
        ("wireguard", "none", "tcp"): [60e6],
    }, plan_extra={
        "description": "TCP 5 s, 3 repetitions.", "overrides": ["reps=1", "duration=3"],
        "reps": 1, "impaired_reps": 1,
    })  # fmt: skip
    plan = json.loads(run.file("plan.json").read_text())
    plan["tests"][0]["params"] = {"duration_s": 3.0, "port": 5201, "direction": "client-to-server"}
    run.file("plan.json").write_text(json.dumps(plan))
    md = _md(run)
    ran = _section(md, "What ran")
    assert md.index("## Summary") < md.index("## What ran") < md.index("## Set-up")
    assert "as the plan file has it (the overrides below change it): TCP 5 s" in ran
    assert "Overridden on the command line: `-o reps=1` `-o duration=3`." in ran
    assert (
        "| tcp | tcp | duration_s=3.0, direction=client-to-server | 1 unimpaired, 1 impaired "
        "| 2 (2 ok) | 10.5 s |" in ran
    )
    plain = tiny_run(tmp_path / "p", {("baseline", "none", "tcp"): [1e6]})
    assert "No `-o` overrides: the plan file as written." in _md(plain)


def test_udp_plots_draw_what_was_received_and_loss_under_every_condition(tmp_path):
    """Issue 32: time_udp-*.png drew the sender's 100 Mbit/s where the receiver got 31, and
    udp.png only the unimpaired case."""

    def sent_100(prof, cond, label, rep, v):
        rec = _udp(prof, cond, label, rep, v)
        rec["intervals"] = [{"start": i, "end": i + 1.0, "bps": 100e6, "packets": 9600}
                            for i in range(3)]  # fmt: skip
        if prof == "ipsec":  # the receiver's own intervals, as an adaptive test records them
            rec["server_intervals"] = [{"start": i, "end": i + 1.0, "bps": b}
                                       for i, b in enumerate((70e6, 75e6, 76e6))]  # fmt: skip
        return rec

    values = {
        (p, c, "udp"): [v * f for f in (1.0, 1.01, 0.99)]
        for c, f0 in (("none", 1.0), ("network1", 0.5))
        for p, v in (("openvpn", 31.4e6 * f0), ("ipsec", 73.9e6 * f0), ("wireguard", 96.8e6 * f0))
    }
    run = tiny_run(tmp_path / "r", values, tests=(("udp", "udp"),), record=sent_100)
    generate(run.path)
    t = json.loads((run.path / "plots" / "time_udp.json").read_text())
    assert t["ylabel"] == "Received rate (Mbit/s)"
    assert t["panels"]["none"]["openvpn #0"]["y"] == [31.4] * 3  # not the sender's 100
    assert t["panels"]["none"]["openvpn #0"]["loss_pct"] == 67.6
    assert t["panels"]["none"]["ipsec #0"]["y"] == [70.0, 75.0, 76.0]
    u = json.loads((run.path / "plots" / "udp.json").read_text())
    assert set(u["panels"]["udp: received"]) == {"none", "network1"}
    assert u["panels"]["udp: received"]["network1"]["y"][0] == pytest.approx(15.7)
    assert u["panels"]["udp: loss"]["none"]["y"] == pytest.approx([67.6, 23.7, 0.5])
    assert u["target"]["udp"] == 100


def test_warnings_are_short_said_once_and_name_the_tests(tmp_path):
    """Issue 32: four boxes filled the first screen; "3 of 32 tests ran with node threads
    waiting" must name the three."""
    held = {"nodes": {"client": {"run_queue": {"run_s": 1.0, "wait_s": 3.0}, "throttled_s": 0.0},
                      "server": {"run_queue": {"run_s": 1.0, "wait_s": 0.1}}}}  # fmt: skip
    run = tiny_run(tmp_path / "r", {
        ("baseline", "none", "tcp"): [900e6, 901e6, 899e6],
        ("wireguard", "none", "tcp"): [60e6, 61e6, 59e6],
    }, entry=lambda p, c, lb, rep, v: {"monitor": held} if p == "wireguard" and rep < 2 else {})  # fmt: skip
    m = json.loads(run.file("manifest.json").read_text())
    m["lab_warnings"] = ["nodes client, server run under qemu-user: a long paragraph " * 4] * 2
    m["cpu"] = {"client": {"profile": "pi4", "calibrated": False}}
    run.file("manifest.json").write_text(json.dumps(m))
    md = _md(run)
    top = md[: md.index("- [Summary]")]
    boxes = [ln for ln in top.splitlines() if ln.startswith("> **Warning:**")]
    assert len(boxes) == 3  # the two identical lab warnings said once
    assert all(len(b) < 200 for b in boxes)
    assert (
        "> **Warning:** 2 of 6 tests ran with node threads waiting for this machine's CPUs "
        "longer than they ran, their CPU caps barely throttled ([Warnings](#warnings))" in top
    )
    assert "> **Warning:** CPU profile uncalibrated on this machine ([Set-up](#set-up))" in top
    w = _section(md, "Warnings").replace("\\|", "|")
    assert (
        "The tests: `wireguard|none|tcp|0` (nodes client), `wireguard|none|tcp|1` (nodes "
        "client)." in w
    )
    assert w.count("qemu-user") == 4  # the whole lab warning, once
    assert "- [Warnings](#warnings)" in md
    html = run.file("report.html").read_text()
    assert html.count("class='warn'") == 3 and "<a href='#warnings'>Warnings</a>" in html
