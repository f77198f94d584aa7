"""Plan files: the shipped catalogue loads, cases are ordered for few bring-ups, overrides apply,
and bad plans are rejected before anything starts with the file, the field and what is accepted."""

from __future__ import annotations

import json
import textwrap

import pytest

from lab.core.errors import ConfigError
from lab.campaign.load import PLAN_DIR, load_plan

SHIPPED = sorted(p.stem for p in PLAN_DIR.glob("*.toml"))

GOOD = """
name = "tiny"
profiles = ["baseline", "wireguard"]
impairments = ["none", "network1", {sweep = "delay", from = 0, to = 20, step = 10}]
reps = 3
impaired_reps = 1
duration = 2
[topology]
file = "topologies/pi_pair.py"
cpu = "pi4"
[defaults]
port = 5301
[[tests]]
test = "tcp"
[[tests]]
test = "ping"
count = 5
interval_s = 0.05
"""


def write(tmp_path, text, name="plan.toml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_shipped_plans_cover_the_studies():
    assert {"quick", "study_a", "study_b", "study_c", "study_d"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_plan_validates(name):
    plan = load_plan(name)
    assert plan.cases()
    assert all(plan.estimate_s(c) > 0 for c in plan.cases())


def test_study_plans_follow_the_methodology():
    a = load_plan("study_a")
    assert {"baseline", "wireguard", "ipsec-aes128gcm", "openvpn-aes256cbc-static"} <= set(
        a.profiles
    )
    names = [p.name for p in a.points]
    assert "delay-100ms" in names and "jitter-10ms" in names and "loss-5pct" in names
    assert (a.reps, a.impaired_reps) == (5, 1)
    d = load_plan("study_d")
    assert d.reps == 50 and d.error_bars == "minmax" and d.placement == "middlebox"
    (tcp,) = d.tests
    assert tcp.params["duration_s"] == 10 and tcp.params["omit_s"] == 1
    assert any("L2TP" in n for n in d.notes)


def test_cases_order_and_repetitions(tmp_path):
    plan = load_plan(write(tmp_path, GOOD))
    cases = plan.cases()
    # none: 3 reps x 2 tests; delay-0ms is a sweep point: impaired_reps (1)
    per_profile = 3 * 2 + 1 * 2 + 1 * 2 + 1 * 2 + 1 * 2
    assert len(cases) == 2 * per_profile
    # one profile after the other, unimpaired points (none, delay-0ms) before impaired ones
    profiles = [c.profile for c in cases]
    assert profiles == sorted(profiles, key=["baseline", "wireguard"].index)
    first = [c.point.name for c in cases if c.profile == "baseline"]
    assert first[:8] == ["none"] * 6 + ["delay-0ms"] * 2
    assert set(first[8:]) == {"network1", "delay-10ms", "delay-20ms"}
    # repetitions interleaved
    assert [(c.test.label, c.rep) for c in cases[:4]] == [
        ("tcp", 0), ("ping", 0), ("tcp", 1), ("ping", 1)
    ]  # fmt: skip
    assert len({c.key for c in cases}) == len(cases)
    tcp = plan.tests[0]
    assert tcp.params["duration_s"] == 2 and tcp.params["port"] == 5301


def test_overrides(tmp_path):
    path = write(tmp_path, GOOD)
    plan = load_plan(path, ["reps=1", "duration=1", "profiles=wireguard", "impairments=none",
                            "tests=tcp", "topology.params.bw=100"])  # fmt: skip
    assert plan.profiles == ["wireguard"]
    assert [p.name for p in plan.points] == ["none"]
    assert [t.label for t in plan.tests] == ["tcp"]
    assert plan.tests[0].params["duration_s"] == 1
    assert plan.topology_params == {"cpu": "pi4", "bw": 100}
    assert len(plan.cases()) == 1
    assert plan.digest() != load_plan(path).digest()


BAD = [
    # (plan text change, field named, words of the accepted values)
    ('name = "tiny"\nfoo = 1', "foo", "accepted: schema"),
    ("schema = 2", "schema", "accepted: 1"),
    ('profiles = ["nosuchvpn"]', "profiles[0]", "wireguard"),
    ('profiles = ["wireguard:nokey=1"]', "profiles[0]", ""),
    ('profiles = ["wireguard", "wireguard"]', "profiles", "twice"),
    ("reps = 0", "reps", "integer 1..10000"),
    ('reps = "five"', "reps", "integer 1..10000"),
    ('impairments = ["loss 120%"]', "impairments[0]", "0..100"),
    ('impairments = ["nosuchpreset"]', "impairments[0]", "network1"),
    (
        'impairments = [{sweep = "speed", from = 0, to = 1, step = 1}]',
        "impairments[0].sweep",
        "delay",
    ),
    ('impairments = [{sweep = "delay", from = 0, to = 10}]', "impairments[0].step", "step"),
    (
        'impairments = [{sweep = "delay", from = 10, to = 0, step = 1}]',
        "impairments[0]",
        "stop >= start",
    ),
    ('impairments = ["none", "none"]', "impairments", "twice"),
    ('placement = "sideways"', "placement", "middlebox"),
    ('error_bars = "iqr"', "error_bars", "minmax"),
    ('[[tests]]\ntest = "nosuchtest"', "tests[2].test", "tcp"),
    ('[[tests]]\ntest = "ping"\nname = "p6"\nip = 5', "tests[2].ip", "4 or 6"),
    ('[[tests]]\ntest = "ping"\nname = "p6"\nip = "6"', "tests[2].ip", "4 or 6"),
    ('[[tests]]\ntest = "tcp"\nduration_s = -1', "duration_s", ">= 1"),
    ('[[tests]]\ntest = "tcp"\nwindow = 3', "window", "accepted"),
    ('[[tests]]\ntest = "udp"\nname = "tcp"', "tests", "used twice"),
    ("duration = 0", "duration", "0.1"),
    ('vm = "yes"', "vm", "true, false"),
    ("[defaults]\nnot_a_param = 1", "defaults.not_a_param", "accepted"),
]


def _bad_plan(change: str) -> str:
    """GOOD with one line replaced (same key) or appended (tables go at the end)."""
    lines = GOOD.strip().splitlines()
    key = change.split("=")[0].strip()
    if change.startswith(("[[tests]]", "[defaults]")):
        text = "\n".join(lines) + "\n" + change + "\n"
        return text.replace("[defaults]\nport = 5301\n", "") if "[defaults]" in change else text
    out = [ln for ln in lines if ln.split("=")[0].strip() != key]
    top = next(i for i, ln in enumerate(out) if ln.startswith("["))
    return "\n".join(out[:top] + change.splitlines() + out[top:]) + "\n"


@pytest.mark.parametrize(("change", "field", "accepted"), BAD, ids=[b[1] for b in BAD])
def test_bad_plans_rejected(tmp_path, change, field, accepted):
    path = write(tmp_path, _bad_plan(change))
    with pytest.raises(ConfigError) as ei:
        load_plan(path)
    msg = str(ei.value)
    assert str(path) in msg, msg
    assert field in msg, msg
    assert accepted in msg, msg


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("name = 'x'\n", "topology"),  # no topology table, no profiles
        ("[topology]\nfile = 'topologies/nosuch.py'\n", "topology.file"),
        ("[topology]\nfile = 'topologies/pi_pair.py'\ncpu = 'cray'\n", "topology.cpu"),
        ("[topology]\nfile = 'topologies/pi_pair.py'\nparams = {nosuch = 1}\n", "topology"),
        ("[topology]\nfile = 'topologies/pi_pair.py'\nram = 1\n", "topology.ram"),
        ("profiles = ['baseline']\n[topology]\nfile = 'topologies/pi_pair.py'\n", "tests"),
        ("not toml = = =", "TOML"),
    ],
)
def test_bad_topology_and_structure(tmp_path, text, field):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as ei:
        load_plan(path)
    assert field in str(ei.value) and str(path) in str(ei.value)


