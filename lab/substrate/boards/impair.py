"""Impairment on boards: kernel netem on the board that forwards where its kernel has sch_netem,
else the lab's engine (lab-impaird) run on that board, as a local lab falls back to it.

The engine on a board sits in a bump network namespace made on the board and spliced into the
data port it impairs (the middlebox's port towards the VPN server; lab.substrate.local.impair.splice_side
picks the same side as on a local lab): the port itself moves into the bump (as `imp-a` or
`imp-b`, keeping its ifindex, MAC and cable), and a veth with the port's name, MAC and MTU takes
its place with the port's addresses and routes. The engine forwards between the two in the bump:
one engine hop carries both directions. IPv6 is off in the bump, so the moved port answers
nothing itself. The same splice serves `lab up --boards --impair` and the first `lab impair set`
on a board lab built without it (the tunnel endpoints' boards are never touched).

Recorded before each step (lab.substrate.boards.lab explains the ledger): `board-netns` (the bump),
`board-splice` (the port's ifindex, its state and its per-interface sysctls, which a move
between namespaces resets to the namespace's defaults), the engine as a `process`. Restore
(lab.substrate.boards.restore) stops the engine, deletes the veth (a link the snapshot did not have),
moves the port back by ifindex under its name, writes its sysctls back and deletes the bump.

The engine binary must be on the board: `lab-impaird` on the board's PATH, else this machine's
build at the same path (an emulated farm shares this machine's files); docs/boards.md says
how to build and install it on a board of another architecture.
"""

from __future__ import annotations

import json
import shlex
import time

from lab.core.errors import PreconditionError, StartupError
from lab.impair import runtime
from lab.model.impairment.directional import needs_engine
from lab.impair.engine import BUILD_COMMAND, NodeEngineClient, engine_binary
from lab.impair.kernel import probe_netem
from lab.substrate.local.impair import splice_side
from lab.model.labspec import LabSpec
from lab.substrate.boards.snapshot import DEFAULT_QDISCS

ENGINE = "lab-impaird"
#: where docs/boards.md installs the engine on a board (on the PATH of a root login)
BOARD_ENGINE_PATH = "/usr/local/bin/lab-impaird"
#: a port's per-interface sysctls (a move between namespaces resets them to its defaults)
SYSCTL_DIRS = ("/proc/sys/net/ipv4/conf/{}", "/proc/sys/net/ipv6/conf/{}")


def find_engine(node) -> tuple[str | None, str]:
    """(path of a lab-impaird the board can run, how it was found) or (None, why not)."""
    candidates = []
    cp = node.run(["sh", "-c", f"PATH=\"$PATH:/usr/local/bin\"; command -v {ENGINE}"],
                  check=False, timeout=30)  # fmt: skip
    if cp.returncode == 0 and cp.stdout.strip():
        candidates.append((cp.stdout.strip(), "on the board's PATH"))
    try:
        candidates.append((engine_binary(), "this machine's build, at the same path"))
    except PreconditionError:
        pass
    tried = []
    for path, how in candidates:
        cp = node.run([path, "--version"], check=False, timeout=30)
        if cp.returncode == 0:
            return path, f"{path} ({how}; {(cp.stdout or cp.stderr).strip()})"
        tried.append(f"{path}: {(cp.stderr.strip() or f'exit {cp.returncode}')[-120:]}")
    return None, (
        f"no {ENGINE} the board can run ({'; '.join(tried) or 'none on its PATH'}); build it for "
        f"the board's architecture ({BUILD_COMMAND}, with --target for another one) and install "
        f"it as {BOARD_ENGINE_PATH} (docs/boards.md, 'Impairment on boards')"
    )


def impairment_path(node) -> dict:
    """Which impairment path this board would take (`lab boards check`): {"ok", "path":
    "kernel-netem" | "userspace" | None, "why"}."""
    pr = probe_netem(node)
    if pr.ok:
        return {"ok": True, "path": "kernel-netem", "why": pr.reason}
    path, how = find_engine(node)
    if path is not None:
        return {"ok": True, "path": "userspace",
                "why": f"kernel netem unavailable ({pr.reason}); the engine: {how}"}  # fmt: skip
    return {"ok": False, "path": None, "why": f"{pr.reason}; {how}"}


