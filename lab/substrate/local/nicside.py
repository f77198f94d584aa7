"""The boards' NIC latency on a side path (docs/cpu.md "The side path"), for a local lab whose
`nic_latency = "auto"` finds no kernel netem and no engine on the VPN path.

The lab's links stay plain veths. Beside each link of the VPN path that carries a NIC delay, a
bump namespace runs the lab's engine (lab-impaird) with that link's NIC delay per direction,
joined to the link's two nodes by two veth pairs of its own: a "side" interface in each node
(same MAC as the node's link interface, no addresses, no IPv6 link-local) and `nic-a` / `nic-b`
in the bump. A permanent tc filter on each side interface's ingress hands whatever the engine
sends back to the link interface as if received there (act_mirred ingress redirect). Only while a
latency test runs (a Test with `nic_side_path = "all"`: ping, rr, handshake) a second filter on
each link interface's egress redirects every frame onto the side interface, so the frame crosses
the engine and gets the NICs' delay; for a test with `nic_side_path = "icmp"` (rrul: pings beside
bulk TCP flows) that filter matches only ICMP and ICMPv6 (u32 on the IP protocol / IPv6 next
header), and the engine's output is hairpinned back to the sending node and out through the link
interface's qdisc (steer_filters), so its pings get the NICs and still queue with its flows,
which do not cross the engine -- where the pings cross the link as ICMP, i.e. no tunnel
encapsulates them (otherwise nothing is steered and the result says why). Otherwise the engine
sits idle, blocked on its sockets, and throughput tests see the plain veth at full speed.
Everything is in the ledger before it is created; the bump namespace takes both veth pairs with
it at `lab down`.
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
from lab.measure import TESTS
from lab.model.labspec import LabSpec
from lab.substrate.local.engines import bump_cgroup, create_bump, spawn_engine
from lab.substrate.local.lab import Lab

#: the engine's two interfaces in the side bump: towards the link's node1, node2
SIDE_A, SIDE_B = "nic-a", "nic-b"
#: tc filter priorities: the steering filter(s) on a link interface's egress (ICMP at STEER_PRIO,
#: ICMPv6 at STEER_PRIO + 1; ICMP steering exempts the frames coming back at STEER_PRIO - 1);
#: on a side interface's ingress the permanent hand-back (PASS_PRIO) and, while ICMP steering
#: is on, the hairpin before it (HAIRPIN_PRIO); in the bump the hairpin on nic-a/nic-b egress
STEER_PRIO, PASS_PRIO, HAIRPIN_PRIO = 4917, 2, 1
ICMP = {"ip": ["match", "ip", "protocol", "1", "0xff"],
        "ipv6": ["match", "ip6", "protocol", "58", "0xff"]}  # fmt: skip
MATCH_KINDS = ("all", "icmp")
#: the VPN drivers that leave a ping ICMP on the link (no tunnel): ICMP-only steering finds it
PLAIN_DRIVERS = ("none",)
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
        [*tc, "filter", "add", "dev", side, "ingress", "protocol", "all", "prio", str(PASS_PRIO)]
        + ["u32", "match", "u32", "0", "0"]
        + ["action", "mirred", "ingress", "redirect", "dev", ifname],
    ]


def side_path_tests(match: str) -> list[str]:
    """The registered tests whose `nic_side_path` is `match`: "all" (RTT-bound: ping, rr,
    handshake) or "icmp" (rrul, whose bulk flows stay on the plain veth like tcp, udp and scp:
    the engine would sit in their packets' path)."""
    return [n for n, t in TESTS.items() if t.nic_side_path == match]


def _redirect(dev: str) -> list[str]:
    return ["action", "mirred", "egress", "redirect", "dev", dev]


def steer_filters(s: dict, match: str = "all") -> list[tuple[str, str, str, int, str, list]]:
    """The filters steering side bump `s`'s link onto it, in the order they go on: (netns, dev,
    "egress" | "ingress", priority, tc protocol, u32 words). "all": every frame of each link
    interface's egress onto the side interface. "icmp": ICMP and ICMPv6 only, and on a hairpin:
    the engine's output is sent back to the node it came from (in the bump, by its source
    MAC), whose side interface puts it out through the link interface's egress -- its qdisc
    (a link's tbf, the queue its flows build) included -- exempt from being steered again (its
    input device is the side interface). So a ping gets its NIC delay and then queues with the
    flows, as on a board (NIC after the queue: the same sum), and crosses the link as usual."""
    if match not in MATCH_KINDS:
        raise ValueError(f"steering match {match!r}; accepted: {', '.join(MATCH_KINDS)}")
    everything = ["match", "u32", "0", "0"]
    if match == "all":
        return [
            (e["ns"], e["ifname"], "egress", STEER_PRIO, "all", everything + _redirect(e["side"]))
            for e in s["ends"]
        ]
    a, b = s["ends"]
    out = [  # the engine's a->b output back to a, its b->a output back to b
        (s["netns"], SIDE_B, "egress", HAIRPIN_PRIO, "all",
         ["match", "ether", "src", a["mac"], *_redirect(SIDE_A)]),
        (s["netns"], SIDE_A, "egress", HAIRPIN_PRIO, "all",
         ["match", "ether", "src", b["mac"], *_redirect(SIDE_B)]),
    ]  # fmt: skip
    for e in s["ends"]:
        ns, link, side = e["ns"], e["ifname"], e["side"]
        exempt = [*everything, "indev", side, "classid", "1:1"]  # no action: on to the qdisc
        out += [
            (ns, side, "ingress", HAIRPIN_PRIO, "all", everything + _redirect(link)),
            (ns, link, "egress", STEER_PRIO - 1, "all", exempt),
            (ns, link, "egress", STEER_PRIO, "ip", ICMP["ip"] + _redirect(side)),
            (ns, link, "egress", STEER_PRIO + 1, "ipv6", ICMP["ipv6"] + _redirect(side)),
        ]
    return out


def _steer_commands(s: dict, on: bool, match: str) -> list[tuple[str, list[str]]]:
    """(where: "netns:dev", command) putting (`on`) or taking off (in the reverse order, each
    filter by its priority alone) the steering of side bump `s` (steer_filters)."""
    out = []
    for ns, dev, hook, prio, proto, words in steer_filters(s, match):
        base = ["tc", "-n", ns, "filter", "add" if on else "del", "dev", dev, hook]
        tail = ["protocol", proto, "prio", str(prio), "u32", *words] if on else ["prio", str(prio)]
        out.append((f"{ns}:{dev}", base + tail))
    return out if on else out[::-1]


def steer_argvs(s: dict, on: bool, match: str = "all") -> list[list[str]]:
    """The commands of _steer_commands alone."""
    return [argv for _, argv in _steer_commands(s, on, match)]


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
        tests=side_path_tests("all"),
        icmp_tests=side_path_tests("icmp"),
        why=record["why"].split(";")[0]
        + "; applied on a side path beside the link, the lab's engine steered onto only while a "
        f"latency test runs ({', '.join(side_path_tests('all'))}; "
        f"{', '.join(side_path_tests('icmp'))}: its ICMP "
        "only, where no tunnel encapsulates it); other tests and `lab exec` see the plain veth",
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
    for inner in (SIDE_A, SIDE_B):  # for ICMP steering's hairpin (steer_filters)
        lab.ledger.record("qdisc", ns=ns, ifname=inner, qdisc="clsact")
        proc.run(["tc", "-n", ns, "qdisc", "add", "dev", inner, "clsact"], where=f"netns {ns}")
    for end in ends:
        mac = end["mac"] = netops.read_interface(end["ns"], end["ifname"])["mac"]
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


def steer(lab: Lab, on: bool, match: str = "all") -> None:
    """Put the lab's VPN path onto its side path (`on`; every frame, or with `match` "icmp" its
    ICMP and ICMPv6 only) or back onto the plain veth (the same `match`). Off is done on every
    end whatever fails, and raises only afterwards."""
    sides = ((lab.info.get("nic_latency") or {}).get("side_path") or {}).get("links") or []
    errors = []
    for s in sides:
        for where, argv in _steer_commands(s, on, match):
            cp = proc.run(argv, check=on)
            if not on and cp.returncode and "No such file" not in (cp.stderr or ""):
                errors.append(f"{where}: {cp.stderr.strip()}")
    if errors:
        raise RuntimeError("taking the NIC side path's steering off failed: " + "; ".join(errors))


def icmp_note(lab: Any) -> tuple[bool, str]:
    """(whether ICMP-only steering reaches the test's pings, what the result says of it): only
    where the lab's pings cross the link as ICMP, i.e. no tunnel encapsulates them (the `none`
    driver); a tunnel's packets are UDP, ESP, TCP or MACsec frames there."""
    driver = ((getattr(lab, "info", None) or {}).get("vpn") or {}).get("driver") or "none"
    if driver in PLAIN_DRIVERS:
        return True, (
            "ICMP only: the test's pings (ICMP/ICMPv6) crossed the boards' NICs on the side "
            "path and then the link's queue with its flows; its TCP flows the plain veth "
            "without the NICs"
        )
    return False, (
        f"not applied: the test's NICs are steered by ICMP on the link, and the {driver} tunnel "
        "carries its pings encapsulated (not ICMP there); its pings and flows ran on the plain "
        "veth without the NICs"
    )


@contextmanager
def steering(lab: Any, test: Any) -> Iterator[dict]:
    """Around one test run (LocalSubstrate.nic_steering): the side path steered on when the lab
    has one and the test's `nic_side_path` asks for it (every frame, or its ICMP only), off
    again after, whatever happens. Yields {"applied": True (every frame), "icmp" (its ICMP only)
    or False, "note": what it means, when there is more to say} (results.jsonl's
    nic_latency_applied and nic_latency_note)."""
    rec = (getattr(lab, "info", None) or {}).get("nic_latency") or {}
    match = getattr(test, "nic_side_path", None)
    if not rec.get("side_path"):
        yield {"applied": rec.get("applied") is True}
        return
    if match is None:
        yield {"applied": False}
        return
    out: dict = {"applied": True}
    if match == "icmp":
        reached, note = icmp_note(lab)
        if not reached:
            yield {"applied": False, "note": note}
            return
        out = {"applied": "icmp", "note": note}
    try:
        steer(lab, True, match)
        yield out
    finally:
        steer(lab, False, match)
