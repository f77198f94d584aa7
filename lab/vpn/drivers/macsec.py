"""MACsec (IEEE 802.1AE) between the two VPN endpoints: MKA via wpa_supplicant, or static keys.

    mode = "mka"     study A: wpa_supplicant `-D macsec_linux` on the underlay interface, a
                     pre-shared CAK/CKN (fresh per lab, 0600), `macsec_policy=1`,
                     `mka_priority=128`. MKA elects a key server, which distributes the SAK;
                     wpa_supplicant then creates the macsec device (named by the kernel,
                     macsec0) and installs the SAs. start() waits for it, then adds the
                     tunnel addresses.
    mode = "static"  `ip macsec` with static SAKs (one per direction) and explicit SCIs, rendered
                     as an `ip -batch` script (macsec.ip).

MACsec is layer 2: both ends must sit on one L2 segment (a direct link or one switch). On
pi_pair it works; pi_pair_middlebox routes between the ends and is refused (check_topology),
naming a topology that works. The tunnel addresses (10.99.0.1/.2, fd99::1/2) live on the macsec
device; frames on the underlay carry the 802.1AE SecTAG (ethertype 0x88e5), payload encrypted
(GCM-AES-128/256) unless `encrypt = false` (integrity only).

The kernel needs the macsec module (this CI host's kernel has none: `lab up --vm`).
"""

from __future__ import annotations

import json
import secrets as pysecrets
import time
from typing import ClassVar

from lab.core.errors import ConfigError, StartupError
from lab.core.node import Node
from lab.vpn.base import (
    Availability,
    Driver,
    Endpoint,
    Rekey,
    TunnelContext,
    write_secret,
    render_template,
)
from lab.core.tools import IP, PING, Tool
from lab.model.params import Param
from lab.vpn.kernelfeatures import probe_links

STATIC_IFNAME = "macsec0"
WPA_CONF = "wpa_supplicant.conf"
STATIC_FILE = "macsec.ip"
CTRL_DIR = "/run/wpa_supplicant"  # the node's private /run
#: explicit SCIs for static mode (MAC-like 48 bits + port 1): independent of the veths' random MACs
SCI = {"client": "02005e1099010001", "server": "02005e1099020001"}
KEY_ID = {"client": "01", "server": "02"}
KEY_BYTES = {"gcm-aes-128": 16, "gcm-aes-256": 32}


def on_one_segment(spec, client: str, server: str) -> bool:
    """Do the two nodes share an L2 segment (a direct link, or ports of one switch)?"""
    segs = {i.segment for i in spec.nodes[client].interfaces}
    return any(i.segment in segs for i in spec.nodes[server].interfaces)


