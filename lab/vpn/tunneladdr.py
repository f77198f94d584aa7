"""The tunnel addresses of a profile that carries the user's own files (docs/byoc.md):

    [tunnel]                        # written by `lab profiles import` from the user's files
    client = ["172.30.9.2/24"]      # IPv4, and IPv6 when the files have it
    server = ["172.30.9.1/24"]

A profile with this table runs its tunnel with exactly these addresses: an IPv4-only table is an
IPv4-only tunnel (no fd99:: address, no IPv6 ping; a test that needs IPv6 says it does not
apply). load() checks the table when the profile loads, collision() against a topology's
underlay when the tunnel is placed, and from_files() derives it on import: the user's addressing
is kept unless it falls in the pools the lab's underlay takes its addresses from (then the lab's
10.99.0.0/24, fd99::/64 replace it, and a note says so). Pure.
"""

from __future__ import annotations

import ipaddress

from lab.core.errors import ConfigError
from lab.model.addressing import AUTO_V4
from lab.model.labspec import LabSpec
from lab.vpn.base import Driver

ROLES = ("client", "server")
LAB_V4 = ipaddress.ip_network("10.99.0.0/24")
LAB_V6 = ipaddress.ip_network("fd99::/64")
#: where the underlay's automatic addresses come from (lab.model.addressing)
UNDERLAY = (AUTO_V4, ipaddress.ip_network("fd00::/48"))

Iface = ipaddress.IPv4Interface | ipaddress.IPv6Interface


def load(table: dict, src: str) -> dict[str, tuple[str, str]]:
    """{role: (v4 with prefix, v6 with prefix or "")} of a profile's [tunnel] table, checked."""
    for key in table:
        if key not in ROLES:
            raise ConfigError(
                f"unknown role {key!r}; valid: {', '.join(ROLES)}",
                source=src,
                field=f"tunnel.{key}",
            )
    out = {}
    for role in ROLES:
        where = f"tunnel.{role}"
        value = table.get(role)
        if not isinstance(value, list) or not value or not all(isinstance(x, str) for x in value):
            raise ConfigError(
                'missing: a list of this end\'s tunnel addresses with prefix, e.g. ["172.30.9.1/24"]'
                " (IPv4, and IPv6 when the tunnel carries it)",
                source=src,
                field=where,
            )
        fams: dict[int, str] = {}
        for text in value:
            try:
                if "/" not in text:
                    raise ValueError(text)
                iface = ipaddress.ip_interface(text)
            except ValueError:
                raise ConfigError(
                    f"{text!r} is not an address with prefix (e.g. 172.30.9.1/24, fd99::1/64)",
                    source=src,
                    field=where,
                ) from None
            if iface.version in fams:
                raise ConfigError(
                    f"one address per family; got {fams[iface.version]!r} and {text!r}",
                    source=src,
                    field=where,
                )
            fams[iface.version] = str(iface)
        if 4 not in fams:
            raise ConfigError(
                "needs an IPv4 address: the lab's tunnel always carries IPv4",
                source=src,
                field=where,
            )
        out[role] = (fams[4], fams.get(6, ""))
    if bool(out["client"][1]) != bool(out["server"][1]):
        raise ConfigError(
            "give both ends an IPv6 address or neither (an IPv4-only tunnel)",
            source=src,
            field="tunnel",
        )
    for fam in (0, 1):
        if out["client"][fam] and _ip(out["client"][fam]) == _ip(out["server"][fam]):
            raise ConfigError(
                f"both ends have the address {_ip(out['client'][fam])}", source=src, field="tunnel"
            )
    return out


def _ip(text: str):
    return ipaddress.ip_interface(text).ip


def collision(spec: LabSpec, table: dict[str, tuple[str, str]], src: str) -> None:
    """ConfigError when a tunnel network overlaps a segment of the topology's underlay (the
    tunnel's routes would hide the underlay's, and the tunnel would carry itself)."""
    for role in ROLES:
        for text in table[role]:
            if not text:
                continue
            net = ipaddress.ip_interface(text).network
            for seg in spec.segments:
                for other in (seg.v4, seg.v6):
                    if other and net.overlaps(ipaddress.ip_network(other)):
                        raise ConfigError(
                            f"the tunnel address {text} overlaps the underlay segment {other} "
                            f"of {spec.source}: choose a tunnel network outside the underlay "
                            f"(e.g. {LAB_V4 if net.version == 4 else LAB_V6})",
                            source=src,
                            field=f"tunnel.{role}",
                        )


def in_underlay(iface: Iface) -> bool:
    return any(iface.network.overlaps(pool) for pool in UNDERLAY if pool.version == iface.version)


def lab_default(version: int, host: int, prefix: int | None = None) -> Iface:
    net = LAB_V4 if version == 4 else LAB_V6
    return ipaddress.ip_interface(f"{net.network_address + host}/{prefix or net.prefixlen}")


def other_host(iface: Iface, taken: list) -> Iface:
    """A host of `iface`'s network that is neither `iface` nor one of `taken`: the first free."""
    net = iface.network
    if net.num_addresses <= 2:  # /31, /32: the next address
        return ipaddress.ip_interface(f"{iface.ip + 1}/{net.prefixlen}")
    for k in range(1, min(net.num_addresses - 1, 1 << 16)):
        ip = net.network_address + k
        if ip != iface.ip and ip not in taken:
            return ipaddress.ip_interface(f"{ip}/{net.prefixlen}")
    raise ValueError(f"{net} has no free host address")


