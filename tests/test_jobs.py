"""`lab run --jobs N|auto` without root: the CPU budget, the labs a plan can keep busy, the
overhead and the interference verdict, all against hand-computed figures (lab.campaign.jobs)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lab.model.cpuprofile import load_cpu_profile
from lab.core.errors import ConfigError
from lab.campaign.jobs import (
    FIXED_MARGIN,
    Budget,
    choose_probe,
    interference,
    lab_quota,
    max_labs,
    node_cores,
    node_cpu_seconds,
    overhead_cores,
    parse_jobs,
    probe_margin,
    probe_overrides,
)
from lab.campaign.plan import TestEntry as Entry
from lab.campaign.shard import Shard, shard_cases

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
    pi4 = load_cpu_profile("pi4").quota_cores  # emulated cores x core share, not scaled to the host
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
    # per node, over the 1 s the samples span: client 0.5 x 0.4 + 0.5 x 1.0, server 0.5 x 0.2
    assert node_cores(samples) == pytest.approx({"client": 0.7, "server": 0.1})
    assert node_cores([]) == {}
    o = overhead_cores(tree_cpu_s=2.8, session_s=4.0, node_cpu_s=0.8)
    assert o["cores"] == pytest.approx(0.5)  # (2.8 - 0.8) / 4
    assert overhead_cores(0.5, 4.0, 0.8)["cores"] == 0.0


def test_interference_verdict_by_hand():
    # one lab a side: alone 10, 11, 12 (mean 11, sd 1); beside 11, 12, 13 (mean 12, sd 1):
    # t = -1 / sqrt(1/3 + 1/3) = -1.2247, df = 4, two-sided p = 0.288: within the noise
    v = interference([[10.0, 11.0, 12.0]], [[11.0, 12.0, 13.0]], higher_is_better=True)
    assert v["t"] == pytest.approx(-1.2247, abs=1e-4) and v["df"] == pytest.approx(4.0)
    assert v["p"] == pytest.approx(0.288, abs=0.002) and not v["changed"]
    assert v["verdict"] == "within the noise" and v["margin"] == FIXED_MARGIN == 0.05
    assert v["ratio"] == pytest.approx(12 / 11) and v["shift"] == pytest.approx(1 / 11)
    # beside 20, 21, 22: t = -11.02, p < 0.001, +91 %: changed; either direction counts
    assert interference([[10.0, 11.0, 12.0]], [[20.0, 21.0, 22.0]], True)["changed"]
    assert interference([[20.0, 21.0, 22.0]], [[10.0, 11.0, 12.0]], True)["changed"]
    # no spread: any difference is significant (then the margin decides), none is not
    assert interference([[5.0, 5.0, 5.0]], [[5.0, 5.0]], False)["verdict"] == "within the noise"
    assert interference([[5.0, 5.0, 5.0]], [[6.0, 6.0]], False)["changed"]  # +20 %
    nospread = interference([[5.0, 5.0, 5.0]], [[5.1, 5.1]], False)  # +2 %: p = 0, < 5 %
    assert nospread["p"] == 0.0 and nospread["verdict"] == "within the margin"
    with pytest.raises(ValueError, match="2 or more values"):
        interference([[5.0]], [[5.0, 6.0]], True)


def test_a_significant_shift_within_the_margin_is_not_a_change():
    # alone two labs of 100, 101, 99: mean 100, sd sqrt(4/5) = 0.894; beside two of 97, 98, 96:
    # mean 97, same sd. se = sqrt(0.8/6 + 0.8/6) = 0.5164, t = 3 / 0.5164 = 5.809, df = 10,
    # two-sided p = 0.00017: significant, but -3 % is within the 5 % margin
    alone, beside = [[100.0, 101.0, 99.0]] * 2, [[97.0, 98.0, 96.0]] * 2
    v = interference(alone, beside, True, margin=0.05)
    assert v["t"] == pytest.approx(5.809, abs=1e-3) and v["df"] == pytest.approx(10.0)
    assert v["p"] == pytest.approx(0.00017, abs=0.00002)
    assert v["shift"] == pytest.approx(-0.03)
    assert v["verdict"] == "within the margin" and not v["changed"]
    # TOST at 5: t = (-3 + 5) / 0.5164 = 3.873 (p 0.0015) and (5 + 3) / 0.5164: equivalent
    assert v["equivalent"]
    assert v["alone"]["labs"] == 2 and v["alone"]["lab_means"] == [100.0, 100.0]
    # the same figures with a 2 % margin (an adaptive test asking for +-2 %): changed
    tight = interference(alone, beside, True, margin=0.02)
    assert tight["changed"] and tight["p"] == v["p"] and not tight["equivalent"]
    # a 10 % shift in noise: alone 100, 120 | 80, 100 (sd 16.33), beside 90, 110 | 70, 90:
    # se = 11.547, t = 0.866, df = 6, p = 0.42: within the noise, and not shown equivalent
    noisy = interference([[100.0, 120.0], [80.0, 100.0]], [[90.0, 110.0], [70.0, 90.0]], True)
    assert noisy["p"] == pytest.approx(0.42, abs=0.01) and noisy["verdict"] == "within the noise"
    assert not noisy["equivalent"]


def test_the_reported_refusal_of_a_1_percent_shift_now_passes():
    # bench/jobs.py at a quiet moment (docs/scale.md): baseline tcp alone in one lab 958.0 +-
    # 0.01 Mbit/s, beside in two 946.9 +- 11: the same Welch p = 0.049 as before, -1.16 %,
    # which is within the 5 % margin
    alone = [[958019962.697383, 958028805.4882445, 958040373.7077075]]
    beside = [
        [956409106.446435, 938222084.676896, 948137704.7771035],
        [952371924.9948394, 955912820.015613, 930233501.1593375],
    ]
    v = interference(alone, beside, True)
    assert v["p"] == pytest.approx(0.0489, abs=0.0005) and v["shift"] == pytest.approx(
        -0.01164, abs=1e-4
    )
    assert v["verdict"] == "within the margin" and v["equivalent"]


def test_a_second_alone_lab_carries_the_bring_up_spread():
    # one alone lab 10.0, 10.1, 9.9 against two beside labs 10.6, 10.7, 10.5: +6 % and far
    # beyond that lab's spread: changed
    first, later = [10.0, 10.1, 9.9], [10.6, 10.7, 10.5]
    assert interference([first], [later, later], True)["changed"]
    # a second alone lab that came up like the beside ones: alone mean 10.3, sd sqrt(0.58 / 5)
    # = 0.3406; beside mean 10.6, sd sqrt(0.04 / 5) = 0.0894; se = sqrt(0.116 / 6 + 0.008 / 6)
    # = 0.14376, t = -2.087, df = 5.69, p = 0.085; +2.9 %: within the noise (and the margin)
    v = interference([first, later], [later, later], True)
    assert v["alone"]["sd"] == pytest.approx(0.3406, abs=1e-4)
    assert v["t"] == pytest.approx(-2.087, abs=1e-3) and v["df"] == pytest.approx(5.69, abs=0.01)
    assert v["p"] == pytest.approx(0.085, abs=0.003) and v["verdict"] == "within the noise"
    assert v["alone"]["lab_means"] == pytest.approx([10.0, 10.6])


def test_probe_margin_is_the_tests_precision_target():
    adaptive = Entry("tcp", "tcp", {"adaptive": True, "adaptive_rel_pct": 2.5}, None)
    margin, why = probe_margin(adaptive)
    assert margin == 0.025 and "adaptive_rel_pct = 2.5" in why
    fixed = Entry("tcp", "tcp", {"adaptive": False, "adaptive_rel_pct": 2.5}, None)
    margin, why = probe_margin(fixed)
    assert margin == FIXED_MARGIN and "FIXED_MARGIN" in why and "not adaptive" in why
    assert probe_margin(Entry("m", "mtu", {}, None))[0] == FIXED_MARGIN


def test_probe_profile_is_the_one_nearest_its_quota():
    # quick.toml at cpu=0.3 (bench/jobs.py's monitor figures): baseline's TCP leaves its nodes
    # near idle, the VPNs run at their cap; openvpn's client 0.279 / 0.3 = 93 % beats
    # wireguard's 0.278 / 0.3 = 92.7 %
    q = {"client": 0.3, "server": 0.3}
    used = {
        "baseline": {"client": 0.013, "server": 0.033},
        "wireguard": {"client": 0.278, "server": 0.26},
        "openvpn": {"client": 0.279, "server": 0.249},
    }
    c = choose_probe(["baseline", "wireguard", "openvpn"], used, q)
    assert c["profile"] == "openvpn" and c["scores"]["openvpn"]["node"] == "client"
    assert c["scores"]["openvpn"]["utilisation"] == pytest.approx(0.93)
    assert c["scores"]["baseline"]["utilisation"] == pytest.approx(0.11)  # 0.033 / 0.3
    assert c["reason"].startswith("openvpn: its node client used 93% of its quota (0.279 of 0.3")
    assert "closest to their CPU quota" in c["criterion"]
    # nearest the quota, not the most cores: server capped at 1 core using 0.5 (50 %) loses to
    # a client capped at 0.3 using 0.25 (83 %)
    q2 = {"client": 0.3, "server": 1.0}
    c = choose_probe(["a", "b"], {"a": {"server": 0.5}, "b": {"client": 0.25}}, q2)
    assert c["profile"] == "b"
    # a tie goes to the plan's order; a profile without samples scores nothing
    same = {"client": 0.15}
    assert choose_probe(["b", "a"], {"a": same, "b": same}, q)["profile"] == "b"
    c = choose_probe(["a", "b"], {"b": {"client": 0.01}}, q)
    assert c["profile"] == "b" and set(c["scores"]) == {"b"}
    # no samples at all: the first profile, and the reason says so
    c = choose_probe(["a", "b"], {}, q)
    assert c["profile"] == "a" and "no CPU samples" in c["reason"]


def test_parse_jobs():
    assert parse_jobs("auto") == "auto" and parse_jobs(" 3 ") == 3
    for bad in ("0", "-1", "two", "1.5", "257", ""):
        with pytest.raises(ConfigError, match="accepted: auto or a whole number from 1 to 256"):
            parse_jobs(bad)


def test_probe_overrides_cut_the_plan_to_the_probe_case():
    plan = make_plan()
    plan.overrides = ["topology.cpu=0.2"]
    plan.tests[0].params["duration_s"] = 5
    assert probe_overrides(plan, ["p2"]) == [
        "topology.cpu=0.2",
        "profiles=p2",
        "impairments=none",
        "tests=a",
        "reps=3",
        "duration=2",
    ]
    # the screen: every profile
    assert "profiles=p1,p2" in probe_overrides(plan, plan.profiles)
    plan.tests[0].params["duration_s"] = 1
    assert probe_overrides(plan, ["p1"])[-1] == "duration=1"


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

    from lab.core.errors import PreconditionError
    from lab.campaign.probe import probe_values

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


def test_screen_cores_per_profile_from_the_monitor_files(tmp_path):
    import json

    from lab.campaign.probe import screen_cores

    lines = [_line(0), {**_line(0), "case": "wireguard|none|tcp|0", "profile": "wireguard"}]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "monitor").mkdir()
    # baseline: client 10 % of a core for 2 s; wireguard: client 30 % for 1 s then 10 % for 1 s
    mon = {
        "baseline|none|tcp|0": [(1.0, 10.0), (2.0, 10.0)],
        "wireguard|none|tcp|0": [(1.0, 30.0), (2.0, 10.0)],
    }
    for i, (case, samples) in enumerate(mon.items()):
        data = {
            "case": case,
            "samples": [{"t": t, "nodes": {"client": {"total": c}}} for t, c in samples],
        }
        (tmp_path / "monitor" / f"{i}.json").write_text(json.dumps(data))
    cores = screen_cores(tmp_path)
    assert set(cores) == {"baseline", "wireguard"}
    assert cores["baseline"] == pytest.approx({"client": 0.1})
    assert cores["wireguard"] == pytest.approx({"client": 0.2})
