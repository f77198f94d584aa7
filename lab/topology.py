"""Load a Mininet-style topology file and resolve it into a validated, fully addressed LabSpec.

Pure data: nothing here touches the system. Every problem is a ConfigError naming the file, the
node or link, and the accepted values, raised before anything is created.
"""

from __future__ import annotations

import contextlib
import importlib.util
import ipaddress
import re
import sys
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .graph import reachable_segments

IFNAMSIZ = 15  # bytes, without the trailing NUL (linux/if.h IFNAMSIZ - 1)

HOST_OPTIONS = {
    "cpu": "CPU profile name (see cpu_profiles/) or a fraction of one core, e.g. 0.25",
    "ip": "IPv4 address with prefix for the host's first interface, e.g. '10.0.1.2/24'",
    "ip6": "IPv6 address with prefix for the host's first interface, e.g. 'fd00:1::2/64'",
    "defaultRoute": "'via ADDRESS' or 'dev IFNAME' (Mininet syntax)",
    "router": "True: the node forwards IPv4/IPv6 between its interfaces",
    "vpn": "tunnel endpoint role: 'client' or 'server'",
    "traffic": "measurement endpoint role: 'client' or 'server'",
}
SWITCH_OPTIONS: dict[str, str] = {}
LINK_OPTIONS = {
    "bw": "bandwidth in Mbit/s (number > 0), shaped with tbf on both ends",
    "delay": "one-way delay per direction, e.g. '40ms' (Mininet TCLink)",
    "jitter": "delay variation, e.g. '5ms' (Mininet TCLink)",
    "loss": "loss percentage 0..100 per direction (Mininet TCLink)",
    "max_queue_size": "queue length in packets (Mininet TCLink)",
    "impair": "impairment spec in tc-netem words, e.g. 'delay 40ms 5ms loss 0.5%'",
    "mtu": "interface MTU on both ends (68..65535)",
    "params1": "dict of per-interface options for node1: ip, ip6",
    "params2": "dict of per-interface options for node2: ip, ip6",
    "intfName1": "interface name on node1 (<= 15 bytes)",
    "intfName2": "interface name on node2 (<= 15 bytes)",
    # added by Mininet's Topo.addLink itself:
    "node1": "",
    "node2": "",
    "port1": "",
    "port2": "",
}
INTF_PARAMS = {"ip", "ip6"}
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*\Z")
NAME_MAX = 32  # node names become namespace, cgroup and file names (with the lab id)
IFNAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*\Z")  # what ip(8) takes without quoting
# Auto-addressing pools for segments without explicit addresses.
AUTO_V4 = ipaddress.ip_network("10.0.0.0/16")
AUTO_V6_PREFIX = "fd00:0:0:{:x}::/64"


@dataclass
class Interface:
    node: str
    name: str
    peer_node: str
    peer_name: str
    link: int  # index into LabSpec.links
    segment: int
    ip: str | None = None  # "10.0.1.2/24"
    ip6: str | None = None


@dataclass
class NodeSpec:
    name: str
    kind: str  # "host" | "switch"
    cpu: str | float | None = None
    router: bool = False
    vpn: str | None = None
    traffic: str | None = None
    default_route: str | None = None
    interfaces: list[Interface] = field(default_factory=list)
    routes: list[dict] = field(default_factory=list)  # {"dst": cidr, "via": addr, "dev": ifname}


@dataclass
class LinkSpec:
    index: int
    node1: str
    node2: str
    intf1: str
    intf2: str
    bw: float | None = None
    mtu: int | None = None
    impair: str | None = None  # tc-netem words, validated by lab.impair.spec when present
    max_queue_size: int | None = None


@dataclass
class Segment:
    index: int
    v4: str
    v6: str
    links: list[int] = field(default_factory=list)


