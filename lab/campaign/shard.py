"""A plan cut into shards for several machines (`lab run PLAN --shard i/N`): which cases a shard
runs, the ids of cases, and what a shard records so that `lab merge` can check the shards belong
together (plan digest, code version, shard i/N, this machine's CPU calibration).

The rule (docs/scale.md): the cases of a plan fall into cells, one per (profile, impairment
point) in plan order; a cell holds R repetitions (the most any test has at that point), each
repetition every test of the plan. Repetition r of cell c goes to shard
(floor(r * N / R) + c) mod N: each shard gets a contiguous block of every cell's repetitions
(so with R >= N every machine runs every profile at every point, and a drift between machines
shows up as spread between repetitions, not as a difference between profiles), and the
rotation by c spreads cells with fewer repetitions than shards (study A's impaired points: one)
evenly. Pure data: nothing here touches the system but code_version's reading of lab/'s files.
"""

from __future__ import annotations

from lab import PACKAGE_DIR
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from lab import __version__
from lab.core.errors import ConfigError
from lab.campaign.plan import Case, Plan
from lab.model.cpucalibration import host_cpu_model
from lab.model.cpuprofile import load_cpu_profile
from lab.campaign.plan import TestEntry
from lab.model.impairment.points import ImpairmentPoint

#: lab/ itself: the source the code version hashes
#: shards a plan may be cut into (a typo of 10**6 would make a million empty shards)
MAX_SHARDS = 10_000

_SHARD_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*\Z")


@dataclass(frozen=True)
class Shard:
    """Shard `index` (from 0, as Slurm's array task id and Kubernetes' completion index) of
    `count`."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def to_json(self) -> dict:
        return {"index": self.index, "count": self.count}

    @classmethod
    def from_json(cls, d: dict) -> Shard:
        return cls(int(d["index"]), int(d["count"]))


def parse_shard(text: str, *, source: str = "--shard") -> Shard:
    """`i/N` with 0 <= i < N <= MAX_SHARDS; else a ConfigError naming the accepted form."""
    m = _SHARD_RE.match(text or "")
    accepted = f"accepted: i/N with N from 1 to {MAX_SHARDS} and i from 0 to N-1 (e.g. 0/3)"
    if not m:
        raise ConfigError(f"got {text!r}; {accepted}", source=source)
    i, n = int(m.group(1)), int(m.group(2))
    if not 1 <= n <= MAX_SHARDS or not 0 <= i < n:
        raise ConfigError(f"got {text!r}; {accepted}", source=source)
    return Shard(i, n)


def case_id(plan_digest: str, key: str) -> str:
    """A case's id: the same on every machine for the same plan, different across plans."""
    return hashlib.sha256(f"{plan_digest}\n{key}".encode()).hexdigest()[:16]


def case_seed(plan_digest: str, key: str) -> int:
    """A seed for a case's random draws (impairment): the first 8 hex digits of its id."""
    return int(case_id(plan_digest, key)[:8], 16)


