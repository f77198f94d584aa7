"""L2TP/IPsec (study D): PPP over L2TPv2 (xl2tpd + pppd) on UDP 1701, which strongSwan protects
with ESP in transport mode (IKEv1 main mode, pre-shared key): what Windows, macOS, iOS and
Android offer built in and what a stock L2TP/IPsec server runs.

Composed from the two drivers it stacks, not copied: lab/vpn/charon.py renders and runs one
charon per end (here `version = 1`, `mode = transport`, traffic selectors = the two underlay
addresses, UDP port 1701 only), then lab/vpn/drivers/l2tp.py's L2TPDriver brings up xl2tpd + pppd over
the ESP-protected UDP 1701 and hands out the tunnel addresses on ppp0 (IPCP; fd99::/64 added
after IPV6CP), exactly as the plain `l2tp` profile does. So the wire carries IKE (UDP 500) and
ESP only: no L2TP or PPP in clear.

Kernel only: ESP transport mode has no userspace path here (charon's kernel-libipsec does tunnel
mode only), and L2TP/PPP need l2tp_ppp + ppp_generic. check() names every missing module; on this
development host that is all three (use --vm). See docs/l2tp-ipsec.md.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from lab.core.errors import TeardownIncomplete
from lab.core.node import Node
from lab.vpn import charon, charonkernel
from lab.vpn.drivers import l2tp
from lab.vpn.base import Availability, Driver, Endpoint, Rekey, TunnelContext
from lab.model.params import Param
from lab.vpn.kernelfeatures import missing_features
from lab.vpn.drivers.strongswan import StrongSwanDriver

#: kernel features: (what, /proc/config.gz symbols, modules); IPv6 rides inside PPP, so the
#: underlay needs IPv4 ESP only
ESP = ("ESP", ("CONFIG_INET_ESP",), ("esp4",))
IKE_KEYS = (
    "ike_proposals",
    "esp_proposals",
    "dpd_delay",
    "dpd_timeout",
    "dpd_action",
    "ike_rekey_time",
    "child_rekey_time",
    "crypto_plugins",
)
L2TP_KEYS = (
    "port",
    "mtu",
    "mru",
    "ipv6",
    "compression",
    "vj",
    "lcp_echo_interval",
    "lcp_echo_failure",
)
#: the proposal lists L2TP/IPsec server guides configure so that the built-in IKEv1 clients
#: connect (AES-CBC or 3DES with SHA-1, MODP-2048 or MODP-1024); docs/l2tp-ipsec.md
IKE_DEFAULT = "aes256-sha1-modp2048,aes128-sha1-modp2048,aes256-sha1-modp1024,3des-sha1-modp1024"
ESP_DEFAULT = "aes256-sha1,aes128-sha1,3des-sha1"


def _params() -> dict[str, Param]:
    sw, lt = StrongSwanDriver.params, l2tp.L2TPDriver.params
    out = {k: sw[k] for k in IKE_KEYS}
    out["ike_proposals"] = dataclasses.replace(
        sw["ike_proposals"], default=IKE_DEFAULT, doc="IKEv1 main-mode proposals, swanctl syntax"
    )
    out["esp_proposals"] = dataclasses.replace(
        sw["esp_proposals"], default=ESP_DEFAULT, doc="ESP (transport mode) proposals"
    )
    out["dpd_timeout"] = dataclasses.replace(
        sw["dpd_timeout"], doc="seconds until an unresponsive peer is declared dead (IKEv1)"
    )
    out.update({k: lt[k] for k in L2TP_KEYS})
    out["start_timeout"] = Param(
        float, 60.0, "seconds for the IKE SA, then again for the PPP session", min=1, max=600
    )
    return out


class L2TPIPsecDriver(Driver):
    name = "l2tp-ipsec"
    params: ClassVar[dict[str, Param]] = _params()
    secret_markers = ("psk", "chap_secret")
    requires = tuple(
        dict.fromkeys([*StrongSwanDriver.requires, *l2tp.L2TPDriver.requires])
    )  # once each
    packages = StrongSwanDriver.packages

    def __init__(self) -> None:
        self._l2tp = l2tp.L2TPDriver()

    def rekey_support(self, params: dict) -> Rekey:
        return Rekey(True, "swanctl --rekey --child: a new ESP transport-mode CHILD_SA (IKEv1)")

    def trigger_rekey(self, ctx: TunnelContext, params: dict, *, timeout: float) -> dict:
        return charon.rekey(ctx, timeout=timeout)

    def validate(self, params: dict, *, source: str = "") -> None:
        charon.validate_proposals(params, source=source)

    def check(self, params: dict, node: Node) -> Availability:
        _, missing = charon.missing_plugins(node, params["crypto_plugins"])
        if missing:
            return Availability(False, "kernel", "missing " + ", ".join(missing))
        lacks = [
            f"{what} ({sym[0]}, module {mod[0]})"
            for what, sym, mod in missing_features(node, [ESP, l2tp.PPP, l2tp.L2TP])
        ]
        if lacks:
            return Availability(
                False,
                "kernel",
                f"needs kernel {' and '.join(lacks)}, which this kernel lacks; use --vm",
            )
        return Availability(True, "kernel")

    # ---------------------------------------------------------------- secrets and configs
    def secrets(self, ctx: TunnelContext, params: dict) -> dict[str, str]:
        return {"psk": charon.new_psk(ctx), **self._l2tp.secrets(ctx, l2tp_params(params))}

    def render(self, ctx: TunnelContext, params: dict, secrets: dict[str, str]) -> dict:
        files = self._l2tp.render(ctx, l2tp_params(params), secrets)
        ike = charon.render_configs(
            ctx,
            ike_params(params),
            secrets["psk"],
            "kernel",
            selectors=lambda end: transport_selectors(end, params["port"]),
            version=1,
            mode="transport",
        )
        return {node: {**ike[node], **files[node]} for node in files}

    # ---------------------------------------------------------------- running
    def start(self, ctx: TunnelContext, params: dict, rendered: dict) -> None:
        """IPsec first (the CHILD_SA's policies cover UDP 1701 before xl2tpd sends a packet),
        then L2TP + PPP as the l2tp driver brings them up."""
        for end in ctx.ends():
            charonkernel.probe_kernel_esp(end, params["esp_proposals"], mode="transport")
            ctx.write_config(end, rendered[end.name])
        charon.start(ctx, params["start_timeout"])
        self._l2tp.start(ctx, l2tp_params(params), rendered)

    def describe(self, ctx: TunnelContext, params: dict) -> dict:
        d = self._l2tp.describe(ctx, l2tp_params(params))
        ike, child = charon.sa(ctx, ctx.client)
        version = charon.version(ctx, ctx.client)
        algs = charon.algorithms(ctx, ctx.client)
        esp = charon.fmt_alg(child)
        if esp and child.get("integ-alg"):
            esp = f"{esp}/{child['integ-alg']}"
        d.update(
            implementation="xl2tpd + pppd over strongSwan (IKEv1, ESP transport mode)",
            version=f"{d['version']}, strongSwan {version}",
            versions={**d["versions"], "strongswan": version},
            cipher=esp,
            ipsec={
                "ike": {
                    "version": ike.get("version"),
                    "encryption": charon.fmt_alg(ike),
                    "integrity": ike.get("integ-alg"),
                    "prf": ike.get("prf-alg"),
                    "dh_group": ike.get("dh-group"),
                    "proposals": params["ike_proposals"],
                },
                "esp": {
                    "encryption": charon.fmt_alg(child),
                    "integrity": child.get("integ-alg"),
                    "mode": child.get("mode"),
                    "udp_encap": child.get("encap") == "yes",
                    "local_ts": child.get("local-ts"),
                    "remote_ts": child.get("remote-ts"),
                    "proposals": params["esp_proposals"],
                },
                "auth": "PSK (per lab)",
                "crypto_providers": {
                    a: charon.provider(algs, a) for a in charon.negotiated(ike, child)
                },
                "plugins": charon.plugin_list("kernel", params["crypto_plugins"]),
            },
            kernel_modules=["esp4", *d["kernel_modules"]],
        )
        return d

    def stop(self, ctx: TunnelContext, params: dict) -> None:
        """L2TP + PPP first (the l2tp driver's stop), then the IKE SA and charon, and whatever a
        killed charon leaves between the two underlay addresses. Raises TeardownIncomplete
        listing what remains of either."""
        left: list[str] = []
        try:
            self._l2tp.stop(ctx, l2tp_params(params))
        except TeardownIncomplete as e:
            left += e.leftovers
        charon.stop(ctx)
        for end in ctx.ends():
            peer = ctx.peer(end)
            left += charonkernel.cleanup(
                end, peer, [f"{end.underlay_v4}/32"], [f"{peer.underlay_v4}/32"]
            )
        if left:
            raise TeardownIncomplete(left)


def l2tp_params(params: dict) -> dict:
    """The l2tp driver's parameters: ours, on its kernel data plane."""
    return {
        **{k: params[k] for k in L2TP_KEYS},
        "dataplane": "kernel",
        "start_timeout": params["start_timeout"],
    }


def ike_params(params: dict) -> dict:
    """What charon.render_configs reads: ours, plus the tunnel-mode knobs that do not apply."""
    return {**{k: params[k] for k in IKE_KEYS}, "encap": False, "mtu": params["mtu"]}


def transport_selectors(end: Endpoint, port: int) -> list[str]:
    """The end's underlay address, L2TP's UDP port only (swanctl: `10.0.1.2/32[udp/1701]`)."""
    return [f"{end.underlay_v4}/32[udp/{port}]"]
