"""Building a LabSpec into namespaces, links and cgroups on this machine (`LocalBuild`, run by
lab.substrate.lifecycle's phases; `up` is the one entry). Every object is recorded in the ledger
before it is created (lab.core.state); the unwinding is lab.core.teardown's."""

from __future__ import annotations

import time

from lab.core import cgroups, netops
from lab.core.arch.emulate import ArchRoot
from lab.substrate.tools import board_tools
from lab.core.errors import ConfigError, PreconditionError
from lab.core.state import Ledger, create_lab_dir, lab_dir, run_root, write_json_atomic
from lab.core.teardown import teardown
from lab.impair import runtime
from lab.model.impairment.directional import needs_engine
from lab.impair.kernel import probe_netem
from lab.model import dilation
from lab.model.labspec import LabSpec
from lab.substrate import lifecycle
from lab.substrate.local import nicside
from lab.substrate.local.engines import create_bump, spawn_engine
from lab.substrate.local.dataplane import dataplane_plan, group_rel
from lab.substrate.local.cpuplan import (
    cpu_plan,
    nic_latency_plan,
    nic_to_points,
    start_core_balancer,
)
from lab.substrate.local.lab import (
    CGROUP_PARENT,
    NODE_SYSCTLS,
    ROUTER_SYSCTLS,
    Lab,
    NodeRuntime,
    current_substrate,
)
from lab.substrate.local.storage import build_storage, storage_plan
from lab.vpn.profiles import Profile
from lab.vpn.tunnel import check_plan, place, prepare


class LocalBuild(lifecycle.Build):
    """A lab of this machine's namespaces being built."""

    check_backend = "userspace"

    def __init__(self, spec: LabSpec, impair_backend: str = "auto"):
        super().__init__(spec)
        self.impair_backend = impair_backend
        self.layout = None
        self.cpu: dict = {}
        self.warnings: list[str] = []

    def prepare_vpn(self, profile: str | Profile):
        # checked on this machine: its nodes will be these
        if isinstance(profile, Profile):  # as a plan loaded it: placed and checked, not re-read
            return check_plan(self.spec, place(self.spec, profile))
        return prepare(self.spec, profile)

    def check(self, lab_id: str, vpn) -> None:
        netops.check_root()
        self.layout = cgroups.probe()
        self.cpu, self.warnings = cpu_plan(self.spec, self.layout, current_substrate())
        self.warnings += storage_plan(self.spec, self.cpu, lab_id)  # the boards' cards
        self.warnings += _arch_plan(self.spec, self.cpu, vpn)
        self.warnings += dataplane_plan(self.cpu, vpn)
        for n in self.spec.nodes.values():
            if netops.netns_exists(f"{lab_id}-{n.name}"):
                raise PreconditionError(
                    f"network namespace {lab_id}-{n.name} already exists: lab {lab_id!r} is up "
                    f"or was not cleaned; run `lab down --id {lab_id}` / `lab clean`, or pick "
                    "another --id"
                )

    def create(self, lab_id: str) -> Lab:
        d = create_lab_dir(lab_id)
        info = {
            "id": lab_id,
            "state": "building",
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "spec": self.spec.to_json(),
            "cgroup": {"version": self.layout.version, "root": str(self.layout.root)},
            "nodes": {},
            "warnings": self.warnings,
            "substrate": current_substrate(),
        }
        ledger = Ledger(d / "ledger.jsonl")
        ledger.record(
            "lab", id=lab_id, cgroup_version=self.layout.version, cgroup_root=str(self.layout.root)
        )
        self.ledger = ledger
        return Lab(lab_id, info)

    def build(self, lab: Lab, impair: str | None, placement: str | None) -> Lab:
        build_lab(
            self.spec,
            lab.id,
            self.layout,
            self.cpu,
            self.ledger,
            lab.info,
            impair,
            placement,
            self.impair_backend,
        )
        return Lab(lab.id, lab.info)  # its nodes' runtime is in lab.info now

    def unwind(self, lab: Lab) -> list[str]:
        return teardown(lab.id)


def up(
    spec: LabSpec,
    lab_id: str | None = None,
    *,
    vpn=None,
    impair: str | None = None,
    placement: str | None = None,
    impair_backend: str = "auto",
) -> Lab:
    """Build `spec` as lab `lab_id`. On any failure everything built so far is removed.

    `vpn`: a profile spec ("wireguard:mtu=1280") or a lab.vpn.tunnel.TunnelPlan from
    prepare() (validated before anything is created); the tunnel is started inside the same
    unwind scope, so a tunnel that fails to come up removes the whole lab.

    `impair`: build impairment points (placement: middlebox/egress/ingress, default by topology)
    and apply this spec ("none" = points only, for `lab impair set` later). Links with their own
    impairment options in the topology imply `impair="none"` at least.
    `impair_backend`: "auto" (kernel netem when present, else the userspace engine),
    "kernel-netem" or "userspace".
    """
    build = LocalBuild(spec, impair_backend)
    return lifecycle.up(build, lab_id, vpn=vpn, impair=impair, placement=placement)


