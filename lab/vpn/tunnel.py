"""Tunnel orchestration: from a lab and a profile to a tunnel that really passes traffic.

    prepare(spec, profile)  load the profile (a spec) or take it loaded (a Profile), place the
                            tunnel in the topology (place()), check (check_plan()) the
                            driver can run on the nodes that will run it -- before anything is
                            created (no lab node exists yet: this machine, whose namespaces
                            become the nodes, answers for them; see nodes_for())
    bring_up(lab, prepared) the TunnelPlan prepare() made: secrets -> render -> start -> wait
                            until a ping passes -> describe; the result is a TunnelRecord
                            (lab.vpn.record), in lab.json
    (lab.vpn.teardown.tear_down(lab) stops it again from its TunnelRecord, keeping the lab)
    render(spec, profile)   the config files per node, for `lab render` (no lab needed)

Placement is pure topology arithmetic: the VPN endpoints come from LabSpec.endpoints("vpn"), each
end's underlay address is its address nearest to the peer, the tunnel net is 10.99.0.0/24 +
fd99::/64 (client .1, server .2) or the user's own ([tunnel], lab.vpn.tunneladdr), and the networks behind each end (segments on its far side,
e.g. a router's LAN) are routed through the tunnel so traffic between the traffic endpoints
(LabSpec.endpoints("traffic")) crosses it.
"""

from __future__ import annotations

import ipaddress
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from lab.core.hostnode import this_machine
from lab.core.errors import (
    ConfigError,
    KernelFeatureMissing,
    PreconditionError,
    StartupError,
)
from lab.core.node import Daemon, Node
from lab.model.graph import reachable_segments
from lab.model.labspec import Interface, LabSpec
from lab.vpn import tunneladdr
from lab.vpn.base import Availability, Driver, Endpoint, TunnelContext, config_hash
from lab.vpn.profiles import Profile, load_profile
from lab.vpn.record import DaemonRecord, Timing, TrafficTarget, TunnelEnd, TunnelRecord
from lab.vpn.userconfig import hashes, tunnel_layout

TUNNEL_V4 = ipaddress.ip_network("10.99.0.0/24")
TUNNEL_V6 = ipaddress.ip_network("fd99::/64")
READY_TIMEOUT = 20.0
#: seconds between wait_ready's pings (iputils ping takes < 0.2 s from root only: the lab is root)
PROBE_S = 0.05
REDACTED = "<redacted:{}>"


@dataclass
class Side:
    """Where one end of the tunnel sits in the topology (pure data)."""

    node: str
    underlay_v4: str  # the address the peer reaches this end at
    underlay_v6: str | None
    underlay_prefix: int  # prefix length of underlay_v4 on its segment
    underlay_if: str  # this end's interface facing the peer
    behind: list[str]  # networks on this end's far side (v4 and v6)


@dataclass
class TunnelPlan:
    """A validated profile placed in a topology: everything bring_up needs, nothing started."""

    profile: Profile
    client: Side
    server: Side
    traffic_client: str
    traffic_server: str
    #: what Driver.check() said on the nodes (prepare() with kernel=True, render(), bring_up())
    availability: Availability | None = None

    @property
    def driver(self) -> Driver:
        return self.profile.driver

    def tunnel_addrs(self, side: Side) -> tuple[str, str]:
        return tunnel_addrs(
            self.driver, self.profile.configs, side, side is self.client, self.profile.tunnel
        )

    def traffic_target(self, spec: LabSpec) -> dict:
        """Where the traffic client sends to: the server's tunnel address, or a host behind it."""
        if self.traffic_server == self.server.node:
            v4, v6 = self.tunnel_addrs(self.server)
            return {"v4": v4.split("/")[0], "v6": v6.split("/")[0] or None}
        intf = _nearest_iface(spec, self.server.node, self.traffic_server)
        return {"v4": intf.ip.split("/")[0], "v6": intf.ip6.split("/")[0] if intf.ip6 else None}


# ------------------------------------------------------------------------------- placement


