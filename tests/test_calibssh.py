"""Calibration coverage (issue 16): OpenSSH's ciphers and the implementation table, checked with
hand-computed figures and measurements the test sets (no root, no sshd): the real sshd run is
exercised by `lab calibrate` itself (bench/cpu_calibrate.py, docs/cpu.md)."""

from __future__ import annotations

import pytest

from lab.campaign import calibrate as calibrate_mod
from lab.campaign import calibssh
from lab.campaign.calibrate import Measurement, implementation_coverage
from lab.model.cpuprofile import PRIMITIVES, load_cpu_profile


def test_rate_per_cpu_second_subtracts_the_handshake():
    # 32 MiB in 0.30 s of client CPU of which 0.05 s was the handshake: 33554432 / 0.25 / 1e6
    assert calibssh.per_cpu_second(32 * 1024 * 1024, 0.30, 0.05) == pytest.approx(134.217728)
    # a transfer that cost no more than the handshake has no rate (not a negative or infinite one)
    assert calibssh.per_cpu_second(1000, 0.05, 0.05) == 0.0


def test_client_argv_pins_cipher_host_key_and_namespace(tmp_path):
    argv = calibssh.client_argv("calib-ssh-1", tmp_path, "aes128-ctr")
    assert argv[1] == "--net=/var/run/netns/calib-ssh-1"
    assert argv[argv.index("-c") + 1] == "aes128-ctr"
    assert argv[argv.index("-F") + 1] == "/dev/null"  # no user or system config
    assert (
        "StrictHostKeyChecking=yes" in argv and f"UserKnownHostsFile={tmp_path}/known_hosts" in argv
    )
    assert argv[-2:] == ["root@127.0.0.1", "cat > /dev/null"]


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """calibrate() with set measurements: every OpenSSL/Go primitive at its pi4 reference / 0.25
    (so core_share = 0.25 exactly), each ssh session 100 MB in 0.6 s CPU with a 0.1 s handshake."""
    monkeypatch.setenv("LAB_CALIBRATION_DIR", str(tmp_path / "cal"))
    refs = load_cpu_profile("pi4", merge_calibration=False).references
    asked: dict = {}

    def openssl(primitive, env, seconds, preexec=None):
        mbps = refs[primitive].mbps / 0.25 if primitive in refs else 400.0
        return Measurement(primitive, int(mbps * 1e6), 1.0, 1.0)

    def go(env, seconds, preexec=None):
        return Measurement("go-chacha20-poly1305", int(800e6), 1.0, 1.0), {}

    def ssh(ciphers, env, *, rounds, mib, say):
        asked.update(ciphers=dict(ciphers), rounds=rounds, mib=mib)
        one = {"bytes": 100_000_000, "elapsed_s": 1.0, "cpu_s": 0.6, "handshake_cpu_s": 0.1}
        return {p: [dict(one) for _ in range(rounds)] for p in ciphers}

    monkeypatch.setattr(calibrate_mod, "measure_openssl", openssl)
    monkeypatch.setattr(calibrate_mod, "measure_go", go)
    monkeypatch.setattr(calibrate_mod.calibssh, "measure", ssh)
    monkeypatch.setattr(calibrate_mod.calibpacket, "missing", lambda: "not in these tests")
    monkeypatch.setattr(calibrate_mod.calibssh, "missing_tools", lambda: [])
    return asked


def test_full_calibration_measures_every_openssh_cipher_and_predicts_it(fake):
    r = calibrate_mod.calibrate("pi4", verify=False)
    ssh = {p: d["cipher"] for p, d in PRIMITIVES.items() if d["tool"] == "ssh"}
    assert fake["ciphers"] == ssh and fake["rounds"] == 3 and fake["mib"] == 32
    assert r["core_share"] == pytest.approx(0.25)
    # 100 MB / (0.6 - 0.1) s = 200 MB per CPU second; predicted board figure 0.25 x 200 = 50
    best = r["measured"]["ssh-chacha20-poly1305"]["best"]
    assert best["cpu_mbps"] == pytest.approx(200.0)
    info = r["informational"]["ssh-chacha20-poly1305"]
    assert info["host_cpu_mbps"] == 200.0 and info["predicted_board_mbps"] == 50.0
    # sha1 (OpenVPN's HMAC) has no reference: measured as information, at the fake 400 MB/s
    assert r["informational"]["sha1"]["predicted_board_mbps"] == 100.0
    assert "ssh-chacha20-poly1305" not in r["residuals"]  # no Pi 4 reference: not fitted


def test_quick_calibration_measures_scp_cipher_only_and_says_why_not_the_others(fake):
    r = calibrate_mod.calibrate("pi4", quick=True, verify=False)
    assert fake["ciphers"] == {"ssh-chacha20-poly1305": "chacha20-poly1305@openssh.com"}
    assert fake["rounds"] == 2 and fake["mib"] == 16
    assert "--quick" in r["skipped"]["ssh-aes128-gcm"] and "--quick" in r["skipped"]["sha1"]


def test_implementation_table_states_each_primitive():
    prof = load_cpu_profile("pi4", merge_calibration=False)
    measured = {"aes-128-gcm": 300.0, "ssh-aes128-gcm": 250.0}
    rows = {
        r["primitive"]: r
        for r in implementation_coverage(prof, measured, {"ssh-aes128-ctr": "sshd missing"})
    }
    # every primitive of every crypto implementation, once (per-packet loops: calibpacket's rows)
    assert set(rows) == {p for p, d in PRIMITIVES.items() if d["tool"] != "syscall"}
    assert rows["aes-128-gcm"]["status"] == "fitted" and rows["aes-128-gcm"]["measured"]
    assert rows["ssh-aes128-gcm"]["status"].startswith("unreferenced")
    assert rows["ssh-aes128-ctr"]["status"] == "not measured: sshd missing"
    kernel = rows["kernel-aes-128-cbc"]
    assert kernel["implementation"] == "kernel" and not kernel["measured"]
    assert kernel["reference_mbps"] == 79.8 and kernel["status"].startswith("reference only")
    assert rows["go-chacha20-poly1305"]["implementation"] == "Go x/crypto"
