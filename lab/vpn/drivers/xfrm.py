"""IPsec transport mode with manual keys (study C): kernel XFRM states and policies, no IKE.

    protocol = "ah"      AH (RFC 4302), `auth` = hmac(sha1) truncated to 96 bits (RFC 2404)
    protocol = "esp"     ESP (RFC 4303), `enc` = cbc(des3_ede) (RFC 2451); no authenticator
                         unless `esp_auth = true` (study C's "ESP (3DES-CBC)": confidentiality
                         only, integrity is what AH+ESP adds)
    protocol = "ah+esp"  ESP applied first, AH around it: IP | AH | ESP | payload

Transport mode has no tunnel device: the endpoints talk to each other's underlay addresses and
the policies protect every packet between those two addresses, IPv4 and IPv6 alike. One SA per
direction, protocol and address family, each with its own fresh random key and SPI (per lab,
from secrets(), 0600). That only protects traffic the two VPN endpoints send themselves, so a
topology whose traffic endpoints sit elsewhere (site_to_site, router_under_test) is refused.

The rendered files per node are `ip -batch` scripts, as a board would run them:
    xfrm.ip        `ip -batch xfrm.ip`: states, then policies
    xfrm-down.ip   `ip -force -batch xfrm-down.ip`: policies, then states (exactly those)
The kernel objects are made with `ip xfrm` through node.run, not pyroute2: pyroute2 (0.9) has
no XFRM netlink API (only the xfrm interface link kind), and the script is the deployable file.

check() asks the node, without changing anything, for its /proc/config.gz (or, where the config
is not exposed, /sys/module and the module lists of /lib/modules/<release>; kernelfeatures) for
AH (ah4/ah6), ESP (esp4/esp6, authenc, echainiv) and the algorithms. This CI host has none of AH, ESP or DES: `lab up --vm`.
"""

from __future__ import annotations

import json
import re
import secrets as pysecrets
import time
from typing import ClassVar

from lab.core.errors import ConfigError, StartupError
from lab.core.node import Node
from lab.vpn.base import Availability, Driver, Endpoint, TunnelContext, config_hash, write_secret
from lab.core.tools import IP, PING
from lab.model.params import Param
from lab.vpn.kernelfeatures import missing_features

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
# number wins): see _nd_bypass().
PRIO_PROTECT = 2000
PRIO_BYPASS = 1000
ICMPV6 = 58  # numeric: a board's `ip` then needs no /etc/protocols
ND_TYPES = (135, 136)  # neighbour solicitation / advertisement

#: what the kernel needs, per feature: (label, CONFIG_ symbols (any), module names (any))
_KERNEL = {
    "ah": [
        ("ah4", ("CONFIG_INET_AH",), ("ah4",)),
        ("ah6", ("CONFIG_INET6_AH",), ("ah6",)),
    ],
    "esp": [
        ("esp4", ("CONFIG_INET_ESP",), ("esp4",)),
        ("esp6", ("CONFIG_INET6_ESP",), ("esp6",)),
        ("authenc", ("CONFIG_CRYPTO_AUTHENC",), ("authenc",)),
        ("echainiv", ("CONFIG_CRYPTO_ECHAINIV",), ("echainiv",)),
        ("cbc", ("CONFIG_CRYPTO_CBC",), ("cbc",)),
    ],
    "hmac": [("hmac", ("CONFIG_CRYPTO_HMAC",), ("hmac",))],
    "hmac(sha1)": [
        ("sha1", ("CONFIG_CRYPTO_SHA1", "CONFIG_CRYPTO_SHA1_SSSE3"), ("sha1_generic", "sha1_ssse3"))
    ],
    "hmac(md5)": [("md5", ("CONFIG_CRYPTO_MD5",), ("md5",))],
    "hmac(sha256)": [
        (
            "sha256",
            ("CONFIG_CRYPTO_SHA256", "CONFIG_CRYPTO_SHA256_SSSE3"),
            ("sha256_generic", "sha256_ssse3"),
        )
    ],
    "cbc(des3_ede)": [
        (
            "des3_ede",
            ("CONFIG_CRYPTO_DES", "CONFIG_CRYPTO_DES3_EDE_X86_64"),
            ("des_generic", "des3_ede_x86_64"),
        )
    ],
    "cbc(aes)": [
        ("aes", ("CONFIG_CRYPTO_AES", "CONFIG_CRYPTO_AES_NI_INTEL"), ("aes_generic", "aesni_intel"))
    ],
    "digest_null": [("crypto_null", ("CONFIG_CRYPTO_NULL",), ("crypto_null",))],
}


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