def choose(lab, spec: LabSpec, impair: str, placement) -> tuple[runtime.ImpairPlan, dict]:
    """The impairment plan for boards: kernel netem when every point's board has sch_netem,
    else the engine on the board of each engine link's splice side. Returns the plan and
    {node: engine path}; refuses, naming the board and what it lacks, when neither can run."""
    iplan = runtime.plan_for(spec, placement, impair, "kernel-netem", "boards: kernel netem")
    lacking = {}
    a, b = spec.endpoints("vpn")
    if needs_engine(impair, a=a, b=b):  # netem has no trace-driven link
        lacking[iplan.points[0].node] = "a trace-driven link (trace) needs the lab's engine"
    for p in iplan.points:
        pr = probe_netem(lab.node(p.node))
        if not pr.ok:
            lacking.setdefault(p.node, pr.reason)
    if not lacking:
        return iplan, {}
    node, reason = next(iter(lacking.items()))
    why = (
        f"board {lab.board(node).name}: kernel netem unavailable ({reason}); using the lab's "
        "engine on the board"
    )
    iplan = runtime.plan_for(spec, iplan.placement, impair, "userspace", why)
    paths = {}
    for link in iplan.engine_links:
        name, _ = splice_side(spec, link)
        path, how = find_engine(lab.node(name))
        if path is None:
            raise PreconditionError(
                f"board {lab.board(name).name} ({name}): {reason}, and {how}; impairment on a "
                "board is kernel netem (load sch_netem there) or the lab's engine"
            )
        paths[name] = path
        iplan.why += f"; {name}: {how}"
    return iplan, paths


def apply(lab, spec: LabSpec, impair: str, placement, *, at_run_time: bool = False) -> None:
    """Give the board lab its impairment points and put `impair` in force (build time, or the
    first `lab impair set`: at_run_time)."""
    iplan, paths = choose(lab, spec, impair, placement)
    st = runtime.plan_json(iplan)
    if at_run_time:
        st["added_at_run_time"] = True
    lab.info["impair"] = st
    lab.save()
    if iplan.backend == "userspace":
        for link in iplan.engine_links:
            node_name, _ = splice_side(spec, link)
            _splice(lab, spec, link)
            _start_engine(lab, st["engines"][-1], paths[node_name])
        lab.save()
    else:
        _netem_points(lab, spec, iplan)
    for lk in spec.links:
        if lk.impair:
            runtime.set_base(lab, lk.impair, f"{lk.node1}-{lk.node2}")
    runtime.set_point(lab, iplan.initial)


def _netem_points(lab, spec: LabSpec, iplan) -> None:
    """Offloads off on the impaired links and the root qdiscs netem replaces, each recorded."""
    for idx in sorted({p.link for p in iplan.points}):
        lk = spec.links[idx]
        for name, ifname in ((lk.node1, lk.intf1), (lk.node2, lk.intf2)):
            node = lab.node(name)
            cp = node.run(["ethtool", "-k", ifname], check=False)
            feats = {}
            for line in cp.stdout.splitlines()[1:]:
                k, _, v = line.strip().partition(": ")
                if k and v.split(" ")[0] in ("on", "off") and "[fixed]" not in v:
                    feats[k] = v.split(" ")[0]
            lab.ledger.record("board-offloads", node=name, ifname=ifname, features=feats)
            node.run(["ethtool", "-K", ifname, *runtime.OFFLOADS_OFF], check=False)
    for p in iplan.points:
        node = lab.node(p.node)
        cp = node.run(["tc", "-j", "qdisc", "show", "dev", p.ifname, "root"])
        prev = [q for q in json.loads(cp.stdout or "[]") if q.get("root")]
        default = node.run(["cat", "/proc/sys/net/core/default_qdisc"], check=False).stdout
        lab.ledger.record(
            "board-qdisc", node=p.node, ifname=p.ifname, prev=prev, default=default.strip()
        )


def read_port(node, ifname: str) -> dict:
    """What lives on the port and dies with it (lab.core.netops.read_interface, read with ip -j on a
    board): ifindex, MAC, MTU, up, addresses (not IPv6 link-local) and routes through it that
    someone added (not the kernel's); and its per-interface sysctls."""
    link = json.loads(node.run(["ip", "-j", "link", "show", "dev", ifname]).stdout)[0]
    addrs = [
        f"{x['local']}/{x['prefixlen']}"
        for a in json.loads(node.run(["ip", "-j", "addr", "show", "dev", ifname]).stdout)
        for x in a.get("addr_info", [])
        if not (x.get("family") == "inet6" and x.get("scope") == "link")
    ]
    routes = []
    for fam in ("-4", "-6"):
        out = node.run(["ip", "-j", fam, "route", "show", "table", "all", "dev", ifname]).stdout
        for r in json.loads(out or "[]"):
            if (
                r.get("protocol") == "kernel"
                or r.get("table") == "local"
                or "dst" in r
                and (r["dst"].startswith(("fe80::", "ff00::", "multicast")))
            ):
                continue
            argv = ["ip", fam, "route", "add", r["dst"]]
            if r.get("gateway"):
                argv += ["via", r["gateway"]]
            argv += ["dev", ifname]
            for key, word in (("table", "table"), ("metric", "metric"), ("protocol", "proto")):
                if r.get(key) not in (None, "main", "boot"):
                    argv += [word, str(r[key])]
            routes.append(argv)
    qdiscs = json.loads(node.run(["tc", "-j", "qdisc", "show", "dev", ifname]).stdout or "[]")
    dirs = " ".join(shlex.quote(d.format(ifname)) for d in SYSCTL_DIRS)
    cp = node.run(["sh", "-c", f"grep -r . {dirs} 2>/dev/null"], check=False, timeout=30)
    sysctls = dict(ln.split(":", 1) for ln in cp.stdout.splitlines() if ":" in ln)
    return {
        "ifindex": link["ifindex"], "mac": link["address"], "mtu": link["mtu"],
        "up": "UP" in link.get("flags", []), "addrs": addrs, "routes": routes,
        "sysctls": sysctls, "qdiscs": qdiscs,
    }  # fmt: skip


