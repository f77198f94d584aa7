"""One strongSwan charon per tunnel end, driven by swanctl over vici: what the `strongswan`
driver (IKEv2 tunnel mode) and the `l2tp-ipsec` driver (IKEv1 transport mode under L2TP) share.

Rendering (strongswan.conf + swanctl.conf from vpn_profiles/templates/strongswan/, pure), starting
the charons (STRONGSWAN_CONF per node, vici socket and pid file in the node's private /run),
loading and initiating, reading connections, SAs and algorithms over vici (`swanctl --raw`), and
stopping: terminate, then SIGTERM by PID. What a charon needs from and leaves in the kernel (the
ESP decision and probe, the leftovers of a killed charon) is lab.vpn.charonkernel. The drivers add
what is theirs (tunnel addresses, L2TP). docs/ipsec.md.

Why swanctl and not strongSwan's `vici` Python package: the vici socket lives in the node's own
/run (its mount namespace, or a board), so a client has to run there, and the node's python must
import vici. On a board it cannot: Debian bookworm (Raspberry Pi OS) has no python3-vici package
and the lab installs nothing on a board (lab.substrate.boards.node runs `python3 -I -S`). swanctl
is needed on every node anyway, for --load-all (vici has no swanctl.conf parser, and a user's own
swanctl.conf is loaded as it is, docs/byoc.md). So one client, swanctl, reads everything too; its
`--raw` form is one line per message, parsed by parse_vici_raw.
"""

from __future__ import annotations

import base64
import re
import secrets as pysecrets
import time
from collections.abc import Callable
from pathlib import Path

from lab import REPO
from lab.core.errors import CommandError, ConfigError, StartupError
from lab.core.node import Daemon, Node
from lab.vpn import libipsec
from lab.vpn.base import Endpoint, TunnelContext, write_secret
from lab.core.tools import Tool

CHARON = "/usr/lib/ipsec/charon"
PLUGIN_DIR = Path("/usr/lib/ipsec/plugins")
RUN_DIR = "/run/lab-strongswan"  # inside the node's private /run
VICI_URI = f"unix://{RUN_DIR}/charon.vici"
PID_FILE = "/run/charon.pid"  # compiled into charon (IPSEC_PIDDIR)
PSK_FILE = "strongswan-psk"
CONN = "lab"  # IKE and CHILD config name
LIBIPSEC_TUN = "ipsec0"
ROUTE_TABLE = "220"  # charon.routing_table default
TEMPLATES = REPO / "vpn_profiles" / "templates"

# IKEv2 "dpd_timeout": charon declares the peer dead when the last of retransmit_tries
# retransmissions of a DPD request times out. Keep strongSwan's default base and tries and
# scale retransmit_timeout so the whole schedule lasts dpd_timeout seconds.
RETRANSMIT_BASE = 1.8
RETRANSMIT_TRIES = 5

# plugins charon loads, in order (the first that provides an algorithm is used)
PLUGINS_HEAD = ("random", "nonce")
PLUGINS_TAIL = ("kernel-netlink", "socket-default", "vici")

PROPOSAL_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*(,[a-z0-9]+(-[a-z0-9]+)*)*$")


def retransmit_timeout_for(dpd_timeout: float) -> float:
    return dpd_timeout / sum(RETRANSMIT_BASE**k for k in range(RETRANSMIT_TRIES + 1))


def plugin_list(dataplane: str, crypto_plugins: str) -> list[str]:
    kernel = ["kernel-libipsec"] if dataplane == "kernel-libipsec" else []
    # kernel-libipsec must come before kernel-netlink: the first kernel-ipsec backend loaded wins
    return [*PLUGINS_HEAD, *crypto_plugins.split(), *kernel, *PLUGINS_TAIL]


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


def fmt_alg(d: dict) -> str | None:
    alg = d.get("encr-alg")
    if not alg:
        return None
    size = d.get("encr-keysize")
    return f"{alg}_{size}" if size else alg


TOOLS = (
    Tool(CHARON, "strongswan-charon", (CHARON, "--version"), label="charon", board=True),
    Tool("swanctl", "strongswan-swanctl", board=True),  # its --version asks the running charon
)


def missing_plugins(node: Node, crypto_plugins: str) -> tuple[set[str], list[str]]:
    """(the plugin files the node has, the required plugins it lacks), asked on the node."""
    cp = node.run(["ls", "-1", str(PLUGIN_DIR)], check=False)
    have = set(cp.stdout.split()) if cp.returncode == 0 else set()
    missing = [
        f"{p} plugin ({PLUGIN_DIR}/libstrongswan-{p}.so)"
        for p in ("vici", "kernel-netlink", "socket-default", *crypto_plugins.split())
        if f"libstrongswan-{p}.so" not in have
    ]
    return have, missing


