"""L2TPv2 + PPP (study B's "PPP/L2TPv2 (xl2tpd)"): xl2tpd carries PPP sessions, pppd runs PPP.

The VPN server runs an LNS, the client a LAC that dials it at start (`autodial`). PPP assigns the
tunnel addresses (IPCP: the LNS hands out 10.99.0.1 and keeps 10.99.0.2), IPV6CP negotiates the
interface identifiers ::1/::2 and the lab adds fd99::1/64 and fd99::2/64 to ppp0. The client
authenticates with CHAP (MD5) and a secret generated per lab. Nothing is encrypted: the capture
test expects the plaintext marker inside L2TP on UDP 1701.

Data plane: `kernel` -- xl2tpd hands each session to the kernel (PPPoL2TP socket, l2tp_ppp) and
pppd drives ppp_generic (/dev/ppp); or `userspace` -- xl2tpd frames PPP itself over a pty to pppd
(ppp_generic still needed). This development host has neither PPP nor L2TP: check() says so and
the lab refuses with KernelFeatureMissing ("use --vm").

pppd reads fixed paths (/etc/ppp/options, /etc/ppp/chap-secrets, /etc/ppp/ip-up, ...) that no
option moves. Each lab node has its own mount namespace, so start() bind-mounts the node's
rendered ppp/ directory over /etc/ppp *inside that namespace* (refused if the node shares the
caller's mount namespace): pppd then sees only the lab's files, the machine's /etc stays as it
is, and the rendered files name the same paths a board uses. xl2tpd's own files are passed with
-c/-s/-p/-C; its pid file and control pipe live in the node's private /run.

pppd is a child of xl2tpd, not spawned by the lab: once the session is up start() asks the node
for xl2tpd's children and adopts each pppd (Node.adopt: PID + start time read on the node, and
on a lab node a ledger line), stop() ends it by that PID if xl2tpd's SIGTERM did not, and a full
`lab down` ends it as a member of the node's cgroup.
"""

from __future__ import annotations

import json
import re
import secrets as pysecrets
import time
from pathlib import Path
from typing import ClassVar

from lab.core.errors import PreconditionError, StartupError, TeardownIncomplete
from lab.core.node import Daemon, Node
from lab.vpn.base import (
    Availability,
    Driver,
    Endpoint,
    TunnelContext,
    route_through,
    write_secret,
    render_template,
)
from lab.core.tools import IP, PING, Tool
from lab.model.params import Param
from lab.vpn.kernelfeatures import missing_features

IFNAME = "ppp0"  # `unit 0`: ppp units are per network namespace
PPP_DIR = "/etc/ppp"  # what pppd reads; in a node, the lab's ppp/ directory is mounted here
#: xl2tpd's pid file and control pipe, in the node's private /run (xl2tpd removes both on
#: SIGTERM); pppd's TDB and, after a SIGKILL, its pid file
PID_FILE = "/run/lab-xl2tpd.pid"
CONTROL = "/run/lab-xl2tpd.control"
RUN_FILES = (PID_FILE, CONTROL, "/run/pppd2.tdb", f"/run/{IFNAME}.pid")
PPP_NAMES = {"client": "lab-lac", "server": "lab-lns"}
IPV6_IDS = {"client": 1, "server": 2}
#: kernel features: (what, /proc/config.gz symbols, modules)
PPP = ("PPP", ("CONFIG_PPP",), ("ppp_generic",))
L2TP = ("L2TP", ("CONFIG_PPPOL2TP",), ("l2tp_ppp",))
LOG_KERNEL = "Using l2tp kernel support."
LOG_NO_KERNEL = "L2TP kernel support not detected"


def kernel_features(node: Node, dataplane: str) -> list[str]:
    """What the node's kernel lacks for `dataplane` (empty: all there), without changing
    anything."""
    need = [PPP, L2TP] if dataplane == "kernel" else [PPP]
    return [
        f"{what} ({sym[0]}, module {mod[0]})" for what, sym, mod in missing_features(node, need)
    ]