def _all_key_names() -> tuple[str, ...]:
    return tuple(
        f"{d}-{f}-{p}-{k}"
        for d in DIRS
        for f in FAMILIES
        for p in ("ah", "esp")
        for k in ("auth", "enc")
    )


def kernel_missing(node: Node, needs: list[str]) -> list[str]:
    """Of the _KERNEL features `needs`, what the node's kernel lacks ("label (CONFIG_X)");
    read-only."""
    features = [f for need in needs for f in _KERNEL[need]]
    return [f"{label} ({symbols[0]})" for label, symbols, _ in missing_features(node, features)]


def _host(addr: str | None) -> str:
    return (addr or "").split("/")[0]


def _prefix(addr: str) -> str:
    return f"{addr}/128" if ":" in addr else f"{addr}/32"


class XfrmManualDriver(Driver):
    name = "xfrm-manual"
    has_tunnel = False  # transport mode: traffic goes to the peer's underlay address
    params: ClassVar[dict[str, Param]] = {
        "protocol": Param(str, "esp", "IPsec protocol(s), transport mode", choices=PROTOCOLS),
        "auth": Param(
            str,
            "hmac(sha1)",
            "AH (and ESP with esp_auth) authentication, truncated ICV (96 bits for sha1/md5)",
            choices=tuple(AUTH),
        ),
        "enc": Param(str, "cbc(des3_ede)", "ESP encryption", choices=tuple(ENC)),
        "esp_auth": Param(
            bool, False, "ESP carries an authenticator (auth); study C's ESP had none"
        ),
        "replay_window": Param(
            int, 0, "anti-replay window in packets (0: off, iproute2's default)", min=0, max=32
        ),
        "start_timeout": Param(
            float, 10.0, "seconds for the first protected ping v4 and v6", min=1, max=120
        ),
    }
    secret_markers = _all_key_names()

    requires = (IP, PING)

    def validate(self, params: dict, *, source: str) -> None:
        if params["esp_auth"] and params["protocol"] == "ah":
            raise ConfigError(
                "esp_auth needs ESP: protocol is 'ah'; valid protocols with it: esp, ah+esp",
                source=source,
                field="params.esp_auth",
            )

    def _needs(self, params: dict) -> list[str]:
        needs = []
        proto = params["protocol"]
        if "ah" in proto.split("+"):
            needs += ["ah", "hmac", params["auth"]]
        if "esp" in proto.split("+"):
            needs += ["esp", params["enc"]]
            needs += ["hmac", params["auth"]] if params["esp_auth"] else ["digest_null"]
        return list(dict.fromkeys(needs))

    def check(self, params: dict, node: Node) -> Availability:
        missing = kernel_missing(node, self._needs(params))
        if not missing:
            return Availability(True, "kernel")
        return Availability(
            False,
            "kernel",
            f"needs kernel {', '.join(missing)} for {params['protocol'].upper()} "
            "(IPsec transport mode has no userspace path here); use --vm",
        )

    def check_topology(self, spec, plan) -> None:
        """ConfigError unless the traffic endpoints are the VPN endpoints (before anything
        exists): transport mode protects only what the two endpoints themselves send."""
        vpn = (plan.client.node, plan.server.node)
        traffic = (plan.traffic_client, plan.traffic_server)
        if traffic != vpn:
            raise ConfigError(
                f"IPsec transport mode protects only packets the VPN endpoints {vpn[0]} and "
                f"{vpn[1]} send to each other, but topology {spec.topo_name!r} sends its "
                f"traffic between {traffic[0]} and {traffic[1]}; use a "
                "topology whose traffic endpoints are the VPN endpoints (pi_pair, "
                "pi_pair_middlebox, host_router_router_host) or a tunnel-mode profile",
                source=spec.source,
            )
        self._need_both_families(plan.client, plan.server, source=spec.source)

    @staticmethod
    def _need_both_families(a, b, *, source: str) -> None:
        missing = [s.node for s in (a, b) if not s.underlay_v6]
        if missing:
            raise ConfigError(
                f"IPsec transport mode here protects IPv4 and IPv6, but {', '.join(missing)} "
                "has no IPv6 address facing the peer; give the link ip6= addresses",
                source=source,
            )

    # ------------------------------------------------------------------ secrets / render

    def secrets(self, ctx: TunnelContext, params: dict) -> dict[str, str]:
        """A fresh random SPI and key(s) per SA. SPIs: 32-bit, >= 0x100 (RFC 4303 reserves
        1..255), all distinct; they are not secret but written to the same 0600 file so that
        it describes the lab's SAs completely."""
        out: dict[str, str] = {}
        spis: set[int] = set()
        for name, kind in secret_layout(params):
            if kind == "spi":
                spi = 0
                while spi < 0x100 or spi in spis:
                    spi = pysecrets.randbits(32)
                spis.add(spi)
                out[name] = f"0x{spi:08x}"
            else:
                n = AUTH[params["auth"]][0] if kind == "auth" else ENC[params["enc"]][0]
                out[name] = "0x" + pysecrets.token_hex(n)
        write_secret(ctx.secrets_dir, SECRETS_FILE, "".join(f"{k}={v}\n" for k, v in out.items()))
        return out

    def render(self, ctx: TunnelContext, params: dict, secrets: dict[str, str]) -> dict:
        for end in ctx.ends():
            if end.behind:  # last line of defence when check_topology was not called
                raise ConfigError(
                    f"IPsec transport mode cannot protect the networks behind {end.name} "
                    f"({', '.join(end.behind)}): use a topology whose traffic endpoints are "
                    "the VPN endpoints, or a tunnel-mode profile",
                    source=ctx.profile or self.name,
                    field="driver",
                )
        self._need_both_families(ctx.client, ctx.server, source=ctx.profile or self.name)
        return {
            end.name: {
                UP_FILE: self._up(ctx, end, params, secrets),
                DOWN_FILE: self._down(ctx, end, params, secrets),
            }
            for end in ctx.ends()
        }

    def _sas(self, ctx: TunnelContext, params: dict, secrets: dict) -> list[dict]:
        out = []
        for d, f, p in sa_names(params["protocol"]):
            src, dst = (ctx.client, ctx.server) if d == "c2s" else (ctx.server, ctx.client)
            addr = (lambda e: e.underlay_v4) if f == "v4" else (lambda e: _host(e.underlay_v6))
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

    def _header(self, ctx: TunnelContext, end: Endpoint, params: dict) -> list[str]:
        role = "client" if end is ctx.client else "server"
        key_bytes, icv, rfc = AUTH[params["auth"]]
        algs = []
        if "ah" in params["protocol"]:
            algs.append(f"AH {params['auth']}, {key_bytes * 8}-bit key, ICV {icv} bits ({rfc})")
        if "esp" in params["protocol"]:
            ek, _, erfc = ENC[params["enc"]]
            esp_auth = (
                f"authenticator {params['auth']}-{icv}"
                if params["esp_auth"]
                else "no authenticator"
            )
            algs.append(f"ESP {params['enc']}, {ek * 8}-bit key ({erfc}), {esp_auth}")
        return [
            f"# lab: IPsec transport mode, manual keys (no IKE), protocol {params['protocol']}; "
            f"node {end.name} ({role}), profile {ctx.profile or self.name}",
            "# " + "; ".join(algs),
            f"# one SA per direction, protocol and family, each its own key and SPI; "
            f"replay-window {params['replay_window']}",
        ]

    def _policies(self, ctx: TunnelContext, end: Endpoint, params: dict) -> list[tuple[str, str]]:
        """(policy selector + dir, template part) for `end`; templates innermost first."""
        peer = ctx.peer(end)
        protos = ("esp", "ah") if params["protocol"] == "ah+esp" else (params["protocol"],)
        out = []
        for mine, theirs in (
            (end.underlay_v4, peer.underlay_v4),
            (_host(end.underlay_v6), _host(peer.underlay_v6)),
        ):
            for src, dst, direction in ((mine, theirs, "out"), (theirs, mine, "in")):
                tmpl = " ".join(
                    f"tmpl src {src} dst {dst} proto {p} mode transport" for p in protos
                )
                out.append((f"src {_prefix(src)} dst {_prefix(dst)} dir {direction}", tmpl))
        return out

    def _nd_bypass(self, ctx: TunnelContext, end: Endpoint) -> list[str]:
        """IPv6 neighbour solicitations/advertisements between the two addresses stay in the
        clear: on a shared link (pi_pair) the kernel sends them unicast between exactly the
        protected pair, and an advertisement that must be protected before the neighbour is
        resolved deadlocks (RFC 4301 section 5: ND needs a bypass). Harmless when routed."""
        mine, theirs = _host(end.underlay_v6), _host(ctx.peer(end).underlay_v6)
        out = []
        for t in ND_TYPES:
            for src, dst, direction in ((mine, theirs, "out"), (theirs, mine, "in")):
                out.append(
                    f"src {_prefix(src)} dst {_prefix(dst)} proto {ICMPV6} type {t} dir {direction}"
                )
        return out

    def _up(self, ctx: TunnelContext, end: Endpoint, params: dict, secrets: dict) -> str:
        lines = self._header(ctx, end, params)
        lines.append(f"# apply with: ip -batch {UP_FILE}   (remove: ip -force -batch {DOWN_FILE})")
        lines.append("# states (SAs)")
        for sa in self._sas(ctx, params, secrets):
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
        for sel, tmpl in self._policies(ctx, end, params):
            lines.append(f"xfrm policy add {sel} priority {PRIO_PROTECT} {tmpl}")
        lines.append("# IPv6 neighbour discovery between the two addresses: in the clear")
        for sel in self._nd_bypass(ctx, end):
            lines.append(f"xfrm policy add {sel} priority {PRIO_BYPASS}")
        return "\n".join(lines) + "\n"

    def _down(self, ctx: TunnelContext, end: Endpoint, params: dict, secrets: dict) -> str:
        lines = self._header(ctx, end, params)[:1]
        lines.append(f"# remove exactly what {UP_FILE} adds: ip -force -batch {DOWN_FILE}")
        for sel in self._nd_bypass(ctx, end):
            lines.append(f"xfrm policy delete {sel}")
        for sel, _ in self._policies(ctx, end, params):
            lines.append(f"xfrm policy delete {sel}")
        for sa in reversed(self._sas(ctx, params, secrets)):
            lines.append(
                f"xfrm state delete src {sa['src']} dst {sa['dst']} proto {sa['proto']} "
                f"spi {sa['spi']}"
            )
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------------ start / ready

    def start(self, ctx: TunnelContext, params: dict, rendered: dict) -> None:
        """Install on both ends, then prove protection: a ping v4 and v6 to the peer passes and
        the outbound SAs of both ends counted its bytes."""
        done = []
        try:
            for end in ctx.ends():
                path = ctx.write_config(end, rendered[end.name])[UP_FILE]
                ctx.write_config(end, {DOWN_FILE: rendered[end.name][DOWN_FILE]})
                done.append(end)
                cp = end.node.run(["ip", "-batch", str(path)], check=False, timeout=30)
                if cp.returncode != 0:
                    raise StartupError(
                        f"xfrm on {end.name}: `ip -batch {path}` failed (exit {cp.returncode}): "
                        f"{cp.stderr.strip()[-400:]}"
                    )
            self._confirm_protected(ctx, params)
        except BaseException:
            for end in done:  # undo what was added (the down script skips what is absent)
                self._remove(ctx, end)
            raise

    def _confirm_protected(self, ctx: TunnelContext, params: dict) -> None:
        deadline = time.monotonic() + params["start_timeout"]
        for addr in (ctx.server.underlay_v4, _host(ctx.server.underlay_v6)):
            while True:
                cp = ctx.client.node.run(
                    ["ping", "-n", "-q", "-c", "1", "-W", "1", addr], check=False, timeout=10
                )
                if cp.returncode == 0:
                    break
                if time.monotonic() > deadline:
                    raise StartupError(
                        f"xfrm: no reply from {addr} within {params['start_timeout']:.0f} s "
                        f"({params['protocol']}, transport mode)"
                    )
                time.sleep(0.1)
        for end in ctx.ends():
            counts = sa_counters(end.node)
            mine = "c2s" if end is ctx.client else "s2c"
            idle = [
                sa["name"]
                for sa in self._sas_public(ctx, params)
                if sa["dir"] == mine
                and counts.get((sa["dst"], sa["proto"], sa["spi"]), (0, 0))[0] == 0
            ]
            if idle:
                raise StartupError(
                    f"xfrm on {end.name}: ping passed but SAs {', '.join(idle)} counted no "
                    "bytes: the traffic was not protected"
                )

    def _sas_public(self, ctx: TunnelContext, params: dict) -> list[dict]:
        """The SAs (without keys) from the secrets file of this lab."""
        path = ctx.secrets_dir / SECRETS_FILE
        values = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
        spis = {k: v for k, v in values.items() if k.endswith("-spi")}
        return self._sas(ctx, params, spis)

    # ------------------------------------------------------------------ describe / stop

    def describe(self, ctx: TunnelContext, params: dict) -> dict:
        node, ifname = ctx.client.node, ctx.client.underlay_if
        link = json.loads(node.run(["ip", "-j", "link", "show", "dev", ifname]).stdout)[0]
        underlay_mtu = int(link["mtu"])
        counts = sa_counters(node)
        sas = []
        for sa in self._sas_public(ctx, params):
            b, p = counts.get((sa["dst"], sa["proto"], sa["spi"]), (None, None))
            sas.append(
                {k: sa[k] for k in ("name", "proto", "family", "src", "dst", "spi")}
                | {"bytes": b, "packets": p}
            )
        # the config hash of the files with placeholders for keys AND SPIs: equal profiles
        # hash equal across labs although both are random per lab
        placeholders = {k: f"<{k}>" for k, _ in secret_layout(params)}
        rendered = self.render(ctx, params, placeholders)
        ip_v = node.run(["ip", "-V"], check=False).stdout.strip()
        return {
            "implementation": "kernel XFRM, manual keys (ip xfrm)",
            "version": "kernel " + node.run(["uname", "-r"]).stdout.strip(),
            "iproute2": ip_v.split(", ")[0].split()[-1] if ip_v else None,
            "path": "kernel",
            "mode": "transport",
            "protocol": params["protocol"],
            "cipher": cipher_name(params),
            "esp_auth": params["esp_auth"] if "esp" in params["protocol"] else None,
            "interface": ifname,  # no tunnel device: the underlay interface
            "underlay_mtu": underlay_mtu,
            "overhead_bytes": overhead(params),
            "mtu": underlay_mtu - overhead(params),
            "replay_window": params["replay_window"],
            "sas_client": sas,
            "config_hash": config_hash(rendered),
        }

    def stop(self, ctx: TunnelContext, params: dict) -> None:
        left = []
        for end in ctx.ends():
            left += self._remove(ctx, end)
        if left:
            raise StartupError("xfrm objects left: " + "; ".join(left))

    def _remove(self, ctx: TunnelContext, end: Endpoint) -> list[str]:
        """Run the node's down script (each line alone: one already gone does not stop the
        rest), then list what of ours is still there."""
        path = ctx.config_dir / end.name / DOWN_FILE
        if not path.exists():
            return [f"{end.name}: {path} missing, cannot tell which SAs are ours"]
        end.node.run(["ip", "-force", "-batch", str(path)], check=False, timeout=30)
        text = path.read_text()
        spis = set(re.findall(r"spi (0x[0-9a-f]+)", text))
        states = {k[2] for k in sa_counters(end.node)}
        left = [f"{end.name}: xfrm state spi {s}" for s in sorted(spis & states)]
        present = policy_selectors(end.node)
        for line in text.splitlines():
            m = _DOWN_POLICY.match(line)
            if m and (m[1], m[2], m[3], m[4]) in present:
                left.append(f"{end.name}: xfrm policy {line.split('delete ', 1)[1]}")
        return left


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


