"""What a strongSwan charon needs from and leaves in the node's kernel: whether the kernel can
carry the ESP proposal (from its config or module lists, and by a throwaway XFRM state), the bytes
ESP adds to a packet, and the removal of only what a killed charon leaves between the two ends
(XFRM states and policies, table-220 routes, the libipsec TUN device, its run directory).
Shared by the `strongswan` and `l2tp-ipsec` drivers, beside lab.vpn.charon (the daemons
themselves). docs/ipsec.md.
"""

from __future__ import annotations

import ipaddress
import re
import secrets as pysecrets

from lab.core.errors import PreconditionError
from lab.vpn.base import Endpoint
from lab.vpn.charon import LIBIPSEC_TUN, PID_FILE, ROUTE_TABLE, RUN_DIR

# kernel crypto a first ESP proposal token needs, by /proc/config.gz symbol
_KERNEL_AEAD = (
    (re.compile(r"^aes\d+gcm"), "CONFIG_CRYPTO_GCM"),
    (re.compile(r"^chacha20poly1305"), "CONFIG_CRYPTO_CHACHA20POLY1305"),
    (re.compile(r"^aes\d+ccm"), "CONFIG_CRYPTO_CCM"),
)


_KERNEL_AEAD_MODULES = (
    (re.compile(r"^aes\d+gcm"), "gcm"),
    (re.compile(r"^chacha20poly1305"), "chacha20poly1305"),
    (re.compile(r"^aes\d+ccm"), "ccm"),
)


def kernel_esp(
    config: dict[str, str] | None,
    esp_proposals: str,
    *,
    loaded: frozenset[str] | set[str] = frozenset(),
    modules: frozenset[str] | set[str] | None = None,
) -> tuple[bool | None, str]:
    """(has ESP + the proposal's AEAD, what is missing); None when the config is unknown.
    Pure: `config` is the node's kernel config (None: not exposed), `loaded` its /sys/module
    names and `modules` the names its modules.dep/modules.builtin list (None: neither)."""
    if config is None:
        if "esp4" in loaded:
            return True, ""
        # no /proc/config.gz (Debian kernels, the lab VM): the module lists say what can load
        mods = modules
        if mods is None:
            return None, "kernel config not readable (/proc/config.gz) and no modules.dep"
        first = esp_proposals.split(",")[0]
        need = ["esp4", "esp6"] + [m for rx, m in _KERNEL_AEAD_MODULES if rx.match(first)]
        missing = [m for m in need if m not in mods]
        return not missing, ", ".join(f"module {m}" for m in missing)
    missing = [
        s for s in ("CONFIG_INET_ESP", "CONFIG_INET6_ESP") if config.get(s) not in ("y", "m")
    ]
    first = esp_proposals.split(",")[0]
    for rx, sym in _KERNEL_AEAD:
        if rx.match(first) and config.get(sym) not in ("y", "m"):
            missing.append(sym)
    return not missing, ", ".join(missing)


def esp_overhead(child: dict, *, udp: bool) -> int:
    """Worst-case bytes ESP tunnel mode adds to an IPv4 packet (outer IPv4 header included)."""
    alg = child.get("encr-alg", "")
    if alg.startswith(("AES_GCM", "AES_CCM")):
        iv, icv, block = 8, int(alg.rsplit("_", 1)[1]), 4
    elif alg.startswith("CHACHA20"):
        iv, icv, block = 8, 16, 4
    else:  # CBC + HMAC: 16-byte IV and block, truncated HMAC up to 32 bytes
        iv, icv, block = 16, 32, 16
    return 20 + (8 if udp else 0) + 8 + iv + (block - 1) + 2 + icv


