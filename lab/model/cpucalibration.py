"""This machine's calibration of CPU profiles: where `lab calibrate` keeps its results (one
JSON file per profile, machine-local), whether a file still holds for a profile (its schema, the
profile's fingerprint, this CPU, a sane core_share) and, if so, its core_share merged into the
profile; and how well one fitted core_share imitates the board (fit_quality). Pure data and
arithmetic over files; knows a profile only by the attributes it reads (lab.model.cpuprofile's
CpuProfile: name, fingerprint(), core_share, calibrated, calibration, uncalibrated_reason).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

CALIBRATION_DIR = Path("/var/lib/lab/calibration")
CALIBRATION_SCHEMA = 1
#: |residual| above which a calibration's fit is called poor (docs/cpu.md "Fit quality"): one
#: core_share cannot make every primitive run at the board's published speed on this host, and
#: results of VPNs using that primitive are off by about that much
RESIDUAL_THRESHOLD = 0.25
#: bounds of a core_share, in a profile file or fitted (host cores per board core)
CORE_SHARE_MAX = 64.0


def calibration_dir() -> Path:
    """Machine-local calibration results (LAB_CALIBRATION_DIR overrides, e.g. for tests)."""
    return Path(os.environ.get("LAB_CALIBRATION_DIR") or CALIBRATION_DIR)


def host_cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def calibration_path(name: str) -> Path:
    return calibration_dir() / f"{name}.json"


def core_share_ok(share) -> bool:
    """A usable core_share: a number in (0, CORE_SHARE_MAX] host cores per board core."""
    return (
        isinstance(share, int | float)
        and not isinstance(share, bool)
        and 0 < share <= CORE_SHARE_MAX
    )


def apply_calibration(prof) -> None:
    """Merge this machine's calibration of `prof` (a CpuProfile) into it if the file still
    holds; otherwise mark it uncalibrated and say why."""
    path = calibration_path(prof.name)
    hint = f"run `sudo lab calibrate {prof.name}`"
    try:
        cal = json.loads(path.read_text())
    except FileNotFoundError:
        prof.calibrated = False
        prof.uncalibrated_reason = f"no calibration on this machine ({path}); {hint}"
        return
    except (OSError, ValueError) as e:
        prof.calibrated = False
        prof.uncalibrated_reason = f"calibration file {path} unreadable ({e}); {hint}"
        return
    why = None
    if cal.get("schema") != CALIBRATION_SCHEMA:
        why = f"schema {cal.get('schema')!r} is not {CALIBRATION_SCHEMA}"
    elif cal.get("profile_fingerprint") != prof.fingerprint():
        why = "the profile's references or masks changed since"
    elif cal.get("host", {}).get("cpu_model") != host_cpu_model():
        why = f"it was made on another CPU ({cal.get('host', {}).get('cpu_model')!r})"
    elif not core_share_ok(cal.get("core_share")):
        why = f"its core_share {cal.get('core_share')!r} is outside (0, {CORE_SHARE_MAX:g}]"
    if why:
        prof.calibrated = False
        prof.uncalibrated_reason = f"calibration {path} is stale: {why}; {hint}"
        return
    prof.core_share = float(cal["core_share"])
    prof.calibrated = True
    prof.calibration = {
        "file": str(path),
        "created": cal.get("created"),
        "mode": cal.get("mode"),
        "residuals": cal.get("residuals", {}),
        "max_abs_residual": cal.get("max_abs_residual"),
        # this host's masked rate of every primitive measured (MB/s per CPU second): what a data
        # plane's share is worked out from (lab.model.boardkernel.plan)
        "host_mbps": host_rates(cal),
        # data plane processes as a whole ("DAEMON:PRIMITIVE" -> MB/s per host CPU second;
        # lab/campaign/calibstandin.py)
        "process_mbps": {
            k: v["host_mbps"]
            for k, v in (cal.get("processes") or {}).items()
            if isinstance(v, dict) and v.get("host_mbps")
        },
        # the datagram size each was measured with (a board packet path is spread over it)
        "process_bytes": {
            k: v["size"]
            for k, v in (cal.get("processes") or {}).items()
            if isinstance(v, dict) and isinstance(v.get("size"), int) and v["size"] > 0
        },
        # judged again with today's threshold, so that older files say it too
        "fit": fit_quality(cal.get("residuals") or {}, profile=prof.name),
    }


def host_rates(cal: dict) -> dict[str, float]:
    """{primitive: this host's masked MB/s per CPU second} from a calibration record: fitted
    primitives' best rounds and the informational ones (measured, no board reference)."""
    out = {}
    for p, m in (cal.get("measured") or {}).items():
        best = (m or {}).get("best") or {}
        if isinstance(best.get("cpu_mbps"), int | float) and best["cpu_mbps"] > 0:
            out[p] = float(best["cpu_mbps"])
    for p, m in (cal.get("informational") or {}).items():
        v = (m or {}).get("host_cpu_mbps")
        if p not in out and isinstance(v, int | float) and v > 0:
            out[p] = float(v)
    return out


def fit_quality(
    residuals: dict[str, float], *, profile: str = "", threshold: float = RESIDUAL_THRESHOLD
) -> dict:
    """How well one fitted core_share imitates the board on this host, in numbers and words.

    A residual r = fitted board speed / the board's published figure - 1: under the fitted cap
    the primitive runs (1 + r) times as fast as on the board, so results of a VPN whose crypto
    is that primitive (in userspace, in a capped node) overstate (r > 0) or understate (r < 0)
    the board's throughput by about |r|. Above `threshold` the fit is called poor: `warnings`
    say so per primitive, worst first, and `warning` is all of it in one sentence.
    """
    res = {p: float(r) for p, r in residuals.items() if r is not None}
    poor = sorted((p for p in res if abs(res[p]) > threshold), key=lambda p: -abs(res[p]))
    worst = max(res, key=lambda p: abs(res[p])) if res else None
    board = f"the {profile} figure" if profile else "the board's figure"
    warnings = []
    for p in poor:
        r = res[p]
        pct = f"{abs(r) * 100:.0f} %"
        warnings.append(
            f"{p} runs {pct} {'faster' if r > 0 else 'slower'} than {board} under the fitted "
            f"cap: results of profiles using it will {'overstate' if r > 0 else 'understate'} "
            f"{profile or 'board'} throughput by about {pct}"
        )
    warning = None
    if warnings:
        warning = (
            f"poor CPU calibration fit{f' for {profile}' if profile else ''} on this machine "
            f"(|residual| above {threshold:.0%} for {', '.join(poor)}): " + "; ".join(warnings)
        )
    return {
        "threshold": threshold,
        "residuals": {p: round(r, 4) for p, r in res.items()},
        "max_abs_residual": round(abs(res[worst]), 4) if worst else None,
        "worst": worst,
        "above_threshold": bool(poor),
        "poor": poor,
        "warnings": warnings,
        "warning": warning,
    }
