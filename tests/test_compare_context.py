"""What a reader needs around the figures (issue 21): `lab compare` gives each run's figures in
units with n and sd and says what differs between the runs (from the two manifests); a report's
warnings come before any figure. Synthetic run directories, no root, no lab."""

from __future__ import annotations

import json
import statistics

import pytest

from lab.results.compare import compare
from lab.results.preamble import warnings_section
from lab.results.doc import Doc

from .test_results import make_run


def _edit_manifest(run, **changes):
    m = run.manifest()
    m.update(changes)
    run.file("manifest.json").write_text(json.dumps(m))


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """A: make_run's pi4 client (uncalibrated); B: the same plan at half the rate, the client
    on a calibrated pi3 profile, wireguard on the kernel data plane, another kernel and netem
    recorded for one impaired point."""
    root = tmp_path_factory.mktemp("cmp")
    a = make_run(root / "a")
    b = make_run(root / "b", scale=0.5)
    _edit_manifest(a, kernel={"release": "6.1.0"})
    mb = b.manifest()
    mb["profiles"]["wireguard"]["path"] = "kernel"
    _edit_manifest(
        b,
        kernel={"release": "6.18.0"},
        profiles=mb["profiles"],
        impairment={"delay-10ms": {"baseline": {"backend": "netem"}}},
        cpu={"client": {"profile": "pi3", "calibrated": True, "core_share": 0.2,
                        "emulated_cores": 1.0, "board_cores": 4}},
    )  # fmt: skip
    s = compare(a.path, b.path)
    return a, b, s, (b.path / "compare-a")


def _differs(out) -> dict[tuple[str, str], tuple[str, str]]:
    rows = json.loads((out / "differs.json").read_text())["rows"]
    return {(r[0], r[1]): (r[2], r[3]) for r in rows}


def test_differs_block_names_the_changed_cpu_profile_path_and_kernel(compared):
    a, b, s, out = compared
    d = _differs(out)
    was, now = d[("CPU profile", "node client")]
    assert was.startswith("pi4, uncalibrated") and now.startswith("pi3, calibrated")
    assert "a board core = 0.2 host core" in now
    assert d[("data plane", "wireguard")] == ("wireguard-go", "kernel")
    assert d[("versions", "kernel")] == ("6.1.0", "6.18.0")
    # what is the same is not listed as a difference
    # each profile's calibration: the fixtures' manifests have no machine calibration record
    assert d[("CPU profile", "pi3 calibration")] == ("not in this run", "not recorded")
    assert d[("CPU profile", "pi4 calibration")] == ("not recorded", "not in this run")
    # A recorded no backend for its impaired points (a point whose cases all failed, say)
    assert d[("impairment backend", "delay-10ms")] == ("not recorded", "netem")
    assert ("impairment backend", "delay-20ms") not in d  # not recorded in either
    assert ("data plane", "baseline") not in d and s["differs"] == len(d) == 6
    md = (out / "compare.md").read_text()
    block = md[md.index("## What differs between the runs") : md.index("## Main metric")]
    assert "| CPU profile | node client | pi4, uncalibrated" in block
    assert "The same in both runs: topology" in block


def test_compare_gives_figures_in_units_with_n_and_sd(compared):
    a, b, s, out = compared
    md = (out / "compare.md").read_text()

    def cell(run):
        vals = [
            e["records"][0]["receiver_bps"] * 1e-6
            for e in map(json.loads, run.results.read_text().splitlines())
            if e["profile"] == "baseline" and e["label"] == "tcp" and e["ok"]
            and e["impairment"]["name"] == "none"
        ]  # fmt: skip
        return f"{statistics.mean(vals):.0f} ± {statistics.stdev(vals):.1f} (n={len(vals)})"

    row = next(x for x in md.splitlines() if x.startswith("| baseline | none | tcp | 0 |"))
    assert (
        row
        == f"| baseline | none | tcp | 0 | throughput | Mbit/s | {cell(a)} | {cell(b)} | 0.500 |"
    )
    ping = next(x for x in md.splitlines() if x.startswith("| baseline | none | ping | 0 |"))
    assert "| mean RTT | ms |" in ping
    html = (out / "compare.html").read_text()
    assert "src='data:image/png;base64," in html  # the plot embedded, the file self-contained
    svg = (out / "plots" / "compare.svg").read_text()  # matplotlib names each text in a comment
    assert "Throughput (Mbit/s)" in svg and "Mean RTT (ms)" in svg


def test_report_warnings_come_first(tmp_path):
    """Each kind of warning the issue names, in the box above the contents (the whole report's
    order is checked by test_report_plots; warnings_section alone keeps this test fast)."""
    run = make_run(tmp_path / "run")  # its client's pi4 profile is uncalibrated
    m = run.manifest()
    m["substrate"] = {"kind": "vm", "evidence": "functional", "note": "TCG: no CPU caps"}
    m["lab_warnings"] = ["client (arm64): the board's own binaries under qemu-user, no CPU cap"]
    doc = Doc("report")
    warnings_section(doc, run.load_results(), m)
    doc.h("Results")
    html = doc.html()
    top = html[: html.index("<h2")]
    for text in (
        "uncalibrated",
        "Functional evidence only: TCG",
        "qemu-user",
        "repetitions failed",
    ):
        assert text in top, text
    assert top.index("class='warn'") < top.index("<nav>")
    # the lab's own warning about the profile replaces the generic one
    m["lab_warnings"] = ["CPU profile 'pi4' is uncalibrated on this machine: stale"]
    doc = Doc("report")
    warnings_section(doc, run.load_results(), m)
    assert sum("uncalibrated" in w for w in doc.warnings) == 1
    good = make_run(tmp_path / "good")
    m = good.manifest()
    m["cpu"]["client"]["calibrated"] = True
    doc = Doc("report")
    warnings_section(doc, [r for r in good.load_results() if r["ok"]], m)
    assert doc.warnings == ["1 test(s) ran throttled by the Pi firmware (see Set-up)."]


def test_differs_names_nic_latency_period_and_a_boards_tool_versions(tmp_path):
    a = make_run(tmp_path / "a")
    b = make_run(tmp_path / "b")
    nic = {"mode": "auto", "applied": False, "backend": None,
           "directions": {"client->server": {"us": 80.0}, "server->client": {"us": 80.0}}}  # fmt: skip
    _edit_manifest(a, nic_latency=nic, node_tool_versions={"client": {"openvpn": "OpenVPN 2.6.14 x86_64"}},
                   cpu={"client": {"profile": "pi4", "calibrated": True, "period_us": 100_000}})  # fmt: skip
    _edit_manifest(b, nic_latency={**nic, "mode": "on", "applied": True, "backend": "userspace"},
                   node_tool_versions={"client": {"openvpn": "OpenVPN 2.6.14 aarch64"}},
                   cpu={"client": {"profile": "pi4", "calibrated": True, "period_us": 10_000}})  # fmt: skip
    compare(a.path, b.path)
    d = _differs(b.path / "compare-a")
    assert d[("boards' NICs", "per-hop latency")] == (
        "auto: client->server 80 us, server->client 80 us, not applied",
        "on: client->server 80 us, server->client 80 us, applied (userspace)",
    )
    assert d[("versions", "openvpn on client")] == (
        "OpenVPN 2.6.14 x86_64",
        "OpenVPN 2.6.14 aarch64",
    )
    was, now = d[("CPU profile", "node client")]
    assert was.endswith("CFS period 100 ms") and now.endswith("CFS period 10 ms")
