"""The report's handshake tables (lab.results.handshakes, issue 33): a rekey-only entry gets a
table of its figures instead of a column of handshake times nobody measured, the cold table
names its metric and shows a profile's own key exchange, and neither the headline nor the
Summary/Recommendation rank on a metric an entry did not measure. Small synthetic runs fed
records as the handshake test writes them (no root)."""

from __future__ import annotations

import re

from lab.results.report import generate

from .test_report_answers import _md, _section, tiny_run

COLD = {"cold": True, "rekey": False, "timeout_s": 30.0}
REKEY_ONLY = {"cold": False, "rekey": True, "unsupported": "not-applicable", "timeout_s": 30.0}


def _entries(*entries: tuple[str, str, dict]) -> dict:
    return {"tests": [{"label": lb, "test": t, "reps": None, "params": p} for lb, t, p in entries]}


def _block(md: str, label: str) -> str:
    """The paragraph that starts `label`'s table, the table and the notes up to the next one."""
    rest = md[md.index(f"**{label}** (") :]
    return re.split(r"\n(?:## |\*\*[\w-]+\*\* \()", rest, maxsplit=1)[0]


def _lines(md: str, label: str) -> list[str]:
    return [ln for ln in _block(md, label).splitlines() if ln.startswith("| ")]


REKEYS = {
    # (profile, condition, rep): the record's rekey fields
    ("ipsec", "none", 0): {"rekey_keys_s": 0.2, "rekey_dip_pct": 10.0, "rekey_noise_pct": 20.0,
                           "rekey_recovery_s": 0.0, "rekey_retransmits": 4,
                           "rekey_status": "recovered"},
    ("ipsec", "none", 1): {"rekey_keys_s": 0.4, "rekey_dip_pct": 30.0, "rekey_noise_pct": 30.0,
                           "rekey_recovery_s": 1.0, "rekey_retransmits": 6,
                           "rekey_status": "recovered"},
    ("openvpn", "none", 0): {"rekey_keys_s": 1.5, "rekey_dip_pct": 100.0,
                             "rekey_noise_pct": 40.0, "rekey_recovery_s": 4.0,
                             "rekey_retransmits": 50, "rekey_status": "recovered"},
    ("openvpn", "none", 1): {"rekey_status": "failed after 30.0 s",
                             "error": "rekey failed after 30.0 s: openvpn on client not up "
                                      "again after 30 s after SIGUSR1; the tunnel was started "
                                      "again for the cases that follow"},
}  # fmt: skip
WG_NA = "no rekey on demand: WireGuard starts a new handshake on its own timer"


def _rekey_record(prof, cond, label, rep, v):
    if label != "rekey":
        return {}
    if prof == "wireguard":
        return {"rekey_status": "not applicable", "not_applicable": WG_NA}
    return dict(REKEYS.get((prof, cond, rep), {}))


def _rekey_run(tmp_path, entry=None):
    values = {
        **{(p, "none", "tcp"): [100e6, 110e6] for p in ("ipsec", "openvpn", "wireguard")},
        **{(p, "none", "rekey"): [0, 0] for p in ("ipsec", "openvpn", "wireguard")},
    }
    return tiny_run(
        tmp_path / "r",
        values,
        tests=(("tcp", "tcp"), ("rekey", "handshake")),
        plan_extra=_entries(("tcp", "tcp", {}), ("rekey", "handshake", REKEY_ONLY)),
        record=_rekey_record,
        entry=entry,
    )


def test_a_rekey_only_entry_has_its_own_table_with_figures_and_statuses(tmp_path):
    md = _md(_rekey_run(tmp_path))
    block = _block(md, "rekey")
    assert "handshake time" not in block  # was "rekey (handshake): handshake ms (ms)", all "-"
    rows = _lines(md, "rekey")
    assert rows[0] == (
        "| profile | condition | new keys after (s) | dip (%) | noise (%) | rekey recovery (s) "
        "| retransmits during the rekey (segments) | status |"
    )
    assert rows[1] == (
        "| ipsec | none | 0.300 ± 0.14 (n=2) | 20.0 ± 14 (n=2) | 25.0 ± 7.1 (n=2) "
        "| 0.500 ± 0.71 (n=2) | 5.00 ± 1.4 (n=2) | 2 recovered |"
    )
    # the rekey that never completed is a result: its status counted, its reason given
    assert rows[2] == (
        "| openvpn | none | 1.50 (n=1) | 100 (n=1) | 40.0 (n=1) | 4.00 (n=1) | 50.0 (n=1) "
        "| 1 recovered, 1 failed after 30.0 s |"
    )
    assert "`openvpn|none|rekey|1`: rekey failed after 30.0 s: openvpn on client" in block
    assert rows[3] == "| wireguard | none | n/a | n/a | n/a | n/a | n/a | n/a |"
    assert f"n/a (wireguard): not applicable, {WG_NA}." in block