_STATE_HEAD = re.compile(r"^src (\S+) dst (\S+)\n\s+proto (\w+) spi (0x[0-9a-f]+)", re.MULTILINE)
_CURRENT = re.compile(r"lifetime current:\n\s+(\d+)\(bytes\), (\d+)\(packets\)")


def sa_counters(node) -> dict[tuple[str, str, str], tuple[int, int]]:
    """{(dst, proto, spi): (bytes, packets)} of the node's SAs, from `ip -s xfrm state list`.

    Text, not JSON: iproute2's xfrm commands have no -j output (6.1). The output also shows
    the keys: it is parsed here and never stored.
    """
    out = node.run(["ip", "-s", "xfrm", "state", "list"], check=False).stdout
    found = {}
    heads = list(_STATE_HEAD.finditer(out))
    for i, m in enumerate(heads):
        block = out[m.start() : heads[i + 1].start() if i + 1 < len(heads) else len(out)]
        c = _CURRENT.search(block)
        if c:
            found[(m[2], m[3], m[4])] = (int(c[1]), int(c[2]))
    return found


_DOWN_POLICY = re.compile(
    r"^xfrm policy delete src (\S+) dst (\S+) (?:proto \d+ type (\d+) )?dir (\w+)"
)
_POLICY = re.compile(
    r"^src (\S+) dst (\S+)(?:[^\n]*? type (\d+))?[^\n]*\n\s*dir (\w+)", re.MULTILINE
)


def policy_selectors(node) -> set[tuple[str, str, str | None, str]]:
    """{(src, dst, ICMP type or None, dir)} of the node's policies (`ip xfrm policy list`)."""
    out = node.run(["ip", "xfrm", "policy", "list"], check=False).stdout
    return {(m[1], m[2], m[3], m[4]) for m in _POLICY.finditer(out)}