def tunnel_addrs(
    drv: Driver, configs: dict, side: Side, client: bool, table: dict | None = None
) -> tuple[str, str]:
    """(v4, v6 or "") tunnel addresses of one end, with prefix: the underlay's for a driver
    without a tunnel; the profile's [tunnel] `table` (the user's own addressing) where it has
    one; else the user's files (`configs`) decide the layout where a profile has them
    (OpenVPN's `server`: the server is .1)."""
    if not drv.has_tunnel:
        return f"{side.underlay_v4}/{side.underlay_prefix}", side.underlay_v6 or ""
    if table:
        return table["client" if client else "server"]
    hosts, v6 = (1, 2), True
    if configs:
        *hosts, v6 = tunnel_layout(drv.name, configs)
    host = hosts[0] if client else hosts[1]
    return (
        f"{TUNNEL_V4.network_address + host}/{TUNNEL_V4.prefixlen}",
        f"{TUNNEL_V6.network_address + host}/{TUNNEL_V6.prefixlen}" if v6 else "",
    )


def _nearest_iface(spec: LabSpec, frm: str, to: str) -> Interface:
    """The interface of `to` whose segment is fewest hops from `frm`."""
    reach = reachable_segments(spec.nodes, frm)
    best = [
        (reach[i.segment].hops, k, i)
        for k, i in enumerate(spec.nodes[to].interfaces)
        if i.segment in reach and i.ip
    ]
    if not best:
        raise ConfigError(f"host {to!r} is unreachable from {frm!r}", source=spec.source)
    return min(best, key=lambda t: t[:2])[2]


def end_side(spec: LabSpec, node: str, peer: str) -> Side:
    # my interface nearest to the peer: its address is what the peer sends to, and it faces
    # the peer; everything reachable from my other interfaces (not through the peer) is behind me
    mine = _nearest_iface(spec, peer, node)
    far = reachable_segments(spec.nodes, node, skip_ifs={mine.name}, blocked={peer})
    behind = []
    for seg in sorted(far):
        if seg != mine.segment:
            s = spec.segments[seg]
            behind += [s.v4, s.v6]
    return Side(
        node=node,
        underlay_v4=mine.ip.split("/")[0],
        underlay_v6=mine.ip6.split("/")[0] if mine.ip6 else None,
        underlay_prefix=int(mine.ip.split("/")[1]),
        underlay_if=mine.name,
        behind=behind,
    )


def plan(spec: LabSpec, profile: str | Profile) -> TunnelPlan:
    """place() for a profile spec as a command line gives it (NAME[:key=value,...], loaded and
    validated here) or a loaded Profile. Pure: nothing is touched."""
    return place(spec, load_profile(profile) if isinstance(profile, str) else profile)


def place(spec: LabSpec, profile: Profile) -> TunnelPlan:
    """Place the loaded profile's tunnel in `spec`. Pure: nothing is touched."""
    client, server = spec.endpoints("vpn")
    tc, ts = spec.endpoints("traffic")
    if profile.tunnel and profile.driver.has_tunnel:
        tunneladdr.collision(spec, profile.tunnel, str(profile.path))
    return TunnelPlan(
        profile, end_side(spec, client, server), end_side(spec, server, client), tc, ts
    )


def nodes_for(p: TunnelPlan, nodes: dict[str, Node] | None = None) -> dict[str, Node]:
    """{end node name: the Node that will run it}: `nodes` (a lab's, or a board substrate's)
    when given, else this machine for both ends."""
    if nodes is not None:
        return {n: nodes[n] for n in (p.client.node, p.server.node)}
    return {p.client.node: this_machine(), p.server.node: this_machine()}


def _distinct(nodes: dict[str, Node]) -> list[tuple[str, Node]]:
    """(end name, node) once per node object: two ends on one machine are asked once."""
    seen: list[tuple[str, Node]] = []
    for name, node in nodes.items():
        if not any(node is n for _, n in seen):
            seen.append((name, node))
    return seen


def check_on(drv: Driver, params: dict, nodes: dict[str, Node]) -> Availability:
    """Driver.check() on every node that will run an end (once per distinct node). Both ends
    must be able to run it and on the same data-plane path (a driver renders one config per
    path); the reason names the end when the nodes differ."""
    results = [(name, drv.check(params, node)) for name, node in _distinct(nodes)]
    if len(results) == 1:
        return results[0][1]
    bad = [(name, a) for name, a in results if not a.ok]
    if bad:
        return Availability(False, bad[0][1].path, "; ".join(f"{n}: {a.why}" for n, a in bad))
    paths = {a.path for _, a in results}
    if len(paths) > 1:
        return Availability(
            False,
            results[0][1].path,
            "the ends would use different data planes ("
            + ", ".join(f"{n}: {a.path}" for n, a in results)
            + "); choose one with the profile's parameters",
        )
    return results[0][1]


