"""A lab's CPU plan: each host's cpu= resolved into cgroup quotas, per-core groups and masks,
fitted onto this machine (docs/cpu.md), and the per-lab balancer of the core groups started.

cpuprofile.py holds the profiles (pure data); this module turns them into what lab.substrate.local.lab builds.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

from lab.core import cgroups, proc
from lab.model.cpuprofile import MASK_VARS, CpuProfile, load_cpu_profile
from lab.model.dilation import MAX_DILATION, auto_factor
from lab.core.errors import ConfigError, PreconditionError
from lab.model.graph import shortest_path
from lab.model.labspec import LabSpec
from lab.core.state import lab_dir, write_json_atomic

# ---------------------------------------------------------------------- fitting to the host

#: share of the host's cores that capped nodes may be given together; the rest is left for the
#: lab's own processes (impairment engine, measurement tools outside nodes, the kernel's softirqs)
HOST_BUDGET_FRACTION = 0.9
#: below this share of what its profile asks for, a node no longer represents the board at all
MIN_SCALE = 0.25
#: the smallest CFS quota the kernel accepts is 1 ms per period; below ~1 % results are noise
MIN_QUOTA_CORES = 0.01


def doc_ref(warning: str) -> str:
    """Where docs/cpu.md explains a warning of `lab up` ("Warnings at `lab up`"): the CLI prints
    the warning's first clause and this pointer, lab.json keeps the whole text."""
    return f"(docs/cpu.md#warning-{warning})"