class L2TPDriver(Driver):
    name = "l2tp"
    params: ClassVar[dict[str, Param]] = {
        "dataplane": Param(
            str,
            "kernel",
            "kernel: PPPoL2TP (l2tp_ppp); userspace: xl2tpd frames PPP over a pty",
            choices=("kernel", "userspace"),
        ),
        "port": Param(int, 1701, "L2TP UDP port (both ends)", min=1, max=65535),
        "mtu": Param(int, 1400, "PPP MTU (ppp0); 1460 is the most 1500 carries", min=576, max=1500),
        "mru": Param(int, 1400, "PPP MRU", min=576, max=1500),
        "ipv6": Param(bool, True, "IPV6CP + fd99::/64 on ppp0 (false: IPv4 only)"),
        "compression": Param(
            str, "none", "PPP CCP compression", choices=("none", "deflate", "bsdcomp")
        ),
        "vj": Param(bool, False, "Van Jacobson TCP/IP header compression"),
        "lcp_echo_interval": Param(
            int, 30, "LCP echo every N s (Debian's default)", min=0, max=3600
        ),
        "lcp_echo_failure": Param(int, 4, "link down after N missed echoes", min=0, max=100),
        "start_timeout": Param(
            float, 30.0, "seconds for the PPP session to come up (TCG VMs are slow)", min=1, max=600
        ),
    }
    secret_markers = ("chap_secret",)
    requires = (
        Tool("xl2tpd", "xl2tpd", ("xl2tpd", "-v"), board=True),
        Tool("pppd", "ppp", ("pppd", "--version"), board=True),
        IP,
        PING,
        Tool("mount", "mount"),
        Tool("umount", "mount"),
    )

    def check(self, params: dict, node: Node) -> Availability:
        missing = kernel_features(node, params["dataplane"])
        if missing:
            return Availability(
                False,
                params["dataplane"],
                f"needs kernel {' and '.join(missing)}, which this kernel lacks; use --vm",
            )
        return Availability(True, params["dataplane"])

    # ---------------------------------------------------------------- secrets and configs
    def secrets(self, ctx: TunnelContext, params: dict) -> dict[str, str]:
        secret = pysecrets.token_hex(16)
        write_secret(ctx.secrets_dir, "l2tp-chap-secret", secret + "\n")
        return {"chap_secret": secret}

    def render(self, ctx: TunnelContext, params: dict, secrets: dict[str, str]) -> dict:
        rendered = {}
        for role, end in (("client", ctx.client), ("server", ctx.server)):
            peer = ctx.peer(end)
            peer_role = "server" if role == "client" else "client"
            values = {
                "node": end.name,
                "role": role,
                "profile": ctx.profile or self.name,
                "dataplane": params["dataplane"],
                "port": params["port"],
                "local": end.underlay_v4,
                "remote": peer.underlay_v4,
                "local_tunnel": _host(end.tunnel_v4),
                "remote_tunnel": _host(peer.tunnel_v4),
                "tunnel_v6": end.tunnel_v6,
                "ppp_name": PPP_NAMES[role],
                "peer_ppp_name": PPP_NAMES[peer_role],
                "ppp_dir": PPP_DIR,
                "mtu": params["mtu"],
                "mru": params["mru"],
                "compression": params["compression"],
                "vj": params["vj"],
                "lcp_echo_interval": params["lcp_echo_interval"],
                "lcp_echo_failure": params["lcp_echo_failure"],
                "ipv6": params["ipv6"] and bool(end.tunnel_v6),
                "ipv6_local_id": IPV6_IDS[role],
                "ipv6_remote_id": IPV6_IDS[peer_role],
                "client_name": PPP_NAMES["client"],
                "server_name": PPP_NAMES["server"],
                "client_ip": _host(ctx.client.tunnel_v4),
                "secret": secrets["chap_secret"],
            }
            rendered[end.name] = {
                "xl2tpd.conf": render_template("l2tp/xl2tpd.conf.j2", **values),
                "ppp/options": render_template("l2tp/options.j2", **values),
                "ppp/options.xl2tpd": render_template("l2tp/options.xl2tpd.j2", **values),
                "ppp/chap-secrets": render_template("l2tp/chap-secrets.j2", **values),
            }
        return rendered

    # ---------------------------------------------------------------- running
    def start(self, ctx: TunnelContext, params: dict, rendered: dict) -> None:
        deadline = time.monotonic() + params["start_timeout"]
        for end in (ctx.server, ctx.client):
            paths = ctx.write_config(end, rendered[end.name])
            _mount_ppp_dir(end, paths["ppp/options"].parent)
        # the LNS first, and only once it listens: the LAC dials as soon as it starts
        for end in (ctx.server, ctx.client):
            conf = ctx.config_dir / end.name / "xl2tpd.conf"
            argv = ["xl2tpd", "-D", "-c", str(conf), "-s", "/dev/null", "-p", PID_FILE]
            d = end.node.spawn("xl2tpd", [*argv, "-C", CONTROL])
            ctx.daemons.append(d)
            _wait_log(ctx, end, d, ("Listening on IP address",), deadline)
            _check_path(end, d, params["dataplane"])
        for end in (ctx.client, ctx.server):
            self._wait_session(ctx, end, params, deadline)
        for end in ctx.ends():
            if params["ipv6"] and end.tunnel_v6:
                end.node.run(["ip", "-6", "addr", "replace", end.tunnel_v6, "dev", IFNAME, "nodad"])
            if ctx.peer(end).behind:
                route_through(end, ctx.peer(end), IFNAME)

    def _wait_session(self, ctx: TunnelContext, end: Endpoint, params: dict, deadline: float):
        """Until ppp0 carries this end's IPCP address (and, with IPv6, its IPV6CP link-local
        one); then record the pppd that xl2tpd started for it."""
        want = [_host(end.tunnel_v4)]
        if params["ipv6"] and end.tunnel_v6:
            role = "client" if end is ctx.client else "server"
            want.append(f"fe80::{IPV6_IDS[role]}")
        xl2tpd = _daemon(ctx, end, "xl2tpd")
        while True:
            cp = end.node.run(["ip", "-j", "addr", "show", "dev", IFNAME], check=False)
            have = set()
            if cp.returncode == 0:
                for link in json.loads(cp.stdout or "[]"):
                    have |= {a["local"] for a in link.get("addr_info", [])}
            if all(w in have for w in want):
                break
            dead = [d for d in ctx.daemons if not d.alive()]
            if dead or time.monotonic() > deadline:
                what = f"{dead[0].name} on {dead[0].node} exited" if dead else "timed out"
                raise StartupError(
                    f"l2tp: {IFNAME} on {end.name} never got {', '.join(want)} ({what})\n"
                    + xl2tpd.log_tail(25)
                )
            time.sleep(0.05)
        for pid in end.node.children(xl2tpd.pid):
            ctx.daemons.append(end.node.adopt("pppd", pid, log=xl2tpd.log))

    def describe(self, ctx: TunnelContext, params: dict) -> dict:
        node = ctx.client.node
        link = json.loads(node.run(["ip", "-j", "link", "show", "dev", IFNAME]).stdout)[0]
        pppd_v = node.run(["pppd", "--version"], check=False)
        xl2tpd_v = node.run(["xl2tpd", "-v"], check=False)
        versions = {
            "xl2tpd": _version(xl2tpd_v.stdout + xl2tpd_v.stderr, r"xl2tpd-(\S+)"),
            "pppd": _version(pppd_v.stdout + pppd_v.stderr, r"pppd version (\S+)"),
        }
        logs = {
            end.name: (
                _daemon(ctx, end, "xl2tpd").log_tail(400) if _daemon(ctx, end, "xl2tpd") else ""
            )
            for end in ctx.ends()
        }
        client_log = logs[ctx.client.name]
        return {
            "implementation": "xl2tpd + pppd",
            "version": f"xl2tpd {versions['xl2tpd']}, pppd {versions['pppd']}",
            "versions": versions,
            "path": _path_of(client_log) or params["dataplane"],
            "kernel_modules": ["l2tp_ppp", "ppp_generic"]
            if params["dataplane"] == "kernel"
            else ["ppp_generic"],
            "cipher": "none",
            "auth": "CHAP (MD5)",
            "auth_confirmed": "CHAP authentication succeeded" in client_log,
            "interface": IFNAME,
            "mtu": int(link["mtu"]),
            "mru": params["mru"],
            "compression": params["compression"],
            "compression_negotiated": _compression(client_log),
            "vj": params["vj"],
            "ipv6": (
                "IPV6CP interface ids ::1/::2; fd99::/64 added to ppp0 by the lab"
                if params["ipv6"]
                else "off (IPv4 only)"
            ),
            "l2tp": {"version": 2, "port": params["port"], "lns": ctx.server.name},
        }

    def stop(self, ctx: TunnelContext, params: dict) -> None:
        """SIGTERM each xl2tpd (it sends StopCCN and ends its pppd), then any pppd still alive
        by its recorded PID; unmount /etc/ppp in the nodes and remove the /run files. Raises
        TeardownIncomplete listing what remains."""
        for name in ("xl2tpd", "pppd"):
            for d in [d for d in reversed(ctx.daemons) if d.name == name]:
                node = ctx.client.node if d.node == ctx.client.name else ctx.server.node
                if name == "pppd":  # xl2tpd's SIGTERM usually ended it already
                    _wait_gone(d, 3.0)
                node.stop(d)
                ctx.daemons.remove(d)
        left = []
        for end in ctx.ends():
            left += _cleanup(end)
        if left:
            raise TeardownIncomplete(left)


