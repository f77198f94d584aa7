"""CPU profiles without root: loading, validation, calibration merge, fitting, cgroup files."""

from __future__ import annotations

import json
import math

import pytest

from lab.campaign import calibrate as calibrate_mod
from lab.core import cgroups
from lab.campaign.calibrate import Measurement, fit_core_share, parse_openssl_mr
from lab.model.cpucalibration import CORE_SHARE_MAX, RESIDUAL_THRESHOLD, fit_quality, host_cpu_model
from lab.model.cpuprofile import PRIMITIVES, Reference, known_profiles, load_cpu_profile
from lab.substrate.local.cpuplan import coverage, plan_entry, scale_to_host
from lab.core.errors import ConfigError, PreconditionError

HOST = {"kind": "local"}  # the substrate cpu_plan is told the lab runs on

GOOD = """
cores = 4
core_share = 0.3
[env]
OPENSSL_ia32cap = "~0x200000200000000"
[reference.aes-128-gcm]
mbps = 70
source = "somewhere"
"""


@pytest.fixture
def profdir(tmp_path, monkeypatch):
    d = tmp_path / "profiles"
    d.mkdir()
    monkeypatch.setenv("LAB_CPU_PROFILES", str(d))
    monkeypatch.setenv("LAB_CALIBRATION_DIR", str(tmp_path / "cal"))
    return d


# ---------------------------------------------------------------- the shipped catalogue


@pytest.mark.parametrize("name", ["host", "pi4", "pi4-64"])
def test_shipped_profiles_load(name, monkeypatch, tmp_path):
    monkeypatch.setenv("LAB_CALIBRATION_DIR", str(tmp_path))
    assert name in known_profiles()
    p = load_cpu_profile(name)
    if name == "host":
        assert p.quota_cores is None and p.calibrated and p.env == {}
        return
    assert p.cores == 4 and p.emulated_cores == 4
    assert not p.calibrated and "lab calibrate" in p.uncalibrated_reason
    assert set(p.references) >= {"aes-128-gcm", "aes-256-gcm", "aes-256-cbc", "chacha20-poly1305"}
    assert all(r.source for r in p.references.values())
    assert p.assumptions
    # the masks: AES-NI (57), PCLMULQDQ (33) and AVX (60) off in word 1, all of word 2 off
    first, second = p.env["OPENSSL_ia32cap"].split(":")
    mask = int(first.lstrip("~"), 16)
    assert mask & (1 << 57) and mask & (1 << 33) and mask & (1 << 60) and not mask & (1 << 41)
    assert second == "~0xffffffffffffffff"
    assert "cpu.aes=off" in p.env["GODEBUG"] and "cpu.avx2=off" in p.env["GODEBUG"]


def test_pi4_figures_follow_the_stated_derivation():
    """pi4 (armv7l, 1.5 GHz) AES-128-GCM = lelegard 64-bit 1.8 GHz x 2.3 x 1.5/1.8."""
    pi4, pi64 = (
        load_cpu_profile("pi4", merge_calibration=False),
        load_cpu_profile("pi4-64", merge_calibration=False),
    )
    derived = pi64.references["aes-128-gcm"].mbps * 2.3 * pi4.clock_mhz / pi64.clock_mhz
    assert pi4.references["aes-128-gcm"].mbps == pytest.approx(derived, rel=0.01)
    assert pi4.word_bits == 32 and pi64.word_bits == 64


# ---------------------------------------------------------------- bad files

