"""Shards and merges without root: which cases each shard runs (hand-computed), case ids, and
every refusal of `lab merge` (another plan, another code version, a shard given twice, other
cuts, duplicate, foreign and missing cases), each leaving nothing behind."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from lab.core.errors import ConfigError
from lab.campaign.merge import merge
from lab.campaign import plan as plancases
from lab.campaign.plan import Plan
from lab.model.impairment.directional import DirectionalImpairment, parse_directional
from lab.model.impairment.points import ImpairmentPoint
from lab.campaign.shard import (
    Shard,
    case_id,
    case_seed,
    parse_shard,
    plan_from_json,
    resume_shard,
    shard_cases,
)

NONE = ImpairmentPoint("none", DirectionalImpairment(), "none")
LOSSY = ImpairmentPoint("lossy", parse_directional("loss 1%"), "lossy")


def make_plan(reps=3, impaired_reps=1, profiles=("p1", "p2"), points=(NONE, LOSSY), name="t"):
    return Plan(
        name=name,
        source="t.toml",
        description="",
        study="",
        notes=[],
        topology_file="topologies/pi_pair.py",
        topo=None,
        topology_params={"cpu": "host"},
        profiles=list(profiles),
        points=list(points),
        placement=None,
        reps=reps,
        impaired_reps=impaired_reps,
        timeout_s=30.0,
        error_bars="sd",
        tests=[
            plancases.TestEntry("a", "ping", {"count": 5}, None),
            plancases.TestEntry("b", "ping", {}, None),
        ],
    )


def keys(cases):
    return [c.key for c in cases]


def test_shards_by_repetition_blocks_hand_computed():
    # cells in plan order: 0 = (p1, none) R=3, 1 = (p1, lossy) R=1, 2 = (p2, none) R=3,
    # 3 = (p2, lossy) R=1; rep r of cell c -> (r*N//R + c) % N
    plan = make_plan()
    got = [keys(shard_cases(plan, Shard(i, 3))) for i in range(3)]
    assert got[0] == [
        "p1|none|a|0", "p1|none|b|0",          # cell 0, rep 0 -> 0
        "p2|none|a|1", "p2|none|b|1",          # cell 2, rep 1 -> (1+2)%3 = 0
        "p2|lossy|a|0", "p2|lossy|b|0",        # cell 3, rep 0 -> (0+3)%3 = 0
    ]  # fmt: skip
    assert got[1] == [
        "p1|none|a|1", "p1|none|b|1",          # cell 0, rep 1
        "p1|lossy|a|0", "p1|lossy|b|0",        # cell 1, rep 0 -> 1
        "p2|none|a|2", "p2|none|b|2",          # cell 2, rep 2 -> (2+2)%3 = 1
    ]  # fmt: skip
    assert got[2] == ["p1|none|a|2", "p1|none|b|2", "p2|none|a|0", "p2|none|b|0"]
    # two shards of 3 repetitions: blocks [0, 1] and [2] (r*2//3), cell 2 rotated by 0
    two = [keys(shard_cases(plan, Shard(i, 2))) for i in range(2)]
    assert [k for k in two[1] if "|none|" in k] == [
        "p1|none|a|2", "p1|none|b|2", "p2|none|a|2", "p2|none|b|2"
    ]  # fmt: skip
    # every machine runs every profile, no case twice, none left out
    for n in (1, 2, 3, 4, 7):
        parts = [keys(shard_cases(plan, Shard(i, n))) for i in range(n)]
        flat = [k for p in parts for k in p]
        assert sorted(flat) == sorted(keys(plan.cases()))
        assert len(flat) == len(set(flat))
    assert keys(shard_cases(plan, None)) == keys(plan.cases())


def test_case_id_from_plan_digest_and_key():
    # printf 'abc\nbaseline|none|ping|0' | sha256sum
    assert case_id("abc", "baseline|none|ping|0") == "0ddd8d8a9b98fd93"
    assert case_id("abd", "baseline|none|ping|0") == "933ad90ed1004474"
    assert case_seed("abc", "baseline|none|ping|0") == 0x0DDD8D8A == 232623498


@pytest.mark.parametrize("overrides", [[], ["adaptive=true"]])
def test_merge_reads_every_shipped_plan_back(overrides):
    """lab merge lists a plan's cases from plan.json alone: for every shipped plan the same
    cases and digest as the loaded plan."""
    from lab.campaign.load import PLAN_DIR, load_plan

    for f in sorted(PLAN_DIR.glob("*.toml")):
        plan = load_plan(f, overrides)
        back = plan_from_json({**plan.to_json(), "digest": plan.digest()}, source=str(f))
        assert keys(back.cases()) == keys(plan.cases()) and back.digest() == plan.digest()
    edited = {**make_plan().to_json(), "digest": make_plan(reps=4).digest()}
    with pytest.raises(ConfigError, match="x.json: digest: its digest .* is not the digest"):
        plan_from_json(edited, source="x.json")


@pytest.mark.parametrize("text", ["3/3", "-1/3", "a/b", "0/0", "1", "", "0/10001"])
def test_parse_shard_refuses(text):
    with pytest.raises(ConfigError, match=r"^--shard: got .*accepted: i/N"):
        parse_shard(text)


def test_parse_shard():
    assert parse_shard("2/5") == Shard(2, 5)
    assert str(parse_shard(" 0 / 1 ")) == "0/1"


# ---------------------------------------------------------------------- merge


def entry(plan, key):
    profile, point, label, rep = key.split("|")
    return {
        "schema": 1,
        "case": key,
        "case_id": case_id(plan.digest(), key),
        "session": "s",
        "profile": profile,
        "vpn": {"driver": "none", "path": "none"},
        "impairment": next(p for p in plan.points if p.name == point).to_json(),
        "test": "ping",
        "label": label,
        "ip": 4,
        "rep": int(rep),
        "params": {},
        "ok": True,
        "error": None,
        "seconds": 1.0,
        "records": [{"ok": True, "rtt_avg_ms": 1.0 + int(rep)}],
        "monitor": {},
    }


def write_shard(root, plan, shard, *, cases=None, source="a1b2", name=None):
    """A shard's run directory as `lab run --shard` writes it (what merge reads of it)."""
    d = root / (name or f"s{shard.index}")
    (d / "raw" / f"rep{shard.index}").mkdir(parents=True)
    (d / "raw" / f"rep{shard.index}" / "out.txt").write_text("raw\n")
    (d / "plan.json").write_text(
        json.dumps({**plan.to_json(), "digest": plan.digest(), "shard": shard.to_json()})
    )
    manifest = {
        "schema": 1,
        "kind": "lab-run",
        "plan_digest": plan.digest(),
        "code_version": {"lab_version": "0.1.0", "source_sha256": source, "git": "g"},
        "shard": shard.to_json(),
        "calibration": {"host_cpu_model": f"cpu{shard.index}", "profiles": {}},
        "kernel": {"hostname": f"node{shard.index}"},
        "profiles": {},
        "impairment": {},
        "cpu": {},
        "sessions": [{"session": f"s{shard.index}"}],
    }
    (d / "manifest.json").write_text(json.dumps(manifest))
    ks = keys(shard_cases(plan, shard)) if cases is None else cases
    (d / "results.jsonl").write_text("".join(json.dumps(entry(plan, k)) + "\n" for k in ks))
    (d / "timeline.jsonl").write_text(
        json.dumps({"t": 1.0 + shard.index, "session": f"s{shard.index}", "event": "x"}) + "\n"
    )
    return d