# ------------------------------------------------------------------------ helpers


def _host(addr: str | None) -> str:
    return (addr or "").split("/")[0]


def _daemon(ctx: TunnelContext, end: Endpoint, name: str) -> Daemon | None:
    return next((d for d in ctx.daemons if d.node == end.name and d.name == name), None)


def _mount_ppp_dir(end: Endpoint, src: Path) -> None:
    """Bind the node's rendered ppp/ directory over /etc/ppp in the node's mount namespace.

    Only where the node says its mounts are its own (Node.private_mounts(): a lab node's
    private mount namespace); on any other node the mount would change the machine's /etc/ppp.
    """
    if not end.node.private_mounts():
        raise PreconditionError(
            f"node {end.name} has no mount namespace of its own: refusing to mount over "
            f"{PPP_DIR} (pppd reads its options and chap-secrets only from there)"
        )
    if end.node.run(["test", "-d", PPP_DIR], check=False).returncode != 0:
        raise PreconditionError(f"{PPP_DIR} missing on {end.name} (is ppp installed?)")
    end.node.run(["mount", "--bind", str(src), PPP_DIR])


def _is_mounted(end: Endpoint) -> bool:
    info = end.node.run(["cat", "/proc/self/mountinfo"], check=False).stdout
    return any(line.split()[4] == PPP_DIR for line in info.splitlines() if len(line.split()) > 4)


