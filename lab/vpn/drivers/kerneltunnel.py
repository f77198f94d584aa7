"""Unencrypted kernel tunnels (study B): GRE, IPIP, ip6gre, ip6tnl and L2TPv3 pseudowires.

One driver, one `kind` parameter. The rendered file per node is an `ip -batch` script
(`tunnel.ip`): what a board runs as `ip -batch tunnel.ip`, and exactly what start() runs in the
node. Tunnel addresses are the lab's usual 10.99.0.1/.2 and fd99::1/2; nothing is encrypted
(the capture test expects the plaintext marker on the wire).

    gre      GRE over IPv4 (ip_gre); carries IPv4 and IPv6
    ipip     IPv4-in-IPv4 (ipip) for IPv4; IPIP cannot carry IPv6, so a companion 6in4 link
             (sit, same endpoints) carries the fd99:: addresses
    ip6gre   GRE over IPv6 (ip6_gre); needs IPv6 underlay addresses
    ip6tnl   IP-in-IPv6, `mode any` (ip6_tunnel): IPv4 and IPv6 over an IPv6 underlay
    l2tpv3   L2TPv3 Ethernet pseudowire (l2tp_eth), UDP (port 1701) or IP encapsulation,
             static tunnel and session ids (`ip l2tp`, no control connection)

The kernel must have the module: check() probes by creating the link in a throwaway network
namespace on the node (`unshare --net`, kernelfeatures.probe_links), which dies with everything
in it. This CI host's kernel has none of
them: run such labs with `lab up --vm`.
"""

from __future__ import annotations

import json
from typing import ClassVar

from lab.core.errors import ConfigError, StartupError
from lab.core.node import Node
from lab.vpn.base import Availability, Driver, Endpoint, TunnelContext
from lab.core.tools import IP, PING
from lab.model.params import Param
from lab.vpn.kernelfeatures import probe_links

KINDS = ("gre", "ipip", "ip6gre", "ip6tnl", "l2tpv3")
IFNAME = {
    "gre": "gre1",
    "ipip": "ipip1",
    "ip6gre": "ip6gre1",
    "ip6tnl": "ip6tnl1",
    "l2tpv3": "l2tpeth1",
}
SIT_IFNAME = "sit1"  # the ipip kind's IPv6 companion
MODULE = {
    "gre": "ip_gre",
    "ipip": "ipip + sit",
    "ip6gre": "ip6_gre",
    "ip6tnl": "ip6_tunnel",
    "l2tpv3": "l2tp_eth (+ l2tp_ip for encap ip)",
}
#: L2TPv3 ids: each end's own tunnel/session id, the peer's are the other pair
L2TP_IDS = {"client": (1000, 1001), "server": (2000, 2001)}
CONFIG_FILE = "tunnel.ip"

# probes run in a throwaway namespace: TEST-NET addresses, never routed anywhere
_PROBES = {
    "gre": ["link add p type gre local 192.0.2.1 remote 192.0.2.2"],
    "ipip": [
        "link add p type ipip local 192.0.2.1 remote 192.0.2.2",
        "link add q type sit local 192.0.2.1 remote 192.0.2.2",
    ],
    "ip6gre": ["link add p type ip6gre local 2001:db8::1 remote 2001:db8::2"],
    "ip6tnl": ["link add p type ip6tnl mode any local 2001:db8::1 remote 2001:db8::2"],
    "l2tpv3": [
        "link set lo up",
        "addr add 192.0.2.1/24 dev lo",  # a route to the remote
        "l2tp add tunnel tunnel_id 1 peer_tunnel_id 1 encap {encap} local 192.0.2.1 "
        "remote 192.0.2.2{ports}",
        "l2tp add session name p tunnel_id 1 session_id 1 peer_session_id 1",
    ],
}


def _host(addr: str | None) -> str:
    return (addr or "").split("/")[0]


