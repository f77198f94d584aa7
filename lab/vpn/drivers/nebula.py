"""Nebula (Slack's overlay network, Debian's `nebula`): two nodes, the server is the lighthouse.

Per node one config.yml, exactly as deployed in /etc/nebula/ on a board: the network's CA
certificate, the node's certificate (its overlay IPv4 address, signed by the CA) and its
X25519 private key inline under `pki`; the lighthouse's overlay address mapped to its underlay
UDP endpoint (`static_host_map`) on the client; a firewall that lets everything inside the
overlay pass; the TUN device's MTU and the network's cipher from the profile. The CA and both
node certificates are made per lab with `nebula-cert` on the controller and kept (0600) in the
lab's secrets directory; the certificates and keys in the rendered files are redacted
everywhere they are shown or recorded.

The data plane is nebula's own userspace one: a Go daemon reading a TUN device (like
wireguard-go), its packets in UDP (port 4242) after a Noise IX handshake, sealed with
AES-256-GCM (Go's crypto/aes, `cipher: aes`, nebula's default) or ChaCha20-Poly1305 (x/crypto,
`cipher: chachapoly`). `routines` (default 1) is the number of TUN-reader/UDP-reader goroutine
pairs: with one, each direction's crypto runs on one goroutine at a time.

IPv4 only: nebula 1.6 (Debian bookworm's 1.6.1) puts one IPv4 network in a certificate and
drops every packet that is not IPv4 on the TUN device (IPv6 overlays need nebula 1.10's v2
certificates), so the profiles name IPv4-only tunnel addresses ([tunnel]) and the lab's tests
that need IPv6 say they do not apply. Host to host only: the networks behind an end would need
`unsafe_routes` and certificate subnets, which this driver does not render.
"""

from __future__ import annotations

import json
import re
import textwrap
import time
from pathlib import Path
from typing import ClassVar

from lab.core import proc
from lab.core.errors import ConfigError, StartupError
from lab.core.node import Node
from lab.core.tools import IP, Tool
from lab.model.boardkernel import DataPlaneCpu
from lab.model.params import Param
from lab.vpn.base import Availability, Driver, Rekey, TunnelContext, make_secrets, render_template
from lab.vpn.kernelfeatures import has_char_device

IFNAME = "nebula1"
#: config.yml's `cipher` -> the AEAD it names
CIPHERS = {"aes": "AES-256-GCM", "chachapoly": "ChaCha20-Poly1305"}
#: nebula logs this once the TUN device is up and the UDP socket listens (interface.go)
ACTIVE = "Nebula interface is active"
#: the name of the CA nebula-cert makes per lab
CA_NAME = "lab"
#: why IPv6 is not carried, for errors and describe()
IPV4_ONLY = (
    "nebula 1.6 carries IPv4 only (its certificates hold one IPv4 network; IPv6 packets on the "
    "TUN device are dropped)"
)


