"""Each plan point is exactly its own spec (issue 13): no point inherits what an earlier point set.

Real labs and real pings: the RTT a point measures is what its own spec implies, whatever ran
before it, and every case records the spec read back from the engine (or qdisc) while it ran.
The queue limit the lab fills in for delay points is recomputed here from the documented rule
(docs/impairment.md "Queue limit"), not taken from the code under test.
"""

from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path

import pytest

from lab.impair import effective, runtime
from lab.campaign.shard import case_seed
from lab.model.impairment.directional import DirectionalImpairment, parse_directional
from lab.model.impairment.model import parse_spec
from lab.substrate.local.build import up
from lab.campaign.load import load_plan
from lab.core.state import read_jsonl
from lab.campaign.runner import Runner
from lab.campaign.setup import create_run_dir
from lab.core.teardown import teardown
from lab.model.topology import load_topology

from .conftest import REPO, TOPOS, lab_traces

PLANS = sorted((REPO / "plans").glob("*.toml"))


def doc_limit(delay_ms: float = 0, jitter_ms: float = 0, rate_bps: float = 1e9) -> int:
    """docs/impairment.md: twice the wire packets (1500 B) the delay line holds at the line rate,
    never below netem's default 1000."""
    pkts = math.ceil(rate_bps * (delay_ms + 4 * jitter_ms) / 1000 / 8 / 1500)
    return max(1000, 2 * pkts)


def expected_words(spec: str, seed: int | None = None) -> str:
    """The canonical words of `spec` with the documented default limit, independently of the
    runtime (parse_spec only canonicalises the words); with `seed`, the seed a plan run gives
    a spec that draws random numbers (jitter, loss, duplicate, corrupt, reorder: docs/scale.md)."""
    imp = parse_spec(spec)
    if imp.is_empty():
        return "none"
    draws = any(
        getattr(imp, f) is not None
        for f in ("jitter_us", "loss", "duplicate_pct", "corrupt_pct", "reorder_pct")
    )
    if seed is not None and draws and imp.seed is None:
        spec = f"{spec} seed {seed}"
    if imp.limit is None:
        lim = doc_limit((imp.delay_us or 0) / 1000, (imp.jitter_us or 0) / 1000)
        return str(parse_spec(f"{spec} limit {lim}"))
    return str(parse_spec(spec))


def _min_rtt(entry: dict) -> float:
    """The smallest RTT of a case's echoes: the path's fixed delay, which load only adds to. A
    configured delay is a floor under it (1 % for the clocks); how close it comes is
    bench/impair_accuracy.py's figure, never asserted here."""
    rec = entry["records"][0]
    rtts = [r["rtt_ms"] for r in rec.get("rtts") or [] if r.get("rtt_ms") is not None]
    assert rtts, entry
    return min(rtts)


def _run(tmp_path: Path, impairments: str, count: int = 10, interval: float = 0.05):
    plan_text = textwrap.dedent(f"""
        name = "points"
        profiles = ["baseline"]
        impairments = {impairments}
        reps = 1
        impaired_reps = 1
        placement = "egress"
        [topology]
        file = "topologies/pi_pair.py"
        cpu = 0.5
        [[tests]]
        test = "ping"
        count = {count}
        interval_s = {interval}
    """)
    path = tmp_path / "points.toml"
    path.write_text(plan_text)
    plan = load_plan(path)
    run = create_run_dir(plan, tmp_path / "run")
    counts = Runner(plan, run).execute()
    lines = read_jsonl(run.results)
    assert counts["failed"] == 0, [r.get("error") for r in lines if not r["ok"]]
    for lab_id in {e["lab_id"] for e in run.load_timeline() if e.get("lab_id")}:
        assert not lab_traces(lab_id), lab_traces(lab_id)
    return plan, {r["impairment"]["name"]: r for r in lines}, run


def _recorded(entry: dict) -> set[str]:
    """Every direction's spec as read back from the engine for this case."""
    applied = entry["impairment_applied"]["applied"]
    return {words for dirs in applied.values() for words in dirs.values()}