def qdisc_argvs(board: str, ifname: str, qdiscs: list[dict], default: str) -> list[list[str]]:
    """tc commands (without `dev`) that re-create the port's qdiscs after a move between
    namespaces, which resets them to the kernel's default: nothing for the kernel's own
    (noqueue, pfifo_fast, mq, net.core.default_qdisc), a root tbf (a board's or the emulated
    farm's shaping of the cable) with its rate, burst and latency or limit. Anything else is
    refused before the splice, naming it."""
    out = []
    for q in qdiscs:
        kind, opts = q.get("kind"), q.get("options") or {}
        if kind in DEFAULT_QDISCS | {default}:
            continue
        if kind == "tbf" and q.get("root") and {"rate", "burst"} <= set(opts):
            argv = ["root", "handle", q["handle"], "tbf", "rate", f"{int(opts['rate']) * 8}bit",
                    "burst", str(opts["burst"]).split("/")[0]]  # fmt: skip
            if "lat" in opts:
                argv += ["latency", f"{opts['lat']}us"]
            else:
                argv += ["limit", str(opts.get("limit", 10000))]
            out.append(argv)
            continue
        raise PreconditionError(
            f"board {board}: qdisc {kind} on {ifname} (handle {q.get('handle')}) would be lost: "
            "the engine's splice moves the port between network namespaces, which resets its "
            "qdiscs, and the lab re-creates only a root tbf; remove it, or load sch_netem on the "
            "board so that impairment is kernel netem"
        )
    return out


def _splice(lab, spec: LabSpec, link: int) -> None:
    lk = spec.links[link]
    name, ifname = splice_side(spec, link)
    node = lab.node(name)
    ns = runtime.bump_ns(lab.id, link)
    # the bump's end towards node1 is imp-a, towards node2 imp-b (engine_fwd_dir counts on it)
    near, far = (
        (runtime.BUMP_A, runtime.BUMP_B) if name == lk.node1 else (runtime.BUMP_B, runtime.BUMP_A)
    )
    lab.ledger.record("board-netns", node=name, name=ns)
    node.run(["ip", "netns", "add", ns])
    # IPv6 off in the bump before the port arrives: the port keeps its MAC and must not answer
    # neighbour solicitations for the link-local address its successor now owns
    node.run(["ip", "netns", "exec", ns, "sh", "-c",
              "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6; "
              "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6"])  # fmt: skip
    state = read_port(node, ifname)
    default = node.run(["cat", "/proc/sys/net/core/default_qdisc"], check=False).stdout.strip()
    state["tc"] = qdisc_argvs(lab.board(name).name, ifname, state.pop("qdiscs"), default)
    lab.ledger.record(
        "board-splice", node=name, ifname=ifname, netns=ns, moved=far, near=near, state=state
    )
    q = shlex.quote
    mtu = str(state["mtu"])
    # The port moves first, into a namespace holding only lo, so it keeps its ifindex (the
    # kernel renumbers a device whose index is taken), and comes back with it at restore.
    lines = [
        "set -e",
        f"ip link set dev {q(ifname)} down",
        f"ip link set dev {q(ifname)} netns {q(ns)}",
        f"ip -n {q(ns)} link set dev {q(ifname)} name {far} up",
        f"ip link add {q(ifname)} address {state['mac']} mtu {mtu} type veth peer name {near} "
        f"netns {q(ns)} mtu {mtu}",
        f"ip -n {q(ns)} link set dev {near} up",
        # the cable's shaping stays with the port that feeds the cable
        *(f"tc -n {q(ns)} qdisc add dev {far} {shlex.join(a)}" for a in state["tc"]),
    ]
    if state["up"]:
        lines.append(f"ip link set dev {q(ifname)} up")
    for k, v in state["sysctls"].items():  # forwarding, accept_dad, ... as the port had them
        if "/ipv6/" in k or "/ipv4/" in k:
            lines.append(f"echo {q(v)} > {q(k)} 2>/dev/null || true")
    for cidr in state["addrs"]:
        lines.append(f"ip addr add {cidr} dev {q(ifname)}" + (" nodad" if ":" in cidr else ""))
    lines += [shlex.join(r) for r in state["routes"]]
    node.run(["sh", "-c", "\n".join(lines)], timeout=30)
    lab.info["impair"]["engines"].append(
        {
            "name": f"imp{link}",
            "link": link,
            "board_node": name,
            "netns": ns,
            "a": f"{lk.node1}:{lk.intf1}",
            "b": f"{lk.node2}:{lk.intf2}",
            "spliced": f"{name}:{ifname}",
        }
    )


