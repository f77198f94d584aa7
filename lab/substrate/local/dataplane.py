"""A tunnel's data plane at the board's speed and with the board's threading, on this machine.

The process that carries a tunnel's packets on a node (charon's kernel-libipsec, wireguard-go,
openvpn, tincd: the driver says which, Driver.cpu_dataplane) runs in groups of its own beside
the node's board cores (`<node>/dp0` ...), as many as the board uses cores for that data plane
(one for XFRM ESP, MACsec and single-threaded daemons; all of them for kernel WireGuard and
multi-threaded daemons) and each capped at the share lab.model.boardkernel works out: one board
core running the board's code for the data plane's dominant primitive, for the stand-in's code
on this host. The node's own quota (all its board cores) stays above them, raised by what the
data plane's cores cost here beyond an ordinary board core's share: on the board those cores run
the kernel's code and the node's other work runs on the remaining cores, so the node's quota is
the sum of its cores' prices (a data plane core at the data plane's share, every other core at
core_share). docs/cpu.md "Data planes".
"""

from __future__ import annotations

import math
import os

from lab.model import boardkernel
from lab.model.cpuprofile import load_cpu_profile
from lab.substrate.local.cpuplan import doc_ref


def dataplane_plan(cpu: dict[str, dict], vpn) -> list[str]:
    """Annotate the cpu plans of the tunnel's end nodes with their data plane's groups
    (`dataplane`: the lab.model.boardkernel record plus `group_cores`, the quota of one group
    in host cores after time dilation). Called after cpu_plan; returns warnings."""
    if vpn is None or vpn.availability is None or not vpn.availability.ok:
        return []
    dp = vpn.driver.cpu_dataplane(vpn.profile.params, vpn.availability.path)
    if dp is None:
        return []
    warnings = []
    for node in dict.fromkeys((vpn.client.node, vpn.server.node)):
        p = cpu.get(node) or {}
        if not p.get("profile") or p.get("cores") is None or p.get("not_applied"):
            continue  # uncapped, a fixed fraction, TCG or qemu-user: no board model to hold to
        if not p.get("slots"):
            # no per-core groups here (cgroup v2 without threaded groups, one emulated core): the
            # daemon shares the node's single board core, as before
            p["dataplane"] = {
                "daemon": dp.daemon,
                "board": dp.board,
                "groups": 0,
                "why": p.get("per_core_not_applied") or "the node emulates one board core",
            }
            continue
        prof = load_cpu_profile(p["profile"])
        rec = boardkernel.plan(prof, dp, cores=p["slots"])
        # a group is one board core: divided by the dilation like the node's core groups, never
        # above one host core per group (a process's thread runs on one CPU at a time)
        want = rec["share"] / p.get("dilation", 1.0)
        rec["group_cores"] = round(min(want, 1.0), 6)
        if want > 1.0:
            # the stand-in needs more of this host than one CPU to match the board's code
            rec["why"] = (
                f"{dp.daemon} would need {want:.2f} host cores per board core to carry what the "
                f"board's {rec.get('implementation') or rec.get('board_reference')} carries; held "
                "to one host core per group: results understate the board"
            )
        raise_node_quota(p, rec)
        p["dataplane"] = rec
        if rec.get("why"):
            warnings.append(
                f"node {node}: {dp.daemon}'s data plane held, slower than the board's: "
                f"{rec['why']} {doc_ref('data-plane-held')}"
            )
    if any((p.get("dataplane") or {}).get("node_cores_added") for p in cpu.values()):
        over = host_overcommit(cpu)
        if over:
            warnings.append(over)
    return warnings


def raise_node_quota(p: dict, rec: dict) -> None:
    """The node's quota with its data plane's cores priced at the data plane's share: each of
    the `groups` cores costs group_cores here instead of slot_cores (one ordinary board core),
    so the node's quota grows by the difference (never shrinks: a data plane cheaper than a
    board core leaves the core's share to the node's other work). Recorded in the data plane
    record (`node_cores_before`, `node_cores_added`)."""
    n = rec.get("groups") or 0
    per_core = p.get("slot_cores") or p["cores"] / max(1, p.get("slots") or 1)
    added = max(0.0, n * (rec["group_cores"] - per_core))
    rec["node_cores_before"] = round(p["cores"], 6)
    rec["node_cores_added"] = round(added, 6)
    p["cores"] = round(p["cores"] + added, 6)


def host_overcommit(cpu: dict[str, dict], host_cores: int | None = None) -> str | None:
    """A warning when the nodes' quotas, data plane cores included, add up to more than this
    machine's cores: then they compete for it and its speed, not the board's, sets the figures;
    None when they fit."""
    host = host_cores or len(os.sched_getaffinity(0))
    total = sum(p["cores"] for p in cpu.values() if p.get("cores") and not p.get("not_applied"))
    if total <= host:
        return None
    return (
        f"the nodes' CPU quotas with their data planes' cores add up to {total:.2f} of {host} "
        f"host cores: under full load the nodes compete and this machine's speed sets the "
        f"figures; run time-dilated (`-p dilation={math.ceil(10 * total / host) / 10:g}`) or on "
        f"a machine with "
        f"more cores {doc_ref('data-plane-overcommit')}"
    )


def group_rel(rel: str, i: int) -> str:
    """The i-th data plane group of node group `rel`."""
    return f"{rel}/dp{i}"
