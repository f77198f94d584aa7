"""Impairment in a lab: where it goes (placement), which backend applies it, and run-time control.

Placement resolves to *impairment points*: "the egress of interface IF on node N" (a direction
of one link). Backends:
  kernel-netem — `tc qdisc replace ... netem` on that interface (ingress placement: via ifb);
  userspace    — the lab's engine (engine/, lab-impaird) in a hidden bump-in-the-wire namespace
                 spliced into the link at build time (`lab up --impair`) or, on a running lab,
                 by the first `lab impair set` (lab.substrate.local.impair); one engine per link, one spec per
                 direction.
With the engine every placement acts as wire impairment: the endpoints' stacks never see drops
(kernel egress netem reports them to the local stack). A middlebox placement with the engine
puts both directions on the router's link towards the VPN server: one engine hop on the path,
the same end-to-end effect as netem on the router's two interfaces.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from lab.model import dilation
from lab.core.errors import ConfigError, PreconditionError
from lab.model.graph import shortest_path
from lab.model.labspec import LabSpec
from lab.impair import kernel
from lab.impair.effective import (
    base_text,
    DEFAULT_LINE_RATE_BPS,
    limit_warning,
    point_spec,
    with_nic,
    with_queue_limit,
    with_seed,
)
from lab.model.impairment.directional import DirectionalImpairment, parse_directional
from lab.model.impairment.model import Impairment
from lab.impair.engine import brief_traces, EngineClient, NodeEngineClient
from lab.impair.where import directions

DEFAULT = "default"
BUMP_A, BUMP_B = "imp-a", "imp-b"

#: How each backend makes every per-packet model (loss, duplicate, reorder, corrupt, limit) act
#: on wire packets rather than on 64 KB GSO/TSO/GRO super-frames (issue 13).
WIRE_PACKETS = {
    "userspace": "engine splits GSO super-frames into wire packets before any per-packet "
    "decision (counters gso_frames -> gso_segments)",
    "kernel-netem": "segmentation and receive offloads (tso, gso, gro, tx-udp-segmentation) off "
    "on the impaired path's interfaces, so the stack hands netem wire packets",
}
#: ethtool -K words that turn the offloads of WIRE_PACKETS["kernel-netem"] off
OFFLOADS_OFF = ["tso", "off", "gso", "off", "gro", "off", "tx-udp-segmentation", "off"]


@dataclass
class Point:
    """Egress of `ifname` on `node`: the direction node -> peer of link `link`."""

    node: str
    ifname: str
    link: int
    #: "fwd" when this direction carries vpn-client -> vpn-server traffic, else "rev"
    way: str


def path_links(spec: LabSpec, a: str, b: str) -> list[tuple[int, str, str]]:
    """Links on the shortest underlay path a -> b as (link index, from node, to node)."""
    path = shortest_path(spec.nodes, spec.links, a, b)
    if path is None:
        raise ConfigError(f"no underlay path between {a} and {b}", source=spec.source)
    return path


def _ifname_on(spec: LabSpec, link: int, node: str) -> str:
    lk = spec.links[link]
    return lk.intf1 if lk.node1 == node else lk.intf2


def default_placement(spec: LabSpec) -> str:
    a, b = spec.endpoints("vpn")
    return "middlebox" if len(path_links(spec, a, b)) >= 2 else "egress"


def points(spec: LabSpec, placement: str) -> list[Point]:
    a, b = spec.endpoints("vpn")
    path = path_links(spec, a, b)
    if placement == "middlebox":
        if len(path) < 2:
            raise ConfigError(
                f"placement 'middlebox' needs a node between {a} and {b}; this topology links them "
                "directly: use 'egress' or 'ingress'",
                source=spec.source,
                field="placement",
            )
        pts = []
        for idx, frm, to in path:
            if frm != a:  # the middle node's egress towards the server
                pts.append(Point(frm, _ifname_on(spec, idx, frm), idx, "fwd"))
            if to != b:  # ... and towards the client
                pts.append(Point(to, _ifname_on(spec, idx, to), idx, "rev"))
        return pts
    if placement in ("egress", "ingress"):
        first, last = path[0], path[-1]
        return [
            Point(a, _ifname_on(spec, first[0], a), first[0], "fwd"),
            Point(b, _ifname_on(spec, last[0], b), last[0], "rev"),
        ]
    raise ConfigError(
        f"placement must be one of middlebox, egress, ingress, got {placement!r}", field="placement"
    )


def engine_links(spec: LabSpec, placement: str) -> list[int]:
    """Links that get a bump namespace when the userspace engine applies `placement`."""
    pts = points(spec, placement)
    if placement == "middlebox":
        a, b = spec.endpoints("vpn")
        return [path_links(spec, a, b)[-1][0]]
    return sorted({p.link for p in pts})


def bump_ns(lab_id: str, link: int) -> str:
    return f"{lab_id}-imp{link}"


def choose_backend(probe_node) -> tuple[str, str]:
    """("kernel-netem" | "userspace", why). probe_node: any node of the lab (lab.core.node(...))."""
    pr = kernel.probe_netem(probe_node)
    if pr.ok:
        return "kernel-netem", "sch_netem available"
    return "userspace", f"kernel netem unavailable ({pr.reason}); using the lab's engine"


# ------------------------------------------------------------------------- run-time control


def _parse(spec_text: str, lab, base: DirectionalImpairment | None = None) -> DirectionalImpairment:
    a, b = lab.spec.endpoints("vpn")
    return parse_directional(spec_text, source="impairment", a=a, b=b, base=base)


def _state(lab) -> dict:
    st = lab.info.get("impair")
    if not st:
        # no lab gets here from the CLI: `lab impair set` adds the points first
        # (lab.substrate.local.impair.ensure_points; on boards, lab.substrate.boards.impair.apply)
        raise PreconditionError(
            f"lab {lab.id!r} has no impairment points: a lab gets them at `lab up --impair` or "
            "at the first `lab impair set` (lab.substrate.local.impair.ensure_points, on boards "
            "lab.substrate.boards.impair.apply)"
        )
    return st


def _key(p: Point) -> str:
    return f"{p.node}:{p.ifname}"


def line_rate_bps(lab, p: Point) -> int:
    bw = lab.spec.links[p.link].bw
    return int(bw * 1e6) if bw else DEFAULT_LINE_RATE_BPS


def set_point(lab, imp: DirectionalImpairment, *, seed: int | None = None) -> dict:
    """Put exactly `imp` in force on every impairment point (a plan point).

    `seed`: the random draws' seed where `imp` gives none and has draws (jitter, loss,
    duplicate, corrupt, reorder; a plan run derives it from a case id, docs/scale.md); the engine
    takes it (mixed per direction), kernel netem does not here (iproute2 < 6.6 rejects netem's
    seed), so there it is not applied and `seed` says so.

    Nothing of what earlier points or `lab impair set` left survives: each point gets the
    topology's own link impairment (its `impair=` option, none for most) with `imp` on top,
    and an empty one leaves just that; the boards' NIC latency, where the lab applies it, is
    added to every point's delay (_apply). Returns show_impairment() plus `expected` (the effective
    spec of every point) and `in_force` (whether what the engine or qdisc reports, read back
    after setting, is exactly that: the objects compared, lab.impair.kernel.differences for
    netem).
    """
    st = _state(lab)
    base = st.get("base") or {}
    changes = []
    for p in [Point(**x) for x in st["points"]]:
        own = Impairment.from_json(base[_key(p)]) if base.get(_key(p)) else Impairment()
        d = point_spec(imp, own)
        one = d.a2b if p.way == "fwd" else d.b2a
        if seed is not None and st["backend"] != "kernel-netem":
            one = with_seed(one, seed)
        changes.append((p, one))
    sent = _apply(lab, st, changes)
    st["applied"] = {_key(p): one.to_json() for p, one in changes}
    lab.save()
    shown, read = _show(lab)
    shown["expected"] = {k: str(v) for k, v in sent.items()}
    shown["in_force"] = in_force(st["backend"], read, sent)
    if seed is not None:
        shown["seed"] = (
            {"derived": seed, "applied": False, "why": "kernel netem: no seed with this tc"}
            if st["backend"] == "kernel-netem"
            else {"derived": seed, "applied": True}
        )
    warnings = [w for p, one in changes if (w := limit_warning(one, line_rate_bps(lab, p)))]
    if warnings:
        shown["warnings"] = sorted(set(warnings))
    return shown


def in_force(backend: str, read: dict[str, Impairment | None], sent: dict[str, Impairment]) -> bool:
    """Whether what the backend reports (`read`, _show's) equals what was sent (keys as
    _apply's). Netem: kernel.differences, which knows what tc cannot report; a key without a
    netem qdisc reads None. The engine: the same object, and an engine that did not answer has
    no key."""
    if backend == "kernel-netem":
        return all(not kernel.differences(v, read.get(k)) for k, v in sent.items())
    return all(read.get(k) == v for k, v in sent.items())


def set_impairment(lab, spec: str, target: str | None = None) -> dict:
    """Apply `spec` (tc-netem words, preset, or directional `client->server: ...; ...`): the
    `lab impair set WORDS` edge, and a topology link's `impair=` words (set_base). Words, not an
    object: they are read against each point's current state (a preset or `none` starts from
    scratch, `delay 50ms` keeps the jitter, `gap 5` needs the reorder in force), which differs
    from point to point.

    target None: every point of the lab's placement. target LINK ('router-server'), NODE
    ('router': every point on that node) or NODE:IFACE limits it to that link / node /
    interface's egress. Each point keeps the
    parameters the new spec does not mention ("setting one parameter keeps the others"): the
    rule for `lab impair set` at a shell. Plan points use set_point (exactly their own spec).
    """
    st = _state(lab)
    applied = st.setdefault("applied", {}) or {}
    changes = []
    for p in _select(lab, st, target):
        cur = Impairment.from_json(applied[_key(p)]) if applied.get(_key(p)) else Impairment()
        d = _parse(spec, lab, base=DirectionalImpairment(cur, cur))
        changes.append((p, d.a2b if p.way == "fwd" else d.b2a))
    _apply(lab, st, changes)
    for p, imp in changes:
        applied[_key(p)] = imp.to_json()
    st["applied"] = applied
    lab.save()
    return show_impairment(lab)


def check_request(lab, spec: str, target: str | None) -> None:
    """Refuse a bad `lab impair set` before anything changes: the spec's words and the target,
    against the lab's points or, on a lab without any yet, those its default placement makes."""
    st = lab.info.get("impair") or {
        "points": [asdict(p) for p in points(lab.spec, default_placement(lab.spec))]
    }
    _select(lab, st, target)
    _parse(spec, lab)


