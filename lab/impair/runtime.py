"""Impairment in a lab: where it goes (placement), which backend applies it, and run-time control.

Placement resolves to *impairment points*: "the egress of interface IF on node N" (a direction
of one link). Backends:
  kernel-netem — `tc qdisc replace ... netem` on that interface (ingress placement: via ifb);
  userspace    — the lab's engine (engine/, lab-impaird) in a hidden bump-in-the-wire namespace
                 spliced into the link at build time; one engine per link, one spec per direction.
With the engine every placement acts as wire impairment: the endpoints' stacks never see drops
(kernel egress netem reports them to the local stack). A middlebox placement with the engine
puts both directions on the router's link towards the VPN server: one engine hop on the path,
the same end-to-end effect as netem on the router's two interfaces.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import ConfigError, PreconditionError
from ..topology import LabSpec
from . import kernel
from .spec import DirectionalImpairment, Impairment, parse_directional

DEFAULT = "default"
BUMP_A, BUMP_B = "imp-a", "imp-b"


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
    adj: dict[str, list[tuple[int, str]]] = {}
    for lk in spec.links:
        adj.setdefault(lk.node1, []).append((lk.index, lk.node2))
        adj.setdefault(lk.node2, []).append((lk.index, lk.node1))
    prev: dict[str, tuple[str, int]] = {a: ("", -1)}
    q = deque([a])
    while q:
        n = q.popleft()
        if n == b:
            break
        for idx, m in adj.get(n, []):
            node = spec.nodes[m]
            passable = m == b or node.kind == "switch" or node.router
            if m not in prev and passable:
                prev[m] = (n, idx)
                q.append(m)
    if b not in prev:
        raise ConfigError(f"no underlay path between {a} and {b}", source=spec.source)
    out = []
    n = b
    while n != a:
        p, idx = prev[n]
        out.append((idx, p, n))
        n = p
    return list(reversed(out))


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
    """("kernel-netem" | "userspace", why). probe_node: any node of the lab (lab.node(...))."""
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
        raise PreconditionError(
            f"lab {lab.id!r} was built without impairment points; rebuild it with "
            "`lab up TOPOLOGY --impair none` (or a spec) to impair it at run time"
        )
    return st


def _key(p: Point) -> str:
    return f"{p.node}:{p.ifname}"


def set_impairment(lab, spec: str, target: str | None = None) -> dict:
    """Apply `spec` (tc-netem words, preset, or directional `client->server: ...; ...`).

    target None: every point of the lab's placement. target LINK ('router-server') or
    NODE:IFACE limits it to that link / that interface's egress. Each point keeps the
    parameters the new spec does not mention ("setting one parameter keeps the others").
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


def clear_impairment(lab) -> dict:
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
    else:
        sel = [p for p in pts if _link_name(lab.spec, p.link) == target]
    if not sel:
        valid = sorted(
            {f"{p.node}:{p.ifname}" for p in pts} | {_link_name(lab.spec, p.link) for p in pts}
        )
        raise ConfigError(
            f"unknown impairment target {target!r}; valid: {', '.join(valid)}", source="TARGET"
        )
    return sel


def _link_name(spec: LabSpec, idx: int) -> str:
    lk = spec.links[idx]
    return f"{lk.node1}-{lk.node2}"


def _apply(lab, st: dict, changes: list[tuple[Point, Impairment]]) -> None:
    if st["backend"] == "kernel-netem":
        for p, imp in changes:
            node = lab.node(p.node)
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
        return
    from .engine import EngineClient

    for eng in st["engines"]:
        rev = "b2a" if eng["fwd_dir"] == "a2b" else "a2b"
        for p, imp in changes:
            # middlebox: the router's two egresses both live on the one engine (module doc)
            if eng["link"] == p.link or st["placement"] == "middlebox":
                EngineClient(eng["control"]).set(
                    eng["fwd_dir"] if p.way == "fwd" else rev, imp.to_json()
                )


def netem_parent(node, ifname: str) -> str:
    """Where the netem of an egress point goes: the root, or -- when the link has a bandwidth
    (a tbf root qdisc, lab.netops.set_tbf) -- the tbf's class, so that shaping and impairment
    stack instead of one replacing the other (tbf -> netem, as tc-tbf(8)/tc-netem(8) show)."""
    cp = node.run(kernel.show_argv(ifname), check=False)
    if cp.returncode == 0:
        for q in json.loads(cp.stdout or "[]"):
            if q.get("root") and q.get("kind") == "tbf":
                return f"{q['handle'].rstrip(':')}:1"
    return "root"


def show_impairment(lab) -> dict:
    st = lab.info.get("impair")
    if not st:
        return {"backend": None, "placement": None, "applied": None, "note": "no impairment points"}
    out = {k: st[k] for k in ("backend", "placement", "why") if k in st}
    out["requested"] = {
        k: str(Impairment.from_json(v)) for k, v in (st.get("applied") or {}).items()
    }
    out["points"] = [f"{p['node']}:{p['ifname']} ({p['way']})" for p in st["points"]]
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
            real[f"{p['node']}:{dev}"] = str(imp) if imp is not None else "none"
        out["applied"] = real
    else:
        from .engine import EngineClient

        eng_out = {}
        for eng in st["engines"]:
            try:
                eng_out[eng["name"]] = EngineClient(eng["control"]).show()
            except Exception as e:  # an engine that died is part of what "show" must tell
                eng_out[eng["name"]] = {"error": str(e)}
        out["engines"] = eng_out
        out["applied"] = {
            name: {
                d: str(Impairment.from_json(v["spec"]))
                if isinstance(v, dict) and "spec" in v
                else v
                for d, v in e.items()
                if d in ("a2b", "b2a")
            }
            for name, e in eng_out.items()
        }
    return out


# ------------------------------------------------------------------------------- build time


@dataclass
class ImpairPlan:
    backend: str
    why: str
    placement: str
    points: list[Point]
    engine_links: list[int]
    initial: str


def plan_for(
    spec: LabSpec, placement: str | None, initial: str, backend: str, why: str
) -> ImpairPlan:
    placement = placement or default_placement(spec)
    pts = points(spec, placement)
    # validate the spec now: bad input is refused before anything is created
    a, b = spec.endpoints("vpn")
    parse_directional(initial, source="--impair", a=a, b=b)
    links = engine_links(spec, placement) if backend == "userspace" else []
    if backend == "userspace" and placement == "ingress":
        why += "; with the engine, ingress and egress placements both act on the wire"
    return ImpairPlan(backend, why, placement, pts, links, initial)


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


def write_engine_config(path: Path, a2b: dict, b2a: dict) -> None:
    path.write_text(json.dumps({"a2b": a2b, "b2a": b2a}))
