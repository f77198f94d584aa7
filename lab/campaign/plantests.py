"""A plan's [[tests]] entries, and the field checks of lab.campaign.load that collect every
problem of a plan file (`Problems`) rather than stopping at the first (issue 32 item 14)."""

from __future__ import annotations

from typing import Any

from lab.campaign.plan import TestEntry
from lab.core.errors import ConfigError, ConfigErrors, LabError, did_you_mean
from lab.measure import TESTS, get_test
from lab.model.impairment.points import NAME_RE

TEST_META_KEYS = ("test", "name", "reps", "ip", "args", "points")


class Problems:
    """Every ConfigError of one plan, collected so that the file's problems are reported
    together (issue 32 item 14): `with problems:` around each independent check."""

    def __init__(self, source: str):
        self.source = source
        self.errors: list[ConfigError] = []

    def __enter__(self) -> Problems:
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


def each(errors: list[ConfigError]) -> None:
    """Raise the one error, or all of them together."""
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ConfigErrors(errors, source=errors[0].source)


#: repetitions a plan may ask for (a typo of 10**9 would otherwise run for years)
MAX_REPS = 10_000


def bad(msg: str, source: str, fld: str) -> ConfigError:
    return ConfigError(msg, source=source, field=fld)


def int_field(
    raw: dict, key: str, source: str, default: int | None, lo: int = 1, hi: int = MAX_REPS
) -> int | None:
    v = raw.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        shown = repr(v) if len(repr(v)) <= 40 else repr(v)[:40] + "..."
        raise bad(f"got {shown}; accepted: an integer {lo}..{hi}", source, key)
    return v


def num_field(v: Any, key: str, source: str, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
        raise bad(f"got {v!r}; accepted: a number {lo:g}..{hi:g}", source, key)
    return float(v)


def str_field(raw: dict, key: str, source: str, default: str = "") -> str:
    v = raw.get(key, default)
    if not isinstance(v, str):
        raise bad(f"got {type(v).__name__} {v!r}; accepted: a string", source, key)
    return v


def entry_points(t: dict, known: set[str], source: str, fld: str) -> tuple[str, ...] | None:
    """A test's `points`: impairment point names of the plan (None when absent: all)."""
    if "points" not in t:
        return None
    v = t["points"]
    accepted = f"accepted: a non-empty list of the plan's point names ({', '.join(sorted(known))})"
    if not isinstance(v, list) or not v or not all(isinstance(n, str) for n in v):
        raise bad(f"got {v!r}; {accepted}", source, f"{fld}.points")
    unknown = [n for n in v if n not in known]
    if unknown:
        raise bad(f"no impairment point {unknown[0]!r}; {accepted}", source, f"{fld}.points")
    return tuple(dict.fromkeys(v))


def plan_tests(
    raw: dict, source: str, point_names: set[str] | None, problems: Problems
) -> list[TestEntry]:
    """The [[tests]] entries; every bad one goes to `problems`. `point_names`: the plan's
    impairment point names (None: they did not load, and the tests' `points` are not judged)."""
    tests = raw.get("tests")
    out: list[TestEntry] = []
    with problems:
        if not isinstance(tests, list) or not tests:
            raise bad(
                f"missing or empty; add [[tests]] with test = one of {', '.join(sorted(TESTS))}",
                source,
                "tests",
            )
    defaults: dict = {}
    with problems:
        defaults = raw.get("defaults", {})
        if not isinstance(defaults, dict):
            defaults = {}
            raise bad("accepted: a table of test parameters", source, "defaults")
    duration = None
    with problems:
        duration = raw.get("duration_s")
        if duration is not None:
            duration = num_field(duration, "duration_s", source, 0.1, 36000)
    if not isinstance(tests, list):
        return out
    used_defaults: set[str] = set()
    bad_entries = 0
    for i, t in enumerate(tests):
        with problems:
            bad_entries += 1
            out.append(
                one_test(
                    t, f"tests[{i}]", raw, source, defaults, duration, used_defaults, point_names
                )
            )
            bad_entries -= 1
    with problems:
        unused = sorted(
            set(defaults) - used_defaults - {k for t in out for k in TESTS[t.test].schema}
        )
        if unused and not bad_entries:  # a bad entry may be the one that takes it
            accepted = sorted({k for t in out for k in TESTS[t.test].schema})
            each(
                [
                    bad(
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
            raise bad(
                f"test label {dup[0]!r} used twice; give each a unique name=", source, "tests"
            )
    return out


def one_test(
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
        raise bad("accepted: a table with test = NAME", source, fld)
    if "test" not in t:
        raise bad(f"missing test; accepted: {', '.join(sorted(TESTS))}", source, f"{fld}.test")
    test = get_test(t["test"], source=source, field=f"{fld}.test")
    label = t.get("name", t["test"])
    if not isinstance(label, str) or not NAME_RE.match(label):
        raise bad(f"got {label!r}; accepted: letters, digits, '-', '_', '.'", source, f"{fld}.name")
    reps = int_field(t, "reps", f"{source}: {fld}", None)
    ip = t.get("ip", 4)
    if ip not in (4, 6) or isinstance(ip, bool):
        raise bad(
            f"got {ip!r}; accepted: 4 or 6 (the traffic address the test targets)",
            source,
            f"{fld}.ip",
        )
    params = {k: v for k, v in t.items() if k not in TEST_META_KEYS}
    # `args = {...}`: the test's parameters as a table, for names the entry itself uses
    # (contention's own `test` parameter)
    args = t.get("args", {})
    if not isinstance(args, dict):
        raise bad("accepted: a table of the test's parameters", source, f"{fld}.args")
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
    points = entry_points(t, point_names, source, fld) if point_names is not None else None
    return TestEntry(label, test.name, params, reps, ip, points)