def set_base(lab, spec: str, target: str) -> None:
    """A topology link's own impairment (`impair=`): applied now and kept under every plan point
    (set_point)."""
    set_impairment(lab, spec, target)
    st = _state(lab)
    base = st.setdefault("base", {})
    for p in _select(lab, st, target):
        base[_key(p)] = st["applied"][_key(p)]
    lab.save()


def clear_impairment(lab) -> dict:
    if not lab.info.get("impair"):  # nothing was ever set: nothing to clear
        return show_impairment(lab)
    st = _state(lab)
    changes = [(Point(**p), Impairment()) for p in st["points"]]
    _apply(lab, st, changes)
    st["applied"] = {_key(p): Impairment().to_json() for p, _ in changes}
    lab.save()
    return show_impairment(lab)


def _select(lab, st, target: str | None) -> list[Point]:
    pts = [Point(**p) for p in st["points"]]
    if target in (None, DEFAULT):
        return pts
    if ":" in target:
        node, ifname = target.split(":", 1)
        sel = [p for p in pts if p.node == node and p.ifname == ifname]
    else:  # a link, or a node: every point on it (`lab impair set router ...`: both ways)
        sel = [p for p in pts if _link_name(lab.spec, p.link) == target]
        sel = sel or [p for p in pts if p.node == target]
    if not sel:
        valid = sorted(
            {f"{p.node}:{p.ifname}" for p in pts}
            | {_link_name(lab.spec, p.link) for p in pts}
            | {p.node for p in pts}
        )
        raise ConfigError(
            f"unknown impairment target {target!r}; valid: {', '.join(valid)}", source="TARGET"
        )
    return sel


