"""A lab on real boards: the topology's addressing, routes, forwarding, impairment and VPN put on
boards over SSH, every change recorded on the controller before it is made, and restored.

The ledger (/var/lib/lab/<id>/ledger.jsonl, as for a local lab) gets, per board:
  board-snapshot  what the board's network looked like before the lab touched it (links by
                  ifindex, addresses, routes, qdiscs, xfrm), the reference `lab down` restores
  board-dir       the per-lab directory on the board (/var/lib/lab/<id>, the controller's path)
  board-link      an interface's state and MTU before the lab set it
  board-sysctl    a sysctl's value before the lab set it
  board-addr      an address the lab adds; board-route: a route it adds
  board-qdisc     a root qdisc before the lab replaced it; board-offloads: ethtool features
  process-intent / process   daemons, by PID + start time read on the board
Restoring (`lab down`, `lab clean`, the unwinding of a failed `lab up`) walks it newest first
over a fresh connection, so it works after the controller was SIGKILLed; an unreachable board
keeps its entries and is finished by the next `lab clean`. Interfaces that appear on a board
while a lab is up on it (a VPN driver's wg0, tun0, macsec0...) are the lab's: restore deletes
links whose ifindex is not in the snapshot, and xfrm states/policies when the board had none.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..errors import ConfigError, LabError, PreconditionError
from ..node import Daemon
from ..state import Ledger, check_id, create_lab_dir, lab_dir, write_json_atomic
from ..topology import LabSpec
from .types import Board, BoardMap, Inventory

#: sysctls a router node needs, set on the board and restored afterwards
ROUTER_SYSCTLS = {"net.ipv4.ip_forward": "1", "net.ipv6.conf.all.forwarding": "1"}
#: root qdisc kinds a kernel puts on an interface by itself (with net.core.default_qdisc, which
#: the ledger records): restoring one means deleting ours
DEFAULT_QDISCS = {"noqueue", "pfifo_fast", "mq"}
KIND = "boards"


# ----------------------------------------------------------------------------- the lab object


class BoardLab:
    """A lab whose nodes are boards: what tunnel.bring_up and impair.runtime need of a lab
    (id, info, spec, dir, node(), nodes(), save()) with board nodes over SSH."""

    def __init__(self, lab_id: str, info: dict, *, connections: dict | None = None):
        self.id = lab_id
        self.info = info
        self.dir = lab_dir(lab_id)
        self.ledger = Ledger(self.dir / "ledger.jsonl")
        self.spec = LabSpec.from_json(info["spec"])
        self._conns: dict = connections if connections is not None else {}
        self._nodes: dict = {}

    @classmethod
    def open(cls, lab_id: str) -> BoardLab:
        path = lab_dir(lab_id) / "lab.json"
        try:
            info = json.loads(path.read_text())
        except FileNotFoundError:
            raise PreconditionError(f"lab {lab_id!r} is not up (no {path})")
        return cls(lab_id, info)

    def save(self) -> None:
        write_json_atomic(self.dir / "lab.json", self.info)

    def board(self, node: str) -> Board:
        b = self.info["boards"][node]
        return Board(
            name=b["name"], host=b["host"], mgmt=b["mgmt"], data=tuple(b["data"]),
            user=b.get("user"), port=b.get("port"), key=b.get("key"),
            become=b.get("become", "root"), ssh_options=tuple(b.get("ssh_options") or ()),
        )  # fmt: skip

    def connection(self, node: str):
        from .sshnode import BoardConnection

        board = self.board(node)
        conn = self._conns.get(board.name)
        if conn is None or not conn.alive():
            (self.dir / "logs").mkdir(mode=0o700, exist_ok=True)
            conn = BoardConnection.open(board, log_path=self.dir / "logs" / f"ssh-{board.name}.log")
            self._conns[board.name] = conn
        return conn

    def node(self, name: str):
        if name not in self.info["boards"]:
            raise ConfigError(
                f"no node {name!r} in lab {self.id!r}; nodes: {', '.join(self.info['boards'])}",
                source="NODE",
            )
        n = self._nodes.get(name)
        if n is None or not n.conn.alive():
            from .sshnode import BoardNode

            n = BoardNode(
                name,
                self.connection(name),
                ledger=self.ledger,
                log_dir=self.dir / "logs",
                sync_dirs=(self.dir / "config", self.dir / "secrets", self.dir / "measure"),
            )
            self._nodes[name] = n
        return n

    def nodes(self) -> dict:
        """Every node, its board's SSH session opened in parallel (each takes ~0.3 s)."""
        from concurrent.futures import ThreadPoolExecutor

        names = list(self.info["boards"])
        with ThreadPoolExecutor(max_workers=len(names) or 1) as pool:
            list(pool.map(self.connection, names))
        return {n: self.node(n) for n in names}

    def close(self) -> None:
        for c in self._conns.values():
            c.close()
        self._conns.clear()
        self._nodes.clear()

    def status(self) -> dict:
        from ..lab import lab_status

        where = {
            name: {"kind": "board", "board": b["name"], "host": b["host"]}
            for name, b in self.info["boards"].items()
        }
        return lab_status(self.id, self.info, self.spec, where)