@pytest.mark.root
def test_delay_then_loss_then_none(tmp_path):
    """The loss point after `delay 400ms` runs with loss only: no echo of it waits 800 ms."""
    plan, by, run = _run(tmp_path, '["delay 400ms", "loss 1%", "none"]', count=6, interval=0.2)
    names = {p.name: p for p in plan.points}
    delay = next(n for n, p in names.items() if p.spec.startswith("delay"))
    loss = next(n for n, p in names.items() if p.spec.startswith("loss"))
    # delay 400ms both ways: no echo back in under 800 ms; the loss point and none inherit
    # nothing: echoes back in under half of that (a stated margin no healthy host misses)
    assert _min_rtt(by[delay]) >= 0.99 * 800, by[delay]["records"][0]
    assert _min_rtt(by[loss]) < 400 and _min_rtt(by["none"]) < 400, by[loss]["records"][0]
    assert _recorded(by[delay]) == {expected_words("delay 400ms")} == {"delay 400ms limit 66668"}
    # the loss point's draws are seeded from its first case's id (docs/scale.md); delay has none
    seed = case_seed(plan.digest(), by[loss]["case"])
    assert _recorded(by[loss]) == {f"loss 1% limit 1000 seed {seed}"}
    assert by["none"]["impairment_applied"]["applied"].startswith("none")
    assert "wire packets" in by[loss]["impairment_applied"]["wire_packets"]
    # the report shows what was in force, queue limit included
    from lab.results.report import generate

    generate(run.path)
    section = run.file("report.md").read_text().split("## Network conditions in force")[1]
    section = section.split("\n## ")[0]
    assert f"| {delay} | delay 400ms | delay 400ms limit 66668 |" in section
    assert f"| {loss} | loss 1% | loss 1% limit 1000 seed {seed} |" in section


@pytest.mark.root
def test_study_a_shaped_sweeps_do_not_leak(tmp_path):
    """Delay sweep, then a jitter sweep on its own base, then a loss sweep (study A's order)."""
    plan, by, _ = _run(
        tmp_path,
        textwrap.dedent("""[
            {sweep = "delay", from = 0, to = 20, step = 10},
            {sweep = "jitter", from = 0, to = 2, step = 1, base = "delay 30ms distribution normal"},
            {sweep = "loss", from = 0, to = 1, step = 0.5},
            "none",
        ]""").replace("\n", " "),
    )
    seen = 0
    for p in plan.points:
        if not p.impaired:
            continue
        entry = by[p.name]
        seed = case_seed(plan.digest(), entry["case"])  # one case per point: the first
        assert _recorded(entry) == {expected_words(p.spec, seed)}, (p.spec, _recorded(entry))
        rtt = _min_rtt(entry)
        own = p.impairment.a2b  # sweep points: the same both ways
        want = 2 * (own.delay_us or 0) / 1000
        if p.parameter == "loss":
            assert own.delay_us is None and own.jitter_us is None, p.spec
            # an inherited delay would add >= 20 ms (the smallest delay point, both ways)
            assert rtt < 0.99 * 20, (p.spec, rtt)
        elif p.parameter == "delay":
            # the floor the point's delay puts under every echo; what is in force exactly is
            # the read-back above
            assert rtt >= 0.99 * want, (p.spec, rtt)
        seen += 1
    assert seen == 2 + 3 + 2  # delay 10, 20; jitter 0..2 on its base; loss 0.5, 1