BAD = {
    "missing_cores": ("core_share = 0.3\n", "cores", "required"),
    "negative_cores": ("cores = -1\ncore_share = 0.3\n", "cores", ">= 0"),
    "cores_string": ('cores = "four"\ncore_share = 0.3\n', "cores", "integer"),
    "share_zero": ("cores = 0\ncore_share = 0\n", "core_share", "> 0"),
    "share_bool": ("cores = 0\ncore_share = true\n", "core_share", "number"),
    "no_references": ("cores = 4\ncore_share = 0.3\n", "reference", "aes-128-gcm"),
    "unknown_primitive": (
        GOOD + '[reference.rot13]\nmbps = 1\nsource = "x"\n',
        "reference.rot13",
        "chacha20-poly1305",
    ),
    "reference_without_source": (
        "cores = 4\ncore_share = 0.3\n[reference.aes-128-gcm]\nmbps = 70\n",
        "reference.aes-128-gcm.source",
        "mbps and source",
    ),
    "reference_negative": (
        "cores = 4\ncore_share = 0.3\n[reference.aes-128-gcm]\nmbps = -3\nsource = 'x'\n",
        "reference.aes-128-gcm.mbps",
        "> 0",
    ),
    "reference_bad_confidence": (
        GOOD.replace('source = "somewhere"', 'source = "s"\nconfidence = "sure"'),
        "reference.aes-128-gcm.confidence",
        "high, medium, low",
    ),
    "unknown_top_field": (
        GOOD.replace("cores = 4", "cores = 4\ncore_sahre = 1"),
        "core_sahre",
        "accepted",
    ),
    "env_not_string": (
        GOOD.replace('OPENSSL_ia32cap = "~0x200000200000000"', "OPENSSL_ia32cap = 5"),
        "env.OPENSSL_ia32cap",
        "string",
    ),
    "word_bits": (GOOD + "", None, None),  # placeholder replaced below
    "emulated_too_many": (
        GOOD.replace("cores = 4", "cores = 4\nemulated_cores = 5"),
        "emulated_cores",
        "(0, cores=4]",
    ),
    "name_mismatch": ('name = "pi5"\n' + GOOD, "name", "must match"),
    "only_go_reference": (
        "cores = 4\ncore_share = 0.3\n[reference.go-chacha20-poly1305]\nmbps = 1\nsource = 'x'\n",
        "reference",
        "OpenSSL",
    ),
    "not_toml": ("cores = = 4\n", None, "not valid TOML"),
}
BAD["word_bits"] = ("word_bits = 16\n" + GOOD, "word_bits", "32 or 64")


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_profile_rejected_naming_file_field_and_accepted_values(case, profdir):
    text, field, accepted = BAD[case]
    (profdir / f"bad-{case}.toml").write_text(text)
    with pytest.raises(ConfigError) as ei:
        load_cpu_profile(f"bad-{case}")
    msg = str(ei.value)
    assert f"bad-{case}.toml" in msg
    if field:
        assert ei.value.field == field
    assert accepted in msg


def test_unknown_profile_lists_valid_ones(profdir):
    with pytest.raises(ConfigError, match="valid: .*pi4"):
        load_cpu_profile("pi9")


def test_adding_a_profile_is_adding_a_file(profdir):
    (profdir / "board.toml").write_text(GOOD)
    assert "board" in known_profiles()
    p = load_cpu_profile("board")
    # emulated_cores defaults to all the board's cores (4 x 0.3), one capped group each
    assert p.emulated_cores == 4 and p.quota_cores == pytest.approx(1.2) and not p.calibrated
    assert plan_entry(p)["slots"] == 4


# ---------------------------------------------------------------- calibration merge


def _calibration(prof, **over):
    cal = {
        "schema": 1,
        "profile_fingerprint": prof.fingerprint(),
        "core_share": 0.25,
        "host": {"cpu_model": host_cpu_model()},
        "residuals": {"aes-128-gcm": 0.01},
        "created": "2026-01-01T00:00:00Z",
        "mode": "quick",
        "max_abs_residual": 0.01,
    }
    cal.update(over)
    return cal


def test_calibration_is_merged(profdir, tmp_path):
    (profdir / "board.toml").write_text(GOOD)
    cal = _calibration(load_cpu_profile("board"))
    (tmp_path / "cal").mkdir()
    (tmp_path / "cal" / "board.json").write_text(json.dumps(cal))
    p = load_cpu_profile("board")
    assert (
        p.calibrated
        and p.core_share == 0.25
        and p.calibration["residuals"] == {"aes-128-gcm": 0.01}
    )