def test_a_failed_rekey_case_is_counted_in_its_status(tmp_path):
    def failed(prof, cond, label, rep, v):  # ipsec's second rekey a failed case
        if (prof, label, rep) != ("ipsec", "rekey", 1):
            return {}
        return {"ok": False, "error": "boom",
                "records": [{"test": "handshake", "ok": False, "error": "boom"}]}  # fmt: skip

    run = _rekey_run(tmp_path, entry=failed)
    md = _md(run)
    assert _lines(md, "rekey")[1] == (
        "| ipsec | none | 0.200 (n=1) | 10.0 (n=1) | 20.0 (n=1) | 0 (n=1) | 4.00 (n=1) "
        "| 1 recovered [1 failed] |"
    )


def test_the_headline_and_ranking_never_use_a_metric_the_entry_did_not_measure(tmp_path):
    run = _rekey_run(tmp_path)
    s = generate(run.path)
    head = s["headline"]
    # the rekey-only entry is headlined by its recovery, not by a handshake time it never had
    assert head["header"] == ["profile", "condition", "tcp throughput (Mbit/s)",
                              "rekey recovery (s)"]  # fmt: skip
    assert [r[3] for r in head["rows"]] == ["0.500 ± 0.71 (n=2)", "4.00 (n=1)", "n/a"]
    md = run.file("report.md").read_text()
    summary, reco = _section(md, "Summary"), _section(md, "Recommendation")
    assert "| none | tcp (Mbit/s) |" in summary
    assert "rekey" not in summary  # a handshake entry ranks nothing
    assert "`tcp`" in reco and "rekey" not in reco


def test_the_cold_table_names_its_metric_and_shows_a_profiles_own_key_exchange(tmp_path):
    def cold(prof, cond, label, rep, v):
        rec = {"handshake_ms": v, "handshake_completed": 1, "handshake_status": "established"}
        if prof == "rosenpass":
            rec.update(key_exchange_ms=200.0 + 100 * rep, key_exchange_bytes=2632,
                       key_exchange_packets=4, key_exchange="rosenpass PQ -> WireGuard PSK")  # fmt: skip
        if (prof, cond, rep) == ("wireguard", "lossy", 1):
            rec = {"handshake_completed": 0, "handshake_status": "failed after 30.0 s",
                   "error": "failed after 30.0 s: no reply through the tunnel"}  # fmt: skip
        return rec

    values = {
        ("wireguard", "none", "handshake"): [300.0, 340.0],
        ("rosenpass", "none", "handshake"): [700.0, 900.0],
        ("wireguard", "lossy", "handshake"): [6000.0, 0],
    }
    run = tiny_run(
        tmp_path / "c",
        values,
        tests=(("handshake", "handshake"),),
        plan_extra=_entries(("handshake", "handshake", COLD)),
        record=cold,
    )
    md = _md(run)
    block = _block(md, "handshake")
    assert "handshake ms" not in block
    assert "rosenpass: rosenpass PQ -> WireGuard PSK" in block
    assert _lines(md, "handshake") == [
        "| profile | condition | handshake time (ms) | established | key exchange time (ms) "
        "| key exchange traffic (bytes) | key exchange frames (packets) |",
        "| wireguard | none | 320 ± 28 (n=2) | 2 of 2 | - | - | - |",
        "| wireguard | lossy | 6000 (n=1) | 1 of 2 (1 failed after 30.0 s) | - | - | - |",
        "| rosenpass | none | 800 ± 141 (n=2) | 2 of 2 | 250 ± 71 (n=2) | 2632 ± 0 (n=2) "
        "| 4.00 ± 0 (n=2) |",
    ]
    assert "`wireguard|lossy|handshake|1`: failed after 30.0 s: no reply" in block


def test_a_cold_and_rekey_entry_has_both_tables(tmp_path):
    def both(prof, cond, label, rep, v):
        return {"handshake_ms": v, "handshake_status": "established",
                **REKEYS[("ipsec", "none", rep)]}  # fmt: skip

    run = tiny_run(
        tmp_path / "b",
        {("ipsec", "none", "hs"): [800.0, 820.0]},
        tests=(("hs", "handshake"),),
        plan_extra=_entries(("hs", "handshake", {**COLD, "rekey": True})),
        record=both,
    )
    md = _md(run)
    tables = [ln for ln in md.splitlines() if ln.startswith("| profile | condition |")]
    assert len(tables) == 2
    assert "| handshake time (ms) | established |" in tables[0]
    assert "| new keys after (s) |" in tables[1]
    assert "| ipsec | none | 810 ± 14 (n=2) | 2 of 2 |" in md