def interactive(board: Board, argv: list[str]) -> int:
    """Run argv on the board attached to this terminal (`lab exec`, `lab shell`): plain ssh
    with a tty when this process has one."""
    import subprocess
    import sys

    from .sshnode import ssh_argv

    ssh = ssh_argv(board, argv)
    if sys.stdin.isatty():
        ssh[ssh.index("-T")] = "-t"
    sys.stdout.flush()
    return subprocess.call(ssh)


def is_board_lab(lab_id: str) -> bool:
    try:
        info = json.loads((lab_dir(lab_id) / "lab.json").read_text())
    except (OSError, ValueError):
        entries = Ledger(lab_dir(lab_id) / "ledger.jsonl").entries()
        return any(e["kind"] == "boardlab" for e in entries[:1])
    return (info.get("substrate") or {}).get("kind") == KIND


# ----------------------------------------------------------------------------- board state


def _sh(node, script: str, *, check: bool = True):
    return node.run(["sh", "-c", script], check=check, timeout=30)


def snapshot(node, board: Board) -> dict:
    """The board's network state the lab may change, normalised for comparison: links
    (ifindex, name, up, mtu), addresses and routes (all tables), root qdiscs, the sysctls the
    lab sets, xfrm states and policies, and the files under the per-lab parent directory."""

    def js(*argv):
        out = node.run(list(argv), timeout=30).stdout.strip()
        return json.loads(out) if out else []

    def count(*argv):
        cp = node.run(list(argv), check=False, timeout=30)
        return sum(1 for ln in cp.stdout.splitlines() if ln.startswith("src "))

    j = [
        js("ip", "-j", "link", "show"),
        js("ip", "-j", "addr", "show"),
        js("ip", "-j", "-4", "route", "show", "table", "all"),
        js("ip", "-j", "-6", "route", "show", "table", "all"),
        js("tc", "-j", "qdisc", "show"),
    ]
    xs = [count("ip", "xfrm", "state", "list"), count("ip", "xfrm", "policy", "list")]
    links = sorted(
        (ln["ifindex"], ln["ifname"], "UP" in ln.get("flags", []), ln.get("mtu")) for ln in j[0]
    )
    addrs = sorted(
        (a["ifname"], f"{x['local']}/{x['prefixlen']}")
        for a in j[1]
        for x in a.get("addr_info", [])
    )
    routes = sorted(
        json.dumps(
            {k: r.get(k) for k in ("dst", "gateway", "dev", "table", "type")}, sort_keys=True
        )
        for r in j[2] + j[3]
    )
    qdiscs = sorted(
        (q["dev"], q["kind"], q.get("handle"), "root" if q.get("root") else q.get("parent"))
        for q in j[4]
    )
    sysctl_names = sorted(ROUTER_SYSCTLS) + [f"net.ipv6.conf.{i}.accept_dad" for i in board.data]
    vals = {}
    for name in sysctl_names:
        c = node.run(["cat", "/proc/sys/" + name.replace(".", "/")], check=False)
        vals[name] = c.stdout.strip() if c.returncode == 0 else None
    return {
        "links": [list(x) for x in links],
        "addrs": [list(x) for x in addrs],
        "routes": routes,
        "qdiscs": [list(x) for x in qdiscs],
        "sysctls": vals,
        "xfrm": {"states": xs[0] if xs else 0, "policies": xs[1] if len(xs) > 1 else 0},
    }


