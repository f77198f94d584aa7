"""`lab calibrate PROFILE`: fit a CPU profile's core_share on this machine and verify it.

1. measure this machine's single-core throughput of each reference primitive with the profile's
   masks applied (openssl speed; tools/gobench for Go's ChaCha20-Poly1305);
2. fit core_share (host cores per board core) by weighted least squares of the log ratios
   ln(core_share * measured / reference), and report each primitive's residual; above
   RESIDUAL_GOAL the fit is poor on this host and the record's `fit` says which primitive, how
   far, and what that means for results (cpucalibration.fit_quality);
3. verify: re-measure with `openssl speed -elapsed` inside a throwaway cgroup lab/calib-<pid>
   capped at one board core (removed in `finally`);
4. store the result in the machine-local calibration file that load_cpu_profile() merges in.

Throughput is measured per CPU second (the child's rusage), not per elapsed second: the CPU the
lab runs on is shared with other work, and what a cgroup quota hands out is CPU time. Each
primitive is measured in interleaved rounds and the best round is kept (least disturbed).
"""

from __future__ import annotations

from lab import REPO
import json
import math
import os
import platform
import resource
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from lab.campaign import calibdataplane, calibpacket, calibssh, calibstandin
from lab.core import cgroups, proc
from lab.substrate.local.cpuplan import coverage
from lab.model.cpucalibration import (
    CALIBRATION_SCHEMA,
    CORE_SHARE_MAX,
    RESIDUAL_THRESHOLD,
    calibration_path,
    core_share_ok,
    fit_quality,
    host_cpu_model,
)
from lab.model.cpuprofile import PRIMITIVES, CpuProfile, Reference, load_cpu_profile
from lab.core.errors import CommandError, ConfigError, LabError, PreconditionError
from lab.core.state import write_json_atomic
from lab.core.netops import check_root
from lab.model.dilation import cfs_period_us

GOBENCH = REPO / "tools" / "gobench" / "gobench"
MSG_BYTES = 16384
#: above this |residual| the fit is poor on this host and `lab calibrate` says what that means
#: for results (cpucalibration.fit_quality; docs/cpu.md "Fit quality")
RESIDUAL_GOAL = RESIDUAL_THRESHOLD
SECONDS_GOAL = 60.0
#: (rounds, seconds per openssl run, seconds per verification run)
MODES = {"full": (3, 1, 2), "quick": (2, 1, 1)}
#: MiB each ssh session sends (lab/campaign/calibssh.py), per mode: ~0.1 s of the client's CPU masked
SSH_MIB = {"full": 32, "quick": 16}
#: OpenSSL primitives measured as information even without a reference (not with --quick)
OPENSSL_INFORMATION = ("sha1",)
#: the OpenSSH primitive the scp test uses (OpenSSH's default cipher): measured even with --quick
SCP_PRIMITIVE = "ssh-chacha20-poly1305"


@dataclass
class Measurement:
    primitive: str
    bytes: int
    elapsed_s: float
    cpu_s: float

    @property
    def elapsed_mbps(self) -> float:
        return self.bytes / self.elapsed_s / 1e6 if self.elapsed_s > 0 else 0.0

    @property
    def cpu_mbps(self) -> float:
        return self.bytes / self.cpu_s / 1e6 if self.cpu_s > 0 else 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(elapsed_mbps=round(self.elapsed_mbps, 2), cpu_mbps=round(self.cpu_mbps, 2))
        return d