def shard_of(case_rep: int, reps: int, cell: int, count: int) -> int:
    """The shard of repetition `case_rep` of cell number `cell` holding `reps` repetitions."""
    return (case_rep * count // reps + cell) % count


def cells(plan: Plan) -> list[tuple[str, str, int, list[Case]]]:
    """(profile, point name, repetitions, cases) per cell, in plan order."""
    out: dict[tuple[str, str], list[Case]] = {}
    for c in plan.cases():
        out.setdefault((c.profile, c.point.name), []).append(c)
    return [(p, pt, max(c.rep for c in cs) + 1, cs) for (p, pt), cs in out.items()]


def shard_cases(plan: Plan, shard: Shard | None) -> list[Case]:
    """The cases `shard` runs, in the plan's run order (every case when shard is None)."""
    cases = plan.cases()
    if shard is None:
        return cases
    mine: set[str] = set()
    for n, (_, _, reps, cs) in enumerate(cells(plan)):
        mine |= {c.key for c in cs if shard_of(c.rep, reps, n, shard.count) == shard.index}
    return [c for c in cases if c.key in mine]


# ---------------------------------------------------------------------- what a shard records


def source_hash(root: Path = PACKAGE_DIR) -> str:
    """SHA-256 over lab/'s Python files (relative path and content, sorted): the code that ran,
    whether or not a git checkout is there (a container image, a copy on a cluster node)."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        if "__pycache__" in p.parts:
            continue
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def code_version(git_describe: str | None) -> dict:
    """What `lab merge` compares: the package version and the source hash (git describe is
    recorded too, but a checkout's `-dirty` does not say which edits it has)."""
    return {"lab_version": __version__, "source_sha256": source_hash(), "git": git_describe}


def calibration_of(spec) -> dict:
    """This machine's calibration of every CPU profile the topology's nodes name: the merged
    calibration summary, or why there is none (each machine of a sharded run fits its own)."""

    out: dict = {"host_cpu_model": host_cpu_model(), "profiles": {}}
    for name in sorted({n.cpu for n in spec.hosts() if isinstance(n.cpu, str)}):
        prof = load_cpu_profile(name)
        out["profiles"][name] = (
            {"calibrated": True, "core_share": prof.core_share, **(prof.calibration or {})}
            if prof.calibrated
            else {"calibrated": False, "reason": prof.uncalibrated_reason}
        )
    return out


def shard_record(shard: Shard | None, spec, git_describe: str | None) -> dict:
    """The manifest keys of every run (a whole plan is shard None): code version, shard, and
    this machine's calibration."""
    return {
        "code_version": code_version(git_describe),
        "shard": shard.to_json() if shard else None,
        "calibration": calibration_of(spec),
    }


def plan_from_json(d: dict, *, source: str) -> Plan:
    """The Plan a run directory's plan.json describes, enough to list its cases (no topology
    or profile is loaded, so a merge needs neither); its digest must be the one stored."""

    try:
        plan = Plan(
            name=d["name"],
            source=d.get("source", ""),
            description=d.get("description", ""),
            study=d.get("study", ""),
            notes=d.get("notes", []),
            topology_file=d["topology"]["file"],
            topo=d["topology"].get("topo"),
            topology_params=d["topology"].get("params", {}),
            profiles=list(d["profiles"]),
            points=[ImpairmentPoint.from_json(p, source=source) for p in d["impairments"]],
            placement=d.get("placement"),
            reps=d["reps"],
            impaired_reps=d["impaired_reps"],
            timeout_s=d["timeout_s"],
            error_bars=d["error_bars"],
            tests=[
                TestEntry(
                    t["label"],
                    t["test"],
                    t["params"],
                    t["reps"],
                    t.get("ip", 4),
                    tuple(t["points"]) if t.get("points") is not None else None,
                )
                for t in d["tests"]
            ],
            vm=d.get("vm", False),
            overrides=d.get("overrides", []),
        )
    except (KeyError, TypeError) as e:
        raise ConfigError(f"not a plan this lab wrote ({e!r})", source=source) from None
    if plan.digest() != d.get("digest"):
        raise ConfigError(
            f"its digest {d.get('digest')!r} is not the digest of its content "
            f"({plan.digest()}): the file was edited or written by another version",
            source=source,
            field="digest",
        )
    return plan


def resume_shard(run, given: Shard | None) -> Shard | None:
    """The shard a resumed run continues: the one its plan.json stores (--shard, if given,
    must be the same)."""
    stored = run.plan_json().get("shard")
    shard = Shard.from_json(stored) if stored else None
    if given is not None and given != shard:
        raise ConfigError(
            f"this run is shard {shard or 'none (the whole plan)'}, not {given}; resume it "
            "without --shard",
            source=str(run.path),
            field="--shard",
        )
    return shard
