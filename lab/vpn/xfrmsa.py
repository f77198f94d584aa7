"""Manual-key IPsec transport mode on paper: its algorithms, the SAs a protocol setting needs and
the per-lab values they take (secret_layout), the `ip -batch` scripts that install and remove
them on one end, and what that costs a packet (overhead) and is called (cipher_name). Pure text;
the driver (lab.vpn.drivers.xfrm) runs the scripts, lab.vpn.xfrmkernel reads the kernel back.
"""

from __future__ import annotations

import re

from lab.vpn.base import Endpoint, TunnelContext

PROTOCOLS = ("ah", "esp", "ah+esp")
#: auth algorithm -> (key bytes, ICV bits, where the truncation comes from)
AUTH = {
    "hmac(sha1)": (20, 96, "RFC 2404"),
    "hmac(md5)": (16, 96, "RFC 2403"),
    "hmac(sha256)": (32, 128, "RFC 4868"),
}
#: enc algorithm -> (key bytes, block/IV bytes, RFC)
ENC = {
    "cbc(des3_ede)": (24, 8, "RFC 2451"),
    "cbc(aes)": (16, 16, "RFC 3602"),
}
UP_FILE = "xfrm.ip"
DOWN_FILE = "xfrm-down.ip"
SECRETS_FILE = "xfrm-sa"
DIRS = ("c2s", "s2c")  # client -> server, server -> client
FAMILIES = ("v4", "v6")
# Protection policies have a lower precedence than the neighbour-discovery bypass (a lower
# number wins): see nd_bypass().
PRIO_PROTECT = 2000
PRIO_BYPASS = 1000
ICMPV6 = 58  # numeric: a board's `ip` then needs no /etc/protocols
ND_TYPES = (135, 136)  # neighbour solicitation / advertisement


def sa_names(protocol: str) -> list[tuple[str, str, str]]:
    """(direction, family, proto) of every SA a protocol setting needs, in install order."""
    protos = ("esp", "ah") if protocol == "ah+esp" else (protocol,)
    return [(d, f, p) for d in DIRS for f in FAMILIES for p in protos]


def secret_layout(params: dict) -> list[tuple[str, str]]:
    """(name, "spi" | "auth" | "enc") of every per-lab value the SAs of `params` need."""
    out = []
    for d, f, p in sa_names(params["protocol"]):
        out.append((f"{d}-{f}-{p}-spi", "spi"))
        if p == "ah" or params["esp_auth"]:
            out.append((f"{d}-{f}-{p}-auth", "auth"))
        if p == "esp":
            out.append((f"{d}-{f}-{p}-enc", "enc"))
    return out


def all_key_names() -> tuple[str, ...]:
    """Every key name any setting's SAs could have (the driver's secret markers)."""
    return tuple(
        f"{d}-{f}-{p}-{k}"
        for d in DIRS
        for f in FAMILIES
        for p in ("ah", "esp")
        for k in ("auth", "enc")
    )


def host(addr: str | None) -> str:
    return (addr or "").split("/")[0]


def prefix(addr: str) -> str:
    return f"{addr}/128" if ":" in addr else f"{addr}/32"


def sas(ctx: TunnelContext, params: dict, secrets: dict) -> list[dict]:
    out = []
    for d, f, p in sa_names(params["protocol"]):
        src, dst = (ctx.client, ctx.server) if d == "c2s" else (ctx.server, ctx.client)
        addr = (lambda e: e.underlay_v4) if f == "v4" else (lambda e: host(e.underlay_v6))
        out.append(
            {
                "name": f"{d}-{f}-{p}",
                "dir": d,
                "family": f,
                "proto": p,
                "src": addr(src),
                "dst": addr(dst),
                "spi": secrets[f"{d}-{f}-{p}-spi"],
                "auth": secrets.get(f"{d}-{f}-{p}-auth"),
                "enc": secrets.get(f"{d}-{f}-{p}-enc"),
            }
        )
    return out


def header(ctx: TunnelContext, end: Endpoint, params: dict, label: str) -> list[str]:
    role = "client" if end is ctx.client else "server"
    key_bytes, icv, rfc = AUTH[params["auth"]]
    algs = []
    if "ah" in params["protocol"]:
        algs.append(f"AH {params['auth']}, {key_bytes * 8}-bit key, ICV {icv} bits ({rfc})")
    if "esp" in params["protocol"]:
        ek, _, erfc = ENC[params["enc"]]
        esp_auth = (
            f"authenticator {params['auth']}-{icv}" if params["esp_auth"] else "no authenticator"
        )
        algs.append(f"ESP {params['enc']}, {ek * 8}-bit key ({erfc}), {esp_auth}")
    return [
        f"# lab: IPsec transport mode, manual keys (no IKE), protocol {params['protocol']}; "
        f"node {end.name} ({role}), profile {label}",
        "# " + "; ".join(algs),
        f"# one SA per direction, protocol and family, each its own key and SPI; "
        f"replay-window {params['replay_window']}",
    ]


