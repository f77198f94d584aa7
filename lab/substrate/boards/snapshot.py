"""What a board's network looks like, read over its node: the snapshot `lab up --boards` records
before changing anything and restore compares against, and the OS facts kept with results."""

from __future__ import annotations

import json

from lab.substrate.local.lab import (
    ROUTER_SYSCTLS,
)  # the sysctls a router needs; set on a board and restored
from lab.substrate.boards.types import Board


#: root qdisc kinds a kernel puts on an interface by itself (with net.core.default_qdisc, which
#: the ledger records): restoring one means deleting ours
DEFAULT_QDISCS = {"noqueue", "pfifo_fast", "mq"}


def run_sh(node, script: str, *, check: bool = True):
    return node.run(["sh", "-c", script], check=check, timeout=30)


def _json(node, *argv: str) -> list:
    out = node.run(list(argv), timeout=30).stdout.strip()
    return json.loads(out) if out else []


def read_addrs(node) -> list[list[str]]:
    """[ifname, "address/prefixlen"] of every address on the board, sorted."""
    return [
        list(x)
        for x in sorted(
            (a["ifname"], f"{x['local']}/{x['prefixlen']}")
            for a in _json(node, "ip", "-j", "addr", "show")
            for x in a.get("addr_info", [])
        )
    ]


def read_routes(node) -> list[str]:
    """Every route of every table, IPv4 and IPv6, as sorted JSON texts of dst, gateway, dev,
    table and type."""
    return sorted(
        json.dumps(
            {k: r.get(k) for k in ("dst", "gateway", "dev", "table", "type")}, sort_keys=True
        )
        for fam in ("-4", "-6")
        for r in _json(node, "ip", "-j", fam, "route", "show", "table", "all")
    )


def snapshot(node, board: Board) -> dict:
    """The board's network state the lab may change, normalised for comparison: links
    (ifindex, name, up, mtu), addresses and routes (all tables), root qdiscs, the sysctls the
    lab sets, xfrm states and policies, and the files under the per-lab parent directory."""

    def count(*argv):
        cp = node.run(list(argv), check=False, timeout=30)
        return sum(1 for ln in cp.stdout.splitlines() if ln.startswith("src "))

    j = [_json(node, "ip", "-j", "link", "show"), _json(node, "tc", "-j", "qdisc", "show")]
    xs = [count("ip", "xfrm", "state", "list"), count("ip", "xfrm", "policy", "list")]
    links = sorted(
        (ln["ifindex"], ln["ifname"], "UP" in ln.get("flags", []), ln.get("mtu")) for ln in j[0]
    )
    qdiscs = sorted(
        (q["dev"], q["kind"], q.get("handle"), "root" if q.get("root") else q.get("parent"))
        for q in j[1]
    )
    sysctl_names = sorted(ROUTER_SYSCTLS) + [f"net.ipv6.conf.{i}.accept_dad" for i in board.data]
    vals = {}
    for name in sysctl_names:
        c = node.run(["cat", "/proc/sys/" + name.replace(".", "/")], check=False)
        vals[name] = c.stdout.strip() if c.returncode == 0 else None
    return {
        "links": [list(x) for x in links],
        "addrs": read_addrs(node),
        "routes": read_routes(node),
        "qdiscs": [list(x) for x in qdiscs],
        "sysctls": vals,
        "xfrm": {"states": xs[0] if xs else 0, "policies": xs[1] if len(xs) > 1 else 0},
        "netns": sorted(n["name"] for n in _json(node, "ip", "-j", "netns", "list")),
    }


def diff(before: dict, after: dict) -> list[str]:
    """What differs between two snapshots, in words (empty: identical)."""
    out = []
    for key in ("links", "addrs", "routes", "qdiscs"):
        b = {json.dumps(x) for x in before[key]}
        a = {json.dumps(x) for x in after[key]}
        out += [f"{key}: gone {x}" for x in sorted(b - a)]
        out += [f"{key}: new {x}" for x in sorted(a - b)]
    for k, v in before["sysctls"].items():
        if after["sysctls"].get(k) != v:
            out.append(f"sysctl {k}: {v} -> {after['sysctls'].get(k)}")
    if before.get("netns", []) != after.get("netns", []):  # older ledgers have none
        out.append(f"named network namespaces: {before.get('netns')} -> {after.get('netns')}")
    if before["xfrm"] != after["xfrm"]:
        out.append(f"xfrm: {before['xfrm']} -> {after['xfrm']}")
    return out
