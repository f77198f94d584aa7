"""What the lab's impairment holds in its queues now: the engine's queue_depth counters and the
kernel netem qdiscs' qlen, per direction or point. A cold establishment waits for them to drain
(lab.vpn.control.TunnelControl.quiesce, handed this by the runner: vpn and impair share a floor)."""

from __future__ import annotations

import json

from lab.impair import kernel
from lab.impair.runtime import engine_client


def queued_packets(lab) -> dict[str, int]:
    """Packets the lab's impairment holds now, per engine direction ("imp1:a2b", the engine's
    queue_depth counter) or netem point ("router:router-eth1", the netem qdisc's qlen from
    `tc -s -j qdisc show`); {} without impairment. An engine or qdisc that does not answer is
    left out (`lab impair show` says why). What a cold establishment waits to drain
    (lab.vpn.control.TunnelControl.quiesce)."""
    st = (getattr(lab, "info", None) or {}).get("impair")  # a lab of any substrate, or none
    if not st:
        return {}
    out: dict[str, int] = {}
    if st["backend"] == "kernel-netem":
        for p in st["points"]:
            dev = f"ifb{p['link']}" if st["placement"] == "ingress" else p["ifname"]
            cp = lab.node(p["node"]).run(["tc", "-s", *kernel.show_argv(dev)[1:]], check=False)
            if cp.returncode == 0:
                out[f"{p['node']}:{dev}"] = netem_qlen(cp.stdout)
        return out
    for eng in st.get("engines") or []:
        try:
            shown = engine_client(lab, eng).show()
        except Exception:  # noqa: BLE001 -- a dead engine holds nothing; show says why
            continue
        for d in ("a2b", "b2a"):
            counters = (shown.get(d) or {}).get("counters") or {}
            if "queue_depth" in counters:
                out[f"{eng['name']}:{d}"] = int(counters["queue_depth"])
    return out


def netem_qlen(tc_json: str) -> int:
    """The packets netem qdiscs hold in `tc -s -j qdisc show dev IF` output (their qlen)."""
    return sum(
        int(q.get("qlen") or 0) for q in json.loads(tc_json or "[]") if q.get("kind") == "netem"
    )
