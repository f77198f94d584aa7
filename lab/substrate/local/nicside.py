"""The boards' NIC latency on a side path (docs/cpu.md "The side path"), for a local lab whose
`nic_latency = "auto"` finds no kernel netem and no engine on the VPN path.

The lab's links stay plain veths. Beside each link of the VPN path that carries a NIC delay, a
bump namespace runs the lab's engine (lab-impaird) with that link's NIC delay per direction,
joined to the link's two nodes by two veth pairs of its own: a "side" interface in each node
(same MAC as the node's link interface, no addresses, no IPv6 link-local) and `nic-a` / `nic-b`
in the bump. A permanent tc filter on each side interface's ingress hands whatever the engine
sends back to the link interface as if received there (act_mirred ingress redirect). Only while a
latency test runs (a Test with `nic_side_path = True`: ping, rr, handshake) a second filter on
each link interface's egress redirects every frame onto the side interface, so the frame crosses
the engine and gets the NICs' delay; otherwise the engine sits idle, blocked on its sockets, and
throughput tests see the plain veth at full speed. Everything is in the ledger before it is
created; the bump namespace takes both veth pairs with it at `lab down`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from lab.core import cgroups, netops, proc
from lab.impair.effective import DEFAULT_LINE_RATE_BPS, with_nic, with_queue_limit
from lab.impair.engine import EngineClient
from lab.impair.runtime import path_links
from lab.model import dilation
from lab.model.impairment.model import Impairment
from lab.model.labspec import LabSpec
from lab.substrate.local.engines import bump_cgroup, create_bump, spawn_engine
from lab.substrate.local.lab import Lab

#: the engine's two interfaces in the side bump: towards the link's node1, node2
SIDE_A, SIDE_B = "nic-a", "nic-b"
#: the tests that get the side path (their `nic_side_path`): RTT-bound ones. rrul mixes load and
#: latency and is left out, like tcp, udp and scp (the engine would sit in their packets' path)
LATENCY_TESTS = ("ping", "rr", "handshake")
#: the tc filter priority of the steering filter on a link interface's egress (deleted by it)
STEER_PRIO = 4917
BACKEND = "side path"


def wanted(record: dict) -> bool:
    """Whether a lab with nic_decision's `record` gets the side path: "auto" left the NICs out
    for want of kernel netem and of an engine on the path, and the path has a NIC delay."""
    total = sum(d.get("us") or 0 for d in (record.get("directions") or {}).values())
    return record.get("mode") == "auto" and not record.get("applied") and total > 0


def side_links(spec: LabSpec, record: dict) -> list[dict]:
    """The links of the VPN path that get a side bump, each {"link", "a2b_us", "b2a_us"}:
    the NIC delay of each direction of that link (a2b: node1 -> node2), from the hop rows of
    nic_path (record["directions"], client->server first, in path order)."""
    a, b = spec.endpoints("vpn")
    hops = {(h["from"], h["to"]): h["us"] for d in record["directions"].values() for h in d["hops"]}
    out = []
    for idx, _frm, _to in path_links(spec, a, b):
        lk = spec.links[idx]
        a2b, b2a = hops.get((lk.node1, lk.node2), 0), hops.get((lk.node2, lk.node1), 0)
        if a2b or b2a:
            out.append({"link": idx, "a2b_us": a2b, "b2a_us": b2a})
    return out


def free_name(base: str, taken: set[str]) -> str:
    """`base`, or `base` with a suffix, that is none of `taken` (a node's interface names, the
    lab's namespace names): the side objects never take a name the topology uses."""
    name, i = base, 0
    while name in taken:
        i += 1
        name = f"{base}s{i}"
    return name


def setup_argvs(ns: str, ifname: str, side: str, mac: str) -> list[list[str]]:
    """Commands making `side` in node namespace `ns` a receive path into link interface
    `ifname`: its MAC (else a redirected frame is PACKET_OTHERHOST and dropped), no IPv6
    link-local (it would speak for the node on the wire), up, clsact on both, and the permanent
    ingress redirect side -> link interface."""
    tc = ["tc", "-n", ns]
    return [
        ["ip", "-n", ns, "link", "set", "dev", side, "address", mac],
        ["ip", "-n", ns, "link", "set", "dev", side, "addrgenmode", "none"],
        ["ip", "-n", ns, "link", "set", "dev", side, "up"],
        [*tc, "qdisc", "add", "dev", ifname, "clsact"],
        [*tc, "qdisc", "add", "dev", side, "clsact"],
        [*tc, "filter", "add", "dev", side, "ingress", "protocol", "all", "prio", "1", "u32"]
        + ["match", "u32", "0", "0", "action", "mirred", "ingress", "redirect", "dev", ifname],
    ]


def steer_argv(ns: str, ifname: str, side: str, on: bool) -> list[str]:
    """The command putting (`on`) or taking off the redirect of `ifname`'s egress onto `side`."""
    base = ["tc", "-n", ns, "filter", "add" if on else "del", "dev", ifname, "egress"]
    base += ["protocol", "all", "prio", str(STEER_PRIO)]
    if not on:
        return base
    return base + ["u32", "match", "u32", "0", "0"] + [
        "action", "mirred", "egress", "redirect", "dev", side,
    ]  # fmt: skip


def build(lab: Lab, record: dict, all_cpus: str, fallback: list[str]) -> list[str]:
    """Build the side path of `lab` (its nodes and links configured, nothing steered) and
    record it in `record` (lab.json's nic_latency). A failure unwinds what was built and is
    recorded, never raised: the lab goes on without the NICs, as before, with `fallback` (the
    "not applied" warnings) and why. Returns warnings."""
    links = side_links(lab.spec, record)
    sides: list[dict] = []
    record["side_path"] = {"links": sides}
    try:
        for spec_link in links:
            _build_one(lab, spec_link, all_cpus, sides)
        _start(lab, sides)
    except Exception as e:  # noqa: BLE001 -- the lab goes on as without it (module doc)
        remove(lab, sides)
        record.pop("side_path")
        why = f"the side path for latency tests could not be built: {e}"
        record["why"] += f"; {why}"
        lab.save()
        return [*fallback, f"the boards' NIC latency: {why}"]
    record.update(
        applied="latency tests",
        backend=BACKEND,
        tests=list(LATENCY_TESTS),
        why=record["why"].split(";")[0]
        + "; applied on a side path beside the link, the lab's engine steered onto only while a "
        f"latency test runs ({', '.join(LATENCY_TESTS)}); other tests and `lab exec` see the "
        "plain veth",
    )
    record.pop("warned", None)
    lab.save()
    return []


def _build_one(lab: Lab, want: dict, all_cpus: str, sides: list[dict]) -> None:
    lk = lab.spec.links[want["link"]]
    names = {f"{lab.id}-{n}" for n in lab.spec.nodes}
    ns = free_name(f"{lab.id}-nic{lk.index}", names)
    name = ns[len(lab.id) + 1 :]
    rel = bump_cgroup(lab.id, name)
    ends = []
    for node, ifname in ((lk.node1, lk.intf1), (lk.node2, lk.intf2)):
        taken = {i.name for i in lab.spec.nodes[node].interfaces}
        ends.append({"node": node, "ns": f"{lab.id}-{node}", "ifname": ifname,
                     "side": free_name(f"nic{lk.index}", taken)})  # fmt: skip
    rec = {"name": name, "link": lk.index, "netns": ns, "cgroup": rel, "ends": ends,
           "a2b_us": want["a2b_us"], "b2a_us": want["b2a_us"]}  # fmt: skip
    sides.append(rec)  # before anything of it exists: a failure removes what there is
    create_bump(lab.ledger, lab.cg, lab.id, name, ns, all_cpus)
    for end, inner in zip(ends, (SIDE_A, SIDE_B), strict=True):
        lab.ledger.record("veth", ns=end["ns"], ifname=end["side"], peer_ns=ns, peer=inner)
        netops.create_veth(end["ns"], end["side"], ns, inner, lk.mtu)
    netops.configure_node(ns, [{"name": SIDE_A}, {"name": SIDE_B}], [])
    for end in ends:
        mac = netops.read_interface(end["ns"], end["ifname"])["mac"]
        lab.ledger.record("qdisc", ns=end["ns"], ifname=end["ifname"], qdisc="clsact")
        lab.ledger.record("qdisc", ns=end["ns"], ifname=end["side"], qdisc="clsact")
        for argv in setup_argvs(end["ns"], end["ifname"], end["side"], mac):
            proc.run(argv, where=f"netns {end['ns']}")
        if lk.bw:  # steered frames skip the link interface's root qdisc: the side gets the tbf
            lab.ledger.record("qdisc", ns=end["ns"], ifname=end["side"], qdisc="tbf")
            netops.set_tbf(end["ns"], end["side"], lk.bw, limit_pkts=lk.max_queue_size,
                           dilation=dilation.factor(lab.spec.dilation))  # fmt: skip


def _start(lab: Lab, sides: list[dict]) -> None:
    """Each side bump's engine, set to its link's NIC delay per direction (dilated like every
    delay of the lab; the default queue limit at the link's rate)."""
    d = dilation.factor(lab.spec.dilation)
    for s in sides:
        spawn_engine(lab, s, SIDE_A, SIDE_B)
        bw = lab.spec.links[s["link"]].bw
        rate = int(bw * 1e6) if bw else DEFAULT_LINE_RATE_BPS
        for way in ("a2b", "b2a"):
            imp = with_queue_limit(with_nic(Impairment(), s[f"{way}_us"]), rate)
            EngineClient(s["control"]).set(way, dilation.impairment(imp, d).to_json())
        lab.save()


def remove(lab: Lab, sides: list[dict]) -> None:
    """Take the side bumps `sides` away (their engines, namespaces with both veth pairs, the
    clsact qdiscs on the link interfaces, cgroups); what is gone already is skipped. The
    ledger keeps the entries: teardown finds them removed."""
    for s in sides:
        if s.get("pid"):
            proc.stop_pid(s["pid"], s.get("start_time"), grace=2.0)
        for end in s["ends"]:
            argv = ["tc", "-n", end["ns"], "qdisc", "del", "dev", end["ifname"], "clsact"]
            proc.run(argv, check=False)
        if netops.netns_exists(s["netns"]):
            netops.remove_netns(s["netns"])
        cgroups.remove_dir(lab.cg, s["cgroup"])


def steer(lab: Lab, on: bool) -> None:
    """Put the lab's VPN path onto its side path (`on`) or back onto the plain veth. Off is
    done on every end whatever fails, and raises only afterwards."""
    sides = ((lab.info.get("nic_latency") or {}).get("side_path") or {}).get("links") or []
    errors = []
    for s in sides:
        for end in s["ends"]:
            cp = proc.run(steer_argv(end["ns"], end["ifname"], end["side"], on), check=on)
            if not on and cp.returncode and "No such file" not in (cp.stderr or ""):
                errors.append(f"{end['ns']}:{end['ifname']}: {cp.stderr.strip()}")
    if errors:
        raise RuntimeError("taking the NIC side path's steering off failed: " + "; ".join(errors))


@contextmanager
def steering(lab: Any, test: Any) -> Iterator[dict]:
    """Around one test run (LocalSubstrate.nic_steering): the side path steered on when the lab
    has one and the test is a latency test (its `nic_side_path`), off again after, whatever
    happens. Yields {"applied": whether the boards' NIC latency is in force for the test}
    (results.jsonl's nic_latency_applied)."""
    rec = (getattr(lab, "info", None) or {}).get("nic_latency") or {}
    if not rec.get("side_path"):
        yield {"applied": rec.get("applied") is True}
        return
    if not getattr(test, "nic_side_path", False):
        yield {"applied": False}
        return
    try:
        steer(lab, True)
        yield {"applied": True}
    finally:
        steer(lab, False)