def probe_kernel_esp(end: Endpoint, esp_proposals: str, mode: str = "tunnel") -> None:
    """Add and delete a throwaway ESP state with the proposal's AEAD in the node (TEST-NET-1).

    The decision is on the exit status only; a kernel without ESP or without the AEAD refuses
    the state. Raises PreconditionError naming the node.
    """
    first = esp_proposals.split(",")[0]
    spi = f"0x{pysecrets.randbelow(0xFFFFFF) + 0x100:x}"
    if first.startswith("chacha20poly1305"):
        alg = ["aead", "rfc7539esp(chacha20,poly1305)", "0x" + "11" * 36, "128"]
    elif re.match(r"^aes\d+gcm", first):
        bits = int(re.match(r"^aes(\d+)", first).group(1))
        icv = {"8": 64, "12": 96, "16": 128}.get(
            re.match(r"^aes\d+gcm(\d*)", first).group(1) or "16", 128
        )
        alg = ["aead", "rfc4106(gcm(aes))", "0x" + "11" * (bits // 8 + 4), str(icv)]
    else:
        alg = [
            "enc",
            "cbc(aes)",
            "0x" + "11" * 16,
            "auth-trunc",
            "hmac(sha256)",
            "0x" + "22" * 32,
            "128",
        ]
    sel = ["src", "192.0.2.1", "dst", "192.0.2.2", "proto", "esp", "spi", spi]
    cp = end.node.run(["ip", "xfrm", "state", "add", *sel, "mode", mode, *alg], check=False)
    if cp.returncode != 0:
        raise PreconditionError(
            f"node {end.name}: the kernel refuses an ESP state with {alg[1]} "
            f"({cp.stderr.strip()}); use dataplane=libipsec (or --vm)"
        )
    end.node.run(["ip", "xfrm", "state", "delete", *sel[:-2], "spi", spi], check=False)


# ------------------------------------------------------------------------ leftovers


def cleanup(end: Endpoint, peer: Endpoint, local_ts: list[str], remote_ts: list[str]) -> list[str]:
    """Remove this end's leftovers of a (possibly killed) charon; returns what still remains.

    Only ours: XFRM states between the two underlay addresses, policies between the two ends'
    selectors (`local_ts`, `remote_ts`: addresses or networks, no ports), table-220 routes to
    the peer's selectors -- never a flush, so a board's other tunnels survive. After a clean
    SIGTERM charon has removed all of them already, so this is one listing per kind.
    """
    n = end.node
    left = []
    if n.run(["ip", "link", "show", "dev", LIBIPSEC_TUN], check=False).returncode == 0:
        # a TUN device goes with the process holding it; if it is still there, charon is too
        left.append(f"{end.name}: interface {LIBIPSEC_TUN}")
    for fam in ("-4", "-6"):
        shown = n.run(["ip", fam, "route", "show", "table", ROUTE_TABLE], check=False).stdout
        present = {net(line.split()[0]) for line in shown.splitlines() if line.strip()}
        for dst in remote_ts:
            if net(dst) in present:
                n.run(["ip", fam, "route", "del", dst, "table", ROUTE_TABLE], check=False)
    states = {(end.underlay_v4, peer.underlay_v4), (peer.underlay_v4, end.underlay_v4)}
    pairs = {
        (net(a), net(b))
        for s in local_ts
        for t in remote_ts
        if (":" in s) == (":" in t)
        for a, b in ((s, t), (t, s))
    }
    for kind, ours in (("state", states), ("policy", pairs)):
        found = _xfrm_pairs(n, kind, normalize=kind == "policy") & ours
        for src, dst in found:
            n.run(["ip", "xfrm", kind, "deleteall", "src", str(src), "dst", str(dst)], check=False)
        if found:
            for src, dst in _xfrm_pairs(n, kind, normalize=kind == "policy") & ours:
                left.append(f"{end.name}: xfrm {kind} src {src} dst {dst}")
    # our run directory (vici socket: charon does not unlink it) and charon's pid file
    if n.run(["rm", "-rf", RUN_DIR, PID_FILE], check=False).returncode != 0:
        left.append(f"{end.name}: {RUN_DIR}")
    return left


def _xfrm_pairs(node, kind: str, *, normalize: bool) -> set[tuple]:
    """{(src, dst)} of every XFRM state or policy in the node (`ip xfrm KIND list`)."""
    out = node.run(["ip", "xfrm", kind, "list"], check=False).stdout
    found = set()
    for m in re.finditer(r"^src (\S+) dst (\S+)", out, re.MULTILINE):
        a, b = m.groups()
        found.add((net(a), net(b)) if normalize else (a, b))
    return found


def net(text: str):
    return ipaddress.ip_network(text, strict=False)
