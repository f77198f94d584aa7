"""Graph search over a topology: the one place the lab walks links and segments.

Pure functions over topology data (lab.model.topology's NodeSpec / Interface / LinkSpec, or anything
with the same fields), so lab.model.topology can use them before its LabSpec exists:
- `adjacency(links)`: node -> [(link index, neighbour)], in link order;
- `shortest_path(nodes, links, a, b)`: the links of the fewest-hop path a -> b that passes only
  through switches and routers;
- `reachable_segments(nodes, start)`: every L2 segment a host reaches through forwarding hosts,
  with the hop count, the start's outgoing interface and the first router on the way.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


def adjacency(links: Iterable[Any]) -> dict[str, list[tuple[int, str]]]:
    """{node: [(link index, neighbour), ...]} in link order (both directions)."""
    adj: dict[str, list[tuple[int, str]]] = {}
    for lk in links:
        adj.setdefault(lk.node1, []).append((lk.index, lk.node2))
        adj.setdefault(lk.node2, []).append((lk.index, lk.node1))
    return adj


def shortest_path(
    nodes: Mapping[str, Any], links: Iterable[Any], a: str, b: str
) -> list[tuple[int, str, str]] | None:
    """Links on the shortest path a -> b as (link index, from node, to node); only switches and
    routers are passed through. None when b cannot be reached."""
    adj = adjacency(links)
    prev: dict[str, tuple[str, int]] = {a: ("", -1)}
    q = deque([a])
    while q:
        n = q.popleft()
        if n == b:
            break
        for idx, m in adj.get(n, []):
            node = nodes[m]
            passable = m == b or node.kind == "switch" or node.router
            if m not in prev and passable:
                prev[m] = (n, idx)
                q.append(m)
    if b not in prev:
        return None
    out = []
    n = b
    while n != a:
        p, idx = prev[n]
        out.append((idx, p, n))
        n = p
    return list(reversed(out))


def segment_members(nodes: Mapping[str, Any]) -> dict[int, list[Any]]:
    """{segment: host interfaces on it} (switch ports are bridge members, not listed)."""
    members: dict[int, list[Any]] = {}
    for nd in nodes.values():
        if nd.kind == "host":
            for i in nd.interfaces:
                members.setdefault(i.segment, []).append(i)
    return members


@dataclass(frozen=True)
class Reach:
    """How host `start` reaches a segment."""

    #: forwarding hosts crossed (0: the start is on the segment)
    hops: int
    #: the start's interface the way leaves by
    out: Any
    #: the first router's interface on out's segment (the next hop); None when hops == 0
    via: Any | None


def reachable_segments(
    nodes: Mapping[str, Any],
    start: str,
    *,
    skip_ifs: Iterable[str] = (),
    blocked: Iterable[str] = (),
) -> dict[int, Reach]:
    """Segments host `start` reaches through forwarding (router=True) hosts, breadth first:
    {segment: Reach}. The start's interfaces in `skip_ifs` are not used to leave, and hosts in
    `blocked` do not forward."""
    members = segment_members(nodes)
    skip, stop = set(skip_ifs), {start, *blocked}
    seen: dict[int, Reach] = {}
    q: deque[int] = deque()
    for i in nodes[start].interfaces:
        if i.name not in skip and i.segment not in seen:
            seen[i.segment] = Reach(0, i, None)
            q.append(i.segment)
    while q:
        seg = q.popleft()
        r = seen[seg]
        for m in members.get(seg, []):
            if m.node in stop or not nodes[m.node].router:
                continue
            for other in nodes[m.node].interfaces:
                if other.segment not in seen:
                    seen[other.segment] = Reach(r.hops + 1, r.out, r.via if r.hops else m)
                    q.append(other.segment)
    return seen