@pytest.mark.root
def test_set_point_replaces_and_topology_impairment_is_the_base(lab_id):
    """set_point on one lab: delay -> loss -> none, measured; and a link's own `impair=` stays
    under every point while `lab impair set` keeps its merge rule at a shell. The boards' NIC
    latency (applied where the engine is on the path anyway) is off: the points alone."""
    spec = load_topology(TOPOS / "pi_pair_middlebox.py", None, {"nic_latency": "off"})
    lab = up(spec, lab_id, impair="none")
    try:
        c = lab.node("client")

        def rtt(n=5):
            out = c.run(["ping", "-c", str(n), "-i", "0.05", "-W", "2", "10.0.2.2"]).stdout
            return float(re.search(r"= ([\d.]+)/", out).group(1))  # the minimum: load only adds

        assert rtt() < 50
        shown = runtime.set_point(lab, parse_directional("delay 50ms"))
        # delay 50ms both ways: no echo back in under 100 ms (1 % for the clocks)
        assert shown["in_force"] and rtt() >= 0.99 * 100
        shown = runtime.set_point(lab, parse_directional("loss 1%"))
        # replaced, not merged: the delay is gone (echoes back in under half of its 100 ms)
        assert shown["in_force"] and rtt() < 50
        assert set(shown["expected"].values()) == {"loss 1% limit 1000"}
        shown = runtime.set_point(lab, DirectionalImpairment())
        assert set(shown["expected"].values()) == {"none"}
        # the shell's rule: setting one parameter keeps the others
        runtime.set_impairment(lab, "delay 20ms")
        shown = runtime.set_impairment(lab, "loss 1%")
        assert set(shown["requested"].values()) == {"delay 20ms loss 1%"}
    finally:
        teardown(lab_id)
    assert lab_traces(lab_id) == []


def test_engine_refuses_nothing_it_reports(monkeypatch):
    """in_force compares what was sent with the read-back, key by key: a mismatch is caught."""
    sent = {"imp1:a2b": parse_spec("delay 10ms"), "imp1:b2a": parse_spec("delay 10ms")}
    good = {"imp1:a2b": parse_spec("delay 10ms"), "imp1:b2a": parse_spec("delay 10ms")}
    assert runtime.in_force("userspace", good, sent)
    stale = {"imp1:a2b": parse_spec("delay 10ms loss 1%"), "imp1:b2a": parse_spec("delay 10ms")}
    assert not runtime.in_force("userspace", stale, sent)
    assert not runtime.in_force("userspace", {"imp1:a2b": good["imp1:a2b"]}, sent)  # no answer
    assert not runtime.in_force("kernel-netem", {"r:eth0": None}, {"r:eth0": sent["imp1:a2b"]})
    assert runtime.in_force("kernel-netem", {}, {"r:eth0": parse_spec("none")})
    netem = {"r:eth0": parse_spec("delay 10ms limit 1000")}  # tc reports its default limit
    assert runtime.in_force("kernel-netem", netem, {"r:eth0": sent["imp1:a2b"]})


def test_queue_limit_default_and_warning():
    imp = parse_spec("delay 400ms")
    assert effective.with_queue_limit(imp, 10**9).limit == doc_limit(400)
    assert effective.with_queue_limit(parse_spec("loss 1%"), 10**9).limit == 1000
    slow = effective.with_queue_limit(imp, 10 * 10**6).limit  # a 10 Mbit/s link needs less
    assert slow == doc_limit(400, rate_bps=10e6) == 1000
    assert effective.with_queue_limit(parse_spec("delay 400ms limit 50"), 10**9).limit == 50
    w = effective.limit_warning(parse_spec("delay 400ms limit 1000"), 10**9)
    assert w and "caps throughput at about 30 Mbit/s" in w
    assert effective.limit_warning(parse_spec("delay 1ms limit 1000"), 10**9) is None


@pytest.mark.parametrize("plan_path", PLANS, ids=[p.stem for p in PLANS])
def test_no_plan_point_sets_what_its_own_spec_does_not(plan_path):
    """Expand every shipped plan and walk its points in run order, as the runner does: each
    point's effective spec has exactly the parameters of its own spec (plus the documented
    default queue limit), never one an earlier point set."""
    plan = load_plan(plan_path)
    for _, pts in plan.groups():
        for p in pts:
            own = parse_directional(p.spec)  # the recorded text says what the object holds
            assert own == p.impairment, (plan_path.name, p.name, p.spec)
            eff = effective.effective_point(p.impairment, 10**9)
            for d in ("a2b", "b2a"):
                o, e = own.direction(d).to_json(), eff.direction(d).to_json()
                extra = set(e) - set(o)
                assert extra <= {"limit"}, (plan_path.name, p.name, d, p.spec, e)
                if "limit" in extra:
                    od = own.direction(d)
                    lim = doc_limit((od.delay_us or 0) / 1000, (od.jitter_us or 0) / 1000)
                    assert e["limit"] == lim, (p.spec, d, e)
                assert {k: e[k] for k in o} == o, (p.spec, d, e)