def diff(before: dict, after: dict) -> list[str]:
    """What differs between two snapshots, in words (empty: identical)."""
    out = []
    for key in ("links", "addrs", "routes", "qdiscs"):
        b = {json.dumps(x) for x in before[key]}
        a = {json.dumps(x) for x in after[key]}
        out += [f"{key}: gone {x}" for x in sorted(b - a)]
        out += [f"{key}: new {x}" for x in sorted(a - b)]
    for k, v in before["sysctls"].items():
        if after["sysctls"].get(k) != v:
            out.append(f"sysctl {k}: {v} -> {after['sysctls'].get(k)}")
    if before["xfrm"] != after["xfrm"]:
        out.append(f"xfrm: {before['xfrm']} -> {after['xfrm']}")
    return out


# ----------------------------------------------------------------------------- building


def up(
    spec: LabSpec,
    inventory: Inventory,
    *,
    mapping: dict[str, str] | None = None,
    lab_id: str | None = None,
    vpn=None,
    impair: str | None = None,
    placement: str | None = None,
) -> BoardLab:
    """Build `spec` on the inventory's boards. On any failure every board is restored."""
    from . import inventory as inv_mod

    bmap = inv_mod.map_nodes(spec, inventory, mapping)
    bspec = inv_mod.board_spec(spec, bmap)
    if impair is None and any(lk.impair for lk in bspec.links):
        impair = "none"
    if impair is not None:
        from ..impair.runtime import plan_for

        plan_for(bspec, placement, impair, "kernel-netem", "")  # validated before anything
    if isinstance(vpn, str):
        from ..vpn.tunnel import plan as tunnel_plan

        vpn = tunnel_plan(bspec, vpn)  # checked on the boards themselves once connected
    from ..lab import default_id

    lab_id = check_id(lab_id or default_id())
    d = create_lab_dir(lab_id)
    for sub in ("logs", "secrets", "config"):
        (d / sub).mkdir(mode=0o700, exist_ok=True)
    boards = {}
    for node, bname in bmap.nodes.items():
        b = inventory.boards[bname]
        boards[node] = {
            "name": b.name, "host": b.host, "mgmt": b.mgmt, "data": list(b.data),
            "user": b.user, "port": b.port, "key": b.key, "become": b.become,
            "ssh_options": list(b.ssh_options),
        }  # fmt: skip
    info = {
        "id": lab_id,
        "state": "building",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "spec": bspec.to_json(),
        "topology_interfaces": {f"{n}:{i}": b for (n, i), b in bmap.interfaces.items()},
        "boards": boards,
        "warnings": [],
        "substrate": {"kind": KIND, "inventory": str(inventory.path)},
    }
    ledger = Ledger(d / "ledger.jsonl")
    ledger.record("boardlab", id=lab_id, inventory=str(inventory.path), boards=boards)
    write_json_atomic(d / "lab.json", info)
    lab = BoardLab(lab_id, info)
    try:
        _build(lab, bspec, bmap, impair, placement)
        if vpn is not None:
            from ..vpn.tunnel import bring_up

            bring_up(lab, vpn)
    except BaseException as e:
        lab.close()
        left = restore(lab_id)
        if left and isinstance(e, LabError):
            e.args = (f"{e.args[0]}\n(unwinding left over: {'; '.join(left)})",)
        raise
    lab.info["state"] = "up"
    lab.save()
    return lab