@dataclass
class LabSpec:
    source: str
    topo_name: str
    params: dict[str, Any]
    nodes: dict[str, NodeSpec]
    links: list[LinkSpec]
    segments: list[Segment]

    def hosts(self) -> list[NodeSpec]:
        return [n for n in self.nodes.values() if n.kind == "host"]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> LabSpec:
        nodes = {}
        for name, n in d["nodes"].items():
            n = dict(n)
            n["interfaces"] = [Interface(**i) for i in n["interfaces"]]
            nodes[name] = NodeSpec(**n)
        return cls(
            source=d["source"],
            topo_name=d["topo_name"],
            params=d["params"],
            nodes=nodes,
            links=[LinkSpec(**lk) for lk in d["links"]],
            segments=[Segment(**s) for s in d["segments"]],
        )

    def endpoints(self, role: str) -> tuple[str, str]:
        """(client, server) for role 'vpn' or 'traffic'; defaults to the two end hosts."""
        marked = {n.name: getattr(n, role) for n in self.hosts() if getattr(n, role)}
        if role == "traffic" and not marked:
            return self.endpoints("vpn") if any(n.vpn for n in self.hosts()) else _ends(self)
        if not marked:
            return _ends(self)
        inv = {v: k for k, v in marked.items()}
        if set(inv) != {"client", "server"}:
            raise ConfigError(
                f"nodes marked {role}= must be exactly one 'client' and one 'server', got {marked}",
                source=self.source,
            )
        return inv["client"], inv["server"]


def _ends(spec: LabSpec) -> tuple[str, str]:
    ends = [n.name for n in spec.hosts() if len(n.interfaces) == 1 and not n.router]
    if len(ends) != 2:
        raise ConfigError(
            f"cannot pick the two end hosts (hosts with one link, not routers: {ends}); "
            "mark them with vpn='client'/'server'",
            source=spec.source,
        )
    return ends[0], ends[1]


# --------------------------------------------------------------------------- loading


def parse_params(texts: list[str]) -> dict[str, Any]:
    """Every `-p key=value` of the command line; a key given twice is refused (which would win
    is not obvious)."""
    params: dict[str, Any] = {}
    for text in texts:
        key, value = parse_param(text)
        if key in params:
            raise ConfigError(
                f"{key} given twice; give each parameter once", source="-p", field=key
            )
        params[key] = value
    return params


def parse_param(text: str) -> tuple[str, Any]:
    """`-p key=value` from the CLI: value parsed as int, float, bool or left a string."""
    if "=" not in text:
        raise ConfigError(f"expected key=value, got {text!r}", source="-p")
    key, value = text.split("=", 1)
    if not key.isidentifier():
        raise ConfigError(f"{key!r} is not a valid parameter name", source="-p")
    if not value.strip():
        raise ConfigError(f"empty value in {text!r}; give key=value", source="-p", field=key)
    low = value.lower()
    if low in ("true", "false"):
        return key, low == "true"
    for conv in (int, float):
        try:
            return key, conv(value)
        except ValueError:
            pass
    return key, value


def load_topology(path: str | Path, topo: str | None = None, params: dict | None = None) -> LabSpec:
    """Import the topology file, build the chosen Topo and resolve it into a LabSpec."""
    path = Path(path)
    src = str(path)
    params = dict(params or {})
    if path.is_dir():
        raise ConfigError("is a directory, not a topology file (a .py file)", source=src)
    if not path.is_file():
        raise ConfigError("topology file not found", source=src)
    module = _import_file(path)
    topos = getattr(module, "topos", None)
    if not isinstance(topos, dict) or not topos:
        raise ConfigError(
            "defines no `topos = {'name': TopoClass}` dict (Mininet convention)", source=src
        )
    if topo is None:
        if len(topos) != 1:
            raise ConfigError(
                f"defines several topologies; choose one with --topo: {', '.join(sorted(topos))}",
                source=src,
            )
        topo = next(iter(topos))
    if topo not in topos:
        raise ConfigError(
            f"unknown topology {topo!r}; valid: {', '.join(sorted(topos))}",
            source=src,
            field="--topo",
        )
    if not callable(topos[topo]):
        raise ConfigError(
            f"topos[{topo!r}] is {topos[topo]!r}, not a Topo class", source=src, field="topos"
        )
    try:
        with _refuse_duplicate_nodes(src):
            obj = topos[topo](**params)
    except ConfigError:
        raise
    except SystemExit as e:  # sys.exit() in build(): not a topology, and not a success
        raise ConfigError(
            f"building topology {topo!r} called sys.exit({e.code!r}); a topology file "
            "describes nodes and links and must not exit",
            source=src,
        )
    except TypeError as e:
        raise ConfigError(
            f"cannot build topology {topo!r} with parameters {params}: {e}", source=src
        )
    except Exception as e:  # the user's build() raised: report it as bad input
        raise ConfigError(f"building topology {topo!r} raised {_short_exc(e, src)}", source=src)
    return resolve(obj, source=src, topo_name=topo, params=params)


