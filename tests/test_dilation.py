"""Time dilation (lab.model.dilation, issue 16): the arithmetic by hand, bad factors refused, and one
real dilated lab whose kernel quotas and shaper are 1/D of the undilated lab's and whose
impairment delays a real ping D times as long.

docs/cpu.md "Time dilation" states the decision; bench/dilation.py compares dilated and
undilated runs (figures move with the host's load, so they are not asserted here).
"""

from __future__ import annotations

import json
import math
from typing import ClassVar

import pytest

from lab.substrate.local import cpuplan
from lab.model import dilation
from lab.core.errors import ConfigError, PreconditionError
from lab.model.impairment.model import parse_spec
from lab.measure import TESTS
from lab.measure.base import Metric, Test, invoke
from lab.model.params import Param
from lab.campaign.load import load_plan
from lab.model.topology import load_topology

from .conftest import REPO, kernel_quota_cores

PI_PAIR = REPO / "topologies" / "pi_pair.py"


# ------------------------------------------------------------------ the factor


@pytest.mark.parametrize(
    "given, want",
    [
        (1, 1.0),
        (2, 2.0),
        (2.5, 2.5),
        ("3", 3.0),
        (" 1.5 ", 1.5),
        ("auto", "auto"),
        ("AUTO", "auto"),
    ],
)
def test_factor_accepted(given, want):
    assert dilation.parse_dilation(given, source="f.toml") == want


@pytest.mark.parametrize("bad", [0.5, 0, -2, "fast", True, None, float("nan"), 65, "", [2]])
def test_factor_refused_naming_field_and_accepted_values(bad):
    with pytest.raises(ConfigError) as e:
        dilation.parse_dilation(bad, source="plan.toml", field="topology.dilation")
    msg = str(e.value)
    assert "plan.toml" in msg and "topology.dilation" in msg
    assert '"auto"' in msg and "from 1 to 64" in msg


def test_auto_factor_smallest_half_step_that_fits():
    assert dilation.auto_factor(1.8, 1.8) == 1.0  # fits: no dilation
    assert dilation.auto_factor(1.83, 1.8) == 1.5  # 1.017 -> 1.5
    assert dilation.auto_factor(3.6, 1.8) == 2.0  # exactly 2
    assert dilation.auto_factor(3.7, 1.8) == 2.5  # 2.06 -> 2.5


def test_topology_param_is_the_labs_not_the_topologys():
    """pi_pair's build() takes no `dilation`: it would fail if the parameter reached it."""
    spec = load_topology(PI_PAIR, None, {"dilation": 2, "bw": 500})
    assert spec.dilation == 2.0 and "dilation" not in spec.params
    assert load_topology(PI_PAIR).dilation == 1.0
    with pytest.raises(ConfigError, match="dilation.*accepted"):
        load_topology(PI_PAIR, None, {"dilation": 0.9})


