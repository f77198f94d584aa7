"""The resolved topology as data: LabSpec and its nodes, links, interfaces and L2 segments.

Pure data, written by lab.model.topology (load_topology / resolve) and lab.model.addressing, read by every
layer above; to_json/from_json are the lab.json form.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from lab.core.errors import ConfigError


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
    #: "arm64"/"armhf": the node runs the board's own binaries under qemu-user (lab.core.arch)
    arch: str | None = None
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
    impair: str | None = None  # tc-netem words, validated by lab.model.impairment.spec when present
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
    #: time dilation (lab.model.dilation): a factor >= 1 or "auto" as asked (`-p dilation=`, a plan's
    #: [topology] dilation); lab.substrate.local.cpuplan.cpu_plan resolves "auto" to the factor in force
    dilation: float | str = 1.0
    #: per-hop NIC latency of the boards' profiles ([link]): "auto" | "on" | "off" (`-p
    #: nic_latency=`, a plan's [topology] nic_latency; lab.substrate.local.cpuplan.nic_decision, docs/cpu.md)
    nic_latency: str = "auto"

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
            dilation=d.get("dilation", 1.0),
            nic_latency=d.get("nic_latency", "auto"),
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