@contextlib.contextmanager
def _refuse_duplicate_nodes(source: str):
    """While a Topo builds: a node name added twice is an error (Mininet's Topo silently keeps
    the last definition)."""
    try:
        from mininet.topo import Topo
    except ImportError:  # pragma: no cover - mininet is a dependency
        yield
        return
    original, original_link = Topo.addNode, Topo.addLink

    def add_link(self, node1, node2, *args, **opts):
        for end in (node1, node2):
            if end not in getattr(self.g, "node", {}):
                raise ConfigError(
                    f"link to undefined node {end!r}; add it first (addHost/addSwitch); nodes: "
                    + (", ".join(map(str, self.g.node)) or "none"),
                    source=source,
                    field=f"link {node1}-{node2}",
                )
        return original_link(self, node1, node2, *args, **opts)

    def add_node(self, name, **opts):
        if name in getattr(self.g, "node", {}):
            kind = "switch" if opts.get("isSwitch") else "host"
            raise ConfigError(
                f"node {name!r} is defined twice; every node needs its own name",
                source=source,
                field=f"{kind} {name!r}",
            )
        return original(self, name, **opts)

    Topo.addNode, Topo.addLink = add_node, add_link
    try:
        yield
    finally:
        Topo.addNode, Topo.addLink = original, original_link


def _short_exc(e: BaseException, path: str | None = None) -> str:
    """`KeyError: 'x' at line 12`: the line of the user's file (`path`) the error came
    through, not a line of the lab's or Mininet's code."""
    tb = traceback.extract_tb(e.__traceback__)
    if path is not None:
        mine = [f for f in tb if Path(f.filename).resolve() == Path(path).resolve()]
        tb = mine or []
    where = f" at line {tb[-1].lineno}" if tb else ""
    return f"{type(e).__name__}: {e}{where}"


def _import_file(path: Path):
    name = f"lab_topology_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError("not a Python file", source=str(path))
    module = importlib.util.module_from_spec(spec)
    try:
        sys.modules[name] = module
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise ConfigError(f"syntax error at line {e.lineno}: {e.msg}", source=str(path))
    except SystemExit as e:  # a data file that exits is not a success (issue 22)
        raise ConfigError(
            f"called sys.exit({e.code!r}) while loading; a topology file describes nodes and "
            "links and must not exit",
            source=str(path),
        )
    except Exception as e:
        raise ConfigError(f"importing raised {_short_exc(e, str(path))}", source=str(path))
    finally:
        sys.modules.pop(name, None)
    return module


# --------------------------------------------------------------------------- resolving