def validate_proposals(params: dict, *, source: str = "") -> None:
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


def new_psk(ctx: TunnelContext) -> str:
    """32 random bytes, base64 (swanctl's 0s form), written 0600 to the lab's secrets."""
    psk = "0s" + base64.b64encode(pysecrets.token_bytes(32)).decode()
    write_secret(ctx.secrets_dir, PSK_FILE, psk + "\n")
    return psk


# ------------------------------------------------------------------------ rendering


def render_configs(
    ctx: TunnelContext,
    params: dict,
    psk: str,
    dataplane: str,
    *,
    selectors: Callable[[Endpoint], list[str]],
    version: int = 2,
    mode: str = "tunnel",
) -> dict[str, dict[str, str]]:
    """{node: {"strongswan.conf": ..., "swanctl.conf": ...}}: pure, no node is touched.
    `selectors(end)`: the end's traffic selectors in swanctl syntax (`10.0.1.2/32[udp/1701]`)."""
    import jinja2  # only where configs are rendered: most lab commands never do

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
            version=version,
            # transport mode: the policies cover the underlay addresses, no route is needed
            install_routes=mode == "tunnel",
            dataplane=dataplane,
            plugins=plugin_list(dataplane, params["crypto_plugins"]),
            vici_uri=VICI_URI,
            mtu=params["mtu"],
            # the board kernel's queues (lab.vpn.libipsec): read by the lab's patched libipsec
            queue_limits=libipsec.limits(end.node) if dataplane == "kernel-libipsec" else None,
            queue_full=libipsec.FULL,
            dpd_timeout=params["dpd_timeout"],
            retransmit_timeout=rt,
            retransmit_base=RETRANSMIT_BASE,
            retransmit_tries=RETRANSMIT_TRIES,
            dead_after=sum(rt * RETRANSMIT_BASE**k for k in range(RETRANSMIT_TRIES + 1)),
        )
        swanctl = env.get_template("strongswan/swanctl.conf.j2").render(
            **common,
            version=version,
            mode=mode,
            conn=CONN,
            local_addr=end.underlay_v4,
            remote_addr=peer.underlay_v4,
            local_name=id_key(end.name),
            remote_name=id_key(peer.name),
            ike_proposals=params["ike_proposals"],
            esp_proposals=params["esp_proposals"],
            encap=params["encap"] and dataplane == "kernel",
            dpd_delay=params["dpd_delay"],
            dpd_timeout=params["dpd_timeout"],
            dpd_action=params["dpd_action"] if initiator else "clear",
            ike_rekey_time=params["ike_rekey_time"],
            child_rekey_time=params["child_rekey_time"],
            local_ts=selectors(end),
            remote_ts=selectors(peer),
            psk=psk,
        )
        out[end.name] = {"strongswan.conf": sconf, "swanctl.conf": swanctl}
    return out


# ------------------------------------------------------------------------ running


def conf_path(ctx: TunnelContext, end: Endpoint, rel: str) -> Path:
    return ctx.config_dir / end.name / rel


def env_of(ctx: TunnelContext, end: Endpoint) -> dict[str, str]:
    return {"STRONGSWAN_CONF": str(conf_path(ctx, end, "strongswan.conf"))}


def swanctl(ctx: TunnelContext, end: Endpoint, args: list[str], *, check=True, timeout=30):
    return end.node.run(
        ["swanctl", *args, "--uri", VICI_URI], env=env_of(ctx, end), check=check, timeout=timeout
    )


def daemon(ctx: TunnelContext, end: Endpoint) -> Daemon | None:
    for d in reversed(ctx.daemons):
        if d.node == end.name and d.name == "charon":
            return d
    return None


def log_tails(ctx: TunnelContext) -> str:
    out = ""
    for d in ctx.daemons:
        if d.name == "charon":
            out += f"\n--- charon on {d.node} ({d.log}) ---\n{d.log_tail(15) or '(empty log)'}"
    return out


