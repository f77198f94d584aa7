"""iperf3 UDP under loss and behind a queueing data path (issue 33; docs/measurements.md "iperf3
UDP under loss"): which failed run lost its stream set-up, and whether a receiving node still
receives. lab.measure.iperf3.run_client acts on both:

- **A lost set-up datagram.** iperf3 sets up each UDP stream with one datagram each way, the
  client's "hello" and the server's reply, each sent once (every version to date, esnet/iperf
  issues 351 and 862); when either is lost the client gives up after its 30-s receive time-out
  with "unable to read from stream socket", before any interval. At 2.5 % loss each way that is
  about 5 % of UDP connections. Such a run is tried again on a fresh connection, up to
  UDP_SETUP_ATTEMPTS in all; the caller's record counts them (`setup_retries`). Nothing else
  is retried but a busy server.
- **A backlog that outlives -t.** A data path that queues without bound (kernel-libipsec's
  queues in charon: strongSwan's libipsec has no limit) holds what a sender above the tunnel's
  rate sends, and the client's end-of-test message waits behind it on the control connection:
  the client ends when the backlog has drained, seconds to minutes after -t. The client's
  time-out (-t + Context.timeout_s) is extended while the receiving node still receives
  datagrams (up to DRAIN_FACTOR x -t more); a client killed while its receiver still received
  fails with a message that says so.
- **Told early.** A client whose stream sockets exist while its receiver gets no datagrams
  for SETUP_STALL_S is waiting for a reply that will not come (SetupWatch): it is ended then
  and tried again, not after iperf3's 30 s (study A's loss sweep loses about one UDP set-up
  in twenty; each cost 30 s).
"""

from __future__ import annotations

import time
from typing import Any

from lab.core.node import Node

#: iperf3's error when a UDP stream's set-up datagram or its reply is lost (IESTREAMREAD)
SETUP_LOST = "unable to read from stream socket"
#: how long iperf3's client waits for the server's reply to its set-up datagram (SO_RCVTIMEO)
UDP_SETUP_WAIT_S = 30.0
#: tries of a UDP run whose stream set-up was lost (2.5 % loss each way: 1 in 8000 fails all 3)
UDP_SETUP_ATTEMPTS = 3
#: a client still running at -t + timeout_s waits on while its receiver receives, up to this
#: many times -t more (a drain of a 15-s segment took 14 s at 400 Mbit/s over kernel-libipsec)
DRAIN_FACTOR = 3.0
#: datagrams the receiving node must get in one probe step to count as still receiving
DRAIN_MIN_DATAGRAMS = 10
#: a UDP client whose last stream socket appeared this long ago while its receiver got fewer
#: than DRAIN_MIN_DATAGRAMS has lost its set-up. After the reply, the streams' start is one
#: more round trip of control messages over TCP: 6 s covers 800 ms round trips (study D's
#: 400 ms each way) with one retransmission time-out of the control connection on top
SETUP_STALL_S = 6.0


def setup_lost(udp: bool, doc: dict[str, Any]) -> bool:
    """A UDP run (`udp`) whose stream set-up datagram or the server's reply was lost: the
    client's error is iperf3's IESTREAMREAD and it measured no interval. Any other failure is
    not this one (a read error once data flowed, a refused connection, a time-out)."""
    return udp and str(doc.get("error", "")).startswith(SETUP_LOST) and not doc.get("intervals")


def lost_in_all(error: str | None, receiver: str) -> str:
    """The failure of a UDP run whose set-up was lost in every attempt: iperf3's own error
    after its 30 s, or the early verdict (SetupWatch) without one."""
    what = (
        f"iperf3: {error}"
        if error
        else f"iperf3: no UDP datagram reached {receiver} within {SETUP_STALL_S:.0f} s of "
        "the client's stream set-up"
    )
    return (
        f"{what} (the UDP stream's set-up datagram or its reply was lost in all "
        f"{UDP_SETUP_ATTEMPTS} attempts: iperf3 sends each once)"
    )


class UdpReceiving:
    """Whether `node` still receives UDP datagrams (its /proc/net/snmp and snmp6 counters,
    which the node's own network namespace keeps): the probe run_client extends a client's
    time-out by. The first call only reads the counters and answers True (look again)."""

    def __init__(self, node: Node):
        self.node = node
        self.last: int | None = None

    def datagrams(self) -> int | None:
        cp = self.node.run(["cat", "/proc/net/snmp", "/proc/net/snmp6"], check=False, timeout=10)
        return udp_in_datagrams(cp.stdout) if cp.returncode == 0 else None

    def __call__(self) -> bool:
        now, before = self.datagrams(), self.last
        self.last = now
        if now is None:
            return False
        return before is None or now - before >= DRAIN_MIN_DATAGRAMS

    def still(self, *, step_s: float) -> bool:
        """Two readings `step_s` apart: the node received datagrams in between."""
        if not self():
            return False
        time.sleep(step_s)
        return self()


def udp_in_datagrams(text: str) -> int | None:
    """UDP datagrams received, IPv4 and IPv6 together, from /proc/net/snmp (an "Udp:" header
    line, then its values) followed by /proc/net/snmp6 ("Udp6InDatagrams N"); None when
    neither is there."""
    total, found = 0, False
    lines = text.splitlines()
    for head, vals in zip(lines, lines[1:], strict=False):
        if head.startswith("Udp: ") and vals.startswith("Udp: "):
            row = dict(zip(head.split()[1:], vals.split()[1:], strict=False))
            if row.get("InDatagrams", "").isdigit():
                total += int(row["InDatagrams"])
                found = True
    for line in lines:
        parts = line.split()
        if len(parts) == 2 and parts[0] == "Udp6InDatagrams" and parts[1].isdigit():
            total += int(parts[1])
            found = True
    return total if found else None


class SetupWatch:
    """Whether a UDP client has lost its set-up (invoke's `stall`): its stream sockets (UDP,
    connected to the server's `port`, in `client`'s namespace) exist, the last appeared at
    least SETUP_STALL_S ago, and `receiver` got fewer than DRAIN_MIN_DATAGRAMS since. Before
    the sockets exist the control connection is still being set up (TCP retransmits that
    itself): no verdict. Once data flows, or where either reading is unavailable, it answers
    False from then on and reads nothing more."""

    def __init__(self, client: Node, receiver: Node, port: int, *, stall_s: float = SETUP_STALL_S):
        self.client, self.receiver, self.port, self.stall_s = client, receiver, port, stall_s
        self.sockets = 0
        self.since: float | None = None
        self.base: int | None = None
        self.done = False

    def stream_sockets(self) -> int | None:
        cp = self.client.run(["ss", "-Hun", f"dport = :{self.port}"], check=False, timeout=10)
        return len(cp.stdout.splitlines()) if cp.returncode == 0 else None

    def __call__(self) -> bool:
        if self.done:
            return False
        n, now = self.stream_sockets(), time.monotonic()
        if n is None:
            self.done = True
            return False
        if n > self.sockets:  # a new stream: its set-up datagram goes out now
            self.sockets, self.since = n, now
            self.base = UdpReceiving(self.receiver).datagrams()
            self.done = self.base is None
            return False
        if self.since is None or self.base is None:
            return False
        got = UdpReceiving(self.receiver).datagrams()
        if got is None or got - self.base >= DRAIN_MIN_DATAGRAMS:
            self.done = True  # data flows (or the counters went away): nothing more to watch
            return False
        return now - self.since >= self.stall_s
