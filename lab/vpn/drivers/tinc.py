"""tinc 1.0 (tincd) in router mode over a TUN device: two nodes, the client ConnectTo the server.

Per node one tinc configuration directory, exactly as deployed in /etc/tinc/<net>/ on a board:
tinc.conf, hosts/<client> and hosts/<server> (Subnet lines, Cipher/Digest and the node's RSA
public key; identical on both ends), rsa_key.priv (the node's 2048-bit RSA private key, a
secret) and tinc-up (addresses, MTU and the routes to the networks behind the peer; tincd runs
it once the TUN device exists). With Blowfish, also openssl.cnf: tinc 1.0 does not load OpenSSL
3's legacy provider, where Blowfish now lives, so tincd is started with OPENSSL_CONF pointing
at a file that activates it (without it the UDP key exchange fails with "unsupported" and
tinc silently carries the traffic over its TCP meta connection instead).

The data plane is tinc's own userspace one: UDP packets (port 655) carrying
seqno + payload, encrypted with `cipher` and followed by a `digest` MAC of MACLength bytes.
The RSA keys only protect the meta connection (TCP, same port) and the packet-key exchange.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import ClassVar

from lab.core import proc
from lab.core.errors import LabError, StartupError
from lab.core.node import Node
from lab.model.boardkernel import DataPlaneCpu
from lab.vpn.base import Availability, Driver, Rekey, TunnelContext, make_secrets, render_template
from lab.core.tools import IP, Tool
from lab.model.params import Param
from lab.vpn.kernelfeatures import has_char_device

IFNAME = "tinc0"
NETNAME = "lab"
#: tinc 1.0 cipher names (OpenSSL's); "none" sends packets unencrypted
CIPHERS = ("blowfish", "aes-128-cbc", "aes-256-cbc", "none")
#: ciphers OpenSSL 3 moved to its legacy provider
LEGACY_CIPHERS = ("blowfish",)
DIGESTS = ("sha1", "sha256", "sha512", "md5", "none")
MAC_LENGTH = 4  # tinc 1.0's default MACLength: the HMAC is truncated to 4 bytes per packet
RSA_BITS = 2048
#: logged (at any debug level) when a packet key cannot be set up: tinc then sends the data
#: over its TCP meta connection, which must not pass for a working UDP data plane
KEY_ERROR = "Error during initialisation of key"


def tinc_name(node: str) -> str:
    """tinc node names are [A-Za-z0-9_] only."""
    return re.sub(r"[^A-Za-z0-9_]", "_", node)


class TincDriver(Driver):
    name = "tinc"
    params: ClassVar[dict[str, Param]] = {
        "cipher": Param(
            str, "blowfish", "packet cipher (tinc 1.0/OpenSSL name; none: cleartext)", CIPHERS
        ),
        "digest": Param(str, "sha1", "packet MAC digest (none: no MAC)", DIGESTS),
        "port": Param(int, 655, "UDP data + TCP meta port on both ends", min=1, max=65535),
        "mtu": Param(int, 1500, "MTU of the tinc0 device (set by tinc-up)", min=576, max=9000),
        "pmtu_discovery": Param(
            bool,
            False,
            "tinc's path-MTU discovery and MSS clamping (tinc's own default: on); off: the "
            "device MTU is the tunnel MTU and the kernel fragments large outer UDP packets",
        ),
    }
    secret_markers = ("client_private", "server_private")
    requires = (
        Tool("tincd", "tinc", ("tincd", "--version"), board=True),
        IP,
        # keys are made on the controller; the node's OpenSSL is asked about Blowfish
        Tool("openssl", "openssl", ("openssl", "version"), board=True),
    )

    def check(self, params: dict, node: Node) -> Availability:
        if not has_char_device(node, "/dev/net/tun"):
            return Availability(False, "userspace", "/dev/net/tun missing")
        if params["cipher"] in LEGACY_CIPHERS and not _legacy_provider(node):
            return Availability(
                False,
                "userspace",
                f"{params['cipher']} needs OpenSSL 3's legacy provider (legacy.so), not found",
            )
        return Availability(True, "userspace")

    # ---------------------------------------------------------------- secrets and configs
    def secrets(self, ctx: TunnelContext, params: dict) -> dict[str, str]:
        """One RSA key pair per node: PKCS#1 PEM, as `tincd -K2048` writes them; the private
        keys kept as <lab>/secrets/tinc-<role>.priv."""
        roles = ("client", "server")
        public: dict[str, str] = {}

        def make(t: Path) -> None:
            for role in roles:
                priv = t / f"{role}.priv"
                proc.run(
                    ["openssl", "genrsa", "-traditional", "-out", priv, str(RSA_BITS)],
                    where="controller",
                )
                public[role] = proc.run(
                    ["openssl", "rsa", "-in", priv, "-RSAPublicKey_out"], where="controller"
                ).stdout.strip()

        made = make_secrets(ctx.secrets_dir, "tinc-", [f"{r}.priv" for r in roles], make)
        out: dict[str, str] = {}
        for role in roles:
            out[f"{role}_private"] = made[f"{role}.priv"].strip()
            out[f"{role}_public"] = public[role]
        return out

    def render(self, ctx: TunnelContext, params: dict, secrets: dict[str, str]) -> dict:
        legacy = params["cipher"] in LEGACY_CIPHERS
        hosts = {}
        for role, end in (("client", ctx.client), ("server", ctx.server)):
            hosts[f"hosts/{tinc_name(end.name)}"] = render_template(
                "tinc/host.j2",
                name=tinc_name(end.name),
                node=end.name,
                profile=ctx.profile or self.name,
                # only the server needs an Address: the client connects to it, not the other way
                address=end.underlay_v4 if role == "server" else None,
                port=params["port"],
                cipher=params["cipher"],
                digest=params["digest"],
                mac_length=MAC_LENGTH,
                subnets=[_host_net(end.tunnel_v4), _host_net(end.tunnel_v6), *end.behind],
                public_key=secrets[f"{role}_public"],
            )
        rendered = {}
        for role, end in (("client", ctx.client), ("server", ctx.server)):
            peer = ctx.peer(end)
            common = {
                "node": end.name,
                "role": role,
                "profile": ctx.profile or self.name,
                "mtu": params["mtu"],
            }
            files = {
                "tinc.conf": render_template(
                    "tinc/tinc.conf.j2",
                    **common,
                    netname=NETNAME,
                    name=tinc_name(end.name),
                    peer_name=tinc_name(peer.name),
                    ifname=IFNAME,
                    pmtu_discovery=params["pmtu_discovery"],
                    legacy=legacy,
                ),
                **hosts,
                "rsa_key.priv": secrets[f"{role}_private"] + "\n",
                "tinc-up": render_template(
                    "tinc/tinc-up.j2",
                    **common,
                    tunnel_v4=end.tunnel_v4,
                    tunnel_v6=end.tunnel_v6,
                    peer_node=peer.name,
                    peer_behind=peer.behind,
                ),
            }
            if legacy:
                files["openssl.cnf"] = render_template("tinc/openssl.cnf.j2", **common)
            rendered[end.name] = files
        return rendered

    # ---------------------------------------------------------------- running
    def start(self, ctx: TunnelContext, params: dict, rendered: dict) -> None:
        # the server first, and the client only once the server listens: a refused ConnectTo
        # is retried only after 5 s
        for end in (ctx.server, ctx.client):
            paths = ctx.write_config(end, rendered[end.name])
            paths["tinc-up"].chmod(0o700)  # tincd executes it
            confdir = paths["tinc.conf"].parent
            env = {"OPENSSL_CONF": str(paths["openssl.cnf"])} if "openssl.cnf" in paths else None
            argv = [
                "tincd",
                "--no-detach",
                "--debug=3",  # level 3 logs the key exchange (ANS_KEY) that start() waits for
                f"--config={confdir}",
                f"--pidfile={confdir / 'tinc.pid'}",
            ]
            d = end.node.spawn("tincd", argv, env=env)
            ctx.daemons.append(d)
            # "Ready" follows tinc-up (run synchronously) and the listening sockets
            _wait_log(end.name, d, "Ready", timeout=5.0)
            _check_configured(end, d)
        # both ends hold the other's packet key: the UDP data plane is set up (a key that
        # cannot be initialised is logged; traffic would then go over the TCP meta connection)
        for end in ctx.ends():
            d = next(d for d in ctx.daemons if d.node == end.name)
            _wait_log(end.name, d, f"Got ANS_KEY from {tinc_name(ctx.peer(end).name)}", timeout=10)
        _check_keys(ctx)

    def cpu_dataplane(self, params: dict, path: str) -> DataPlaneCpu | None:
        # tinc 1.0 handles packets on one thread, on the board as here
        cipher = params["cipher"]
        return DataPlaneCpu(
            daemon="tincd",
            primitive=cipher if cipher in ("aes-128-cbc", "aes-256-cbc") else None,
            board="userspace",
            threads="one",
            what="tincd (userspace, OpenSSL, one thread)",
        )

    def rekey_support(self, params: dict) -> Rekey:
        return Rekey(
            False,
            "tinc 1.0 renews its session keys on its own KeyExpire timer (default 3600 s); no "
            "signal or command forces it",
        )

    def describe(self, ctx: TunnelContext, params: dict) -> dict:
        _check_keys(ctx)
        node = ctx.client.node
        lines = node.run(["tincd", "--version"], check=False).stdout.splitlines()
        m = re.match(r"tinc version (\S+)", lines[0]) if lines else None
        link = json.loads(node.run(["ip", "-j", "link", "show", "dev", IFNAME]).stdout)[0]
        return {
            "implementation": "tinc",
            "version": m.group(1) if m else None,
            "path": "userspace",
            "mode": "router",
            "transport": "udp",  # data; the meta connection is TCP on the same port
            "cipher": params["cipher"],
            "digest": params["digest"],
            "mac_length": MAC_LENGTH if params["digest"] != "none" else 0,
            "openssl_legacy_provider": params["cipher"] in LEGACY_CIPHERS,
            "pmtu_discovery": params["pmtu_discovery"],
            "rsa_bits": RSA_BITS,
            "interface": IFNAME,
            "mtu": int(link["mtu"]),
        }


def _host_net(addr: str) -> str:
    """10.99.0.1/24 -> 10.99.0.1/32: a node owns its tunnel address, the net is the device's."""
    ip = addr.split("/")[0]
    return f"{ip}/128" if ":" in ip else f"{ip}/32"