def resolve(topo, *, source: str, topo_name: str = "topo", params: dict | None = None) -> LabSpec:
    """Validate a built Mininet Topo and resolve interfaces, addresses and routes."""
    nodes: dict[str, NodeSpec] = {}
    try:
        names = list(topo.nodes(sort=False))
    except Exception as e:
        raise ConfigError(f"not a Mininet Topo: {e}", source=source)
    if not names:
        raise ConfigError("topology has no nodes", source=source)
    for name in names:
        info = dict(topo.nodeInfo(name))
        is_switch = bool(info.pop("isSwitch", False))
        where = f"{'switch' if is_switch else 'host'} {name!r}"
        if not isinstance(name, str) or not NAME_RE.match(name) or len(name) > NAME_MAX:
            raise ConfigError(
                "node names must start with a letter and contain only letters, digits and '_' "
                f"(1..{NAME_MAX} characters)",
                source=source,
                field=where if len(str(name)) <= 60 else where[:60] + "...'",
            )
        allowed = SWITCH_OPTIONS if is_switch else HOST_OPTIONS
        _reject_unknown(info, allowed, source, where)
        nodes[name] = _node_spec(name, is_switch, info, source, where)

    links: list[LinkSpec] = []
    used_ifnames: dict[str, set[str]] = {n: set() for n in nodes}
    raw_links = topo.links(sort=False, withKeys=True, withInfo=True)
    link_addrs: list[dict] = []
    for idx, (a, b, _key, info) in enumerate(raw_links):
        info = dict(info)
        where = f"link {a}-{b}"
        _reject_unknown(info, LINK_OPTIONS, source, where)
        node1, node2 = info["node1"], info["node2"]
        for end in (node1, node2):
            if end not in nodes:
                raise ConfigError(
                    f"link to undefined node {end!r}; nodes: {', '.join(nodes)}",
                    source=source,
                    field=where,
                )
        if node1 == node2:
            raise ConfigError("a link must join two different nodes", source=source, field=where)
        names_ = []
        for end, node, port in ((1, node1, info["port1"]), (2, node2, info["port2"])):
            ifname = info.get(f"intfName{end}")
            if ifname is None:
                ifname = f"{node}-eth{port}"
            if isinstance(ifname, str) and ifname and not IFNAME_RE.match(ifname):
                raise ConfigError(
                    f"interface name {ifname!r}: accepted ASCII letters, digits, '_', '.', '-'",
                    source=source,
                    field=f"{where} intfName{end}",
                )
            if not isinstance(ifname, str) or len(ifname.encode()) > IFNAMSIZ or not ifname:
                raise ConfigError(
                    f"interface name {ifname!r} is {len(str(ifname).encode())} bytes; Linux allows"
                    f" 1..{IFNAMSIZ} (shorten the node name or set intfName{end})",
                    source=source,
                    field=where,
                )
            if ifname in used_ifnames[node] or ifname == "lo":
                raise ConfigError(
                    f"interface name {ifname!r} used twice on node {node!r}",
                    source=source,
                    field=where,
                )
            used_ifnames[node].add(ifname)
            names_.append(ifname)
        lk = LinkSpec(index=idx, node1=node1, node2=node2, intf1=names_[0], intf2=names_[1])
        lk.bw = _number(info.get("bw"), source, where, "bw", lo=0.001, hi=100000, unit="Mbit/s")
        mtu = info.get("mtu")
        if mtu is not None:
            lk.mtu = int(_number(mtu, source, where, "mtu", lo=68, hi=65535, unit="bytes"))
        mq = info.get("max_queue_size")
        if mq is not None:
            lk.max_queue_size = int(_number(mq, source, where, "max_queue_size", lo=1, hi=10**6))
        lk.impair = _link_impairment(info, source, where)
        addrs = {}
        for end in (1, 2):
            p = info.get(f"params{end}") or {}
            if not isinstance(p, dict):
                raise ConfigError(
                    f"params{end} must be a dict with keys {sorted(INTF_PARAMS)}",
                    source=source,
                    field=where,
                )
            _reject_unknown(p, {k: "" for k in INTF_PARAMS}, source, f"{where} params{end}")
            addrs[end] = p
        link_addrs.append(addrs)
        links.append(lk)
    _check_connected_names(nodes, links, source)
    segments = _assign(nodes, links, link_addrs, source, topo)
    _compute_routes(nodes, segments, links)
    for n in nodes.values():
        if n.default_route:
            _check_default_route(n, source)
    return LabSpec(source, topo_name, dict(params or {}), nodes, links, segments)


def _reject_unknown(info: dict, allowed: dict, source: str, where: str) -> None:
    unknown = sorted(set(info) - set(allowed))
    if unknown:
        valid = ", ".join(k for k in allowed if allowed[k]) or "(none)"
        raise ConfigError(
            f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; valid: {valid}",
            source=source,
            field=where,
        )


