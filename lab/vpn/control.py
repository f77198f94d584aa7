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

import time
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


class TunnelControl:
    """The tunnel of `lab`, which runs `profile` (loaded and validated by the plan)."""

    def __init__(self, lab, profile: Profile):
        self.lab = lab
        self.profile = profile
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
