"""mtu: the tunnel interface's MTU, confirmed end to end by DF-set pings found by bisection.

IPv4 payload + 28 (IP 20 + ICMP 8) and IPv6 payload + 48 (IP 40 + ICMPv6 8) give the path MTU.
A probe fails only when every one of `attempts` single echoes fails, so random loss under
impairment does not shrink the answer; a "message too long, mtu=N" from the local stack or a
"Frag needed"/"Packet too big" from a hop narrows the search at once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from lab.measure.base import (
    Context,
    MeasurementFailed,
    Metric,
    Primary,
    Record,
    Test,
    family_of,
    invoke,
)
from lab.model.params import Param
from lab.core.tools import IP, PING
from lab.measure.ping import parse_ping, ping_argv

ICMP_OVERHEAD = {4: 28, 6: 48}
#: smallest probe: below 16 B ping carries no timestamp and prints no RTT
MIN_PROBE = 16


def parse_ip_link_mtu(json_text: str) -> int:
    """MTU from ``ip -j link show IFACE``."""
    try:
        links = json.loads(json_text)
        return int(links[0]["mtu"])
    except (ValueError, LookupError, TypeError) as e:
        raise MeasurementFailed(f"cannot read mtu from 'ip -j link show' output: {e}") from None


def _ipv6_literal(value: str) -> str | None:
    return None if family_of(value) == 6 else "not an IPv6 address literal"


class MtuTest(Test):
    name = "mtu"
    client_tools = ("ip", "ping")
    requires = (IP, PING)
    schema: ClassVar[dict[str, Param]] = {
        "addr6": Param(
            str,
            None,
            optional=True,
            check=_ipv6_literal,
            doc="also probe this IPv6 address of the server",
        ),
        "ipv6": Param(
            bool,
            False,
            doc="also probe the server's IPv6 traffic address (the tunnel's for a VPN, the "
            "underlay's for the baseline); a lab without one (an IPv4-only tunnel) records its "
            "IPv6 row as not applicable",
        ),
        "upper_mtu": Param(
            int, 1500, min=576, max=65535, doc="search ceiling when the context names no interface"
        ),
        "attempts": Param(int, 2, min=1, max=10, doc="echoes per probe before it counts as lost"),
    }
    metrics = (
        Metric("iface_mtu", unit="bytes", description="the tunnel interface's MTU"),
        Metric("path_mtu", unit="bytes", description="largest DF ping that passed + headers"),
    )
    primary = Primary("path_mtu", "bytes", 1.0, True)

    def estimate_s(self, params: Mapping[str, Any]) -> float:
        return 1.5 * (2 if params.get("addr6") or params.get("ipv6") else 1)

    def run(self, ctx: Context, params: Mapping[str, Any]) -> list[Record]:
        files: list[Path] = []
        iface_mtu = None
        if ctx.iface:
            inv = invoke(
                ctx,
                ctx.client,
                ["ip", "-j", "link", "show", ctx.iface],
                label="ip-link",
                suffix=".json",
                timeout=ctx.timeout_s,
            )
            files += inv.raw_files
            try:
                iface_mtu = parse_ip_link_mtu(inv.stdout)
            except MeasurementFailed as e:
                return [self.record(ok=False, error=str(e), raw_files=files, iface=ctx.iface)]
        upper = iface_mtu or params["upper_mtu"]
        targets = [ctx.server_addr] + ([params["addr6"]] if params["addr6"] else [])
        records = []
        if params["ipv6"] and ctx.server_addr6 and ctx.server_addr6 not in targets:
            targets.append(ctx.server_addr6)
        for addr in targets:
            fam = family_of(addr) or 4
            rec = self._probe_family(ctx, addr, fam, upper, params["attempts"])
            rec["raw_files"] = [str(f) for f in files] + rec["raw_files"]
            rec.update(iface=ctx.iface, iface_mtu=iface_mtu)
            if iface_mtu and rec.get("path_mtu"):
                rec["matches_iface"] = rec["path_mtu"] == iface_mtu
            records.append(rec)
        if params["ipv6"] and not ctx.server_addr6:
            # an IPv4-only tunnel (an imported wg-quick file with IPv4 addresses only) or an
            # IPv4-only topology: the IPv6 row says so instead of failing the case or vanishing
            records.append(
                self.not_applicable(
                    "no IPv6 traffic address: the tunnel (or, without one, the topology) "
                    "carries IPv4 only",
                    family=6,
                )
            )
        return records

    def _probe_family(self, ctx: Context, addr: str, fam: int, upper: int, attempts: int) -> Record:
        hdr = ICMP_OVERHEAD[fam]
        files: list[Path] = []
        probes: list[dict[str, Any]] = []

        def probe(size: int) -> tuple[bool, int | None]:
            hint = None
            for _ in range(attempts):
                argv = ping_argv(
                    addr,
                    count=1,
                    interval_s=1,
                    size=size,
                    reply_timeout_s=1,
                    family=fam,
                    dont_fragment=True,
                )
                inv = invoke(
                    ctx, ctx.client, argv, label=f"ping{fam}-df-{size}", timeout=1 + ctx.timeout_s
                )
                files.extend(inv.raw_files)
                try:
                    res = parse_ping(inv.stdout + "\n" + inv.stderr)
                except MeasurementFailed:
                    res = {"received": 0, "mtu_hint": None}
                hint = res["mtu_hint"] or hint
                if res["received"]:
                    probes.append({"size": size, "passed": True})
                    return True, None
                if hint:  # a definite "too big" is not loss: no point repeating it
                    break
            probes.append({"size": size, "passed": False, "mtu_hint": hint})
            return False, hint

        base = {"family": fam, "target": addr}
        hi = upper - hdr
        passed, hint = probe(hi)
        if passed:
            lo = hi
        else:
            if hint and MIN_PROBE <= hint - hdr < hi:
                # try what the stack or the hop told us first; it is usually the answer
                cand = hint - hdr
                ok, _ = probe(cand)
                if ok:
                    lo = cand
                else:
                    hi = cand
                    lo = None
            else:
                lo = None
            if lo is None:
                ok, _ = probe(MIN_PROBE)
                if not ok:
                    return self.record(
                        ok=False,
                        error=f"no DF echo of {MIN_PROBE} B came back from {addr}",
                        raw_files=files,
                        probes=probes,
                        **base,
                    )
                lo = MIN_PROBE
            while hi - lo > 1:
                mid = (lo + hi) // 2
                ok, hint = probe(mid)
                if ok:
                    lo = mid
                else:
                    hi = mid
        return self.record(
            raw_files=files,
            largest_payload=lo,
            path_mtu=lo + hdr,
            probes=probes,
            **base,
        )
