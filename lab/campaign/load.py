"""Plan files: a campaign as data (profiles x impairments x tests x repetitions), validated whole.

A plan is a TOML file (see plans/ and docs/results.md):

    name = "quick"
    profiles = ["baseline", "wireguard"]
    impairments = ["none", "network1", {sweep = "delay", from = 0, to = 100, step = 10}]
    reps = 5                 # repetitions of every test without impairment
    impaired_reps = 1        # repetitions at each impairment point (study A: 1)
    duration_s = 5           # of every test that takes one (unless the test sets it)
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
from lab.core.paths import locate
from lab.campaign.overrides import apply_overrides
from lab.campaign.plan import SCHEMA, Plan, TestEntry
from lab.core.errors import ConfigError, ConfigErrors, LabError, did_you_mean
from lab.model.impairment.points import NAME_RE, impairment_points
from lab.vpn.profiles import Profile, known_profiles, load_profile
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
    "duration_s": "seconds for every test with a duration_s parameter that does not set its "
    "own (`duration`, its old name, is still read)",
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
    "file": "topology file: a path relative to the plan, else to the current directory, else to "
    "the installation; or a name in topologies/",
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
    """A plan file: a path (relative to the current directory, else to the installation) or the
    name of a file in plans/ (with or without .toml); lab.core.paths says the rule."""
    return locate("plan", name, field="PLAN")


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
    if any(o.split("=", 1)[0].strip() == "duration" for o in overrides):
        plan.notices.append("-o duration is now -o duration_s; the old name will go")
    return plan


WITH_OVERRIDES = " (with -o "


def plan_file(source: str) -> str:
    """The plan file of a Plan.source ("FILE" or "FILE (with -o k=v -o ...)")."""
    return source.split(WITH_OVERRIDES)[0]


# ---------------------------------------------------------------------- validation


class _Problems:
    """Every ConfigError of one plan, collected so that the file's problems are reported
    together (issue 32 item 14): `with problems:` around each independent check."""

    def __init__(self, source: str):
        self.source = source
        self.errors: list[ConfigError] = []

    def __enter__(self) -> _Problems:
        return self

    def __exit__(self, kind, error, tb) -> bool:
        if isinstance(error, ConfigError):
            self.errors.append(error)
            return True
        return False

    def check(self) -> None:
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            raise ConfigErrors(self.errors, source=self.source)


#: old key -> the key of the one vocabulary (names carry their unit, as every test parameter
#: and timeout_s do): still accepted, with a one-line note
ALIASES = {"duration": "duration_s"}


def _aliases(raw: dict, source: str, notices: list[str]) -> dict:
    """`raw` with the old keys of ALIASES renamed; a note for each one used."""
    raw = dict(raw)
    for old, new in ALIASES.items():
        if old not in raw:
            continue
        if new in raw:
            raise _bad(f"give {new} only ({old} is its old name)", source, old)
        raw[new] = raw.pop(old)
        notices.append(f"{source}: {old!r} is now {new!r}; the old name will go")
    return raw


def validate(
    raw: dict,
    *,
    source: str,
    base_dir: Path,
    default_name: str,
    file_points: set[str] | None = None,
) -> Plan:
    """Turn a raw plan dict into a Plan; every problem found is reported at once (a
    ConfigError, or ConfigErrors for several), each naming its field and the accepted values.
    `file_points`: the point names of the plan file before `-o impairments` replaced them
    (a test's `points` may name those; it then runs at the ones that remain)."""
    problems = _Problems(source)
    notices: list[str] = []
    with problems:
        raw = _aliases(raw, source, notices)
    with problems:
        unknown = sorted(set(raw) - set(TOP_KEYS) - set(ALIASES))
        _each(
            [
                _bad(
                    f"unknown key{did_you_mean(k, TOP_KEYS)}; accepted: {', '.join(TOP_KEYS)}",
                    source,
                    k,
                )
                for k in unknown
            ]
        )
    with problems:
        schema = raw.get("schema", SCHEMA)
        if schema != SCHEMA or type(schema) is not type(SCHEMA):  # 1.0 == 1 is not a version
            raise _bad(f"got {schema!r}; accepted: {SCHEMA}", source, "schema")
    name = default_name
    with problems:
        name = _str(raw, "name", source, default_name)
        if not NAME_RE.match(name):
            raise _bad(f"got {name!r}; accepted: letters, digits, '-', '_', '.'", source, "name")
    notes: list[str] = []
    with problems:
        notes = raw.get("notes", [])
        if isinstance(notes, str):
            notes = [notes]
        if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
            raise _bad("accepted: a string or a list of strings", source, "notes")

    topo_file, topo, params, spec = "", None, {}, None
    with problems:
        topo_file, topo, params, spec = _topology(raw, source, base_dir)
    loaded = _profiles(raw, source, spec, problems)
    points = []
    with problems:
        points = impairment_points(raw, source)
    placement = raw.get("placement")
    with problems:
        if placement is not None and placement not in PLACEMENTS:
            raise _bad(
                f"got {placement!r}{did_you_mean(placement, PLACEMENTS)}; accepted: "
                f"{', '.join(PLACEMENTS)}",
                source,
                "placement",
            )
    reps = impaired_reps = 1
    with problems:
        reps = _int(raw, "reps", source, 1)
    with problems:
        impaired_reps = _int(raw, "impaired_reps", source, reps)
    timeout_s = 30.0
    with problems:
        timeout_s = _num(raw.get("timeout_s", 30), "timeout_s", source, 1, 3600)
    error_bars = raw.get("error_bars", "sd")
    with problems:
        if error_bars not in ERROR_BARS:
            raise _bad(
                f"got {error_bars!r}; accepted: {', '.join(ERROR_BARS)}", source, "error_bars"
            )
    with problems:
        adaptive = raw.get("adaptive", False)
        if not isinstance(adaptive, bool):
            raise _bad(f"got {adaptive!r}; accepted: true, false", source, "adaptive")
    names = {p.name for p in points}
    if file_points is None and not points:
        names = None  # the impairments did not load: the tests' points are not judged
    tests = _tests(raw, source, None if names is None else names | (file_points or set()), problems)
    vm = False
    with problems:
        vm = raw.get("vm", False)
        if not isinstance(vm, bool):
            raise _bad(f"got {vm!r}; accepted: true, false", source, "vm")
    texts = {"description": "", "study": ""}
    for key in texts:
        with problems:
            texts[key] = _str(raw, key, source)
    problems.check()
    return Plan(
        name=name,
        source=source,
        description=texts["description"],
        study=texts["study"],
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
        notices=notices,
    )


def _each(errors: list[ConfigError]) -> None:
    """Raise the one error, or all of them together."""
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ConfigErrors(errors, source=errors[0].source)


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
    # a path in a plan is relative to the plan's folder, then to the current directory (a
    # plan beside its topologies/), then to the installation; a bare name is a shipped one
    path = locate("topology", f, source=source, field="topology.file", bases=[base_dir, Path()])
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
    # the installation's files by their path in it (plans' digests stay those of earlier
    # runs), others absolute: the run is resumed, and its lab built, from any folder
    full = path.resolve()
    rel = str(full.relative_to(REPO)) if full.is_relative_to(REPO) else str(full)
    return rel, spec.topo_name, params, spec


def _profiles(raw: dict, source: str, spec, problems: _Problems) -> dict[str, Profile]:
    """The plan's profile specs, each loaded, validated and placed in the topology `spec` (when
    it loaded), by the spec the plan gives (its name in cases and records), in the plan's
    order; every bad one goes to `problems`, each named by its field (profiles[i])."""
    profiles = raw.get("profiles")
    loaded: dict[str, Profile] = {}
    with problems:
        if not isinstance(profiles, list) or not profiles:
            raise _bad(
                f"missing or empty; accepted: a list of {', '.join(known_profiles())}",
                source,
                "profiles",
            )
    if not isinstance(profiles, list):
        return loaded
    for i, p in enumerate(profiles):
        fld = f"profiles[{i}]"
        with problems:
            if not isinstance(p, str):
                raise _bad(f"got {p!r}; accepted: a profile name", source, fld)
            where = f"{source}: {fld}"
            try:
                loaded[p] = load_profile(p, where=where)
                if spec is not None:
                    place(spec, loaded[p])
            except ConfigError as e:
                if (e.source or "").startswith(where):  # the spec's own error names its field
                    raise
                raise _bad(str(e), source, fld) from None  # the profile file's, or placing it
    with problems:
        dup = sorted({p for p in profiles if isinstance(p, str) and profiles.count(p) > 1})
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


def _tests(
    raw: dict, source: str, point_names: set[str] | None, problems: _Problems
) -> list[TestEntry]:
    """The [[tests]] entries; every bad one goes to `problems`. `point_names`: the plan's
    impairment point names (None: they did not load, and the tests' `points` are not judged)."""
    tests = raw.get("tests")
    out: list[TestEntry] = []
    with problems:
        if not isinstance(tests, list) or not tests:
            raise _bad(
                f"missing or empty; add [[tests]] with test = one of {', '.join(sorted(TESTS))}",
                source,
                "tests",
            )
    defaults: dict = {}
    with problems:
        defaults = raw.get("defaults", {})
        if not isinstance(defaults, dict):
            defaults = {}
            raise _bad("accepted: a table of test parameters", source, "defaults")
    duration = None
    with problems:
        duration = raw.get("duration_s")
        if duration is not None:
            duration = _num(duration, "duration_s", source, 0.1, 36000)
    if not isinstance(tests, list):
        return out
    used_defaults: set[str] = set()
    bad_entries = 0
    for i, t in enumerate(tests):
        with problems:
            bad_entries += 1
            out.append(
                _test(t, f"tests[{i}]", raw, source, defaults, duration, used_defaults, point_names)
            )
            bad_entries -= 1
    with problems:
        unused = sorted(
            set(defaults) - used_defaults - {k for t in out for k in TESTS[t.test].schema}
        )
        if unused and not bad_entries:  # a bad entry may be the one that takes it
            accepted = sorted({k for t in out for k in TESTS[t.test].schema})
            _each(
                [
                    _bad(
                        f"no test of the plan takes this parameter{did_you_mean(k, accepted)}; "
                        f"accepted: {', '.join(accepted)}",
                        source,
                        f"defaults.{k}",
                    )
                    for k in unused
                ]
            )
    with problems:
        labels = [t.label for t in out]
        dup = sorted({x for x in labels if labels.count(x) > 1})
        if dup:
            raise _bad(
                f"test label {dup[0]!r} used twice; give each a unique name=", source, "tests"
            )
    return out


def _test(
    t: Any,
    fld: str,
    raw: dict,
    source: str,
    defaults: dict,
    duration: float | None,
    used_defaults: set[str],
    point_names: set[str] | None,
) -> TestEntry:
    """One [[tests]] entry (`fld`: tests[i]) validated, the plan's defaults, duration_s and
    adaptive given to it."""
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
    except ConfigError:
        raise
    except LabError as e:
        raise ConfigError(str(e)) from None
    points = _points(t, point_names, source, fld) if point_names is not None else None
    return TestEntry(label, test.name, params, reps, ip, points)


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
