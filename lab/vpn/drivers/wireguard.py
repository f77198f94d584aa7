"""WireGuard: kernel WireGuard when the node's kernel has it, otherwise wireguard-go over TUN;
boringtun (Cloudflare's userspace WireGuard in Rust) when the profile asks for it.

Keys are X25519 (RFC 7748), generated here in Python so that rendering needs no tool; `wg
pubkey` agrees (tests/test_vpn_wireguard.py). The rendered file is wg-quick(8) format, as used on
a board; the lab strips the wg-quick-only keys and hands the rest to `wg setconf`.

wireguard-go puts its UAPI socket in /var/run/wireguard/<ifname>.sock; every lab node has a
private /run (lab.core.netops.create_node_mntns), so both ends can call their interface wg0.
boringtun-cli serves the same UAPI on the same socket, so `wg setconf` configures either.

boringtun is not a Debian package: `./setup.sh --with boringtun` builds boringtun-cli with cargo
into ${LAB_CACHE:-/var/cache/lab}/boringtun (kept across runs and clones). It is therefore no
`requires` Tool (those feed packages.txt, apt's list): check() looks for the binary itself and
names the set-up option when it is missing, and describe() records its version.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import time
from pathlib import Path
from typing import ClassVar

from lab.core.errors import ConfigError, StartupError
from lab.core.node import Node
from lab.model.boardkernel import DataPlaneCpu
from lab.vpn.base import (
    Availability,
    Driver,
    Rekey,
    TunnelContext,
    route_through,
    write_secret,
    render_template,
)
from lab.core.tools import IP, Tool
from lab.model.params import Param
from lab.vpn import userconfig
from lab.vpn.kernelfeatures import has_char_device, probe_netns
import base64

IFNAME = "wg0"
#: where `./setup.sh --with boringtun` installs boringtun-cli (cargo install --root)
BORINGTUN_ROOT = Path(os.environ.get("LAB_CACHE", "/var/cache/lab")) / "boringtun"
BORINGTUN_SETUP = "sudo ./setup.sh --with boringtun"
WG_QUICK_ONLY = {
    "address",
    "mtu",
    "dns",
    "table",
    "preup",
    "postup",
    "predown",
    "postdown",
    "saveconfig",
}
_P = 2**255 - 19


def x25519(k: bytes, u: bytes) -> bytes:
    """RFC 7748 scalar multiplication (Montgomery ladder). Not constant-time: lab keys only."""
    kb = bytearray(k)
    kb[0] &= 248
    kb[31] &= 127
    kb[31] |= 64
    n = int.from_bytes(kb, "little")
    x1 = int.from_bytes(u, "little") & ((1 << 255) - 1)
    x2, z2, x3, z3, swap = 1, 0, x1, 1, 0
    for t in reversed(range(255)):
        bit = (n >> t) & 1
        swap ^= bit
        if swap:
            x2, x3, z2, z3 = x3, x2, z3, z2
        swap = bit
        a, b = (x2 + z2) % _P, (x2 - z2) % _P
        aa, bb = a * a % _P, b * b % _P
        e = (aa - bb) % _P
        c, d = (x3 + z3) % _P, (x3 - z3) % _P
        da, cb = d * a % _P, c * b % _P
        x3, z3 = (da + cb) ** 2 % _P, x1 * (da - cb) ** 2 % _P
        x2, z2 = aa * bb % _P, e * (aa + 121665 * e) % _P
    if swap:
        x2, z2 = x3, z3
    return (x2 * pow(z2, _P - 2, _P) % _P).to_bytes(32, "little")


def genkey() -> tuple[str, str]:
    """(private, public) base64, as `wg genkey | tee priv | wg pubkey`."""

    priv = bytearray(os.urandom(32))
    priv[0] &= 248
    priv[31] = (priv[31] & 127) | 64
    pub = x25519(bytes(priv), (9).to_bytes(32, "little"))
    return base64.b64encode(bytes(priv)).decode(), base64.b64encode(pub).decode()


def setconf_text(wg_quick: str) -> str:
    """wg-quick file -> `wg setconf` file (the wg-quick-only keys removed, as `wg-quick strip`)."""
    out = []
    for line in wg_quick.splitlines():
        key = line.split("=", 1)[0].strip().lower() if "=" in line else ""
        if key not in WG_QUICK_ONLY:
            out.append(line)
    return "\n".join(out) + "\n"


def kernel_wireguard(node: Node) -> tuple[bool, str]:
    """Can the node's kernel create a WireGuard link? Probed in a throwaway network namespace on
    the node (`unshare --net`): the probe link dies with that namespace, nothing is left behind."""
    return probe_netns(node, ["ip", "link", "add", "wgprobe", "type", "wireguard"])


class WireGuardDriver(Driver):
    name = "wireguard"
    params: ClassVar[dict[str, Param]] = {
        "listen_port": Param(int, 51820, "UDP port both ends listen on", min=1, max=65535),
        "mtu": Param(int, 1420, "tunnel interface MTU", min=1280, max=9000),
        "implementation": Param(
            str,
            "auto",
            "data plane: kernel, wireguard-go, boringtun (userspace, Rust; built by "
            f"`{BORINGTUN_SETUP}`), or auto (kernel when the kernel has it, else wireguard-go)",
            choices=("auto", "kernel", "wireguard-go", "boringtun"),
        ),
        "boringtun_threads": Param(
            int,
            4,
            "implementation=boringtun: its worker threads (boringtun-cli --threads, default 4)",
            min=1,
            max=64,
        ),
        "persistent_keepalive": Param(
            int, 0, "seconds between keepalives (0: off)", min=0, max=65535
        ),
    }
    secret_markers = ("client_private", "server_private", "preshared")
    requires = (
        Tool("wg", "wireguard-tools", ("wg", "--version")),
        Tool("wireguard-go", "wireguard-go", ("wireguard-go", "--version"), board=True),
        IP,
    )

    def tools(self, params: dict) -> list[str]:
        impl = params["implementation"]
        return ["wg", "ip"] + (["wireguard-go"] if impl == "wireguard-go" else [])

    def validate(self, params: dict, *, source: str) -> None:
        if params["listen_port"] == 0:
            raise ConfigError("must be 1..65535", source=source, field="params.listen_port")

    def check(self, params: dict, node: Node) -> Availability:
        impl = params["implementation"]
        if impl == "boringtun":
            if boringtun_binary(node) is None:
                return Availability(
                    False,
                    "boringtun",
                    f"boringtun-cli not built (neither {BORINGTUN_ROOT}/bin/boringtun-cli nor "
                    f"on PATH): run `{BORINGTUN_SETUP}`",
                )
            if not has_char_device(node, "/dev/net/tun"):
                return Availability(False, "boringtun", "/dev/net/tun missing")
            return Availability(True, "boringtun")
        kernel, why = kernel_wireguard(node)
        if impl in ("auto", "kernel") and kernel:
            return Availability(True, "kernel")
        if impl == "kernel":
            return Availability(False, "kernel", f"kernel WireGuard unavailable ({why}); use --vm")
        if node.missing_tools(["wireguard-go"]):
            return Availability(False, "wireguard-go", "no kernel WireGuard and no wireguard-go")
        if not has_char_device(node, "/dev/net/tun"):
            return Availability(False, "wireguard-go", "/dev/net/tun missing")
        return Availability(True, "wireguard-go")

    def secrets(self, ctx: TunnelContext, params: dict) -> dict[str, str]:
        out = {}
        for role in ("client", "server"):
            priv, pub = genkey()
            write_secret(ctx.secrets_dir, f"wg-{role}.key", priv + "\n")
            out[f"{role}_private"], out[f"{role}_public"] = priv, pub
        if ctx.configs:  # the user's files may have a PresharedKey: the lab's, per lab
            out["preshared"] = base64.b64encode(os.urandom(32)).decode()
            write_secret(ctx.secrets_dir, "wg-preshared.key", out["preshared"] + "\n")
        return out

    def render(self, ctx: TunnelContext, params: dict, secrets: dict[str, str]) -> dict:
        if ctx.configs:
            return self._render_user(ctx, params, secrets)
        rendered = {}
        for role, end in (("client", ctx.client), ("server", ctx.server)):
            peer = ctx.peer(end)
            prole = "server" if role == "client" else "client"
            allowed = [_host_route(peer.tunnel_v4), _host_route(peer.tunnel_v6), *peer.behind]
            rendered[end.name] = {
                f"{IFNAME}.conf": render_template(
                    "wireguard/wg0.conf.j2",
                    ifname=IFNAME,
                    node=end.name,
                    role=role,
                    profile=ctx.profile or self.name,
                    address_v4=end.tunnel_v4,
                    address_v6=end.tunnel_v6,
                    listen_port=params["listen_port"],
                    private_key=secrets[f"{role}_private"],
                    mtu=params["mtu"],
                    peer_node=peer.name,
                    peer_public_key=secrets[f"{prole}_public"],
                    allowed_ips=allowed,
                    peer_endpoint=f"{peer.underlay_v4}:{params['listen_port']}",
                    persistent_keepalive=params["persistent_keepalive"],
                )
            }
        return rendered

    def _render_user(self, ctx: TunnelContext, params: dict, secrets: dict[str, str]) -> dict:
        """The user's wg-quick files (docs/byoc.md), checked: AllowedIPs holds the peer."""

        def values(end, role):
            peer, prole = ctx.peer(end), "server" if role == "client" else "client"
            allowed = [_host_route(peer.tunnel_v4), *peer.behind]
            if peer.tunnel_v6:
                allowed.insert(1, _host_route(peer.tunnel_v6))
            return {
                "address": ", ".join(a for a in (end.tunnel_v4, end.tunnel_v6) if a),
                "private_key": secrets[f"{role}_private"],
                "peer_public_key": secrets[f"{prole}_public"],
                "preshared_key": secrets["preshared"],
                "listen_port": params["listen_port"],
                "peer_endpoint": f"{peer.underlay_v4}:{params['listen_port']}",
                "peer_allowed_ips": ", ".join(allowed),
            }, {}

        rendered = userconfig.render(ctx, self.name, values)
        for end in ctx.ends():
            text = rendered[end.name][f"{IFNAME}.conf"]
            userconfig.wg_check(userconfig.config_of(ctx, end), text, ctx.peer(end))
        return rendered

    def start(self, ctx: TunnelContext, params: dict, rendered: dict) -> None:
        impl = params["implementation"]
        for end in ctx.ends():
            ctx.write_config(end, rendered[end.name])
            wg_quick = rendered[end.name][f"{IFNAME}.conf"]
            setconf = setconf_text(wg_quick)
            if ctx.configs and not userconfig.config_of(ctx, end).listen_port:
                # the lab owns the port the peer's Endpoint names: given to wg with the rest
                # (set later, the port moves under a handshake already under way)
                setconf = re.sub(
                    r"(?im)^\s*\[interface\]\s*$",
                    lambda m: f"{m.group(0)}\nListenPort = {params['listen_port']}",
                    setconf,
                    count=1,
                )
            conf = ctx.write_config(end, {f"{IFNAME}.setconf": setconf})
            node = end.node
            made = False
            if impl in ("auto", "kernel"):
                cp = node.run(["ip", "link", "add", IFNAME, "type", "wireguard"], check=False)
                made = cp.returncode == 0
                if not made and impl == "kernel":
                    raise StartupError(
                        f"{end.name}: cannot create a kernel WireGuard link: {cp.stderr.strip()}"
                    )
            if impl == "boringtun":
                d = node.spawn("boringtun", boringtun_argv(node, params))
                ctx.daemons.append(d)
                self._wait_uapi(ctx, end, d)
            elif not made:
                d = node.spawn(
                    "wireguard-go",
                    ["wireguard-go", "-f", IFNAME],
                    env={"WG_PROCESS_FOREGROUND": "1", "LOG_LEVEL": "error"},
                )
                ctx.daemons.append(d)
                self._wait_uapi(ctx, end, d)
            mtu = params["mtu"]
            if ctx.configs:  # the user's file: wg's own parser judges it, errors name its line
                cfg = userconfig.config_of(ctx, end)
                cp = node.run(
                    ["wg", "setconf", IFNAME, str(conf[f"{IFNAME}.setconf"])], check=False
                )
                if cp.returncode != 0:
                    raise userconfig.wg_setconf_error(cfg, wg_quick, setconf, cp.stderr)
                mtu = cfg.mtu or mtu  # the file's own MTU, read when the profile was loaded
            else:
                node.run(["wg", "setconf", IFNAME, str(conf[f"{IFNAME}.setconf"])])
            node.run(["ip", "-4", "addr", "add", end.tunnel_v4, "dev", IFNAME])
            if end.tunnel_v6:
                node.run(["ip", "-6", "addr", "add", end.tunnel_v6, "dev", IFNAME, "nodad"])
            node.run(["ip", "link", "set", IFNAME, "mtu", str(mtu), "up"])
            route_through(end, ctx.peer(end), IFNAME)

    def stop(self, ctx: TunnelContext, params: dict) -> None:
        """The daemons, then the wg0 this driver made: a userspace daemon's TUN goes with its
        process, but the kernel unregisters it a moment later, and a kernel link stays until
        deleted; a start right after (the handshake test's cold establishment) must find none."""
        super().stop(ctx, params)
        for end in ctx.ends():
            deadline = time.monotonic() + 2.0
            while end.node.run(["ip", "link", "show", "dev", IFNAME], check=False).returncode == 0:
                if time.monotonic() > deadline:
                    end.node.run(["ip", "link", "del", "dev", IFNAME], check=False)
                    break
                time.sleep(0.02)

    @staticmethod
    def _wait_uapi(ctx: TunnelContext, end, daemon, timeout: float = 5.0) -> None:
        """Until the userspace daemon (wireguard-go, boringtun) answers on its UAPI socket (it
        creates the TUN first).

        `wg` is asked only once the socket listens (uapi_listening: the node's /proc/net/unix):
        wg deletes a socket file whose connect() is refused ("If the process is gone, we try to
        clean up the socket", wireguard-tools ipc-uapi-unix.h), and between the daemon's bind()
        and listen() a connect() is refused. wireguard-go then finds its socket gone when it
        watches it and exits: "Failed to listen on uapi socket: no such file or directory". The
        window is microseconds, but a node's CPU cap can stop the daemon inside it for the rest
        of a CFS period, more often on a host busy with another lab."""
        deadline = time.monotonic() + timeout
        while True:
            cp = end.node.run(["cat", "/proc/net/unix"], check=False)
            if (
                cp.returncode == 0
                and uapi_listening(cp.stdout, IFNAME)
                and end.node.run(["wg", "show", IFNAME, "listen-port"], check=False).returncode == 0
            ):
                return
            if not daemon.alive() or time.monotonic() > deadline:
                raise StartupError(
                    f"{daemon.name} on {end.name} {'exited' if not daemon.alive() else 'not ready'}"
                    f" during start-up\n{daemon.log_tail()}"
                )
            time.sleep(0.01)

    def cpu_dataplane(self, params: dict, path: str) -> DataPlaneCpu | None:
        if path == "boringtun":
            # the board runs the same program: its --threads workers over the board's cores.
            # Its data path seals with ring's ChaCha20-Poly1305 (boringtun src/noise/session.rs):
            # assembly of the same origin as OpenSSL's, but ring picks its code by its own CPU
            # probe, which OPENSSL_ia32cap does not reach. Priced by OpenSSL's masked figure it
            # would run unmasked code at a masked code's price, so it names no primitive: one
            # board core's share per core (core_share), listed as unreferenced
            return DataPlaneCpu(
                daemon="boringtun",
                primitive=None,
                board="userspace",
                threads="program",
                what="boringtun (userspace, ring's ChaCha20-Poly1305; unreferenced: no "
                "calibrated figure for it, core_share)",
            )
        if path != "wireguard-go":
            return None
        board_kernel = params["implementation"] != "wireguard-go"  # a board has the module
        return DataPlaneCpu(
            daemon="wireguard-go",
            primitive="go-chacha20-poly1305",
            board="kernel:wireguard" if board_kernel else "userspace",
            what="wireguard-go (userspace, Go x/crypto)"
            + (" for the board's kernel WireGuard" if board_kernel else ""),
        )

    def rekey_support(self, params: dict) -> Rekey:
        # REKEY_AFTER_TIME is an enum constant of the kernel module (messages.h) and a Go const
        # of wireguard-go (device/constants.go): neither has a knob, `wg` has no command for it
        return Rekey(
            False,
            "WireGuard starts a new handshake on its own timer (REKEY_AFTER_TIME = 120 s, a "
            "constant compiled into the kernel module and wireguard-go); no command forces one "
            "and neither binary lets the timer be shortened",
        )

    def describe(self, ctx: TunnelContext, params: dict) -> dict:
        node = ctx.client.node
        if any(d.name == "boringtun" for d in ctx.daemons):
            return self._describe_boringtun(ctx, params)
        userspace = any(d.name == "wireguard-go" for d in ctx.daemons)
        link = json.loads(node.run(["ip", "-j", "link", "show", "dev", IFNAME]).stdout)[0]
        version = node.run(["wg", "--version"]).stdout.strip().split(" - ")[0]
        impl_version = "kernel " + node.run(["uname", "-r"]).stdout.strip()
        if userspace:
            impl_version = node.run(["wireguard-go", "--version"]).stdout.strip().splitlines()[0]
        return {
            "implementation": "wireguard-go" if userspace else "kernel WireGuard",
            "version": impl_version,
            "tools": version,
            "path": "wireguard-go" if userspace else "kernel",
            "cipher": "ChaCha20-Poly1305 (Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s)",
            "interface": IFNAME,
            "mtu": int(link["mtu"]),
            "listen_port": params["listen_port"],
        }

    def _describe_boringtun(self, ctx: TunnelContext, params: dict) -> dict:
        node = ctx.client.node
        link = json.loads(node.run(["ip", "-j", "link", "show", "dev", IFNAME]).stdout)[0]
        binary = boringtun_binary(node) or "boringtun-cli"
        return {
            "implementation": "boringtun",
            "version": node.run([binary, "--version"]).stdout.strip().splitlines()[0],
            "tools": node.run(["wg", "--version"]).stdout.strip().split(" - ")[0],
            "path": "boringtun",
            "cipher": "ChaCha20-Poly1305 (Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s)",
            "interface": IFNAME,
            "mtu": int(link["mtu"]),
            "listen_port": params["listen_port"],
            "threads": params["boringtun_threads"],
        }


