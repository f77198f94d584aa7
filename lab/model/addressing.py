"""Addresses and routes for a topology: L2 segments, their subnets, every host interface's
addresses and every host's static routes (docs/design.md "Addressing and routes").

Pure data over lab.model.labspec's objects; every conflict is a ConfigError naming the file and the
links or host concerned.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from lab.core.errors import ConfigError
from lab.model.graph import reachable_segments
from lab.model.labspec import Interface, LinkSpec, NodeSpec, Segment

# Auto-addressing pools for segments without explicit addresses.
AUTO_V4 = ipaddress.ip_network("10.0.0.0/16")
AUTO_V6_PREFIX = "fd00:0:0:{:x}::/64"


def _iface(value, version, source, where, fld):
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        iface = ipaddress.ip_interface(value)
    except ValueError:
        raise ConfigError(
            f"{fld} must be an IPv{version} address with prefix, e.g. "
            f"{'10.0.1.2/24' if version == 4 else 'fd00:1::2/64'}; got {value!r}",
            source=source,
            field=where,
        )
    if iface.version != version:
        raise ConfigError(f"{fld} must be IPv{version}, got {value!r}", source=source, field=where)
    if "/" not in str(value):
        iface = ipaddress.ip_interface(f"{iface.ip}/{24 if version == 4 else 64}")
    if iface.ip == iface.network.network_address and iface.network.prefixlen < (
        31 if version == 4 else 127
    ):
        raise ConfigError(f"{fld} {value} is the network address", source=source, field=where)
    return iface


def assign(nodes, links, link_addrs, source) -> list[Segment]:
    """Group links into L2 segments (switches join theirs), then address every host interface."""
    parent = list(range(len(links)))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    by_switch: dict[str, list[int]] = {}
    for lk in links:
        for nd in (lk.node1, lk.node2):
            if nodes[nd].kind == "switch":
                by_switch.setdefault(nd, []).append(lk.index)
    for idxs in by_switch.values():
        for i in idxs[1:]:
            parent[find(i)] = find(idxs[0])
    groups: dict[int, list[int]] = {}
    for lk in links:
        groups.setdefault(find(lk.index), []).append(lk.index)

    # interfaces (hosts only carry addresses; switch ports are bridge members)
    seg_of_link = {}
    seg_list = list(groups.values())
    for si, idxs in enumerate(seg_list):
        for i in idxs:
            seg_of_link[i] = si
    first_if_seen: set[str] = set()
    explicit: dict[int, list[tuple[Interface, Any, Any, str]]] = {
        i: [] for i in range(len(seg_list))
    }
    for lk in links:
        for end, node, ifn, peer, peer_if in (
            (1, lk.node1, lk.intf1, lk.node2, lk.intf2),
            (2, lk.node2, lk.intf2, lk.node1, lk.intf1),
        ):
            nd = nodes[node]
            intf = Interface(node, ifn, peer, peer_if, lk.index, seg_of_link[lk.index])
            nd.interfaces.append(intf)
            if nd.kind != "host":
                continue
            where = f"link {lk.node1}-{lk.node2} ({node}:{ifn})"
            p = link_addrs[lk.index][end]
            v4, v6 = p.get("ip"), p.get("ip6")
            if node not in first_if_seen:
                first_if_seen.add(node)
                v4 = v4 if v4 is not None else getattr(nd, "_ip", None)
                v6 = v6 if v6 is not None else getattr(nd, "_ip6", None)
            i4 = _iface(v4, 4, source, where, "ip") if v4 is not None else None
            i6 = _iface(v6, 6, source, where, "ip6") if v6 is not None else None
            explicit[seg_of_link[lk.index]].append((intf, i4, i6, where))
    for nd in nodes.values():
        for a in ("_ip", "_ip6"):
            if hasattr(nd, a):
                if getattr(nd, a) is not None and not nd.interfaces:
                    raise ConfigError(
                        f"{a[1:]} given but the host has no links",
                        source=source,
                        field=f"host {nd.name!r}",
                    )
                delattr(nd, a)

    segments: list[Segment] = []
    nets4: dict[int, ipaddress.IPv4Network] = {}
    nets6: dict[int, ipaddress.IPv6Network] = {}
    for si, items in explicit.items():
        for nets, col in ((nets4, 1), (nets6, 2)):
            found = {it[col].network: it for it in items if it[col] is not None}
            if len(found) > 1:
                a, b = list(found.values())[:2]
                raise ConfigError(
                    f"addresses {a[col]} ({a[3]}) and {b[col]} ({b[3]}) are on the same L2 segment"
                    " but in different subnets",
                    source=source,
                )
            if found:
                nets[si] = next(iter(found))
    # overlap between explicit subnets of different segments
    for nets in (nets4, nets6):
        items = sorted(nets.items())
        for i, (sa, na) in enumerate(items):
            for sb, nb in items[i + 1 :]:
                if na.overlaps(nb):
                    raise ConfigError(
                        f"subnets {na} and {nb} overlap but belong to different links "
                        f"({_seg_desc(seg_list[sa], links)} / {_seg_desc(seg_list[sb], links)})",
                        source=source,
                    )
    auto4 = (n for n in AUTO_V4.subnets(new_prefix=24))
    k6 = 0
    for si in range(len(seg_list)):
        if si not in nets4:
            for cand in auto4:
                if cand.network_address.packed[2] == 0:
                    continue  # keep 10.0.0.0/24 free: users often pick it by hand
                if not any(cand.overlaps(n) for n in nets4.values()):
                    nets4[si] = cand
                    break
        if si not in nets6:
            while True:
                k6 += 1
                cand = ipaddress.ip_network(AUTO_V6_PREFIX.format(k6))
                if not any(cand.overlaps(n) for n in nets6.values()):
                    nets6[si] = cand
                    break
        segments.append(Segment(si, str(nets4[si]), str(nets6[si]), list(seg_list[si])))
    # fill in addresses
    for si, items in explicit.items():
        for ver, nets, col in ((4, nets4, 1), (6, nets6, 2)):
            net = nets[si]
            used = {it[col].ip for it in items if it[col] is not None}
            dup = [it for it in items if it[col] is not None]
            seen = {}
            for it in dup:
                if it[col].ip in seen:
                    raise ConfigError(
                        f"address {it[col].ip} assigned twice ({seen[it[col].ip]} and {it[3]})",
                        source=source,
                    )
                seen[it[col].ip] = it[3]
            hosts_iter = net.hosts()
            for intf, i4, i6, where in items:
                given = i4 if ver == 4 else i6
                if given is not None:
                    value = f"{given.ip}/{net.prefixlen}"
                else:
                    for h in hosts_iter:
                        if h not in used:
                            used.add(h)
                            value = f"{h}/{net.prefixlen}"
                            break
                    else:
                        raise ConfigError(
                            f"subnet {net} has no free address left", source=source, field=where
                        )
                if ver == 4:
                    intf.ip = value
                else:
                    intf.ip6 = value
    return segments


def _seg_desc(idxs, links):
    return ", ".join(f"{links[i].node1}-{links[i].node2}" for i in idxs)


def compute_routes(nodes: dict[str, NodeSpec], segments: list[Segment], links: list[LinkSpec]):
    """Static routes: every host reaches every segment through the nearest forwarding hosts."""
    for nd in nodes.values():
        if nd.kind != "host":
            continue
        for seg, r in sorted(reachable_segments(nodes, nd.name).items()):
            if r.hops == 0:
                continue
            s = segments[seg]
            nd.routes.append({"dst": s.v4, "via": r.via.ip.split("/")[0], "dev": r.out.name})
            nd.routes.append({"dst": s.v6, "via": r.via.ip6.split("/")[0], "dev": r.out.name})


def check_default_route(n: NodeSpec, source: str):
    where = f"host {n.name!r}"
    words = n.default_route.split()
    if len(words) != 2 or words[0] not in ("via", "dev"):
        raise ConfigError(
            f"defaultRoute must be 'via ADDRESS' or 'dev IFNAME', got {n.default_route!r}",
            source=source,
            field=where,
        )
    if words[0] == "dev" and words[1] not in {i.name for i in n.interfaces}:
        raise ConfigError(
            f"defaultRoute names interface {words[1]!r}; the host has {[i.name for i in n.interfaces]}",
            source=source,
            field=where,
        )
    if words[0] == "via":
        try:
            addr = ipaddress.ip_address(words[1])
        except ValueError:
            raise ConfigError(
                f"defaultRoute via {words[1]!r} is not an IP address", source=source, field=where
            )
        nets = [
            ipaddress.ip_interface(i.ip if addr.version == 4 else i.ip6).network
            for i in n.interfaces
        ]
        if not any(addr in net for net in nets):
            raise ConfigError(
                f"defaultRoute gateway {addr} is on none of the host's subnets {[str(x) for x in nets]}",
                source=source,
                field=where,
            )