def _arch_plan(spec: LabSpec, cpu: dict[str, dict], vpn=None) -> list[str]:
    """Nodes of another architecture: their root and qemu-user must be here, and a tunnel end
    among them must use a user-space data plane (refused before anything is created). No CPU
    quota applies to them: qemu-user translates every instruction, so a quota fitted to native
    code would make them far slower than a board. The profile's masks still apply (and the
    architecture's own, lab.core.arch). Returns warnings."""
    emulated = [n for n in spec.hosts() if n.arch]
    path = vpn.availability.path if vpn is not None and vpn.availability else None
    for n in emulated:
        ArchRoot.open(n.arch, board_tools())
        if path == "kernel" and n.name in (vpn.client.node, vpn.server.node):
            # the board's tools cannot drive XFRM or generic netlink under qemu-user, and a
            # kernel data plane runs no board binary anyway (docs/arch.md)
            raise PreconditionError(
                f"node {n.name!r} ({n.arch}): profile {vpn.profile.name!r} would use the kernel "
                "data plane, which no board binary runs; pick its user-space one "
                "(wireguard:implementation=wireguard-go, ipsec-*:dataplane=libipsec) or an x86 "
                "node (docs/arch.md)"
            )
        plan = cpu.setdefault(n.name, {"profile": None, "cores": None, "env": {}})
        if plan.get("cores") is not None:
            plan.update(cores=None, slots=0, not_applied="qemu-user")
    if not emulated:
        return []
    return [
        f"{', '.join(f'{n.name} ({n.arch})' for n in emulated)}: the board's own binaries under "
        "qemu-user, no CPU cap: functional evidence, not performance (docs/arch.md)"
    ]


def impair_plan(spec, lab_id, info, impair, placement, backend):

    a, b = spec.endpoints("vpn")
    if backend == "auto" and needs_engine(impair, a=a, b=b):
        backend, why = "userspace", "a trace-driven link (trace): only the lab's engine has it"
    elif backend == "auto":
        first = next(n for n in spec.hosts())
        probe_node = Lab(lab_id, info).node(first.name)
        backend, why = runtime.choose_backend(probe_node)
    elif backend == "kernel-netem":
        if needs_engine(impair, a=a, b=b):
            raise ConfigError(
                "--impair-backend kernel-netem: the --impair words have a trace, which only the "
                "lab's engine runs; use --impair-backend userspace (or auto)",
                source="--impair-backend",
            )
        first = next(n for n in spec.hosts())
        pr = probe_netem(Lab(lab_id, info).node(first.name))
        if not pr.ok:
            raise PreconditionError(
                f"--impair-backend kernel-netem: {pr.reason}; run the lab in the "
                "full-kernel VM (`lab up --vm`) or use --impair-backend userspace"
            )
        why = "chosen with --impair-backend"
    elif backend == "userspace":
        why = "chosen with --impair-backend"
    else:
        raise ConfigError(
            f"impairment backend must be auto, kernel-netem or userspace, got {backend!r}",
            source="--impair-backend",
        )
    return runtime.plan_for(spec, placement, impair, backend, why)


def _netem_here(spec, lab_id, info) -> tuple[bool, str]:
    """(kernel netem usable, why not), probed in the lab's first host."""

    pr = probe_netem(Lab(lab_id, info).node(spec.hosts()[0].name))
    return pr.ok, pr.reason


def _build_bump(lab_id, lk, layout, ledger, info, all_cpus) -> None:
    """Splice a bump-in-the-wire namespace into link `lk`: node1 <-> [imp-a engine imp-b] <-> node2."""

    name = f"imp{lk.index}"
    ns = runtime.bump_ns(lab_id, lk.index)
    rel = create_bump(ledger, layout, lab_id, name, ns, all_cpus)
    ns1, ns2 = f"{lab_id}-{lk.node1}", f"{lab_id}-{lk.node2}"
    ledger.record("veth", ns=ns1, ifname=lk.intf1, peer_ns=ns, peer=runtime.BUMP_A)
    netops.create_veth(ns1, lk.intf1, ns, runtime.BUMP_A, lk.mtu)
    ledger.record("veth", ns=ns, ifname=runtime.BUMP_B, peer_ns=ns2, peer=lk.intf2)
    netops.create_veth(ns, runtime.BUMP_B, ns2, lk.intf2, lk.mtu)
    netops.configure_node(ns, [{"name": runtime.BUMP_A}, {"name": runtime.BUMP_B}], [])
    info["impair"]["engines"].append(
        {
            "name": name,
            "link": lk.index,
            "netns": ns,
            "cgroup": rel,
            "a": f"{lk.node1}:{lk.intf1}",
            "b": f"{lk.node2}:{lk.intf2}",
        }
    )


