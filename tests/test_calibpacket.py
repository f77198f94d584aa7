"""Per-packet work under core_share (lab/campaign/calibpacket.py, docs/cpu.md "Per-packet work"):
tools/unixloops' output, units, the residual arithmetic and the calibration record, with
measurements recorded on this host; and one real run (root) that checks only the mechanism: the
loops run, and a group capped at a share runs them slower by about that share."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from lab.campaign import calibpacket
from lab.campaign import calibrate as calibrate_mod
from lab.campaign.calibrate import Measurement
from lab.core import cgroups
from lab.core.errors import ConfigError
from lab.model.cpuprofile import PRIMITIVES, load_cpu_profile, parse_profile

#: tools/unixloops output recorded on this host (2 vCPUs, AMD EPYC, kernel 6.18, 2026-11-26, load
#: ~9 from other work: hence a third of a CPU per elapsed second), uncapped and in a group capped
#: at 0.25 host cores
RECORDED = {
    "pipe": '{"loop": "pipe", "loops": 413794, "elapsed_s": 1.000098, "cpu_s": 0.339262}',
    "syscall": '{"loop": "syscall", "loops": 358929, "elapsed_s": 1.000049, "cpu_s": 0.336252}',
    "pipe-capped": '{"loop": "pipe", "loops": 629721, "elapsed_s": 2.000038, "cpu_s": 0.488994}',
}


def test_parse_recorded_output():
    run = calibpacket.parse(RECORDED["pipe"] + "\n", "unixbench-pipe")
    assert run.loops == 413794 and run.cpu_rate == pytest.approx(413794 / 0.339262)
    assert run.elapsed_rate == pytest.approx(413794 / 1.000098)
    with pytest.raises(ValueError, match="wanted 'syscall'"):
        calibpacket.parse(RECORDED["pipe"], "unixbench-syscall")
    with pytest.raises(ValueError):
        calibpacket.parse("usage: unixloops pipe|syscall SECONDS", "unixbench-pipe")


def test_loops_and_units():
    assert calibpacket.primitives() == ["unixbench-pipe", "unixbench-syscall"]
    assert {PRIMITIVES[p]["tool"] for p in calibpacket.primitives()} == {calibpacket.TOOL}
    assert calibpacket.in_unit(100_000, "unixbench-pipe", "loops/s") == 100_000
    # the pipe loop moves 512 bytes: 100000 loops/s = 51.2 MB/s
    assert calibpacket.in_unit(100_000, "unixbench-pipe", "MB/s") == pytest.approx(51.2)
    with pytest.raises(ConfigError, match="moves no bytes") as e:
        calibpacket.in_unit(100_000, "unixbench-syscall", "MB/s", "pi4.toml")
    assert e.value.field == "reference.unixbench-syscall.unit"


def test_profiles_state_the_board_figures_in_loops_per_second():
    for name in ("pi4", "pi4-64"):
        refs = load_cpu_profile(name, merge_calibration=False).references
        for p in calibpacket.primitives():
            assert refs[p].unit == "loops/s" and refs[p].source and refs[p].kernel, (name, p)
        assert refs["aes-128-gcm"].unit == "MB/s"  # the default
    pi4 = load_cpu_profile("pi4", merge_calibration=False).references
    assert pi4["unixbench-syscall"].confidence == "high"
    # armv7l: the mean of a run at 1.5 GHz and one at 2.15 GHz scaled to 1.5 GHz (its derivation)
    pipe, sysc = ((95964.6, 148577.8), (492327.8, 703409.2))
    assert pi4["unixbench-pipe"].mbps == pytest.approx((pipe[0] + pipe[1] * 1500 / 2150) / 2, abs=1)
    assert pi4["unixbench-syscall"].mbps == pytest.approx(
        (sysc[0] + sysc[1] * 1500 / 2150) / 2, abs=1
    )


def test_a_unit_outside_the_accepted_ones_is_refused():
    data = {
        "cores": 4,
        "core_share": 0.25,
        "reference": {
            "aes-128-gcm": {"mbps": 70, "source": "s"},
            "unixbench-pipe": {"mbps": 1e5, "source": "s", "unit": "lps"},
        },
    }
    with pytest.raises(ConfigError, match="MB/s, loops/s") as e:
        parse_profile("x", data, "x.toml")
    assert e.value.field == "reference.unixbench-pipe.unit"


def test_residual_is_core_share_times_host_over_board():
    prof = load_cpu_profile("pi4", merge_calibration=False)
    best = {
        "unixbench-pipe": calibpacket.parse(RECORDED["pipe"], "unixbench-pipe"),
        "unixbench-syscall": calibpacket.parse(RECORDED["syscall"], "unixbench-syscall"),
    }
    capped = {"unixbench-pipe": calibpacket.parse(RECORDED["pipe-capped"], "unixbench-pipe")}
    share = 0.229
    rows = {r["primitive"]: r for r in calibpacket.rows(prof, share, best, capped)}
    pipe, sysc = rows["unixbench-pipe"], rows["unixbench-syscall"]
    host = 413794 / 0.339262
    assert pipe["host_per_cpu_s"] == pytest.approx(host, abs=0.1)
    assert pipe["predicted_board"] == pytest.approx(share * host, abs=0.1)
    board = prof.references["unixbench-pipe"].mbps
    assert pipe["residual"] == pytest.approx(share * host / board - 1, abs=1e-4)
    assert pipe["residual"] > 1  # this host's pipe loop at core_share: almost 3x the Pi's
    # the capped run: 629721 loops in 2.000038 s elapsed, against the board
    assert pipe["capped"] == pytest.approx(629721 / 2.000038, abs=0.1)
    assert pipe["capped_vs_board"] == pytest.approx(629721 / 2.000038 / board - 1, abs=1e-4)
    # 0.244 CPU s per elapsed s against a 0.229 quota: not held back
    assert pipe["cpu_per_elapsed"] == pytest.approx(0.244, abs=1e-3) and not pipe["contended"]
    assert "capped" not in sysc and sysc["unit"] == "loops/s"
    # the bare syscalls at core_share: half the Pi's rate (-50 %)
    assert sysc["residual"] == pytest.approx(
        share * 358929 / 0.336252 / prof.references["unixbench-syscall"].mbps - 1, abs=1e-4
    )
    assert sysc["residual"] < -0.4


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """calibrate() with set crypto measurements (each OpenSSL/Go primitive at its pi4 reference /
    0.25, so core_share = 0.25) and the recorded loops."""
    monkeypatch.setenv("LAB_CALIBRATION_DIR", str(tmp_path / "cal"))
    refs = load_cpu_profile("pi4", merge_calibration=False).references

    def openssl(primitive, env, seconds, preexec=None):
        mbps = refs[primitive].mbps / 0.25 if primitive in refs else 400.0
        return Measurement(primitive, int(mbps * 1e6), 1.0, 1.0)

    def go(env, seconds, preexec=None):
        return Measurement("go-chacha20-poly1305", int(800e6), 1.0, 1.0), {}

    def run_loop(primitive, env, seconds, preexec=None):
        assert env["OPENSSL_ia32cap"]  # the node's environment
        return calibpacket.parse(RECORDED[PRIMITIVES[primitive]["loop"]], primitive)

    monkeypatch.setattr(calibrate_mod, "measure_openssl", openssl)
    monkeypatch.setattr(calibrate_mod, "measure_go", go)
    monkeypatch.setattr(calibrate_mod.calibssh, "missing_tools", lambda: ["ssh"])
    monkeypatch.setattr(calibpacket, "missing", lambda: None)
    monkeypatch.setattr(calibpacket, "run_loop", run_loop)


def test_calibration_reports_per_packet_work_without_fitting_it(fake):
    r = calibrate_mod.calibrate("pi4", quick=True, verify=False)
    assert r["core_share"] == pytest.approx(0.25)  # the crypto fit alone
    for p in calibpacket.primitives():
        assert p not in r["residuals"] and p not in r["fit"]["residuals"]
        assert p not in r["skipped"] and p not in r["measured"]
    rows = {x["primitive"]: x for x in r["per_packet"]["rows"]}
    assert set(rows) == set(calibpacket.primitives())
    assert rows["unixbench-pipe"]["residual"] == pytest.approx(
        0.25 * 413794 / 0.339262 / 99812 - 1, abs=1e-4
    )
    assert len(r["per_packet"]["rounds"]["unixbench-pipe"]) == 2  # --quick: 2 rounds
    assert r["per_packet"]["verification"] is None  # --no-verify: no capped run


def test_calibrate_cli_prints_the_per_packet_table(fake, capsys):
    from lab.cli.main import main

    assert main(["calibrate", "pi4", "--quick", "--no-verify"]) == 0
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "per-packet work under core_share, not fitted" in out
    # host 413794 / 0.339262 = 1219689 loops per CPU second, x 0.25 = 304922: +205.5 %
    assert "unixbench-pipe loops/s 99812 1219689 304922 +205.5%" in out


def test_a_missing_tool_is_skipped_saying_why(monkeypatch):
    monkeypatch.setattr(calibpacket, "UNIXLOOPS", calibpacket.REPO / "tools" / "nosuch")
    prof = load_cpu_profile("pi4", merge_calibration=False)
    r = calibpacket.measure(prof, {}, 0.25, 2, 1, 1, lambda s: None)
    assert r["rows"] == [] and "setup.sh builds it" in r["skipped"]


@pytest.fixture(scope="module")
def unixloops():
    """tools/unixloops, built here if ./setup.sh has not (needs a C compiler)."""
    if calibpacket.missing():
        if not shutil.which("make") or not shutil.which("cc"):
            pytest.skip("tools/unixloops is not built and there is no make/cc to build it")
        subprocess.run(["make", "-s", "-C", str(calibpacket.UNIXLOOPS.parent)], check=True)
    return calibpacket.UNIXLOOPS


@pytest.mark.root
def test_loops_run_and_a_capped_group_runs_them_at_its_share(unixloops):
    """The mechanism, not this host's speed: a positive rate, and in a group capped at 0.25 host
    cores the loop gets about a quarter of what it gets per CPU second uncapped (generous margins:
    host load can only lower the capped figure; CFS may hand out a period's worth extra)."""
    env: dict[str, str] = {}
    free = max(
        (calibpacket.run_loop("unixbench-pipe", env, 1) for _ in range(2)),
        key=lambda m: m.cpu_rate,
    )
    assert free.loops > 0 and free.cpu_s > 0 and free.cpu_rate > 0
    share = 0.25
    runs, where = calibpacket.run_capped(share, env, ["unixbench-pipe"], 2, lambda s: None)
    ratio = runs["unixbench-pipe"].elapsed_rate / free.cpu_rate
    assert 0.3 * share < ratio < 1.3 * share, (ratio, runs, free)
    assert where["left_over"] == [] and where["quota_cores"] == share
    assert not any(d.exists() for d in cgroups.probe().dirs(where["cgroup"]))