def missing_tools(drv: Driver, params: dict, nodes: dict[str, Node]) -> list[str]:
    """The profile's tools some node lacks ("tool" or, when the nodes differ, "tool on END")."""
    tools = drv.tools(params)
    distinct = _distinct(nodes)
    out = []
    for name, node in distinct:
        for t in node.missing_tools(tools):
            out.append(t if len(distinct) == 1 else f"{t} on {name}")
    return out


def prepare(
    spec: LabSpec,
    profile: str | Profile,
    *,
    kernel: bool = True,
    nodes: dict[str, Node] | None = None,
) -> TunnelPlan:
    """plan() plus check_plan(): the profile (a spec, loaded here, or a Profile) placed in
    `spec` and checked on the nodes that will run it."""
    return check_plan(spec, plan(spec, profile), kernel=kernel, nodes=nodes)


def check_plan(
    spec: LabSpec, p: TunnelPlan, *, kernel: bool = True, nodes: dict[str, Node] | None = None
) -> TunnelPlan:
    """`p` once the driver accepts the topology (an L2 technology needs both ends on one
    segment: ConfigError), every tool is present on the nodes and, with `kernel`, the driver can
    run on their kernels (KernelFeatureMissing). `nodes`: {end node name: Node} that will run
    the ends; default this machine (see nodes_for). kernel=False for a lab that will run in the
    full-kernel VM, which runs the host's tools on a kernel that has every feature."""
    drv, params = p.driver, p.profile.params
    drv.check_topology(spec, p)
    on = nodes_for(p, nodes)
    missing = missing_tools(drv, params, on)
    if missing:
        raise PreconditionError(
            f"profile {p.profile.name!r} needs {', '.join(missing)} (not on PATH); run ./setup.sh"
        )
    if kernel:
        avail = check_on(drv, params, on)
        if not avail.ok:
            raise KernelFeatureMissing(f"profile {p.profile.name!r} cannot run here: {avail.why}")
        p.availability = avail
    return p


def availability(profile: Profile, nodes: dict[str, Node] | None = None) -> dict:
    """For `lab profiles`: can this profile run here (on `nodes`, default this machine), on
    which data-plane path, why not."""
    drv = profile.driver
    on = nodes if nodes is not None else {"client": this_machine(), "server": this_machine()}
    missing = missing_tools(drv, profile.params, on)
    a = check_on(drv, profile.params, on)
    why = a.why
    if missing:
        why = f"missing tools: {', '.join(missing)}" + (f"; {why}" if why else "")
    return {"ok": a.ok and not missing, "path": a.path, "why": why}


# ------------------------------------------------------------------------------- context


def endpoint(side: Side, node, addrs: tuple[str, str]) -> Endpoint:
    """One end for a TunnelContext: its place `side`, its Node, its tunnel addresses (v4, v6)."""
    t4, t6 = addrs
    return Endpoint(
        name=side.node,
        node=node,
        underlay_v4=side.underlay_v4,
        underlay_v6=side.underlay_v6,
        tunnel_v4=t4,
        tunnel_v6=t6,
        behind=list(side.behind),
        underlay_if=side.underlay_if,
    )


def make_context(lab_id: str, p: TunnelPlan, nodes: dict, base: Path) -> TunnelContext:
    return TunnelContext(
        lab_id=lab_id,
        client=endpoint(p.client, nodes.get(p.client.node), p.tunnel_addrs(p.client)),
        server=endpoint(p.server, nodes.get(p.server.node), p.tunnel_addrs(p.server)),
        secrets_dir=base / "secrets",
        config_dir=base / "config" / "vpn",
        log_dir=base / "logs",
        profile=p.profile.name,
        dataplane=p.availability.path if p.availability else "",
        configs=dict(p.profile.configs),
    )


