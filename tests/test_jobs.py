"""`lab run --jobs N|auto` without root: the CPU budget, the labs a plan can keep busy, the
overhead and the interference verdict, all against hand-computed figures (lab.jobs)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lab.cpuprofile import load_profile
from lab.errors import ConfigError
from lab.jobs import (
    Budget,
    interference,
    lab_quota,
    max_labs,
    node_cpu_seconds,
    overhead_cores,
    parse_jobs,
    probe_overrides,
)
from lab.shard import Shard, shard_cases

from .test_shard import NONE, make_plan


def test_budget_by_hand():
    # 2 cores, 90 %: 1.8 of room; a lab of two 0.2-core nodes plus 0.13 overhead needs 0.53
    b = Budget(host_cores=2, quota_cores=0.4, overhead_cores=0.13, max_labs=8)
    assert b.per_lab == pytest.approx(0.53) and b.room == pytest.approx(1.8)
    assert b.fits(3) and not b.fits(4)  # 1.59 <= 1.8 < 2.12
    assert b.largest() == 3
    assert Budget(2, 0.4, 0.13, max_labs=2).largest() == 2  # never more than the plan keeps busy
    # quick.toml's two Pi 4 nodes (4 board cores each) ask ~1.94 host cores here: one lab
    assert Budget(2, 1.94, None, 16).largest() == 1
    assert Budget(8, 1.94, 0.1, 16).largest() == 3  # 7.2 / 2.04 = 3.5 on an 8-core machine
    # before the probe the overhead is unknown: the quotas alone
    assert Budget(2, 0.4, None, 8).largest() == 4
    text = Budget(2, 1.94, 0.2, 16).explain(2)
    assert "each lab needs 2.14 cores (1.94 node quotas + 0.20 measured overhead)" in text
    assert "this machine has 2 (90%: 1.80); 2 labs need 4.28" in text


def test_lab_quota_counts_profiles_fractions_and_uncapped_nodes():
    node = lambda name, cpu: SimpleNamespace(name=name, cpu=cpu)  # noqa: E731
    spec = SimpleNamespace(hosts=lambda: [node("a", 0.25), node("b", "pi4"), node("c", None)])
    total, per = lab_quota(spec, host_cores=2)
    pi4 = load_profile("pi4").quota_cores  # emulated cores x core share, not scaled to the host
    assert per == {"a": 0.25, "b": pi4, "c": 2.0}  # an uncapped node may take every core
    assert total == pytest.approx(0.25 + pi4 + 2.0)


def test_max_labs_is_the_largest_cut_without_an_empty_shard():
    # 2 profiles x (none: 3 reps, lossy: 1 rep): cells 0..3, 8 repetition blocks. Shard of
    # repetition r of cell c: (floor(r N / R) + c) mod N. N = 4: cell 0 -> 0, 1, 2; cell 1 -> 1;
    # cell 2 -> 2, 3, 0; cell 3 -> 3: all four busy. N = 5: cell 0 -> 0, 1, 3; cell 1 -> 1;
    # cell 2 -> 2, 3, 0; cell 3 -> 3: shard 4 empty; N = 8: 0, 2, 5 | 1 | 2, 4, 7 | 3: 6 empty
    plan = make_plan()
    assert max_labs(plan) == 4
    assert not shard_cases(plan, Shard(4, 5)) and not shard_cases(plan, Shard(6, 8))
    assert all(shard_cases(plan, Shard(i, 4)) for i in range(4))
    assert max_labs(plan, 3) == 3 and max_labs(plan, 2) == 2
    assert max_labs(make_plan(reps=1, profiles=("p1",), points=(NONE,))) == 1
    assert max_labs(make_plan(reps=1, points=(NONE,))) == 2


def test_overhead_by_hand():
    # samples 0.5 s apart: nodes at 40 % + 20 % of a core, then 100 % + 0 %
    samples = [
        {"t": 0.5, "nodes": {"client": {"total": 40.0}, "server": {"total": 20.0}}},
        {"t": 1.0, "nodes": {"client": {"total": 100.0}, "server": {"total": 0.0}}},
    ]
    assert node_cpu_seconds(samples) == pytest.approx(0.5 * 0.6 + 0.5 * 1.0)
    o = overhead_cores(tree_cpu_s=2.8, session_s=4.0, node_cpu_s=0.8)
    assert o["cores"] == pytest.approx(0.5)  # (2.8 - 0.8) / 4
    assert overhead_cores(0.5, 4.0, 0.8)["cores"] == 0.0


def test_interference_verdict_by_hand():
    # alone 10, 11, 12 (mean 11, sd 1); beside 11, 12, 13 (mean 12, sd 1):
    # t = -1 / sqrt(1/3 + 1/3) = -1.2247, df = 4, two-sided p = 0.288: within the noise
    v = interference([10.0, 11.0, 12.0], [11.0, 12.0, 13.0], higher_is_better=True)
    assert v["t"] == pytest.approx(-1.2247, abs=1e-4) and v["df"] == pytest.approx(4.0)
    assert v["p"] == pytest.approx(0.288, abs=0.002) and not v["changed"]
    assert v["ratio"] == pytest.approx(12 / 11)
    # beside 20, 21, 22: t = -11.02, p < 0.001: changed; either direction counts
    assert interference([10.0, 11.0, 12.0], [20.0, 21.0, 22.0], True)["changed"]
    assert interference([20.0, 21.0, 22.0], [10.0, 11.0, 12.0], True)["changed"]
    # no spread: any difference is beyond the noise, none is not
    assert not interference([5.0, 5.0, 5.0], [5.0, 5.0], False)["changed"]
    assert interference([5.0, 5.0, 5.0], [6.0, 6.0], False)["changed"]
    with pytest.raises(ValueError, match="2 or more values"):
        interference([5.0], [5.0, 6.0], True)


def test_parse_jobs():
    assert parse_jobs("auto") == "auto" and parse_jobs(" 3 ") == 3
    for bad in ("0", "-1", "two", "1.5", "257", ""):
        with pytest.raises(ConfigError, match="accepted: auto or a whole number from 1 to 256"):
            parse_jobs(bad)


def test_probe_is_the_first_profile_and_test_short():
    plan = make_plan()
    plan.overrides = ["topology.cpu=0.2"]
    plan.tests[0].params["duration_s"] = 5
    assert probe_overrides(plan) == [
        "topology.cpu=0.2",
        "profiles=p1",
        "impairments=none",
        "tests=a",
        "reps=3",
        "duration=2",
    ]
    plan.tests[0].params["duration_s"] = 1
    assert probe_overrides(plan)[-1] == "duration=1"


def _line(rep, ok=True, bps=9e8):
    rec = {"test": "tcp", "ok": ok, "receiver_bps": bps, "sender_bps": bps + 1e6}
    return {
        "case": f"baseline|none|tcp|{rep}",
        "profile": "baseline",
        "impairment": {"name": "none"},
        "test": "tcp",
        "label": "tcp",
        "rep": rep,
        "ok": ok,
        "error": None if ok else "iperf3 failed",
        "records": [rec],
    }


def test_probe_values_are_the_reports_primary_column(tmp_path):
    import json

    from lab.errors import PreconditionError
    from lab.parallel import probe_values

    (tmp_path / "results.jsonl").write_text(
        "".join(json.dumps(_line(r, bps=b)) + "\n" for r, b in enumerate((8e8, 9e8, 1e9)))
    )
    key: dict = {}
    # tcp ranks by throughput_bps, read from the record's receiver_bps (not the sender's)
    assert probe_values(tmp_path, key) == [8e8, 9e8, 1e9]
    assert key == {"metric": "throughput_bps", "higher_is_better": True}
    (tmp_path / "results.jsonl").write_text(json.dumps(_line(0, ok=False)) + "\n")
    with pytest.raises(PreconditionError, match="probe's case baseline\\|none\\|tcp\\|0 failed"):
        probe_values(tmp_path, {})
