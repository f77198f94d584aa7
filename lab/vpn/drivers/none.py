"""The baseline: no tunnel. Traffic goes to the server's underlay address in the clear.

It exists so that every campaign measures "no VPN" through exactly the same code path as the
tunnels: same bring-up, same readiness check (a ping to the server), same describe() record.
"""

from __future__ import annotations

import json
from typing import ClassVar

from lab.core.node import Node
from lab.vpn.base import Availability, Driver, TunnelContext, config_hash
from lab.core.tools import IP, PING
from lab.model.params import Param


class NoneDriver(Driver):
    name = "none"
    has_tunnel = False
    params: ClassVar[dict[str, Param]] = {}
    requires = (IP, PING)

    def check(self, params: dict, node: Node) -> Availability:
        return Availability(True, "none")

    def render(self, ctx: TunnelContext, params: dict, secrets: dict[str, str]) -> dict:
        return {}

    def start(self, ctx: TunnelContext, params: dict, rendered: dict) -> None:
        pass

    def describe(self, ctx: TunnelContext, params: dict) -> dict:
        mtu = None
        ifname = ctx.client.underlay_if
        if ifname:
            out = ctx.client.node.run(["ip", "-j", "link", "show", "dev", ifname]).stdout
            mtu = int(json.loads(out)[0]["mtu"])
        return {
            "implementation": "none",
            "version": ctx.client.node.run(["uname", "-r"]).stdout.strip(),
            "path": "none",
            "cipher": "none",
            "interface": ifname,
            "mtu": mtu,
            "config_hash": config_hash({}),
        }