def _start_engine(lab, eng: dict, path: str, timeout: float = 10.0) -> None:
    """Start the engine in the bump on the board, as pass-through; wait until it answers."""
    node = lab.node(eng["board_node"])
    idir = lab.dir / "impair"
    node.run(["mkdir", "-p", "-m", "0700", str(idir)])
    control = str(idir / f"{eng['name']}.sock")
    eng["control"] = control
    eng["fwd_dir"] = runtime.engine_fwd_dir(lab.spec, eng["link"])
    argv = ["ip", "netns", "exec", eng["netns"], path, "--a", runtime.BUMP_A, "--b",
            runtime.BUMP_B, "--control", control]  # fmt: skip
    d = node.spawn(ENGINE, argv)
    eng["pid"], eng["start_time"] = d.pid, d.start_time
    lab.save()
    client = NodeEngineClient(node, control)
    deadline = time.monotonic() + timeout
    while True:
        try:
            eng["version"] = client.ping()
            return
        except StartupError as e:
            if not d.alive() or time.monotonic() > deadline:
                raise StartupError(
                    f"board {lab.board(eng['board_node']).name}: {ENGINE} did not answer "
                    f"({e})\n{d.log_tail()}"
                ) from e
        time.sleep(0.05)


def unsplice(node, e: dict) -> list[str]:
    """Undo a board-splice entry: the veth gone, the port (found by ifindex in the bump) back
    under its name with its sysctls. Returns what could not be done."""
    st, ns, ifname = e["state"], e["netns"], e["ifname"]
    cp = node.run(["ip", "-n", ns, "-j", "link", "show"], check=False)
    inside = json.loads(cp.stdout or "[]") if cp.returncode == 0 else []
    port = next((ln for ln in inside if ln["ifindex"] == st["ifindex"]), None)
    cp = node.run(["ip", "-j", "link", "show", "dev", ifname], check=False)
    here = json.loads(cp.stdout or "[]") if cp.returncode == 0 else []
    if here and here[0]["ifindex"] != st["ifindex"]:  # the veth that took the port's place
        node.run(["ip", "link", "del", "dev", ifname], check=False)
    if port is not None:
        # the port's target is the namespace of the shell that runs this (the board's own):
        # `ip -n` enters the bump, and `netns PID` names the namespace of that PID
        node.run(["sh", "-c", f'ip -n {shlex.quote(ns)} link set dev "$1" netns $$', "sh",
                  port["ifname"]])  # fmt: skip
        node.run(["ip", "link", "set", "dev", port["ifname"], "name", ifname], check=False)
    cp = node.run(["ip", "-j", "link", "show", "dev", ifname], check=False)
    back = json.loads(cp.stdout or "[]") if cp.returncode == 0 else []
    if not back or back[0]["ifindex"] != st["ifindex"]:
        return [f"{ifname} (ifindex {st['ifindex']}) not back from the bump {ns}"]
    lines = [f"echo {shlex.quote(v)} > {shlex.quote(k)} 2>/dev/null || true"
             for k, v in st["sysctls"].items()]  # fmt: skip
    lines += [
        f"tc qdisc replace dev {shlex.quote(ifname)} {shlex.join(a)}" for a in st.get("tc", [])
    ]
    if lines:
        node.run(["sh", "-c", "\n".join(lines)], check=False)
    return []


def remove_bump(node, ns: str, port_ifindex: int | None) -> list[str]:
    """Delete the bump namespace unless the spliced port (`port_ifindex`) is still in it:
    deleting a namespace returns a physical port to the board's first namespace but destroys a
    veth, and an emulated board's "cable" is one. Returns what was left."""
    cp = node.run(["ip", "-n", ns, "-j", "link", "show"], check=False)
    if cp.returncode != 0:
        return []  # not there (never made, or already deleted)
    inside = json.loads(cp.stdout or "[]")
    kept = [ln["ifname"] for ln in inside if ln["ifindex"] == port_ifindex]
    if kept:
        return [f"network namespace {ns} still holds the port {kept[0]}: not deleted"]
    node.run(["ip", "netns", "del", ns], check=False)
    return []
