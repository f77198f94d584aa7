"""A running lab's tunnel as the `handshake` test drives it (lab.measure.handshake): stopped and
started again from cold, timed from the driver's start() to the first reply through it, and its
keys renewed on demand (Driver.trigger_rekey).

The runner hands one TunnelControl per case to the test (lab.measure.base.Context.tunnel); the
test knows it only by its methods, never by this module (measure and vpn share a floor).

A restart is lab.vpn.teardown.tear_down then lab.vpn.tunnel.bring_up, the same two steps as
`lab up`'s tunnel phase and bench/vpn_up_ipsec.py: every daemon started again goes through
node.spawn, so its PID is in the lab's ledger and lab.json like the first ones, and teardown
ends it. A cold establishment that passes nothing within its cap is a result, not an error: the
tunnel is then brought up again the ordinary way (READY_TIMEOUT) for the cases that follow; when
even that fails, StartupError, and the lab's record stays "starting", which the runner reads as
a dead tunnel (lab.substrate.*.tunnel_alive) and builds the lab again.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from lab.core.errors import PreconditionError, StartupError
from lab.vpn.base import Rekey
from lab.vpn.profiles import Profile
from lab.vpn.record import TunnelRecord
from lab.vpn.teardown import context_of, tear_down
from lab.vpn.tunnel import TunnelPlan, bring_up, plan


def can(profile: Profile, need: str) -> Rekey:
    """Whether `profile` can do what a test needs of it (lab.measure.base.Test.needs), and how
    or why not. Pure: asked when a plan loads."""
    if need == "rekey":
        return profile.driver.rekey_support(profile.params)
    raise TypeError(f"unknown test need {need!r}; known: rekey")


@dataclass(frozen=True)
class Establishment:
    """One cold establishment: `ms` from the driver's start() to the first reply through the
    tunnel when it came (`ok`); otherwise `failed_after_s` and the first line of the reason."""

    ok: bool
    ms: float | None = None
    failed_after_s: float | None = None
    error: str | None = None
    #: after a failure: the tunnel could not be brought up again either (why); the lab's
    #: record then stays "starting" and the runner builds the lab again before the next case
    not_restored: str | None = None
    #: the driver's own key exchange beside the handshake, timed within it (Driver.key_exchange:
    #: Rosenpass's {"what", "ms", "bytes", "packets"}); None: none
    exchange: dict | None = None


# --------------------------------------------------------------------- a quiet path
#
# A cold establishment measured right after a loaded test on a long, lossy path found the
# previous test's TCP connections (iperf3's control connection: 472 bytes of results and a FIN
# unacknowledged, FIN-WAIT-1 on both ends) still open when the tunnel was stopped. The kernel
# retransmits them into the new tunnel the moment its routes are back, so the server starts a
# handshake of its own while the client's is in flight. WireGuard's two crossing initiations
# each overwrite the other end's handshake state: both responses are refused ("Received invalid
# response message", wireguard-go verbose log) and both ends retry after REKEY_TIMEOUT (5 s),
# where they can cross again: 6.4, 11.6, 17 s instead of 1.2 s. A cold establishment therefore
# starts from a quiet path: wait_quiet() below, before the tunnel is stopped, while the old one
# can still carry those connections to their end.

#: TCP states in which a socket sends nothing by itself (FIN-WAIT-2 and TIME-WAIT only answer
#: what the peer sends, and linger for tcp_fin_timeout / 2 MSL after the peer is gone)
SILENT_TCP_STATES = frozenset({"LISTEN", "TIME-WAIT", "FIN-WAIT-2", "CLOSED", "UNCONN"})
#: seconds between two looks at the path while waiting for it to go quiet
QUIET_POLL_S = 0.1


@dataclass(frozen=True)
class Quiet:
    """What wait_quiet() found: `quiet` when every probe came back empty in the same round,
    after `waited_s`; `waited_for` what was busy at some point while waiting (the first time
    each thing was seen), `still` what was busy at the bound when it was reached."""

    quiet: bool
    waited_s: float
    waited_for: tuple[str, ...] = ()
    still: tuple[str, ...] = ()


def wait_quiet(
    probes: Mapping[str, Callable[[], Iterable[str]]],
    *,
    timeout: float,
    poll_s: float = QUIET_POLL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Quiet:
    """Ask every probe (name -> what it finds busy; nothing: quiet) until all of them answer
    nothing in the same round, or `timeout` seconds have passed. The first round is at once: a
    quiet path costs one look. A thing is one item however its figures in parentheses change
    ("imp1:a2b (1850 packets)" then "imp1:a2b (3 packets)"): `waited_for` keeps its first look."""
    t0 = clock()
    seen: dict[str, str] = {}  # the thing -> how it was first seen, in order
    while True:
        busy = [f"{name}: {what}" for name, probe in probes.items() for what in probe()]
        for b in busy:
            seen.setdefault(b.split(" (")[0], b)
        waited = clock() - t0
        if not busy:
            return Quiet(True, round(waited, 3), tuple(seen.values()))
        if waited >= timeout:
            return Quiet(False, round(waited, 3), tuple(seen.values()), tuple(busy))
        sleep(min(poll_s, max(0.0, timeout - waited)))


def open_connections(ss_text: str, addrs: Iterable[str]) -> list[str]:
    """The TCP sockets in `ss -Htan` output (State Recv-Q Send-Q Local Peer) that can still
    send by themselves (not SILENT_TCP_STATES) and have an address of `addrs` at either end:
    "STATE LOCAL -> PEER (send-q N)"."""
    want = {ipaddress.ip_address(a.split("/")[0].strip("[]")) for a in addrs if a}
    out = []
    for line in ss_text.splitlines():
        f = line.split()
        if len(f) < 5 or f[0] in SILENT_TCP_STATES:
            continue
        ends = []
        for ep in f[3:5]:
            host = ep.rpartition(":")[0].strip("[]").split("%")[0]
            try:
                ends.append(ipaddress.ip_address(host))
            except ValueError:
                ends.append(None)
        if want.intersection(ends):
            out.append(f"{f[0]} {f[3]} -> {f[4]} (send-q {f[2]})")
    return out


class TunnelControl:
    """The tunnel of `lab`, which runs `profile` (loaded and validated by the plan).

    `queues`: packets the lab's impairment holds per point and direction ({} when none), from
    the layer that knows the impairment (the runner: lab.impair.queues.queued_packets); None:
    not asked."""

    def __init__(
        self,
        lab,
        profile: Profile,
        *,
        queues: Callable[[], Mapping[str, int]] | None = None,
    ):
        self.lab = lab
        self.profile = profile
        self.queues = queues
        self._placed: TunnelPlan | None = None

    @property
    def name(self) -> str:
        return self.profile.name

    def rekey_support(self) -> Rekey:
        return self.profile.driver.rekey_support(self.profile.params)

    def _plan(self, cap_s: float | None = None) -> TunnelPlan:
        """The profile placed in the lab's topology: what the driver's check() said on the
        nodes the first time is kept, so a restart times the start, not the questions. With
        `cap_s`, a driver's own start-up bound (its `start_timeout` parameter: strongSwan waits
        that long for its CHILD_SA inside start()) is lowered to it."""
        profile = self.profile
        bound = profile.params.get("start_timeout")
        if cap_s is not None and isinstance(bound, int | float) and bound > cap_s:
            profile = replace(profile, params={**profile.params, "start_timeout": cap_s})
        p = plan(self.lab.spec, profile)
        if self._placed is not None:
            p.availability = self._placed.availability
        self._placed = p
        return p

    def quiesce(self, *, timeout: float) -> Quiet:
        """Wait (at most `timeout` s, wait_quiet) until nothing of an earlier test is on the
        tunnel's path: no TCP connection that can still send on the tunnel's ends or the
        traffic endpoints with an address of the tunnel or the traffic target, and no packet
        held in the impairment's queues."""
        rec = TunnelRecord.of(self.lab)
        probes: dict[str, Callable[[], Iterable[str]]] = {}
        if rec is not None and rec.tunnel:
            addrs = [a for e in rec.tunnel.values() for a in (e.v4, e.v6) if a]
            nodes = [rec.client, rec.server]
            if rec.traffic is not None:
                addrs += [a for a in (rec.traffic.v4, rec.traffic.v6) if a]
                nodes += [rec.traffic.client, rec.traffic.server]
            for name in dict.fromkeys(nodes):
                probes[f"{name} tcp"] = self._connections(name, addrs)
        if self.queues is not None:
            queues = self.queues

            def held() -> list[str]:
                return [f"{k} ({n} packets)" for k, n in queues().items() if n]

            probes["impairment queue"] = held
        return wait_quiet(probes, timeout=timeout)

    def _connections(self, name: str, addrs: list[str]) -> Callable[[], list[str]]:
        node = self.lab.node(name)

        def probe() -> list[str]:
            cp = node.run(["ss", "-Htan"], check=False)
            return open_connections(cp.stdout, addrs) if cp.returncode == 0 else []

        return probe

    def establish(self, *, cap_s: float, probe_s: float) -> Establishment:
        """Stop the tunnel and start it again, timed (bring_up's Timing.established_ms), the
        first reply awaited for at most `cap_s` from the driver's start() with a ping every
        `probe_s`. Not established in time: an Establishment with ok=False, and the tunnel
        brought up again as `lab up` would (when even that fails, `not_restored` says why)."""
        tear_down(self.lab)
        t0 = time.monotonic()
        try:
            rec = bring_up(self.lab, self._plan(cap_s), cap_s=cap_s, probe_s=probe_s)
        except StartupError as e:
            failed = Establishment(
                False,
                failed_after_s=getattr(e, "after_launch_s", round(time.monotonic() - t0, 1)),
                error=(str(e).strip().splitlines() or ["no reason given"])[0],
            )
        else:
            assert rec.timing is not None  # set by a bring_up that returned
            ctx = context_of(self.lab, rec, where=True)
            exchange = self.profile.driver.key_exchange(ctx, rec.params)
            return Establishment(True, ms=rec.timing.established_ms, exchange=exchange)
        tear_down(self.lab)
        try:
            bring_up(self.lab, self._plan())
        except StartupError as e:
            return replace(failed, not_restored=(str(e).strip().splitlines() or ["?"])[0])
        return failed

    def rekey(self, *, timeout: float) -> dict:
        """Driver.trigger_rekey on the running tunnel: the daemon's evidence of new keys."""
        rec = TunnelRecord.of(self.lab)
        if rec is None or rec.state != "up":
            raise StartupError(f"lab {self.lab.id!r}: no tunnel up to rekey")
        support = self.rekey_support()
        if not support.ok:
            raise PreconditionError(
                f"profile {self.name!r} cannot be rekeyed on demand: {support.how}"
            )
        ctx = context_of(self.lab, rec, where=True)
        return self.profile.driver.trigger_rekey(ctx, rec.params, timeout=timeout)
