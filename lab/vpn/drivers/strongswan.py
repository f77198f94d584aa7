"""strongSwan driver: IKEv2 with a pre-shared key, tunnel mode, configured by swanctl.conf + vici.

Each end runs its own charon, started directly (/usr/lib/ipsec/charon, no starter, no systemd)
with STRONGSWAN_CONF pointing at the rendered strongswan.conf, so that the plugin list, the vici
socket and the logging are ours and nothing from /etc/strongswan.d is loaded. The pid file
(/run/charon.pid, compiled in) and the vici socket live under the node's private /run.
swanctl loads the rendered swanctl.conf over vici and the client initiates.

Data plane (decided by check() on the node, recorded in the rendered strongswan.conf and in
describe()):
  kernel          kernel XFRM (CONFIG_INET_ESP); charon's kernel-netlink installs SAs/policies
  kernel-libipsec userspace ESP in charon (libcharon-extra-plugins) over the TUN device ipsec0,
                  always UDP-encapsulated (port 4500); used when the kernel has no ESP
Crypto comes from the openssl plugin so that a CPU profile's OPENSSL_ia32cap applies to IKE and,
with kernel-libipsec, to ESP too; describe() records which plugin provides each negotiated
algorithm.

Tunnel addresses are host addresses (/32, /128) on `lo`: an address with a shorter prefix on lo
would make the whole prefix local (the peer's address included). The CHILD_SA's traffic
selectors are those host addresses plus the networks behind each end; charon routes the peer's
selectors through table 220 with our tunnel address as source. See docs/ipsec.md.

The charon plumbing (render, start, vici, stop, cleanup) is lab/vpn/charon.py, shared with the
l2tp-ipsec driver; this module adds tunnel mode: addresses, selectors, data-plane choice.
"""

from __future__ import annotations

import json
import re
from typing import ClassVar

from lab.core.errors import StartupError, TeardownIncomplete
from lab.core.node import Node
from lab.vpn import charon, charonkernel, userconfig
from lab.model.boardkernel import DataPlaneCpu
from lab.vpn.base import Availability, Driver, Endpoint, Rekey, TunnelContext, config_hash
from lab.core.tools import IP, PING
from lab.model.params import Param
from lab.vpn.charon import (
    LIBIPSEC_TUN,
    RETRANSMIT_BASE,
    RETRANSMIT_TRIES,
    dataplane_of,
    plugin_list,
    retransmit_timeout_for,
)
from lab.vpn.charon import fmt_alg as _fmt_alg
from lab.vpn.charon import host as _host
from lab.vpn.charon import provider as _provider
from lab.vpn.charonkernel import esp_overhead, kernel_esp, probe_kernel_esp
from lab.vpn.kernelfeatures import KernelFacts, kernel_facts

# ------------------------------------------------------------------------ the driver