def _legacy_provider(node: Node) -> bool:
    """Is OpenSSL 3's legacy provider module installed on the node (or is its OpenSSL 1.x, which
    has Blowfish built in)? Probed with the node's openssl tool; changes nothing."""
    try:
        cp = node.run(
            ["openssl", "list", "-providers", "-provider", "legacy"], check=False, timeout=10
        )
    except LabError:  # no openssl there
        return False
    return cp.returncode == 0 or "invalid command" in cp.stderr.lower()


def _wait_log(node: str, daemon, needle: str, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        text = daemon.log_text()
        if KEY_ERROR in text:
            raise StartupError(
                f"tincd on {node}: the packet key could not be set up (cipher/digest not "
                f"available in this OpenSSL?)\n{daemon.log_tail(20)}"
            )
        if needle in text:
            return
        if not daemon.alive() or time.monotonic() > deadline:
            what = "exited" if not daemon.alive() else f"did not log {needle!r} in {timeout:.0f} s"
            raise StartupError(f"tincd on {node} {what} during start-up\n{daemon.log_tail(20)}")
        time.sleep(0.01)


def _check_configured(end, daemon) -> None:
    """tinc-up ran and gave the device its address (tincd logs a failed script and goes on)."""
    want = end.tunnel_v4.split("/")[0]
    cp = end.node.run(["ip", "-j", "-4", "addr", "show", "dev", IFNAME], check=False)
    if cp.returncode != 0 or want not in cp.stdout:
        raise StartupError(
            f"tincd on {end.name}: tinc-up did not configure {IFNAME} with {want}\n"
            + daemon.log_tail(20)
        )


def _check_keys(ctx: TunnelContext) -> None:
    for d in ctx.daemons:
        text = d.log_text()
        if KEY_ERROR in text:
            raise StartupError(
                f"tincd on {d.node}: the packet key could not be set up; tinc would carry the "
                f"traffic over its TCP meta connection\n{d.log_tail(20)}"
            )
