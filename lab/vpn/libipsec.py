"""kernel-libipsec's queues held to the board kernel's: the lab's patched libipsec (issue 30).

strongSwan's libipsec (charon's userspace ESP, the stand-in for a board's XFRM ESP) queues the
packets it reads from its TUN device (outbound, before encryption) and from its UDP socket
(inbound, before decryption) without any limit: above the tunnel's rate the stand-in builds a
backlog of GBs and delivers it for seconds after the sender stopped, where the board's kernel
drops at its queues. Its encrypted packets then wait in charon's sender (libcharon's
network/sender.c, a list without a limit that one thread sends from): the patch holds those to
the outbound limit too, counted from the hand-over until the sender destroys them (`encrypted`
in FULL_RE), since a board's ESP has only its egress device's queue there.
tools/libipsec/build.sh (run by setup.sh) builds libipsec from the
installed strongSwan's upstream source with tools/libipsec/queue-limit.patch into LIBRARY_DIR.
With it, each queue holds at most `charon.plugins.kernel-libipsec.queue_limit_in` / `_out`
packets (strongswan.conf; 0 or absent: upstream's unbounded queue).

What a full queue does is `queue_full` (FULL, rendered by the lab): `wait`, the board's
back-pressure. On a board a local sender's ESP encrypts inside the sender's own sendmsg, so
nothing is encrypted only to be dropped, and a receiving core that cannot keep up drops at its
NIC's ring before doing any work. So the producer of a full bound waits for room: the TUN reader
(outbound; the TUN device's queue of the board's txqueuelen then drops, counted in its tx
drops), the encrypting thread (the sender's list), charon's receiver (inbound; its UDP socket's
buffer then drops, counted in the socket's drops). With `drop` (the patch's default) a full
queue drops the packet after charon read it, or after it was encrypted: work a board does not
do, which cost the capped stand-in 17-40 % of its figure at twice its rate
(bench/standin_capped.py, docs/fidelity.md). The library logs the running total of packets
that found each bound full (FULL_RE: dropped or waited).

The limits are the board profile's `[kernel.dataplane.xfrm-esp.queue]` (lab.model.dpqueue, the
node's `dataplane_queue`): inbound = rx packets for the SA's AEAD, outbound = tx packets. A node
without a board queue (cpu="host", or a profile that states none) keeps the unbounded queue,
and so does a node whose charon is the board's own binary (another architecture, qemu-user):
the library here is this machine's. The charon of a bounded node is started with
LD_LIBRARY_PATH=LIBRARY_DIR, which precedes the plugin's RUNPATH /usr/lib/ipsec; only
libipsec.so.0 is there, the rest stays Debian's. Which library a charon really mapped is read
from the process (lab.substrate.local.queues) into lab.json's vpn.queues.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from lab import REPO
from lab.core.node import Node

ROOT = Path(os.environ.get("LAB_CACHE", "/var/cache/lab")) / "libipsec"
LIBRARY_DIR = ROOT / "lib"
LIBRARY = LIBRARY_DIR / "libipsec.so.0"
STAMP = ROOT / "stamp.json"
PATCH = REPO / "tools" / "libipsec" / "queue-limit.patch"
DEBIAN_LIBRARY = "/usr/lib/ipsec/libipsec.so.0"
#: strongswan.conf keys the patch reads (in charon's `plugins.kernel-libipsec` section)
KEY_IN = "queue_limit_in"
KEY_OUT = "queue_limit_out"
#: `queue_full`, what the lab's charons do at a full bound: wait for room (the board's
#: back-pressure; the patch's default, `drop`, drops there)
FULL = "wait"
#: the patched library's lines in charon's log (DBG1, ESP group)
LIMITS_RE = re.compile(
    r"libipsec queue limits \(lab patch\): inbound (\d+), outbound (\d+)"
    r" packets \(0: none\)(?:, full queues (wait|drop))?"
)
FULL_RE = re.compile(
    r"libipsec (inbound|outbound|encrypted) queue \(limit (\d+)\): (\d+) packets"
    r" (dropped|waited)"
)


def limits(node: Node | None) -> dict[str, int] | None:
    """{"in": packets, "out": packets} the board's kernel ESP holds on `node` (its queue
    record's rx and tx), None where the node holds no board queue (unbounded) or there is no
    node (`lab render` without a lab)."""
    q = node.dataplane_queue if node is not None else None
    if not q:
        return None
    out = {"in": int(q.get("rx_packets") or 0), "out": int(q.get("tx_packets") or 0)}
    return out if out["in"] or out["out"] else None


def library() -> tuple[Path | None, str]:
    """(the patched library, "") when it is built from this checkout's patch; else (None, why)."""
    if not LIBRARY.is_file():
        return None, f"{LIBRARY} not built (./setup.sh builds it; tools/libipsec/build.sh)"
    try:
        stamp = json.loads(STAMP.read_text())
    except (OSError, ValueError):
        return None, f"{STAMP} missing or unreadable: run tools/libipsec/build.sh"
    if stamp.get("patch_sha256") != hashlib.sha256(PATCH.read_bytes()).hexdigest():
        return None, f"{LIBRARY} was built from another {PATCH.name}: run tools/libipsec/build.sh"
    return LIBRARY, ""


