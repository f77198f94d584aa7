"""Plan files: a campaign as data (profiles x impairments x tests x repetitions), validated whole.

A plan is a TOML file (see plans/ and docs/results.md):

    name = "quick"
    profiles = ["baseline", "wireguard"]
    impairments = ["none", "network1", {sweep = "delay", from = 0, to = 100, step = 10}]
    reps = 5                 # repetitions of every test without impairment
    impaired_reps = 1        # repetitions at each impairment point (study A: 1)
    duration = 5             # duration_s of every test that takes one (unless the test sets it)
    [topology]
    file = "topologies/pi_pair.py"
    cpu = "pi4"              # the topology's cpu parameter: a CPU profile name
    dilation = 1             # time dilation factor, or "auto" (docs/cpu.md "Time dilation")
    nic_latency = "auto"     # the boards' per-hop NIC latency: auto, on, off (docs/cpu.md)
    params = { bw = 1000 }   # the other -p parameters
    [defaults]               # parameters given to every test that accepts them
    omit_s = 1
    [[tests]]
    test = "tcp"             # a name from lab.measure.TESTS
    name = "tcp-out"         # label, unique in the plan (default: the test name)
    duration_s = 10          # the test's own parameters

`load_plan(path, overrides)` reads, applies `-o key=value` overrides (lab.campaign.overrides)
and validates everything (topology, profiles, impairment specs, every test's parameters) without
touching the system: every problem is a ConfigError naming the file, the field and the accepted
values. The plan keeps what it parsed (each profile a lab.vpn.profiles.Profile in Plan.loaded,
each impairment point its DirectionalImpairment), for the runner to hand down. `Plan.cases()`
lists the cases in the order the runner runs them (fewest lab bring-ups).

The data model (tests, cases, estimates) is lab.campaign.plan, the impairment points and
sweeps lab.model.impairment.points.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from lab import REPO
from lab.campaign.overrides import apply_overrides
from lab.campaign.plan import SCHEMA, Plan, TestEntry
from lab.core.errors import ConfigError, LabError
from lab.model.impairment.points import NAME_RE, impairment_points
from lab.vpn.profiles import Profile, known_profiles, load_profile
from lab.vpn.control import can
from lab.vpn.tunnel import place
from lab.model.cpuprofile import known_profiles as known_cpu
from lab.model.cpuprofile import parse_nic_latency
from lab.model.dilation import parse_dilation
from lab.model.topology import load_topology
from lab.measure import TESTS, get_test
from lab.model.impairment.presets import PLACEMENTS

PLAN_DIR = REPO / "plans"


#: top-level keys -> what they mean (for error messages and docs)
TOP_KEYS: dict[str, str] = {
    "schema": f"plan schema version (only {SCHEMA})",
    "name": "plan name (letters, digits, - _ .); default: the file name",
    "description": "free text",
    "study": "which study the plan reproduces (free text)",
    "notes": "free text or a list of strings (gaps, stand-ins), copied into the report",
    "topology": "table: file, topo, cpu, dilation, nic_latency, params",
    "profiles": "list of VPN profile specs (NAME or NAME:key=value,...)",
    "impairments": "list of: 'none', a preset, tc-netem words, {name, spec} or a sweep table",
    "placement": "where impairment goes: egress, ingress or middlebox (default: the lab's)",
    "reps": "repetitions per test without impairment (>= 1)",
    "impaired_reps": "repetitions per test at each impairment point (>= 1; default: reps)",
    "duration": "seconds for every test with a duration_s parameter that does not set its own",
    "adaptive": "true: tests that can (tcp, udp, ping) stop on lab.model.stoprule, duration/count "
    "the cap, and repetitions stop when their interval is narrow (default false)",
    "timeout_s": "grace beyond a tool's planned duration before it is killed (default 30)",
    "error_bars": "'sd' (study A) or 'minmax' (study D) in the report's bar charts",
    "defaults": "table of test parameters given to every test that accepts them",
    "tests": "array of tables: test, name, reps, ip (4 or 6), points (the impairment point "
    "names it runs at; default all) and the test's parameters",
    "vm": "true: run the whole plan inside the full-kernel VM (`lab run --vm`); default false",
    # judged by `lab check` (lab.results.expect validates them there); `lab run` carries them unread
    "expect": "array of tables: what must hold, judged by `lab check` (docs/ci.md)",
}


TOPOLOGY_KEYS = {
    "file": "topology file (relative to the plan, else to the repository)",
    "topo": "entry of the file's topos dict",
    "cpu": "CPU profile name given as the topology's cpu parameter",
    "params": "table of other topology parameters (the -p of `lab up`)",
    "dilation": 'time dilation: a factor >= 1 or "auto" (docs/cpu.md "Time dilation")',
    "nic_latency": 'the boards\' per-hop NIC latency: "auto", "on" or "off" (docs/cpu.md)',
}


TEST_META_KEYS = ("test", "name", "reps", "ip", "args", "points")


ERROR_BARS = ("sd", "minmax")


# ---------------------------------------------------------------------- loading


def find_plan(name: str) -> Path:
    """A path, or the name of a file in plans/ (with or without .toml)."""
    p = Path(name)
    if p.is_dir():
        raise ConfigError("is a directory, not a plan file (.toml)", source=name, field="PLAN")
    if p.is_file():
        return p
    for cand in (PLAN_DIR / name, PLAN_DIR / f"{name}.toml"):
        if cand.is_file():
            return cand
    known = sorted(q.stem for q in PLAN_DIR.glob("*.toml"))
    raise ConfigError(f"plan file not found; plans in {PLAN_DIR}: {', '.join(known)}", source=name)


def load_plan(path: str | Path, overrides: list[str] | None = None) -> Plan:
    path = find_plan(str(path))
    src = str(path)
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"not valid TOML: {e}", source=src) from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"not UTF-8 text (byte {e.start}): not a TOML file", source=src) from None
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror}", source=src) from None
    overrides = list(overrides or [])
    file_points = None
    if overrides:
        if any(o.split("=", 1)[0].strip() == "impairments" for o in overrides):
            # a test's `points` name the file's points; -o impairments may leave some out
            try:
                file_points = {pt.name for pt in impairment_points(raw, src)}
            except ConfigError:
                file_points = None  # the file's own error shows if the override keeps it
        raw = apply_overrides(raw, overrides, source=src)
        src = f"{src}{WITH_OVERRIDES}{' -o '.join(overrides)})"
    plan = validate(
        raw, source=src, base_dir=path.parent, default_name=path.stem, file_points=file_points
    )
    plan.overrides = overrides
    return plan


WITH_OVERRIDES = " (with -o "


def plan_file(source: str) -> str:
    """The plan file of a Plan.source ("FILE" or "FILE (with -o k=v -o ...)")."""
    return source.split(WITH_OVERRIDES)[0]


# ---------------------------------------------------------------------- validation


def validate(
    raw: dict,
    *,
    source: str,
    base_dir: Path,
    default_name: str,
    file_points: set[str] | None = None,
) -> Plan:
    """Turn a raw plan dict into a Plan; ConfigError on the first problem found.
    `file_points`: the point names of the plan file before `-o impairments` replaced them
    (a test's `points` may name those; it then runs at the ones that remain)."""
    unknown = sorted(set(raw) - set(TOP_KEYS))
    if unknown:
        raise _bad(f"unknown key; accepted: {', '.join(TOP_KEYS)}", source, unknown[0])
    schema = raw.get("schema", SCHEMA)
    if schema != SCHEMA or type(schema) is not type(SCHEMA):  # 1.0 == 1 but is not a version
        raise _bad(f"got {schema!r}; accepted: {SCHEMA}", source, "schema")
    name = _str(raw, "name", source, default_name)
    if not NAME_RE.match(name):
        raise _bad(f"got {name!r}; accepted: letters, digits, '-', '_', '.'", source, "name")
    notes = raw.get("notes", [])
    if isinstance(notes, str):
        notes = [notes]
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise _bad("accepted: a string or a list of strings", source, "notes")

    topo_file, topo, params, spec = _topology(raw, source, base_dir)
    loaded = _profiles(raw, source, spec)
    points = impairment_points(raw, source)
    placement = raw.get("placement")
    if placement is not None:
        if placement not in PLACEMENTS:
            raise _bad(f"got {placement!r}; accepted: {', '.join(PLACEMENTS)}", source, "placement")
    reps = _int(raw, "reps", source, 1)
    impaired_reps = _int(raw, "impaired_reps", source, reps)
    timeout_s = _num(raw.get("timeout_s", 30), "timeout_s", source, 1, 3600)
    error_bars = raw.get("error_bars", "sd")
    if error_bars not in ERROR_BARS:
        raise _bad(f"got {error_bars!r}; accepted: {', '.join(ERROR_BARS)}", source, "error_bars")
    adaptive = raw.get("adaptive", False)
    if not isinstance(adaptive, bool):
        raise _bad(f"got {adaptive!r}; accepted: true, false", source, "adaptive")
    names = {p.name for p in points}
    tests = _tests(raw, source, names | (file_points or set()))
    _check_needs(tests, loaded, source)
    vm = raw.get("vm", False)
    if not isinstance(vm, bool):
        raise _bad(f"got {vm!r}; accepted: true, false", source, "vm")
    return Plan(
        name=name,
        source=source,
        description=_str(raw, "description", source),
        study=_str(raw, "study", source),
        notes=notes,
        topology_file=topo_file,
        topo=topo,
        topology_params=params,
        profiles=list(loaded),
        points=points,
        placement=placement,
        reps=reps,
        impaired_reps=impaired_reps,
        timeout_s=timeout_s,
        error_bars=error_bars,
        tests=tests,
        vm=vm,
        raw=raw,
        loaded=loaded,
    )


def _topology(raw: dict, source: str, base_dir: Path):
    t = raw.get("topology")
    if not isinstance(t, dict):
        raise _bad(f"missing or not a table; keys: {', '.join(TOPOLOGY_KEYS)}", source, "topology")
    unknown = sorted(set(t) - set(TOPOLOGY_KEYS))
    if unknown:
        raise _bad(
            f"unknown key; accepted: {', '.join(TOPOLOGY_KEYS)}", source, f"topology.{unknown[0]}"
        )
    f = t.get("file")
    if not isinstance(f, str) or not f:
        raise _bad(
            "missing; accepted: a topology file path, e.g. topologies/pi_pair.py",
            source,
            "topology.file",
        )
    try:
        path = next((p for p in (base_dir / f, REPO / f, Path(f)) if p.is_file()), None)
    except OSError as e:  # ENAMETOOLONG and kin: no file of that name can exist
        raise _bad(f"file {f[:60]!r}: {e.strerror}", source, "topology.file") from None
    if path is None:
        known = sorted(str(p.relative_to(REPO)) for p in (REPO / "topologies").glob("*.py"))
        raise _bad(f"file {f!r} not found; topologies: {', '.join(known)}", source, "topology.file")
    topo = t.get("topo")
    if topo is not None and not isinstance(topo, str):
        raise _bad(f"got {topo!r}; accepted: a string", source, "topology.topo")
    params = t.get("params", {})
    if not isinstance(params, dict):
        raise _bad("accepted: a table of parameters", source, "topology.params")
    params = dict(params)
    if "cpu" in t:
        cpu = t["cpu"]
        if isinstance(cpu, str):
            if cpu not in known_cpu():
                raise _bad(
                    f"unknown CPU profile {cpu!r}; accepted: {', '.join(known_cpu())} "
                    "or a fraction of one core",
                    source,
                    "topology.cpu",
                )
        elif isinstance(cpu, bool) or not isinstance(cpu, int | float) or cpu <= 0:
            raise _bad(
                f"got {cpu!r}; accepted: a CPU profile name or cores > 0", source, "topology.cpu"
            )
        params["cpu"] = cpu
    if "dilation" in t:
        params["dilation"] = parse_dilation(t["dilation"], source=source, field="topology.dilation")
    if "nic_latency" in t:
        params["nic_latency"] = parse_nic_latency(
            t["nic_latency"], source=source, field="topology.nic_latency"
        )
    try:
        spec = load_topology(path, topo, params)
    except ConfigError as e:
        raise _bad(str(e), source, "topology") from None
    rel = (
        str(path.resolve().relative_to(REPO)) if path.resolve().is_relative_to(REPO) else str(path)
    )
    return rel, spec.topo_name, params, spec


def _profiles(raw: dict, source: str, spec) -> dict[str, Profile]:
    """The plan's profile specs, each loaded, validated and placed in the topology `spec`, by
    the spec the plan gives (its name in cases and records), in the plan's order."""
    profiles = raw.get("profiles")
    if not isinstance(profiles, list) or not profiles:
        raise _bad(
            f"missing or empty; accepted: a list of {', '.join(known_profiles())}",
            source,
            "profiles",
        )
    loaded: dict[str, Profile] = {}
    for i, p in enumerate(profiles):
        if not isinstance(p, str):
            raise _bad(f"got {p!r}; accepted: a profile name", source, f"profiles[{i}]")
        try:
            loaded[p] = load_profile(p)
            place(spec, loaded[p])
        except ConfigError as e:
            known = ", ".join(known_profiles())
            msg = str(e) if known in str(e) else f"{e}; profiles: {known}"
            raise _bad(msg, source, f"profiles[{i}]") from None
    dup = sorted({p for p in profiles if profiles.count(p) > 1})
    if dup:
        raise _bad(f"profile {dup[0]!r} listed twice", source, "profiles")
    return loaded


def _points(t: dict, known: set[str], source: str, fld: str) -> tuple[str, ...] | None:
    """A test's `points`: impairment point names of the plan (None when absent: all)."""
    if "points" not in t:
        return None
    v = t["points"]
    accepted = f"accepted: a non-empty list of the plan's point names ({', '.join(sorted(known))})"
    if not isinstance(v, list) or not v or not all(isinstance(n, str) for n in v):
        raise _bad(f"got {v!r}; {accepted}", source, f"{fld}.points")
    unknown = [n for n in v if n not in known]
    if unknown:
        raise _bad(f"no impairment point {unknown[0]!r}; {accepted}", source, f"{fld}.points")
    return tuple(dict.fromkeys(v))


def _tests(raw: dict, source: str, point_names: set[str]) -> list[TestEntry]:
    tests = raw.get("tests")
    if not isinstance(tests, list) or not tests:
        raise _bad(
            f"missing or empty; add [[tests]] with test = one of {', '.join(sorted(TESTS))}",
            source,
            "tests",
        )
    defaults = raw.get("defaults", {})
    if not isinstance(defaults, dict):
        raise _bad("accepted: a table of test parameters", source, "defaults")
    used_defaults: set[str] = set()
    duration = raw.get("duration")
    if duration is not None:
        duration = _num(duration, "duration", source, 0.1, 36000)
    out: list[TestEntry] = []
    for i, t in enumerate(tests):
        fld = f"tests[{i}]"
        if not isinstance(t, dict):
            raise _bad("accepted: a table with test = NAME", source, fld)
        if "test" not in t:
            raise _bad(f"missing test; accepted: {', '.join(sorted(TESTS))}", source, f"{fld}.test")
        test = get_test(t["test"], source=source, field=f"{fld}.test")
        label = t.get("name", t["test"])
        if not isinstance(label, str) or not NAME_RE.match(label):
            raise _bad(
                f"got {label!r}; accepted: letters, digits, '-', '_', '.'", source, f"{fld}.name"
            )
        reps = _int(t, "reps", f"{source}: {fld}", None)
        ip = t.get("ip", 4)
        if ip not in (4, 6) or isinstance(ip, bool):
            raise _bad(
                f"got {ip!r}; accepted: 4 or 6 (the traffic address the test targets)",
                source,
                f"{fld}.ip",
            )
        params = {k: v for k, v in t.items() if k not in TEST_META_KEYS}
        # `args = {...}`: the test's parameters as a table, for names the entry itself uses
        # (contention's own `test` parameter)
        args = t.get("args", {})
        if not isinstance(args, dict):
            raise _bad("accepted: a table of the test's parameters", source, f"{fld}.args")
        params.update(args)
        for k, v in defaults.items():
            if k in test.schema and k not in params:
                params[k] = v
                used_defaults.add(k)
        if duration is not None and "duration_s" in test.schema and "duration_s" not in params:
            params["duration_s"] = duration
        if raw.get("adaptive") is True and "adaptive" in test.schema and "adaptive" not in params:
            params["adaptive"] = True
        try:
            params = test.validate(params, source=f"{source}: {fld} ({label})")
        except LabError as e:
            raise ConfigError(str(e)) from None
        out.append(
            TestEntry(label, test.name, params, reps, ip, _points(t, point_names, source, fld))
        )
    unused = sorted(set(defaults) - used_defaults - {k for t in out for k in TESTS[t.test].schema})
    if unused:
        accepted = sorted({k for t in out for k in TESTS[t.test].schema})
        raise _bad(
            f"no test of the plan takes this parameter; accepted: {', '.join(accepted)}",
            source,
            f"defaults.{unused[0]}",
        )
    labels = [t.label for t in out]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise _bad(f"test label {dup[0]!r} used twice; give each a unique name=", source, "tests")
    return out


def _check_needs(tests: list[TestEntry], loaded: dict[str, Profile], source: str) -> None:
    """Each profile can do what each test asks of it (Test.needs, e.g. the handshake test's
    forced rekey), or a ConfigError naming the test, the profile, why not and the profiles
    that can."""
    for i, t in enumerate(tests):
        for need in TESTS[t.test].needs(t.params):
            for spec, profile in loaded.items():
                answer = can(profile, need)
                if answer.ok:
                    continue
                able = []
                for name in known_profiles():
                    try:
                        if can(load_profile(name), need).ok:
                            able.append(name)
                    except ConfigError:  # a profile file that does not load cannot do it
                        continue
                raise _bad(
                    f"test {t.label!r} asks for {need} = true, which profile {spec!r} cannot "
                    f"do: {answer.how}; profiles that can: {', '.join(able) or '(none)'}",
                    source,
                    f"tests[{i}].{need}",
                )


#: repetitions a plan may ask for (a typo of 10**9 would otherwise run for years)
MAX_REPS = 10_000


# ---------------------------------------------------------------------- field checks


def _bad(msg: str, source: str, fld: str) -> ConfigError:
    return ConfigError(msg, source=source, field=fld)


def _int(
    raw: dict, key: str, source: str, default: int | None, lo: int = 1, hi: int = MAX_REPS
) -> int | None:
    v = raw.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        shown = repr(v) if len(repr(v)) <= 40 else repr(v)[:40] + "..."
        raise _bad(f"got {shown}; accepted: an integer {lo}..{hi}", source, key)
    return v


def _num(v: Any, key: str, source: str, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
        raise _bad(f"got {v!r}; accepted: a number {lo:g}..{hi:g}", source, key)
    return float(v)


def _str(raw: dict, key: str, source: str, default: str = "") -> str:
    v = raw.get(key, default)
    if not isinstance(v, str):
        raise _bad(f"got {type(v).__name__} {v!r}; accepted: a string", source, key)
    return v
