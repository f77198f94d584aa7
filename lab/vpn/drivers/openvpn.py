"""OpenVPN 2.x point-to-point over a TUN device: static-key mode (studies A, B) or TLS (study D).

One config file per node with every key inline (<secret>, <ca>/<cert>/<key>), so the rendered
file is exactly what is copied to a board. Static keys are 2048 random bits in OpenVPN's own
format; the TLS CA and certificates are made per lab with openssl on the controller.

The data plane is always OpenVPN's userspace one here (`disable-dco`: this kernel has no
ovpn-dco, and the studies' OpenVPN 2.5 had none either).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import time
from pathlib import Path
from typing import ClassVar

from lab.core import proc
from lab.core.errors import ConfigError, StartupError
from lab.core.node import Node
from lab.model.boardkernel import DataPlaneCpu
from lab.vpn.base import (
    Availability,
    Driver,
    Rekey,
    TunnelContext,
    make_secrets,
    route_through,
    write_secret,
    render_template,
)
from lab.core.tools import IP, Tool
from lab.model.params import Param
from lab.vpn import userconfig
from lab.vpn.kernelfeatures import has_char_device

IFNAME = "tun0"
CBC_CIPHERS = ("AES-256-CBC", "AES-128-CBC", "BF-CBC")
AEAD_CIPHERS = ("AES-256-GCM", "AES-128-GCM", "CHACHA20-POLY1305")
#: the socket is ready: UDP bound (both ends), TCP server listening, TCP client connected
#: (a tcp-client logs "link local: (not bound)", so "bound" alone never matched it)
READY_LOG = (
    "link local (bound)",
    "Listening for incoming TCP connection",
    "TCP connection established",
)
#: the client's log line once a (re)negotiated session carries data
SESSION_UP = "Initialization Sequence Completed"
OPENSSL_CNF = """\
[req]
distinguished_name = dn
prompt = no
[dn]
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = CA:FALSE
keyUsage = critical,digitalSignature,keyAgreement,keyEncipherment
extendedKeyUsage = serverAuth
[client]
basicConstraints = CA:FALSE
keyUsage = critical,digitalSignature,keyAgreement,keyEncipherment
extendedKeyUsage = clientAuth
"""


def static_key() -> str:
    """A 2048-bit key in the format of `openvpn --genkey secret`."""
    hexed = os.urandom(256).hex()
    lines = [hexed[i : i + 32] for i in range(0, len(hexed), 32)]
    return "\n".join(
        ["#", "# 2048 bit OpenVPN static key", "#", "-----BEGIN OpenVPN Static key V1-----"]
        + lines
        + ["-----END OpenVPN Static key V1-----"]
    )


class OpenVPNDriver(Driver):
    name = "openvpn"
    params: ClassVar[dict[str, Param]] = {
        "mode": Param(
            str, "static", "static key (p2p, no TLS) or tls (per-lab CA)", choices=("static", "tls")
        ),
        "cipher": Param(
            str,
            "AES-256-CBC",
            "data-channel cipher (tls: the one data-ciphers entry)",
            choices=(*CBC_CIPHERS, *AEAD_CIPHERS, "none"),
        ),
        "auth": Param(
            str,
            "SHA1",
            "HMAC digest of non-AEAD ciphers",
            choices=("SHA1", "SHA256", "SHA512", "none"),
        ),
        "proto": Param(str, "udp", "transport", choices=("udp", "tcp")),
        "port": Param(int, 1194, "port on both ends", min=1, max=65535),
        "mtu": Param(int, 1500, "tun-mtu", min=576, max=9000),
        "keepalive_interval": Param(int, 10, "keepalive: ping every N s", min=1, max=3600),
        "keepalive_timeout": Param(
            int, 120, "keepalive: restart after N s silent", min=2, max=7200
        ),
        "key": Param(str, "ec-p256", "tls: certificate key type", choices=("ec-p256", "rsa-2048")),
    }
    secret_markers = ("static_key", "ca_key", "server_key", "client_key")
    requires = (
        Tool("openvpn", "openvpn", ("openvpn", "--version"), board=True),
        IP,
        # on the controller (tls: the per-lab CA and certificates)
        Tool("openssl", "openssl", ("openssl", "version"), board=True),
    )

    def tools(self, params: dict) -> list[str]:
        return ["openvpn", "ip"] + (["openssl"] if params["mode"] == "tls" else [])

    def validate(self, params: dict, *, source: str) -> None:
        cipher, mode = params["cipher"], params["mode"]
        if mode == "static" and cipher in AEAD_CIPHERS:
            raise ConfigError(
                f'{cipher} needs TLS (mode = "tls"); static-key mode accepts '
                f"{', '.join((*CBC_CIPHERS, 'none'))}",
                source=source,
                field="params.cipher",
            )
        if mode == "tls" and cipher == "none":
            raise ConfigError(
                'cipher none is static-key only here; with mode = "tls" use one of '
                + ", ".join((*AEAD_CIPHERS, *CBC_CIPHERS)),
                source=source,
                field="params.cipher",
            )
        if params["keepalive_timeout"] < 2 * params["keepalive_interval"]:
            raise ConfigError(
                "must be at least twice keepalive_interval",
                source=source,
                field="params.keepalive_timeout",
            )

    def check(self, params: dict, node: Node) -> Availability:
        if not has_char_device(node, "/dev/net/tun"):
            return Availability(False, "userspace", "/dev/net/tun missing")
        return Availability(True, "userspace")

    # ---------------------------------------------------------------- secrets and configs
    def secrets(self, ctx: TunnelContext, params: dict) -> dict[str, str]:
        if ctx.configs:  # the user's files (docs/byoc.md): a per-lab PKI, a tls-crypt/-auth key
            # and DH parameters (RFC 7919's ffdhe2048 group: public, nothing to generate)
            key = static_key()
            write_secret(ctx.secrets_dir, "openvpn-tls.key", key + "\n")
            dh = proc.run(
                ["openssl", "genpkey", "-genparam", "-algorithm", "DH"]
                + ["-pkeyopt", "group:ffdhe2048"],
                where="controller",
            ).stdout.strip()
            return {**self._pki(ctx, params), "static_key": key, "dh": dh}
        if params["mode"] == "static":
            key = static_key()
            write_secret(ctx.secrets_dir, "openvpn-static.key", key + "\n")
            return {"static_key": key}
        return self._pki(ctx, params)

    def _pki(self, ctx: TunnelContext, params: dict) -> dict[str, str]:
        """A per-lab CA and a certificate + key for each end, by openssl on the controller."""
        newkey = (
            ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
            if params["key"] == "ec-p256"
            else ["-newkey", "rsa:2048"]
        )
        roles = ("ca", "server", "client")

        def make(t: Path) -> None:
            cnf = t / "openssl.cnf"
            cnf.write_text(OPENSSL_CNF)
            for name, cn in zip(
                roles, (f"lab-{ctx.lab_id}-ca", ctx.server.name, ctx.client.name), strict=True
            ):
                argv = [
                    "openssl",
                    "req",
                    "-x509",
                    "-config",
                    cnf,
                    "-extensions",
                    name,
                    *newkey,
                    "-nodes",
                    "-days",
                    "30",
                    "-subj",
                    f"/CN={cn}",
                    "-keyout",
                    t / f"{name}.key",
                    "-out",
                    t / f"{name}.crt",
                ]
                if name != "ca":
                    argv += ["-CA", t / "ca.crt", "-CAkey", t / "ca.key"]
                proc.run(argv, where="controller")

        names = [f"{name}.{x}" for name in roles for x in ("key", "crt")]
        made = make_secrets(ctx.secrets_dir, "openvpn-", names, make)
        out: dict[str, str] = {}
        for name in roles:
            out[f"{name}_key"] = made[f"{name}.key"].strip()
            out[f"{name}_cert"] = made[f"{name}.crt"].strip()
        return out

    def render(self, ctx: TunnelContext, params: dict, secrets: dict[str, str]) -> dict:
        if ctx.configs:
            return userconfig.render(ctx, self.name, self._user_values(ctx, params, secrets))
        rendered = {}
        for role, end in (("client", ctx.client), ("server", ctx.server)):
            peer = ctx.peer(end)
            v4 = ipaddress.ip_interface(end.tunnel_v4)
            proto = params["proto"]
            if proto == "tcp":
                proto = "tcp-server" if role == "server" else "tcp-client"
            else:
                proto = "udp4"
            values = {
                "node": end.name,
                "role": role,
                "profile": ctx.profile or self.name,
                "ifname": IFNAME,
                "proto": proto,
                "port": params["port"],
                "remote": peer.underlay_v4,
                "local_v4": str(v4.ip),
                "netmask_v4": str(v4.netmask),
                "local_v6": end.tunnel_v6,
                "remote_v6": peer.tunnel_v6.split("/")[0],
                "mtu": params["mtu"],
                "keepalive_interval": params["keepalive_interval"],
                "keepalive_timeout": params["keepalive_timeout"],
                "mode": "tls" if ctx.configs else params["mode"],
                "cipher": params["cipher"],
                "auth": params["auth"],
            }
            if params["mode"] == "static":
                # direction 0 on the server, 1 on the client: each way uses its own HMAC/cipher keys
                values.update(
                    key_direction=0 if role == "server" else 1, static_key=secrets["static_key"]
                )
            else:
                values.update(
                    ca_cert=secrets["ca_cert"],
                    cert=secrets[f"{role}_cert"],
                    key=secrets[f"{role}_key"],
                )
            rendered[end.name] = {
                "openvpn.conf": render_template("openvpn/openvpn.conf.j2", **values)
            }
        return rendered

    @staticmethod
    def _user_values(ctx: TunnelContext, params: dict, secrets: dict[str, str]):
        """values_of(end, role) for the user's files: inline PEM values, and for the *_file
        placeholders the file names written beside the config (openvpn runs with --cd there)."""

        def values_of(end, role):
            inline = {
                "ifname": IFNAME,
                "port": params["port"],
                "remote": ctx.peer(end).underlay_v4,
                "ca_cert": secrets["ca_cert"],
                "cert": secrets[f"{role}_cert"],
                "key": secrets[f"{role}_key"],
                "tls_crypt_key": secrets["static_key"],
                "tls_auth_key": secrets["static_key"],
                "dh": secrets["dh"],
            }
            files, names = {}, {}
            for ph, (fname, secret) in userconfig.OPENVPN_FILES.items():
                names[ph] = fname
                if ph in userconfig.config_of(ctx, end).names:
                    files[fname] = secrets[secret.format(role=role)] + "\n"
            return {**inline, **names}, files

        return values_of

    # ---------------------------------------------------------------- running
    def start(self, ctx: TunnelContext, params: dict, rendered: dict) -> None:
        # server first, and only once its socket is bound: the client's first packets (the TLS
        # handshake) are then not lost to an ICMP port-unreachable and a retransmit timer
        for end in (ctx.server, ctx.client):
            conf = ctx.write_config(end, rendered[end.name])["openvpn.conf"]
            argv = ["openvpn", "--config", str(conf)]
            ready = READY_LOG
            if ctx.configs:  # the user's file names its key files relative to its directory
                argv = ["openvpn", "--cd", str(conf.parent), "--config", conf.name]
                self._check_user(ctx, end, argv, rendered[end.name]["openvpn.conf"])
                ready = (*READY_LOG, "link remote:")  # a `nobind` client binds nothing
            d = end.node.spawn("openvpn", argv)
            ctx.daemons.append(d)
            self._wait_log(end.name, d, ready, timeout=5.0)
        if ctx.configs:
            self._wait_client_address(ctx)
        for end in ctx.ends():
            if ctx.peer(end).behind:
                self._wait_configured(ctx, end)
                route_through(end, ctx.peer(end), IFNAME)

    @staticmethod
    def _check_user(ctx: TunnelContext, end, argv: list[str], rendered: str) -> None:
        """OpenVPN's own option checker on the user's rendered file (userconfig.OPENVPN_PARSED)."""
        cp = end.node.run([*argv, "--test-crypto", "--verb", "1"], check=False, timeout=30)
        out = cp.stdout + cp.stderr
        if userconfig.OPENVPN_PARSED not in out:
            raise userconfig.openvpn_error(userconfig.config_of(ctx, end), rendered, out)

    @staticmethod
    def _wait_client_address(ctx: TunnelContext, timeout: float = 15.0) -> None:
        """The address the server pushed to the client (topology net30 or subnet): recorded."""
        deadline = time.monotonic() + timeout
        while True:
            cp = ctx.client.node.run(["ip", "-j", "-4", "addr", "show", "dev", IFNAME], check=False)
            infos = [a for i in json.loads(cp.stdout or "[]") for a in i.get("addr_info", [])]
            if cp.returncode == 0 and infos:
                ctx.client.tunnel_v4 = f"{infos[0]['local']}/{infos[0]['prefixlen']}"
                return
            dead = [d for d in ctx.daemons if not d.alive()]
            if dead or time.monotonic() > deadline:
                tail = dead[0].log_tail(20) if dead else ""
                raise StartupError(f"openvpn: {IFNAME} on {ctx.client.name} got no address\n{tail}")
            time.sleep(0.02)

    @staticmethod
    def _wait_configured(ctx: TunnelContext, end, timeout: float = 15.0) -> None:
        """Until OpenVPN has opened and addressed the TUN device (routes need it up)."""
        want = end.tunnel_v4.split("/")[0]
        deadline = time.monotonic() + timeout
        while True:
            cp = end.node.run(["ip", "-j", "-4", "addr", "show", "dev", IFNAME], check=False)
            if cp.returncode == 0 and want in cp.stdout:
                return
            dead = [d for d in ctx.daemons if not d.alive()]
            if dead or time.monotonic() > deadline:
                tail = dead[0].log_tail(20) if dead else ""
                raise StartupError(f"openvpn on {end.name}: {IFNAME} never got {want}\n{tail}")
            time.sleep(0.02)

    @staticmethod
    def _wait_log(node: str, daemon, needles: tuple[str, ...], *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            text = daemon.log_text()
            if any(n in text for n in needles):
                return
            if not daemon.alive() or time.monotonic() > deadline:
                what = "exited" if not daemon.alive() else f"not ready after {timeout:.0f} s"
                raise StartupError(
                    f"openvpn on {node} {what} during start-up\n{daemon.log_tail(20)}"
                )
            time.sleep(0.01)

    # ---------------------------------------------------------------- rekey
    def rekey_support(self, params: dict) -> Rekey:
        if params["mode"] == "static":
            return Rekey(False, 'static-key mode has no key exchange (mode = "tls" has one)')
        return Rekey(
            True,
            "SIGUSR1 to the client's openvpn: a soft restart with a new TLS session and new "
            "data-channel keys, the TUN device reopened (OpenVPN 2 has no command that "
            "renegotiates in place; reneg-sec only sets the timer)",
        )

    def trigger_rekey(self, ctx: TunnelContext, params: dict, *, timeout: float) -> dict:
        d = next((d for d in ctx.daemons if d.node == ctx.client.name), None)
        if d is None or not d.alive():
            raise StartupError(f"openvpn on {ctx.client.name} is not running")
        before = d.log_text().count(SESSION_UP)
        t0 = time.monotonic()
        # kill is the shell's builtin: no tool beyond the node's sh
        ctx.client.node.run(["sh", "-c", 'kill -USR1 "$1"', "sh", str(d.pid)])
        deadline = t0 + timeout
        while d.log_text().count(SESSION_UP) <= before:
            if not d.alive() or time.monotonic() > deadline:
                what = "exited" if not d.alive() else f"not up again after {timeout:.0f} s"
                raise StartupError(
                    f"openvpn on {ctx.client.name} {what} after SIGUSR1\n{d.log_tail(20)}"
                )
            time.sleep(0.02)
        seconds = round(time.monotonic() - t0, 3)
        for end in ctx.ends():  # a reopened TUN device lost the routes through it
            if ctx.peer(end).behind:
                route_through(end, ctx.peer(end), IFNAME)
        return {
            "how": f"SIGUSR1 to openvpn (pid {d.pid}) on {ctx.client.name}",
            "before": f"{before} TLS session(s) completed",
            "after": f"{before + 1} TLS session(s) completed",
            "seconds": seconds,
        }

    def cpu_dataplane(self, params: dict, path: str) -> DataPlaneCpu | None:
        # OpenVPN 2.x encrypts on one thread, on the board as here
        cipher = params["cipher"].lower()
        return DataPlaneCpu(
            daemon="openvpn",
            primitive=cipher
            if cipher
            in ("aes-256-cbc", "aes-128-cbc", "aes-256-gcm", "aes-128-gcm", "chacha20-poly1305")
            else None,
            board="userspace",
            threads="one",
            what="OpenVPN's data channel (userspace, OpenSSL, one thread)",
        )

    def describe(self, ctx: TunnelContext, params: dict) -> dict:
        node = ctx.client.node
        lines = node.run(["openvpn", "--version"], check=False).stdout.splitlines()
        link = json.loads(node.run(["ip", "-j", "link", "show", "dev", IFNAME]).stdout)[0]
        negotiated = None
        for d in ctx.daemons:
            if d.node == ctx.client.name and d.log:
                # the data channel line follows "Initialization Sequence Completed", which may
                # come a moment after the first packet passed
                try:
                    self._wait_log(d.node, d, ("Data Channel: cipher",), timeout=2.0)
                except StartupError:
                    pass
                m = re.findall(r"Data Channel: cipher '([^']+)'(?:, auth '([^']+)')?", d.log_text())
                if m:
                    negotiated = {"cipher": m[-1][0], "auth": m[-1][1] or None}
        cipher = params["cipher"] if params["cipher"] != "none" else "none"
        if ctx.configs:  # the user's files chose it: what the data channel negotiated
            cipher = (negotiated or {}).get("cipher")
        return {
            "implementation": "OpenVPN",
            "version": lines[0].split()[1] if lines else None,
            "library": lines[1].strip() if len(lines) > 1 else None,
            "path": "userspace",
            "mode": "tls" if ctx.configs else params["mode"],
            "cipher": cipher,
            "auth": params["auth"] if params["cipher"] not in AEAD_CIPHERS else "AEAD",
            "negotiated": negotiated,
            "proto": params["proto"],
            "interface": IFNAME,
            "mtu": int(link["mtu"]),
        }