def _build(lab: BoardLab, spec: LabSpec, bmap: BoardMap, impair, placement) -> None:
    from . import inventory as inv_mod

    nodes = lab.nodes()  # connect to every board first: an unreachable one fails before changes
    mgmt_addrs = {}
    for name, node in nodes.items():
        board = lab.board(name)
        cp = node.run(["ip", "-j", "addr", "show"], timeout=20)
        present = {a["ifname"]: a for a in json.loads(cp.stdout)}
        missing = [i for i in (board.mgmt, *board.data) if i not in present]
        if missing:
            raise PreconditionError(
                f"board {board.name} ({board.host}): no interface {', '.join(missing)}; it has "
                f"{', '.join(sorted(present))} (inventory {lab.info['substrate']['inventory']})"
            )
        mgmt_addrs[board.name] = [
            f"{x['local']}/{x['prefixlen']}" for x in present[board.mgmt].get("addr_info", [])
        ]
    inventory = _inventory_of(lab)
    inv_mod.check_management(spec, bmap, inventory, mgmt_addrs)
    for name, node in nodes.items():  # the board OS's own TCP defaults, for the results
        lab.info["boards"][name]["os"] = _os_facts(node)

    # the reference everything is restored to, recorded before the first change
    for name, node in nodes.items():
        lab.ledger.record("board-snapshot", node=name, snapshot=snapshot(node, lab.board(name)))
    for name, node in nodes.items():
        lab.ledger.record("board-dir", node=name, path=str(lab.dir))
        _sh(node, f"umask 077; mkdir -p '{lab.dir}/logs' '{lab.dir}/config' '{lab.dir}/secrets'")

    # data ports up (state and MTU recorded), then every cable verified before any address
    for name, node in nodes.items():
        for i in spec.nodes[name].interfaces:
            lk = spec.links[i.link]
            _link_up(lab, node, name, i.name, lk.mtu)
    _verify_cables(lab, spec, nodes)

    for name, node in nodes.items():
        n = spec.nodes[name]
        sysctls = dict(ROUTER_SYSCTLS) if n.router else {}
        for i in n.interfaces:
            sysctls[f"net.ipv6.conf.{i.name}.accept_dad"] = "0"  # addresses usable at once
        for k, v in sysctls.items():
            _sysctl(lab, node, name, k, v)
        for i in n.interfaces:
            for cidr in (i.ip, i.ip6):
                if cidr:
                    lab.ledger.record("board-addr", node=name, ifname=i.name, cidr=cidr)
                    node.run(["ip", "addr", "add", cidr, "dev", i.name, "nodad"] if ":" in cidr
                             else ["ip", "addr", "add", cidr, "dev", i.name])  # fmt: skip
        for r in n.routes:
            fam = "-6" if ":" in r["dst"] else "-4"
            lab.ledger.record("board-route", node=name, family=fam, dst=r["dst"], via=r["via"],
                              dev=r["dev"])  # fmt: skip
            node.run(["ip", fam, "route", "add", r["dst"], "via", r["via"], "dev", r["dev"]])
        if n.default_route:
            lab.info["warnings"].append(
                f"{name}: default route {n.default_route!r} not installed on board "
                f"{lab.board(name).name} (its default route stays on the management network; "
                "routes to every lab subnet are installed instead)"
            )
    if any(lk.bw for lk in spec.links):
        lab.info["warnings"].append(
            "link bandwidth (bw=) is not shaped on boards: the cable is the link"
        )
    lab.save()
    if impair is not None:
        _impair(lab, spec, impair, placement)


def _os_facts(node) -> dict:
    """What shapes a board's TCP figures: its congestion control and buffer limits, read on
    it (the lab does not change them on a board; a local node gets its profile's, lab.cpuprofile
    OS_SYSCTLS)."""
    from ..cpuprofile import OS_SYSCTLS

    out = {}
    for key in [*OS_SYSCTLS.values(), "net.core.rmem_max", "net.core.wmem_max"]:
        cp = node.run(["cat", "/proc/sys/" + key.replace(".", "/")], check=False)
        out[key] = " ".join(cp.stdout.split()) if cp.returncode == 0 else None
    return out


def _inventory_of(lab: BoardLab) -> Inventory:
    boards = {b["name"]: lab.board(n) for n, b in lab.info["boards"].items()}
    return Inventory(path=Path(lab.info["substrate"]["inventory"]), boards=boards)


def _link_up(lab, node, name: str, ifname: str, mtu: int | None) -> None:
    cp = node.run(["ip", "-j", "link", "show", "dev", ifname])
    ln = json.loads(cp.stdout)[0]
    lab.ledger.record(
        "board-link", node=name, ifname=ifname, up="UP" in ln.get("flags", []), mtu=ln.get("mtu")
    )
    argv = ["ip", "link", "set", "dev", ifname, "up"]
    if mtu:
        argv += ["mtu", str(mtu)]
    node.run(argv)


def _sysctl(lab, node, name: str, key: str, value: str) -> None:
    path = "/proc/sys/" + key.replace(".", "/")
    prev = node.run(["cat", path]).stdout.strip()
    lab.ledger.record("board-sysctl", node=name, key=key, prev=prev)
    node.run(["sh", "-c", f"echo '{value}' > '{path}'"])


