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

Every problem of a file is reported at once (lab.campaign.plantests.Problems, which also
validates the [[tests]] entries); the file is found by lab.core.paths' rule. The data model
(tests, cases, estimates) is lab.campaign.plan, the impairment points and sweeps
lab.model.impairment.points.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from lab import REPO
from lab.core.paths import locate
from lab.campaign.overrides import apply_overrides
from lab.campaign.plan import SCHEMA, Plan, TestEntry
from lab.campaign.plantests import Problems, bad, each, int_field, num_field, plan_tests, str_field
from lab.core.errors import ConfigError, did_you_mean
from lab.model.impairment.points import NAME_RE, impairment_points
from lab.vpn.profiles import Profile, known_profiles, load_profile
from lab.vpn.control import can
from lab.vpn.tunnel import place
from lab.model.cpuprofile import known_profiles as known_cpu
from lab.model.cpuprofile import parse_nic_latency
from lab.model.dilation import parse_dilation
from lab.model.topology import load_topology
from lab.model.impairment.presets import PLACEMENTS
from lab.measure import TESTS

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
    plan.file = str(path.absolute())
    if any(o.split("=", 1)[0].strip() == "duration" for o in overrides):
        plan.notices.append("-o duration is now -o duration_s; the old name will go")
    return plan


WITH_OVERRIDES = " (with -o "


def plan_file(source: str) -> str:
    """The plan file of a Plan.source ("FILE" or "FILE (with -o k=v -o ...)")."""
    return source.split(WITH_OVERRIDES)[0]


# ---------------------------------------------------------------------- validation


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
            raise bad(f"give {new} only ({old} is its old name)", source, old)
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
    problems = Problems(source)
    notices: list[str] = []
    with problems:
        raw = _aliases(raw, source, notices)
    with problems:
        unknown = sorted(set(raw) - set(TOP_KEYS) - set(ALIASES))
        each(
            [
                bad(
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
            raise bad(f"got {schema!r}; accepted: {SCHEMA}", source, "schema")
    name = default_name
    with problems:
        name = str_field(raw, "name", source, default_name)
        if not NAME_RE.match(name):
            raise bad(f"got {name!r}; accepted: letters, digits, '-', '_', '.'", source, "name")
    notes: list[str] = []
    with problems:
        notes = raw.get("notes", [])
        if isinstance(notes, str):
            notes = [notes]
        if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
            raise bad("accepted: a string or a list of strings", source, "notes")

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
            raise bad(
                f"got {placement!r}{did_you_mean(placement, PLACEMENTS)}; accepted: "
                f"{', '.join(PLACEMENTS)}",
                source,
                "placement",
            )
    reps = impaired_reps = 1
    with problems:
        reps = int_field(raw, "reps", source, 1)
    with problems:
        impaired_reps = int_field(raw, "impaired_reps", source, reps)
    timeout_s = 30.0
    with problems:
        timeout_s = num_field(raw.get("timeout_s", 30), "timeout_s", source, 1, 3600)
    error_bars = raw.get("error_bars", "sd")
    with problems:
        if error_bars not in ERROR_BARS:
            raise bad(
                f"got {error_bars!r}; accepted: {', '.join(ERROR_BARS)}", source, "error_bars"
            )
    with problems:
        adaptive = raw.get("adaptive", False)
        if not isinstance(adaptive, bool):
            raise bad(f"got {adaptive!r}; accepted: true, false", source, "adaptive")
    names = {p.name for p in points}
    if file_points is None and not points:
        names = None  # the impairments did not load: the tests' points are not judged
    before = len(problems.errors)
    tests = plan_tests(
        raw, source, None if names is None else names | (file_points or set()), problems
    )
    if len(problems.errors) == before:  # every entry loaded: tests[i] is the file's i-th
        with problems:
            _check_needs(tests, loaded, source)
    vm = False
    with problems:
        vm = raw.get("vm", False)
        if not isinstance(vm, bool):
            raise bad(f"got {vm!r}; accepted: true, false", source, "vm")
    texts = {"description": "", "study": ""}
    for key in texts:
        with problems:
            texts[key] = str_field(raw, key, source)
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


def _topology(raw: dict, source: str, base_dir: Path):
    t = raw.get("topology")
    if not isinstance(t, dict):
        raise bad(f"missing or not a table; keys: {', '.join(TOPOLOGY_KEYS)}", source, "topology")
    unknown = sorted(set(t) - set(TOPOLOGY_KEYS))
    if unknown:
        raise bad(
            f"unknown key; accepted: {', '.join(TOPOLOGY_KEYS)}", source, f"topology.{unknown[0]}"
        )
    f = t.get("file")
    if not isinstance(f, str) or not f:
        raise bad(
            "missing; accepted: a topology file path, e.g. topologies/pi_pair.py",
            source,
            "topology.file",
        )
    # a path in a plan is relative to the plan's folder, then to the current directory (a
    # plan beside its topologies/), then to the installation; a bare name is a shipped one
    path = locate("topology", f, source=source, field="topology.file", bases=[base_dir, Path()])
    topo = t.get("topo")
    if topo is not None and not isinstance(topo, str):
        raise bad(f"got {topo!r}; accepted: a string", source, "topology.topo")
    params = t.get("params", {})
    if not isinstance(params, dict):
        raise bad("accepted: a table of parameters", source, "topology.params")
    params = dict(params)
    if "cpu" in t:
        cpu = t["cpu"]
        if isinstance(cpu, str):
            if cpu not in known_cpu():
                raise bad(
                    f"unknown CPU profile {cpu!r}; accepted: {', '.join(known_cpu())} "
                    "or a fraction of one core",
                    source,
                    "topology.cpu",
                )
        elif isinstance(cpu, bool) or not isinstance(cpu, int | float) or cpu <= 0:
            raise bad(
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
        raise bad(str(e), source, "topology") from None
    # the installation's files by their path in it (plans' digests stay those of earlier
    # runs), others absolute: the run is resumed, and its lab built, from any folder
    full = path.resolve()
    rel = str(full.relative_to(REPO)) if full.is_relative_to(REPO) else str(full)
    return rel, spec.topo_name, params, spec


def _profiles(raw: dict, source: str, spec, problems: Problems) -> dict[str, Profile]:
    """The plan's profile specs, each loaded, validated and placed in the topology `spec` (when
    it loaded), by the spec the plan gives (its name in cases and records), in the plan's
    order; every bad one goes to `problems`, each named by its field (profiles[i])."""
    profiles = raw.get("profiles")
    loaded: dict[str, Profile] = {}
    with problems:
        if not isinstance(profiles, list) or not profiles:
            raise bad(
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
                raise bad(f"got {p!r}; accepted: a profile name", source, fld)
            where = f"{source}: {fld}"
            try:
                loaded[p] = load_profile(p, where=where)
                if spec is not None:
                    place(spec, loaded[p])
            except ConfigError as e:
                if (e.source or "").startswith(where):  # the spec's own error names its field
                    raise
                raise bad(str(e), source, fld) from None  # the profile file's, or placing it
    with problems:
        dup = sorted({p for p in profiles if isinstance(p, str) and profiles.count(p) > 1})
        if dup:
            raise bad(f"profile {dup[0]!r} listed twice", source, "profiles")
    return loaded


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
                raise bad(
                    f"test {t.label!r} asks for {need} = true, which profile {spec!r} cannot "
                    f"do: {answer.how}; profiles that can: {', '.join(able) or '(none)'} "
                    f'(or unsupported = "not-applicable" in the test: those profiles then '
                    "record it as not applicable)",
                    source,
                    f"tests[{i}].{need}",
                )
