"""Where each entry of `lab impair show` acts, in the words of the `lab status` table: the link
(its node names), the direction on it (`router->server`) and which tunnel direction that carries
(`client->server`: VPN client to VPN server, `server->client` the other way).

Keyed as show_impairment's `requested` and `applied` (NODE:IFACE for a point or a kernel qdisc,
ENGINE:a2b / ENGINE:b2a for an engine's direction), so the CLI prints no key without its words.
"""

from __future__ import annotations

from lab.model.labspec import LabSpec

WAYS = {"fwd": "client->server", "rev": "server->client"}


def directions(spec: LabSpec, st: dict) -> dict[str, dict[str, str]]:
    """{key: {"link", "from", "to", "way"}} for every point, kernel device and engine direction
    of the lab's impairment state `st` (lab.json's "impair")."""
    out: dict[str, dict[str, str]] = {}
    ingress = st.get("placement") == "ingress"
    fwd_from: dict[int, str] = {}  # link -> the node its client->server traffic leaves from
    for p in st.get("points") or []:
        lk = spec.links[p["link"]]
        other = lk.node2 if p["node"] == lk.node1 else lk.node1
        fwd_from[p["link"]] = p["node"] if p["way"] == "fwd" else other
        words = {"link": f"{lk.node1}-{lk.node2}", "way": WAYS.get(p["way"], p["way"])}
        out[f"{p['node']}:{p['ifname']}"] = {**words, "from": p["node"], "to": other}
        if ingress and st.get("backend") == "kernel-netem":  # the qdisc sits on an ifb
            out[f"{p['node']}:ifb{p['link']}"] = {**words, "from": other, "to": p["node"]}
    for eng in st.get("engines") or []:
        lk = spec.links[eng["link"]]
        for d, frm, to in (("a2b", lk.node1, lk.node2), ("b2a", lk.node2, lk.node1)):
            way = (
                "client->server" if fwd_from.get(eng["link"], lk.node1) == frm else "server->client"
            )
            out[f"{eng['name']}:{d}"] = {
                "link": f"{lk.node1}-{lk.node2}",
                "from": frm,
                "to": to,
                "way": way,
            }
    return out