def test_plan_topology_dilation_and_override(tmp_path):
    plan = load_plan("quick", ["-o", "topology.dilation=2"][1:])
    assert plan.topology_params["dilation"] == 2.0
    assert load_plan("quick", ["topology.dilation=auto"]).topology_params["dilation"] == "auto"
    text = (REPO / "plans" / "quick.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace("[topology]", '[topology]\ndilation = "slow"', 1))
    with pytest.raises(ConfigError) as e:
        load_plan(bad)
    assert "topology.dilation" in str(e.value) and "auto" in str(e.value)


# ------------------------------------------------------------------ CPU quotas


def _node(share=0.25, cores=4):
    return {
        "profile": "b",
        "cores": cores * share,
        "board_cores": cores,
        "core_share": share,
        "slots": cores,
        "env": {},
    }


def test_auto_gives_every_node_all_its_cores_at_board_speed():
    # two 4-core boards at 0.25 host cores per board core: 2.0 host cores wanted, 1.8 room
    plan = {"a": _node(), "b": _node(), "r": {"profile": None, "cores": None, "env": {}}}
    d = cpuplan.dilate(plan, "auto", host_cores=2)
    assert d == 1.5  # 2.0 / 1.8 = 1.11 -> 1.5
    assert cpuplan.scale_to_host(plan, 2) == []
    for n in ("a", "b"):
        p = plan[n]
        assert p["cores"] == pytest.approx(1.0 / 1.5)
        assert p["cores_undilated"] == pytest.approx(1.0)
        assert p["slot_cores"] == pytest.approx(0.25 / 1.5, abs=1e-6)
        assert (p["scale"], p["board_cores_emulated"], p["single_thread_vs_board"]) == (1, 4, 1)
        assert p["dilation"] == 1.5
        # the period follows from it when the lab is built (lab._build): 10 ms x 1.5
        assert dilation.cfs_period_us(p["dilation"], min_share=p["slot_cores"]) == 15_000
    assert plan["r"]["cores"] is None and "dilation" not in plan["r"]


def test_cfs_period_stretched_up_to_the_kernels_limit():
    assert dilation.cfs_period_us(1.0) == 10_000
    assert dilation.cfs_period_us(2.0) == 20_000
    assert dilation.cfs_period_us(2.5) == 25_000
    assert dilation.cfs_period_us(200.0) == 1_000_000  # the kernel's maximum


def test_cfs_period_long_enough_for_the_smallest_quota():
    # one Pi core's 0.229 host cores: 2.29 ms of every 10 ms, above the 2 ms floor
    assert dilation.cfs_period_us(1.0, min_share=0.229) == 10_000
    # a 0.05-core group would get 0.5 ms of 10 ms (the kernel's minimum is 1 ms): 40 ms
    assert dilation.cfs_period_us(1.0, min_share=0.05) == 40_000
    # dilated x2 with 0.1-core groups: 20 ms either way
    assert dilation.cfs_period_us(2.0, min_share=0.1) == 20_000
    assert dilation.cfs_period_us(1.0, min_share=0.0001) == 1_000_000


def test_undilated_shortfall_warns_naming_the_factor_that_fits():
    plan = {"a": _node(), "b": _node()}
    assert cpuplan.dilate(plan, 1.0, host_cores=2) == 1.0
    (w,) = cpuplan.scale_to_host(plan, 2)
    assert "scaled to 90% of their boards' cores" in w
    assert "-p dilation=1.5" in w and "dilation = 1.5" in w and "dilation=auto" in w
    assert plan["a"]["board_cores_emulated"] == pytest.approx(3.6)


def test_explicit_factor_divides_profile_and_fixed_quotas():
    plan = {"a": _node(), "f": {"profile": None, "cores": 0.5, "env": {}}}
    assert cpuplan.dilate(plan, 2.0, host_cores=2) == 2.0
    cpuplan.scale_to_host(plan, 2)
    assert plan["a"]["cores"] == pytest.approx(0.5)
    assert plan["a"]["slot_cores"] == pytest.approx(0.125)
    assert plan["a"]["board_cores_emulated"] == pytest.approx(4.0)
    assert plan["f"]["cores"] == pytest.approx(0.25)


def test_refusal_names_the_factor_that_would_fit():
    plan = {n: _node(share=1.0) for n in "abc"}  # 12 host cores asked on 2
    cpuplan.dilate(plan, 1.0, host_cores=2)
    with pytest.raises(PreconditionError, match=r"dilation=7\b"):  # 12 / 1.8 = 6.67 -> 7
        cpuplan.scale_to_host(plan, 2)


# ------------------------------------------------------------------ impairment


def test_impairment_delays_times_rates_divided_probabilities_kept():
    imp = parse_spec(
        "delay 40ms 5ms 25% distribution normal loss 0.5% 10% duplicate 1% corrupt 0.1% "
        "reorder 25% 50% gap 5 rate 100mbit 14 limit 1000 seed 7"
    )
    got = dilation.impairment(imp, 2.0)
    want = parse_spec(
        "delay 80ms 10ms 25% distribution normal loss 0.5% 10% duplicate 1% corrupt 0.1% "
        "reorder 25% 50% gap 5 rate 50mbit 14 limit 1000 seed 7"
    )
    assert got == want
    ge = parse_spec("delay 10ms loss gemodel 1% 25% 70% 0.1%")
    assert dilation.impairment(ge, 3.0).loss == ge.loss
    assert dilation.impairment(ge, 3.0).delay_us == 30_000
    assert dilation.impairment(imp, 1.0) is imp


def test_shaper_rate_divided_queue_time_multiplied_bucket_kept(monkeypatch):
    from lab.core import netops, proc

    seen = []
    monkeypatch.setattr(proc, "run", lambda argv, **kw: seen.append(argv))
    netops.set_tbf("ns", "eth0", 1000, dilation=2.0)
    netops.set_tbf("ns", "eth0", 1000, limit_pkts=100, dilation=2.0)
    a, b = seen
    assert a[a.index("rate") + 1] == "500000000bit" and a[a.index("latency") + 1] == "100ms"
    # the bucket holds the undilated link's 4 ms of traffic: 1000 Mbit/s / 8 / 250 = 500000 B,
    # not 250000 (an amount of data does not dilate)
    assert a[a.index("burst") + 1] == "500000"
    assert b[b.index("rate") + 1] == "500000000bit" and b[b.index("limit") + 1] == "151400"


# ------------------------------------------------------------------ test parameters


def _valid(test, params):
    return TESTS[test].validate(params, source="t")


def test_test_parameters_slowed_down():
    tcp = _valid("tcp", {"duration_s": 10, "omit_s": 1, "streams": 2, "adaptive": True})
    got = dilation.dilate_params(tcp, 2.0)
    assert (got["duration_s"], got["omit_s"], got["streams"], got["port"]) == (20, 2, 2, 5201)
    assert got["adaptive_min_s"] == 2 * tcp["adaptive_min_s"]
    assert got["adaptive_rel_pct"] == tcp["adaptive_rel_pct"] and got["adaptive"] is True
    udp = dilation.dilate_params(_valid("udp", {"rate_mbit": 400, "duration_s": 5}), 2.0)
    assert (udp["rate_mbit"], udp["duration_s"], udp["size"]) == (200, 10, 1300)
    ping = dilation.dilate_params(_valid("ping", {"count": 50, "interval_s": 0.2}), 2.0)
    assert (ping["count"], ping["interval_s"], ping["reply_timeout_s"]) == (50, 0.4, 4.0)
    rr = dilation.dilate_params(_valid("rr", {"proto": "udp", "udp_timeout_ms": 100}), 4.0)
    assert (rr["udp_timeout_ms"], rr["duration_s"], rr["request"]) == (400, 40, 1)
    sweep = dilation.dilate_params(_valid("udp-sweep", {"rates_mbit": [100, 300]}), 2.0)
    assert sweep["rates_mbit"] == [50, 150] and sweep["start_mbit"] == 12.5
    scp = dilation.dilate_params(_valid("scp", {"size_mb": 64}), 2.0)
    assert scp["size_mb"] == 64
    wrapped = _valid("contention", {"test": "udp", "params": {"rate_mbit": 10}})
    assert dilation.dilate_params(wrapped, 2.0)["params"]["rate_mbit"] == 5


# ------------------------------------------------------------------ results scaled back


def test_results_scaled_back_raw_kept():
    rec = {
        "test": "udp",
        "ok": True,
        "receiver_bps": 200e6,
        "sender_bps": 201e6,
        "rate_mbit": 200.0,
        "size": 1300,
        "target_pps": 19230.8,
        "jitter_ms": 0.4,
        "loss_pct": 1.5,
        "packets_sent": 1000,
        "packets_lost": 15,
        "measured_s": 20.0,
        "stop_reason": "stable",
    }
    got = dilation.scale_back(rec, TESTS["udp"].metrics, 2.0)
    assert got["receiver_bps"] == 400e6 and got["sender_bps"] == 402e6
    assert got["rate_mbit"] == 400 and got["target_pps"] == pytest.approx(38461.6)
    assert got["jitter_ms"] == 0.2 and got["measured_s"] == 10
    for same in ("loss_pct", "packets_sent", "packets_lost", "size", "stop_reason", "ok"):
        assert got[same] == rec[same], same
    assert got["dilated"]["receiver_bps"] == 200e6 and got["dilated"]["jitter_ms"] == 0.4
    assert "loss_pct" not in got["dilated"] and got["dilation"] == 2.0
    assert rec["receiver_bps"] == 200e6  # the raw record itself is not changed
    ping = dilation.scale_back({"rtt_avg_ms": 80.0, "loss_pct": 0.0}, TESTS["ping"].metrics, 2)
    assert ping["rtt_avg_ms"] == 40.0 and ping["loss_pct"] == 0.0
    rr = dilation.scale_back(
        {"transactions_per_s": 500.0, "latency_p50_us": 900.0}, TESTS["rr"].metrics, 3.0
    )
    assert rr["transactions_per_s"] == 1500 and rr["latency_p50_us"] == 300
    assert dilation.scale_back(rec, TESTS["udp"].metrics, 1.0) is rec


def test_report_header_line_for_a_dilated_run():
    assert dilation.report_line(2.0, 2).startswith("time-dilated x2: ")
    assert "x1.5" in dilation.report_line(1.5)


# ------------------------------------------------------------------ a real dilated lab


PROFILE = """name = "tboard"
cores = 2
emulated_cores = 2
core_share = 0.2
[env]
OPENSSL_ia32cap = "~0x200000000000000"
[reference.aes-128-gcm]
mbps = 50
source = "test"
"""


@pytest.mark.root
def test_dilated_lab_quotas_shaper_and_delay(tmp_path, monkeypatch, lab_id):
    """Undilated and x2 labs of the same 2-core profile (both fit this machine): the kernel's
    node and core-group quotas and the link's tbf rate of the dilated lab are half the
    undilated one's, and a 20 ms impairment delays a real ping by 2 x 20 ms each way, which
    scales back to at least 40 ms (a delay is a floor whatever the host's load)."""
    from lab.substrate.local.build import up
    from lab.measure import Context
    from lab.core.teardown import teardown

    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "tboard.toml").write_text(PROFILE)
    monkeypatch.setenv("LAB_CPU_PROFILES", str(tmp_path / "p"))
    monkeypatch.setenv("LAB_CALIBRATION_DIR", str(tmp_path / "cal"))

    def quotas(lab):
        rel = lab.runtime["client"].cgroup
        cores = [kernel_quota_cores(lab.cg, f"{rel}/core{i}") for i in range(2)]
        return kernel_quota_cores(lab.cg, rel), cores

    def tbf_bps(lab):
        out = lab.node("client").run(["tc", "-j", "qdisc", "show", "dev", "client-eth0"]).stdout
        (q,) = [q for q in json.loads(out) if q["kind"] == "tbf"]
        return q["options"]["rate"]

    plain_id = lab_id[:-1] + ("a" if lab_id[-1] != "a" else "b")
    try:
        plain = up(load_topology(PI_PAIR, None, {"cpu": "tboard", "bw": 400}), plain_id)
        node0, cores0 = quotas(plain)
        bps0 = tbf_bps(plain)
    finally:
        assert teardown(plain_id) == []
    assert node0 == pytest.approx(0.4, abs=1e-4) and cores0 == pytest.approx([0.2, 0.2], abs=1e-4)
    spec = load_topology(PI_PAIR, None, {"cpu": "tboard", "bw": 400, "dilation": 2})
    lab = up(spec, lab_id, impair="delay 20ms")
    node2, cores2 = quotas(lab)
    assert node2 == pytest.approx(node0 / 2, abs=1e-4)
    assert cores2 == pytest.approx([c / 2 for c in cores0], abs=1e-4)
    assert tbf_bps(lab) == pytest.approx(bps0 / 2, rel=0.01)
    assert lab.info["nodes"]["client"]["cpu"]["dilation"] == 2.0
    if lab.cg.version == 1:  # the quota is handed out over a period stretched x2 as well
        d = lab.cg.root / "cpu" / lab.runtime["client"].cgroup
        for g in (d, d / "core0"):
            assert (g / "cpu.cfs_period_us").read_text().strip() == "20000"
        assert lab.info["nodes"]["client"]["cpu"]["period_us"] == 20_000
    assert lab.spec.dilation == 2.0
    ping = TESTS["ping"]
    ctx = Context(lab.node("client"), lab.node("server"), "10.0.1.2", tmp_path / "raw")
    params = dilation.dilate_params(ping.validate({"count": 3, "interval_s": 0.2}, source="t"), 2)
    (raw,) = ping.run(ctx, params)
    assert raw["ok"], raw
    # each direction's netem/engine point holds a packet 40 ms in the dilated lab
    assert raw["rtt_min_ms"] >= 80.0
    back = dilation.scale_back(raw, ping.metrics, 2.0)
    assert back["rtt_min_ms"] >= 40.0 and back["dilated"]["rtt_min_ms"] == raw["rtt_min_ms"]
    assert math.isclose(back["rtt_min_ms"] * 2, raw["rtt_min_ms"])
    from lab.impair.runtime import show_impairment

    shown = show_impairment(lab)
    assert shown["dilation"] == 2.0 and "real time" in shown["note"]


