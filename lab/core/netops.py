"""Kernel objects on this machine: network namespaces, node mount namespaces, veths, bridges, tbf.

pyroute2 for netlink; "already exists"/"already gone" decided on errno, never on message text.
`create_*` fails when the object exists (it may belong to someone else); `remove_*` is idempotent.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shlex
import time
from pathlib import Path

from lab.core import proc
from lab.core.errors import CommandError, PreconditionError
import socket
from pyroute2 import netns
from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2 import NetNS

# pyroute2 is imported inside the functions that build things: `lab down`, `lab exec` and
# `lab status` never need it, and importing it costs a quarter of a second.

NETNS_DIR = Path("/var/run/netns")
_libc = ctypes.CDLL(None, use_errno=True)
MS_BIND, MS_PRIVATE, MS_REC = 4096, 1 << 18, 16384
MNT_DETACH = 2


def _mount(src: str | None, target: str, fstype: str | None, flags: int) -> None:
    if (
        _libc.mount(
            src.encode() if src else None,
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            None,
        )
        != 0
    ):
        e = ctypes.get_errno()
        raise OSError(e, f"mount {target}: {os.strerror(e)}")


def is_mountpoint(path: str) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def umount(path: str) -> None:
    """Lazily unmount `path` if mounted (idempotent)."""
    if _libc.umount2(path.encode(), MNT_DETACH) != 0:
        e = ctypes.get_errno()
        if e not in (errno.EINVAL, errno.ENOENT):
            raise OSError(e, f"umount {path}: {os.strerror(e)}")


# ----------------------------------------------------------------------------- namespaces


def netns_exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()


def create_netns(name: str) -> None:
    if netns_exists(name):
        raise PreconditionError(
            f"network namespace {name!r} already exists (not created by this lab)"
        )

    netns.create(name)


def remove_netns(name: str) -> None:
    """Drop the namespace's handle (as `ip netns del`): it goes when its last process does."""
    path = NETNS_DIR / name
    umount(str(path))
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def create_private_dir_mount(path: Path) -> None:
    """Make `path` a private bind mount of itself: mount-namespace handles may only live there."""
    path.mkdir(parents=True, exist_ok=True)
    if not is_mountpoint(str(path)):
        _mount(str(path), str(path), None, MS_BIND)
    _mount(None, str(path), None, MS_PRIVATE)


def create_node_mntns(netns_name: str, handle: Path, sysctls: dict[str, str]) -> None:
    """A persistent mount namespace for a node: private /run (tmpfs) and a /sys of its netns.

    `unshare --mount=FILE` keeps the namespace alive by bind-mounting it on FILE; inside it we
    enter the node's netns so the sysfs mount shows the node's interfaces, and we set the node's
    sysctls in the same process (they are per network namespace).
    """
    handle.touch(exist_ok=True)
    script = "mount -t tmpfs -o mode=0755,size=64m lab-run /run && mount -t sysfs lab-sys /sys"
    for k, v in sysctls.items():
        script += f" && echo {shlex.quote(v)} > /proc/sys/{k.replace('.', '/')}"
    proc.run(
        [
            "unshare",
            f"--mount={handle}",
            "--propagation",
            "private",
            "--",
            "nsenter",
            f"--net={NETNS_DIR / netns_name}",
            "--",
            "sh",
            "-c",
            script,
        ],
        where=f"netns {netns_name}",
        timeout=20,
    )


def remove_node_mntns(handle: Path) -> None:
    umount(str(handle))
    try:
        handle.unlink()
    except FileNotFoundError:
        pass


# ----------------------------------------------------------------------------- links


def create_veth(ns1: str, if1: str, ns2: str, if2: str, mtu: int | None = None) -> None:
    """A veth pair born directly inside the two namespaces (never visible in the root netns)."""

    kw = {"mtu": mtu} if mtu else {}
    peer = {"ifname": if2, "net_ns_fd": ns2, **kw}
    try:
        with IPRoute() as ipr:
            ipr.link("add", ifname=if1, kind="veth", net_ns_fd=ns1, peer=peer, **kw)
    except NetlinkError as e:
        raise CommandError(
            ["netlink", "link add veth", if1, if2],
            e.code,
            os.strerror(e.code),
            where=f"{ns1}/{ns2}",
        ) from e