class MACsecDriver(Driver):
    name = "macsec"
    params: ClassVar[dict[str, Param]] = {
        "mode": Param(
            str,
            "mka",
            "key agreement: mka (wpa_supplicant) or static (ip macsec)",
            choices=("mka", "static"),
        ),
        "cipher": Param(
            str,
            "gcm-aes-128",
            "cipher suite (mka: gcm-aes-128 only here)",
            choices=("gcm-aes-128", "gcm-aes-256"),
        ),
        "encrypt": Param(bool, True, "encrypt (true) or integrity only (false)"),
        "mka_priority": Param(int, 128, "MKA key server priority (lower wins)", min=0, max=255),
        "replay_window": Param(int, 0, "replay protection window (0: off)", min=0, max=2**31 - 1),
        "start_timeout": Param(
            float, 40.0, "seconds to wait for MKA to install the SAs", min=1, max=300
        ),
    }
    secret_markers = ("cak", "client_key", "server_key")
    requires = (IP, PING, Tool("wpa_supplicant", "wpasupplicant", ("wpa_supplicant", "-v")))

    def tools(self, params: dict) -> list[str]:
        return ["ip", "ping"] + (["wpa_supplicant"] if params["mode"] == "mka" else [])

    def validate(self, params: dict, *, source: str) -> None:
        if params["mode"] == "mka" and params["cipher"] != "gcm-aes-128":
            raise ConfigError(
                "MKA mode here supports gcm-aes-128 only (wpa_supplicant's "
                "default cipher suite); use mode=static for gcm-aes-256",
                source=source,
                field="params.cipher",
            )

    def check(self, params: dict, node: Node) -> Availability:
        ok, why = probe_links(
            node, ("link add p type veth peer name q", "link add link p name m type macsec")
        )
        if ok:
            return Availability(True, "kernel")
        return Availability(False, "kernel", f"needs kernel module macsec (ip: {why}); use --vm")

    def check_topology(self, spec, plan) -> None:
        """ConfigError unless the two ends share an L2 segment (called before anything exists)."""
        if not on_one_segment(spec, plan.client.node, plan.server.node):
            raise ConfigError(
                f"MACsec is layer 2: {plan.client.node} and {plan.server.node} must share one L2 "
                "segment, but this topology routes between them; use topologies/pi_pair.py "
                "(impairment then goes on the endpoints' egress: --placement egress)",
                source=spec.source,
            )

    # ------------------------------------------------------------------ secrets / render

    def secrets(self, ctx: TunnelContext, params: dict) -> dict[str, str]:
        if params["mode"] == "mka":
            # CAK: 128-bit (the cipher suite's key length); CKN: 32 bytes, as wpa_supplicant's
            # examples. Both ends share them: that is MKA's pre-shared-key mode.
            cak, ckn = pysecrets.token_hex(16), pysecrets.token_hex(32)
            write_secret(ctx.secrets_dir, "macsec-cak", cak + "\n")
            write_secret(ctx.secrets_dir, "macsec-ckn", ckn + "\n")
            return {"cak": cak, "ckn": ckn}
        n = KEY_BYTES[params["cipher"]]
        out = {}
        for role in ("client", "server"):
            out[f"{role}_key"] = pysecrets.token_hex(n)
            write_secret(ctx.secrets_dir, f"macsec-{role}.key", out[f"{role}_key"] + "\n")
        return out

    def render(self, ctx: TunnelContext, params: dict, secrets: dict[str, str]) -> dict:
        out = {}
        for end in ctx.ends():
            role = "client" if end is ctx.client else "server"
            if params["mode"] == "mka":
                text = render_template(
                    "macsec/wpa_supplicant.conf.j2",
                    node=end.name,
                    role=role,
                    profile=ctx.profile or self.name,
                    ifname=end.underlay_if,
                    ctrl_dir=CTRL_DIR,
                    cak=secrets["cak"],
                    ckn=secrets["ckn"],
                    mka_priority=params["mka_priority"],
                    integ_only=0 if params["encrypt"] else 1,
                    replay_protect=1 if params["replay_window"] else 0,
                    replay_window=params["replay_window"],
                )
                out[end.name] = {WPA_CONF: text}
            else:
                out[end.name] = {STATIC_FILE: self._static_script(ctx, end, role, params, secrets)}
        return out

    def _static_script(self, ctx, end: Endpoint, role: str, params: dict, secrets: dict) -> str:
        peer_role = "server" if role == "client" else "client"
        dev = STATIC_IFNAME
        replay = (
            f" replay on window {params['replay_window']}"
            if params["replay_window"]
            else " replay off"
        )
        lines = [
            f"# lab: MACsec static keys, node {end.name} ({role}), profile {ctx.profile or self.name}",
            f"# apply with: ip -batch {STATIC_FILE}",
            f"link add link {end.underlay_if} name {dev} type macsec sci {SCI[role]} "
            f"cipher {params['cipher']} encrypt {'on' if params['encrypt'] else 'off'}{replay}",
            f"macsec add {dev} tx sa 0 pn 1 on key {KEY_ID[role]} {secrets[f'{role}_key']}",
            f"macsec add {dev} rx sci {SCI[peer_role]} on",
            f"macsec add {dev} rx sci {SCI[peer_role]} sa 0 pn 1 on key {KEY_ID[peer_role]} "
            f"{secrets[f'{peer_role}_key']}",
            f"link set {dev} up",
        ]
        return "\n".join(lines + self._addr_lines(ctx, end, dev)) + "\n"

    @staticmethod
    def _addr_lines(ctx: TunnelContext, end: Endpoint, dev: str) -> list[str]:
        peer = ctx.peer(end)
        lines = [f"addr add {end.tunnel_v4} dev {dev}"]
        if end.tunnel_v6:
            lines.append(f"addr add {end.tunnel_v6} dev {dev} nodad")
        for net in peer.behind:  # an Ethernet link: behind networks via the peer's address
            via = (peer.tunnel_v6 if ":" in net else peer.tunnel_v4).split("/")[0]
            lines.append(f"route replace {net} via {via} dev {dev}")
        return lines

    # ------------------------------------------------------------------ start

    def start(self, ctx: TunnelContext, params: dict, rendered: dict) -> None:
        for end in ctx.ends():
            self._require_l2(ctx, end)
        if params["mode"] == "static":
            for end in ctx.ends():
                path = ctx.write_config(end, rendered[end.name])[STATIC_FILE]
                self._batch(end, [f"# {path}"], path=str(path))
            return
        for end in ctx.ends():
            conf = ctx.write_config(end, rendered[end.name])[WPA_CONF]
            end.node.run(["mkdir", "-p", "-m", "0700", CTRL_DIR])
            ctx.daemons.append(
                end.node.spawn(
                    "wpa_supplicant",
                    [
                        "wpa_supplicant",
                        "-i",
                        end.underlay_if,
                        "-D",
                        "macsec_linux",
                        "-c",
                        str(conf),
                        "-t",
                    ],
                )
            )
        deadline = time.monotonic() + params["start_timeout"]
        devs = {end.name: self._wait_macsec_dev(ctx, end, deadline) for end in ctx.ends()}
        for end in ctx.ends():
            self._batch(
                end, [f"link set {devs[end.name]} up", *self._addr_lines(ctx, end, devs[end.name])]
            )

    @staticmethod
    def _require_l2(ctx: TunnelContext, end: Endpoint) -> None:
        # last line of defence when check_topology was not called (lab.up from Python):
        # the peer must be on-link, not behind a gateway
        peer = ctx.peer(end)
        route = json.loads(end.node.run(["ip", "-j", "route", "get", peer.underlay_v4]).stdout)[0]
        if "gateway" in route or route.get("dev") != end.underlay_if:
            raise ConfigError(
                f"MACsec is layer 2: {end.name} reaches {peer.name} through a router "
                f"({route.get('gateway')}), not on one segment; use topologies/pi_pair.py",
                source=ctx.profile or "macsec",
            )

    @staticmethod
    def _batch(end: Endpoint, lines: list[str], path: str | None = None) -> None:
        argv = ["ip", "-batch", path or "-"]
        cp = end.node.run(argv, check=False, input=None if path else "\n".join(lines) + "\n")
        if cp.returncode != 0:
            raise StartupError(
                f"MACsec on {end.name}: `ip -batch {path or '-'}` failed: "
                f"{cp.stderr.strip()[-400:]}"
            )

    @staticmethod
    def _macsec_devs(end: Endpoint) -> list[dict]:
        out = end.node.run(["ip", "-j", "-d", "link", "show", "type", "macsec"], check=False).stdout
        return json.loads(out or "[]")

    def _wait_macsec_dev(self, ctx: TunnelContext, end: Endpoint, deadline: float) -> str:
        """Until MKA has created the macsec device on top of the underlay interface with a
        transmit SA in use (wpa_supplicant does this once the key server distributed a SAK)."""
        daemon = next(d for d in ctx.daemons if d.node == end.name)
        while True:
            for link in self._macsec_devs(end):
                if link.get("link") == end.underlay_if:
                    sa = end.node.run(["ip", "macsec", "show", link["ifname"]], check=False).stdout
                    if "TXSC" in sa and ": PN" in sa and "state on" in sa:
                        return link["ifname"]
            if not daemon.alive():
                raise StartupError(
                    f"wpa_supplicant on {end.name} exited during MKA\n" + daemon.log_tail(25)
                )
            if time.monotonic() > deadline:
                raise StartupError(
                    f"MKA on {end.name}: no macsec device with an active SA "
                    f"within the start timeout\n" + daemon.log_tail(25)
                )
            time.sleep(0.2)

    # ------------------------------------------------------------------ describe / stop

    def rekey_support(self, params: dict) -> Rekey:
        if params["mode"] == "static":
            return Rekey(False, "static MACsec keys (ip macsec): no key agreement to renew")
        return Rekey(
            False,
            "MKA (wpa_supplicant) distributes a new SAK on its own schedule; the lab has no "
            "command wired to force one",
        )

    def describe(self, ctx: TunnelContext, params: dict) -> dict:
        node = ctx.client.node
        dev = next(
            (
                x["ifname"]
                for x in self._macsec_devs(ctx.client)
                if x.get("link") == ctx.client.underlay_if
            ),
            None,
        )
        if dev is None:
            raise StartupError(f"no macsec device on {ctx.client.name}")
        link = json.loads(node.run(["ip", "-j", "-d", "link", "show", "dev", dev]).stdout)[0]
        info = (link.get("linkinfo") or {}).get("info_data") or {}
        out = {
            "implementation": "kernel MACsec"
            + (" + wpa_supplicant MKA" if params["mode"] == "mka" else " (static keys)"),
            "version": "kernel " + node.run(["uname", "-r"]).stdout.strip(),
            "path": "kernel",
            "cipher": str(info.get("cipher_suite", params["cipher"])).lower(),
            "encrypt": info.get("encrypt", params["encrypt"]),
            "interface": dev,
            "underlay_interface": ctx.client.underlay_if,
            "mtu": int(link["mtu"]),
            "sci": info.get("sci"),
            "mode": params["mode"],
        }
        if params["mode"] == "mka":
            out["wpa_supplicant"] = (
                node.run(["wpa_supplicant", "-v"], check=False).stdout.splitlines()[0].strip()
            )
            out["mka_priority"] = params["mka_priority"]
        return out

    def stop(self, ctx: TunnelContext, params: dict) -> None:
        super().stop(ctx, params)  # wpa_supplicant removes the device it created on SIGTERM
        for end in ctx.ends():
            for link in self._macsec_devs(end):
                if link.get("link") == end.underlay_if:
                    end.node.run(["ip", "link", "del", link["ifname"]], check=False)
