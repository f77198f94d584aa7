"""A running lab: build a LabSpec into namespaces, links and cgroups; open it again; tear it down.

Every object is recorded in the ledger before it is created (see lab.core.state). A failure during
`up` unwinds everything already built before the error propagates.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from lab.core import cgroups
from lab.core.errors import ConfigError, PreconditionError
from lab.core.arch.emulate import ArchRoot
from lab.substrate.tools import board_tools
from lab.substrate.local.node import LocalNode
from lab.core.state import (
    Ledger,
    check_id,
    lab_dir,
    list_lab_ids,
    write_json_atomic,
)
from lab.model.labspec import LabSpec
import json

CGROUP_PARENT = "lab"
ROUTER_SYSCTLS = {"net.ipv4.ip_forward": "1", "net.ipv6.conf.all.forwarding": "1"}
NODE_SYSCTLS = {
    # no duplicate address detection: IPv6 addresses usable at once, not after ~2 s
    "net.ipv6.conf.all.accept_dad": "0",
    "net.ipv6.conf.default.accept_dad": "0",
    "net.ipv6.conf.default.accept_ra": "0",
    "net.ipv4.ping_group_range": "0 2147483647",
}


@dataclass
class NodeRuntime:
    name: str
    kind: str
    netns: str
    mntns: str | None
    cgroup: str
    cpu: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    #: the node's per-core groups (cpu hierarchy directories; lab/substrate/local/coreslots.py), [] if none
    cpu_slots: list = field(default_factory=list)
    #: the data plane's groups (lab/substrate/local/dataplane.py), [] if none
    dp_slots: list = field(default_factory=list)
    #: "arm64"/"armhf": the node runs that root's binaries under qemu-user (lab.core.arch)
    arch: str | None = None


class Lab:
    """An existing (or being built) lab on this machine."""

    def __init__(self, lab_id: str, info: dict):
        self.id = lab_id
        self.info = info
        self.dir = lab_dir(lab_id)
        self.ledger = Ledger(self.dir / "ledger.jsonl")
        self.spec = LabSpec.from_json(info["spec"])
        layout = info["cgroup"]
        self.cg = cgroups.CgroupLayout(layout["version"], Path(layout["root"]))
        self.runtime = {n: NodeRuntime(**r) for n, r in info["nodes"].items()}

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, lab_id: str | None = None) -> Lab:
        lab_id = resolve_id(lab_id)

        path = lab_dir(lab_id) / "lab.json"
        try:
            info = json.loads(path.read_text())
        except FileNotFoundError:
            raise PreconditionError(
                f"lab {lab_id!r} is not up (no {path}); `lab clean` removes remains"
            )
        return cls(lab_id, info)

    def save(self) -> None:
        write_json_atomic(self.dir / "lab.json", self.info)

    def node(self, name: str) -> LocalNode:
        rt = self.runtime.get(name)
        if rt is None or rt.kind != "host":
            hosts = [n for n, r in self.runtime.items() if r.kind == "host"]
            raise ConfigError(
                f"no host {name!r} in lab {self.id!r}; hosts: {', '.join(hosts)}", source="NODE"
            )
        return LocalNode(
            self.id,
            name,
            netns=rt.netns,
            mntns=Path(rt.mntns) if rt.mntns else None,
            procs_files=cgroups.procs_files(self.cg, rt.cgroup),
            cpu_slots=rt.cpu_slots,
            dataplane=(rt.cpu.get("dataplane", {}).get("daemon"), rt.dp_slots),
            dataplane_queue=rt.cpu.get("dataplane", {}).get("queue"),
            env=rt.env,
            ledger=self.ledger,
            log_dir=self.dir / "logs",
            arch=ArchRoot.open(rt.arch, board_tools()) if rt.arch else None,
        )

    def nodes(self) -> dict[str, LocalNode]:
        return {n: self.node(n) for n, r in self.runtime.items() if r.kind == "host"}

    def status(self) -> dict:
        info = self.info
        if w := info.get("cpu_weight"):
            # the shared parent's weight now: a host-speed lab built since lowers it
            now = cgroups.weight(self.cg, CGROUP_PARENT)
            info = {**info, "cpu_weight": {**w, "parent": now if now is not None else w["parent"]}}
        return lab_status(
            self.id,
            info,
            self.spec,
            {
                name: {
                    "kind": rt.kind,
                    "netns": rt.netns,
                    "cpu": rt.cpu,
                    **({"arch": rt.arch} if rt.arch else {}),
                }
                for name, rt in self.runtime.items()
            },
        )


def lab_status(lab_id: str, info: dict, spec: LabSpec, where: dict[str, dict]) -> dict:
    """`lab status --json` of a lab: its nodes (with `where[node]`: kind, netns or board, ...),
    interfaces and addresses, and the VPN, impairment, warnings and substrate records."""
    out = {
        "id": lab_id,
        "state": info.get("state"),
        "topology": spec.source,
        "topo": spec.topo_name,
        "created": info.get("created"),
        "nodes": {},
    }
    for name, fields in where.items():
        n = spec.nodes[name]
        out["nodes"][name] = {
            **fields,
            "router": n.router,
            "interfaces": [
                {"name": i.name, "ip": i.ip, "ip6": i.ip6, "peer": f"{i.peer_node}:{i.peer_name}"}
                for i in n.interfaces
            ],
        }
    for k in ("vpn", "impair", "nic_latency", "cpu_weight", "warnings", "substrate"):
        if k in info:
            out[k] = info[k]
    return out


def resolve_id(lab_id: str | None) -> str:
    if lab_id:
        return check_id(lab_id)
    ids = list_lab_ids()
    if len(ids) == 1:
        return ids[0]
    if not ids:
        raise PreconditionError("no lab is up; start one with `lab up TOPOLOGY`")
    raise ConfigError(
        f"several labs are up ({', '.join(ids)}); choose one with --id", source="--id"
    )


def current_substrate() -> dict:
    """What this lab runs on: this machine's kernel, or (LAB_SUBSTRATE, set by lab.substrate.vm.lab for the
    `lab up` it runs in a guest) the full-kernel VM with its accelerator and evidence class."""
    given = os.environ.get("LAB_SUBSTRATE")
    if given:
        return json.loads(given)
    return {"kind": "local", "kernel": os.uname().release}