def _number(v, source, where, fld, *, lo, hi, unit=""):
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(
            f"{fld} must be a number {lo}..{hi} {unit}, got {v!r}", source=source, field=where
        )
    if not lo <= v <= hi:
        raise ConfigError(f"{fld} must be {lo}..{hi} {unit}, got {v!r}", source=source, field=where)
    return float(v)


def _node_spec(name, is_switch, info, source, where) -> NodeSpec:
    if is_switch:
        return NodeSpec(name=name, kind="switch")
    n = NodeSpec(name=name, kind="host")
    cpu = info.get("cpu")
    if cpu is not None:
        if isinstance(cpu, bool):
            raise ConfigError(
                f"cpu must be a profile name or a core fraction, got {cpu!r}",
                source=source,
                field=where,
            )
        if isinstance(cpu, (int, float)):
            if not 0.01 <= cpu <= 1024:
                raise ConfigError(
                    f"cpu fraction must be 0.01..1024 cores, got {cpu}", source=source, field=where
                )
            n.cpu = float(cpu)
        elif isinstance(cpu, str):
            from .cpuprofile import known_profiles  # data lookup only

            if cpu not in known_profiles():
                raise ConfigError(
                    f"cpu: unknown CPU profile {cpu!r}; valid: {', '.join(known_profiles())} "
                    "or a core fraction",
                    source=source,
                    field=where,
                )
            n.cpu = cpu
        else:
            raise ConfigError(
                f"cpu must be a profile name or a number, got {cpu!r}", source=source, field=where
            )
    router = info.get("router", False)
    if not isinstance(router, bool):
        raise ConfigError(
            f"router must be True or False, got {router!r}", source=source, field=where
        )
    n.router = router
    for role in ("vpn", "traffic"):
        v = info.get(role)
        if v is not None and v not in ("client", "server"):
            raise ConfigError(
                f"{role} must be 'client' or 'server', got {v!r}", source=source, field=where
            )
        setattr(n, role, v)
    dr = info.get("defaultRoute")
    if dr is not None and (not isinstance(dr, str) or not dr.strip()):
        raise ConfigError(
            f"defaultRoute must be 'via ADDR' or 'dev IF', got {dr!r}", source=source, field=where
        )
    n.default_route = dr
    n._ip = info.get("ip")  # type: ignore[attr-defined]  # consumed by _assign
    n._ip6 = info.get("ip6")  # type: ignore[attr-defined]
    return n


def _link_impairment(info, source, where) -> str | None:
    parts = []
    if info.get("impair") is not None:
        if not isinstance(info["impair"], str) or not info["impair"].strip():
            raise ConfigError(
                f"impair must be a string of tc-netem words, got {info['impair']!r}",
                source=source,
                field=where,
            )
        parts.append(info["impair"])
    tc = {k: info[k] for k in ("delay", "jitter", "loss") if info.get(k) is not None}
    if tc:
        if "jitter" in tc and "delay" not in tc:
            raise ConfigError("jitter needs delay (Mininet TCLink)", source=source, field=where)
        words = []
        if "delay" in tc:
            words += ["delay", str(tc["delay"])]
            if "jitter" in tc:
                words.append(str(tc["jitter"]))
        if "loss" in tc:
            loss = tc["loss"]
            if isinstance(loss, bool) or not isinstance(loss, (int, float)) or not 0 <= loss <= 100:
                raise ConfigError(
                    f"loss must be a percentage 0..100, got {loss!r}", source=source, field=where
                )
            words += ["loss", f"{loss}%"]
        parts.append(" ".join(words))
    if not parts:
        return None
    text = " ".join(parts)
    try:
        from .impair import spec as impair_spec
    except ImportError:  # impairment language not installed yet: keep the words as given
        return text
    try:
        impair_spec.parse_spec(text, source=f"{source}: {where}")
    except ConfigError:
        raise
    return text


def _check_connected_names(nodes, links, source):
    for n in nodes.values():
        if n.kind == "switch" and not any(n.name in (lk.node1, lk.node2) for lk in links):
            raise ConfigError("switch has no links", source=source, field=f"switch {n.name!r}")


