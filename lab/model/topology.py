"""Load a Mininet-style topology file and resolve it into a validated, fully addressed LabSpec.

Pure data: nothing here touches the system. Every problem is a ConfigError naming the file, the
node or link, and the accepted values, raised before anything is created. This module validates
the host, switch and link options; lab.model.topofile imports the file and builds its Topo,
lab.model.addressing gives segments, addresses and routes, lab.model.labspec holds the resulting dataclasses.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lab.model.addressing import assign, check_default_route, compute_routes
from lab.core.arch import ARCHES
from lab.model.cpuprofile import known_profiles
from lab.model.cpuprofile import parse_nic_latency
from lab.model.dilation import parse_dilation
from lab.core.errors import ConfigError
from lab.model.impairment.model import parse_spec
from lab.model.labspec import Interface, LabSpec, LinkSpec, NodeSpec, Segment
from lab.model.params import Param, validate
from lab.core.paths import locate
from lab.model.topofile import build_topo

# the dataclasses live in lab.model.labspec; their old home still names them
__all__ = ["Interface", "LabSpec", "LinkSpec", "NodeSpec", "Segment", "load_topology", "resolve"]

IFNAMSIZ = 15  # bytes, without the trailing NUL (linux/if.h IFNAMSIZ - 1)


def _nonblank(what: str) -> Callable[[str], str | None]:
    return lambda v: None if v.strip() else f"empty; give {what}"


def _cpu_check(cpu: str | float) -> str | None:
    if isinstance(cpu, float):
        return None if 0.01 <= cpu <= 1024 else f"got {cpu!r} cores"
    if cpu not in known_profiles():
        return f"unknown CPU profile {cpu!r}; profiles: {', '.join(known_profiles())}"
    return None


#: the options of addHost (lab.model.params schema; Mininet's own options are not accepted)
HOST_OPTIONS = {
    "cpu": Param(
        (str, float),
        None,
        "CPU profile name (see cpu_profiles/) or a fraction of one core, e.g. 0.25",
        optional=True,
        check=_cpu_check,
        accepts="a CPU profile name (cpu_profiles/) or a core fraction 0.01..1024",
    ),
    "ip": Param(
        str,
        None,
        "IPv4 address with prefix for the host's first interface, e.g. '10.0.1.2/24'",
        optional=True,
    ),
    "ip6": Param(
        str,
        None,
        "IPv6 address with prefix for the host's first interface, e.g. 'fd00:1::2/64'",
        optional=True,
    ),
    "defaultRoute": Param(
        str,
        None,
        "'via ADDRESS' or 'dev IFNAME' (Mininet syntax)",
        optional=True,
        check=_nonblank("'via ADDRESS' or 'dev IFNAME'"),
    ),
    "router": Param(
        bool,
        False,
        "True: the node forwards IPv4/IPv6 between its interfaces",
        choices=(True, False),
    ),
    "vpn": Param(str, None, "tunnel endpoint role", choices=("client", "server"), optional=True),
    "traffic": Param(
        str, None, "measurement endpoint role", choices=("client", "server"), optional=True
    ),
    "arch": Param(
        str,
        None,
        "'arm64' or 'armhf': run the board's own binaries (lab arch fetch ARCH; docs/arch.md)",
        choices=tuple(ARCHES),
        optional=True,
    ),
}
SWITCH_OPTIONS: dict[str, Param] = {}
#: the options of addLink; Mininet's Topo.addLink adds node1, node2, port1 and port2 itself
LINK_OPTIONS = {
    "bw": Param(
        float,
        None,
        "bandwidth, shaped with tbf on both ends",
        min=0.001,
        max=100000,
        optional=True,
        unit="Mbit/s",
    ),
    "delay": Param(
        str,
        None,
        "one-way delay per direction, e.g. '40ms' (Mininet TCLink)",
        optional=True,
        accepts="a time with its unit, e.g. '40ms'",
    ),
    "jitter": Param(
        str,
        None,
        "delay variation, e.g. '5ms' (Mininet TCLink)",
        optional=True,
        accepts="a time with its unit, e.g. '5ms'",
    ),
    "loss": Param(
        float,
        None,
        "loss percentage per direction (Mininet TCLink)",
        min=0,
        max=100,
        optional=True,
        unit="%",
    ),
    "max_queue_size": Param(
        int, None, "queue length in packets (Mininet TCLink)", min=1, max=10**6, optional=True
    ),
    "impair": Param(
        str,
        None,
        "impairment spec in tc-netem words, e.g. 'delay 40ms 5ms loss 0.5%'",
        optional=True,
        check=_nonblank("tc-netem words"),
    ),
    "mtu": Param(
        int, None, "interface MTU on both ends", min=68, max=65535, optional=True, unit="bytes"
    ),
    "params1": Param(
        dict,
        None,
        "per-interface options for node1: ip, ip6",
        optional=True,
        accepts="a dict with keys ip, ip6",
    ),
    "params2": Param(
        dict,
        None,
        "per-interface options for node2: ip, ip6",
        optional=True,
        accepts="a dict with keys ip, ip6",
    ),
    "intfName1": Param(str, None, "interface name on node1 (<= 15 bytes)", optional=True),
    "intfName2": Param(str, None, "interface name on node2 (<= 15 bytes)", optional=True),
}
MININET_LINK_KEYS = ("node1", "node2", "port1", "port2")
INTF_OPTIONS = {
    "ip": Param(str, None, "IPv4 address with prefix", optional=True),
    "ip6": Param(str, None, "IPv6 address with prefix", optional=True),
}
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*\Z")
NAME_MAX = 32  # node names become namespace, cgroup and file names (with the lab id)
IFNAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*\Z")  # what ip(8) takes without quoting


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


def find_topology(text: str | Path) -> Path:
    """A topology file: a path (relative to the current directory, else to the installation)
    or the name of a file in topologies/ (lab.core.paths says the rule)."""
    return locate("topology", str(text), field="TOPOLOGY")


def load_topology(path: str | Path, topo: str | None = None, params: dict | None = None) -> LabSpec:
    """Find (find_topology) and import the topology file, build the chosen Topo and resolve it
    into a LabSpec."""
    path = find_topology(path)
    params = dict(params or {})
    # a lab parameter, not the topology's: its build() never sees it (docs/cpu.md "Time dilation")
    dilation = parse_dilation(params.pop("dilation", 1.0), source=str(path), field="dilation")
    nic = parse_nic_latency(params.pop("nic_latency", "auto"), source=str(path))
    obj, topo = build_topo(path, topo, params)
    spec = resolve(obj, source=str(path), topo_name=topo, params=params)
    spec.dilation = dilation
    spec.nic_latency = nic
    return spec


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
        schema = SWITCH_OPTIONS if is_switch else HOST_OPTIONS
        opts = validate(schema, info, source=source, field_prefix=f"{where}: ", noun="option")
        nodes[name] = _node_spec(name, is_switch, opts)

    links: list[LinkSpec] = []
    used_ifnames: dict[str, set[str]] = {n: set() for n in nodes}
    raw_links = topo.links(sort=False, withKeys=True, withInfo=True)
    link_addrs: list[dict] = []
    for idx, (a, b, _key, info) in enumerate(raw_links):
        info = dict(info)
        where = f"link {a}-{b}"
        node1, node2, port1, port2 = (info.pop(k) for k in MININET_LINK_KEYS)
        info = validate(LINK_OPTIONS, info, source=source, field_prefix=f"{where}: ", noun="option")
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
        for end, node, port in ((1, node1, port1), (2, node2, port2)):
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
        lk.bw, lk.mtu, lk.max_queue_size = info["bw"], info["mtu"], info["max_queue_size"]
        lk.impair = _link_impairment(info, source, where)
        addrs = {}
        for end in (1, 2):
            addrs[end] = validate(
                INTF_OPTIONS,
                info[f"params{end}"],
                source=source,
                field_prefix=f"{where} params{end}: ",
                noun="option",
            )
        link_addrs.append(addrs)
        links.append(lk)
    _check_connected_names(nodes, links, source)
    segments = assign(nodes, links, link_addrs, source)
    compute_routes(nodes, segments, links)
    for n in nodes.values():
        if n.default_route:
            check_default_route(n, source)
    return LabSpec(source, topo_name, dict(params or {}), nodes, links, segments)


def _node_spec(name: str, is_switch: bool, opts: dict) -> NodeSpec:
    """A node from its validated options."""
    if is_switch:
        return NodeSpec(name=name, kind="switch")
    n = NodeSpec(
        name=name,
        kind="host",
        cpu=opts["cpu"],
        arch=opts["arch"],
        router=opts["router"],
        vpn=opts["vpn"],
        traffic=opts["traffic"],
        default_route=opts["defaultRoute"],
    )
    n._ip = opts["ip"]  # type: ignore[attr-defined]  # consumed by lab.model.addressing.assign
    n._ip6 = opts["ip6"]  # type: ignore[attr-defined]
    return n


def _link_impairment(info, source, where) -> str | None:
    """The link's impairment in tc-netem words: `impair` and Mininet's delay/jitter/loss."""
    parts = []
    if info["impair"] is not None:
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
            words += ["loss", f"{tc['loss']:g}%"]
        parts.append(" ".join(words))
    if not parts:
        return None
    text = " ".join(parts)
    parse_spec(text, source=f"{source}: {where}")  # refused here, before anything is built
    return text


def _check_connected_names(nodes, links, source):
    for n in nodes.values():
        if n.kind == "switch" and not any(n.name in (lk.node1, lk.node2) for lk in links):
            raise ConfigError("switch has no links", source=source, field=f"switch {n.name!r}")