def _link_name(spec: LabSpec, idx: int) -> str:
    lk = spec.links[idx]
    return f"{lk.node1}-{lk.node2}"


def _apply(lab, st: dict, changes: list[tuple[Point, Impairment]]) -> dict[str, Impairment]:
    """Put each change in place with the default queue limit filled in; returns what was sent,
    keyed as show_impairment's read-back (kernel: NODE:DEV, engine: ENGINE:DIR)."""
    # a time-dilated lab gets every impairment in slow motion here, the one place all of them
    # pass (plan points, `lab impair set`, a link's own impair=): delays x d, rates / d. The
    # queue limit is reckoned undilated (its packets are the same: rate / d x delay x d)
    # the boards' NICs (lab.substrate.local.cpuplan.nic_point_delays, recorded at `lab up` as `nic_us`) are
    # added here too, under every spec, `clear` included: part of the board, not an impairment
    nic = st.get("nic_us") or {}
    d = dilation.factor(lab.spec.dilation)
    changes = [
        (
            p,
            dilation.impairment(
                with_queue_limit(with_nic(imp, nic.get(_key(p), 0)), line_rate_bps(lab, p)), d
            ),
        )
        for p, imp in changes
    ]
    sent: dict[str, Impairment] = {}
    if st["backend"] == "kernel-netem":
        for _p, imp in changes:  # every point checked before the first changes
            kernel.refuse_engine_only(imp)
        for p, imp in changes:
            node = lab.node(p.node)
            dev = f"ifb{p.link}" if st["placement"] == "ingress" else p.ifname
            sent[f"{p.node}:{dev}"] = imp
            if st["placement"] == "ingress":
                ifb = f"ifb{p.link}"
                argvs = (
                    kernel.apply_argvs(p.ifname, imp, placement="ingress", ifb=ifb)
                    if not imp.is_empty()
                    else [kernel.clear_argv(ifb)]
                )
            else:
                parent = netem_parent(node, p.ifname)
                argvs = (
                    [kernel.netem_argv(p.ifname, imp, parent=parent)]
                    if not imp.is_empty()
                    else [kernel.clear_argv(p.ifname, parent=parent)]
                )
            for argv in argvs:
                node.run(argv, check=not imp.is_empty())
        return sent
    for eng in st["engines"]:
        rev = "b2a" if eng["fwd_dir"] == "a2b" else "a2b"
        for p, imp in changes:
            # middlebox: the router's two egresses both live on the one engine (module doc)
            if eng["link"] == p.link or st["placement"] == "middlebox":
                d = eng["fwd_dir"] if p.way == "fwd" else rev
                engine_client(lab, eng).set(d, imp.to_json())
                sent[f"{eng['name']}:{d}"] = imp
    return sent