def _iface(value, version, source, where, fld):
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        iface = ipaddress.ip_interface(value)
    except ValueError:
        raise ConfigError(
            f"{fld} must be an IPv{version} address with prefix, e.g. "
            f"{'10.0.1.2/24' if version == 4 else 'fd00:1::2/64'}; got {value!r}",
            source=source,
            field=where,
        )
    if iface.version != version:
        raise ConfigError(f"{fld} must be IPv{version}, got {value!r}", source=source, field=where)
    if "/" not in str(value):
        iface = ipaddress.ip_interface(f"{iface.ip}/{24 if version == 4 else 64}")
    if iface.ip == iface.network.network_address and iface.network.prefixlen < (
        31 if version == 4 else 127
    ):
        raise ConfigError(f"{fld} {value} is the network address", source=source, field=where)
    return iface


def _assign(nodes, links, link_addrs, source, topo) -> list[Segment]:
    """Group links into L2 segments (switches join theirs), then address every host interface."""
    parent = list(range(len(links)))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    by_switch: dict[str, list[int]] = {}
    for lk in links:
        for nd in (lk.node1, lk.node2):
            if nodes[nd].kind == "switch":
                by_switch.setdefault(nd, []).append(lk.index)
    for idxs in by_switch.values():
        for i in idxs[1:]:
            parent[find(i)] = find(idxs[0])
    groups: dict[int, list[int]] = {}
    for lk in links:
        groups.setdefault(find(lk.index), []).append(lk.index)

    # interfaces (hosts only carry addresses; switch ports are bridge members)
    seg_of_link = {}
    seg_list = list(groups.values())
    for si, idxs in enumerate(seg_list):
        for i in idxs:
            seg_of_link[i] = si
    first_if_seen: set[str] = set()
    explicit: dict[int, list[tuple[Interface, Any, Any, str]]] = {
        i: [] for i in range(len(seg_list))
    }
    for lk in links:
        for end, node, ifn, peer, peer_if in (
            (1, lk.node1, lk.intf1, lk.node2, lk.intf2),
            (2, lk.node2, lk.intf2, lk.node1, lk.intf1),
        ):
            nd = nodes[node]
            intf = Interface(node, ifn, peer, peer_if, lk.index, seg_of_link[lk.index])
            nd.interfaces.append(intf)
            if nd.kind != "host":
                continue
            where = f"link {lk.node1}-{lk.node2} ({node}:{ifn})"
            p = link_addrs[lk.index][end]
            v4, v6 = p.get("ip"), p.get("ip6")
            if node not in first_if_seen:
                first_if_seen.add(node)
                v4 = v4 if v4 is not None else getattr(nd, "_ip", None)
                v6 = v6 if v6 is not None else getattr(nd, "_ip6", None)
            i4 = _iface(v4, 4, source, where, "ip") if v4 is not None else None
            i6 = _iface(v6, 6, source, where, "ip6") if v6 is not None else None
            explicit[seg_of_link[lk.index]].append((intf, i4, i6, where))
    for nd in nodes.values():
        for a in ("_ip", "_ip6"):
            if hasattr(nd, a):
                if getattr(nd, a) is not None and not nd.interfaces:
                    raise ConfigError(
                        f"{a[1:]} given but the host has no links",
                        source=source,
                        field=f"host {nd.name!r}",
                    )
                delattr(nd, a)

    segments: list[Segment] = []
    nets4: dict[int, ipaddress.IPv4Network] = {}
    nets6: dict[int, ipaddress.IPv6Network] = {}
    for si, items in explicit.items():
        for nets, col in ((nets4, 1), (nets6, 2)):
            found = {it[col].network: it for it in items if it[col] is not None}
            if len(found) > 1:
                a, b = list(found.values())[:2]
                raise ConfigError(
                    f"addresses {a[col]} ({a[3]}) and {b[col]} ({b[3]}) are on the same L2 segment"
                    " but in different subnets",
                    source=source,
                )
            if found:
                nets[si] = next(iter(found))
    # overlap between explicit subnets of different segments
    for nets in (nets4, nets6):
        items = sorted(nets.items())
        for i, (sa, na) in enumerate(items):
            for sb, nb in items[i + 1 :]:
                if na.overlaps(nb):
                    raise ConfigError(
                        f"subnets {na} and {nb} overlap but belong to different links "
                        f"({_seg_desc(seg_list[sa], links)} / {_seg_desc(seg_list[sb], links)})",
                        source=source,
                    )
    auto4 = (n for n in AUTO_V4.subnets(new_prefix=24))
    k6 = 0
    for si in range(len(seg_list)):
        if si not in nets4:
            for cand in auto4:
                if cand.network_address.packed[2] == 0:
                    continue  # keep 10.0.0.0/24 free: users often pick it by hand
                if not any(cand.overlaps(n) for n in nets4.values()):
                    nets4[si] = cand
                    break
        if si not in nets6:
            while True:
                k6 += 1
                cand = ipaddress.ip_network(AUTO_V6_PREFIX.format(k6))
                if not any(cand.overlaps(n) for n in nets6.values()):
                    nets6[si] = cand
                    break
        segments.append(Segment(si, str(nets4[si]), str(nets6[si]), list(seg_list[si])))
    # fill in addresses
    for si, items in explicit.items():
        for ver, nets, col in ((4, nets4, 1), (6, nets6, 2)):
            net = nets[si]
            used = {it[col].ip for it in items if it[col] is not None}
            dup = [it for it in items if it[col] is not None]
            seen = {}
            for it in dup:
                if it[col].ip in seen:
                    raise ConfigError(
                        f"address {it[col].ip} assigned twice ({seen[it[col].ip]} and {it[3]})",
                        source=source,
                    )
                seen[it[col].ip] = it[3]
            hosts_iter = net.hosts()
            for intf, i4, i6, where in items:
                given = i4 if ver == 4 else i6
                if given is not None:
                    value = f"{given.ip}/{net.prefixlen}"
                else:
                    for h in hosts_iter:
                        if h not in used:
                            used.add(h)
                            value = f"{h}/{net.prefixlen}"
                            break
                    else:
                        raise ConfigError(
                            f"subnet {net} has no free address left", source=source, field=where
                        )
                if ver == 4:
                    intf.ip = value
                else:
                    intf.ip6 = value
    return segments