def test_merge_writes_one_run_in_plan_order(tmp_path):
    plan = make_plan()
    dirs = [write_shard(tmp_path, plan, Shard(i, 3)) for i in (2, 0, 1)]
    out = tmp_path / "merged"
    s = merge(dirs, out)
    lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert [r["case"] for r in lines] == keys(plan.cases())
    assert s["cases"] == 16 and s["failed"] == 0
    m = json.loads((out / "manifest.json").read_text())
    assert [x["hostname"] for x in m["merged_from"]] == ["node0", "node1", "node2"]
    assert [x["calibration"]["host_cpu_model"] for x in m["merged_from"]] == [
        "cpu0",
        "cpu1",
        "cpu2",
    ]
    assert [x["session"] for x in m["sessions"]] == ["s0", "s1", "s2"]
    assert "shard" not in json.loads((out / "plan.json").read_text())
    assert sorted(p.name for p in (out / "raw").iterdir()) == ["rep0", "rep1", "rep2"]
    assert (out / "report.md").is_file() and (out / "summary.csv").is_file()


def refused(tmp_path, dirs, match):
    out = tmp_path / "merged"
    with pytest.raises(ConfigError, match=match):
        merge(dirs, out)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_merge_refuses_a_shard_of_another_plan(tmp_path):
    plan, other = make_plan(), make_plan(reps=4)
    d0 = write_shard(tmp_path, plan, Shard(0, 2))
    d1 = write_shard(tmp_path, other, Shard(1, 2))
    refused(tmp_path, [d0, d1], rf"{d1}: plan digest: plan digest {other.digest()} differs")


def test_merge_refuses_another_code_version(tmp_path):
    plan = make_plan()
    d0 = write_shard(tmp_path, plan, Shard(0, 2))
    d1 = write_shard(tmp_path, plan, Shard(1, 2), source="ffff")
    refused(tmp_path, [d0, d1], rf"{d1}: code_version.source_sha256: .* ffff differs from a1b2")