def engine_client(lab, eng: dict):
    """The control client of engine `eng`: its socket here, or on the board that runs it
    (lab.substrate.boards.impair puts `board_node` in its record)."""

    if eng.get("board_node"):
        return NodeEngineClient(lab.node(eng["board_node"]), eng["control"])
    return EngineClient(eng["control"])


def netem_parent(node, ifname: str) -> str:
    """Where the netem of an egress point goes: the root, or -- when the link has a bandwidth
    (a tbf root qdisc, lab.core.netops.set_tbf) -- the tbf's class, so that shaping and impairment
    stack instead of one replacing the other (tbf -> netem, as tc-tbf(8)/tc-netem(8) show)."""
    cp = node.run(kernel.show_argv(ifname), check=False)
    if cp.returncode == 0:
        for q in json.loads(cp.stdout or "[]"):
            if q.get("root") and q.get("kind") == "tbf":
                return f"{q['handle'].rstrip(':')}:1"
    return "root"


def show_impairment(lab) -> dict:
    """The lab's impairment as `lab impair show` prints it: what was requested and what the
    engine or qdisc reports in force, in tc-netem words."""
    return _show(lab)[0]


def _show(lab) -> tuple[dict, dict[str, Impairment | None]]:
    """show_impairment's answer, and what the backend reports in force as objects, keyed as
    _apply's `sent` (kernel: NODE:DEV, None where no netem qdisc is; engine: ENGINE:DIR, none
    for an engine that did not answer)."""
    read: dict[str, Impairment | None] = {}
    st = lab.info.get("impair")
    if not st:
        out = {"backend": None, "placement": None, "applied": None, "note": "no impairment points"}
        return out, read
    out = {k: st[k] for k in ("backend", "placement", "why") if k in st}
    if dilation.factor(lab.spec.dilation) != 1.0:
        out["dilation"] = dilation.factor(lab.spec.dilation)
        out["note"] = (
            f"time-dilated x{out['dilation']:g}: 'requested' is in real time, 'applied' what is "
            "in force in the slowed-down lab (delays x the factor, rates / it)"
        )
    if st.get("backend") in WIRE_PACKETS:
        out["wire_packets"] = WIRE_PACKETS[st["backend"]]
        if st.get("offloads_off"):
            out["offloads_off"] = st["offloads_off"]
    out["requested"] = {
        k: str(Impairment.from_json(v)) for k, v in (st.get("applied") or {}).items()
    }
    out["points"] = [f"{p['node']}:{p['ifname']} ({p['way']})" for p in st["points"]]
    out["where"] = directions(lab.spec, st)  # each key's link, direction and tunnel direction
    if st.get("base") or st.get("nic_us"):
        out["base"] = base_text(st)
    if st["backend"] == "kernel-netem":
        real = {}
        for p in st["points"]:
            dev = f"ifb{p['link']}" if st["placement"] == "ingress" else p["ifname"]
            node = lab.node(p["node"])
            parent = "root" if st["placement"] == "ingress" else netem_parent(node, dev)
            cp = node.run(kernel.show_argv(dev), check=False)
            imp = (
                kernel.parse_tc_qdisc_show_json(cp.stdout, dev=dev, parent=parent)
                if cp.returncode == 0
                else None
            )
            read[f"{p['node']}:{dev}"] = imp
            real[f"{p['node']}:{dev}"] = str(imp) if imp is not None else "none"
        out["applied"] = real
    else:
        eng_out = {}
        for eng in st["engines"]:
            try:
                eng_out[eng["name"]] = engine_client(lab, eng).show()
            except Exception as e:  # an engine that died is part of what "show" must tell
                eng_out[eng["name"]] = {"error": str(e)}
        out["engines"] = eng_out
        applied: dict[str, dict] = {}
        for name, e in eng_out.items():
            applied[name] = {}
            for d, v in e.items():
                if d not in ("a2b", "b2a"):
                    continue
                if isinstance(v, dict) and "spec" in v:
                    read[f"{name}:{d}"] = Impairment.from_json(v["spec"], source=name)
                    v = str(read[f"{name}:{d}"])
                applied[name][d] = v
        brief_traces(eng_out)  # after `read`: a trace's opportunities are not for people
        out["applied"] = applied
    return out, read