def secret_values(drv: Driver, secrets: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in secrets.items() if k in drv.secret_markers and v}


def redact(
    rendered: dict[str, dict[str, str]], secret: dict[str, str]
) -> dict[str, dict[str, str]]:
    """Every secret value replaced by <redacted:NAME> (longest first: a value may contain another)."""
    out = {}
    for node, files in rendered.items():
        out[node] = {}
        for rel, text in files.items():
            for name, value in sorted(secret.items(), key=lambda kv: -len(kv[1])):
                text = text.replace(value.strip(), REDACTED.format(name))
            out[node][rel] = text
    return out


def render(spec: LabSpec, profile: str | Profile, *, show_secrets: bool = False) -> dict:
    """Render a profile for a topology without a lab: fresh throwaway secrets, redacted. The
    data-plane path (which some drivers render) is the one check() finds on this machine."""
    p = plan(spec, profile)
    drv = p.driver
    p.availability = check_on(drv, p.profile.params, nodes_for(p))
    with tempfile.TemporaryDirectory(prefix="lab-render-") as tmp:
        ctx = make_context("render", p, {}, Path(tmp))
        secrets = drv.secrets(ctx, p.profile.params)
        rendered = drv.render(ctx, p.profile.params, secrets)
    shown = rendered if show_secrets else redact(rendered, secret_values(drv, secrets))
    return {
        "profile": p.profile.to_json(),
        "client": p.client.node,
        "server": p.server.node,
        "files": shown,
        "config_hash": config_hash(shown),
        "redacted": not show_secrets,
    }


def write_rendered(result: dict, out: Path) -> list[Path]:
    """`lab render --out DIR`: DIR/<node>/<file>; files holding secrets stay 0600."""
    written = []
    for node, files in result["files"].items():
        for rel, text in files.items():
            path = out / node / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            path.chmod(0o644 if result["redacted"] else 0o600)
            written.append(path)
    return written


# ------------------------------------------------------------------------------- bring-up


def bring_up(
    lab, p: TunnelPlan, *, cap_s: float | None = None, probe_s: float = PROBE_S
) -> TunnelRecord:
    """Start the tunnel of `p` (prepare()'s, or plan()'s where the nodes are asked here) in a
    running lab and wait until traffic passes it. One type: the profile is loaded, validated and
    placed before anything of the lab exists, and not again here.

    Records it (profile, driver, describe(), addresses, traffic target, timing: a TunnelRecord)
    in lab.json, before the daemons start and again once it is up. A daemon that dies or a
    tunnel that passes nothing raises StartupError with the daemons' log tails; the caller
    (lab.up) then unwinds the whole lab. `cap_s`: seconds from the driver's start() by which
    the first reply must have come (default: READY_TIMEOUT after start() returned); `probe_s`:
    wait_ready's ping interval (the `handshake` test's cold establishments set both).
    """
    t0 = time.monotonic()
    old = TunnelRecord.of(lab)
    if old is not None:
        raise PreconditionError(f"lab {lab.id!r} already has a VPN ({old.profile})")
    drv, params = p.driver, p.profile.params
    nodes = {p.client.node: lab.node(p.client.node), p.server.node: lab.node(p.server.node)}
    if p.availability is None:  # prepared without the kernel check: ask the lab's own nodes
        p.availability = check_on(drv, params, nodes)
    ctx = make_context(lab.id, p, nodes, lab.dir)
    record = TunnelRecord(
        profile=p.profile.name,
        driver=drv.name,
        client=p.client.node,
        server=p.server.node,
        params=params,
        overrides=p.profile.overrides,
    )
    record.store(lab)
    secrets = drv.secrets(ctx, params)
    rendered = drv.render(ctx, params, secrets)
    t_launch = time.monotonic()
    try:
        drv.start(ctx, params, rendered)
        # the board's data plane queues, held by a stand-in's sockets and TUN (lab.model.dpqueue)
        held = {n: q for n, nd in nodes.items() if (q := nd.hold_dataplane_queues(ctx.daemons))}
        record.queues = held or None
        addrs = [a for e in ctx.ends() for a in (e.tunnel_v4, e.tunnel_v6)]
        for node, argv in tunneladdr.tunnel_routes(lab.spec, drv, p.client, p.server, addrs):
            lab.node(node).run(argv)
        t_started = time.monotonic()
        left = READY_TIMEOUT if cap_s is None else max(0.0, cap_s - (t_started - t_launch))
        ready = wait_ready(ctx, p, timeout=left, probe_s=probe_s)
    except StartupError as e:
        # how long the tunnel had (the handshake test's "failed after N s")
        e.after_launch_s = round(time.monotonic() - t_launch, 1)
        raise
    finally:
        record.daemons = [DaemonRecord.of(d) for d in ctx.daemons]
        record.store(lab)
    t_ready = ready[4]  # the first packet through the tunnel
    desc = drv.describe(ctx, params)
    if not desc.get("config_hash"):
        # of the redacted files: equal configs hash equal across labs although keys differ
        desc["config_hash"] = config_hash(redact(rendered, secret_values(drv, secrets)))
    if p.profile.configs:  # the user's own files (docs/byoc.md): which ones, byte for byte
        desc["user_configs"] = hashes(p.profile.configs)
    record.state = "up"
    record.describe = desc
    record.path = desc.get("path")
    record.tunnel = {
        role: TunnelEnd(e.name, e.tunnel_v4, e.tunnel_v6, e.underlay_v4, e.behind)
        for role, e in (("client", ctx.client), ("server", ctx.server))
    }
    target = p.traffic_target(lab.spec)
    record.traffic = TrafficTarget(p.traffic_client, p.traffic_server, target["v4"], target["v6"])
    record.timing = Timing(
        start_s=round(t_started - t0, 3),
        ready_s=round(t_ready - t0, 3),
        ready_v6_s=round(ready[6] - t0, 3) if 6 in ready else None,
        ready_monotonic=t_ready,
        established_ms=round((t_ready - t_launch) * 1000, 1),
    )
    record.configs = sorted(f"{n}/{f}" for n, fs in rendered.items() for f in fs)
    record.store(lab)
    return record


