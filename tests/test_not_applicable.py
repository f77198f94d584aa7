"""A test that needs IPv6 on an IPv4-only tunnel (an imported IPv4-only wg-quick file) says it
does not apply (issue 32): a results row with the reason, neither a failure nor a gap, and the
report's "n/a". Synthetic runs without root; one real run of such a profile as root."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from lab.campaign.load import load_plan
from lab.campaign.runner import Runner
from lab.campaign.setup import create_run_dir
from lab.core.state import read_jsonl
from lab.measure import TESTS
from lab.results.report import generate
from lab.results.rundir import RunDir, write_tables

from .conftest import lab_traces
from .test_byoc import ipv4_pair, need

WHY = "no IPv6 traffic address: the tunnel carries IPv4 only"


def _run(path: Path) -> RunDir:
    """wireguard (both families) and an IPv4-only profile, each with mtu over IPv4 and IPv6 and
    a ping entry with ip = 6, as the runner leaves them."""
    path.mkdir(parents=True)
    plan = {
        "name": "v4only",
        "profiles": ["wireguard", "team/wg.toml"],
        "impairments": [{"name": "none", "spec": "", "group": "none", "parameter": None,
                         "value": None}],
        "tests": [{"label": "mtu", "test": "mtu"}, {"label": "ping6", "test": "ping", "ip": 6}],
        "reps": 1, "impaired_reps": 1,
        "topology": {"file": "topologies/pi_pair.py", "params": {}},
    }  # fmt: skip
    (path / "plan.json").write_text(json.dumps(plan))
    (path / "manifest.json").write_text(json.dumps({"profiles": {}, "cpu": {}}))
    run = RunDir(path)
    run.event({"t": 1.0, "session": "s", "event": "session-start"})
    mtu, ping = TESTS["mtu"], TESTS["ping"]
    for prof in plan["profiles"]:
        v4 = mtu.record(family=4, target="10.99.0.2", path_mtu=1420, iface_mtu=1420)
        if prof == "wireguard":
            mtu_recs = [v4, mtu.record(family=6, target="fd99::2", path_mtu=1420, iface_mtu=1420)]
            ping_recs = [ping.record(family=6, rtt_avg_ms=0.5, loss_pct=0.0)]
        else:
            mtu_recs = [v4, mtu.not_applicable(WHY, family=6)]
            ping_recs = [ping.not_applicable("ip = 6: the lab has no IPv6 traffic address")]
        for label, test, ip, recs in (("mtu", "mtu", 4, mtu_recs), ("ping6", "ping", 6, ping_recs)):
            run.add_result({
                "case": f"{prof}|none|{label}|0", "session": "s", "profile": prof,
                "vpn": {"driver": "wireguard", "path": "wireguard-go"},
                "impairment": plan["impairments"][0], "test": test, "label": label, "ip": ip,
                "rep": 0, "ok": True, "error": None, "started_utc": "2025-01-01T00:00:00Z",
                "seconds": 1.0, "ended_t": 2.0, "records": recs, "monitor": {},
            })  # fmt: skip
    run.event({"t": 3.0, "session": "s", "event": "session-end"})
    return run


def test_results_csv_row_says_why_and_counts_as_neither_failed_nor_measured(tmp_path):
    run = _run(tmp_path / "run")
    write_tables(run)
    df = pd.read_csv(run.file("results.csv"), keep_default_na=False)
    mine = df[(df.profile == "team/wg.toml") & (df.test == "mtu")]
    assert list(mine.ip) == [4, 6]  # the family each row probed, not the case's
    assert list(mine.not_applicable) == ["", WHY]
    assert list(mine.ok) == [True, True] and list(mine.error) == ["", ""]
    assert list(mine.path_mtu) == ["1420.0", ""]  # read as text: keep_default_na=False
    summ = pd.read_csv(run.file("summary.csv"))
    na = summ[(summ.profile == "team/wg.toml") & (summ.test == "mtu") & (summ.point == 1)]
    assert set(na.metric) == {"case_seconds"}  # nothing measured: no statistic of a metric
    assert (summ.failed == 0).all()


def test_report_shows_not_applicable_with_its_reason(tmp_path):
    run = _run(tmp_path / "run")
    out = generate(run.path)
    md = run.file("report.md").read_text()
    assert out["failed"] == 0 and "## Failed cases" not in md
    # the mtu table per family: IPv6 of the IPv4-only profile is n/a, wireguard's measured
    assert "**mtu** (mtu (IPv4))" in md and "**mtu** (mtu (IPv6))" in md
    v6 = md.split("**mtu** (mtu (IPv6))")[1].split("**ping6**")[0]
    assert "| team/wg.toml | n/a |" in v6 and "| wireguard | 1420 (n=1) |" in v6
    assert f"n/a (team/wg.toml): not applicable, {WHY}." in v6
    ping6 = md.split("**ping6**")[1].split("\n\n**")[0]
    assert "| team/wg.toml | none | n/a | n/a |" in ping6
    assert "n/a (team/wg.toml): not applicable, ip = 6: the lab has no IPv6" in ping6


PLAN = """
name = "v4only"
profiles = ["{profile}"]
impairments = ["none"]
reps = 1
[topology]
file = "topologies/pi_pair.py"
cpu = "host"
[[tests]]
test = "mtu"
ipv6 = true
attempts = 1
[[tests]]
test = "ping"
name = "ping6"
ip = 6
count = 2
interval_s = 0.2
"""


@pytest.mark.root
def test_ipv4_only_wg_quick_profile_runs_with_ipv6_tests_not_applicable(tmp_path):
    """A real run of an imported IPv4-only wg-quick pair: the IPv4 path MTU is measured through
    the tunnel, the IPv6 row and the ip = 6 ping say they do not apply, nothing fails."""
    need("wireguard")
    profile = ipv4_pair(tmp_path)
    path = tmp_path / "v4only.toml"
    path.write_text(PLAN.format(profile=profile))
    plan = load_plan(path)
    run = create_run_dir(plan, tmp_path / "run")
    counts = Runner(plan, run).execute()
    assert counts == {"ok": 2, "failed": 0, "skipped": 0}
    lines = {r["label"]: r for r in read_jsonl(run.results)}
    v4, v6 = lines["mtu"]["records"]
    assert v4["target"] == "172.30.9.1" and v4["path_mtu"] > 0 and v4["ok"]
    assert v6["family"] == 6 and "no IPv6 traffic address" in v6["not_applicable"]
    assert [r["not_applicable"] for r in lines["ping6"]["records"]] == [
        f"ip = 6: the lab has no IPv6 traffic address (profile {profile} or the topology "
        "carries no IPv6)"
    ]
    generate(run.path)
    assert "| n/a |" in run.file("report.md").read_text()
    for lab_id in {e["lab_id"] for e in run.load_timeline() if e.get("lab_id")}:
        assert not lab_traces(lab_id), lab_traces(lab_id)