def toml_lines(table: dict[str, list[Iface]]) -> list[str]:
    return [
        "[tunnel]",
        *(
            f"{role} = [{', '.join(repr(str(a)).replace(chr(39), chr(34)) for a in table[role])}]"
            for role in ROLES
        ),
        "",
    ]


def from_files(driver: str, tpls: list, note) -> dict[str, list[Iface]] | None:
    """{role: [v4, v6?]}: the tunnel addresses the imported files give (each template's `addrs`
    and `peer_addrs`: (line, interface)), kept where they do not fall in the lab's underlay
    pools; replaced there by the lab's, `note(file, line, why)` saying so. None: the files give
    no address (the lab's layout then, as for a hand-written profile)."""
    ends: dict[str, dict] = {"client": {}, "server": {}}
    for t in tpls:
        other = "server" if t.role == "client" else "client"
        for n, a in t.addrs:
            ends[t.role].setdefault(a.version, (a, t.source, n))
        for n, a in t.peer_addrs:
            ends[other].setdefault(a.version, (a, t.source, n))
    if not ends["client"] and not ends["server"]:
        return None
    for role, other in (("client", "server"), ("server", "client")):
        for v, (a, src, n) in list(ends[role].items()):
            if v not in ends[other]:  # one file for both ends: the peer gets the next free host
                ends[other][v] = (other_host(a, [a.ip]), src, n)
    hosts = {"client": 2, "server": 1} if driver == "openvpn" else {"client": 1, "server": 2}
    for v in (4, 6):
        found = [ends[r][v] for r in ROLES if v in ends[r]]
        lab = LAB_V4 if v == 4 else LAB_V6
        bad = [f for f in found if in_underlay(f[0])]
        if bad:
            a, src, n = bad[0]
            pools = ", ".join(map(str, UNDERLAY))
            note(
                src,
                n,
                f"the tunnel network {a.network} falls in the lab's underlay (its "
                f"addresses come from {pools}): the lab's {lab} replaces it",
            )
        elif v == 4 and not found:
            src, n = tpls[0].source, 1
            note(
                src,
                n,
                f"no IPv4 tunnel address in the files: the lab's tunnel always "
                f"carries IPv4, the lab's {lab} is added",
            )
        else:
            continue
        for r in ROLES:
            ends[r][v] = (lab_default(v, hosts[r]), src, n)
    return {r: [ends[r][v][0] for v in (4, 6) if v in ends[r]] for r in ROLES}


def tunnel_routes(
    spec: LabSpec, drv: Driver, client, server, addrs: list[str] | None = None
) -> list[tuple[str, list[str]]]:
    """(node, `ip route replace` argv) for hosts behind either end: the tunnel nets (of
    `addrs`, the ends' tunnel addresses; default the lab's) via the router that leads them to
    that end (their default route may be IPv4 only, or absent)."""
    if not drv.has_tunnel:
        return []
    nets = [LAB_V4, LAB_V6]
    if addrs:
        nets = list(dict.fromkeys(ipaddress.ip_interface(a).network for a in addrs if a))
    out = []
    for side in (client, server):
        end_seg = next(
            i.segment for i in spec.nodes[side.node].interfaces if i.name == side.underlay_if
        )
        far = set(side.behind)
        for n in spec.hosts():
            if n.name in (client.node, server.node):
                continue
            if not any(
                i.segment < len(spec.segments) and spec.segments[i.segment].v4 in far
                for i in n.interfaces
            ):
                continue
            seg = spec.segments[end_seg]
            for net in nets:
                dst = seg.v4 if net.version == 4 else seg.v6
                r = next((r for r in n.routes if r["dst"] == dst), None)
                if r:
                    fam = "-6" if net.version == 6 else "-4"
                    via = ["via", r["via"], "dev", r["dev"]]
                    out.append((n.name, ["ip", fam, "route", "replace", str(net), *via]))
    return out


def first_hosts(n: int, value: str) -> list:
    """(line, first host of the first net of each family) of a traffic selector list: the
    tunnel address the lab puts on that end (10.1.0.0/16 -> 10.1.0.1/16)."""
    out, seen = [], set()
    for item in (x.strip() for x in value.split(",") if x.strip()):
        try:
            net = ipaddress.ip_network(item.split("[")[0], strict=False)
        except ValueError:
            continue  # a range or `dynamic`: strongSwan's business, no address to keep
        if net.version not in seen:
            seen.add(net.version)
            host = net[1] if net.num_addresses > 2 else net[0]
            out.append((n, ipaddress.ip_interface(f"{host}/{net.prefixlen}")))
    return out


def openvpn_net(t, n: int, words: list[str]) -> None:
    """`server NET MASK` / `server-ipv6 NET/LEN`: the server takes the net's first address, the
    client (whatever the server pushes, read after start) is given the second."""
    try:
        net = ipaddress.ip_network("/".join(words[1:3]) if words[0] == "server" else words[1])
    except (ValueError, IndexError):
        return
    if net.num_addresses > 4:
        t.addrs.append((n, ipaddress.ip_interface(f"{net[1]}/{net.prefixlen}")))
        t.peer_addrs.append((n, ipaddress.ip_interface(f"{net[2]}/{net.prefixlen}")))
