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
"""

from __future__ import annotations

import base64
import ipaddress
import json
import re
import secrets as pysecrets
import time
from pathlib import Path
from typing import ClassVar

from ..errors import CommandError, ConfigError, PreconditionError, StartupError, TeardownIncomplete
from ..node import Node
from .base import (
    IP,
    PING,
    Availability,
    Driver,
    Endpoint,
    Param,
    Tool,
    TunnelContext,
    config_hash,
    write_secret,
)
from .kernelfeatures import KernelFacts, kernel_facts

CHARON = "/usr/lib/ipsec/charon"
PLUGIN_DIR = Path("/usr/lib/ipsec/plugins")
RUN_DIR = "/run/lab-strongswan"  # inside the node's private /run
VICI_URI = f"unix://{RUN_DIR}/charon.vici"
PID_FILE = "/run/charon.pid"  # compiled into charon (IPSEC_PIDDIR)
PSK_FILE = "strongswan-psk"
CONN = "lab"  # IKE and CHILD config name
LIBIPSEC_TUN = "ipsec0"
ROUTE_TABLE = "220"  # charon.routing_table default
TEMPLATES = Path(__file__).resolve().parent.parent.parent / "vpn_profiles" / "templates"

# IKEv2 "dpd_timeout": charon declares the peer dead when the last of retransmit_tries
# retransmissions of a DPD request times out. Keep strongSwan's default base and tries and
# scale retransmit_timeout so the whole schedule lasts dpd_timeout seconds.
RETRANSMIT_BASE = 1.8
RETRANSMIT_TRIES = 5

# plugins charon loads, in order (the first that provides an algorithm is used)
PLUGINS_HEAD = ("random", "nonce")
PLUGINS_TAIL = ("kernel-netlink", "socket-default", "vici")

PROPOSAL_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*(,[a-z0-9]+(-[a-z0-9]+)*)*$")

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


def retransmit_timeout_for(dpd_timeout: float) -> float:
    return dpd_timeout / sum(RETRANSMIT_BASE**k for k in range(RETRANSMIT_TRIES + 1))


def plugin_list(dataplane: str, crypto_plugins: str) -> list[str]:
    kernel = ["kernel-libipsec"] if dataplane == "kernel-libipsec" else []
    # kernel-libipsec must come before kernel-netlink: the first kernel-ipsec backend loaded wins
    return [*PLUGINS_HEAD, *crypto_plugins.split(), *kernel, *PLUGINS_TAIL]


# ------------------------------------------------------------------------ kernel probing


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


# ------------------------------------------------------------------------ vici output


_TOKEN = re.compile(r"([^\s=]+)=\[([^\]]*)\]|([^\s=]+)=([^\s}]*)|(\S+) \{|(\})")


def parse_vici_raw(text: str) -> list[tuple[str, dict]]:
    """Parse `swanctl --raw` output into [(message name, {key: value | [..] | {...}}), ...].

    The raw form is `NAME {key=value list=[a b] section {...}}`, one message per line. Values
    containing spaces are not supported (none of the keys this driver reads has them).
    """
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.endswith("}") or "{" not in line:
            continue
        name, _, body = line.partition(" {")
        stack: list[dict] = [{}]
        for m in _TOKEN.finditer(body):
            lk, lv, k, v, sect, end = m.groups()
            if lk is not None:
                stack[-1][lk] = lv.split()
            elif k is not None:
                stack[-1][k] = v
            elif sect is not None:
                child: dict = {}
                stack[-1][sect] = child
                stack.append(child)
            elif end is not None and len(stack) > 1:
                stack.pop()
        out.append((name, stack[0]))
    return out


def _fmt_alg(d: dict) -> str | None:
    alg = d.get("encr-alg")
    if not alg:
        return None
    size = d.get("encr-keysize")
    return f"{alg}_{size}" if size else alg


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
        for key in ("ike_proposals", "esp_proposals"):
            value = params.get(key, "")
            if not PROPOSAL_RE.match(value):
                raise ConfigError(
                    f"{value!r} is not a swanctl proposal list (comma-separated "
                    "algorithm-algorithm-..., lowercase, e.g. aes128gcm8-prfsha256-modp1024)",
                    source=source,
                    field=f"params.{key}",
                )
        for plugin in params.get("crypto_plugins", "").split():
            if not re.match(r"^[a-z0-9-]+$", plugin):
                raise ConfigError(
                    f"{plugin!r} is not a plugin name", source=source, field="params.crypto_plugins"
                )

    requires = (
        Tool(CHARON, "strongswan-charon", (CHARON, "--version"), label="charon"),
        Tool("swanctl", "strongswan-swanctl"),  # its --version asks the running charon
        IP,
        PING,
    )

    def check(self, params: dict, node: Node) -> Availability:
        cp = node.run(["ls", "-1", str(PLUGIN_DIR)], check=False)
        have = set(cp.stdout.split()) if cp.returncode == 0 else set()
        missing = [
            f"{p} plugin ({PLUGIN_DIR}/libstrongswan-{p}.so)"
            for p in ("vici", "kernel-netlink", "socket-default", *params["crypto_plugins"].split())
            if f"libstrongswan-{p}.so" not in have
        ]
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
        psk = "0s" + base64.b64encode(pysecrets.token_bytes(32)).decode()
        write_secret(ctx.secrets_dir, PSK_FILE, psk + "\n")
        return {"psk": psk}

    def render(
        self, ctx: TunnelContext, params: dict, secrets: dict[str, str]
    ) -> dict[str, dict[str, str]]:
        # the path check() found on the nodes; unasked, the one the parameters name
        path = ctx.dataplane or ("kernel-libipsec" if params["dataplane"] == "libipsec" else "")
        return render_configs(ctx, params, secrets["psk"], path or "kernel")

    # ------------------------------------------------------------------ start

    def start(self, ctx: TunnelContext, params: dict, rendered: dict[str, dict[str, str]]) -> None:
        dataplane = dataplane_of(rendered[ctx.client.name]["strongswan.conf"])
        if dataplane == "kernel":
            for end in ctx.ends():
                probe_kernel_esp(end, params["esp_proposals"])
        for end in ctx.ends():
            ctx.write_config(end, rendered[end.name])
        ctx.log_dir.mkdir(parents=True, exist_ok=True)
        for end in ctx.ends():
            _ensure_tunnel_addrs(end)
            # stale socket from an earlier run: charon would unlink it anyway; a fresh dir is ours
            end.node.run(["rm", "-f", f"{RUN_DIR}/charon.vici"], check=False)
            end.node.run(["mkdir", "-p", "-m", "0700", RUN_DIR])
        for end in ctx.ends():
            log = ctx.log_dir / f"{end.name}-charon.log"
            log.unlink(missing_ok=True)
            ctx.daemons.append(end.node.spawn("charon", [CHARON], log=log, env=self._env(ctx, end)))
        deadline = time.monotonic() + params["start_timeout"]
        for end in ctx.ends():
            self._wait_vici(ctx, end, deadline)
        for end in ctx.ends():
            self._swanctl(
                ctx,
                end,
                ["--load-all", "--noprompt", "--file", str(self._conf(ctx, end, "swanctl.conf"))],
            )
        left = max(1, int(deadline - time.monotonic() + 0.999))
        cp = self._swanctl(
            ctx,
            ctx.client,
            ["--initiate", "--ike", CONN, "--child", CONN, "--timeout", str(left)],
            check=False,
            timeout=left + 5,
        )
        if cp.returncode != 0:
            raise StartupError(
                f"strongSwan: initiating CHILD_SA {CONN!r} from {ctx.client.name} failed "
                f"(swanctl exit {cp.returncode})\n{_tail(cp.stdout + cp.stderr, 12)}"
                + self._log_tails(ctx)
            )

    def _env(self, ctx: TunnelContext, end: Endpoint) -> dict[str, str]:
        return {"STRONGSWAN_CONF": str(self._conf(ctx, end, "strongswan.conf"))}

    def _conf(self, ctx: TunnelContext, end: Endpoint, rel: str) -> Path:
        return ctx.config_dir / end.name / rel

    def _swanctl(self, ctx, end: Endpoint, args: list[str], *, check=True, timeout=30):
        return end.node.run(
            ["swanctl", *args, "--uri", VICI_URI],
            env=self._env(ctx, end),
            check=check,
            timeout=timeout,
        )

    def _wait_vici(self, ctx: TunnelContext, end: Endpoint, deadline: float) -> None:
        daemon = self._daemon(ctx, end)
        while True:
            if daemon is not None and not daemon.alive():
                raise StartupError(
                    f"strongSwan: charon on {end.name} exited during start-up\n"
                    + (daemon.log_tail(20) or "(empty log)")
                )
            # swanctl itself can take seconds to start on a slow (emulated) CPU: a probe that
            # times out means "not yet", like one that cannot connect
            left = max(5.0, deadline - time.monotonic())
            try:
                cp = self._swanctl(ctx, end, ["--stats"], check=False, timeout=left)
                if cp.returncode == 0:
                    return
            except CommandError as e:
                if e.returncode != -1:
                    raise
            if time.monotonic() > deadline:
                raise StartupError(
                    f"strongSwan: charon on {end.name} did not open its vici socket {VICI_URI}"
                    + self._log_tails(ctx)
                )
            time.sleep(0.02)

    def _daemon(self, ctx: TunnelContext, end: Endpoint):
        for d in reversed(ctx.daemons):
            if d.node == end.name and d.name == "charon":
                return d
        return None

    def _log_tails(self, ctx: TunnelContext) -> str:
        out = ""
        for d in ctx.daemons:
            if d.name == "charon":
                out += f"\n--- charon on {d.node} ({d.log}) ---\n{d.log_tail(15) or '(empty log)'}"
        return out

    # ------------------------------------------------------------------ describe

    def describe(self, ctx: TunnelContext, params: dict) -> dict:
        files = self._deployed(ctx)
        dataplane = dataplane_of(files[ctx.client.name]["strongswan.conf"])
        version = None
        for name, msg in parse_vici_raw(
            self._swanctl(ctx, ctx.client, ["--version", "--daemon", "--raw"]).stdout
        ):
            if name == "version reply":
                version = msg.get("version")
        ike, child = self.sa(ctx, ctx.client)
        algs = self._algorithms(ctx, ctx.client)
        negotiated = [
            a
            for a in (
                ike.get("encr-alg"),
                ike.get("integ-alg"),
                ike.get("prf-alg"),
                ike.get("dh-group"),
                child.get("encr-alg"),
                child.get("integ-alg"),
                child.get("dh-group"),
            )
            if a
        ]
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
        cp = self._swanctl(ctx, end, ["--list-sas", "--ike", CONN, "--raw"])
        for name, msg in parse_vici_raw(cp.stdout):
            if name == "list-sa event" and CONN in msg:
                ike = msg[CONN]
                for child in (ike.get("child-sas") or {}).values():
                    if isinstance(child, dict) and child.get("state") == "INSTALLED":
                        return ike, child
                return ike, {}
        return {}, {}

    def _algorithms(self, ctx: TunnelContext, end: Endpoint) -> dict:
        cp = self._swanctl(ctx, end, ["--list-algs", "--raw"])
        for name, msg in parse_vici_raw(cp.stdout):
            if name == "get-algorithms reply":
                return msg
        return {}

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

    def _deployed(self, ctx: TunnelContext) -> dict[str, dict[str, str]]:
        """The config files as written by start(), PSK redacted (the hash the framework records)."""
        psk = (ctx.secrets_dir / PSK_FILE).read_text().strip()
        files = {}
        for end in ctx.ends():
            files[end.name] = {
                rel: self._conf(ctx, end, rel).read_text().replace(psk, "<redacted:psk>")
                for rel in ("strongswan.conf", "swanctl.conf")
            }
        return files

    # ------------------------------------------------------------------ stop

    def stop(self, ctx: TunnelContext, params: dict) -> None:
        """Terminate the IKE_SA over vici, stop each charon by PID, remove what it left.

        charon removes ipsec0, its routes (table 220) and its XFRM states/policies on SIGTERM;
        after a SIGKILL they stay, so each is removed here too (only ours: by our selectors and
        underlay addresses, never a flush). Raises TeardownIncomplete listing what remains.
        """
        if self._daemon(ctx, ctx.client) is not None and self._daemon(ctx, ctx.client).alive():
            self._swanctl(
                ctx,
                ctx.client,
                ["--terminate", "--ike", CONN, "--timeout", "3"],
                check=False,
                timeout=8,
            )
        for d in [d for d in reversed(ctx.daemons) if d.name == "charon"]:
            node = ctx.client.node if d.node == ctx.client.name else ctx.server.node
            node.stop(d)
            ctx.daemons.remove(d)
        left = []
        for end in ctx.ends():
            left += _cleanup(end, ctx.peer(end))
        if left:
            raise TeardownIncomplete(left)


# ------------------------------------------------------------------------ helpers


def render_configs(
    ctx: TunnelContext, params: dict, psk: str, dataplane: str
) -> dict[str, dict[str, str]]:
    """{node: {"strongswan.conf": ..., "swanctl.conf": ...}}: pure, no node is touched."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    rt = retransmit_timeout_for(params["dpd_timeout"])
    out = {}
    for end in ctx.ends():
        peer = ctx.peer(end)
        initiator = end is ctx.client
        common = {"node": end.name, "role": "initiator" if initiator else "responder"}
        sconf = env.get_template("strongswan/strongswan.conf.j2").render(
            **common,
            dataplane=dataplane,
            plugins=plugin_list(dataplane, params["crypto_plugins"]),
            vici_uri=VICI_URI,
            mtu=params["mtu"],
            dpd_timeout=params["dpd_timeout"],
            retransmit_timeout=rt,
            retransmit_base=RETRANSMIT_BASE,
            retransmit_tries=RETRANSMIT_TRIES,
            dead_after=sum(rt * RETRANSMIT_BASE**k for k in range(RETRANSMIT_TRIES + 1)),
        )
        swanctl = env.get_template("strongswan/swanctl.conf.j2").render(
            **common,
            conn=CONN,
            local_addr=end.underlay_v4,
            remote_addr=peer.underlay_v4,
            local_name=_id_key(end.name),
            remote_name=_id_key(peer.name),
            ike_proposals=params["ike_proposals"],
            esp_proposals=params["esp_proposals"],
            encap=params["encap"] and dataplane == "kernel",
            dpd_delay=params["dpd_delay"],
            dpd_action=params["dpd_action"] if initiator else "clear",
            ike_rekey_time=params["ike_rekey_time"],
            child_rekey_time=params["child_rekey_time"],
            local_ts=traffic_selectors(end),
            remote_ts=traffic_selectors(peer),
            psk=psk,
        )
        out[end.name] = {"strongswan.conf": sconf, "swanctl.conf": swanctl}
    return out