def _netlink(ns: str | None):
    """A pyroute2 socket in namespace `ns` (None: the root namespace)."""

    return IPRoute() if ns is None else NetNS(ns)


def link_exists(ns: str | None, ifname: str) -> bool:
    """Is interface `ifname` in namespace `ns` (None: the root namespace)?"""
    if ns is not None and not netns_exists(ns):
        return False
    with _netlink(ns) as ipr:
        return bool(ipr.link_lookup(ifname=ifname))


def remove_link(ns: str | None, ifname: str) -> None:
    """Delete interface `ifname` of namespace `ns` (None: the root namespace), if still there."""
    if ns is not None and not netns_exists(ns):
        return

    with _netlink(ns) as ipr:
        idx = ipr.link_lookup(ifname=ifname)
        if idx:
            try:
                ipr.link("del", index=idx[0])
            except NetlinkError as e:
                if e.code != errno.ENODEV:
                    raise


RTPROT_KERNEL, RT_TABLE_LOCAL, RT_SCOPE_LINK = 2, 255, 253
#: neighbour states (linux/neighbour.h): REACHABLE kept as it is; STALE, DELAY and PROBE (a MAC
#: not confirmed lately) come back as STALE, which sends at once and confirms in the background;
#: PERMANENT stays. INCOMPLETE and FAILED know no MAC.
NUD_REACHABLE, NUD_STALE, NUD_DELAY, NUD_PROBE, NUD_PERMANENT = 0x02, 0x04, 0x08, 0x10, 0x80
NUD_KEEP = NUD_STALE | NUD_DELAY | NUD_PROBE | NUD_PERMANENT


def read_interface(ns: str, ifname: str) -> dict:
    """What configuration of interface `ifname` lives on the interface itself and dies with it:
    MAC, MTU, addresses (not IPv6 link-local: the kernel makes it again from the MAC) and the
    routes through it that someone added (not the kernel's connected and local routes).
    JSON-able, so the lab can record what it is about to restore (restore_interface)."""

    with NetNS(ns) as ipr:
        idx = ipr.link_lookup(ifname=ifname)[0]
        link = ipr.get_links(idx)[0]
        addrs = []
        for a in ipr.get_addr(index=idx):
            if a["family"] == socket.AF_INET6 and a["scope"] == RT_SCOPE_LINK:
                continue
            local = a.get_attr("IFA_LOCAL") or a.get_attr("IFA_ADDRESS")
            addrs.append({"address": local, "prefixlen": a["prefixlen"], "family": a["family"]})
        routes = []
        for fam in (socket.AF_INET, socket.AF_INET6):
            for r in ipr.route("dump", family=fam):  # every table (table=0 would match none)
                table = r.get_attr("RTA_TABLE") or r["table"]
                if (
                    r.get_attr("RTA_OIF") != idx
                    or r["proto"] == RTPROT_KERNEL
                    or table == RT_TABLE_LOCAL
                ):
                    continue
                rt = {
                    "family": fam,
                    "dst_len": r["dst_len"],
                    "table": table,
                    "proto": r["proto"],
                    "scope": r["scope"],
                    "type": r["type"],
                }
                for key, attr in (
                    ("dst", "RTA_DST"),
                    ("gateway", "RTA_GATEWAY"),
                    ("priority", "RTA_PRIORITY"),
                    ("prefsrc", "RTA_PREFSRC"),
                ):
                    if r.get_attr(attr) is not None:
                        rt[key] = r.get_attr(attr)
                routes.append(rt)
        neighbours = _neighbours(ipr, idx)
    return {
        "ifname": ifname,
        "mac": link.get_attr("IFLA_ADDRESS"),
        "mtu": link.get_attr("IFLA_MTU"),
        "addrs": addrs,
        "routes": routes,
        "neighbours": neighbours,
    }