def env(node: Node) -> dict[str, str]:
    """LD_LIBRARY_PATH for the charon on `node` when its queues are to be bounded and the
    patched library is there; {} otherwise (upstream's libipsec)."""
    if limits(node) is None or getattr(node, "arch", None) is not None:
        return {}
    lib, _ = library()
    return {"LD_LIBRARY_PATH": str(lib.parent)} if lib else {}


def record(node: Node, mapped: str | None, log_text: str) -> dict:
    """vpn.queues' `libipsec` of a node: the library its charon mapped, whether its queues
    were bounded (the patched library's own log line says so, with its limits), why not."""
    out: dict = {"library": mapped}
    m = ([None, *LIMITS_RE.finditer(log_text)])[-1]  # the last start's (a restarted charon)
    if m is not None and (int(m.group(1)) or int(m.group(2))):
        out.update(bounded=True, limit_in=int(m.group(1)), limit_out=int(m.group(2)))
        out["full"] = m.group(3) or "drop"  # a library before queue_full: it dropped
        lib, why = library()
        out["build"] = _stamp() if lib else why
        return out
    out["bounded"] = False
    if getattr(node, "arch", None) is not None:
        out["why"] = "the node runs the board's own charon (another architecture)"
    elif m is not None:
        out["why"] = f"the patched library read no {KEY_IN}/{KEY_OUT} from strongswan.conf"
    else:
        out["why"] = library()[1] or "charon did not load the patched library"
    return out


def drops(log_text: str) -> dict[str, int]:
    """{"inbound": n, "outbound": n, "encrypted": n}: packets the patched libipsec dropped at
    its full queues (`queue_full = drop`; encrypted: beyond the outbound limit of encrypted
    packets waiting in charon's sender), the last running total charon logged per queue (0
    where it logged none)."""
    return _totals(log_text, "dropped")


def waits(log_text: str) -> dict[str, int]:
    """The same for `queue_full = wait`: packets whose producer waited for room in a full
    queue (the drops are then the TUN device's and the UDP socket's, in the kernel)."""
    return _totals(log_text, "waited")


def _totals(log_text: str, verb: str) -> dict[str, int]:
    out = {"inbound": 0, "outbound": 0, "encrypted": 0}
    for m in FULL_RE.finditer(log_text):
        if m.group(4) == verb:
            out[m.group(1)] = int(m.group(3))
    return out


def _stamp() -> dict | None:
    try:
        return json.loads(STAMP.read_text())
    except (OSError, ValueError):
        return None