def _wait_log(ctx, end: Endpoint, d: Daemon, needles: tuple[str, ...], deadline: float) -> None:
    while True:
        text = d.log_text()
        if any(n in text for n in needles):
            return
        if not d.alive() or time.monotonic() > deadline:
            what = "exited" if not d.alive() else "did not start listening"
            raise StartupError(f"xl2tpd on {end.name} {what}\n{d.log_tail(20)}")
        time.sleep(0.02)


def _path_of(log: str) -> str | None:
    if LOG_KERNEL in log:
        return "kernel"
    if LOG_NO_KERNEL in log or "Not looking for kernel support" in log:
        return "userspace"
    return None


def _check_path(end: Endpoint, d: Daemon, dataplane: str) -> None:
    """xl2tpd falls back to its userspace data plane without a word beyond its log: insist on
    the path the profile asked for."""
    ran = _path_of(d.log_text())
    if ran is not None and ran != dataplane:
        raise StartupError(
            f"xl2tpd on {end.name} runs the {ran} data plane, the profile asks for {dataplane} "
            f"(kernel L2TP needs l2tp_ppp)\n{d.log_tail(10)}"
        )


def _wait_gone(d: Daemon, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while d.alive() and time.monotonic() < deadline:
        time.sleep(0.02)


def _cleanup(end: Endpoint) -> list[str]:
    """Remove what the tunnel leaves in a node; returns what still remains."""
    n = end.node
    left = []
    cp = n.run(["ip", "-j", "link", "show", "type", "ppp"], check=False)
    for link in json.loads(cp.stdout or "[]") if cp.returncode == 0 else []:
        left.append(f"{end.name}: interface {link['ifname']}")
    n.run(["umount", PPP_DIR], check=False)  # exit 32 when not mounted: judged below
    if _is_mounted(end):
        left.append(f"{end.name}: mount {PPP_DIR}")
    if n.run(["rm", "-f", *RUN_FILES], check=False).returncode != 0:
        left.append(f"{end.name}: files in /run ({', '.join(RUN_FILES)})")
    return left


def _version(text: str, rx: str) -> str | None:
    m = re.search(rx, text)
    return m.group(1) if m else None


def _compression(log: str) -> str | None:
    m = re.findall(r"(\S+ \(\d+\)) compression enabled", log)
    return m[-1] if m else None