def start_engines(lab: Lab, iplan) -> None:
    """Start one engine per bump with the initial spec; wait until each answers."""

    for eng in lab.info["impair"]["engines"]:
        eng["fwd_dir"] = runtime.engine_fwd_dir(lab.spec, eng["link"])
        spawn_engine(lab, eng, runtime.BUMP_A, runtime.BUMP_B)
    lab.save()


def build_lab(
    spec, lab_id, layout, cpu, ledger, info, impair=None, placement=None, impair_backend="auto"
) -> None:
    d = lab_dir(lab_id)
    for sub in ("logs", "secrets", "config"):
        (d / sub).mkdir(mode=0o700, exist_ok=True)
    # only lab.json is needed to open a lab; write it early so `down` works mid-build too
    write_json_atomic(d / "lab.json", info)
    ns_dir = run_root() / lab_id / "ns"
    ledger.record("mntdir", path=str(ns_dir))
    netops.create_private_dir_mount(ns_dir)

    for rel in (CGROUP_PARENT, f"{CGROUP_PARENT}/{lab_id}"):
        ledger.record("cgroup", rel=rel, shared=rel == CGROUP_PARENT)
        cgroups.ensure_dir(layout, rel)
    # a capped lab's weight against the host's other work (docs/cpu.md "The lab's CPU weight")
    capped = all((cpu.get(n.name) or {}).get("cores") for n in spec.hosts())
    info["cpu_weight"] = cgroups.weigh_lab(
        layout, CGROUP_PARENT, f"{CGROUP_PARENT}/{lab_id}", capped=capped
    )

    all_cpus = cgroups.all_cpus(layout)
    for n in spec.nodes.values():
        netns_name = f"{lab_id}-{n.name}"
        rel = f"{CGROUP_PARENT}/{lab_id}/{n.name}"
        mnt = ns_dir / n.name if n.kind == "host" else None
        plan = cpu.get(n.name, {"cores": None, "env": {}})
        info["nodes"][n.name] = NodeRuntime(
            n.name, n.kind, netns_name, str(mnt) if mnt else None, rel, plan, plan.get("env", {})
        ).__dict__
        info["nodes"][n.name]["arch"] = n.arch
        ledger.record("cgroup", rel=rel, node=n.name)
        cgroups.ensure_dir(layout, rel)
        # the CFS period of the node's quotas (lab.model.dilation.cfs_period_us: 10 ms, stretched
        # for a time-dilated lab and for small shares), recorded with the node's cpu plan
        period = cgroups.PERIOD_US
        dp = plan.get("dataplane") or {}
        shares = [
            c for c in (plan.get("cores"), plan.get("slot_cores"), dp.get("group_cores")) if c
        ]
        if shares:
            period = dilation.cfs_period_us(
                dilation.factor(plan.get("dilation")), min_share=min(shares)
            )
            plan["period_us"] = period
        cgroups.set_cpu(layout, rel, plan.get("cores"), all_cpus, period_us=period)
        # which mechanism models the node's cores here (lab.json, `lab status`, run manifests)
        plan["cgroup"] = cgroups.cgroup_record(
            layout, slots=plan.get("slots") or 0, refused=plan.get("per_core_not_applied")
        )
        for i in range(plan.get("slots") or 0):
            # one group per board core under the node's quota (lab/substrate/local/coreslots.py;
            # v2: threaded children of the node group, cgroups.ensure_slot)
            ledger.record("cgroup", rel=cgroups.slot_rel(rel, i), node=n.name, slot=i)
            slot = cgroups.ensure_slot(layout, rel, i, plan["slot_cores"], period_us=period)
            info["nodes"][n.name]["cpu_slots"].append(slot)
        for i in range(dp.get("groups") or 0):
            # the data plane's own groups: the board's threading and crypto speed for the
            # process carrying the tunnel's packets (lab/substrate/local/dataplane.py)
            dp_rel = group_rel(rel, i)
            ledger.record("cgroup", rel=dp_rel, node=n.name, dataplane=i)
            slot = cgroups.ensure_slot(
                layout, rel, i, dp["group_cores"], period_us=period, rel_of=dp_rel
            )
            info["nodes"][n.name]["dp_slots"].append(slot)
        ledger.record("netns", name=netns_name, node=n.name)
        netops.create_netns(netns_name)
        if mnt is not None:
            sysctls = dict(NODE_SYSCTLS)
            if n.router:
                sysctls.update(ROUTER_SYSCTLS)
            # the board OS's TCP defaults (congestion control, buffers), per network namespace
            sysctls.update(plan.get("os") or {})
            ledger.record("mntns", path=str(mnt), node=n.name)
            netops.create_node_mntns(netns_name, mnt, sysctls)
    build_storage(lab_id, info, ledger)  # the boards' cards, in the nodes' mount namespaces
    write_json_atomic(d / "lab.json", info)
    start_core_balancer(lab_id, layout, info, ledger)

    # the boards' NICs: a delay on the VPN path's impairment points (docs/cpu.md "A board model")
    nic, nic_warnings = nic_latency_plan(
        spec, cpu, lambda: _netem_here(spec, lab_id, info), engine_anyway=impair is not None
    )
    info["nic_latency"] = nic
    side = nicside.wanted(nic)  # its warning only if the side path cannot be built (nicside)
    info["warnings"] += [] if side else nic_warnings
    if nic["applied"] and impair is None:
        impair = "none"

    iplan = None
    if impair is not None:
        iplan = impair_plan(spec, lab_id, info, impair, placement, impair_backend)
        info["impair"] = runtime.plan_json(iplan)
        nic_to_points(nic, info["impair"])
        write_json_atomic(d / "lab.json", info)

    for lk in spec.links:
        ns1, ns2 = f"{lab_id}-{lk.node1}", f"{lab_id}-{lk.node2}"
        if iplan is not None and lk.index in iplan.engine_links:
            _build_bump(lab_id, lk, layout, ledger, info, all_cpus)
            continue
        ledger.record("veth", ns=ns1, ifname=lk.intf1, peer_ns=ns2, peer=lk.intf2)
        netops.create_veth(ns1, lk.intf1, ns2, lk.intf2, lk.mtu)

    for n in spec.nodes.values():
        ns = f"{lab_id}-{n.name}"
        if n.kind == "switch":
            ledger.record("bridge", ns=ns, ifname="br0")
            netops.configure_node(
                ns,
                [{"name": i.name} for i in n.interfaces],
                [],
                bridge_ports=[i.name for i in n.interfaces],
            )
        else:
            netops.configure_node(
                ns, [i.__dict__ for i in n.interfaces], n.routes, default_route=n.default_route
            )

    # shaping first: a kernel netem on a shaped link goes under the tbf (runtime.netem_parent)
    for lk in spec.links:
        if lk.bw:
            for node, ifname in ((lk.node1, lk.intf1), (lk.node2, lk.intf2)):
                ns = f"{lab_id}-{node}"
                ledger.record("qdisc", ns=ns, ifname=ifname, qdisc="tbf")
                netops.set_tbf(
                    ns,
                    ifname,
                    lk.bw,
                    limit_pkts=lk.max_queue_size,
                    dilation=dilation.factor(spec.dilation),
                )

    if iplan is not None:
        lab = Lab(lab_id, info)
        if iplan.backend == "userspace":
            start_engines(lab, iplan)
        else:
            offloads_off(lab, iplan)
        for lk in spec.links:
            if lk.impair:
                runtime.set_base(lab, lk.impair, f"{lk.node1}-{lk.node2}")
        runtime.set_point(lab, iplan.initial)
    if side:  # the boards' NICs beside the link, for latency tests (docs/cpu.md "The side path")
        info["warnings"] += nicside.build(Lab(lab_id, info), nic, all_cpus, nic_warnings)


def offloads_off(lab: Lab, iplan) -> None:
    """Kernel netem sees what the stack hands the qdisc: with TSO/GSO on, 64 KB super-frames that
    per-packet models would drop or duplicate whole. Turn segmentation and receive offloads off
    on both ends of every impaired link, so every packet a qdisc sees is a wire packet
    (docs/impairment.md "Wire packets"). The interfaces die with the lab: nothing to restore."""

    done = []
    for idx in sorted({p.link for p in iplan.points}):
        lk = lab.spec.links[idx]
        for node, ifname in ((lk.node1, lk.intf1), (lk.node2, lk.intf2)):
            lab.node(node).run(["ethtool", "-K", ifname, *runtime.OFFLOADS_OFF])
            done.append(f"{node}:{ifname}")
    lab.info["impair"]["offloads_off"] = done
    lab.save()