class KernelTunnelDriver(Driver):
    name = "kerneltunnel"
    params: ClassVar[dict[str, Param]] = {
        "kind": Param(str, "gre", "tunnel type", choices=KINDS),
        "mtu": Param(int, 0, "tunnel MTU (0: the kernel's default for the kind)", min=0, max=9000),
        "ttl": Param(int, 64, "outer TTL / hop limit (IP tunnels)", min=1, max=255),
        "encap": Param(str, "udp", "L2TPv3 encapsulation", choices=("udp", "ip")),
        "port": Param(int, 1701, "L2TPv3 UDP port (both ends)", min=1, max=65535),
    }

    requires = (IP, PING)

    def _probe_lines(self, params: dict) -> tuple[str, ...]:
        ports = (
            f" udp_sport {params['port']} udp_dport {params['port']}"
            if params["encap"] == "udp"
            else ""
        )
        return tuple(x.format(encap=params["encap"], ports=ports) for x in _PROBES[params["kind"]])

    def check(self, params: dict, node: Node) -> Availability:
        ok, why = probe_links(node, self._probe_lines(params))
        if ok:
            return Availability(True, "kernel")
        return Availability(
            False, "kernel", f"needs kernel module {MODULE[params['kind']]} (ip: {why}); use --vm"
        )

    def render(self, ctx: TunnelContext, params: dict, secrets: dict[str, str]) -> dict:
        return {end.name: {CONFIG_FILE: self._script(ctx, end, params)} for end in ctx.ends()}

    def _script(self, ctx: TunnelContext, end: Endpoint, params: dict) -> str:
        kind, peer = params["kind"], ctx.peer(end)
        role = "client" if end is ctx.client else "server"
        dev = IFNAME[kind]
        six = kind in ("ip6gre", "ip6tnl")
        local, remote = (
            (end.underlay_v6, peer.underlay_v6) if six else (end.underlay_v4, peer.underlay_v4)
        )
        if not local or not remote:
            raise ConfigError(
                f"kind {kind!r} needs IPv6 underlay addresses on both ends "
                f"({end.name}, {peer.name}); use gre/ipip or give them ip6=",
                source=ctx.profile or self.name,
                field="params.kind",
            )
        ttl = f"ttl {params['ttl']}" if not six else f"hoplimit {params['ttl']}"
        lines = [
            f"# lab: kernel tunnel {kind} ({MODULE[kind]}), node {end.name} ({role}), "
            f"profile {ctx.profile or self.name}",
            f"# apply with: ip -batch {CONFIG_FILE}",
        ]
        v6dev = dev
        if kind == "gre":
            lines.append(f"link add {dev} type gre local {local} remote {remote} {ttl}")
        elif kind == "ipip":
            lines.append(f"link add {dev} type ipip local {local} remote {remote} {ttl}")
            lines.append(f"link add {SIT_IFNAME} type sit local {local} remote {remote} {ttl}")
            v6dev = SIT_IFNAME
        elif kind == "ip6gre":
            lines.append(f"link add {dev} type ip6gre local {local} remote {remote} {ttl}")
        elif kind == "ip6tnl":
            lines.append(f"link add {dev} type ip6tnl mode any local {local} remote {remote} {ttl}")
        else:
            mine, theirs = L2TP_IDS[role], L2TP_IDS["server" if role == "client" else "client"]
            ports = (
                f" udp_sport {params['port']} udp_dport {params['port']}"
                if params["encap"] == "udp"
                else ""
            )
            lines.append(
                f"l2tp add tunnel tunnel_id {mine[0]} peer_tunnel_id {theirs[0]} "
                f"encap {params['encap']} local {local} remote {remote}{ports}"
            )
            lines.append(
                f"l2tp add session name {dev} tunnel_id {mine[0]} session_id {mine[1]} "
                f"peer_session_id {theirs[1]}"
            )
        for d in dict.fromkeys((dev, v6dev)):
            mtu = f" mtu {params['mtu']}" if params["mtu"] else ""
            lines.append(f"link set {d}{mtu} up")
        lines.append(f"addr add {end.tunnel_v4} dev {dev}")
        if end.tunnel_v6:
            lines.append(f"addr add {end.tunnel_v6} dev {v6dev} nodad")
        # networks behind the peer go through the tunnel (`replace`: the underlay route must
        # stop carrying them). The L2TPv3 pseudowire is Ethernet: route via the peer's address.
        for net in peer.behind:
            v6 = ":" in net
            via = ""
            if kind == "l2tpv3":
                via = f" via {_host(peer.tunnel_v6 if v6 else peer.tunnel_v4)}"
            lines.append(f"route replace {net}{via} dev {v6dev if v6 else dev}")
        return "\n".join(lines) + "\n"

    def start(self, ctx: TunnelContext, params: dict, rendered: dict) -> None:
        for end in ctx.ends():
            path = ctx.write_config(end, rendered[end.name])[CONFIG_FILE]
            cp = end.node.run(["ip", "-batch", str(path)], check=False, timeout=30)
            if cp.returncode != 0:
                raise StartupError(
                    f"{params['kind']} tunnel on {end.name}: `ip -batch {path}` failed "
                    f"(exit {cp.returncode}): {cp.stderr.strip()[-400:]}"
                )

    def describe(self, ctx: TunnelContext, params: dict) -> dict:
        kind = params["kind"]
        node = ctx.client.node
        dev = IFNAME[kind]
        link = json.loads(node.run(["ip", "-j", "-d", "link", "show", "dev", dev]).stdout)[0]
        out = {
            "implementation": f"kernel {kind}",
            "version": "kernel " + node.run(["uname", "-r"]).stdout.strip(),
            "path": "kernel",
            "cipher": "none",
            "interface": dev,
            "mtu": int(link["mtu"]),
            "kind": kind,
            "module": MODULE[kind],
        }
        if kind == "ipip":
            sit = json.loads(node.run(["ip", "-j", "link", "show", "dev", SIT_IFNAME]).stdout)[0]
            out["ipv6_interface"] = {"name": SIT_IFNAME, "mtu": int(sit["mtu"]), "kind": "sit"}
        if kind == "l2tpv3":
            out["l2tp"] = {
                "encap": params["encap"],
                "port": params["port"] if params["encap"] == "udp" else None,
                "tunnel_ids": L2TP_IDS,
            }
        return out

    def stop(self, ctx: TunnelContext, params: dict) -> None:
        """Remove the links (the namespaces would take them anyway; this keeps the lab)."""
        kind = params["kind"]
        for end in ctx.ends():
            role = "client" if end is ctx.client else "server"
            if kind == "l2tpv3":  # deleting the tunnel deletes its session and l2tpeth device
                end.node.run(
                    ["ip", "l2tp", "del", "tunnel", "tunnel_id", str(L2TP_IDS[role][0])],
                    check=False,
                )
            for dev in (IFNAME[kind], SIT_IFNAME if kind == "ipip" else None):
                if dev:
                    end.node.run(["ip", "link", "del", dev], check=False)
