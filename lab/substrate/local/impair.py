"""Impairment points added to a running lab: what `lab impair set` does on a lab built without
`--impair`.

Kernel netem (when the nodes have sch_netem): the points are egress qdiscs, so adding them is
only the plan and the offloads (lab.substrate.local.build.offloads_off). The userspace engine: a bump namespace
is spliced into each engine link of the live lab (lab.core.netops.splice_veth_end): one end of the
link's veth moves into the bump, a new veth with the moved end's name, MAC and MTU takes its
place with its addresses, routes and neighbour entries restored, and the engine starts there as
pass-through. The other end, and the VPN endpoint's tunnel, sockets and daemons, are never
touched, except that the neighbour entries the kernel flushes there while its carrier is down are
put back; a UDP tunnel sees only the few milliseconds of the swap (docs/impairment.md "Run-time
impairment on any lab"), and the first packet after it no ARP/NDP round trip (issue 32).

Every object is in the ledger before it is created, so `lab down` removes the bump with the
rest of the lab, and a crash mid-splice leaves nothing that teardown does not find.
"""

from __future__ import annotations

from lab.core import cgroups, netops
from lab.model import dilation
from lab.substrate.local.build import impair_plan, offloads_off, start_engines
from lab.substrate.local import nicside
from lab.substrate.local.cpuplan import nic_to_points
from lab.substrate.local.lab import CGROUP_PARENT, Lab
from lab.core.state import write_json_atomic
from lab.impair import runtime
from lab.model.impairment.directional import DirectionalImpairment
from lab.model.labspec import LabSpec


def ensure_points(lab: Lab) -> bool:
    """Give `lab` impairment points (the topology's default placement, nothing applied) unless
    it has them. Returns True when it added them."""
    if lab.info.get("impair"):
        return False
    iplan = impair_plan(lab.spec, lab.id, lab.info, "none", None, "auto")
    st = runtime.plan_json(iplan)
    st["added_at_run_time"] = True
    lab.info["impair"] = st
    nic = lab.info.get("nic_latency") or {}
    if nic.get("side_path"):
        # the engine is on the path now: it carries the NICs for every test, as for a lab built
        # with impairment ("auto" with the engine on the path), and the side path goes first
        nicside.remove(lab, nic.pop("side_path")["links"])
        nic.pop("tests", None)
        nic.update(applied=True, why=nic["why"].split(";")[0] + "; `lab impair set` put the "
                   "lab's engine on the path, which carries it since (side path removed)")  # fmt: skip
        nic_to_points(nic, st)
    write_json_atomic(lab.dir / "lab.json", lab.info)
    if iplan.backend == "userspace":
        for idx in iplan.engine_links:
            splice_bump(lab, idx)
        lab.save()
        start_engines(lab, iplan)
    else:
        offloads_off(lab, iplan)
    runtime.set_point(lab, DirectionalImpairment())
    return True


def splice_side(spec: LabSpec, link: int) -> tuple[str, str]:
    """(node, ifname) of link `link` whose interface is re-created: a node that is no VPN
    endpoint when the link has one (the router of a middlebox link), else the link's first node.
    The endpoint's interface, sockets and routes then stay exactly as the tunnel left them."""
    lk = spec.links[link]
    endpoints = set(spec.endpoints("vpn"))
    if lk.node1 in endpoints and lk.node2 not in endpoints:
        return lk.node2, lk.intf2
    return lk.node1, lk.intf1


def splice_bump(lab: Lab, link: int) -> None:
    """Splice a pass-through bump namespace into live link `link` (see the module doc)."""
    lk = lab.spec.links[link]
    layout = lab.cg
    name = f"imp{link}"
    ns = runtime.bump_ns(lab.id, link)
    rel = f"{CGROUP_PARENT}/{lab.id}/{name}"
    lab.ledger.record("cgroup", rel=rel, node=name)
    cgroups.ensure_dir(layout, rel)
    cgroups.set_cpu(layout, rel, None, cgroups.all_cpus(layout))
    lab.ledger.record("netns", name=ns, node=name)
    netops.create_netns(ns)
    netops.configure_node(ns, [], [])  # lo up

    node, ifname = splice_side(lab.spec, link)
    node_ns = f"{lab.id}-{node}"
    # the bump's end towards node1 is imp-a, towards node2 imp-b (engine_fwd_dir counts on it)
    near, far = (
        (runtime.BUMP_A, runtime.BUMP_B) if node == lk.node1 else (runtime.BUMP_B, runtime.BUMP_A)
    )
    state = netops.read_interface(node_ns, ifname)
    # recorded before the swap: the new pair and the moved end live in (and die with) the bump
    lab.ledger.record(
        "veth", ns=node_ns, ifname=ifname, peer_ns=ns, peer=near, spliced=True, restore=state
    )
    lab.ledger.record("veth", ns=ns, ifname=far, moved_from=f"{node_ns}:{ifname}")
    # the other end keeps its interface but not its neighbour entries: its carrier drops while
    # the moved end changes namespace (netops.restore_neighbours)
    other, other_if = (lk.node2, lk.intf2) if node == lk.node1 else (lk.node1, lk.intf1)
    other_ns = f"{lab.id}-{other}"
    kept = netops.read_neighbours(other_ns, other_if)
    netops.splice_veth_end(node_ns, state, ns, far, near)
    netops.restore_neighbours(other_ns, other_if, kept)
    if lk.bw:  # the moved end lost its tbf with its namespace; the new end gets the link's
        lab.ledger.record("qdisc", ns=node_ns, ifname=ifname, qdisc="tbf")
        netops.set_tbf(
            node_ns,
            ifname,
            lk.bw,
            limit_pkts=lk.max_queue_size,
            dilation=dilation.factor(lab.spec.dilation),
        )
    lab.info["impair"]["engines"].append(
        {
            "name": name,
            "link": link,
            "netns": ns,
            "cgroup": rel,
            "a": f"{lk.node1}:{lk.intf1}",
            "b": f"{lk.node2}:{lk.intf2}",
            "spliced": f"{node}:{ifname}",
        }
    )