class SpyTest(Test):
    """Records the parameters the runner hands it and moves a real ping's worth of packets."""

    name = "spy"
    schema: ClassVar[dict[str, Param]] = {
        "duration_s": Param(float, 1.0),
        "rate_mbit": Param(float, 10.0),
        "count": Param(int, 3),
    }
    metrics = (Metric("rate_bps", unit="bit/s"), Metric("wait_ms", unit="ms"))

    def __init__(self):
        self.seen = []

    def run(self, ctx, params):
        self.seen.append(dict(params))
        inv = invoke(ctx, ctx.client, ["ping", "-c", "1", "-W", "2", ctx.server_addr],
                     label="spy", timeout=10)  # fmt: skip
        return [self.record(ok=inv.returncode == 0, rate_bps=1e6, wait_ms=50.0)]


@pytest.mark.root
def test_lab_run_dilated_end_to_end(tmp_path, monkeypatch):
    """`lab run` of a plan with `dilation = 2`: the test gets its times x 2 and rates / 2, its
    figures come back x 2 / / 2 with the raw ones kept, a real ping through `delay 10ms` takes
    2 x 10 x 2 ms or more in the lab and scales back to 20 ms or more, and the manifest and the
    report say x2."""
    from lab import measure
    from lab.results.report import generate
    from lab.core.state import read_jsonl
    from lab.campaign.runner import Runner
    from lab.campaign.setup import create_run_dir

    spy = SpyTest()
    monkeypatch.setitem(measure.TESTS, "spy", spy)
    path = tmp_path / "p.toml"
    path.write_text(
        'name = "dil"\nprofiles = ["baseline"]\nimpairments = ["delay 10ms"]\nreps = 1\n'
        '[topology]\nfile = "topologies/pi_pair.py"\ncpu = 0.5\ndilation = 2\n'
        '[[tests]]\ntest = "spy"\nduration_s = 1.5\nrate_mbit = 40\n'
        '[[tests]]\ntest = "ping"\ncount = 3\ninterval_s = 0.05\n'
    )
    run = create_run_dir(load_plan(path), tmp_path / "run")
    assert Runner(load_plan(path), run).execute()["ok"] == 2
    assert spy.seen == [{"duration_s": 3.0, "rate_mbit": 20.0, "count": 3}]
    lines = {r["test"]: r for r in read_jsonl(run.results)}
    (rec,) = lines["spy"]["records"]
    assert (rec["rate_bps"], rec["wait_ms"], rec["dilation"]) == (2e6, 25.0, 2.0)
    assert rec["dilated"] == {"rate_bps": 1e6, "wait_ms": 50.0}
    (ping,) = lines["ping"]["records"]
    assert ping["dilated"]["rtt_min_ms"] >= 40.0 and ping["rtt_min_ms"] >= 20.0
    assert ping["rtt_min_ms"] == pytest.approx(ping["dilated"]["rtt_min_ms"] / 2)
    m = run.manifest()
    assert m["dilation"] == 2.0 and m["cpu"]["client"]["cores"] == pytest.approx(0.25)
    generate(run.path)
    assert "time-dilated x2: " in run.file("report.md").read_text()