class StrongSwanDriver(Driver):
    name = "strongswan"
    has_tunnel = True
    secret_markers = ("psk",)
    params: ClassVar[dict[str, Param]] = {
        "ike_proposals": Param(
            str,
            "aes256gcm16-prfsha384-x25519",
            "IKE proposals, swanctl syntax (ipsec.conf ike= without the trailing '!')",
        ),
        "esp_proposals": Param(
            str,
            "aes256gcm16-x25519",
            "ESP proposals, swanctl syntax (a PRF token is accepted and ignored; a DH group "
            "means PFS on CHILD_SA rekeying)",
        ),
        "dpd_delay": Param(int, 30, "seconds without traffic before a DPD check", min=0, max=3600),
        "dpd_timeout": Param(
            int,
            120,
            "seconds until an unresponsive peer is declared dead (IKEv2: mapped to "
            "the retransmission schedule)",
            min=5,
            max=3600,
        ),
        "ike_rekey_time": Param(int, 28800, "IKE_SA rekey_time (s)", min=60, max=604800),
        "child_rekey_time": Param(int, 3600, "CHILD_SA rekey_time (s)", min=60, max=604800),
        "dpd_action": Param(
            str,
            "restart",
            "initiator's action when DPD declares the peer dead (responder: clear)",
            choices=("clear", "trap", "restart"),
        ),
        "dataplane": Param(
            str,
            "auto",
            "ESP data plane: kernel XFRM, kernel-libipsec (userspace over TUN), or "
            "auto (kernel when it has ESP)",
            choices=("auto", "kernel", "libipsec"),
        ),
        "mtu": Param(int, 1400, "MTU of the kernel-libipsec TUN device ipsec0", min=1280, max=9000),
        "encap": Param(
            bool, False, "force UDP encapsulation on the kernel path (libipsec: always)"
        ),
        "crypto_plugins": Param(
            str,
            "openssl kdf",
            "charon crypto plugins, in priority order (openssl: CPU masks "
            "via OPENSSL_ia32cap apply)",
        ),
        "start_timeout": Param(
            float, 15.0, "seconds to wait for charon and the CHILD_SA", min=1, max=120
        ),
    }

    # ------------------------------------------------------------------ validation / checks

    def validate(self, params: dict, *, source: str = "") -> None:
        charon.validate_proposals(params, source=source)

    requires = (*charon.TOOLS, IP, PING)
    # the charon plug-ins the profiles load: kernel-libipsec (user-space ESP) and the rest
    # (extra), openssl, gcm, ... (standard)
    packages = (
        "libcharon-extra-plugins",
        "libstrongswan-extra-plugins",
        "libstrongswan-standard-plugins",
    )

    def cpu_dataplane(self, params: dict, path: str) -> DataPlaneCpu | None:
        if path != "kernel-libipsec":
            return None  # XFRM: the kernel carries the packets
        board_kernel = params["dataplane"] != "libipsec"  # a board has ESP: auto/kernel use it
        return DataPlaneCpu(
            daemon="charon",
            primitive=esp_primitive(params["esp_proposals"]),
            board="kernel:xfrm-esp" if board_kernel else "userspace",
            what="charon's kernel-libipsec ESP (userspace, OpenSSL)"
            + (" for the board kernel's XFRM ESP" if board_kernel else ""),
        )

    def check(self, params: dict, node: Node) -> Availability:
        have, missing = charon.missing_plugins(node, params["crypto_plugins"])
        if missing:
            return Availability(False, "", "missing " + ", ".join(missing) + "; run ./setup.sh")
        path, why = self._dataplane(params, kernel_facts(node))
        if path == "kernel-libipsec" and "libstrongswan-kernel-libipsec.so" not in have:
            return Availability(
                False, path, f"{why}; kernel-libipsec plugin missing (libcharon-extra-plugins)"
            )
        if path == "":
            return Availability(False, "kernel", why)
        return Availability(True, path)  # why: only when it cannot run (`lab profiles`)

    def _dataplane(self, params: dict, facts: KernelFacts) -> tuple[str, str]:
        """('kernel' | 'kernel-libipsec' | '' when impossible, explanation) for a kernel with
        `facts`. Pure."""
        want = params["dataplane"]
        if want == "libipsec":
            return "kernel-libipsec", "dataplane=libipsec requested"
        ok, missing = kernel_esp(
            facts.config, params["esp_proposals"], loaded=facts.loaded, modules=facts.available
        )
        if want == "kernel":
            if ok is False:
                return "", f"kernel lacks {missing}: use dataplane=libipsec (or --vm)"
            return "kernel", "dataplane=kernel requested"
        if ok:
            return "kernel", "kernel has ESP"
        return "kernel-libipsec", f"kernel ESP unavailable ({missing})"

    # ------------------------------------------------------------------ secrets / render

    def secrets(self, ctx: TunnelContext, params: dict) -> dict[str, str]:
        return {"psk": charon.new_psk(ctx)}

    def render(
        self, ctx: TunnelContext, params: dict, secrets: dict[str, str]
    ) -> dict[str, dict[str, str]]:
        # the path check() found on the nodes; unasked, the one the parameters name
        path = ctx.dataplane or ("kernel-libipsec" if params["dataplane"] == "libipsec" else "")
        out = charon.render_configs(
            ctx, params, secrets["psk"], path or "kernel", selectors=traffic_selectors
        )
        if ctx.configs:  # the user's swanctl.conf; strongswan.conf (plugins, vici) stays the lab's
            user = userconfig.render(
                ctx,
                self.name,
                lambda end, role: (
                    {
                        "local_addr": end.underlay_v4,
                        "remote_addr": ctx.peer(end).underlay_v4,
                        "psk": secrets["psk"],
                        "local_ts": ", ".join(traffic_selectors(end)),
                        "remote_ts": ", ".join(traffic_selectors(ctx.peer(end))),
                    },
                    {},
                ),
            )
            for node, files in user.items():
                out[node].update(files)
        return out

    # ------------------------------------------------------------------ start

    def start(self, ctx: TunnelContext, params: dict, rendered: dict[str, dict[str, str]]) -> None:
        dataplane = dataplane_of(rendered[ctx.client.name]["strongswan.conf"])
        if dataplane == "kernel":
            for end in ctx.ends():
                probe_kernel_esp(end, params["esp_proposals"])
        for end in ctx.ends():
            ctx.write_config(end, rendered[end.name])
        for end in ctx.ends():
            _ensure_tunnel_addrs(end)
        if not ctx.configs:
            charon.start(ctx, params["start_timeout"])
            return
        files = {end.name: conf for end in ctx.ends() for conf in [userconfig.config_of(ctx, end)]}

        def load_error(end: Endpoint, output: str) -> Exception:
            # swanctl's parser or charon refused the user's file: its own words, its line
            cfg, text = files[end.name], rendered[end.name]["swanctl.conf"]
            said = [
                ln
                for ln in output.splitlines()
                if ln.strip() and "opening directory" not in ln and " found, " not in ln
            ]
            m = re.search(r"invalid value for: (\w+)", output)  # "loading connection failed"
            line = userconfig.line_of(text, rf"^\s*{m.group(1)}\s*=") if m else None
            return userconfig.file_error(cfg, text, line, "swanctl --load-all: " + " / ".join(said))

        try:
            charon.start(ctx, params["start_timeout"], load_error=load_error)
        except StartupError as e:  # only the negotiation tells: the daemons' own log lines
            where = [
                userconfig.rejected_proposal(
                    files[d.node], rendered[d.node]["swanctl.conf"], d.log_text()
                )
                for d in ctx.daemons
            ]
            said = [
                f"{d.node}: {ln}"
                for d in ctx.daemons
                for ln in userconfig.daemon_lines(d.log_text())
            ]
            raise StartupError(
                "strongSwan with the user's files "
                + ", ".join(f"{c.path} ({c.role})" for c in ctx.configs.values())
                + "".join(f"\nrefused by {w}" for w in where if w)
                + "\nthe daemons' log says:\n  "
                + "\n  ".join(said or ["(nothing)"])
                + f"\n{e}"
            ) from None

    # ------------------------------------------------------------------ describe

    def describe(self, ctx: TunnelContext, params: dict) -> dict:
        files = charon.deployed(ctx)
        dataplane = dataplane_of(files[ctx.client.name]["strongswan.conf"])
        version = charon.version(ctx, ctx.client)
        conn = charon.conn_names(ctx, ctx.client)[0] if ctx.configs else charon.CONN
        ike, child = charon.sa(ctx, ctx.client, conn)
        algs = charon.algorithms(ctx, ctx.client)
        negotiated = charon.negotiated(ike, child)
        mtu, mtu_source, ifname = self._mtu(ctx, dataplane, child)
        return {
            "implementation": "strongSwan",
            "version": version,
            "path": dataplane,
            "cipher": _fmt_alg(child),
            "ike": {
                "version": ike.get("version"),
                "encryption": _fmt_alg(ike),
                "integrity": ike.get("integ-alg"),
                "prf": ike.get("prf-alg"),
                "dh_group": ike.get("dh-group"),
                "proposals": params["ike_proposals"],
            },
            "esp": {
                "encryption": _fmt_alg(child),
                "integrity": child.get("integ-alg"),
                "dh_group": child.get("dh-group"),
                "mode": child.get("mode"),
                "udp_encap": child.get("encap") == "yes",
                "local_ts": child.get("local-ts"),
                "remote_ts": child.get("remote-ts"),
                "proposals": params["esp_proposals"],
            },
            "crypto_providers": {a: _provider(algs, a) for a in negotiated},
            "plugins": plugin_list(dataplane, params["crypto_plugins"]),
            "interface": ifname,
            "mtu": mtu,
            "mtu_source": mtu_source,
            "dpd": {
                "delay_s": params["dpd_delay"],
                "timeout_s": params["dpd_timeout"],
                "mapped_to": f"retransmit_timeout={retransmit_timeout_for(params['dpd_timeout']):.3f} "
                f"base={RETRANSMIT_BASE} tries={RETRANSMIT_TRIES}",
            },
            "lifetimes": {
                "ike_rekey_s": params["ike_rekey_time"],
                "child_rekey_s": params["child_rekey_time"],
            },
            "config_hash": config_hash(files),
        }

    def sa(self, ctx: TunnelContext, end: Endpoint) -> tuple[dict, dict]:
        """(IKE_SA, first installed CHILD_SA) of our connection as vici reports them ({} if none)."""
        return charon.sa(ctx, end)

    def _mtu(
        self, ctx: TunnelContext, dataplane: str, child: dict
    ) -> tuple[int | None, str, str | None]:
        if dataplane == "kernel-libipsec":
            out = ctx.client.node.run(["ip", "-j", "link", "show", "dev", LIBIPSEC_TUN]).stdout
            return int(json.loads(out)[0]["mtu"]), f"{LIBIPSEC_TUN} interface", LIBIPSEC_TUN
        # kernel XFRM has no tunnel interface: underlay MTU minus the worst-case ESP overhead
        route = ctx.client.node.run(["ip", "-j", "route", "get", ctx.server.underlay_v4]).stdout
        dev = json.loads(route)[0]["dev"]
        out = ctx.client.node.run(["ip", "-j", "link", "show", "dev", dev]).stdout
        under = int(json.loads(out)[0]["mtu"])
        return (
            under - esp_overhead(child, udp=child.get("encap") == "yes"),
            f"{dev} MTU - ESP overhead",
            None,
        )

    # ------------------------------------------------------------------ rekey

    def rekey_support(self, params: dict) -> Rekey:
        return Rekey(
            True,
            "swanctl --rekey --child: a new CHILD_SA (new ESP keys and SPIs) negotiated over "
            "the running IKE_SA",
        )

    def trigger_rekey(self, ctx: TunnelContext, params: dict, *, timeout: float) -> dict:
        return charon.rekey(ctx, timeout=timeout)

    # ------------------------------------------------------------------ stop

    def stop(self, ctx: TunnelContext, params: dict) -> None:
        """Terminate the IKE_SA over vici, stop each charon by PID, remove what it left.

        charon removes ipsec0, its routes (table 220) and its XFRM states/policies on SIGTERM;
        after a SIGKILL they stay, so each is removed here too (only ours: by our selectors and
        underlay addresses, never a flush). Raises TeardownIncomplete listing what remains.
        """
        charon.stop(ctx)
        left = []
        for end in ctx.ends():
            left += _cleanup(end, ctx.peer(end))
        if left:
            raise TeardownIncomplete(left)