def traffic_selectors(end: Endpoint) -> list[str]:
    """The end's tunnel host addresses plus the networks behind it."""
    ts = [f"{_host(end.tunnel_v4)}/32"]
    if _host(end.tunnel_v6):
        ts.append(f"{_host(end.tunnel_v6)}/128")
    return ts + list(end.behind)


def dataplane_of(strongswan_conf: str) -> str:
    m = re.search(r"^# lab: data-plane (\S+)$", strongswan_conf, re.MULTILINE)
    if not m:
        raise ConfigError("rendered strongswan.conf lacks its '# lab: data-plane' line")
    return m.group(1)


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


def probe_kernel_esp(end: Endpoint, esp_proposals: str) -> None:
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
    cp = end.node.run(["ip", "xfrm", "state", "add", *sel, "mode", "tunnel", *alg], check=False)
    if cp.returncode != 0:
        raise PreconditionError(
            f"node {end.name}: the kernel refuses an ESP state with {alg[1]} "
            f"({cp.stderr.strip()}); use dataplane=libipsec (or --vm)"
        )
    end.node.run(["ip", "xfrm", "state", "delete", *sel[:-2], "spi", spi], check=False)


def _ensure_tunnel_addrs(end: Endpoint) -> None:
    end.node.run(["ip", "addr", "replace", f"{_host(end.tunnel_v4)}/32", "dev", "lo"])
    if _host(end.tunnel_v6):
        end.node.run(
            ["ip", "-6", "addr", "replace", f"{_host(end.tunnel_v6)}/128", "dev", "lo", "nodad"]
        )