@pytest.mark.parametrize(
    "over,why",
    [
        ({"profile_fingerprint": "0" * 16}, "references or masks changed"),
        ({"host": {"cpu_model": "Some Other CPU"}}, "another CPU"),
        ({"schema": 99}, "schema"),
        ({"core_share": 0}, "outside (0, 64]"),
        ({"core_share": CORE_SHARE_MAX * 2}, "outside (0, 64]"),
        ({"core_share": "0.3"}, "outside (0, 64]"),
    ],
)
def test_stale_calibration_is_not_used(profdir, tmp_path, over, why):
    (profdir / "board.toml").write_text(GOOD)
    (tmp_path / "cal").mkdir()
    (tmp_path / "cal" / "board.json").write_text(
        json.dumps(_calibration(load_cpu_profile("board"), **over))
    )
    p = load_cpu_profile("board")
    assert not p.calibrated and p.core_share == 0.3
    assert why in p.uncalibrated_reason and "lab calibrate board" in p.uncalibrated_reason


def test_a_board_kernel_figure_is_not_in_the_fingerprint(profdir, tmp_path):
    """Calibration runs no kernel-* reference: editing one keeps the calibration, editing a
    measured reference makes it stale."""
    kernel = '[reference.kernel-gcm-aes-128]\nmbps = 44.3\nsource = "x"\n'
    (profdir / "board.toml").write_text(GOOD + kernel)
    (tmp_path / "cal").mkdir()
    (tmp_path / "cal" / "board.json").write_text(
        json.dumps(_calibration(load_cpu_profile("board")))
    )
    (profdir / "board.toml").write_text(GOOD + kernel.replace("44.3", "45.7"))
    p = load_cpu_profile("board")
    assert p.calibrated and p.references["kernel-gcm-aes-128"].mbps == 45.7
    (profdir / "board.toml").write_text(GOOD.replace("mbps = 70", "mbps = 71") + kernel)
    p = load_cpu_profile("board")
    assert not p.calibrated and "references or masks changed" in p.uncalibrated_reason


# ---------------------------------------------------------------- fitting


def test_fit_is_least_squares_of_log_ratios():
    refs = {"a": Reference("a", 100, "s"), "b": Reference("b", 50, "s", weight=3)}
    measured = {"a": 400.0, "b": 100.0}  # ratios 0.25 and 0.5
    s, res = fit_core_share(measured, refs)
    assert math.log(s) == pytest.approx((math.log(0.25) + 3 * math.log(0.5)) / 4)
    assert res["a"] == pytest.approx(s * 4 - 1) and res["b"] == pytest.approx(s * 2 - 1)
    s1, res1 = fit_core_share({"a": 400.0}, refs)
    assert s1 == pytest.approx(0.25) and res1 == {"a": pytest.approx(0.0)}


def test_fit_quality_names_the_primitive_how_far_and_what_it_means():
    """Fed a synthetic measurement in which one primitive runs 1.6x as fast (relative to the
    board) as the others: the fit is poor for that one only, in the right direction."""
    refs = {p: Reference(p, 100, "s") for p in ("a", "b", "c")}
    measured = {"a": 400.0, "b": 400.0, "c": 640.0}
    s, res = fit_core_share(measured, refs)
    expected_c = s * 6.4 - 1  # fitted board speed of c / its reference - 1
    assert expected_c > RESIDUAL_THRESHOLD > abs(s * 4 - 1)
    fit = fit_quality(res, profile="pi4")
    assert fit["above_threshold"] and fit["poor"] == ["c"] and fit["worst"] == "c"
    assert fit["max_abs_residual"] == pytest.approx(expected_c, abs=1e-4)
    assert fit["threshold"] == RESIDUAL_THRESHOLD
    (w,) = fit["warnings"]
    pct = f"{expected_c * 100:.0f} %"
    assert w == (
        f"c runs {pct} faster than the pi4 figure under the fitted cap: results of profiles "
        f"using it will overstate pi4 throughput by about {pct}"
    )
    assert fit["warning"].startswith("poor CPU calibration fit for pi4") and w in fit["warning"]
    # slower than the board: results understate it
    slow = fit_quality({"a": 0.05, "b": -0.4}, profile="pi4")
    assert slow["poor"] == ["b"] and "b runs 40 % slower" in slow["warning"]
    assert "understate pi4 throughput by about 40 %" in slow["warning"]
    # worst first; the threshold itself is still a good fit
    both = fit_quality({"a": -0.3, "b": 0.5, "c": RESIDUAL_THRESHOLD})
    assert both["poor"] == ["b", "a"] and both["warnings"][0].startswith("b runs 50 % faster")
    good = fit_quality({"a": 0.1, "b": -0.2})
    assert not good["above_threshold"] and good["warnings"] == [] and good["warning"] is None
    assert good["max_abs_residual"] == 0.2 and good["worst"] == "b"


