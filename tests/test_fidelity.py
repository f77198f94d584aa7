"""lab import and the fidelity section of lab compare (issue 16), against figures worked out by hand.

Hardware (imported, n and sd as a paper would give them) and emulation (imported too, so the
expectations stay exact) for three groups:

tcp, ideal (Mbit/s)        hardware (n=5, sd)   emulated    ratio emu/hw   ln ratio
  wireguard                300 (sd 10)          240         0.8            -0.22314
  ipsec-chacha20poly1305   150 (sd 5)           120         0.8            -0.22314
  openvpn-aes256cbc-static 100 (sd 5)           130         1.3            +0.26236
  rankings: emulated wg > openvpn > chacha, hardware wg > chacha > openvpn
  pairs (wg,chacha) C, (wg,openvpn) C, (chacha,openvpn) D -> tau-b = (2 - 1) / 3 = 1/3
  flip: dry-run openvpn above chacha (130 vs 120); hardware the other way by 150/100 - 1 = 50 %;
  2 combined SE = 2 sqrt(5^2/5 + 5^2/5) = 2 sqrt(10) = 6.325 Mbit/s < 50 -> beyond noise

ping, ideal (rtt_avg_ms, lower is better; hardware n=1, no sd)
  wireguard 0.50 vs emulated 0.30 (ratio 0.6); openvpn 0.40 vs 0.60 (ratio 1.5)
  emulated wg first, hardware openvpn first: tau-b = -1; flip by 0.50/0.40 - 1 = 25 %, noise unknown

tcp, "delay 20ms" (point delay-20ms; hardware n=3, sd 30)
  wireguard 100 vs 80, chacha 90 vs 85: emulated chacha first, hardware wg first by 11.1 %;
  2 SE = 2 sqrt(900/3 + 900/3) = 48.99 Mbit/s > 10 -> within noise; tau-b = -1
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from lab.results.compare import compare
from lab.core.errors import ConfigError
from lab.results.fidelity import analyse, ranking
from lab.results.importer import COLUMNS, import_table
from lab.model.stats import kendall_tau_b

REPO = Path(__file__).resolve().parent.parent
HEADER = ",".join(COLUMNS)
WG, CHACHA, OVPN = "wireguard", "ipsec-chacha20poly1305", "openvpn-aes256cbc-static"

HARDWARE = f"""{HEADER}
{WG},ideal,tcp,throughput_mbps,300,5,10,hand table A
{CHACHA},ideal,tcp,throughput_mbps,150,5,5,hand table A
{OVPN},ideal,tcp,throughput_mbps,100,5,5,hand table A
{WG},ideal,ping,rtt_avg_ms,0.50,1,,hand table B
{OVPN},ideal,ping,rtt_avg_ms,0.40,1,,hand table B
{WG},delay 20ms,tcp,throughput_bps,100e6,3,30e6,hand table C
{CHACHA},delay 20ms,tcp,throughput_bps,90e6,3,30e6,hand table C
"""
EMULATED = f"""{HEADER}
{WG},none,tcp,throughput_mbps,240,1,,dry-run
{CHACHA},none,tcp,throughput_mbps,120,1,,dry-run
{OVPN},none,tcp,throughput_mbps,130,1,,dry-run
{WG},none,ping,rtt_avg_ms,0.30,1,,dry-run
{OVPN},none,ping,rtt_avg_ms,0.60,1,,dry-run
{WG},delay 20ms,tcp,throughput_mbps,80,1,,dry-run
{CHACHA},delay 20ms,tcp,throughput_mbps,85,1,,dry-run
"""


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture
def runs(tmp_path):
    hw = import_table(_write(tmp_path / "hw.csv", HARDWARE), tmp_path / "hw")
    emu = import_table(_write(tmp_path / "emu.csv", EMULATED), tmp_path / "emu")
    return Path(emu["out"]), Path(hw["out"])


def _read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# ------------------------------------------------------------------ the imported run directory


def test_import_writes_a_run_directory_like_a_measured_one(runs):
    _, hw = runs
    m = json.loads((hw / "manifest.json").read_text())
    assert m["kind"] == "imported"
    assert m["sources"] == ["hand table A", "hand table B", "hand table C"]
    assert m["table"]["figures"] == 7 and m["table"]["cases"] == 7
    plan = json.loads((hw / "plan.json").read_text())
    assert plan["profiles"] == [WG, CHACHA, OVPN]
    assert [p["name"] for p in plan["impairments"]] == ["none", "delay-20ms"]
    lines = [json.loads(x) for x in (hw / "results.jsonl").read_text().splitlines()]
    first = lines[0]
    assert first["case"] == f"{WG}|none|tcp|0" and first["vpn"]["driver"] == "wireguard"
    assert first["records"][0]["receiver_bps"] == 300e6  # tcp's throughput_bps record key
    summary = {
        (r["profile"], r["impairment"], r["test_label"], r["metric"]): r
        for r in _read_csv(hw / "summary.csv")
    }
    s = summary[(WG, "none", "tcp", "throughput_bps")]
    assert (int(s["n"]), float(s["mean"]), float(s["sd"])) == (5, 300e6, 10e6)
    assert s["min"] == s["max"] == ""  # unknown for a published mean of 5 repetitions
    # receiver_bps is the same figure, with the same n and sd
    assert summary[(WG, "none", "tcp", "receiver_bps")]["n"] == "5"
    ping = summary[(OVPN, "none", "ping", "rtt_avg_ms")]
    assert (ping["n"], ping["sd"]) == ("1", "")  # sd not given stays empty
    assert summary[(CHACHA, "delay-20ms", "tcp", "throughput_bps")]["sd"] == "30000000.0"


# ------------------------------------------------------------------ fidelity by hand


def test_kendall_tau_b_by_hand():
    assert kendall_tau_b([240, 120, 130], [300, 150, 100]) == pytest.approx(1 / 3)
    assert kendall_tau_b([1, 2], [2, 1]) == -1
    assert kendall_tau_b([1, 2, 3], [1, 2, 3]) == 1
    # ties: x = 1,1,2 y = 1,2,3: pairs (0,1) tied in x, (0,2) C, (1,2) C; n0 = 3, n1 = 1, n2 = 0
    assert kendall_tau_b([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / math.sqrt(2 * 3))
    assert kendall_tau_b([1, 1], [1, 2]) is None
    assert kendall_tau_b([5], [5]) is None
    assert ranking({"a": 3, "b": 5, "c": 3}, True) == [(1, "b"), (2, "a"), (2, "c")]
    assert ranking({"a": 0.3, "b": 0.6}, False) == [(1, "a"), (2, "b")]


def test_compare_fidelity_matches_the_hand_computation(runs, tmp_path):
    emu, hw = runs
    s = compare(emu, hw, tmp_path / "cmp")
    out = Path(s["out"])
    f = s["fidelity"]
    assert f["cases"] == 7 and f["rankings"] == 3
    assert f["flips"] == 3 and f["flips_beyond_noise"] == 1
    assert f["mean_tau_b"] == pytest.approx((1 / 3 - 1 - 1) / 3)

    cases = {
        (r["profile"], r["test_label"], r["impairment"]): r for r in _read_csv(out / "fidelity.csv")
    }
    expect = {
        (WG, "tcp", "none"): 0.8,
        (CHACHA, "tcp", "none"): 0.8,
        (OVPN, "tcp", "none"): 1.3,
        (WG, "ping", "none"): 0.6,
        (OVPN, "ping", "none"): 1.5,
        (WG, "tcp", "delay-20ms"): 0.8,
        (CHACHA, "tcp", "delay-20ms"): 85 / 90,
    }
    assert set(cases) == set(expect)  # receiver_bps, the same figure, is not compared twice
    for k, ratio in expect.items():
        assert float(cases[k]["ratio"]) == pytest.approx(ratio)
        assert float(cases[k]["log_error"]) == pytest.approx(math.log(ratio))
    assert float(cases[(OVPN, "tcp", "none")]["log_error"]) == pytest.approx(0.26236, abs=1e-5)

    ranks = {(r["test_label"], r["impairment"]): r for r in _read_csv(out / "fidelity-ranks.csv")}
    tcp = ranks[("tcp", "none")]
    assert tcp["emulated_ranking"] == f"{WG} > {OVPN} > {CHACHA}"
    assert tcp["hardware_ranking"] == f"{WG} > {CHACHA} > {OVPN}"
    assert float(tcp["tau_b"]) == pytest.approx(1 / 3)
    ping = ranks[("ping", "none")]
    assert ping["emulated_ranking"] == f"{WG} > {OVPN}"  # lower RTT ranks first
    assert ping["hardware_ranking"] == f"{OVPN} > {WG}"
    assert float(ping["tau_b"]) == -1
    assert float(ranks[("tcp", "delay-20ms")]["tau_b"]) == -1

    flips = {(r["test_label"], r["impairment"]): r for r in _read_csv(out / "fidelity-flips.csv")}
    t = flips[("tcp", "none")]
    assert (t["emulated_above"], t["emulated_below"], t["status"]) == (OVPN, CHACHA, "beyond noise")
    assert float(t["hardware_margin"]) == pytest.approx(0.5)
    assert float(t["hardware_diff"]) == pytest.approx(50e6)
    assert float(t["noise_2se"]) == pytest.approx(2 * math.sqrt(10) * 1e6)
    p = flips[("ping", "none")]
    assert (p["emulated_above"], p["emulated_below"], p["status"]) == (WG, OVPN, "noise unknown")
    assert float(p["hardware_margin"]) == pytest.approx(0.25)
    d = flips[("tcp", "delay-20ms")]
    assert (d["emulated_above"], d["emulated_below"], d["status"]) == (CHACHA, WG, "within noise")
    assert float(d["noise_2se"]) == pytest.approx(2 * math.sqrt(600) * 1e6)
    assert float(d["hardware_margin"]) == pytest.approx(100 / 90 - 1)

    md = (out / "compare.md").read_text()
    assert "## Fidelity" in md
    assert (
        f"**Decision flip:** `tcp` throughput_bps, condition none: the dry-run ranks {OVPN} above "
        f"{CHACHA} (130 vs 120 Mbit/s, 8 % apart); the hardware ranks them the other way by 50 % "
        "(150 vs 100 Mbit/s), beyond noise (difference 50.0 Mbit/s > 2 combined standard errors "
        "6.32 Mbit/s)." in md
    )
    assert "within noise" in md and "cannot be called beyond noise" in md
    assert "Fidelity" in (out / "compare.html").read_text()


def test_measured_repetitions_give_the_noise():
    """A measured hardware run: n repetitions and their sample sd; one repetition is no noise."""
    base = {"impairment": "none", "test_label": "tcp", "point": 0, "metric": "throughput_bps",
            "test": "tcp"}  # fmt: skip
    table = [
        {**base, "profile": "a", "n_a": 1, "mean_a": 10.0, "sd_a": 0.0, "n_b": 4, "mean_b": 20.0,
         "sd_b": 2.0},
        {**base, "profile": "b", "n_a": 1, "mean_a": 12.0, "sd_a": 0.0, "n_b": 4, "mean_b": 17.0,
         "sd_b": 2.0},
    ]  # fmt: skip
    (flip,) = analyse(table)["flips"]
    # 2 sqrt(4/4 + 4/4) = 2.83 < 3 -> beyond noise
    assert flip["noise_2se"] == pytest.approx(2 * math.sqrt(2)) and flip["status"] == "beyond noise"
    table[1]["n_b"] = 1
    (flip,) = analyse(table)["flips"]
    assert flip["status"] == "noise unknown"


# ------------------------------------------------------------------ bad tables


GOOD_ROW = f"{WG},ideal,tcp,throughput_mbps,300,5,10,paper"
BAD = {
    "missing column": ("profile,condition,test,metric,value,n,source\nx", 1, "sd", "needs profile"),
    "unknown column": (HEADER + ",units\n", 1, "units", "accepted: profile"),
    "empty file": ("", 1, None, "empty table"),
    "header only": (HEADER + "\n", 2, None, "no figures"),
    "unknown profile": (f"{HEADER}\nwireguardd,ideal,tcp,throughput_bps,1,1,,p", 2, "profile",
                        "accepted: "),
    "bad condition": (f"{HEADER}\n{WG},delay banana,tcp,throughput_bps,1,1,,p", 2, "condition",
                      "network1"),
    "unknown test": (f"{HEADER}\n{WG},ideal,tcpp,throughput_bps,1,1,,p", 2, "test", "ping"),
    "metric of another test": (f"{HEADER}\n{WG},ideal,tcp,rtt_avg_ms,1,1,,p", 2, "metric",
                               "throughput_bps, throughput_mbps"),
    "value not a number": (f"{HEADER}\n{WG},ideal,tcp,throughput_bps,fast,1,,p", 2, "value",
                           "a finite number >= 0"),
    "negative value": (f"{HEADER}\n{WG},ideal,tcp,throughput_bps,-5,1,,p", 2, "value", ">= 0"),
    "n not an integer": (f"{HEADER}\n{WG},ideal,tcp,throughput_bps,5,2.5,,p", 2, "n",
                         "an integer >= 1"),
    "n zero": (f"{HEADER}\n{WG},ideal,tcp,throughput_bps,5,0,,p", 2, "n", "an integer >= 1"),
    "negative sd": (f"{HEADER}\n{WG},ideal,tcp,throughput_bps,5,3,-1,p", 2, "sd", ">= 0"),
    "no source": (f"{HEADER}\n{WG},ideal,tcp,throughput_bps,5,3,1,", 2, "source", "where the"),
    "cells missing": (f"{HEADER}\n{GOOD_ROW}\n{WG},ideal,tcp", 3, None, "the header has 8"),
    "duplicate figure": (f"{HEADER}\n{GOOD_ROW}\n{WG},none,tcp,receiver_bps,3e8,5,,p", 3,
                         "metric", "as line 2"),
    "label on two tests": (f"{HEADER},label\n{GOOD_ROW},x\n{WG},ideal,ping,rtt_avg_ms,1,1,,p,x", 3,
                           "label", "one test per label"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_table_is_a_clear_error_and_creates_nothing(tmp_path, case):
    text, line, column, accepted = BAD[case]
    table = _write(tmp_path / "t.csv", text)
    out = tmp_path / "runs" / "imported"
    with pytest.raises(ConfigError) as e:
        import_table(table, out)
    msg = str(e.value)
    assert f"{table}: line {line}" in msg, msg
    if column:
        assert e.value.field == column, msg
    assert accepted in msg, msg
    assert not out.exists() and not (tmp_path / "runs").exists()


def test_an_existing_run_directory_is_refused_and_left_alone(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep").write_text("mine")
    with pytest.raises(ConfigError, match="not an empty directory"):
        import_table(_write(tmp_path / "t.csv", HARDWARE), out)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert (out / "keep").read_text() == "mine" and len(list(out.iterdir())) == 1


# ------------------------------------------------------------------ the CLI end to end


def _lab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lab.cli.main", *args], cwd=REPO, capture_output=True, text=True
    )


def test_cli_import_and_compare(tmp_path):
    for name, text in (("hw", HARDWARE), ("emu", EMULATED)):
        cp = _lab("import", str(_write(tmp_path / f"{name}.csv", text)), "--out",
                  str(tmp_path / name))  # fmt: skip
        assert cp.returncode == 0, cp.stderr
        assert "7 figures in 7 cases" in cp.stdout
        assert (tmp_path / name / "report.md").is_file()
    report = (tmp_path / "hw" / "report.md").read_text()
    assert "300 ± 10 (n=5)" in report and "(n=1, sd not given)" in report
    cp = _lab("compare", str(tmp_path / "emu"), str(tmp_path / "hw"))
    assert cp.returncode == 0, cp.stderr
    out = tmp_path / "hw" / "compare-emu"
    for f in ("compare.csv", "compare.md", "fidelity.csv", "fidelity-ranks.csv",
              "fidelity-flips.csv"):  # fmt: skip
        assert (out / f).is_file(), f
    assert "**Decision flip:**" in (out / "compare.md").read_text()

    bad = _write(tmp_path / "bad.csv", f"{HEADER}\n{WG},ideal,tcp,throughput_bps,fast,1,,p\n")
    cp = _lab("import", str(bad), "--out", str(tmp_path / "bad"))
    assert cp.returncode == 2
    assert f"{bad}: line 2: value: got 'fast'" in cp.stderr
    assert not (tmp_path / "bad").exists()


def test_published_example_imports():
    """docs/examples/pi4-published.csv is a valid table with every source filled in."""
    table = REPO / "docs" / "examples" / "pi4-published.csv"
    from lab.results.importer import read_table

    cases = read_table(table)
    assert cases and all(f["source"] for c in cases for f in c.figures.values())
