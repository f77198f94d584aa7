"""A handshake entry with only its rekey part (cold = false, rekey = true) measures no
handshake_ms: `lab compare`, `lab check` and the progress line judge and show it by the metric
the report's rekey table headlines (doc.entry_primary: rekey_recovery_s), as the report does."""

from __future__ import annotations

import json

from lab.campaign.check import judge_run
from lab.cli.progress import case_line
from lab.results.compare import compare
from lab.results.doc import entry_primary
from lab.results.expect import parse_expectations
from lab.results.rundir import RunDir

REKEY_ONLY = {"cold": False, "rekey": True, "timeout_s": 30.0, "duration_s": 20.0}
COLD = {"cold": True, "rekey": False, "timeout_s": 30.0}
PLAN = {
    "name": "rekeys",
    "profiles": ["wireguard", "ipsec"],
    "impairments": [{"name": "none", "spec": ""}],
    "tests": [
        {"label": "rekey", "test": "handshake", "params": REKEY_ONLY},
        {"label": "cold", "test": "handshake", "params": COLD},
    ],
}
#: each profile's rekey recovery (s): the same order in both runs, B slower
RECOVERY = {"a": {"wireguard": 1.0, "ipsec": 3.0}, "b": {"wireguard": 2.0, "ipsec": 5.0}}


def _entry(profile: str, label: str, rep: int, recovery: float) -> dict:
    entry = next(t for t in PLAN["tests"] if t["label"] == label)
    if label == "rekey":
        rec = {"rekey_recovery_s": recovery + 0.1 * rep, "rekey_keys_s": 0.5,
               "rekey_dip_pct": 40.0, "rekey_status": "recovered"}  # fmt: skip
    else:
        rec = {"handshake_ms": 30.0 + rep, "handshake_status": "established"}
    return {"case": f"{profile}|none|{label}|{rep}", "profile": profile, "test": "handshake",
            "label": label, "params": entry["params"], "rep": rep, "ok": True,
            "impairment": {"name": "none", "spec": ""},
            "records": [{"test": "handshake", "ok": True, **rec}]}  # fmt: skip


def _run(path, side: str) -> RunDir:
    path.mkdir(parents=True)
    (path / "plan.json").write_text(json.dumps(PLAN))
    (path / "manifest.json").write_text(json.dumps({}))
    lines = [
        _entry(p, label, rep, RECOVERY[side][p])
        for p in PLAN["profiles"]
        for label in ("rekey", "cold")
        for rep in range(3)
    ]
    (path / "results.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    return RunDir(path)


def test_the_report_headlines_a_rekey_only_entry_by_its_rekey_recovery():
    assert entry_primary(PLAN["tests"][0]).column == "rekey_recovery_s"
    assert entry_primary(PLAN["tests"][1]).column == "handshake_ms"


def test_compare_shows_the_rekey_only_entry_by_its_rekey_recovery(tmp_path):
    a, b = _run(tmp_path / "a", "a"), _run(tmp_path / "b", "b")
    out = compare(a.path, b.path, tmp_path / "out")
    md = (tmp_path / "out" / "compare.md").read_text()
    main = md.split("## Main metric per case")[1].split("\n## ")[0]
    rekey = [ln for ln in main.splitlines() if "| rekey |" in ln]
    cold = [ln for ln in main.splitlines() if "| cold |" in ln]
    assert len(rekey) == 2 and len(cold) == 2, main
    # wireguard: A 1.0/1.1/1.2 s, B 2.0/2.1/2.2 s; shown in s, the ratio of the means
    [wg] = [ln for ln in rekey if "| wireguard |" in ln]
    assert "| rekey recovery | s | 1.10 ± 0.10 (n=3) | 2.10 ± 0.10 (n=3) | 1.909 |" in wg, wg
    assert all("| handshake time | ms |" in ln for ln in cold), cold
    assert out["rows"] > 4
    # the fidelity section's main metrics and the ranking of a time: lower is better
    fid = md.split("## Fidelity")[1]
    assert "| rekey | none | 0 | rekey_recovery_s | wireguard > ipsec | wireguard > ipsec |" in fid
    assert any("| rekey |" in ln and "rekey_recovery_s (s)" in ln for ln in fid.splitlines())


def _verdicts(run: RunDir, baseline: RunDir) -> dict:
    raw = [{"name": "no-slower", "regression": "20%", "test": "rekey"}]
    exp = parse_expectations(raw, source="t.toml", profiles=PLAN["profiles"], points=["none"],
                             tests={"rekey": "handshake", "cold": "handshake"})  # fmt: skip
    res = judge_run(run.path, exp, [baseline])
    return {v.profile: v for v in res.verdicts if v.kind == "regression"}


def test_check_judges_a_rekey_only_entry_by_its_rekey_recovery(tmp_path):
    a, b = _run(tmp_path / "a", "a"), _run(tmp_path / "b", "b")
    slower = _verdicts(b, a)  # B's recovery takes about twice as long: a regression
    assert slower["wireguard"].status == "fail", slower["wireguard"].message
    assert "rekey_recovery_s = 2.1 s" in slower["wireguard"].message
    assert "rekey_recovery_s <= 120% of the baseline's mean" in slower["wireguard"].bound
    faster = _verdicts(a, b)  # A against B: faster, fine
    assert {v.status for v in faster.values()} == {"pass"}, [v.message for v in faster.values()]


def test_the_progress_line_shows_a_rekey_only_case_by_its_rekey_recovery():
    line = case_line("wireguard|none|rekey|0", _entry("wireguard", "rekey", 0, 1.5),
                     done=1, total=12, eta_s=None)  # fmt: skip
    assert line.endswith("[1/12] wireguard|none|rekey|0 ok 1.50 s"), line
    cold = case_line("wireguard|none|cold|0", _entry("wireguard", "cold", 0, 0.0),
                     done=2, total=12, eta_s=None)  # fmt: skip
    assert cold.endswith("[2/12] wireguard|none|cold|0 ok 30.0 ms"), cold


def test_one_rule_says_which_way_a_column_is_better():
    from lab.results.doc import lower_is_better

    for col in ("rekey_recovery_s", "rekey_keys_s", "handshake_ms", "loss_pct", "retransmits",
                "rtt_avg_ms", "latency_p99_us", "key_exchange_bytes", "seconds"):  # fmt: skip
        assert lower_is_better(col), col
    for col in ("throughput_bps", "packets_per_s", "transactions_per_s", "received_pps",
                "responsiveness_rpm", "rrul_total_bps"):  # fmt: skip
        assert not lower_is_better(col), col
