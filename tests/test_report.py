"""Report, plots and compare on synthetic runs (no root)."""

from __future__ import annotations

import pandas as pd
import pytest

from lab.results.compare import compare
from lab.core.errors import ConfigError
from lab.results.report import generate

from .test_results import make_run


def test_report_tables_plots_and_time_share(tmp_path):
    run = make_run(tmp_path / "run")
    s = generate(run.path)
    md = run.file("report.md").read_text()
    html = run.file("report.html").read_text()
    # the share of run time outside measurement, stated as such
    assert "Time outside measurement:" in md and "% of the run" in md
    assert s["budget"]["outside_share"] is not None
    assert f"{100 * s['budget']['outside_share']:.1f} %" in md
    # tables per test, recommendation, failed case with its raw output
    assert "## Recommendation" in md and "| none | wireguard |" in md
    assert "## Failed cases" in md and "wireguard|none|udp|1" in md and "boom" in md
    assert "<details>" in html and "<table>" in html
    names = {p.split("/")[-1] for p in s["plots"]}
    assert {"throughput.png", "throughput_vs_delay.png", "cpu.png", "udp.png",
            "udp_sweep_sweep.png"} <= names  # fmt: skip
    for p in s["plots"]:
        png = run.path / p
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert png.with_suffix(".svg").read_text().lstrip().startswith("<?xml")
        assert p in md
    # regenerating is harmless and leaves no temporary files
    generate(run.path)
    assert not [p for p in run.path.rglob(".*") if p.is_file()]


def test_report_states_a_vm_substrate_and_its_evidence_class(tmp_path):
    import json

    from lab.substrate.vm.lab import TCG_NOTE

    run = make_run(tmp_path / "run")
    m = run.manifest()
    m["substrate"] = {"kind": "vm", "kernel": "6.12.0-test", "accelerator": "tcg",
                      "evidence": "functional", "note": TCG_NOTE, "host_kernel": "5.10.0-host"}  # fmt: skip
    run.file("manifest.json").write_text(json.dumps(m))
    generate(run.path)
    md = run.file("report.md").read_text()
    assert "full-kernel VM, kernel 6.12.0-test, accelerator TCG on host kernel 5.10.0-host" in md
    assert "functional evidence only" in md
    host = make_run(tmp_path / "host")
    generate(host.path)
    assert "full-kernel VM" not in host.file("report.md").read_text()


def test_report_refuses_a_directory_that_is_no_run(tmp_path):
    with pytest.raises(ConfigError, match="not a run directory"):
        generate(tmp_path)


def test_compare_two_runs(tmp_path):
    a = make_run(tmp_path / "a")
    b = make_run(tmp_path / "b", scale=0.5)
    s = compare(a.path, b.path)
    out = b.path / "compare-a"
    assert s["out"] == str(out) and s["matched"] > 0 and s["only_a"] == 0
    df = pd.read_csv(out / "compare.csv")
    tcp = df[(df.profile == "baseline") & (df.impairment == "none") & (df.test_label == "tcp")
             & (df.metric == "throughput_bps")]  # fmt: skip
    assert tcp.ratio_b_over_a.iloc[0] == pytest.approx(0.5)
    assert (out / "plots" / "compare.png").read_bytes()[:4] == b"\x89PNG"
    assert "compare.png" in (out / "compare.md").read_text()


def test_compare_lists_cases_of_one_run_only(tmp_path):
    a = make_run(tmp_path / "a")
    b = make_run(tmp_path / "b", profiles=("baseline",))
    s = compare(a.path, b.path, tmp_path / "cmp")
    assert s["only_a"] > 0 and s["only_b"] == 0
    df = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    assert (df[df.profile == "wireguard"].n_b == 0).all()


def test_report_warns_when_a_test_ran_throttled(tmp_path):
    run = make_run(tmp_path / "run")  # wireguard|none|tcp|2 ran throttled (vcgencmd)
    generate(run.path)
    md = run.file("report.md").read_text()
    assert "**Warning: 1 of 40 tests ran throttled**" in md
    assert "hottest sensor 81.5 °C" in md and "`wireguard|none|tcp|2`" in md
    assert "<b>Warning: 1 of 40 tests ran throttled</b>" in run.file("report.html").read_text()
    quiet = make_run(tmp_path / "quiet", profiles=("baseline",))  # no vcgencmd readings
    generate(quiet.path)
    assert "ran throttled" not in quiet.file("report.md").read_text()


def test_report_states_the_cpu_calibration_fit(tmp_path):
    """The fit quality recorded in the manifest (node cpu dicts) is in the report: residuals per
    primitive against the threshold, and the poor-fit warning in plain words."""
    import json

    from lab.model.cpucalibration import fit_quality

    def with_calibration(name, residuals, fit=True):
        run = make_run(tmp_path / name)
        m = run.manifest()
        cal = {"file": "/var/lib/lab/calibration/pi4.json", "created": "2026-01-01T00:00:00Z",
               "mode": "full", "residuals": residuals}  # fmt: skip
        if fit:
            cal["fit"] = fit_quality(residuals, profile="pi4")
        m["cpu"] = {n: {"profile": "pi4", "calibrated": True, "calibration": cal}
                    for n in ("client", "server")}  # fmt: skip
        run.file("manifest.json").write_text(json.dumps(m))
        generate(run.path)
        return run.file("report.md").read_text().replace("\\|", "|")  # Markdown's escaped |

    poor = with_calibration("poor", {"aes-128-gcm": -0.0978, "aes-256-gcm": 0.3009})
    assert poor.count("| CPU calibration |") == 1  # one row per profile, not per node
    assert "aes-128-gcm -9.8%, aes-256-gcm +30.1%" in poor
    assert "max |residual| 30.1% (aes-256-gcm) above the 25% threshold" in poor
    assert "| warning | poor CPU calibration fit for pi4" in poor
    assert "aes-256-gcm runs 30 % faster than the pi4 figure under the fitted cap" in poor
    assert "overstate pi4 throughput by about 30 %" in poor
    good = with_calibration("good", {"aes-128-gcm": 0.01, "aes-256-gcm": -0.12})
    assert "max |residual| 12.0% (aes-256-gcm) within the 25% threshold" in good
    assert "calibration fit" not in good and "runs" not in good.split("## ")[1]
    # a manifest from before fit quality was recorded: judged from its residuals
    old = with_calibration("old", {"aes-256-gcm": -0.4}, fit=False)
    assert "understate pi4 throughput by about 40 %" in old