def test_merge_refuses_a_shard_resumed_with_other_code(tmp_path):
    plan = make_plan()
    d0 = write_shard(tmp_path, plan, Shard(0, 2))
    d1 = write_shard(tmp_path, plan, Shard(1, 2))
    m = json.loads((d1 / "manifest.json").read_text())
    m["sessions"].append({"session": "later", "source_sha256": "beef"})
    (d1 / "manifest.json").write_text(json.dumps(m))
    refused(tmp_path, [d0, d1], rf"{d1}: code_version.source_sha256: its session later .* beef")


def test_merge_refuses_other_cuts_and_repeats(tmp_path):
    plan = make_plan()
    d0 = write_shard(tmp_path, plan, Shard(0, 2))
    d1 = write_shard(tmp_path, plan, Shard(1, 3))
    refused(tmp_path, [d0, d1], rf"{d1}: shard: shard 1/3 is one of 3")
    d0b = write_shard(tmp_path, plan, Shard(0, 2), name="again")
    refused(tmp_path, [d0, d0b], r"shard 0/2 given twice")


def test_merge_refuses_duplicate_foreign_and_missing_cases(tmp_path):
    plan = make_plan()
    s0, s1 = Shard(0, 2), Shard(1, 2)
    k0, k1 = keys(shard_cases(plan, s0)), keys(shard_cases(plan, s1))
    d0 = write_shard(tmp_path, plan, s0)
    d1 = write_shard(tmp_path, plan, s1, cases=[*k1, k0[0]], name="dup")
    refused(tmp_path, [d0, d1], rf"duplicate cases: {k0[0].replace('|', '.')} in {d0}")
    d2 = write_shard(tmp_path, plan, s1, cases=k1[1:], name="short")
    refused(
        tmp_path,
        [d0, d2],
        rf"1 missing cases: {k1[0].replace('|', '.')} \(shard 1/2: lab run --resume {d2}\)",
    )
    d3 = write_shard(tmp_path, plan, s1, cases=[*k1, "p9|none|a|0"], name="foreign")
    refused(tmp_path, [d0, d3], r"cases not in the plan: p9.none.a.0")
    refused(tmp_path, [d0], rf"{len(k1)} missing cases: .*\(shard 1/2: not given\)")


def test_merge_refuses_before_anything_exists(tmp_path):
    (tmp_path / "notarun").mkdir()
    refused(tmp_path, [tmp_path / "notarun"], r"notarun: not a run directory")
    out = tmp_path / "full"
    out.mkdir()
    (out / "x").write_text("")
    with pytest.raises(ConfigError, match="exists and is not empty") as e:
        merge([tmp_path / "notarun"], out)
    assert "--resume" not in str(e.value)  # lab merge has no --resume to suggest


def test_resume_keeps_the_shard(tmp_path):
    plan = make_plan()
    d = write_shard(tmp_path, plan, Shard(1, 3))

    class Run:
        path = d

        def plan_json(self):
            return json.loads((d / "plan.json").read_text())

    assert resume_shard(Run(), None) == Shard(1, 3)
    with pytest.raises(ConfigError, match="this run is shard 1/3, not 0/3"):
        resume_shard(Run(), Shard(0, 3))


# ---------------------------------------------------------------------- the recipes

SCALE = Path(__file__).resolve().parent.parent / "docs/examples/scale"


def _bash_n(text: str, where: str) -> None:
    r = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    assert r.returncode == 0, f"{where}: {r.stderr}"


def test_recipes_are_consistent():
    """Every shell script parses; the Kubernetes Job and the Actions matrix cut the plan into
    as many shards as they start, and hand the shard index to lab run --shard."""
    for p in sorted((SCALE / "slurm").iterdir()):
        _bash_n(p.read_text(), str(p))
    shards, merge_job = (SCALE / "kubernetes/lab-shards.yaml"), SCALE / "kubernetes/lab-merge.yaml"
    job = [d for d in yaml.safe_load_all(shards.read_text()) if d["kind"] == "Job"][0]
    spec = job["spec"]
    c = spec["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == int(env["LAB_SHARDS"])
    assert '--shard "$i/$LAB_SHARDS"' in c["args"][0] and "i=$JOB_COMPLETION_INDEX" in c["args"][0]
    _bash_n(c["args"][0], str(shards))
    m = yaml.safe_load(merge_job.read_text())["spec"]["template"]["spec"]["containers"][0]
    _bash_n(m["args"][0], str(merge_job))
    wf = yaml.safe_load((SCALE / "github/lab-shards.yml").read_text())
    assert len(wf["jobs"]["shard"]["strategy"]["matrix"]["shard"]) == int(wf["env"]["SHARDS"])
    assert wf["jobs"]["merge"]["needs"] == "shard"
    for name, j in wf["jobs"].items():
        for step in j["steps"]:
            if "run" in step:
                _bash_n(re.sub(r"\$\{\{[^}]*\}\}", "x", step["run"]), f"{name}: {step.get('name')}")
