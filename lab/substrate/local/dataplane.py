"""A tunnel's data plane at the board's speed and with the board's threading, on this machine.

The process that carries a tunnel's packets on a node (charon's kernel-libipsec, wireguard-go,
openvpn, tincd: the driver says which, Driver.cpu_dataplane) runs in groups of its own beside
the node's board cores (`<node>/dp0` ...), as many as the board uses cores for that data plane
(one for XFRM ESP, MACsec and single-threaded daemons; all of them for kernel WireGuard and
multi-threaded daemons) and each capped at the share lab.model.boardkernel works out: one board
core running the board's code for the data plane's dominant primitive, for the stand-in's code
on this host. The node's own quota (all its board cores) stays above them. docs/cpu.md "Data
planes".
"""

from __future__ import annotations

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
        # above the node's own quota
        want = rec["share"] / p.get("dilation", 1.0)
        rec["group_cores"] = round(min(want, p["cores"]), 6)
        if want > p["cores"]:
            # the stand-in needs more of this host than the node has to match the board's code
            rec["why"] = (
                f"{dp.daemon} would need {want:.2f} host cores per board core to carry what the "
                f"board's {rec.get('implementation') or rec.get('board_reference')} carries; held "
                f"to the node's {p['cores']:.2f}: results understate the board"
            )
        p["dataplane"] = rec
        if rec.get("why"):
            warnings.append(
                f"node {node}: {dp.daemon}'s data plane held to the node's quota, slower than the "
                f"board's: {rec['why']} {doc_ref('data-plane-held')}"
            )
    return warnings


def group_rel(rel: str, i: int) -> str:
    """The i-th data plane group of node group `rel`."""
    return f"{rel}/dp{i}"
