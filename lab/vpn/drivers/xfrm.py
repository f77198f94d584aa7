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
The algorithms, SAs and scripts are lab.vpn.xfrmsa; the kernel's side (what it needs, what it
holds) is lab.vpn.xfrmkernel. This module is the driver: checks, secrets, start, describe, stop.

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
from lab.model.params import Param
from lab.vpn.base import (
    Availability,
    Driver,
    Endpoint,
    Rekey,
    TunnelContext,
    config_hash,
    write_secret,
)
from lab.vpn.xfrmkernel import kernel_missing, policy_selectors, sa_counters
from lab.vpn.xfrmsa import (
    AUTH,
    DOWN_FILE,
    DOWN_POLICY,
    ENC,
    PROTOCOLS,
    SECRETS_FILE,
    UP_FILE,
    all_key_names,
    cipher_name,
    down_script,
    host,
    overhead,
    sas,
    secret_layout,
    up_script,
)
from lab.core.tools import IP, PING


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
    secret_markers = all_key_names()

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
                UP_FILE: up_script(ctx, end, params, secrets, ctx.profile or self.name),
                DOWN_FILE: down_script(ctx, end, params, secrets, ctx.profile or self.name),
            }
            for end in ctx.ends()
        }

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
        for addr in (ctx.server.underlay_v4, host(ctx.server.underlay_v6)):
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
        return sas(ctx, params, spis)

    # ------------------------------------------------------------------ describe / stop

    def rekey_support(self, params: dict) -> Rekey:
        return Rekey(False, "manual keys (ip xfrm state): no key exchange, the SAs never change")

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
            m = DOWN_POLICY.match(line)
            if m and (m[1], m[2], m[3], m[4]) in present:
                left.append(f"{end.name}: xfrm policy {line.split('delete ', 1)[1]}")
        return left