def scale_to_host(plan: dict[str, dict], host_cores: int) -> list[str]:
    """Fit the capped nodes of `plan` (node -> cpu dict, as cpu_plan builds it) onto this machine.

    Decision (docs/cpu.md "Many boards on a small machine"): the speed of one board core is kept
    exact (core_share host cores per board core) as long as the sum of all capped nodes' quotas
    fits within HOST_BUDGET_FRACTION of the host; beyond that every profile node is scaled by the
    same factor, so all nodes stay equally fast relative to each other and the shortfall is stated
    (`scale`, `board_cores_emulated`, `share_of_board`, `single_thread_vs_board`). A request that
    would leave a node less than MIN_SCALE of its profile, or below the kernel's smallest quota, is
    refused with PreconditionError. Explicit core fractions (cpu=0.5) are never scaled, only checked.
    Mutates `plan` in place; returns warnings.
    """
    warnings: list[str] = []
    budget = host_cores * HOST_BUDGET_FRACTION
    fixed = {n: p for n, p in plan.items() if p.get("cores") is not None and not p.get("profile")}
    prof = {n: p for n, p in plan.items() if p.get("cores") is not None and p.get("profile")}
    for n, p in fixed.items():
        if p["cores"] > host_cores:
            raise PreconditionError(
                f"node {n}: cpu={p['cores']} cores but this machine has {host_cores}; "
                f"use at most {host_cores} or a CPU profile"
            )
    fixed_sum = sum(p["cores"] for p in fixed.values())
    want = sum(p["cores"] for p in prof.values())
    room = budget - fixed_sum
    scale = 1.0
    # time dilation (lab.model.dilation): quotas arrive divided by d, and so does one board core
    d = max([p.get("dilation", 1.0) for p in plan.values()] or [1.0])
    if prof and want > room:
        scale = room / want if room > 0 else 0.0
        # the factor at which every node would get all its cores (the same quotas, undivided)
        fits = auto_factor((want + fixed_sum) * d, budget)
        dilate = (
            f"; or run the experiment time-dilated (`-p dilation={fits:g}` or `dilation=auto` to "
            f"`lab up`, `dilation = {fits:g}` in a plan's [topology]): every node then gets all "
            f"its board's cores, the run takes {fits:g} times as long"
        )
        if scale < MIN_SCALE or any(p["cores"] * scale < MIN_QUOTA_CORES for p in prof.values()):
            need = (want * MIN_SCALE + fixed_sum) / HOST_BUDGET_FRACTION
            raise PreconditionError(
                f"this machine cannot honour the CPU request: {len(prof)} profile node(s) want "
                f"{want:.2f} host cores (plus {fixed_sum:.2f} fixed) but {host_cores} cores leave "
                f"{room:.2f} for them, {scale:.0%} of what they need (minimum {MIN_SCALE:.0%}); use "
                f"fewer capped nodes, a profile with fewer emulated_cores, or a machine with at "
                f"least {need:.1f} cores"
                + (f'{dilate} (docs/cpu.md "Time dilation")' if fits < MAX_DILATION else "")
            )
        if all(p.get("slots") and p["cores"] * scale >= p["core_share"] / d for p in prof.values()):
            warnings.append(
                f"CPU profiles scaled to {scale:.0%} of their boards' cores to fit {host_cores} "
                "host cores: every profile node keeps one board core's speed per thread, so "
                "multi-threaded data planes (wireguard-go, several daemons at once) are "
                "under-provisioned by that much (the nodes' cpu.board_cores_emulated in `lab "
                f"status --json`){dilate} {doc_ref('scaled-to-fit')}"
            )
        else:
            warnings.append(
                f"CPU profiles scaled to {scale:.0%} of their boards' CPU time to fit "
                f"{host_cores} host cores (the nodes' cpu.scale in `lab status --json`){dilate} "
                + doc_ref("scaled-to-fit")
            )
    for p in prof.values():
        # one board core's worth of host CPU in the (dilated) experiment
        share = p["core_share"] / p.get("dilation", 1.0)
        quota = p["cores"] * scale
        p["scale"] = round(scale, 4)
        p["cores"] = quota
        p["board_cores_emulated"] = round(quota / share, 3)
        p["share_of_board"] = round(quota / share / p["board_cores"], 4)
        if p.get("slots"):
            # one group per board core: a thread never beyond one board core, whatever the
            # node's total; scaling takes cores away from the node before it slows a core
            p["slot_cores"] = round(min(share, quota), 6)
            p["single_thread_vs_board"] = round(p["slot_cores"] / share, 3)
        else:
            # a single thread can use at most one host core, however large the quota
            p["single_thread_vs_board"] = round(min(1.0, quota) / share, 3)
    if fixed_sum > budget:
        warnings.append(
            f"fixed CPU caps add up to {fixed_sum:.2f} of {host_cores} host cores: nodes will "
            f"compete and may not get their caps {doc_ref('fixed-caps')}"
        )
    return warnings


def dilate(plan: dict[str, dict], requested: float | str, host_cores: int) -> float:
    """Resolve the lab's time dilation and divide every capped node's quota by it (docs/cpu.md
    "Time dilation"); returns the factor. "auto": the smallest factor (lab.model.dilation.AUTO_STEP
    steps) at which every profile node gets all its board cores at one board core's speed each,
    fixed caps included, within HOST_BUDGET_FRACTION of the host; 1.0 when they fit already.
    Each capped node's dict gets `dilation` and keeps its undivided quota as `cores_undilated`;
    scale_to_host then works on the divided quotas (and divides core_share by the factor)."""
    capped = [p for p in plan.values() if p.get("cores") is not None]
    if requested == "auto":
        want = sum(p["cores"] for p in capped)
        d = auto_factor(want, host_cores * HOST_BUDGET_FRACTION)
    else:
        d = float(requested)
    for p in capped:
        p["cores_undilated"] = p["cores"]
        p["cores"] = p["cores"] / d
        p["dilation"] = d  # lab._build stretches the CFS period by it (dilation.cfs_period_us)
    return d


