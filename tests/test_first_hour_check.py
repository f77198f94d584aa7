"""Issue 32, item 12: `lab check --baseline` across a profile's parameter overrides, bounds shown
in the unit they were written in, and the checklist of `lab ci init`.

Run directories are synthesised as tests/test_check.py does (no root, nothing runs): a baseline
of `wireguard` and a candidate of `wireguard:mtu=1380`, 25 % slower. Before the fix the candidate
passed with its regression skipped ("the baseline has no successful throughput_bps for this
case") and the bound read `throughput_bps >= 5e+07`."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from lab.campaign.check import CI_FILES, EDIT_RE
from lab.cli.main import main
from lab.results.expect import parse_expectations
from lab.results.verdicts import match_baseline, overrides_differ
from tests.test_check import PLAN, make_run

OVERRIDE = "wireguard:mtu=1380"
#: what a check of PLAN with its profiles overridden looks like
CHECK = ["check", str(PLAN), "-o", f"profiles={OVERRIDE}"]


def respec(path: Path, spec: str) -> Path:
    """A run of tests/test_check.make_run with its profile renamed to `spec`, as `lab run -o
    profiles=SPEC` would have named its cases."""
    lines = [json.loads(x) for x in (path / "results.jsonl").read_text().splitlines()]
    for r in lines:
        r["profile"] = spec
        r["case"] = spec + r["case"][len("wireguard") :]
    (path / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    plan = json.loads((path / "plan.json").read_text())
    (path / "plan.json").write_text(json.dumps({**plan, "profiles": [spec]}))
    m = json.loads((path / "manifest.json").read_text())
    m["profiles"] = {spec: m["profiles"]["wireguard"]}
    (path / "manifest.json").write_text(json.dumps(m))
    return path


def run_of(path: Path, spec: str, mbit: list[float], **kw) -> Path:
    return respec(make_run(path, mbit, **kw), spec)


def merge(path: Path, *runs: Path) -> Path:
    """One baseline run holding the cases of several (a plan that ran several specs)."""
    path.mkdir()
    for name in ("plan.json", "manifest.json"):
        (path / name).write_text((runs[0] / name).read_text())
    (path / "results.jsonl").write_text("".join((r / "results.jsonl").read_text() for r in runs))
    return path


def regression(run: Path) -> dict:
    (v,) = [
        v
        for v in json.loads((run / "check.json").read_text())["verdicts"]
        if v["kind"] == "regression"
    ]
    return v


def words(text: str) -> str:
    """The console wraps long lines: compare words, not line breaks."""
    return " ".join(text.split())


# ---------------------------------------------------------------------- matching


def test_an_override_is_compared_with_the_plain_profile(tmp_path, capsys):
    base = make_run(tmp_path / "base", [400, 410, 395, 405, 402])
    slow = run_of(tmp_path / "slow", OVERRIDE, [300, 305, 298, 302, 301])
    assert main([*CHECK, "--run", str(slow), "--baseline", str(base)]) == 1
    out = words(capsys.readouterr().out)
    v = regression(slow)
    assert v["status"] == "fail"  # was "skip": the gate let a 25 % drop through
    assert v["details"]["baseline_case"] == ["wireguard"]
    assert v["details"]["overrides_differ"] == {"wireguard": {"mtu": ["1380", None]}}
    assert "compared with the baseline's wireguard (mtu 1380 here" in out
    assert "compared with the baseline's wireguard" in (slow / "check.md").read_text()

    same = run_of(tmp_path / "same", OVERRIDE, [398, 407, 401, 396, 404])
    assert main([*CHECK, "--run", str(same), "--baseline", str(base)]) == 0
    assert regression(same)["status"] == "pass"


def test_the_same_spec_wins_over_other_overrides(tmp_path):
    plain = make_run(tmp_path / "plain", [300, 302, 298])
    spec = run_of(tmp_path / "spec", OVERRIDE, [400, 404, 398])
    base = merge(tmp_path / "base", plain, spec)
    cand = run_of(tmp_path / "cand", OVERRIDE, [300, 301, 299])  # slower than its own spec
    assert main([*CHECK, "--run", str(cand), "--baseline", str(base)]) == 1
    v = regression(cand)
    assert v["details"]["baseline_case"] == [OVERRIDE] and v["details"]["overrides_differ"] == {}


def test_several_candidates_fail_naming_them(tmp_path, capsys):
    a = run_of(tmp_path / "a", "wireguard:mtu=1280", [400, 404, 398])
    b = run_of(tmp_path / "b", "wireguard:mtu=1420", [400, 404, 398])
    base = merge(tmp_path / "base", a, b)
    cand = run_of(tmp_path / "cand", OVERRIDE, [400, 402, 399])  # unchanged: still a failure
    assert main([*CHECK, "--run", str(cand), "--baseline", str(base), "--allow-missing-baseline"])
    v = regression(cand)
    assert v["status"] == "fail"
    assert f"{OVERRIDE} none/tcp" in v["message"]
    assert "wireguard:mtu=1280, wireguard:mtu=1420" in v["message"]
    assert "wireguard:mtu=1280" in words(capsys.readouterr().out)


def test_a_case_the_baseline_lacks_fails_unless_allowed(tmp_path, capsys):
    base = run_of(tmp_path / "base", "openvpn-tls", [400, 404, 398])
    cand = run_of(tmp_path / "cand", OVERRIDE, [400, 402, 399])
    argv = [*CHECK, "--run", str(cand), "--baseline", str(base)]
    assert main(argv) == 1
    v = regression(cand)
    assert v["status"] == "fail"
    assert f"no case {OVERRIDE} none/tcp" in v["message"] and "openvpn-tls" in v["message"]
    assert "--allow-missing-baseline" in v["message"]

    assert main([*argv, "--allow-missing-baseline"]) == 0
    assert regression(cand)["status"] == "skip"
    md = (cand / "check.md").read_text()
    assert "1 regression(s) not judged against the baseline" in md and OVERRIDE in md


def test_a_baseline_whose_case_failed_is_no_pass(tmp_path):
    base = make_run(tmp_path / "base", [400, 404, 398], fail_rep=None)
    rows = [json.loads(x) for x in (base / "results.jsonl").read_text().splitlines()]
    for r in rows:  # every tcp repetition of the baseline failed
        if r["label"] == "tcp":
            r.update(ok=False, error="tunnel did not come up", records=[])
    (base / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cand = run_of(tmp_path / "cand", OVERRIDE, [400, 402, 399])
    argv = [*CHECK, "--run", str(cand), "--baseline", str(base)]
    assert main(argv) == 1
    assert "every repetition failed there" in regression(cand)["message"]
    assert main([*argv, "--allow-missing-baseline"]) == 0


def test_several_baseline_runs_each_matched(tmp_path, capsys):
    bases = [make_run(tmp_path / f"b{i}", [m, m + 4, m - 4]) for i, m in enumerate((380, 420, 400))]
    cand = run_of(tmp_path / "cand", OVERRIDE, [300, 304, 298])
    argv = [*CHECK, "--run", str(cand), *(a for b in bases for a in ("--baseline", str(b)))]
    assert main(argv) == 1
    assert "t against 3 baseline runs" in words(capsys.readouterr().out)


def test_match_rule_units():
    g = {(s, "none", "tcp", 0): [] for s in ("wireguard", "wireguard:mtu=1280", "openvpn-tls")}
    assert match_baseline(("wireguard", "none", "tcp", 0), g)[0] == ("wireguard", "none", "tcp", 0)
    # two specs of wireguard fit a third one: no match, both named
    assert match_baseline((OVERRIDE, "none", "tcp", 0), g) == (
        None,
        ["wireguard", "wireguard:mtu=1280"],
    )
    assert match_baseline(("openvpn-tls:cipher=AES-128-GCM", "none", "tcp", 0), g)[0] == (
        "openvpn-tls",
        "none",
        "tcp",
        0,
    )
    assert match_baseline(("wireguard", "delay", "tcp", 0), g) == (None, [])
    assert overrides_differ("wireguard:mtu=1380,listen_port=9", "wireguard:mtu=1280") == {
        "listen_port": ["9", None],
        "mtu": ["1380", "1280"],
    }


def test_an_expectation_on_a_profile_name_covers_its_overrides():
    ctx = dict(points=["none"], tests={"tcp": "tcp"})
    (e,) = parse_expectations(
        [{"profile": "wireguard", "that": "throughput >= 50 Mbit/s"}],
        source="p.toml",
        profiles=[OVERRIDE],
        **ctx,
    )
    assert e.matches(OVERRIDE, "none", "tcp") and not e.matches("openvpn-tls", "none", "tcp")
    # where the plan has the plain spec too, the name means that spec only (as before)
    (e,) = parse_expectations(
        [{"profile": "wireguard", "that": "throughput >= 50 Mbit/s"}],
        source="p.toml",
        profiles=["wireguard", OVERRIDE],
        **ctx,
    )
    assert e.matches("wireguard", "none", "tcp") and not e.matches(OVERRIDE, "none", "tcp")


# ---------------------------------------------------------------------- units


def test_bounds_and_values_in_the_unit_written(tmp_path, capsys):
    slow = run_of(tmp_path / "slow", OVERRIDE, [40, 41, 39.5])
    j = tmp_path / "j.xml"
    assert main([*CHECK, "--run", str(slow), "--junit", str(j)]) == 1
    out = words(capsys.readouterr().out)
    md = (slow / "check.md").read_text()
    assert "bound throughput_bps >= 50 Mbit/s" in out and "throughput_bps = 40.17 Mbit/s" in out
    assert "rtt_avg_ms = 0.7 ms" in out and "bound rtt_avg_ms <= 10 ms" in out
    assert "| 40.17 Mbit/s | throughput_bps >= 50 Mbit/s |" in md
    for text in (out, md, j.read_text()):
        assert "5e+07" not in text and "4.017e+07" not in text
    (failure,) = ET.parse(j).getroot().iter("failure")
    assert "bound: throughput_bps >= 50 Mbit/s" in failure.text
    assert "measured: 40.17 Mbit/s" in failure.text
    bound = [v for v in json.loads((slow / "check.json").read_text())["verdicts"] if v["check"]
             == "throughput_bps >= 50 Mbit/s"][0]  # fmt: skip
    assert bound["measured"] == pytest.approx(40.1667e6, rel=1e-4)  # the column's unit kept


def test_every_repetition_and_other_units(tmp_path):
    (e,) = parse_expectations(
        [{"test": "ping", "that": "rtt_avg_ms <= 500 us", "of": "every"}],
        source="p.toml",
        profiles=["wireguard"],
        points=["none"],
        tests={"ping": "ping"},
    )
    assert (e.value, e.written, e.unit) == (pytest.approx(0.5), "500 us", "us")
    assert e.show(0.7) == "700 us"


def test_a_regression_shows_the_tests_main_unit(tmp_path, capsys):
    base = make_run(tmp_path / "base", [400, 410, 395])
    cand = run_of(tmp_path / "cand", OVERRIDE, [300, 305, 298])
    main([*CHECK, "--run", str(cand), "--baseline", str(base)])
    v = regression(cand)
    assert v["measured_text"] == "301 Mbit/s"
    assert "vs baseline 401.7 Mbit/s" in v["message"] and "(361.5 Mbit/s)" in v["bound"]


# ---------------------------------------------------------------------- lab ci init


def test_ci_init_lists_the_edits_the_files_need(tmp_path, capsys):
    assert main(["ci", "init", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    wf = tmp_path / ".github/workflows/lab-check.yml"
    lines = wf.read_text().splitlines()
    (n,) = [i for i, x in enumerate(lines, 1) if x.strip().startswith("LAB_REPO:")]
    assert "your-org/lab" in lines[n - 1] and "# EDIT:" in lines[n - 1]  # the placeholder marked
    assert f"{wf}:{n}: LAB_REPO: your-org/lab" in out  # and listed, with file and line
    plan = tmp_path / "lab-check.toml"
    (p,) = [i for i, x in enumerate(plan.read_text().splitlines(), 1) if x.startswith("profiles")]
    assert f"{plan}:{p}: profiles =" in out
    assert "vpn_profiles/" in out and "no baseline to commit" in out
    # every marked line of every file written is in the list, and nothing else is numbered so
    marked = [
        (rel, i)
        for rel in CI_FILES
        for i, x in enumerate((tmp_path / rel).read_text().splitlines(), 1)
        if EDIT_RE.search(x)
    ]
    for rel, i in marked:
        assert f"{tmp_path / rel}:{i}:" in out
    assert re.findall(r"^\s+(\d+)\. ", out, re.M) == [str(i) for i in range(1, len(marked) + 3)]
