"""`tear_down(lab)`: stop a lab's tunnel and undo its routes, keeping the lab, from its
TunnelRecord (lab.vpn.record) alone: the driver by name, the ends where the tunnel had them, the
daemons it started. The profile is not loaded again (its file may have changed or be gone).
"""

from __future__ import annotations

import shutil
from dataclasses import replace

from lab.core.errors import LabError, StartupError
from lab.vpn import get_driver
from lab.vpn.base import TunnelContext
from lab.vpn.record import TunnelRecord
from lab.vpn.tunnel import end_side, endpoint, tunnel_addrs
from lab.vpn.tunneladdr import tunnel_routes


def context_of(lab, rec: TunnelRecord, *, where: bool = False) -> TunnelContext:
    """The TunnelContext of the lab's tunnel as its record `rec` gives it (ends, daemons).
    `where`: each daemon asked through its node (alive(), log_text()), as a board's must be;
    default: this machine's /proc and files, enough to stop them by PID."""
    drv = get_driver(rec.driver, source=f"lab {lab.id}: lab.json")
    client = end_side(lab.spec, rec.client, rec.server)
    server = end_side(lab.spec, rec.server, rec.client)
    ends = []
    for role, side in (("client", client), ("server", server)):
        # where the tunnel had them; one that never came up has them as bring_up gives them
        # to a profile without user files
        e = (rec.tunnel or {}).get(role)
        addrs = (e.v4, e.v6) if e else tunnel_addrs(drv, {}, side, role == "client")
        ends.append(endpoint(side, lab.node(side.node), addrs))
    daemons = [d.daemon() for d in rec.daemons]
    if where:
        daemons = [replace(d, where=lab.node(d.node)) for d in daemons]
    return TunnelContext(
        lab_id=lab.id,
        client=ends[0],
        server=ends[1],
        secrets_dir=lab.dir / "secrets",
        config_dir=lab.dir / "config" / "vpn",
        log_dir=lab.dir / "logs",
        daemons=daemons,
        profile=rec.profile,
    )


def tear_down(lab) -> None:
    """Stop the lab's tunnel and undo its routes; the lab itself stays up."""
    rec = TunnelRecord.of(lab)
    if rec is None:
        return
    drv = get_driver(rec.driver, source=f"lab {lab.id}: lab.json")
    ctx = context_of(lab, rec)
    client = end_side(lab.spec, rec.client, rec.server)
    server = end_side(lab.spec, rec.server, rec.client)
    errors = []
    try:
        drv.stop(ctx, rec.params)
    except (LabError, OSError) as e:  # keep going: the routes and files still have to go
        errors.append(f"stop: {e}")
    for end in ctx.ends():
        peer = ctx.peer(end)
        underlay = {r["dst"]: r for r in lab.spec.nodes[end.name].routes}
        for net in peer.behind:
            fam = "-6" if ":" in net else "-4"
            r = underlay.get(net)
            argv = (
                ["ip", fam, "route", "replace", net, "via", r["via"], "dev", r["dev"]]
                if r
                else ["ip", fam, "route", "del", net]
            )
            end.node.run(argv, check=False)
    addrs = [a for e in ctx.ends() for a in (e.tunnel_v4, e.tunnel_v6)]
    for node, argv in tunnel_routes(lab.spec, drv, client, server, addrs):
        lab.node(node).run(["ip", argv[1], "route", "del", argv[4]], check=False)
    shutil.rmtree(ctx.config_dir, ignore_errors=True)
    for f in ctx.secrets_dir.glob("*"):
        f.unlink(missing_ok=True)
    del lab.info["vpn"]
    lab.save()
    if errors:
        raise StartupError("; ".join(errors))