def policies(ctx: TunnelContext, end: Endpoint, params: dict) -> list[tuple[str, str]]:
    """(policy selector + dir, template part) for `end`; templates innermost first."""
    peer = ctx.peer(end)
    protos = ("esp", "ah") if params["protocol"] == "ah+esp" else (params["protocol"],)
    out = []
    for mine, theirs in (
        (end.underlay_v4, peer.underlay_v4),
        (host(end.underlay_v6), host(peer.underlay_v6)),
    ):
        for src, dst, direction in ((mine, theirs, "out"), (theirs, mine, "in")):
            tmpl = " ".join(f"tmpl src {src} dst {dst} proto {p} mode transport" for p in protos)
            out.append((f"src {prefix(src)} dst {prefix(dst)} dir {direction}", tmpl))
    return out


def nd_bypass(ctx: TunnelContext, end: Endpoint) -> list[str]:
    """IPv6 neighbour solicitations/advertisements between the two addresses stay in the
    clear: on a shared link (pi_pair) the kernel sends them unicast between exactly the
    protected pair, and an advertisement that must be protected before the neighbour is
    resolved deadlocks (RFC 4301 section 5: ND needs a bypass). Harmless when routed."""
    mine, theirs = host(end.underlay_v6), host(ctx.peer(end).underlay_v6)
    out = []
    for t in ND_TYPES:
        for src, dst, direction in ((mine, theirs, "out"), (theirs, mine, "in")):
            out.append(
                f"src {prefix(src)} dst {prefix(dst)} proto {ICMPV6} type {t} dir {direction}"
            )
    return out


def up_script(ctx: TunnelContext, end: Endpoint, params: dict, secrets: dict, label: str) -> str:
    """The `ip -batch` script that installs `end`'s states, then its policies."""
    lines = header(ctx, end, params, label)
    lines.append(f"# apply with: ip -batch {UP_FILE}   (remove: ip -force -batch {DOWN_FILE})")
    lines.append("# states (SAs)")
    for sa in sas(ctx, params, secrets):
        alg = ""
        if sa["auth"]:
            alg += f" auth-trunc {params['auth']} {sa['auth']} {AUTH[params['auth']][1]}"
        if sa["enc"]:
            alg += f" enc {params['enc']} {sa['enc']}"
        lines.append(
            f"xfrm state add src {sa['src']} dst {sa['dst']} proto {sa['proto']} "
            f"spi {sa['spi']} mode transport replay-window {params['replay_window']}{alg}"
        )
    order = "ESP, then AH around it (IP | AH | ESP | payload)"
    lines.append(
        "# policies: every packet between the two addresses"
        + (f"; templates innermost first: {order}" if params["protocol"] == "ah+esp" else "")
    )
    for sel, tmpl in policies(ctx, end, params):
        lines.append(f"xfrm policy add {sel} priority {PRIO_PROTECT} {tmpl}")
    lines.append("# IPv6 neighbour discovery between the two addresses: in the clear")
    for sel in nd_bypass(ctx, end):
        lines.append(f"xfrm policy add {sel} priority {PRIO_BYPASS}")
    return "\n".join(lines) + "\n"


def down_script(ctx: TunnelContext, end: Endpoint, params: dict, secrets: dict, label: str) -> str:
    """The `ip -force -batch` script that removes exactly what up_script adds."""
    lines = header(ctx, end, params, label)[:1]
    lines.append(f"# remove exactly what {UP_FILE} adds: ip -force -batch {DOWN_FILE}")
    for sel in nd_bypass(ctx, end):
        lines.append(f"xfrm policy delete {sel}")
    for sel, _ in policies(ctx, end, params):
        lines.append(f"xfrm policy delete {sel}")
    for sa in reversed(sas(ctx, params, secrets)):
        lines.append(
            f"xfrm state delete src {sa['src']} dst {sa['dst']} proto {sa['proto']} spi {sa['spi']}"
        )
    return "\n".join(lines) + "\n"


def cipher_name(params: dict) -> str:
    icv = AUTH[params["auth"]][1]
    parts = []
    if "ah" in params["protocol"]:
        parts.append(f"ah:{params['auth']}-{icv}")
    if "esp" in params["protocol"]:
        parts.append(
            f"esp:{params['enc']}" + (f"+{params['auth']}-{icv}" if params["esp_auth"] else "")
        )
    return ",".join(parts)


def overhead(params: dict) -> int:
    """Worst-case bytes IPsec adds to a packet (IPv6 alignment, maximal ESP padding)."""
    icv = AUTH[params["auth"]][1] // 8
    total = 0
    if "ah" in params["protocol"]:
        total += -(-(12 + icv) // 8) * 8  # AH header + ICV, 8-byte aligned for IPv6
    if "esp" in params["protocol"]:
        block = ENC[params["enc"]][1]
        # SPI + sequence, IV, padding (up to block - 1), pad length + next header, ICV
        total += 8 + block + (block - 1) + 2 + (icv if params["esp_auth"] else 0)
    return total


#: a policy line of a down script: (src, dst, ICMP type or None, dir)
DOWN_POLICY = re.compile(
    r"^xfrm policy delete src (\S+) dst (\S+) (?:proto \d+ type (\d+) )?dir (\w+)"
)