@pytest.mark.parametrize(
    ("override", "field"),
    [("nosuch=1", "nosuch"), ("reps", "key=value"), ("tests=nosuch", "tests"),
     ("reps=0", "reps"), ("topology.ram=1", "topology.ram")],
)  # fmt: skip
def test_bad_overrides(tmp_path, override, field):
    with pytest.raises(ConfigError) as ei:
        load_plan(write(tmp_path, GOOD), [override])
    assert field in str(ei.value)


def test_missing_plan_lists_the_shipped_ones():
    with pytest.raises(ConfigError) as ei:
        load_plan("no-such-plan")
    assert "quick" in str(ei.value)


def test_vm_key_and_override(tmp_path):
    path = write(tmp_path, GOOD)
    host = load_plan(path)
    assert host.vm is False
    vm = load_plan(path, ["vm=true"])
    assert vm.vm is True and vm.to_json()["vm"] is True
    # a VM run is a different run: resuming it on the host (or the reverse) is refused by digest
    assert vm.digest() != host.digest()
    # runs recorded before the key existed keep their digest
    assert load_plan(path, ["vm=false"]).digest() == host.digest()
    written = write(tmp_path, GOOD.replace('name = "tiny"', 'name = "tiny"\nvm = true'), "v.toml")
    assert load_plan(written).vm is True


