"""`lab run --jobs` for real (root): a tiny plan (baseline and wireguard, ping, one repetition,
nodes capped at 0.1 core) as two labs at once, against the same plan run with `--jobs 1`; and
the refusals, which create nothing."""

from __future__ import annotations

import csv
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from lab.core.state import read_jsonl

from .conftest import lab_traces, run_lab

pytestmark = pytest.mark.root

PLAN = """
name = "jobs-tiny"
profiles = ["baseline", "wireguard"]
impairments = ["none"]
reps = 1
[topology]
file = "topologies/pi_pair.py"
cpu = 0.1
[[tests]]
test = "ping"
count = 5
interval_s = 0.05
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    d = tmp_path_factory.mktemp("jobs")
    (d / "tiny.toml").write_text(PLAN)
    e = {"LAB_STATE_DIR": str(d / "state"), "LAB_RUN_DIR": str(d / "run")}
    saved = {k: os.environ.get(k) for k in e}
    os.environ.update(e)  # lab_traces reads the same roots
    yield d, e
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _header(path):
    with open(path) as f:
        return next(csv.reader(f))


def _headings(run):
    text = (run / "report.md").read_text().replace(f"# Run {run.name}:", "# Run RUN:")
    return [ln for ln in text.splitlines() if ln.startswith("#")]


def _timeline(run):
    return read_jsonl(run / "timeline.jsonl")


def test_two_labs_at_once_give_a_normal_run(env):
    d, e = env
    par, one = d / "par", d / "one"
    # the reference --jobs 1 run at the same time (--force: whatever the probe measures)
    with ThreadPoolExecutor(2) as pool:
        jp = pool.submit(
            run_lab, "run", d / "tiny.toml", "--jobs", "2", "--force", "--out", par, env=e
        )
        jo = pool.submit(run_lab, "run", d / "tiny.toml", "--jobs", "1", "--out", one, env=e)
        cp, co = jp.result(), jo.result()
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "jobs: 2 (each lab needs" in cp.stdout and "this machine has" in cp.stdout
    assert co.returncode == 0, co.stdout + co.stderr
    assert not (one / "jobs.json").exists()  # --jobs 1 is a plain run: no probe, no shards

    # every case once, in plan order, as the one-lab run
    cases = [r["case"] for r in read_jsonl(par / "results.jsonl")]
    assert cases == [r["case"] for r in read_jsonl(one / "results.jsonl")]
    assert cases == ["baseline|none|ping|0", "wireguard|none|ping|0"]
    # the same schema
    for f in ("results.csv", "summary.csv"):
        assert _header(par / f) == _header(one / f)
    lines_p, lines_o = read_jsonl(par / "results.jsonl"), read_jsonl(one / "results.jsonl")
    assert [sorted(r) for r in lines_p] == [sorted(r) for r in lines_o]
    mp = json.loads((par / "manifest.json").read_text())
    mo = json.loads((one / "manifest.json").read_text())
    assert set(mp) == set(mo) | {"merged_from", "jobs"}
    assert _headings(par) == _headings(one)
    assert sorted(p.name for p in (par / "plots").iterdir()) == sorted(
        p.name for p in (one / "plots").iterdir()
    )

    # two labs of their own, both up at the same time (intervals from the shards' timelines)
    spans = {}
    for i in (0, 1):
        tl = _timeline(par / "shards" / f"shard-{i}")
        up = next(x for x in tl if x["event"] == "up" and x["ok"])
        down = next(x for x in tl if x["event"] == "down" and x["lab_id"] == up["lab_id"])
        spans[up["lab_id"]] = (up["t"] - up["seconds"], down["t"])
    assert len(spans) == 2
    starts, ends = zip(*spans.values(), strict=True)
    assert max(starts) < min(ends), f"the labs never overlapped: {spans}"

    # the decision and its figures: budget from the quotas, the screen's choice (its lab the
    # first alone), the probe alone in a second lab and beside
    jobs = json.loads((par / "jobs.json").read_text())
    assert jobs["n"] == 2 and mp["jobs"]["n"] == 2
    assert jobs["budget"]["quota_cores"] == pytest.approx(0.2)
    probe = jobs["probe"]
    assert probe == mp["jobs"]["probe"]
    choice = probe["choice"]
    screened = read_jsonl(par / "probe" / "screen" / "results.jsonl")
    assert sorted(r["profile"] for r in screened) == ["baseline"] * 3 + ["wireguard"] * 3
    assert (
        choice["profile"] == probe["profile"]
        and "closest to their CPU quota" in choice["criterion"]
    )
    if choice["scores"]:  # ping's 0.25 s may leave a profile without a monitor sample
        best = max(choice["scores"].values(), key=lambda x: x["utilisation"])
        assert choice["scores"][probe["profile"]] == best
    assert probe["margin"] == 0.05 and "not adaptive" in probe["margin_from"]
    alone = probe["alone"]
    assert alone["metric"] == "rtt_avg_ms" and [len(v) for v in alone["values"]] == [3, 3]
    assert alone["overhead"]["cores"] >= 0 and alone["overhead"]["window"] == "session"
    level = probe["levels"][0]
    assert level["n"] == 2 and [len(v) for v in level["values"]] == [3, 3]
    assert level["verdict"]["alone"]["values"] == alone["values"][0] + alone["values"][1]
    assert level["verdict"]["verdict"] in ("changed", "within the margin", "within the noise")
    # the probe's other labs ran the chosen profile only
    probes = [par / "probe" / n for n in ("alone-1", "n2-0", "n2-1")]
    for dd in probes:
        assert {r["profile"] for r in read_jsonl(dd / "results.jsonl")} == {probe["profile"]}

    # nothing left behind: every lab (probes' and shards') gone, every worker ended
    dirs = [par / "probe" / "screen", *probes]
    dirs += [par / "shards" / f"shard-{i}" for i in (0, 1)]
    ids = {x["lab_id"] for dd in dirs for x in _timeline(dd) if x.get("lab_id")}
    assert len(ids) == 6
    for lab_id in ids:
        assert lab_traces(lab_id) == []
    for w in jobs["workers"]:
        assert (
            w["rc"] == 0
            and not os.path.exists(f"/proc/{w['pid']}/cgroup")
            or (w["pid"] == os.getpid())
        )
    assert not list(d.glob(".par.*"))  # no merge left-overs beside the run


def test_refusals_create_nothing(env):
    d, e = env
    out = d / "refused"
    # uncapped nodes may take every core: two such labs never fit
    cp = run_lab(
        "run", d / "tiny.toml", "-o", "topology.cpu=host", "--jobs", "2", "--out", out, env=e
    )
    assert cp.returncode == 3, cp.stderr
    need = 2 * (os.cpu_count() or 1)
    assert re.search(
        rf"--jobs 2 does not fit this machine's CPU: each lab needs {need:.2f} cores "
        rf"\({need:.2f} node quotas\), this machine has {os.cpu_count()} .*; at most 1 fit",
        cp.stderr,
    ), cp.stderr
    # two profiles x one repetition: two labs at most
    cp = run_lab("run", d / "tiny.toml", "--jobs", "3", "--out", out, env=e)
    assert cp.returncode == 2 and "leaves some empty" in cp.stderr and "--jobs 2" in cp.stderr
    cp = run_lab("run", d / "tiny.toml", "--jobs", "2", "--shard", "0/2", "--out", out, env=e)
    assert cp.returncode == 2 and "--shard" in cp.stderr
    cp = run_lab("run", d / "tiny.toml", "--jobs", "many", "--out", out, env=e)
    assert cp.returncode == 2 and "accepted: auto or a whole number" in cp.stderr
    assert not out.exists()


def test_sigterm_stops_every_worker_and_its_lab(env):
    """SIGTERM to `lab run --jobs` while its probe's lab is up: the worker is stopped by its
    PID, its lab torn down, the run exits 130 and says how to go on; a run stopped before its
    shards started cannot be resumed, and says so."""
    import signal
    import subprocess
    import sys
    import time

    d, e = env
    slow = d / "slow.toml"
    slow.write_text(PLAN.replace("count = 5", "count = 400"))  # 20 s a case
    run = d / "stopped"
    p = subprocess.Popen(
        [sys.executable, "-m", "lab.cli.main", "run", slow, "--jobs", "2", "--force", "--out", run],
        env={**os.environ, **e},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    tl = run / "probe" / "screen" / "timeline.jsonl"
    end = time.monotonic() + 60
    while not (tl.is_file() and any(x["event"] == "up" for x in read_jsonl(tl))):
        assert p.poll() is None and time.monotonic() < end, "the probe's lab never came up"
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    _, stderr = p.communicate(timeout=60)
    assert p.returncode == 130, stderr
    assert f"Continue: lab run --resume {run}" in stderr
    jobs = json.loads((run / "jobs.json").read_text())
    (worker,) = jobs["stopped"]
    assert worker["name"] == "screen" and worker["rc"] is not None
    assert not os.path.exists(f"/proc/{worker['pid']}/cgroup")
    ids = {x["lab_id"] for x in read_jsonl(tl) if x.get("lab_id")}
    assert len(ids) == 1 and lab_traces(ids.pop()) == []
    assert jobs["left_over"] == []
    cp = run_lab("run", "--resume", run, env=e)
    assert cp.returncode == 2 and "stopped before its shards started" in cp.stderr