class NebulaDriver(Driver):
    name = "nebula"
    params: ClassVar[dict[str, Param]] = {
        "cipher": Param(
            str,
            "aes",
            "the network's AEAD: aes (AES-256-GCM, nebula's default) or chachapoly "
            "(ChaCha20-Poly1305)",
            tuple(CIPHERS),
        ),
        "port": Param(int, 4242, "UDP port both ends listen on", min=1, max=65535),
        "mtu": Param(
            int, 1300, "MTU of the nebula1 device (nebula's default: 1300)", min=576, max=9000
        ),
        "routines": Param(
            int,
            1,
            "TUN/UDP reader goroutine pairs (nebula's default: 1; more sets IFF_MULTI_QUEUE and "
            "SO_REUSEPORT)",
            min=1,
            max=64,
        ),
    }
    secret_markers = ("ca_cert", "client_cert", "server_cert", "client_key", "server_key")
    requires = (
        Tool("nebula", "nebula", ("nebula", "-version"), board=True),
        # certificates are made on the controller (secrets()), never on a node
        Tool("nebula-cert", "nebula", ("nebula-cert", "-version")),
        IP,
    )

    def tools(self, params: dict) -> list[str]:
        return ["nebula", "ip"]

    def check_topology(self, spec, plan) -> None:
        src = str(plan.profile.path)
        for side in (plan.client, plan.server):
            if plan.tunnel_addrs(side)[1]:
                raise ConfigError(
                    f"{IPV4_ONLY}: give the profile a [tunnel] table with IPv4 addresses only, "
                    'e.g. client = ["10.99.0.1/24"], server = ["10.99.0.2/24"]',
                    source=src,
                    field="tunnel",
                )
            if side.behind:
                raise ConfigError(
                    f"node {side.node!r} of {spec.source} has networks behind it "
                    f"({', '.join(side.behind)}); the nebula driver connects the two VPN ends "
                    "only (no unsafe_routes): use a topology whose VPN ends are the traffic ends, "
                    "e.g. pi_pair_middlebox",
                    source=src,
                    field="driver",
                )

    def check(self, params: dict, node: Node) -> Availability:
        if not has_char_device(node, "/dev/net/tun"):
            return Availability(False, "userspace", "/dev/net/tun missing")
        return Availability(True, "userspace")

    # ---------------------------------------------------------------- secrets and configs
    def secrets(self, ctx: TunnelContext, params: dict) -> dict[str, str]:
        """A CA and one certificate + X25519 key per node, made by nebula-cert on the controller
        (the CA's key signs, then stays in the secrets directory, 0600 like everything there)."""

        def make(t: Path) -> None:
            proc.run(
                ["nebula-cert", "ca", "-name", CA_NAME, "-duration", "24h",
                 "-out-crt", t / "ca.crt", "-out-key", t / "ca.key"],
                where="controller",
            )  # fmt: skip
            for role, end in (("client", ctx.client), ("server", ctx.server)):
                proc.run(
                    ["nebula-cert", "sign", "-ca-crt", t / "ca.crt", "-ca-key", t / "ca.key",
                     "-name", end.name, "-ip", end.tunnel_v4,
                     "-out-crt", t / f"{role}.crt", "-out-key", t / f"{role}.key"],
                    where="controller",
                )  # fmt: skip

        names = [f"{who}.{x}" for who in ("ca", "client", "server") for x in ("crt", "key")]
        made = make_secrets(ctx.secrets_dir, "nebula-", names, make)
        # the values as they stand in config.yml (a YAML block, indented): redaction finds them
        out = {"ca_cert": _block(made["ca.crt"])}
        for role in ("client", "server"):
            out[f"{role}_cert"] = _block(made[f"{role}.crt"])
            out[f"{role}_key"] = _block(made[f"{role}.key"])
        return out

    def render(self, ctx: TunnelContext, params: dict, secrets: dict[str, str]) -> dict:
        rendered = {}
        for role, end in (("client", ctx.client), ("server", ctx.server)):
            rendered[end.name] = {
                "config.yml": render_template(
                    "nebula/config.yml.j2",
                    node=end.name,
                    role=role,
                    profile=ctx.profile or self.name,
                    lighthouse=role == "server",
                    lighthouse_ip=ctx.server.tunnel_v4.split("/")[0],
                    lighthouse_underlay=ctx.server.underlay_v4,
                    port=params["port"],
                    routines=params["routines"],
                    cipher=params["cipher"],
                    ifname=IFNAME,
                    mtu=params["mtu"],
                    ca_cert=secrets["ca_cert"],
                    cert=secrets[f"{role}_cert"],
                    key=secrets[f"{role}_key"],
                )
            }
        return rendered

    # ---------------------------------------------------------------- running
    def start(self, ctx: TunnelContext, params: dict, rendered: dict) -> None:
        # the lighthouse first: the client's first handshake then finds it listening
        for end in (ctx.server, ctx.client):
            paths = ctx.write_config(end, rendered[end.name])
            d = end.node.spawn("nebula", ["nebula", "-config", str(paths["config.yml"])])
            ctx.daemons.append(d)
            _wait_active(end.name, d, timeout=5.0)

    def cpu_dataplane(self, params: dict, path: str) -> DataPlaneCpu | None:
        # one Go program on the board as here, its goroutines on every core; Go's AES-GCM has no
        # primitive of the lab's calibration (tools/gobench measures x/crypto's ChaCha20-Poly1305
        # only, and no Pi 4 figure for Go's AES-GCM was found: docs/cpu.md "Calibration
        # coverage"), so `aes` is held to the node's core_share alone
        chacha = params["cipher"] == "chachapoly"
        return DataPlaneCpu(
            daemon="nebula",
            primitive="go-chacha20-poly1305" if chacha else None,
            board="userspace",
            threads="program",
            what=f"nebula (userspace, Go {'x/crypto ChaCha20-Poly1305' if chacha else 'crypto/aes AES-256-GCM'}, "
            f"routines={params['routines']})",
        )

    def rekey_support(self, params: dict) -> Rekey:
        return Rekey(
            False,
            "nebula 1.6 does not rekey: a tunnel keeps its handshake's keys until it is closed "
            "(nebula's admin sshd `close-tunnel`, not enabled here), and the next packet then "
            "makes a new handshake",
        )

    def describe(self, ctx: TunnelContext, params: dict) -> dict:
        node = ctx.client.node
        out = node.run(["nebula", "-version"], check=False).stdout
        m = re.search(r"Version:\s*(\S+)", out)
        link = json.loads(node.run(["ip", "-j", "link", "show", "dev", IFNAME]).stdout)[0]
        return {
            "implementation": "nebula",
            "version": m.group(1) if m else None,
            "path": "userspace",
            "transport": "udp",
            "cipher": CIPHERS[params["cipher"]],
            "nebula_cipher": params["cipher"],
            "handshake": "Noise IX (X25519), certificates signed by a per-lab CA",
            "lighthouse": ctx.server.name,
            "routines": params["routines"],
            "ipv6": f"not carried: {IPV4_ONLY}",
            "interface": IFNAME,
            "mtu": int(link["mtu"]),
            "port": params["port"],
        }


def _block(pem: str) -> str:
    """A PEM text as the body of config.yml's `key: |` block (4 spaces in, no final newline)."""
    return textwrap.indent(pem.strip(), "    ")


def _wait_active(node: str, daemon, *, timeout: float) -> None:
    """Until nebula says its interface is active (TUN up, address and MTU set, UDP listening)."""
    deadline = time.monotonic() + timeout
    while ACTIVE not in daemon.log_text():
        if not daemon.alive() or time.monotonic() > deadline:
            what = "exited" if not daemon.alive() else f"did not log {ACTIVE!r} in {timeout:.0f} s"
            raise StartupError(f"nebula on {node} {what} during start-up\n{daemon.log_tail(20)}")
        time.sleep(0.01)