def _seg_desc(idxs, links):
    return ", ".join(f"{links[i].node1}-{links[i].node2}" for i in idxs)


def _compute_routes(nodes: dict[str, NodeSpec], segments: list[Segment], links: list[LinkSpec]):
    """Static routes: every host reaches every segment through the nearest forwarding hosts."""
    for nd in nodes.values():
        if nd.kind != "host":
            continue
        for seg, r in sorted(reachable_segments(nodes, nd.name).items()):
            if r.hops == 0:
                continue
            s = segments[seg]
            nd.routes.append({"dst": s.v4, "via": r.via.ip.split("/")[0], "dev": r.out.name})
            nd.routes.append({"dst": s.v6, "via": r.via.ip6.split("/")[0], "dev": r.out.name})


def _check_default_route(n: NodeSpec, source: str):
    where = f"host {n.name!r}"
    words = n.default_route.split()
    if len(words) != 2 or words[0] not in ("via", "dev"):
        raise ConfigError(
            f"defaultRoute must be 'via ADDRESS' or 'dev IFNAME', got {n.default_route!r}",
            source=source,
            field=where,
        )
    if words[0] == "dev" and words[1] not in {i.name for i in n.interfaces}:
        raise ConfigError(
            f"defaultRoute names interface {words[1]!r}; the host has {[i.name for i in n.interfaces]}",
            source=source,
            field=where,
        )
    if words[0] == "via":
        try:
            addr = ipaddress.ip_address(words[1])
        except ValueError:
            raise ConfigError(
                f"defaultRoute via {words[1]!r} is not an IP address", source=source, field=where
            )
        nets = [
            ipaddress.ip_interface(i.ip if addr.version == 4 else i.ip6).network
            for i in n.interfaces
        ]
        if not any(addr in net for net in nets):
            raise ConfigError(
                f"defaultRoute gateway {addr} is on none of the host's subnets {[str(x) for x in nets]}",
                source=source,
                field=where,
            )