#: fake host rates: the pi4 reference / 0.25, aes-256-gcm 1.6x as fast as that
def _fake_rates(off: float) -> dict[str, float]:
    prof = load_cpu_profile("pi4", merge_calibration=False)
    rates = {p: r.mbps / 0.25 for p, r in prof.references.items()}
    rates["aes-256-gcm"] *= off
    rates["go-chacha20-poly1305"] = 1000.0
    return rates


@pytest.fixture
def fake_measurements(monkeypatch, tmp_path):
    """calibrate() with measurements it did not make: each primitive's rate per CPU second is
    set by the test (`rates`), so fitting and reporting are checked whatever this host is."""
    monkeypatch.setenv("LAB_CALIBRATION_DIR", str(tmp_path / "cal"))
    rates: dict[str, float] = {}

    def openssl(primitive, env, seconds, preexec=None):
        assert env["OPENSSL_ia32cap"]  # measured with the profile's masks
        return Measurement(primitive, int(rates[primitive] * 1e6), 1.0, 1.0)

    def go(env, seconds, preexec=None):
        m = Measurement("go-chacha20-poly1305", int(rates["go-chacha20-poly1305"] * 1e6), 1, 1)
        return m, {"aes": False, "avx2": False}

    def ssh(prims, env, rounds, mib, say):
        return {p: [Measurement(p, int(rates.get(p, 500.0) * 1e6), 1.0, 1.0)] for p in prims}

    monkeypatch.setattr(calibrate_mod, "measure_openssl", openssl)
    monkeypatch.setattr(calibrate_mod, "measure_go", go)
    monkeypatch.setattr(calibrate_mod, "measure_ssh", ssh)
    monkeypatch.setattr(calibrate_mod.calibpacket, "missing", lambda: "not in these tests")
    return rates


def _expected_fit(rates: dict[str, float]) -> tuple[float, dict[str, float]]:
    """core_share and residuals by the definition in docs/cpu.md, from the fake rates."""
    refs = load_cpu_profile("pi4", merge_calibration=False).references
    # kernel crypto is a record only, per-packet work a residual (calibpacket): neither is fitted
    refs = {p: r for p, r in refs.items() if PRIMITIVES[p]["tool"] not in ("kernel", "syscall")}
    wsum = sum(r.weight for r in refs.values())
    s = math.exp(sum(r.weight * math.log(r.mbps / rates[p]) for p, r in refs.items()) / wsum)
    return s, {p: s * rates[p] / r.mbps - 1 for p, r in refs.items()}