def plan_entry(prof: CpuProfile) -> dict:
    """The cpu dict of one node using `prof`, before scale_to_host; goes into lab.json/status."""
    entry = {
        "profile": prof.name,
        "cores": prof.quota_cores,
        "board_cores": prof.cores,
        "emulated_cores": prof.emulated_cores if prof.capped else None,
        # one capped group per board core when the node has more than one (lab/substrate/local/coreslots.py);
        # cpu_plan sets 0 with the reason where this machine cannot
        "slots": math.ceil(prof.emulated_cores) if prof.capped and prof.emulated_cores > 1 else 0,
        "core_share": prof.core_share,
        "calibrated": prof.calibrated,
        # None = removed from the inherited environment (lab.core.node.merged_env)
        "env": {**{v: None for v in MASK_VARS if v not in prof.env}, **prof.env},
        "coverage": coverage(prof),
    }
    if prof.nic_latency_us:
        # one traversal of the board's NIC; lab.substrate.local.lab adds it per hop of the VPN path (nic_path)
        entry["nic_latency_us"] = prof.nic_latency_us
    if prof.os:
        entry["os"] = dict(prof.os)
        entry["os_source"] = prof.os_source
    if prof.calibration:
        entry["calibration"] = prof.calibration
    return entry


# ---------------------------------------------------------------------- what it covers


def coverage(profile: CpuProfile) -> dict:
    """Which crypto the profile's cap and masks really cover, stated for result manifests."""
    masked_ossl = "OPENSSL_ia32cap" in profile.env
    masked_go = "GODEBUG" in profile.env and "cpu." in profile.env["GODEBUG"]
    capped = profile.capped
    return {
        "userspace_openssl": {
            "used_by": ["OpenVPN", "strongSwan openssl plugin (charon, kernel-libipsec ESP)"],
            "masked": masked_ossl,
            "quota_scaled": capped,
            "how": "OPENSSL_ia32cap in every process of the node" if masked_ossl else "not masked",
        },
        "userspace_go": {
            "used_by": ["wireguard-go (golang.org/x/crypto)"],
            "masked": masked_go,
            "quota_scaled": capped,
            "how": "GODEBUG cpu.* options in every process of the node"
            if masked_go
            else "not masked",
        },
        "kernel": {
            "used_by": ["kernel WireGuard", "XFRM ESP", "MACsec", "dm-crypt"],
            "masked": False,
            "quota_scaled": "partial" if capped else False,
            "how": (
                "not maskable per namespace: the kernel uses the host's AES-NI/AVX whatever the "
                "node's environment; only crypto done in the node's process context (e.g. ESP "
                "output of locally sent packets) is charged to its cgroup, softirq and kworker "
                "work (kernel WireGuard's encryption workers, received packets) is not"
            ),
        },
    }


def congestion_control_refused(cc: str) -> str | None:
    """Why a node's network namespace cannot default to TCP congestion control `cc`, or None.
    Outside the initial namespace the kernel accepts only algorithms of the machine-wide
    net.ipv4.tcp_allowed_congestion_control list (./setup.sh adds the boards' cubic to it)."""
    proc_dir = Path("/proc/sys/net/ipv4")
    try:
        allowed = (proc_dir / "tcp_allowed_congestion_control").read_text().split()
    except OSError:
        return None
    if cc in allowed:
        return None
    return (
        f"the kernel lets namespaces use only net.ipv4.tcp_allowed_congestion_control "
        f"({' '.join(allowed)}); `sudo ./setup.sh` adds {cc} to it, or "
        f"`sysctl -w net.ipv4.tcp_allowed_congestion_control='{' '.join([*allowed, cc])}'`"
    )