def test_ip_6_is_recorded_and_only_then_in_the_digest(tmp_path):
    text = (PLAN_DIR / "quick.toml").read_text()
    base = tmp_path / "a.toml"
    base.write_text(text)
    six = tmp_path / "b.toml"
    six.write_text(text.replace('test = "ping"', 'test = "ping"\nip = 6', 1))
    four = tmp_path / "c.toml"
    four.write_text(text.replace('test = "ping"', 'test = "ping"\nip = 4', 1))
    a, b, c = load_plan(base), load_plan(six), load_plan(four)
    assert [t.ip for t in b.tests if t.test == "ping"][0] == 6
    assert '"ip":' not in json.dumps([t.to_json() for t in a.tests])
    assert a.digest() == c.digest() != b.digest()


def test_a_bad_impairment_names_file_point_and_keyword_once(tmp_path):
    p = write(tmp_path, GOOD.replace('"network1"', '"nosuch 3"'))
    with pytest.raises(ConfigError) as e:
        load_plan(p)
    msg = str(e.value)
    assert msg.count(str(p)) == 1 and msg.count("impairments[1]") == 1, msg
    assert "unknown keyword 'nosuch'" in msg and msg.count("presets:") == 1, msg
    bad_sweep = GOOD.replace('{sweep = "delay", from = 0, to = 20, step = 10}',
                             '{sweep = "delay", from = 0, to = 20, step = 10, base = "jitter 5"}')  # fmt: skip
    with pytest.raises(ConfigError) as e:
        load_plan(write(tmp_path, bad_sweep, "sweep.toml"))
    assert str(e.value).count("impairments[2]") == 1, str(e.value)


def test_adaptive_rel_pct_override_reaches_every_test_that_takes_it():
    plan = load_plan("study_a", ["adaptive_rel_pct=10"])
    got = {t.label: t.params.get("adaptive_rel_pct") for t in plan.tests}
    assert got["tcp"] == 10 and got["udp-400m-1300"] == 10 and got["ping"] == 10
    assert got["scp"] == 10
    assert got["mtu"] is None  # mtu has no stop rule: nothing is given to it
    with pytest.raises(ConfigError) as e:
        load_plan("study_a", ["adaptive_rel_pct=0"])
    assert "adaptive_rel_pct" in str(e.value)
