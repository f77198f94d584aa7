"""`lab run` for real (root): a tool failing mid-way, a SIGKILLed run resumed, compare of two runs.

Tiny plans (baseline profile, 1 s tests) keep this under a minute. Every lab id the runs used is
read from their timeline and checked to be gone afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import ClassVar

import pandas as pd
import pytest

from lab import measure
from lab.model.params import Param
from lab.measure.base import Test, describe_failure, invoke
from lab.campaign.load import load_plan
from lab.results.rundir import RunDir
from lab.core.state import read_jsonl
from lab.campaign.runner import Runner
from lab.campaign.setup import create_run_dir

from .conftest import REPO, lab_traces, run_lab

pytestmark = pytest.mark.root

TINY = """
name = "tiny"
profiles = ["baseline"]
impairments = ["none"]
reps = {reps}
[topology]
file = "topologies/pi_pair.py"
cpu = 0.5
{tests}
"""


class FlakyTest(Test):
    """Runs a real command on the client; call 2 fails (exit 3), call 3 raises."""

    name = "flaky"
    schema: ClassVar[dict[str, Param]] = {"x": Param(int, 0)}

    def __init__(self):
        self.calls = 0

    def run(self, ctx, params):
        self.calls += 1
        if self.calls == 3:
            raise OSError("the tool vanished")
        code = 3 if self.calls == 2 else 0
        inv = invoke(ctx, ctx.client,
                     ["sh", "-c", f"echo partial output {self.calls}; echo oops >&2; exit {code}"],
                     label="flaky", timeout=10)  # fmt: skip
        if inv.returncode:
            return [self.record(ok=False, error=describe_failure(inv, "flaky"),
                                raw_files=inv.raw_files)]  # fmt: skip
        return [self.record(raw_files=inv.raw_files, value=1.0)]


def _lab_ids(run: RunDir) -> set[str]:
    return {e["lab_id"] for e in run.load_timeline() if e.get("lab_id")}


def _assert_clean(run: RunDir) -> None:
    for lab_id in _lab_ids(run):
        assert not lab_traces(lab_id), lab_traces(lab_id)


def test_failing_tool_keeps_the_run_going(tmp_path, monkeypatch):
    monkeypatch.setitem(measure.TESTS, "flaky", FlakyTest())
    tests = '[[tests]]\ntest = "flaky"\n[[tests]]\ntest = "ping"\ncount = 3\ninterval_s = 0.05\n'
    path = tmp_path / "tiny.toml"
    path.write_text(TINY.format(reps=3, tests=tests))
    plan = load_plan(path)
    run = create_run_dir(plan, tmp_path / "run")
    counts = Runner(plan, run).execute()
    assert counts == {"ok": 4, "failed": 2, "skipped": 0}
    lines = {r["case"]: r for r in read_jsonl(run.results)}
    assert len(lines) == 6 and all(lines[f"baseline|none|ping|{i}"]["ok"] for i in range(3))
    bad = lines["baseline|none|flaky|1"]
    assert not bad["ok"] and "flaky exited 3" in bad["error"]
    # the raw output of the failed case, as it arrived, in the result line and on disk
    tails = "\n".join(bad["raw_tail"].values())
    assert "partial output 2" in tails and "oops" in tails
    assert (run.path / bad["records"][0]["raw_files"][0]).read_text() == "partial output 2\n"
    boom = lines["baseline|none|flaky|2"]
    assert not boom["ok"] and "OSError: the tool vanished" in boom["error"]
    assert "the tool vanished" in (run.path / boom["raw_dir"] / "error.txt").read_text()
    # monitors ran during every test
    assert lines["baseline|none|ping|0"]["monitor"]["samples"] >= 1
    from lab.results.report import generate

    generate(run.path)
    md = run.file("report.md").read_text()
    assert "baseline|none|flaky|1" in md and "partial output 2" in md
    df = pd.read_csv(run.file("results.csv"))
    assert (~df.ok).sum() == 2
    _assert_clean(run)


def _start(args, tmp_path):
    log = open(tmp_path / "lab-run.log", "w")  # noqa: SIM115 -- handed to the child
    return subprocess.Popen([sys.executable, "-m", "lab.cli.main", *map(str, args)], cwd=REPO,
                            stdout=log, stderr=subprocess.STDOUT)  # fmt: skip


def test_sigkill_then_resume_loses_nothing(tmp_path):
    tests = textwrap.dedent("""
        [[tests]]
        test = "tcp"
        duration_s = 1
        [[tests]]
        test = "ping"
        count = 3
        interval_s = 0.05
    """)
    path = tmp_path / "tiny.toml"
    path.write_text(TINY.format(reps=4, tests=tests))
    out = tmp_path / "run"
    p = _start(["run", path, "--out", out], tmp_path)
    run = RunDir(out)
    deadline = time.monotonic() + 60
    while len(read_jsonl(run.results)) < 3:
        assert p.poll() is None, (tmp_path / "lab-run.log").read_text()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    before = run.results.read_text().splitlines()
    done_before = [json.loads(x)["case"] for x in before]
    (killed_lab,) = _lab_ids(run)
    assert lab_traces(killed_lab), "the killed run's lab should still be up"

    cp = run_lab("run", "--resume", out, timeout=120)
    # exit 1 = a case failed (a loaded CI host can time a tool out): still nothing lost
    assert cp.returncode in (0, 1), cp.stdout + cp.stderr
    assert f"{len(done_before)} finished case repetitions skipped" in cp.stdout
    after = run.results.read_text().splitlines()
    assert after[: len(before)] == before  # nothing rewritten
    keys = [json.loads(x)["case"] for x in after]
    expected = [c.key for c in load_plan(path).cases()]
    assert sorted(keys) == sorted(expected) and len(keys) == len(set(keys)) == 8
    tl = run.load_timeline()
    assert any(e["event"] == "down" and e.get("lab_id") == killed_lab for e in tl)
    assert len({e["session"] for e in tl}) == 2
    manifest = json.loads(run.file("manifest.json").read_text())
    assert len(manifest["sessions"]) == 2 and manifest["git_revision"]
    assert manifest["profiles"]["baseline"]["path"] == "none"
    assert "Time outside measurement" in run.file("report.md").read_text()
    _assert_clean(run)

    # a second, shorter run of the same plan, compared with this one
    cp = run_lab("run", path, "-o", "reps=1", "--out", tmp_path / "run2", timeout=120)
    assert cp.returncode in (0, 1), cp.stdout + cp.stderr
    cp = run_lab("compare", out, tmp_path / "run2", timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    df = pd.read_csv(tmp_path / "run2" / f"compare-{out.name}" / "compare.csv")
    tcp = df[(df.test_label == "tcp") & (df.metric == "throughput_bps")]
    ok_tcp = sum(1 for x in after if json.loads(x)["ok"] and json.loads(x)["label"] == "tcp")
    assert len(tcp) == 1 and tcp.n_a.iloc[0] == ok_tcp and tcp.n_b.iloc[0] == 1

    def tcp_mean(run_dir):  # mean throughput of the run's successful tcp repetitions
        r = pd.read_csv(run_dir / "results.csv")
        return r[r.ok & (r.test_label == "tcp")].throughput_bps.mean()

    # the ratio is B's mean over A's, whatever the two throughputs were on this host
    expected = tcp_mean(tmp_path / "run2") / tcp_mean(out)
    assert tcp.ratio_b_over_a.iloc[0] == pytest.approx(expected, rel=1e-3)
    _assert_clean(RunDir(tmp_path / "run2"))


def test_bad_plan_creates_nothing(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(TINY.format(reps=0, tests='[[tests]]\ntest = "tcp"\n'))
    cp = run_lab("run", path, "--out", tmp_path / "run")
    assert cp.returncode == 2
    assert "reps" in cp.stderr and "integer 1..10000" in cp.stderr
    assert not (tmp_path / "run").exists()


def test_resume_refuses_a_changed_plan(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY.format(reps=1, tests='[[tests]]\ntest = "ping"\ncount = 2\n'))
    run = create_run_dir(load_plan(path), tmp_path / "run")
    cp = run_lab("run", "--resume", run.path, "-o", "reps=2")
    assert cp.returncode == 2 and "differs" in cp.stderr


def test_ctrl_c_twice_still_tears_down(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY.format(reps=5, tests='[[tests]]\ntest = "tcp"\nduration_s = 2\n'))
    out = tmp_path / "run"
    p = _start(["run", path, "--out", out], tmp_path)
    run = RunDir(out)
    deadline = time.monotonic() + 60
    while not any(e["event"] == "up" for e in run.load_timeline()):
        assert p.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.5)  # inside the first test
    p.send_signal(signal.SIGINT)
    time.sleep(0.05)
    p.send_signal(signal.SIGINT)  # impatient second Ctrl-C
    assert p.wait(timeout=60) == 130, (tmp_path / "lab-run.log").read_text()
    assert "--resume" in (tmp_path / "lab-run.log").read_text()
    assert any(e["event"] == "down" for e in run.load_timeline())
    assert run.file("report.md").is_file()
    _assert_clean(run)


def test_ipv6_tests_target_the_ipv6_traffic_address(tmp_path):
    """Study C's repeat over IPv6: `ip = 6` on a test sends its traffic to the lab's IPv6
    traffic address (the tunnel's for a VPN profile, the peer's underlay for baseline)."""
    plan_text = textwrap.dedent("""
        name = "six"
        profiles = ["baseline", "wireguard"]
        impairments = ["none"]
        reps = 1
        [topology]
        file = "topologies/pi_pair_middlebox.py"
        cpu = 0.5
        [[tests]]
        test = "ping"
        name = "ping4"
        count = 2
        interval_s = 0.05
        [[tests]]
        test = "ping"
        name = "ping6"
        ip = 6
        count = 2
        interval_s = 0.05
        [[tests]]
        test = "tcp"
        name = "tcp6"
        ip = 6
        duration_s = 1
        [[tests]]
        test = "rr"
        name = "rr6"
        ip = 6
        duration_s = 1
    """)
    path = tmp_path / "six.toml"
    path.write_text(plan_text)
    plan = load_plan(path)
    run = create_run_dir(plan, tmp_path / "run")
    counts = Runner(plan, run).execute()
    lines = {r["case"]: r for r in read_jsonl(run.results)}
    assert counts == {"ok": 8, "failed": 0, "skipped": 0}, {
        k: v["error"] for k, v in lines.items() if not v["ok"]
    }
    for profile, v4, v6 in (("baseline", "10.0.2.2", "fd00:2::2"), ("wireguard", "10.99.0.2", "fd99::2")):  # fmt: skip
        assert lines[f"{profile}|none|ping4|0"]["target"] == v4
        assert lines[f"{profile}|none|ping4|0"]["ip"] == 4
        for label in ("ping6", "tcp6", "rr6"):
            r = lines[f"{profile}|none|{label}|0"]
            assert (r["ip"], r["target"]) == (6, v6), r
        assert lines[f"{profile}|none|ping6|0"]["records"][0]["family"] == 6
    from lab.results.report import generate

    generate(run.path)
    df = pd.read_csv(run.file("results.csv"))
    assert sorted(df.groupby("test_label").ip.first().items()) == [
        ("ping4", 4), ("ping6", 6), ("rr6", 6), ("tcp6", 6)
    ]  # fmt: skip
    _assert_clean(run)