def measure_env(profile: CpuProfile) -> dict[str, str]:
    """The environment a capped node's processes get: ours minus stray masks, plus the profile's."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENSSL_ia32cap", "GODEBUG")}
    env.update(profile.env)
    return env


def parse_openssl_mr(text: str) -> tuple[int, float]:
    """(operations, seconds) from `openssl speed -mr` output: `+R:<count>:<name>:<seconds>`."""
    for line in text.splitlines():
        if line.startswith("+R:"):
            parts = line.split(":")
            return int(parts[1]), float(parts[-1])
    raise ValueError("no +R: line in openssl speed -mr output")


def _child_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def measure_openssl(primitive: str, env: dict[str, str], seconds: int, preexec=None) -> Measurement:
    """One `openssl speed -elapsed -evp` run. -elapsed: the rate is per wall-clock second (without
    it openssl divides by its own CPU time, which a cgroup cap does not change)."""
    evp = PRIMITIVES[primitive]["evp"]
    argv = [
        proc.require("openssl"),
        "speed",
        "-elapsed",
        "-mr",
        "-evp",
        evp,
        "-bytes",
        str(MSG_BYTES),
        "-seconds",
        str(seconds),
    ]
    c0 = _child_cpu()
    cp = proc.run(argv, env=env, timeout=seconds * 10 + 30, preexec=preexec, where="calibrate")
    cpu = _child_cpu() - c0
    try:
        count, secs = parse_openssl_mr(cp.stderr + "\n" + cp.stdout)
    except ValueError:
        raise CommandError(
            argv, cp.returncode, "unexpected output:\n" + cp.stdout + cp.stderr, where="calibrate"
        )
    return Measurement(primitive, count * MSG_BYTES, secs, cpu)


def measure_go(env: dict[str, str], seconds: int, preexec=None) -> tuple[Measurement, dict]:
    """tools/gobench: x/crypto ChaCha20-Poly1305 seal, the AEAD wireguard-go uses."""
    if not os.access(GOBENCH, os.X_OK):
        raise PreconditionError(f"{GOBENCH} is not built; ./setup.sh builds it (needs Go)")
    argv = [str(GOBENCH), "-seconds", str(seconds), "-bytes", str(MSG_BYTES)]
    cp = proc.run(argv, env=env, timeout=seconds * 10 + 30, preexec=preexec, where="calibrate")
    d = json.loads(cp.stdout)
    return Measurement("go-chacha20-poly1305", d["bytes"], d["elapsed_s"], d["cpu_s"]), d[
        "features"
    ]


def measure_ssh(
    prims: list[str], env: dict[str, str], rounds: int, mib: int, say
) -> dict[str, list[Measurement]]:
    """OpenSSH's ciphers through a real sshd (lab/campaign/calibssh.py): per round, the client's CPU for
    the payload minus its CPU for a session without one (the handshake)."""
    raw = calibssh.measure(
        {p: PRIMITIVES[p]["cipher"] for p in prims}, env, rounds=rounds, mib=mib, say=say
    )
    return {
        p: [
            Measurement(p, m["bytes"], m["elapsed_s"], m["cpu_s"] - m["handshake_cpu_s"])
            for m in ms
        ]
        for p, ms in raw.items()
    }


def ssh_primitives(prof: CpuProfile, quick: bool) -> list[str]:
    """OpenSSH primitives to measure: all (quick: scp's and the referenced ones)."""
    return [
        p
        for p, d in PRIMITIVES.items()
        if d["tool"] == "ssh" and (not quick or p == SCP_PRIMITIVE or p in prof.references)
    ]


KERNEL_NOT_MEASURED = (
    "the board kernel's code is not run here (this host's kernel uses AES-NI/AVX whatever the "
    "node's masks): its figure prices the stand-in's data plane groups instead (data planes "
    'table; docs/cpu.md "Data planes")'
)

#: every crypto implementation a data plane or test of the lab uses, with its primitives
IMPLEMENTATIONS = (
    (
        "OpenSSL",
        "OpenVPN's data channel; strongSwan's openssl plugin (charon, and ESP itself under "
        "kernel-libipsec: crypto_plugins = 'openssl kdf'); tinc 1.0",
    ),
    ("Go x/crypto", "wireguard-go (ChaCha20-Poly1305)"),
    ("OpenSSH", "the scp test (chacha20-poly1305@openssh.com unless its cipher is set)"),
    (
        "kernel",
        "kernel WireGuard, XFRM ESP and AH, MACsec (here with --vm or on boards only)",
    ),
)
_TOOL_OF = {"OpenSSL": "openssl", "Go x/crypto": "go", "OpenSSH": "ssh", "kernel": "kernel"}


def implementation_coverage(
    prof: CpuProfile, measured: dict[str, float], skipped: dict[str, str]
) -> list[dict]:
    """One row per primitive of every implementation in IMPLEMENTATIONS: measured or not, the
    profile's reference figure or none, and so fitted, unreferenced or not measured (why)."""
    rows = []
    for impl, used_by in IMPLEMENTATIONS:
        for p, d in PRIMITIVES.items():
            if d["tool"] != _TOOL_OF[impl]:
                continue
            ref = prof.references.get(p)
            if p in measured:
                status = "fitted" if ref else "unreferenced: measured and predicted, not fitted"
            elif d["tool"] == "kernel":
                status = "reference only: " + KERNEL_NOT_MEASURED if ref else "unreferenced"
            elif p in skipped:
                status = "not measured: " + skipped[p]
            else:
                status = "not measured: no reference, and no shipped data plane uses it alone"
            rows.append(
                {
                    "implementation": impl,
                    "primitive": p,
                    "used_by": used_by,
                    "measured": p in measured,
                    "reference_mbps": ref.mbps if ref else None,
                    "confidence": ref.confidence if ref else None,
                    "status": status,
                }
            )
    return rows


def fit_core_share(
    measured: dict[str, float], refs: dict[str, Reference]
) -> tuple[float, dict[str, float]]:
    """Weighted least squares on a log scale: the core_share s minimising
    sum w_i * ln(s * m_i / r_i)^2, i.e. ln s = sum w_i ln(r_i / m_i) / sum w_i.
    Returns (s, residuals) with residual_i = s * m_i / r_i - 1."""
    used = [p for p in refs if p in measured and measured[p] > 0]
    if not used:
        raise ConfigError("no reference primitive could be measured", field="reference")
    wsum = sum(refs[p].weight for p in used)
    ln_s = sum(refs[p].weight * math.log(refs[p].mbps / measured[p]) for p in used) / wsum
    s = math.exp(ln_s)
    return s, {p: s * measured[p] / refs[p].mbps - 1 for p in used}


def _versions() -> dict[str, str]:
    out = {"kernel": platform.release(), "cpu_model": host_cpu_model(), "cpus": str(os.cpu_count())}
    try:
        out["openssl"] = proc.run([proc.require("openssl"), "version"], timeout=10).stdout.strip()
    except LabError as e:  # a version string is metadata: its absence must not stop calibration
        out["openssl"] = f"unknown ({e})"
    try:
        flags = (
            next(
                line
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("flags")
            )
            .split(":", 1)[1]
            .split()
        )
        out["cpu_flags"] = " ".join(
            f
            for f in flags
            if f
            in {
                "aes",
                "pclmulqdq",
                "ssse3",
                "avx",
                "avx2",
                "avx512f",
                "sha_ni",
                "vaes",
                "vpclmulqdq",
            }
        )
    except (OSError, StopIteration):
        pass
    return out


def calibrate(
    name: str,
    *,
    quick: bool = False,
    verify: bool = True,
    store: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Calibrate profile `name` on this machine; returns (and stores) the calibration record."""
    t0 = time.monotonic()
    say = progress or (lambda s: None)
    prof = load_cpu_profile(name, merge_calibration=False)
    if not prof.capped:
        raise ConfigError(
            f"profile {name!r} is uncapped (cores = 0): nothing to calibrate",
            source=prof.path,
            field="cores",
        )
    if verify:
        check_root()
    mode = "quick" if quick else "full"
    rounds, secs, vsecs = MODES[mode]
    env = measure_env(prof)
    ossl = [p for p in prof.references if PRIMITIVES[p]["tool"] == "openssl"]
    want_go = "go-chacha20-poly1305" in prof.references or os.access(GOBENCH, os.X_OK)

    # OpenSSL primitives a data plane uses without a reference: measured as information (full)
    info = [] if quick else [p for p in OPENSSL_INFORMATION if p not in ossl]
    runs: dict[str, list[Measurement]] = {p: [] for p in ossl + info}
    go_features: dict = {}
    skipped: dict[str, str] = {}
    if want_go:
        runs["go-chacha20-poly1305"] = []
    else:
        skipped["go-chacha20-poly1305"] = f"{GOBENCH} not built (./setup.sh builds it with Go)"
    for i in range(rounds):
        for p in list(runs):
            if PRIMITIVES[p]["tool"] == "openssl":
                m = measure_openssl(p, env, secs)
            else:
                m, go_features = measure_go(env, secs)
            runs[p].append(m)
            say(f"round {i + 1}/{rounds} {p}: {m.cpu_mbps:.1f} MB/s per CPU second")
    ssh_prims = ssh_primitives(prof, quick)
    for p, d in PRIMITIVES.items():
        if quick and p not in runs and p not in ssh_prims and d["tool"] in ("openssl", "ssh"):
            skipped[p] = "--quick measures only the referenced primitives and scp's cipher"
    missing = calibssh.missing_tools()
    if missing:
        why = f"{', '.join(missing)} not installed (./setup.sh installs OpenSSH)"
        needed = [p for p in ssh_prims if p in prof.references]
        if needed:
            raise PreconditionError(f"{name} has references for {', '.join(needed)}: {why}")
        skipped.update({p: why for p in ssh_prims})
    elif ssh_prims:
        runs.update(measure_ssh(ssh_prims, env, rounds, SSH_MIB[mode], say))
    best = {p: max(ms, key=lambda m: m.cpu_mbps) for p, ms in runs.items() if ms}
    measured = {p: m.cpu_mbps for p, m in best.items()}

    unmasked = {}
    if not quick:
        # evidence the masks bite: the same primitives with the host's full instruction set
        plain = {k: v for k, v in os.environ.items() if k not in ("OPENSSL_ia32cap", "GODEBUG")}
        for p in ("aes-128-gcm", "chacha20-poly1305"):
            if p in ossl:
                unmasked[p] = round(measure_openssl(p, plain, secs).cpu_mbps, 1)

    fitted_refs = {p: r for p, r in prof.references.items() if p in measured}
    share, residuals = fit_core_share(measured, fitted_refs)
    for p in prof.references:
        if p not in measured and p not in calibpacket.primitives():  # those: per_packet below
            skipped.setdefault(
                p, KERNEL_NOT_MEASURED if PRIMITIVES[p]["tool"] == "kernel" else "not measured"
            )
    if not core_share_ok(share):
        raise PreconditionError(
            f"fitted core_share {share:.4g} is outside (0, {CORE_SHARE_MAX:g}] host cores per "
            f"board core: this machine cannot imitate {name}"
        )
    say(f"fitted core_share {share:.4f} host cores per board core")

    verification = None
    if verify:
        vprims = (
            ossl if not quick else [p for p in ("aes-128-gcm", "chacha20-poly1305") if p in ossl]
        )
        verification = verify_in_cgroup(prof, share, env, vprims, vsecs, say)

    def measure_one(prim, seconds, preexec):
        if PRIMITIVES[prim]["tool"] == "go":
            return measure_go(env, seconds, preexec=preexec)[0]
        return measure_openssl(prim, env, seconds, preexec=preexec)

    # each data plane's own share (lab/campaign/calibdataplane.py), checked in a capped group
    runner = calibdataplane.capped_runner(measure_one, vsecs, say) if verify else None
    # data plane processes as a whole (lab/campaign/calibstandin.py; root, full mode)
    processes = calibstandin.calibrate(prof, env, say) if verify and not quick else {}
    dataplanes = calibdataplane.shares(
        prof, measured, verify=runner, processes=processes, core_share=share
    )
    # per-packet kernel work (lab/campaign/calibpacket.py): a residual under the fit, never fitted
    per_packet = calibpacket.measure(prof, env, share, rounds, secs, vsecs if verify else 0, say)

    result = {
        "schema": CALIBRATION_SCHEMA,
        "profile": name,
        "profile_file": prof.path,
        "profile_fingerprint": prof.fingerprint(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "mode": mode,
        "host": _versions(),
        "env": dict(prof.env),
        "method": (
            f"openssl speed -elapsed -mr -evp P -bytes {MSG_BYTES} -seconds {secs}, {rounds} "
            "interleaved round(s), best rate per CPU second of the child; core_share = weighted "
            "least squares of ln(core_share * measured / reference); OpenSSH ciphers: "
            f"ssh -c CIPHER sending {SSH_MIB[mode]} MiB to a real sshd in a throwaway network "
            "namespace, the client's CPU time minus that of a session without payload"
        ),
        "core_share": share,
        "measured": {
            p: {"best": best[p].as_dict(), "rounds": [m.as_dict() for m in runs[p]]} for p in best
        },
        "unmasked_cpu_mbps": unmasked,
        "go_features_seen": go_features,
        "references": {
            p: {"mbps": r.mbps, "weight": r.weight, "confidence": r.confidence, "source": r.source}
            for p, r in prof.references.items()
        },
        "residuals": {p: round(r, 4) for p, r in residuals.items()},
        "max_abs_residual": round(max(abs(r) for r in residuals.values()), 4),
        "fit": fit_quality(residuals, profile=name, threshold=RESIDUAL_GOAL),
        "informational": {
            p: {
                "host_cpu_mbps": round(measured[p], 1),
                "predicted_board_mbps": round(share * measured[p], 1),
                "note": "no reference figure in the profile: measured, not fitted",
            }
            for p in measured
            if p not in prof.references
        },
        "skipped": skipped,
        "verification": verification,
        "dataplanes": dataplanes,
        "per_packet": per_packet,
        "processes": processes,
        "coverage": coverage(prof),
        "implementations": implementation_coverage(prof, measured, skipped),
        "goals": {"max_abs_residual": RESIDUAL_GOAL, "seconds": SECONDS_GOAL},
    }
    result["duration_s"] = round(time.monotonic() - t0, 1)
    if store:
        path = calibration_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, result)
        result["stored"] = str(path)
    return result


def verify_in_cgroup(
    prof: CpuProfile,
    share: float,
    env: dict[str, str],
    prims: list[str],
    seconds: int,
    say: Callable[[str], None],
) -> dict:
    """Re-measure with -elapsed inside a throwaway cgroup capped at one board core."""
    layout = cgroups.probe()
    rel = f"lab/calib-{os.getpid()}"
    out: dict = {
        "cgroup_version": layout.version,
        "cgroup": rel,
        "quota_cores": round(share, 4),
        "results": {},
        "left_over": [],
    }
    try:
        cgroups.ensure_dir(layout, "lab")  # shared parent of every lab; left in place
        cgroups.ensure_dir(layout, rel)
        cgroups.weigh_lab(layout, "lab", rel, capped=True)  # as a capped lab's
        # the CFS period a lab's nodes get (docs/cpu.md "The CFS period"), so the check runs
        # as the nodes will

        period = cfs_period_us(1.0, min_share=share)
        out["period_us"] = period
        cgroups.set_cpu(layout, rel, share, cgroups.all_cpus(layout), period_us=period)
        files = cgroups.procs_files(layout, rel)
        for p in prims:
            m = measure_openssl(p, env, seconds, preexec=lambda: cgroups.join(files))
            ref = prof.references[p].mbps
            out["results"][p] = {
                "elapsed_mbps": round(m.elapsed_mbps, 2),
                "reference_mbps": ref,
                "error": round(m.elapsed_mbps / ref - 1, 4),
                "cpu_per_elapsed": round(m.cpu_s / m.elapsed_s, 3) if m.elapsed_s else None,
            }
            if m.elapsed_s and m.cpu_s / m.elapsed_s < 0.85 * share:
                # other work on the host kept the group below its quota: slower for that reason
                out.setdefault("contended", []).append(p)
            say(f"capped {p}: {m.elapsed_mbps:.1f} MB/s elapsed (reference {ref})")
    finally:
        out["left_over"] = cgroups.remove_dir(layout, rel)
    return out