def _verify_cables(lab: BoardLab, spec: LabSpec, nodes: dict, timeout: float = 6.0) -> None:
    """Each link's two ports must reach each other: a ping from one end to the other end's
    IPv6 link-local address, out of that port only. Names the first link that fails."""
    lls = {}
    for name, node in nodes.items():
        cp = node.run(["ip", "-j", "-6", "addr", "show", "scope", "link"])
        for a in json.loads(cp.stdout):
            for x in a.get("addr_info", []):
                lls[(name, a["ifname"])] = x["local"]
    bad = []
    for lk in spec.links:
        peer_ll = lls.get((lk.node2, lk.intf2))
        b1, b2 = lab.board(lk.node1).name, lab.board(lk.node2).name
        what = f"cable {b1}:{lk.intf1} <-> {b2}:{lk.intf2} (link {lk.node1}-{lk.node2})"
        if peer_ll is None:
            bad.append(f"{what}: {b2}:{lk.intf2} has no IPv6 link-local address to probe")
            continue
        deadline = time.monotonic() + timeout
        while True:
            cp = nodes[lk.node1].run(
                ["ping", "-6", "-n", "-q", "-c", "1", "-W", "1", f"{peer_ll}%{lk.intf1}"],
                check=False,
                timeout=10,
            )
            if cp.returncode == 0:
                break
            if time.monotonic() > deadline:
                bad.append(f"{what}: no reply from {b2}:{lk.intf2} through {b1}:{lk.intf1} "
                           "(miscabled, unplugged or down)")  # fmt: skip
                break
            time.sleep(0.2)
    if bad:
        raise PreconditionError("; ".join(bad))


def _impair(lab: BoardLab, spec: LabSpec, impair: str, placement) -> None:
    from ..impair import runtime
    from ..impair.kernel import probe_netem

    iplan = runtime.plan_for(spec, placement, impair, "kernel-netem", "boards: kernel netem")
    for p in iplan.points:
        pr = probe_netem(lab.node(p.node))
        if not pr.ok:
            raise PreconditionError(
                f"board {lab.board(p.node).name} ({p.node}): {pr.reason}; impairment on boards "
                "is kernel netem on the board that forwards (load sch_netem there)"
            )
    lab.info["impair"] = runtime.plan_json(iplan)
    lab.save()
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
    for lk in spec.links:
        if lk.impair:
            runtime.set_base(lab, lk.impair, f"{lk.node1}-{lk.node2}")
    runtime.set_point(lab, iplan.initial)


# ----------------------------------------------------------------------------- restoring


def restore(lab_id: str, notes: list[str] | None = None) -> list[str]:
    """Put every board back as the ledger says it was. Returns what is left (unreachable
    boards, changes that could not be undone); the lab's state stays until nothing is left."""
    import shutil

    d = lab_dir(lab_id)
    ledger = Ledger(d / "ledger.jsonl")
    entries = ledger.entries()
    head = next((e for e in entries if e["kind"] == "boardlab"), None)
    if head is None:
        return [f"lab {lab_id}: ledger has no boardlab entry"]
    info = {"spec": {"source": "", "topo_name": "", "params": {}, "nodes": {}, "links": [],
                     "segments": []}, "boards": head["boards"]}  # fmt: skip
    try:
        info = json.loads((d / "lab.json").read_text())
    except (OSError, ValueError):
        pass
    lab = BoardLab(lab_id, info)
    left: list[str] = []
    by_node: dict[str, list[dict]] = {}
    for e in entries:
        if e.get("node") in head["boards"]:
            by_node.setdefault(e["node"], []).append(e)

    def one(name: str, es: list[dict]) -> list[str]:
        bname = head["boards"][name]["name"]
        try:
            node = lab.node(name)
        except (LabError, OSError) as ex:
            return [f"board {bname}: unreachable ({str(ex).splitlines()[0]}); run `lab clean` "
                    "when it is back"]  # fmt: skip
        return [f"board {bname}: {x}" for x in _restore_node(node, es)]

    from concurrent.futures import ThreadPoolExecutor

    # boards are independent: restore them at once (each its own SSH session)
    with ThreadPoolExecutor(max_workers=len(by_node) or 1) as pool:
        for got in pool.map(lambda kv: one(*kv), list(by_node.items())):
            left += got
    lab.close()
    if not left:
        shutil.rmtree(d, ignore_errors=True)
    return left