def _cleanup(end: Endpoint, peer: Endpoint) -> list[str]:
    """Remove this end's leftovers of a (possibly killed) charon; returns what still remains.

    Only ours: XFRM states between the two underlay addresses, policies between the two ends'
    selectors, table-220 routes to the peer's selectors -- never a flush, so a board's other
    tunnels survive. After a clean SIGTERM charon has removed all of them already, so this is
    one listing per kind and nothing to delete.
    """
    n = end.node
    left = []
    if n.run(["ip", "link", "show", "dev", LIBIPSEC_TUN], check=False).returncode == 0:
        # a TUN device goes with the process holding it; if it is still there, charon is too
        left.append(f"{end.name}: interface {LIBIPSEC_TUN}")
    for fam in ("-4", "-6"):
        shown = n.run(["ip", fam, "route", "show", "table", ROUTE_TABLE], check=False).stdout
        present = {_net(line.split()[0]) for line in shown.splitlines() if line.strip()}
        for dst in traffic_selectors(peer):
            if _net(dst) in present:
                n.run(["ip", fam, "route", "del", dst, "table", ROUTE_TABLE], check=False)
    states = {(end.underlay_v4, peer.underlay_v4), (peer.underlay_v4, end.underlay_v4)}
    pairs = {
        (_net(a), _net(b))
        for s in traffic_selectors(end)
        for t in traffic_selectors(peer)
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
    n.run(["ip", "addr", "del", f"{_host(end.tunnel_v4)}/32", "dev", "lo"], check=False)
    if _host(end.tunnel_v6):
        n.run(["ip", "-6", "addr", "del", f"{_host(end.tunnel_v6)}/128", "dev", "lo"], check=False)
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
        found.add((_net(a), _net(b)) if normalize else (a, b))
    return found


def _net(text: str):
    return ipaddress.ip_network(text, strict=False)


def _provider(algs: dict, name: str) -> str | None:
    for group in algs.values():
        if isinstance(group, dict) and name in group:
            return group[name]
    return None


def _host(addr: str | None) -> str:
    return (addr or "").split("/")[0]


def _id_key(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "", name) or "x"


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