def test_poor_fit_is_recorded_merged_and_warned_at_up(fake_measurements, tmp_path):
    from lab.substrate.local.cpuplan import cpu_plan
    from lab.model.topology import load_topology
    from tests.conftest import TOPOS

    fake_measurements.update(_fake_rates(1.6))
    share, res = _expected_fit(fake_measurements)
    assert res["aes-256-gcm"] > RESIDUAL_THRESHOLD
    assert all(abs(r) <= RESIDUAL_THRESHOLD for p, r in res.items() if p != "aes-256-gcm")
    r = calibrate_mod.calibrate("pi4", quick=True, verify=False)
    assert r["core_share"] == pytest.approx(share)
    assert r["residuals"] == {p: pytest.approx(v, abs=1e-4) for p, v in res.items()}
    fit = r["fit"]
    assert fit["above_threshold"] and fit["poor"] == ["aes-256-gcm"]
    pct = f"{res['aes-256-gcm'] * 100:.0f} %"
    assert f"aes-256-gcm runs {pct} faster than the pi4 figure" in fit["warning"]
    stored = json.loads((tmp_path / "cal" / "pi4.json").read_text())
    assert stored["fit"] == fit
    # every lab (and so every run's manifest: node cpu dicts and lab_warnings) carries it
    prof = load_cpu_profile("pi4")
    assert prof.calibrated and prof.calibration["fit"]["warning"] == fit["warning"]
    plan, warnings = cpu_plan(
        load_topology(TOPOS / "pi_pair.py", params={"cpu": "pi4"}), None, HOST
    )
    assert plan["client"]["calibration"]["fit"]["poor"] == ["aes-256-gcm"]
    assert fit["warning"] in warnings


def test_good_fit_is_not_warned(fake_measurements):
    from lab.substrate.local.cpuplan import cpu_plan
    from lab.model.topology import load_topology
    from tests.conftest import TOPOS

    fake_measurements.update(_fake_rates(1.1))
    r = calibrate_mod.calibrate("pi4", quick=True, verify=False)
    assert not r["fit"]["above_threshold"] and r["fit"]["warning"] is None
    _, warnings = cpu_plan(load_topology(TOPOS / "pi_pair.py", params={"cpu": "pi4"}), None, HOST)
    assert not any("calibration fit" in w for w in warnings), warnings