def _restore_node(node, entries: list[dict]) -> list[str]:
    problems: list[str] = []
    stopped = {e["pid"] for e in entries if e["kind"] == "process-stopped"}
    for e in reversed(entries):
        if e["kind"] == "process" and e["pid"] not in stopped:
            d = Daemon(e["node"], e.get("name", "?"), e["pid"], e.get("start_time"), None)
            if not node.stop(d, grace=2.0):
                problems.append(f"process {e['pid']} ({e.get('name')}) still running")
    snap = next((e["snapshot"] for e in entries if e["kind"] == "board-snapshot"), None)
    if snap is not None:  # links the lab's drivers created (not there before), newest first
        known = {x[0] for x in snap["links"]}
        cp = node.run(["ip", "-j", "link", "show"], check=False)
        now = json.loads(cp.stdout) if cp.returncode == 0 else []
        for ln in sorted(now, key=lambda x: -x["ifindex"]):
            if ln["ifindex"] not in known:
                node.run(["ip", "link", "del", "dev", ln["ifname"]], check=False)
        for what, n in snap["xfrm"].items():
            if n == 0:
                node.run(["ip", "xfrm", what.rstrip("s"), "flush"], check=False)
    for e in reversed(entries):
        k = e["kind"]
        try:
            if k == "board-addr":
                node.run(["ip", "addr", "del", e["cidr"], "dev", e["ifname"]], check=False)
            elif k == "board-route":
                node.run(["ip", e["family"], "route", "del", e["dst"], "via", e["via"], "dev",
                          e["dev"]], check=False)  # fmt: skip
            elif k == "board-sysctl":
                path = "/proc/sys/" + e["key"].replace(".", "/")
                node.run(["sh", "-c", f"echo '{e['prev']}' > '{path}'"], check=False)
            elif k == "board-qdisc":
                prev = e["prev"]
                kind = prev[0].get("kind") if prev else None
                if kind is None or kind in DEFAULT_QDISCS | {e.get("default")}:
                    node.run(["tc", "qdisc", "del", "dev", e["ifname"], "root"], check=False)
                elif kind == "tbf":  # the board's shaping stays; the netem in its class goes
                    parent = f"{prev[0]['handle'].rstrip(':')}:1"
                    node.run(["tc", "qdisc", "del", "dev", e["ifname"], "parent", parent],
                             check=False)  # fmt: skip
                else:
                    problems.append(f"{e['ifname']}: root qdisc {kind} was there before; the "
                                    "lab's netem replaced it and it is not restored")  # fmt: skip
            elif k == "board-offloads":
                on = [x for kv in e["features"].items() for x in kv]
                if on:
                    node.run(["ethtool", "-K", e["ifname"], *on], check=False)
            elif k == "board-link":
                argv = ["ip", "link", "set", "dev", e["ifname"], "up" if e["up"] else "down"]
                if e.get("mtu"):
                    argv += ["mtu", str(e["mtu"])]
                node.run(argv, check=False)
            elif k == "board-dir":
                node.run(["rm", "-rf", "--one-file-system", e["path"]], check=False)
        except LabError as ex:
            problems.append(f"{k}: {ex}")
    if snap is not None:
        board = _board_from(node)
        _remove_new_addresses_and_routes(node, board, snap)
        after = snapshot(node, board)
        problems += diff(snap, after)
    return problems


def _remove_new_addresses_and_routes(node, board: Board, snap: dict) -> None:
    """Addresses and routes that appeared on the board while the lab was up are the lab's (its
    drivers add tunnel addresses on lo, routes through tunnels): remove them, except on the
    management interface, which the lab never touches. Routes of the local table go with their
    addresses."""
    now = snapshot(node, board)
    for ifname, cidr in sorted(
        {tuple(x) for x in now["addrs"]} - {tuple(x) for x in snap["addrs"]}
    ):
        if ifname != board.mgmt:
            node.run(["ip", "addr", "del", cidr, "dev", ifname], check=False)
    now = snapshot(node, board)
    for text in sorted(set(now["routes"]) - set(snap["routes"])):
        r = json.loads(text)
        if r.get("dev") == board.mgmt or r.get("table") == "local" or not r.get("dst"):
            continue
        argv = ["ip", "-6" if ":" in r["dst"] else "-4", "route", "del", r["dst"]]
        if r.get("gateway"):
            argv += ["via", r["gateway"]]
        if r.get("dev"):
            argv += ["dev", r["dev"]]
        if r.get("table"):
            argv += ["table", str(r["table"])]
        node.run(argv, check=False)


def _board_from(node):
    """The Board of a BoardNode (for snapshot's sysctl list)."""
    return node.conn.board
