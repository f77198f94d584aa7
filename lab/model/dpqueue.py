"""How many packets a board's kernel data plane holds before it drops: its queues, for the
stand-in to hold as many (issue 30, mechanism 7).

On the board, kernel WireGuard and XFRM ESP never put a tunnel's datagrams in a socket buffer:
received ones wait in the NIC's receive ring and then in the data plane's own queue (kernel
WireGuard's decryption queue, cryptd's queue for an asynchronous AEAD) until a core decrypts
them; sent ones wait in its encryption queue, or (a synchronous AEAD, encrypted in the sender's
own context) in the egress device's queue. The lab's stand-ins (wireguard-go, charon's
kernel-libipsec) instead read the datagrams from a UDP socket whose buffer is this host's
default (212992 bytes: ~92 full-size datagrams) and take the packets to send from a TUN device
whose queue is 500 packets; a stand-in behind for a few milliseconds (a CFS quota's stall, a
run-queue wait) drops there what the board would have queued (docs/fidelity.md "The board's
queues"). A board profile states per kernel data plane how many packets it holds each way
(`[kernel.dataplane.NAME.queue]`: `rx` and `tx`, a number or one per stand-in primitive, with
`source`), and the lab sizes the stand-in's socket and TUN queue to hold as many.

A socket's buffer is counted in bytes of the kernel's buffers (truesize), not in datagrams:
DATAGRAM_TRUESIZE is what one full-size datagram costs it on this host's veth path (measured:
212992 bytes held 92 datagrams of 1400 bytes, 2304 bytes each: a 2 KiB data buffer plus the
sk_buff). Smaller datagrams cost less, so the socket then holds more of them than the board's
queue would; the tunnels' bulk traffic is full-size.

Pure: parsing and arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lab.core.errors import ConfigError, reject_unknown

#: bytes of socket buffer one full-size datagram takes on this host (see the module text)
DATAGRAM_TRUESIZE = 2304
_FIELDS = ("rx", "source", "tx")


@dataclass(frozen=True)
class DataPlaneQueue:
    """Packets a board kernel data plane holds before it drops, per direction; a number for
    every stand-in primitive or one per primitive."""

    rx: int | dict[str, int]
    tx: int | dict[str, int]
    source: str

    def packets(self, primitive: str | None) -> tuple[int | None, int | None]:
        """(rx, tx) for a stand-in of `primitive` (None where the profile states none)."""

        def one(v: int | dict[str, int]) -> int | None:
            return v if isinstance(v, int) else v.get(primitive or "")

        return one(self.rx), one(self.tx)


def parse_queue(t: Any, src: str, where: str, primitives: dict) -> DataPlaneQueue | None:
    """[WHERE.queue]: `rx`, `tx` (packets: a positive integer, or a table of stand-in
    primitive = packets, the primitives among `primitives`) and `source`."""
    if t is None:
        return None
    where = f"{where}.queue"
    if not isinstance(t, dict):
        raise ConfigError(
            f"must be a table; accepted fields: {', '.join(_FIELDS)}", source=src, field=where
        )
    reject_unknown(t, _FIELDS, source=src, where=where)
    if not isinstance(t.get("source"), str) or not t["source"]:
        raise ConfigError(
            "missing: say where the queue lengths come from", source=src, field=f"{where}.source"
        )
    sides = {}
    for side in ("rx", "tx"):
        v = t.get(side)
        if isinstance(v, dict):
            # per stand-in primitive: those of the data plane's crypto table
            reject_unknown(v, primitives, source=src, where=f"{where}.{side}")
            for prim, n in v.items():
                _packets(n, src, f"{where}.{side}.{prim}")
            sides[side] = {k: int(n) for k, n in v.items()}
        else:
            sides[side] = _packets(v, src, f"{where}.{side}")
    return DataPlaneQueue(sides["rx"], sides["tx"], t["source"])


def _packets(v: Any, src: str, field: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ConfigError(
            f"must be a positive integer (packets) or a table of STAND-IN-PRIMITIVE = packets, "
            f"got {v!r}",
            source=src,
            field=field,
        )
    return v


def queue_record(q: DataPlaneQueue | None, primitive: str | None) -> dict | None:
    """lab.json's `queue` of a data plane record: packets each way, the receive side in
    socket-buffer bytes too; None when the profile states no queue for this stand-in."""
    if q is None:
        return None
    rx, tx = q.packets(primitive)
    if rx is None and tx is None:
        return None
    return {
        "rx_packets": rx,
        "tx_packets": tx,
        "rx_bytes": rx * DATAGRAM_TRUESIZE if rx else None,
        "datagram_truesize": DATAGRAM_TRUESIZE,
        "source": q.source,
    }