def wait_ready(
    ctx: TunnelContext, p: TunnelPlan, *, timeout: float, probe_s: float = PROBE_S
) -> dict[int, float]:
    """Poll a ping from the client to the server's tunnel address, IPv4 then IPv6; returns
    {4: monotonic time of the first IPv4 reply, 6: ... IPv6}.

    One ping process per attempt asks for a single reply and sends every `probe_s` (50 ms), so
    readiness is seen within ~`probe_s` of the first packet passing; meanwhile every daemon is
    checked, and one that has died ends the wait at once with its log tail.
    """
    deadline = time.monotonic() + timeout
    times: dict[int, float] = {}
    for fam, addr in ((4, ctx.server.tunnel_v4), (6, ctx.server.tunnel_v6)):
        addr = addr.split("/")[0]
        if not addr:
            continue
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise StartupError(
                    f"tunnel {p.profile.name!r}: no reply from {addr} through the tunnel within "
                    f"{timeout:.0f} s" + _tails(ctx.daemons)
                )
            wait = str(max(1, min(int(left), 2)))
            pop = ctx.client.node.popen(
                ["ping", "-n", "-q", "-c", "1", "-i", f"{probe_s:g}", "-w", wait, addr],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            while pop.poll() is None:
                _check_daemons(ctx, p)
                if time.monotonic() > deadline:  # ping's -w counts whole seconds only
                    pop.kill()
                    pop.wait()
                    break
                time.sleep(0.005)
            if pop.returncode == 0:
                times[fam] = time.monotonic()
                break
            _check_daemons(ctx, p)
            time.sleep(0.02)
    return times


def _check_daemons(ctx: TunnelContext, p: TunnelPlan) -> None:
    dead = [d for d in ctx.daemons if not d.alive()]
    if dead:
        names = ", ".join(f"{d.name} on {d.node}" for d in dead)
        raise StartupError(
            f"tunnel {p.profile.name!r}: {names} exited during start-up" + _tails(dead)
        )


def _tails(daemons: list[Daemon], lines: int = 15) -> str:
    out = ""
    for d in daemons:
        tail = d.log_tail(lines)
        out += f"\n--- {d.name} on {d.node} ({d.log}) ---\n{tail or '(empty log)'}"
    return out
