"""Load a Mininet-style topology file and resolve it into a validated, fully addressed LabSpec.

Pure data: nothing here touches the system. Every problem is a ConfigError naming the file, the
node or link, and the accepted values, raised before anything is created. This module validates
the host, switch and link options; lab.topofile imports the file and builds its Topo,
lab.addressing gives segments, addresses and routes, lab.labspec holds the resulting dataclasses.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .addressing import assign, check_default_route, compute_routes
from .arch import ARCHES
from .errors import ConfigError
from .labspec import Interface, LabSpec, LinkSpec, NodeSpec, Segment
from .topofile import build_topo

# the dataclasses live in lab.labspec; their old home still names them
__all__ = ["Interface", "LabSpec", "LinkSpec", "NodeSpec", "Segment", "load_topology", "resolve"]

IFNAMSIZ = 15  # bytes, without the trailing NUL (linux/if.h IFNAMSIZ - 1)

HOST_OPTIONS = {
    "cpu": "CPU profile name (see cpu_profiles/) or a fraction of one core, e.g. 0.25",
    "arch": "'arm64' or 'armhf': run the board's own binaries (lab arch fetch ARCH; docs/arch.md)",
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
    params = dict(params or {})
    obj, topo = build_topo(path, topo, params)
    return resolve(obj, source=str(path), topo_name=topo, params=params)


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
    segments = assign(nodes, links, link_addrs, source)
    compute_routes(nodes, segments, links)
    for n in nodes.values():
        if n.default_route:
            check_default_route(n, source)
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
    arch = info.get("arch")
    if arch is not None:
        if not isinstance(arch, str) or arch not in ARCHES:
            raise ConfigError(
                f"arch: unknown architecture {arch!r}; accepted: {', '.join(ARCHES)}",
                source=source,
                field=where,
            )
        n.arch = arch
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
