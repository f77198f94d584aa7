"""`lab up`'s phases, written once for every substrate that builds a lab itself (this machine's
namespaces, boards over SSH; the VM runs this machine's in its guest):

    validate   impairment words and placement, the VPN profile: before anything exists
    check      the substrate's own preconditions (root, free names, CPU plan; boards reachable)
    create     the lab's state directory and the first ledger line (ownership recorded first)
    build      network, CPU caps, impairment points (every object in the ledger before it exists)
    tunnel     the VPN brought up, proved to pass traffic
    up         lab.json says "up"
and, on any failure in create..tunnel, `unwind`: everything built so far removed (or restored, on
boards) from the ledger, and what could not be is appended to the error.

A substrate supplies a `Build` (its spec, how it validates and prepares, creates, builds and
unwinds); the order, the validation and the unwinding rule live here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from lab.core.errors import LabError
from lab.core.state import check_id
from lab.impair.runtime import plan_for
from lab.model.labspec import LabSpec
from lab.vpn.profiles import Profile
from lab.vpn.tunnel import bring_up

#: the lab id when none is given (`lab up` without --id)
DEFAULT_LAB_ID = "lab"


class Build(ABC):
    """One lab being built on one substrate."""

    #: the impairment backend the words are validated against before anything exists
    check_backend: str = "userspace"

    def __init__(self, spec: LabSpec):
        self.spec = spec

    @abstractmethod
    def prepare_vpn(self, profile: str | Profile):
        """A profile spec ("wireguard:mtu=1280") or a loaded Profile -> the TunnelPlan bring_up
        takes, checked as far as this substrate can before anything exists."""

    def check(self, lab_id: str, vpn) -> None:  # noqa: B027 - optional phase, nothing by default
        """Preconditions of this substrate, before anything is created."""

    @abstractmethod
    def create(self, lab_id: str):
        """The lab's state directory, ledger and lab object (with `info` and `save()`)."""

    @abstractmethod
    def build(self, lab, impair: str | None, placement: str | None):
        """Network, CPU and impairment points of the lab; the lab object to go on with (one
        that knows its nodes now)."""

    @abstractmethod
    def unwind(self, lab) -> list[str]:
        """Remove (restore) everything the lab's ledger records; what is left over."""


def up(build: Build, lab_id: str | None, *, vpn=None, impair=None, placement=None):
    """Run the phases of `build` for lab `lab_id`; the lab object, up. On any failure after
    `create` the lab is unwound and the error says what was left over."""
    spec = build.spec
    if impair is None and any(lk.impair for lk in spec.links):
        impair = "none"  # links with their own impairment options need the points
    if impair is not None:
        plan_for(spec, placement, impair, build.check_backend, "")  # the backend comes later
    if isinstance(vpn, str | Profile):
        vpn = build.prepare_vpn(vpn)
    lab_id = check_id(lab_id or DEFAULT_LAB_ID)
    build.check(lab_id, vpn)
    lab = build.create(lab_id)
    try:
        lab = build.build(lab, impair, placement)
        if vpn is not None:
            bring_up(lab, vpn)
    except BaseException as e:
        left = build.unwind(lab)
        if left and isinstance(e, LabError):
            e.args = (f"{e.args[0]}\n(unwinding left over: {'; '.join(left)})",)
        raise
    lab.info["state"] = "up"
    lab.save()
    return lab