# ------------------------------------------------------------------------------- build time


@dataclass
class ImpairPlan:
    backend: str
    why: str
    placement: str
    points: list[Point]
    engine_links: list[int]
    #: what the lab starts with, put in force by set_point once the points exist
    initial: DirectionalImpairment


def plan_for(
    spec: LabSpec, placement: str | None, initial: str, backend: str, why: str
) -> ImpairPlan:
    """The plan of a lab's impairment points; `initial` is the `lab up --impair` words (or
    "none"), parsed here, once: bad input is refused before anything is created."""
    placement = placement or default_placement(spec)
    pts = points(spec, placement)
    a, b = spec.endpoints("vpn")
    first = parse_directional(initial, source="--impair", a=a, b=b)
    links = engine_links(spec, placement) if backend == "userspace" else []
    if backend == "userspace" and placement == "ingress":
        why += "; with the engine, ingress and egress placements both act on the wire"
    return ImpairPlan(backend, why, placement, pts, links, first)


def plan_json(p: ImpairPlan) -> dict:
    return {
        "backend": p.backend,
        "why": p.why,
        "placement": p.placement,
        "points": [asdict(x) for x in p.points],
        "engines": [],
        "applied": {},
    }


def engine_fwd_dir(spec: LabSpec, link: int) -> str:
    """Which engine direction (a = node1 side) carries vpn-client -> vpn-server traffic."""
    a, b = spec.endpoints("vpn")
    for idx, frm, _to in path_links(spec, a, b):
        if idx == link:
            return "a2b" if spec.links[idx].node1 == frm else "b2a"
    return "a2b"
