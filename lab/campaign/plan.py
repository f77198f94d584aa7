"""The plan as data: profiles, impairment points, test entries, cases in run order and their time
estimates (`Plan`, built by lab.campaign.load.validate)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from lab.model.impairment.points import ImpairmentPoint
from lab.vpn.profiles import Profile
from lab.measure import get_test

SCHEMA = 1


@dataclass(frozen=True)
class TestEntry:
    """One [[tests]] entry: the registered test, its label, repetitions and validated params."""

    label: str
    test: str
    params: dict[str, Any]
    reps: int | None  # None: the plan's reps / impaired_reps
    ip: int = 4  # IP version of the traffic address the test targets (study C: IPv4 and IPv6)
    #: the impairment points (names) the test runs at; None: every point of the plan
    points: tuple[str, ...] | None = None

    def runs_at(self, point: ImpairmentPoint) -> bool:
        return self.points is None or point.name in self.points

    def to_json(self) -> dict:
        params = self.params
        if params.get("adaptive") is False:
            # a fixed-length test's adaptive_* knobs are unused: plans written before adaptive
            # length (issue 17) keep their digest
            params = {k: v for k, v in params.items() if not k.startswith("adaptive")}
        params = get_test(self.test).digest_params(params)  # e.g. without tcp's bidir = false
        d = {"label": self.label, "test": self.test, "reps": self.reps, "params": params}
        if self.ip != 4:  # absent for IPv4: plans written before `ip` keep their digest
            d["ip"] = self.ip
        if self.points is not None:  # absent when unset: other plans keep their digest
            d["points"] = list(self.points)
        return d


@dataclass(frozen=True)
class Case:
    """One measurement: a test at one repetition, for one profile at one impairment point."""

    profile: str
    point: ImpairmentPoint
    test: TestEntry
    rep: int

    @property
    def key(self) -> str:
        return case_key(self.profile, self.point.name, self.test.label, self.rep)


def case_key(profile: str, point: str, label: str, rep: int) -> str:
    return f"{profile}|{point}|{label}|{rep}"


@dataclass
class Plan:
    name: str
    source: str
    description: str
    study: str
    notes: list[str]
    topology_file: str
    topo: str | None
    topology_params: dict[str, Any]
    #: the profile specs (NAME[:key=value,...]) as the plan gives them: the names of cases,
    #: records, CSV rows and the digest
    profiles: list[str]
    points: list[ImpairmentPoint]
    placement: str | None
    reps: int
    impaired_reps: int
    timeout_s: float
    error_bars: str
    tests: list[TestEntry]
    vm: bool = False
    overrides: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    #: each of `profiles` loaded, validated and placed in the topology by load.validate, which
    #: the runner hands down to the lab that runs it; empty for a plan read back from its
    #: plan.json (lab.campaign.shard.plan_from_json), which lists cases and runs none
    loaded: dict[str, Profile] = field(default_factory=dict, repr=False, compare=False)
    #: one-line notes for the user about the file (an old key name it used), which the CLI
    #: prints; not part of what runs
    notices: list[str] = field(default_factory=list, repr=False, compare=False)
    #: the plan file, absolute (resumed from any folder); "" for a plan read from plan.json
    file: str = field(default="", repr=False, compare=False)

    # ------------------------------------------------------------------ derived
    def reps_for(self, test: TestEntry, point: ImpairmentPoint) -> int:
        """`reps` for the plan's unimpaired entries, `impaired_reps` for every other point.

        A sweep's zero point (delay 0 ms) is unimpaired but belongs to the sweep: it gets the
        sweep's repetitions (study A: 1), and runs in the clean lab. A test whose `points`
        leave `point` out has none there.
        """
        if not test.runs_at(point):
            return 0
        if test.reps is not None:
            return test.reps
        return self.reps if point.group == "none" else self.impaired_reps

    def groups(self) -> list[tuple[str, list[ImpairmentPoint]]]:
        """Points that share one bring-up of a profile's lab.

        The unimpaired points run in a lab built without any impairment machinery (with the
        userspace engine a hidden bump namespace would otherwise forward the baseline's
        packets); every impaired point shares a second lab whose impairment is changed in place.
        """
        clean = [p for p in self.points if not p.impaired]
        dirty = [p for p in self.points if p.impaired]
        return [(g, pts) for g, pts in (("unimpaired", clean), ("impaired", dirty)) if pts]

    def cases(self) -> list[Case]:
        """Every case in run order: profile, impairment group, point, repetition, test.

        Repetitions are interleaved (rep 0 of every test, then rep 1, ...) so a slow drift of
        the host shows up as spread rather than as a difference between tests.
        """
        out = []
        for profile in self.profiles:
            for _, pts in self.groups():
                for pt in pts:
                    n = max(self.reps_for(t, pt) for t in self.tests)
                    for rep in range(n):
                        for t in self.tests:
                            if rep < self.reps_for(t, pt):
                                out.append(Case(profile, pt, t, rep))
        return out

    def estimate_s(self, case: Case) -> float:
        return estimate_s(case.test.test, case.test.params)

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA,
            "name": self.name,
            "source": self.source,
            "description": self.description,
            "study": self.study,
            "notes": self.notes,
            "topology": {
                "file": self.topology_file,
                "topo": self.topo,
                "params": self.topology_params,
            },
            "profiles": self.profiles,
            "impairments": [p.to_json() for p in self.points],
            "placement": self.placement,
            "reps": self.reps,
            "impaired_reps": self.impaired_reps,
            "timeout_s": self.timeout_s,
            "error_bars": self.error_bars,
            "tests": [t.to_json() for t in self.tests],
            "vm": self.vm,
            "overrides": self.overrides,
        }

    def digest(self) -> str:
        """Hash of what the plan runs (cases and parameters), to match a run it resumes."""
        d = self.to_json()
        for k in ("source", "description", "notes", "overrides"):
            d.pop(k)
        if not d["vm"]:
            d.pop("vm")  # digests of runs made before the key existed stay valid
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------- estimates


def estimate_s(test: str, params: dict[str, Any]) -> float:
    """Expected wall time of one run of `test` (for the progress bar's ETA): the test's own."""

    return get_test(test).estimate_s(params)