def test_calibrate_cli_tells_a_poor_fit_plainly(fake_measurements, capsys):
    from lab.cli.main import main

    fake_measurements.update(_fake_rates(1.6))
    _, res = _expected_fit(fake_measurements)
    pct = f"{res['aes-256-gcm'] * 100:.0f} %"
    assert main(["calibrate", "pi4", "--quick", "--no-verify"]) == 0
    out = capsys.readouterr().out
    assert "POOR FIT on this machine" in out
    assert (
        f"aes-256-gcm runs {pct} faster than the pi4 figure under the fitted cap: results of "
        f"profiles using it will overstate pi4 throughput by about {pct}"
    ) in " ".join(out.split())
    assert "aes-128-gcm runs" not in out  # the primitives that fit are not named
    # --json: stdout stays the record; the warning goes to stderr
    assert main(["calibrate", "pi4", "--quick", "--no-verify", "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["fit"]["poor"] == ["aes-256-gcm"]
    assert "lab: warning:" in cap.err and "aes-256-gcm runs" in cap.err
    # a good fit: no warning at all
    fake_measurements.update(_fake_rates(1.0))
    assert main(["calibrate", "pi4", "--quick", "--no-verify"]) == 0
    cap = capsys.readouterr()
    assert "POOR FIT" not in cap.out and "runs" not in cap.out + cap.err


def test_calibrate_refuses_a_share_outside_the_bounds(fake_measurements):
    fake_measurements.update({p: 1e-3 for p in _fake_rates(1.0)})  # a board 1000x this host
    with pytest.raises(PreconditionError, match="cannot imitate pi4"):
        calibrate_mod.calibrate("pi4", quick=True, verify=False)


def test_parse_openssl_machine_readable_output():
    text = "+DT:AES-128-GCM:1:16384\n+R:106115:AES-128-GCM:1.000000\n+H:16384\n+F:25:AES-128-GCM:1.7e9\n"
    assert parse_openssl_mr(text) == (106115, 1.0)
    with pytest.raises(ValueError):
        parse_openssl_mr("nothing")


def test_primitives_catalogue():
    assert {p["tool"] for p in PRIMITIVES.values()} == {"openssl", "go", "ssh", "kernel", "syscall"}
    # every OpenSSH primitive names the cipher `ssh -c` gets
    assert all(p["cipher"] for p in PRIMITIVES.values() if p["tool"] == "ssh")


# ---------------------------------------------------------------- scaling onto the host


def _plan(n, share=0.26, emulated=1, fixed=()):
    prof = load_cpu_profile("pi4", merge_calibration=False)
    prof.core_share, prof.emulated_cores = share, emulated
    plan = {f"n{i}": plan_entry(prof) for i in range(n)}
    for i, c in enumerate(fixed):
        plan[f"f{i}"] = {"profile": None, "cores": c, "env": {}}
    return plan


def test_pi_pair_fits_two_cores_unscaled():
    plan = _plan(2)
    assert scale_to_host(plan, 2) == []
    for p in plan.values():
        assert p["cores"] == pytest.approx(0.26) and p["scale"] == 1.0
        assert p["board_cores_emulated"] == pytest.approx(1.0)
        assert p["share_of_board"] == pytest.approx(0.25)
        assert p["single_thread_vs_board"] == pytest.approx(1.0)
        assert p["coverage"]["kernel"]["masked"] is False


def test_whole_boards_are_scaled_down_equally_and_said_so():
    plan = _plan(2, emulated=4)  # 2 x 4 x 0.26 = 2.08 host cores > 0.9 x 2
    warnings = scale_to_host(plan, 2)
    assert warnings and "scaled" in warnings[0]
    for p in plan.values():
        assert p["scale"] == pytest.approx(1.8 / 2.08, abs=1e-3)
        assert p["cores"] == pytest.approx(0.9)
        assert p["board_cores_emulated"] == pytest.approx(0.9 / 0.26, abs=1e-3)
        # one capped group per board core: a thread still runs at one Pi core's speed
        assert p["slots"] == 4 and p["slot_cores"] == pytest.approx(0.26)
        assert p["single_thread_vs_board"] == pytest.approx(1.0)
    assert "one board core's speed per thread" in warnings[0]


def test_without_per_core_groups_one_thread_would_outrun_a_board_core():
    plan = _plan(2, emulated=4)
    for p in plan.values():
        p["slots"] = 0  # what cpu_plan leaves where this machine cannot (cgroup v2)
    scale_to_host(plan, 2)
    for p in plan.values():
        # a single thread may use a whole host core: faster than one Pi core, and stated
        assert p["single_thread_vs_board"] == pytest.approx(0.9 / 0.26, abs=1e-3)


def test_scaling_below_one_board_core_slows_the_core_too():
    plan = _plan(4, emulated=1.5)  # 4 x 1.5 x 0.26 = 1.56 host cores + 1.2 fixed > 1.8
    for i in range(2):
        plan[f"f{i}"] = {"profile": None, "cores": 0.6, "env": {}}
    warnings = scale_to_host(plan, 2)
    room = 1.8 - 1.2
    for n in ("n0", "n1", "n2", "n3"):
        p = plan[n]
        assert p["slots"] == 2
        assert p["cores"] == pytest.approx(room / 4)  # 0.15 < one core's 0.26
        assert p["slot_cores"] == pytest.approx(room / 4)
        assert p["single_thread_vs_board"] == pytest.approx(room / 4 / 0.26, abs=1e-3)
    assert "of their boards' CPU time" in warnings[0]


def test_impossible_request_is_refused():
    with pytest.raises(PreconditionError, match="cannot honour"):
        scale_to_host(_plan(40), 2)  # 40 x 0.26 = 10.4 host cores on 2
    with pytest.raises(PreconditionError, match="this machine has 2"):
        scale_to_host(_plan(0, fixed=[3.0]), 2)


def test_fixed_caps_leave_less_room_for_profiles():
    plan = _plan(2, fixed=[1.5])  # 0.3 left for 0.52 wanted
    scale_to_host(plan, 2)
    assert plan["n0"]["scale"] == pytest.approx(0.3 / 0.52, abs=1e-3)
    assert plan["f0"]["cores"] == 1.5


def test_coverage_states_what_is_and_is_not_masked():
    c = coverage(load_cpu_profile("pi4", merge_calibration=False))
    assert c["userspace_openssl"]["masked"] and c["userspace_openssl"]["quota_scaled"]
    assert c["userspace_go"]["masked"] and "wireguard-go" in c["userspace_go"]["used_by"][0]
    assert c["kernel"]["masked"] is False and c["kernel"]["quota_scaled"] == "partial"
    assert "kernel WireGuard" in c["kernel"]["used_by"]
    h = coverage(load_cpu_profile("host"))
    assert not h["userspace_openssl"]["masked"] and not h["kernel"]["quota_scaled"]


# ---------------------------------------------------------------- cgroup files, v2 and v1


def _fake_v2(root):
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("")
    (root / "cgroup.procs").write_text("")
    (root / "cpuset.cpus.effective").write_text("0-1\n")
    return root


def test_profile_quota_on_fake_cgroup_v2(tmp_path):
    root = _fake_v2(tmp_path / "cg2")
    layout = cgroups.probe(root)
    assert layout.version == 2
    plan = _plan(2)
    scale_to_host(plan, 2)
    cgroups.ensure_dir(layout, "lab")
    # the fake tree does not populate children the way cgroupfs does: play the kernel's part
    (root / "lab" / "cgroup.controllers").write_text("cpuset cpu\n")
    (root / "lab" / "cgroup.subtree_control").write_text("")
    cgroups.ensure_dir(layout, "lab/x")
    (root / "lab" / "x" / "cpuset.cpus").write_text("")
    cgroups.set_cpu(layout, "lab/x", plan["n0"]["cores"], cgroups.all_cpus(layout))
    assert (root / "cgroup.subtree_control").read_text() == "+cpu +cpuset"
    assert (root / "lab" / "x" / "cpu.max").read_text() == "26000 100000"
    assert (root / "lab" / "x" / "cpuset.cpus").read_text() == "0-1"


def test_profile_quota_on_fake_cgroup_v1(tmp_path):
    root = tmp_path / "cg1"
    for c in cgroups.V1_CONTROLLERS:
        (root / c).mkdir(parents=True)
        (root / c / "cgroup.procs").write_text("")
    (root / "cpuset" / "cpuset.cpus").write_text("0-1\n")
    (root / "cpuset" / "cpuset.mems").write_text("0\n")
    layout = cgroups.probe(root)
    assert layout.version == 1
    for rel in ("lab", "lab/x"):
        (root / "cpuset" / rel).mkdir()
        for f in ("cpuset.cpus", "cpuset.mems"):
            (root / "cpuset" / rel / f).write_text("")
        cgroups.ensure_dir(layout, rel)
    assert (root / "cpuset" / "lab" / "x" / "cpuset.mems").read_text() == "0"
    plan = _plan(2)
    scale_to_host(plan, 2)
    cgroups.set_cpu(layout, "lab/x", plan["n0"]["cores"], "0-1")
    assert (root / "cpu" / "lab" / "x" / "cpu.cfs_quota_us").read_text() == "26000"
    assert (root / "cpu" / "lab" / "x" / "cpu.cfs_period_us").read_text() == "100000"


def test_tcg_vm_substrate_applies_masks_but_no_caps(monkeypatch):
    """Inside a TCG VM a host-calibrated quota would make nodes far slower than a board: caps
    are left off (stated as a warning and in each node's cpu record), the masks stay."""
    from lab.substrate.local.cpuplan import cpu_plan
    from lab.substrate.local.lab import current_substrate
    from lab.model.topology import load_topology
    from tests.conftest import TOPOS

    spec = load_topology(TOPOS / "pi_pair.py", params={"cpu": "pi4"})
    plan, _ = cpu_plan(spec, None, HOST)
    assert all(p["cores"] for p in plan.values())  # on the host: capped
    monkeypatch.setenv(
        "LAB_SUBSTRATE", json.dumps({"kind": "vm", "accelerator": "tcg", "kernel": "6.12"})
    )
    plan, warnings = cpu_plan(spec, None, current_substrate())
    assert {n: (p["cores"], p.get("not_applied")) for n, p in plan.items()} == {
        "client": (None, "TCG"),
        "server": (None, "TCG"),
    }
    assert all("OPENSSL_ia32cap" in p["env"] for p in plan.values())
    assert any("not applied" in w and "TCG" in w for w in warnings), warnings
    monkeypatch.setenv(
        "LAB_SUBSTRATE", json.dumps({"kind": "vm", "accelerator": "kvm", "kernel": "6.12"})
    )
    plan, _ = cpu_plan(spec, None, current_substrate())
    assert all(p["cores"] for p in plan.values())  # KVM runs at near-native speed: capped


def test_a_profile_defines_the_mask_environment_entirely(monkeypatch):
    """A `host` node must not inherit a mask the caller exported; pi4 gets exactly its own."""
    from lab.substrate.local.cpuplan import plan_entry
    from lab.model.cpuprofile import load_cpu_profile
    from lab.core.node import merged_env

    monkeypatch.setenv("OPENSSL_ia32cap", "~0x2")
    monkeypatch.setenv("GODEBUG", "cpu.all=off")
    monkeypatch.setenv("LAB_KEEP_ME", "1")
    host = merged_env(plan_entry(load_cpu_profile("host", merge_calibration=False))["env"])
    assert "OPENSSL_ia32cap" not in host and "GODEBUG" not in host and host["LAB_KEEP_ME"] == "1"
    pi4 = load_cpu_profile("pi4", merge_calibration=False)
    env = merged_env(plan_entry(pi4)["env"], {"EXTRA": "x"})
    assert env["OPENSSL_ia32cap"] == pi4.env["OPENSSL_ia32cap"]
    assert env["GODEBUG"] == pi4.env["GODEBUG"] and env["EXTRA"] == "x"
    # a node without a profile (cpu=None or a core fraction) keeps the caller's environment
    assert merged_env({})["OPENSSL_ia32cap"] == "~0x2"


# ---------------------------------------------------------------- the board OS's defaults


def test_pi_profiles_state_the_board_os_tcp_defaults_with_a_source(monkeypatch, tmp_path):
    monkeypatch.setenv("LAB_CALIBRATION_DIR", str(tmp_path))
    for name in ("pi4", "pi4-64"):
        p = load_cpu_profile(name)
        assert p.os == {
            "net.ipv4.tcp_congestion_control": "cubic",
            "net.ipv4.tcp_rmem": "4096 131072 6291456",
            "net.ipv4.tcp_wmem": "4096 16384 4194304",
        }
        assert "ip-sysctl" in p.os_source
        assert plan_entry(p)["os"] == p.os
    assert load_cpu_profile("host").os == {} and "os" not in plan_entry(load_cpu_profile("host"))


@pytest.mark.parametrize(
    "table, field",
    [
        ('[os]\ntcp_congestion_control = "cubic"\n', "os"),  # no source
        ('[os]\ntcp_window_scaling = "1"\nsource = "x"\n', "os.tcp_window_scaling"),
        ('[os]\ntcp_rmem = 4096\nsource = "x"\n', "os.tcp_rmem"),
        ('os = "cubic"\n', "os"),
    ],
)
def test_bad_os_tables_are_refused_naming_the_field(profdir, table, field):
    text = GOOD.replace("[env]", table + "[env]") if table.startswith("[") else table + GOOD
    (profdir / "bad.toml").write_text(text)
    with pytest.raises(ConfigError) as e:
        load_cpu_profile("bad")
    assert e.value.field == field and "bad.toml" in str(e.value)