def cpu_plan(
    spec: LabSpec, layout: cgroups.CgroupLayout | None, substrate: dict
) -> tuple[dict[str, dict], list[str]]:
    """Resolve each host's cpu= into cgroup settings; returns (per-node plan, warnings).
    `substrate`: what the lab runs on (lab.substrate.local.lab.current_substrate()). Sets `spec.dilation` to the
    factor in force ("auto" resolved: dilate())."""
    plan, warnings = {}, []
    host_cores = os.cpu_count() or 1
    for n in spec.hosts():
        if n.cpu is None:
            plan[n.name] = {"profile": None, "cores": None, "env": {}}
        elif isinstance(n.cpu, float):
            plan[n.name] = {"profile": None, "cores": n.cpu, "env": {}}
        else:
            prof = load_cpu_profile(n.cpu)
            if not prof.calibrated:
                warnings.append(
                    f"CPU profile {prof.name!r} is uncalibrated on this machine (core_share "
                    f"{prof.core_share} is a placeholder): {prof.uncalibrated_reason} "
                    + doc_ref("uncalibrated")
                )
            elif ((prof.calibration or {}).get("fit") or {}).get("warning"):
                # the quota is fitted, but some primitives run well off the board's speed here;
                # its text as the calibration wrote it (no doc_ref): the report says it once by
                # that text, from the node's cpu record and from lab_warnings alike
                warnings.append(prof.calibration["fit"]["warning"])
            plan[n.name] = plan_entry(prof)
            why_not = cgroups.slots_supported(layout) if plan[n.name]["slots"] and layout else None
            if why_not:
                # without per-core groups a quota of several board cores would let one thread
                # run on a whole host core: keep one board core, exact for a single thread
                plan[n.name].update(cores=prof.core_share, emulated_cores=1.0, slots=0)
                plan[n.name]["per_core_not_applied"] = why_not
                warnings.append(
                    f"CPU profile {prof.name!r}: nodes get one of the board's {prof.cores} cores, "
                    f"not all of them ({why_not}) {doc_ref('one-board-core')}"
                )
            cc = (plan[n.name].get("os") or {}).get("net.ipv4.tcp_congestion_control")
            why = congestion_control_refused(cc) if cc else None
            if why:
                del plan[n.name]["os"]["net.ipv4.tcp_congestion_control"]
                plan[n.name]["os_not_applied"] = {"net.ipv4.tcp_congestion_control": why}
                warnings.append(
                    f"CPU profile {prof.name!r}: TCP congestion control {cc!r} not set in the "
                    f"nodes, which keep this machine's: {why} {doc_ref('congestion-control')}"
                )
    sub = substrate
    tcg = sub.get("kind") == "vm" and sub.get("accelerator") == "tcg"
    # no quota applies under TCG, so "auto" has nothing to fit: 1; a given factor still holds
    spec.dilation = dilate(
        plan, 1.0 if tcg and spec.dilation == "auto" else spec.dilation, host_cores
    )
    if spec.dilation != 1.0:
        warnings.append(
            f"time-dilated x{spec.dilation:g}: CPU quotas, link and impairment rates / "
            f"{spec.dilation:g}, delays and test durations x {spec.dilation:g}, results scaled "
            "back; kernel timers and uncapped kernel packet work do not dilate "
            + doc_ref("time-dilated")
        )
    if tcg:
        # QEMU TCG emulates the CPU in software, many times slower than the host: a quota
        # calibrated on the host would make a node far slower than a board, and no figure from
        # this lab is performance evidence anyway. Masks (env) still apply: same code paths.
        capped = [n for n, p in plan.items() if p.get("cores") is not None]
        for n in capped:
            plan[n]["cores"] = None
            plan[n]["slots"] = 0
            plan[n]["not_applied"] = "TCG"
        if capped:
            # no host-calibrated quota applies: neither its absence nor its fit matters
            warnings = [
                w for w in warnings if "uncalibrated" not in w and "calibration fit" not in w
            ]
            warnings.append(
                f"CPU caps not applied to {', '.join(capped)}: the lab runs in a VM under TCG "
                "(software CPU emulation), where a host-calibrated quota means nothing; "
                f"profile masks still apply {doc_ref('no-cap-under-tcg')}"
            )
        return plan, list(dict.fromkeys(warnings))
    # fit the capped nodes onto this machine (or refuse); see scale_to_host
    warnings += scale_to_host(plan, host_cores)
    return plan, list(dict.fromkeys(warnings))