def splice_veth_end(ns: str, state: dict, bump_ns: str, moved_name: str, new_name: str) -> None:
    """Put namespace `bump_ns` into the live veth whose end in `ns` is `state["ifname"]`
    (read_interface): ns:IF <-> peer becomes ns:IF <-> bump:new_name, bump:moved_name <-> peer.

    The peer's namespace is never touched. The old end moves into the bump as `moved_name`; a new
    veth with the old end's name, MAC and MTU takes its place in `ns`, with its addresses and
    routes restored. Everything new is prepared before the old end goes down, so the link is cut
    only for the few netlink calls of the swap (bench/impair_speed.py --splice measures it).
    """

    ifname = state["ifname"]
    tmp = f"lspl{os.getpid() % 100000}"
    create_veth(ns, tmp, bump_ns, new_name, state["mtu"])
    with NetNS(ns) as ipr, NetNS(bump_ns) as bpr:
        bpr.link("set", index=bpr.link_lookup(ifname=new_name)[0], state="up")
        t = ipr.link_lookup(ifname=tmp)[0]
        ipr.link("set", index=t, address=state["mac"])
        # the swap: a renamed interface must be down (EBUSY otherwise); moving it also downs it
        old = ipr.link_lookup(ifname=ifname)[0]
        ipr.link("set", index=old, state="down")
        ipr.link("set", index=old, ifname=moved_name)
        ipr.link("set", index=old, net_ns_fd=bump_ns)
        ipr.link("set", index=t, ifname=ifname)
        ipr.link("set", index=t, state="up")
        # the moved end still has the MAC its successor took over: give it its own (a bridge or
        # a switch behind the bump would take frames from that MAC for its own and drop them)
        moved = bpr.link_lookup(ifname=moved_name)[0]
        bpr.link("set", index=moved, address=random_mac())
        bpr.link("set", index=moved, state="up")
        restore_interface(ipr, t, state)


def random_mac() -> str:
    """A random unicast, locally administered MAC (as the kernel gives a new veth)."""
    b = bytearray(os.urandom(6))
    b[0] = (b[0] & 0xFE) | 0x02
    return ":".join(f"{x:02x}" for x in b)


def restore_interface(ipr, idx: int, state: dict) -> None:
    """Addresses, then routes (a gateway needs its connected route first), then the neighbour
    entries of read_interface: the MACs the node had resolved on the interface die with it, and
    without them the first packet after a splice waits for ARP/NDP across the new path (one
    more round trip through the impairment, issue 32 item 16)."""

    for a in state["addrs"]:
        try:
            ipr.addr("add", index=idx, address=a["address"], prefixlen=a["prefixlen"])
        except NetlinkError as e:
            if e.code != errno.EEXIST:
                raise
    for r in state["routes"]:
        try:
            ipr.route("add", oif=idx, **r)
        except NetlinkError as e:
            if e.code != errno.EEXIST:
                raise
    _add_neighbours(ipr, idx, state.get("neighbours") or [])  # none in a pre-issue-32 record


def read_neighbours(ns: str, ifname: str) -> list[dict]:
    """The neighbour entries (ARP, NDP) with a MAC on interface `ifname` of namespace `ns`."""
    with NetNS(ns) as ipr:
        return _neighbours(ipr, ipr.link_lookup(ifname=ifname)[0])


def restore_neighbours(ns: str, ifname: str, entries: list[dict], timeout: float = 5.0) -> None:
    """Put `entries` (read_neighbours) back on `ifname` once its carrier is up again: a veth
    whose peer went down lost them (the kernel flushes a device's neighbours when its carrier
    drops, net/ipv4/arp.c arp_netdev_event). Waits for operstate UP, which the kernel's linkwatch
    sets after it has handled the carrier change, so no flush comes after the entries are back."""
    with NetNS(ns) as ipr:
        idx = ipr.link_lookup(ifname=ifname)[0]
        deadline = time.monotonic() + timeout
        while ipr.get_links(idx)[0].get_attr("IFLA_OPERSTATE") != "UP":
            if time.monotonic() > deadline:
                return  # no carrier: entries would be flushed again; ARP/NDP resolves later
            time.sleep(0.002)
        _add_neighbours(ipr, idx, entries)


