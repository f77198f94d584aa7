"""CPU profiles for real (root): calibration, a capped pi4 node's crypto, masks in daemons.

These tests check mechanisms, never how well this host imitates a Pi: the residuals, the time a
calibration takes and how close a capped node comes to the Pi figures depend on the host's CPU
model and on what else runs at that moment. bench/cpu_calibrate.py prints those figures.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from lab.core import cgroups
from lab.campaign.calibrate import calibrate, measure_openssl, parse_openssl_mr
from lab.model.cpucalibration import CORE_SHARE_MAX, RESIDUAL_THRESHOLD
from lab.model.cpuprofile import PRIMITIVES, load_cpu_profile

from .conftest import REPO, kernel_quota_cores, lab_traces, run_lab

pytestmark = pytest.mark.root


#: what a capped group's CPU time per wall-clock second may exceed its quota by: CFS hands the
#: quota out per 100 ms period (a window of a few seconds can catch one period's worth extra)
#: in per-CPU slices. Host load only lowers the figure, never raises it.
CAP_SLOP = 0.2


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """A quick pi4 calibration stored in a private directory (the machine's own is left alone)."""
    d = tmp_path_factory.mktemp("calibration")
    old = os.environ.get("LAB_CALIBRATION_DIR")
    os.environ["LAB_CALIBRATION_DIR"] = str(d)
    try:
        result = calibrate("pi4", quick=True)
        yield result
    finally:
        if old is None:
            os.environ.pop("LAB_CALIBRATION_DIR", None)
        else:
            os.environ["LAB_CALIBRATION_DIR"] = old


def test_calibrate_cli_quick(tmp_path):
    """Calibration runs, writes its file, fits a core_share inside the profile's bounds by the
    documented formula from the rates it measured, reports a residual per reference primitive
    and judges each against the documented threshold. Not how small the residuals are: that
    depends on this host (bench/cpu_calibrate.py); the warning itself is tested in
    test_cpu_profile.py with synthetic measurements."""
    r = run_lab("calibrate", "pi4", "--quick", "--json", env={"LAB_CALIBRATION_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    refs = load_cpu_profile("pi4", merge_calibration=False).references
    # the kernel's figure is a record only: never measured or fitted, and said so
    assert "board kernel's code is not run here" in res["skipped"].pop("kernel-aes-128-cbc")
    # per-packet loops are a residual of their own (calibpacket), never fitted
    refs = {p: r for p, r in refs.items() if PRIMITIVES[p]["tool"] not in ("kernel", "syscall")}
    expected = {"aes-128-gcm", "aes-256-gcm", "aes-256-cbc", "chacha20-poly1305"}
    assert set(res["residuals"]) == set(refs) == expected
    # scp's OpenSSH cipher is measured even with --quick (a real sshd), as information
    assert res["measured"]["ssh-chacha20-poly1305"]["best"]["cpu_mbps"] > 0
    assert "ssh-chacha20-poly1305" in res["informational"]
    # the fit, recomputed from the best round of each primitive (docs/cpu.md, Calibration 2)
    for p in refs:
        rounds = [m["cpu_mbps"] for m in res["measured"][p]["rounds"]]
        assert len(rounds) == 2 and all(x > 0 for x in rounds), (p, rounds)
        assert res["measured"][p]["best"]["cpu_mbps"] == max(rounds)
    got = {p: res["measured"][p]["best"]["cpu_mbps"] for p in refs}
    wsum = sum(r.weight for r in refs.values())
    share = math.exp(sum(r.weight * math.log(r.mbps / got[p]) for p, r in refs.items()) / wsum)
    assert 0 < res["core_share"] <= CORE_SHARE_MAX
    assert res["core_share"] == pytest.approx(share, rel=1e-3)
    for p, ref in refs.items():
        assert res["residuals"][p] == pytest.approx(share * got[p] / ref.mbps - 1, abs=1e-3), p
    # judged against the documented threshold, and said on stderr when poor
    fit = res["fit"]
    poor = {p for p, x in res["residuals"].items() if abs(x) > RESIDUAL_THRESHOLD}
    assert fit["threshold"] == RESIDUAL_THRESHOLD and set(fit["poor"]) == poor
    assert fit["above_threshold"] == bool(poor) and (fit["warning"] is None) == (not poor)
    assert all(f"lab: warning: {p} runs" in r.stderr for p in poor), r.stderr
    stored = json.loads((tmp_path / "pi4.json").read_text())
    assert stored["core_share"] == res["core_share"] and stored["host"]["openssl"].startswith(
        "OpenSSL"
    )
    assert stored["env"]["OPENSSL_ia32cap"] and stored["env"]["GODEBUG"]
    v = stored["verification"]
    assert v["cgroup_version"] == cgroups.probe().version and v["left_over"] == []
    assert not any(d.exists() for d in cgroups.probe().dirs(v["cgroup"]))
    if "go-chacha20-poly1305" in res["measured"]:
        # GODEBUG reached the Go program: x/sys/cpu saw no AES, no AVX2
        assert res["go_features_seen"]["aes"] is False and res["go_features_seen"]["avx2"] is False
    # and load_cpu_profile now uses it
    os.environ["LAB_CALIBRATION_DIR"] = str(tmp_path)
    try:
        p = load_cpu_profile("pi4")
    finally:
        del os.environ["LAB_CALIBRATION_DIR"]
    assert p.calibrated and p.core_share == pytest.approx(res["core_share"])


def _cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _openssl_capabilities(env: dict[str, str]) -> tuple[int, int]:
    """The capability vector OpenSSL itself runs with (`openssl info -cpusettings`, OpenSSL >= 3):
    CPUID leaf 1 (EDX | ECX << 32) and leaf 7 (EBX | ECX << 32), after OPENSSL_ia32cap."""
    cp = subprocess.run(
        ["openssl", "info", "-cpusettings"], capture_output=True, text=True, env=env, check=False
    )
    m = re.search(r"OPENSSL_ia32cap=0x([0-9a-f]+):0x([0-9a-f]+)", cp.stdout)
    if cp.returncode != 0 or not m:
        pytest.skip(f"`openssl info -cpusettings` (OpenSSL >= 3.0) unavailable: {cp.stderr}")
    return int(m[1], 16), int(m[2], 16)


# OPENSSL_ia32cap bits (crypto/cpuid.c): leaf 1 ECX is the upper half of the first word
AESNI, PCLMUL, AVX = 1 << (32 + 25), 1 << (32 + 1), 1 << (32 + 28)
AVX2 = 1 << 5  # leaf 7 EBX, the second word


@pytest.mark.parametrize(
    ("prim", "flag", "word", "bit"),
    [("aes-128-gcm", "aes", 0, AESNI), ("chacha20-poly1305", "avx2", 1, AVX2)],
)
def test_masks_slow_aes_and_chacha(prim, flag, word, bit):
    """OPENSSL_ia32cap really removes AES-NI and the wide-vector ChaCha20-Poly1305 paths: the
    capability vector OpenSSL reports under the profile's env has the bits the host has cleared
    (AES-NI, PCLMULQDQ, AVX; all of leaf 7: AVX2, AVX-512), and the masked path is slower
    (interleaved rounds, best of each; the real factors, 10-20x and 2-4x, are the host's:
    bench/cpu_calibrate.py step 4)."""
    if flag not in _cpu_flags():
        pytest.skip(f"host CPU lacks {flag}: nothing faster than the masked path to compare with")
    prof = load_cpu_profile("pi4", merge_calibration=False)
    plain = {k: v for k, v in os.environ.items() if k != "OPENSSL_ia32cap"}
    masked = dict(plain, **prof.env)
    host, under_mask = _openssl_capabilities(plain), _openssl_capabilities(masked)
    assert host[word] & bit, f"host has {flag} but OpenSSL does not see it: {host}"
    assert not under_mask[word] & bit, (flag, hex(under_mask[word]))
    assert not under_mask[0] & (AESNI | PCLMUL | AVX) and under_mask[1] == 0, under_mask
    fast, slow = [], []
    for _ in range(3):
        fast.append(measure_openssl(prim, plain, 1).cpu_mbps)
        slow.append(measure_openssl(prim, masked, 1).cpu_mbps)
    assert max(fast) > max(slow), (prim, fast, slow)


def test_capped_pi4_node_holds_its_quota_and_masks_reach_daemons(calibrated, lab_id):
    """The calibrated quota is the node's, the kernel throttles crypto in the node to it (its
    CPU time per elapsed second never above the quota), and the masks reach a daemon. How close
    the node's rate comes to the Pi figure moves with the host: bench/cpu_calibrate.py."""
    from lab.substrate.local.lab import Lab
    from lab.substrate.local.build import up
    from lab.model.topology import load_topology

    lab = up(load_topology(REPO / "topologies" / "pi_pair.py"), lab_id)
    try:
        cpu = lab.status()["nodes"]["client"]["cpu"]
        assert cpu["profile"] == "pi4" and cpu["calibrated"]
        # one Pi core per thread (one capped group per board core), all four for the node
        # (scaled to fit this machine: both nodes' 4 cores may not fit in 90 % of its cores)
        assert cpu["slots"] == 4
        assert cpu["slot_cores"] == pytest.approx(calibrated["core_share"], rel=1e-4)
        assert cpu["cores"] == pytest.approx(4 * calibrated["core_share"] * cpu["scale"], rel=1e-3)
        assert cpu["single_thread_vs_board"] == pytest.approx(1.0)
        assert cpu["coverage"]["kernel"]["masked"] is False
        assert Lab.open(lab_id).info["nodes"]["client"]["cpu"]["core_share"] == cpu["core_share"]
        node = lab.node("client")
        prof = load_cpu_profile("pi4")
        rel = lab.runtime["client"].cgroup
        # the kernel holds whole microseconds per CFS period (10 ms): rounding <= 0.5 / period
        tick = 0.5 / cpu["period_us"] + 1e-9
        assert cpu["period_us"] == 10_000
        assert kernel_quota_cores(lab.cg, rel) == pytest.approx(cpu["cores"], abs=tick)
        # openssl speed is one thread: what holds it is one core's group
        quota = cpu["slot_cores"]
        cores = [f"{rel}/core{i}" for i in range(4)]
        for c in cores:
            assert kernel_quota_cores(lab.cg, c) == pytest.approx(quota, abs=tick)

        def throttled():
            return sum(cgroups.throttling(lab.cg, c).get("nr_throttled", 0) for c in cores)

        throttled0 = throttled()
        for prim in ("aes-128-gcm", "chacha20-poly1305"):
            rates = []
            used0, t0 = cgroups.usage(lab.cg, rel)["total"], time.monotonic()
            for _ in range(3):
                cp = node.run(
                    [
                        "openssl",
                        "speed",
                        "-elapsed",
                        "-mr",
                        "-evp",
                        prim,
                        "-bytes",
                        "16384",
                        "-seconds",
                        "1",
                    ],
                    timeout=60,
                )
                count, secs = parse_openssl_mr(cp.stderr + cp.stdout)
                rates.append(count * 16384 / secs / 1e6)
            # the node's CPU time per wall-clock second over the three runs, by its cgroup
            share = (cgroups.usage(lab.cg, rel)["total"] - used0) / (time.monotonic() - t0)
            why = (prim, f"{share:.3f} of a core, quota {quota:.3f}", "MB/s:", rates)
            assert all(r > 0 for r in rates), why  # the crypto ran
            assert share <= quota * (1 + CAP_SLOP), why  # the cap holds
        # and it was the quota that held them there, not a busy host
        assert throttled() > throttled0

        # masks reach a daemon started in the node (its environ, read from /proc)
        d = node.spawn("envprobe", ["sleep", "60"])
        try:
            # nsenter execs sleep under the same PID; read environ once the exec is done. The
            # kernel names the task (comm) before it lays out the new stack's environment, so
            # comm == "sleep" alone can still read an empty environ: wait for both.
            deadline = time.monotonic() + 5
            while True:
                comm = Path(f"/proc/{d.pid}/comm").read_text().strip()
                raw = Path(f"/proc/{d.pid}/environ").read_bytes()
                if comm == "sleep" and raw:
                    break
                assert time.monotonic() < deadline, f"daemon never became sleep ({comm})"
                time.sleep(0.01)
            environ = dict(kv.split("=", 1) for kv in raw.decode().split("\0") if "=" in kv)
            assert environ["OPENSSL_ia32cap"] == prof.env["OPENSSL_ia32cap"]
            assert environ["GODEBUG"] == prof.env["GODEBUG"]
            assert f"/lab/{lab_id}/client" in Path(f"/proc/{d.pid}/cgroup").read_text()
        finally:
            node.stop(d)
    finally:
        from lab.core.teardown import teardown

        teardown(lab_id)
    assert lab_traces(lab_id) == []