def start_core_balancer(lab_id, layout, info, ledger) -> None:
    """One balancer per lab spreads the busy threads of nodes with per-core groups over them
    (lab/substrate/local/coreslots.py); recorded like any daemon, so teardown ends it by PID."""
    nodes = {
        name: {
            "group": str(cgroups.cpu_dir(layout, r["cgroup"])),
            "slots": r["cpu_slots"],
            "slot_cores": r["cpu"]["slot_cores"],
        }
        for name, r in info["nodes"].items()
        if r.get("cpu_slots")
    }
    # a data plane spread over several groups (lab/substrate/local/dataplane.py) is balanced
    # over them the same way, apart from the board's cores
    nodes.update(
        {
            f"{name}:dataplane": {
                "group": "",
                "slots": r["dp_slots"],
                "slot_cores": r["cpu"]["dataplane"]["group_cores"],
            }
            for name, r in info["nodes"].items()
            if len(r.get("dp_slots") or []) > 1
        }
    )
    if not nodes:
        return
    cfg = lab_dir(lab_id) / "coreslots.json"
    write_json_atomic(cfg, {"nodes": nodes})
    log = lab_dir(lab_id) / "logs" / "coreslots.log"
    ledger.record("process-intent", node=None, name="coreslots")
    with open(log, "ab") as out:
        p = proc.spawn(
            [sys.executable, "-m", "lab.substrate.local.coreslots", str(cfg)],
            stdout=out,
            stderr=out,
        )
    st = proc.proc_start_time(p.pid)
    ledger.record("process", node=None, name="coreslots", pid=p.pid, start_time=st)
    info["core_balancer"] = {"pid": p.pid, "start_time": st, "config": str(cfg)}


# ---------------------------------------------------------------------- the boards' NICs


#: why "auto" leaves the NIC latency out on a kernel without netem (docs/cpu.md "A board model")
NO_NETEM = (
    "this kernel has no sch_netem ({reason}); `-p nic_latency=on` applies it with the lab's "
    "userspace engine (one bump per link, ~0.2 engine cores per Gbit/s)"
)


def nic_path(spec: LabSpec, cpu: dict[str, dict]) -> dict[str, dict]:
    """Per direction of the VPN path ("client->server", "server->client"): the one-way latency
    the boards' NICs add, the sum over the path's hops of the sending and the receiving node's
    `nic_latency_us` (their profile's [link]). A node without one (a router standing for another
    machine, `cpu=host`, a fraction of a core, a switch) adds 0: its real counterpart's NIC is
    not the boards' and is not modelled. `cpu`: cpu_plan's per-node dicts (plan_entry)."""
    a, b = spec.endpoints("vpn")
    path = shortest_path(spec.nodes, spec.links, a, b) or []

    def nic(node: str) -> float:
        return float((cpu.get(node) or {}).get("nic_latency_us") or 0.0)

    out = {}
    for name, hops in ((f"{a}->{b}", path), (f"{b}->{a}", [(i, t, f) for i, f, t in path[::-1]])):
        rows = [{"from": f, "to": t, "us": nic(f) + nic(t)} for _i, f, t in hops]
        out[name] = {"us": round(sum(r["us"] for r in rows), 3), "hops": rows}
    return out