def start(
    ctx: TunnelContext,
    start_timeout: float,
    *,
    load_error: Callable[[Endpoint, str], Exception] | None = None,
) -> tuple[str, str]:
    """Both charons (configs already written), vici up, --load-all on both, the client
    initiates and blocks until the CHILD_SA is installed. StartupError with the logs if not.
    `load_error(end, swanctl output)`: the error to raise when --load-all refuses a file (a
    user's own swanctl.conf; default: CommandError). Returns the (IKE, CHILD) names started:
    the lab's CONN, or a user's file's first connection and child (conn_names)."""
    ctx.log_dir.mkdir(parents=True, exist_ok=True)
    for end in ctx.ends():
        # stale socket from an earlier run: charon would unlink it anyway; a fresh dir is ours
        end.node.run(["rm", "-f", f"{RUN_DIR}/charon.vici"], check=False)
        end.node.run(["mkdir", "-p", "-m", "0700", RUN_DIR])
    for end in ctx.ends():
        log = ctx.log_dir / f"{end.name}-charon.log"
        log.unlink(missing_ok=True)
        env = {**env_of(ctx, end), **libipsec.env(end.node)}  # the patched libipsec, if bounded
        ctx.daemons.append(end.node.spawn("charon", [CHARON], log=log, env=env))
    deadline = time.monotonic() + start_timeout
    for end in ctx.ends():
        _wait_vici(ctx, end, deadline)
        _ensure_route_rules(end.node)
    for end in ctx.ends():
        conf = str(conf_path(ctx, end, "swanctl.conf"))
        cp = swanctl(ctx, end, ["--load-all", "--noprompt", "--file", conf], check=not load_error)
        # a file swanctl cannot parse is skipped with "invalid config file" and exit 0
        if load_error and (cp.returncode != 0 or "invalid config file" in cp.stderr):
            raise load_error(end, cp.stdout + cp.stderr)
    ike, child = conn_names(ctx, ctx.client) if ctx.configs else (CONN, CONN)
    left = max(1, int(deadline - time.monotonic() + 0.999))
    cp = swanctl(
        ctx,
        ctx.client,
        ["--initiate", "--ike", ike, "--child", child, "--timeout", str(left)],
        check=False,
        timeout=left + 5,
    )
    if cp.returncode != 0:
        raise StartupError(
            f"strongSwan: initiating CHILD_SA {child!r} from {ctx.client.name} failed "
            f"(swanctl exit {cp.returncode})\n{tail_of(cp.stdout + cp.stderr, 12)}" + log_tails(ctx)
        )
    return ike, child


def conn_names(ctx: TunnelContext, end: Endpoint) -> tuple[str, str]:
    """(first connection, its first child) of what charon loaded on `end`, as swanctl lists
    them: a user's swanctl.conf names its own (docs/byoc.md)."""
    cp = swanctl(ctx, end, ["--list-conns", "--raw"])
    for name, msg in parse_vici_raw(cp.stdout):
        if name == "list-conn event":
            for ike, conf in msg.items():
                children = [c for c in (conf.get("children") or {})]
                if children:
                    return ike, children[0]
    raise StartupError(f"strongSwan: no connection with a child loaded on {end.name}")


def _ensure_route_rules(node) -> None:
    """charon's policy-routing rules (`lookup 220`, priority 220) where charon could not add
    them: a charon run under qemu-user (a node of another architecture, lab.core.arch) gets
    EOPNOTSUPP for RTM_NEWRULE, which QEMU's rtnetlink translation lacks (its log: "unable to
    create IPv4 routing table rule"), and the routes it installs in table 220 go unused. Added
    with this machine's ip inside the node's namespace, which takes them along when it goes;
    a charon that made them itself is left alone."""
    for fam in ("-4", "-6"):
        if not node.run(["ip", fam, "rule", "show", "table", ROUTE_TABLE]).stdout.strip():
            node.run(["ip", fam, "rule", "add", "priority", ROUTE_TABLE, "table", ROUTE_TABLE])


def _wait_vici(ctx: TunnelContext, end: Endpoint, deadline: float) -> None:
    d = daemon(ctx, end)
    while True:
        if d is not None and not d.alive():
            raise StartupError(
                f"strongSwan: charon on {end.name} exited during start-up\n"
                + (d.log_tail(20) or "(empty log)")
            )
        # swanctl itself can take seconds to start on a slow (emulated) CPU: a probe that
        # times out means "not yet", like one that cannot connect
        left = max(5.0, deadline - time.monotonic())
        try:
            cp = swanctl(ctx, end, ["--stats"], check=False, timeout=left)
            if cp.returncode == 0:
                return
        except CommandError as e:
            if e.returncode != -1:
                raise
        if time.monotonic() > deadline:
            raise StartupError(
                f"strongSwan: charon on {end.name} did not open its vici socket {VICI_URI}"
                + log_tails(ctx)
            )
        time.sleep(0.02)


def sa(ctx: TunnelContext, end: Endpoint, conn: str = CONN) -> tuple[dict, dict]:
    """(IKE_SA, first installed CHILD_SA) of our connection as vici reports them ({} if none)."""
    cp = swanctl(ctx, end, ["--list-sas", "--ike", conn, "--raw"])
    for name, msg in parse_vici_raw(cp.stdout):
        if name == "list-sa event" and conn in msg:
            ike = msg[conn]
            for child in (ike.get("child-sas") or {}).values():
                if isinstance(child, dict) and child.get("state") == "INSTALLED":
                    return ike, child
            return ike, {}
    return {}, {}


