"""The board's data plane queues, held by its stand-in on this machine (lab.model.dpqueue).

Once the tunnel's daemons run, the process standing in for the board's kernel data plane
(wireguard-go, charon's kernel-libipsec: the one spawned under the data plane's daemon name, or
whose threads sit in the data plane's groups) gets receive buffers on its UDP sockets that hold
the board's receive queue (`rx_bytes`: rx_packets full-size datagrams, SO_RCVBUFFORCE through
lab.core.sockbuf), and every TUN device of the node (the stand-in's wg0 or ipsec0) a transmit
queue of the board's `tx_packets` (`ip link set DEV txqueuelen N`). Both are the daemon's own
objects: they go when it ends, so teardown has nothing more to undo. What was set, before and
after, goes into lab.json (vpn.queues) and the run's manifest with it. A stand-in that mapped a
libipsec.so.0 (charon's kernel-libipsec) has its own queues in front of the TUN's; which
library it runs and whether that bounds them is recorded too (lab.vpn.libipsec).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from lab.core import cgroups, sockbuf
from lab.core.node import Daemon, Node
from lab.vpn import libipsec


def stand_in_pids(name: str, groups: Sequence[str], daemons: list[Daemon], node: str) -> list[int]:
    """The processes carrying the data plane: those spawned under `name` on `node`, and those
    whose threads are in the data plane's groups."""
    pids = {d.pid for d in daemons if d.node == node and d.name == name and d.alive()}
    for g in groups:
        for tid in cgroups.thread_ids(g):
            if tgid := cgroups.tgid_of(tid):
                pids.add(tgid)
    return sorted(pids)


def tun_links(node: Node, *, stats: bool = False) -> list[dict]:
    """The TUN devices in the node's network namespace, as `ip -j -d link` shows them (with
    `stats`, their counters too: `-s`); [] where there are none or ip's output is unreadable."""
    cp = node.run(["ip", "-j", "-d", *(["-s"] if stats else []), "link", "show"], check=False)
    try:
        links = json.loads(cp.stdout or "[]")
    except ValueError:
        return []
    return [link for link in links if (link.get("linkinfo") or {}).get("info_kind") == "tun"]


def tun_devices(node: Node) -> dict[str, int]:
    """{TUN device: txqueuelen} in the node's network namespace."""
    return {link["ifname"]: int(link.get("txqlen", 0)) for link in tun_links(node)}


def hold_queues(
    node: Node, queue: dict, name: str, groups: Sequence[str], daemons: list[Daemon]
) -> dict:
    """Size the stand-in's sockets and the node's TUN queues to `queue` (a
    lab.model.dpqueue.queue_record); returns the record of what was set."""
    out: dict = {"daemon": name, "rx_packets": queue.get("rx_packets"),
                 "tx_packets": queue.get("tx_packets"), "sockets": [], "tun": {}}  # fmt: skip
    pids = stand_in_pids(name, groups, daemons, node.name)
    out["pids"] = pids
    if queue.get("rx_bytes"):
        for pid in pids:
            for s in sockbuf.set_receive_buffer(pid, None, int(queue["rx_bytes"])):
                out["sockets"].append(
                    {"pid": s.pid, "port": s.port, "rcvbuf_before": s.before, "rcvbuf": s.after}
                )
    if queue.get("tx_packets"):
        for dev, before in tun_devices(node).items():
            node.run(["ip", "link", "set", dev, "txqueuelen", str(queue["tx_packets"])])
            out["tun"][dev] = {"txqueuelen_before": before, "txqueuelen": queue["tx_packets"]}
    for pid in pids:
        if mapped := mapped_file(pid, "libipsec.so.0"):
            logs = "".join(d.log_text() for d in daemons if d.node == node.name and d.pid == pid)
            out["libipsec"] = libipsec.record(node, mapped, logs)
    return out


def mapped_file(pid: int, soname: str) -> str | None:
    """The path of the library `soname` (or a file of it with a longer version, what the soname
    links to: libipsec.so.0.0.0) that process `pid` has mapped (/proc/PID/maps: which copy the
    dynamic loader chose), None when it has none or is gone."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                fields = line.rstrip("\n").split(maxsplit=5)  # address perms offset dev inode path
                file = fields[5].rsplit("/", 1)[-1] if len(fields) == 6 else ""
                if file == soname or file.startswith(soname + "."):
                    return fields[5]
    except OSError:
        return None
    return None