def nic_decision(
    mode: str, path: dict[str, dict], netem=None, *, engine_anyway: bool = False
) -> tuple[dict, list[str]]:
    """Whether the boards' NIC latency is applied, recorded for lab.json and run manifests:
    (record, warnings). `mode`: the lab's nic_latency ("auto" | "on" | "off"); `path`:
    nic_path(); `netem`: a callable returning (sch_netem usable, why not), asked only when
    "auto" needs it. "auto" applies it where kernel netem is present, and where it is not but
    the lab's engine is on the path anyway (`engine_anyway`: the lab builds impairment points,
    which then run in the engine: the NICs add a delay, not the engine's CPU), and leaves it out,
    with a warning, where the lab would need its engine on every link for it; "on" applies it with
    whichever backend the lab's impairment uses; "off" never. lab.substrate.local.lab adds `backend`."""
    rec: dict = {"mode": mode, "applied": False, "directions": path, "backend": None}
    total = sum(d["us"] for d in path.values())
    if not total:
        rec["why"] = "no node on the VPN path has a CPU profile with a [link] nic_latency_us"
        return rec, []
    if mode == "off":
        rec["why"] = "nic_latency=off"
        return rec, []
    if mode == "on":
        rec.update(applied=True, why="nic_latency=on: applied by the lab's impairment backend")
        return rec, []
    ok, reason = netem() if netem is not None else (False, "not probed")
    if ok:
        rec.update(applied=True, why="nic_latency=auto: kernel netem present")
        return rec, []
    if engine_anyway:
        rec.update(
            applied=True,
            why=f"nic_latency=auto: no kernel netem ({reason}), but the lab's impairment engine "
            "is on the path for the lab's impairment anyway",
        )
        return rec, []
    rec["why"] = NO_NETEM.format(reason=reason)
    each = ", ".join(f"{k} {v['us']:g} us" for k, v in path.items())
    rec["warned"] = True  # `lab up` said it; `lab status` does not again
    return rec, [
        f"the boards' NIC latency is not applied ({each}): {rec['why']} "
        + doc_ref("nic-latency-not-applied")
    ]


def nic_point_delays(record: dict, points: list[dict], backend: str) -> dict[str, int]:
    """Microseconds each impairment point ("NODE:IFNAME") adds for the boards' NICs, so that
    each direction of the path gets its total once: split evenly over the direction's kernel
    netem points (each delays the packet), whole on each point of the engine (a middlebox
    engine's points of one direction all set that one engine direction, lab.impair.runtime
    _apply; an egress/ingress one has one point per direction). `record`: nic_decision's."""
    if not record.get("applied"):
        return {}
    totals = [d["us"] for d in record["directions"].values()]  # client->server, then back
    out = {}
    for way, total in zip(("fwd", "rev"), totals, strict=True):
        pts = [p for p in points if p["way"] == way]
        share = total / len(pts) if pts and backend == "kernel-netem" else total
        for p in pts:
            out[f"{p['node']}:{p['ifname']}"] = round(share)
    return out


def nic_latency_plan(
    spec: LabSpec, cpu: dict[str, dict], netem, *, engine_anyway: bool = False
) -> tuple[dict, list[str]]:
    """nic_decision for `spec`'s nic_latency on its VPN path (lab.substrate.local.lab._build calls it once the
    nodes exist, so that `netem` can probe one)."""
    if not any((p or {}).get("nic_latency_us") for p in cpu.values()):
        return nic_decision(spec.nic_latency, {}, netem)
    try:
        path = nic_path(spec, cpu)
    except ConfigError as e:  # no VPN path to put it on (ends not marked): said, not fatal
        rec, _ = nic_decision(spec.nic_latency, {}, netem)
        rec["why"] = f"no VPN path to add it to: {e}"
        rec["warned"] = True
        return rec, [
            f"the boards' NIC latency is not applied: {rec['why']} "
            + doc_ref("nic-latency-not-applied")
        ]
    return nic_decision(spec.nic_latency, path, netem, engine_anyway=engine_anyway)


def nic_to_points(record: dict, impair_state: dict) -> None:
    """Put the applied NIC latency on the lab's impairment points (lab.json's impair record:
    `nic_us`, kept under every spec by lab.impair.runtime) and record the backend."""
    if record.get("applied"):
        record["backend"] = impair_state["backend"]
        impair_state["nic_us"] = nic_point_delays(
            record, impair_state["points"], impair_state["backend"]
        )