def child_spis(ctx: TunnelContext, end: Endpoint, ike: str = CONN) -> set[str]:
    """The "SPI-in/SPI-out" of every INSTALLED CHILD_SA of IKE_SA `ike` on `end`, as vici lists
    them (a rekey installs the new CHILD_SA before it deletes the old one)."""
    cp = swanctl(ctx, end, ["--list-sas", "--ike", ike, "--raw"])
    out = set()
    for name, msg in parse_vici_raw(cp.stdout):
        if name == "list-sa event" and ike in msg:
            for child in (msg[ike].get("child-sas") or {}).values():
                if isinstance(child, dict) and child.get("state") == "INSTALLED":
                    out.add(f"{child.get('spi-in')}/{child.get('spi-out')}")
    return out


def rekey(ctx: TunnelContext, *, timeout: float) -> dict:
    """Rekey the CHILD_SA now (`swanctl --rekey --child`, a CREATE_CHILD_SA exchange over the
    running IKE_SA, from the client) and wait until a CHILD_SA with SPIs that were not
    installed before is installed. Returns {"how", "before", "after", "seconds"} read from
    charon over vici; StartupError when none appears within `timeout` s."""
    ike, child = conn_names(ctx, ctx.client) if ctx.configs else (CONN, CONN)
    before = child_spis(ctx, ctx.client, ike)
    if not before:
        raise StartupError(f"strongSwan: no installed CHILD_SA {child!r} on {ctx.client.name}")
    t0 = time.monotonic()
    deadline = t0 + timeout
    cp = swanctl(ctx, ctx.client, ["--rekey", "--child", child], check=False, timeout=timeout + 5)
    if cp.returncode != 0:
        raise StartupError(
            f"strongSwan: swanctl --rekey --child {child} failed (exit {cp.returncode})\n"
            + tail_of(cp.stdout + cp.stderr, 8)
        )
    while True:
        new = child_spis(ctx, ctx.client, ike) - before
        if new:
            return {
                "how": f"swanctl --rekey --child {child}",
                "before": " ".join(sorted(before)),
                "after": " ".join(sorted(new)),
                "seconds": round(time.monotonic() - t0, 3),
            }
        if time.monotonic() > deadline:
            raise StartupError(
                f"strongSwan: no new CHILD_SA {child!r} within {timeout:.0f} s of the rekey"
                + log_tails(ctx)
            )
        time.sleep(0.02)


def algorithms(ctx: TunnelContext, end: Endpoint) -> dict:
    cp = swanctl(ctx, end, ["--list-algs", "--raw"])
    for name, msg in parse_vici_raw(cp.stdout):
        if name == "get-algorithms reply":
            return msg
    return {}


def version(ctx: TunnelContext, end: Endpoint) -> str | None:
    for name, msg in parse_vici_raw(swanctl(ctx, end, ["--version", "--daemon", "--raw"]).stdout):
        if name == "version reply":
            return msg.get("version")
    return None


def negotiated(ike: dict, child: dict) -> list[str]:
    keys = (("encr-alg", "integ-alg", "prf-alg", "dh-group"), ("encr-alg", "integ-alg", "dh-group"))
    return [sa_[k] for sa_, ks in ((ike, keys[0]), (child, keys[1])) for k in ks if sa_.get(k)]


def deployed(ctx: TunnelContext) -> dict[str, dict[str, str]]:
    """The charon config files as written by start(), PSK redacted."""
    psk = (ctx.secrets_dir / PSK_FILE).read_text().strip()
    return {
        end.name: {
            rel: conf_path(ctx, end, rel).read_text().replace(psk, "<redacted:psk>")
            for rel in ("strongswan.conf", "swanctl.conf")
        }
        for end in ctx.ends()
    }


def stop(ctx: TunnelContext) -> None:
    """Terminate the IKE_SA over vici (the peer gets a DELETE), then each charon by PID
    (SIGTERM: charon removes its TUN device, routes and XFRM objects itself)."""
    d = daemon(ctx, ctx.client)
    if d is not None and d.alive():
        swanctl(
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


# ------------------------------------------------------------------------ helpers


def dataplane_of(strongswan_conf: str) -> str:
    m = re.search(r"^# lab: data-plane (\S+)$", strongswan_conf, re.MULTILINE)
    if not m:
        raise ConfigError("rendered strongswan.conf lacks its '# lab: data-plane' line")
    return m.group(1)


def provider(algs: dict, name: str) -> str | None:
    for group in algs.values():
        if isinstance(group, dict) and name in group:
            return group[name]
    return None


def host(addr: str | None) -> str:
    return (addr or "").split("/")[0]


def id_key(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "", name) or "x"


def tail_of(text: str, lines: int) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