# ------------------------------------------------------------------------ helpers


def traffic_selectors(end: Endpoint) -> list[str]:
    """The end's tunnel host addresses plus the networks behind it."""
    ts = [f"{_host(end.tunnel_v4)}/32"]
    if _host(end.tunnel_v6):
        ts.append(f"{_host(end.tunnel_v6)}/128")
    return ts + list(end.behind)


def _ensure_tunnel_addrs(end: Endpoint) -> None:
    end.node.run(["ip", "addr", "replace", f"{_host(end.tunnel_v4)}/32", "dev", "lo"])
    if _host(end.tunnel_v6):
        end.node.run(
            ["ip", "-6", "addr", "replace", f"{_host(end.tunnel_v6)}/128", "dev", "lo", "nodad"]
        )


def _cleanup(end: Endpoint, peer: Endpoint) -> list[str]:
    """charon's leftovers between our selectors (charonkernel.cleanup), then the tunnel addresses on
    lo; returns what still remains."""
    left = charonkernel.cleanup(end, peer, traffic_selectors(end), traffic_selectors(peer))
    n = end.node
    n.run(["ip", "addr", "del", f"{_host(end.tunnel_v4)}/32", "dev", "lo"], check=False)
    if _host(end.tunnel_v6):
        n.run(["ip", "-6", "addr", "del", f"{_host(end.tunnel_v6)}/128", "dev", "lo"], check=False)
    return left


def esp_primitive(proposals: str) -> str | None:
    """The crypto primitive of the first ESP proposal (its encryption algorithm), as
    lab.model.cpuprofile names it; None for one the CPU model has no figure for."""
    first = proposals.split(",")[0].split("-")[0].strip().lower()
    for prefix, prim in (
        ("aes128gcm", "aes-128-gcm"),
        ("aes256gcm", "aes-256-gcm"),
        ("chacha20poly1305", "chacha20-poly1305"),
        ("aes128", "aes-128-cbc"),
        ("aes256", "aes-256-cbc"),
    ):
        if first.startswith(prefix):
            return prim
    return None
