"""`lab calibrate`'s data plane rows: the share of this host's CPU each data plane's group gets
(lab.model.boardkernel) and a check that a group capped at it runs the primitive at the board's
figure.

One core_share fitted over every primitive prices some of them badly on a given host CPU (on an
AMD EPYC AES-256-CBC ran 21-32 % slow and AES-256-GCM 20-27 % fast under it). A data plane's
process is therefore capped at a share of its own: the board's figure for its dominant primitive
(OpenSSL's for a userspace data plane the board runs too, the board kernel's code for a kernel
data plane a stand-in imitates) over this host's masked rate of the code the process really
runs. The share is exact by construction on the calibration's own measurement; what the rows
check is that a real CFS-capped group delivers it: `openssl speed -elapsed` (tools/gobench for
Go) in a throwaway group capped at the share, against the board's figure (`residual`).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from lab.core import cgroups
from lab.campaign import calibstandin
from lab.model.boardkernel import share_of
from lab.model.cpuprofile import PRIMITIVES, CpuProfile
from lab.model.dilation import cfs_period_us

#: tools whose primitives a data plane's process runs and the calibration can measure here
MEASURABLE = ("openssl", "go")


#: kernel data plane -> the daemon that stands in for it here
KERNEL_STAND_INS = {"xfrm-esp": "charon", "wireguard": "wireguard-go"}


def pairs(prof: CpuProfile) -> list[tuple[str, str, str, str]]:
    """(data plane, daemon, its primitive here, the board's reference) for every data plane the
    profile implies: each [kernel.dataplane.NAME.crypto] entry with a stand-in, and every
    process of calibstandin.PROCESSES whose primitive has a board figure."""
    out = []
    for dp in prof.kernel.dataplanes.values() if prof.kernel else ():
        daemon = KERNEL_STAND_INS.get(dp.name)
        if daemon:
            out += [(f"kernel {dp.name}", daemon, p, ref) for p, ref in dp.crypto.items()]
    out += [
        ("userspace", daemon, p, p)
        for daemon, p in calibstandin.PROCESSES
        if p in prof.references and PRIMITIVES[p]["tool"] in MEASURABLE
    ]
    return out


def shares(
    prof: CpuProfile,
    host_mbps: dict[str, float],
    *,
    verify: Callable[[str, float], float] | None = None,
    processes: dict | None = None,
    core_share: float | None = None,
) -> list[dict]:
    """One row per pair(): the board's figure, this host's rates (the primitive alone and the
    process as a whole: `processes`, lab/campaign/calibstandin.py), the share
    (lab.model.boardkernel.share_of) and, for a share worked out from the primitive alone,
    with `verify` (primitive, share -> MB/s elapsed in a group capped at share) the capped rate
    and its residual against the board's figure."""
    rows = []
    processes = processes or {}
    # the fitted share (calibrate passes it; the profile's own is a placeholder until then)
    cs = core_share or prof.core_share
    for dp, daemon, prim, ref_name in pairs(prof):
        ref = prof.references[ref_name]
        rec = processes.get(f"{daemon}:{prim}") or {}
        proc = rec.get("host_mbps")
        # the board's own packet path, where the profile states it (lab.model.boardkernel): the
        # board kernel's for a stand-in, the program's own for a userspace data plane
        kernel_dp = dp.removeprefix("kernel ") if dp.startswith("kernel ") else None
        if kernel_dp:
            kdp = prof.kernel.dataplanes.get(kernel_dp) if prof.kernel else None
            board_path, what = (kdp.path if kdp else None), "board kernel"
        else:
            udp = prof.userspace.get(daemon)
            board_path, what = (udp.path if udp else None), "board userspace"
        pps = board_path.pps.get(prim) if board_path else None
        path = pps * (rec.get("size") or board_path.bytes) / 1e6 if pps else None
        share, how = share_of(cs, ref.mbps, proc, host_mbps.get(prim), path, what)
        row = {
            "dataplane": dp,
            "daemon": daemon,
            "primitive": prim,
            "board_reference": ref_name,
            "board_mbps": ref.mbps,
            "implementation": ref.implementation,
            "kernel": ref.kernel,
            "confidence": ref.confidence,
            "source": ref.source,
            "host_mbps": host_mbps.get(prim),
            "process_mbps": proc,
            "share": round(share, 5),
            "vs_core_share": round(share / cs, 3),
            **how,
        }
        if how["basis"] == "core_share":
            row["skipped"] = f"{prim} not measured on this machine"
        elif how["basis"] == "primitive" and verify is not None:
            capped = verify(prim, share)
            row.update(capped_mbps=round(capped, 2), residual=round(capped / ref.mbps - 1, 4))
        rows.append(row)
    return rows


def capped_runner(
    measure: Callable[..., object], seconds: int, say: Callable[[str], None]
) -> Callable[[str, float], float]:
    """A `verify` for shares(): runs `measure(primitive, seconds, preexec)` (an object with
    elapsed_mbps) in a throwaway cgroup `lab/calib-dp-<pid>` capped at the share (the CFS period
    a lab's node would get for it), removed afterwards."""
    layout = cgroups.probe()

    def run(prim: str, share: float) -> float:
        rel = f"lab/calib-dp-{os.getpid()}"
        try:
            cgroups.ensure_dir(layout, "lab")
            cgroups.ensure_dir(layout, rel)
            cgroups.weigh_lab(layout, "lab", rel, capped=True)  # as a capped lab's
            period = cfs_period_us(1.0, min_share=share)
            cgroups.set_cpu(layout, rel, share, cgroups.all_cpus(layout), period_us=period)
            files = cgroups.procs_files(layout, rel)
            m = measure(prim, seconds, lambda: cgroups.join(files))
            say(f"data plane share {share:.4f} cores, {prim}: {m.elapsed_mbps:.1f} MB/s elapsed")
            return m.elapsed_mbps
        finally:
            cgroups.remove_dir(layout, rel)

    return run