def _neighbours(ipr, idx: int) -> list[dict]:
    return [
        {
            "family": n["family"],
            "dst": n.get_attr("NDA_DST"),
            "lladdr": n.get_attr("NDA_LLADDR"),
            "state": n["state"],
        }
        for n in ipr.get_neighbours(ifindex=idx)
        if n["state"] & (NUD_REACHABLE | NUD_KEEP) and n.get_attr("NDA_LLADDR")
    ]


def _add_neighbours(ipr, idx: int, entries: list[dict]) -> None:
    for n in entries:
        nud = n["state"] if n["state"] & (NUD_REACHABLE | NUD_PERMANENT) else NUD_STALE
        ipr.neigh(
            "replace",
            ifindex=idx,
            family=n["family"],
            dst=n["dst"],
            lladdr=n["lladdr"],
            state=nud,
        )


def configure_node(
    ns: str,
    interfaces: list[dict],
    routes: list[dict],
    *,
    bridge_ports: list[str] | None = None,
    default_route: str | None = None,
) -> None:
    """Bring up lo and the interfaces, add addresses and routes (all in one netlink session)."""

    with NetNS(ns) as ipr:
        ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
        if bridge_ports is not None:
            ipr.link("add", ifname="br0", kind="bridge")
            br = ipr.link_lookup(ifname="br0")[0]
            for port in bridge_ports:
                ipr.link("set", index=ipr.link_lookup(ifname=port)[0], master=br)
            ipr.link("set", index=br, state="up")
        for intf in interfaces:
            idx = ipr.link_lookup(ifname=intf["name"])[0]
            for key in ("ip", "ip6"):
                if intf.get(key):
                    addr, plen = intf[key].split("/")
                    ipr.addr("add", index=idx, address=addr, prefixlen=int(plen))
            ipr.link("set", index=idx, state="up")
        for r in routes:
            idx = ipr.link_lookup(ifname=r["dev"])[0]
            ipr.route("add", dst=r["dst"], gateway=r["via"], oif=idx)
        if default_route:
            kind, value = default_route.split()
            if kind == "via":
                ipr.route(
                    "add",
                    dst="default" if ":" not in value else "::/0",
                    gateway=value,
                    **({"family": 10} if ":" in value else {}),
                )
            else:
                ipr.route("add", dst="default", oif=ipr.link_lookup(ifname=value)[0])


def set_tbf(
    ns: str, ifname: str, mbit: float, *, limit_pkts: int | None = None, dilation: float = 1.0
) -> None:
    """Shape egress to `mbit` Mbit/s with tbf (Mininet TCLink's bw). A time-dilated lab
    (lab.model.dilation) runs the link at mbit / dilation with a queue of the same packets (its
    latency x dilation) and the same bucket in bytes (an amount of data, like the queue)."""
    rate_bps = int(mbit * 1_000_000 / dilation)
    # burst must hold at least one MTU-sized frame and one timer tick of traffic (HZ=1000 worst
    # case); taken from the undilated rate: a bucket of rate / D would be D times smaller than
    # the board's link, and capped senders burst at host speed in either mode (issue 16: x1.5
    # hit the bucket's limit on up to 16 k wireguard-go packets per 12 s where x1 hit it on
    # none; docs/fidelity.md "Why wireguard-go's TCP does not dilate")
    burst = max(15000, int(mbit * 1_000_000) // 8 // 250)
    latency_ms = 50 * dilation if limit_pkts is None else None
    argv = [
        "tc",
        "qdisc",
        "replace",
        "dev",
        ifname,
        "root",
        "tbf",
        "rate",
        f"{rate_bps}bit",
        "burst",
        str(burst),
    ]
    argv += ["latency", f"{latency_ms:g}ms"] if latency_ms else ["limit", str(limit_pkts * 1514)]
    proc.run(["nsenter", f"--net={NETNS_DIR / ns}", "--", *argv], where=f"netns {ns}")


def check_root() -> None:
    if os.geteuid() != 0:
        raise PreconditionError("this command needs root (namespaces, cgroups): run it with sudo")