#: where wireguard-go and boringtun bind their UAPI socket (wireguard-go ipc/uapi_unix.go
#: socketDirectory; /var/run is /run on the nodes), as /proc/net/unix shows the bound path
UAPI_DIRS = ("/var/run/wireguard", "/run/wireguard")
#: /proc/net/unix Flags bit of a listening socket (__SO_ACCEPTCON, include/linux/net.h)
SO_ACCEPTCON = 0x10000


def uapi_listening(proc_net_unix: str, ifname: str) -> bool:
    """Whether /proc/net/unix (Num RefCount Protocol Flags Type St Inode Path) holds the UAPI
    socket of `ifname` listening: bound and listen()ed, so a connect() is accepted, not refused.
    The file is per network namespace: a node's shows its own sockets only."""
    paths = {f"{d}/{ifname}.sock" for d in UAPI_DIRS}
    for line in proc_net_unix.splitlines():
        f = line.split()
        # boringtun binds "/var/run/wireguard//wg0.sock", and the path is shown as bound
        if len(f) >= 8 and posixpath.normpath(f[7]) in paths:
            try:
                if int(f[3], 16) & SO_ACCEPTCON:
                    return True
            except ValueError:
                continue
    return False


def boringtun_binary(node: Node) -> str | None:
    """The boringtun-cli the node can execute: setup.sh's build, else one on PATH; None."""
    built = str(BORINGTUN_ROOT / "bin" / "boringtun-cli")
    missing = node.missing_tools([built, "boringtun-cli"])
    for b in (built, "boringtun-cli"):
        if b not in missing:
            return b
    return None


def boringtun_argv(node: Node, params: dict) -> list[str]:
    """boringtun-cli in the foreground (the lab owns the process: its PID is recorded), as root
    (dropping privileges would lose the TUN it reconfigures), its UAPI socket in the node's
    /run/wireguard like wireguard-go's."""
    binary = boringtun_binary(node)
    if binary is None:
        raise StartupError(f"boringtun-cli missing on the node: run `{BORINGTUN_SETUP}`")
    return [
        binary,
        "--foreground",
        "--disable-drop-privileges",
        "--threads",
        str(params["boringtun_threads"]),
        "--verbosity",
        "error",
        IFNAME,
    ]


def _host_route(cidr: str) -> str:
    addr = cidr.split("/")[0]
    return f"{addr}/{128 if ':' in addr else 32}"
