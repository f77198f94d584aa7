"""`lab import TABLE.csv --out RUN_DIR`: published or hand-collected figures -> a run directory.

The table (docs/results.md, "Fidelity") has one row per figure: profile, condition, test, metric,
value, n, sd, source (and an optional label). Each (profile, condition, test label) becomes one
results.jsonl line with rep 0 and one record holding its figures, shaped like a measured case, so
`lab report` and `lab compare` read it as they read a run (results.csv and summary.csv are
written here; `lab import` then writes the report); the figure's n, sd and source go in the
line's `imported` map, which lab.results.rundir.summarize honours (summary.csv then carries the published
n and sd, not "one repetition"). manifest.json says `kind: "imported"` and lists the sources.

The whole table is validated before anything is written; the directory is built under a temporary
name next to RUN_DIR and renamed into place, so a bad table or a crash leaves nothing behind.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from lab import __version__
from lab.core.errors import ConfigError
from lab.measure import TESTS, metric_columns
from lab.results.rundir import RESULT_SCHEMA, RunDir, write_tables
from lab.core.state import write_text_atomic
from lab.model.impairment.words import PRESETS
from lab.model.impairment.points import impairment_points
from lab.vpn.profiles import known_profiles, load_profile

#: columns every table has, in this order in the documentation (any order in the file)
COLUMNS = ("profile", "condition", "test", "metric", "value", "n", "sd", "source")
#: optional: the plan's label of the test entry, when it is not the test's name (udp-100m)
OPTIONAL = ("label",)
#: condition words that mean "no impairment" (a measured run names that point 'none')
IDEAL = ("ideal", "none")
#: alias suffix for a bit/s metric given in Mbit/s: throughput_mbps = throughput_bps / 1e6
MBPS_ALIAS = ("_bps", "_mbps", 1e6)


@dataclass
class Case:
    """One (profile, condition, label): a results.jsonl line."""

    profile: str
    driver: str
    point: dict
    test: str
    label: str
    line: int
    #: metric column -> {value (in the column's unit), n, sd, source, line}
    figures: dict[str, dict] = field(default_factory=dict)


def accepted_metrics(test: str) -> dict[str, tuple[str, float]]:
    """Accepted metric names for `test` -> (results.csv column, factor to the column's unit):
    the summarised columns the test declares, plus `X_mbps` for every `X_bps`."""
    cols = metric_columns()
    out: dict[str, tuple[str, float]] = {}
    for m in TESTS[test].metrics:
        if not cols[m.name].summarised:
            continue
        out[m.name] = (m.name, 1.0)
        suffix, alias, factor = MBPS_ALIAS
        if m.name.endswith(suffix):
            out[m.name[: -len(suffix)] + alias] = (m.name, factor)
    return out


def _condition(text: str, where: str) -> dict:
    """The impairment point a condition names, named as a plan names it (so cases match)."""

    words = text.strip()
    if words.lower() in IDEAL or not words:
        return {"name": "none", "spec": "", "group": "none", "parameter": None, "value": None}
    try:
        (pt,) = impairment_points({"impairments": [words]}, where)
    except ConfigError as e:
        raise ConfigError(
            f"{e}; accepted: {' or '.join(IDEAL)}, a preset ({', '.join(PRESETS)}) or tc-netem "
            "words ('delay 20ms loss 1%')",
            source=where,
            field="condition",
        ) from None
    return {"name": pt.name, "spec": pt.spec, "group": pt.group, "parameter": None, "value": None}


def _number(text: str, where: str, col: str, *, integer: bool = False, minimum: float = 0):
    what = f"an integer >= {minimum:g}" if integer else f"a finite number >= {minimum:g}"
    try:
        v = int(text) if integer else float(text)
    except ValueError:
        raise ConfigError(f"got {text!r}; accepted: {what}", source=where, field=col) from None
    if not math.isfinite(v) or v < minimum:
        raise ConfigError(f"got {text!r}; accepted: {what}", source=where, field=col)
    return v


def read_table(path: Path) -> list[Case]:
    """Parse and validate the whole table; ConfigError naming file, line, column, accepted."""

    src = str(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ConfigError("no such file", source=src) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read it as UTF-8 text: {e}", source=src) from None
    reader = csv.reader(text.splitlines())
    header = next(reader, None)
    if not header or not any(h.strip() for h in header):
        raise ConfigError(
            f"empty table; accepted: a header line with the columns {', '.join(COLUMNS)} "
            f"(optional: {', '.join(OPTIONAL)}) and one row per figure",
            source=f"{src}: line 1",
        )
    header = [h.strip() for h in header]
    for h in header:
        if h not in COLUMNS + OPTIONAL:
            raise ConfigError(
                f"unknown column; accepted: {', '.join(COLUMNS + OPTIONAL)}",
                source=f"{src}: line 1",
                field=h,
            )
    for c in COLUMNS:
        if c not in header:
            raise ConfigError(
                f"missing column; the header needs {', '.join(COLUMNS)}",
                source=f"{src}: line 1",
                field=c,
            )
    dup = sorted({h for h in header if header.count(h) > 1})
    if dup:
        raise ConfigError("column given twice", source=f"{src}: line 1", field=dup[0])

    profiles: dict[str, str] = {}
    cases: dict[tuple, Case] = {}
    label_test: dict[str, tuple[str, int]] = {}
    seen: dict[tuple, int] = {}
    nrows = 0
    for cells in reader:
        lineno = reader.line_num
        if not any(c.strip() for c in cells):
            continue
        where = f"{src}: line {lineno}"
        if len(cells) != len(header):
            raise ConfigError(
                f"{len(cells)} cells, the header has {len(header)} ({', '.join(header)})",
                source=where,
            )
        row = {h: c.strip() for h, c in zip(header, cells, strict=True)}
        nrows += 1

        prof = row["profile"]
        if prof not in profiles:
            try:
                profiles[prof] = load_profile(prof).driver_name if prof else ""
            except ConfigError:
                profiles[prof] = ""
            if not profiles[prof]:
                raise ConfigError(
                    f"unknown profile {prof!r}; accepted: {', '.join(known_profiles())}",
                    source=where,
                    field="profile",
                )
        point = _condition(row["condition"], where)

        test = row["test"]
        if test not in TESTS:
            raise ConfigError(
                f"unknown test {test!r}; accepted: {', '.join(sorted(TESTS))}",
                source=where,
                field="test",
            )
        label = row.get("label") or test
        first = label_test.setdefault(label, (test, lineno))
        if first[0] != test:
            raise ConfigError(
                f"label {label!r} is test {first[0]!r} on line {first[1]}; accepted: one test per "
                "label (give the other a label of its own)",
                source=where,
                field="label" if row.get("label") else "test",
            )

        metrics = accepted_metrics(test)
        if row["metric"] not in metrics:
            raise ConfigError(
                f"got {row['metric']!r}, not a metric of test {test!r}; accepted: "
                f"{', '.join(metrics)}",
                source=where,
                field="metric",
            )
        column, factor = metrics[row["metric"]]
        value = _number(row["value"], where, "value")
        n = _number(row["n"], where, "n", integer=True, minimum=1)
        sd = _number(row["sd"], where, "sd") if row["sd"] else None
        if not row["source"]:
            raise ConfigError(
                "empty; accepted: where the figure comes from (paper, URL, table, board run)",
                source=where,
                field="source",
            )

        # columns read from one record key are one figure (tcp: throughput_bps = receiver_bps)
        rkey = {m.name: m.key for m in TESTS[test].metrics}[column]
        key = (prof, point["name"], label, rkey)
        if key in seen:
            raise ConfigError(
                f"the same figure as line {seen[key]} ({prof}, {point['name']}, {label}, "
                f"{column}); accepted: one row per profile, condition, test and metric (columns "
                "read from one record, such as tcp's throughput_bps and receiver_bps, are one)",
                source=where,
                field="metric",
            )
        seen[key] = lineno
        case = cases.setdefault(key[:3], Case(prof, profiles[prof], point, test, label, lineno))
        case.figures[column] = {
            "value": value * factor,
            "n": n,
            "sd": sd * factor if sd is not None else None,
            "source": row["source"],
            "line": lineno,
            "given_as": row["metric"],
        }
    if not nrows:
        raise ConfigError(
            "no figures after the header; accepted: one row per figure", source=f"{src}: line 2"
        )
    return list(cases.values())


def _result_line(case: Case) -> dict:
    test = TESTS[case.test]
    keys = {m.name: m.key for m in test.metrics}
    record = {"test": case.test, "ok": True, "error": None, "raw_files": []}
    for col, fig in case.figures.items():
        record[keys[col]] = fig["value"]
    return {
        "schema": RESULT_SCHEMA,
        "case": f"{case.profile}|{case.point['name']}|{case.label}|0",
        "session": "import",
        "profile": case.profile,
        "vpn": {"driver": case.driver, "path": None},
        "impairment": case.point,
        "test": case.test,
        "label": case.label,
        "ip": 4,
        "rep": 0,
        "params": {},
        "roles": {},
        "ok": True,
        "error": None,
        "started_utc": None,
        "seconds": None,
        "records": [record],
        "monitor": {},
        # every column read from a figure's record key carries its n and sd (tcp's
        # throughput_bps and receiver_bps are one figure)
        "imported": {
            other: {k: fig[k] for k in ("n", "sd", "source", "line", "given_as")}
            for col, fig in case.figures.items()
            for other, key in keys.items()
            if key == keys[col]
        },
    }


def import_table(
    table: str | Path, out: str | Path, *, command_line: list[str] | None = None
) -> dict:
    """Validate `table`, then write the run directory `out` (refused if it exists, unless empty)."""
    table, out = Path(table), Path(out)
    cases = read_table(table)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(
            "exists and is not an empty directory; accepted: a new run directory",
            source=str(out),
            field="--out",
        )
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    profiles = list(dict.fromkeys(c.profile for c in cases))
    points = list({c.point["name"]: c.point for c in cases}.values())
    labels = list({c.label: c.test for c in cases}.items())
    sources = list(dict.fromkeys(f["source"] for c in cases for f in c.figures.values()))
    plan = {
        "schema": 1,
        "name": out.name,
        "source": str(table.resolve()),
        "description": f"Figures imported from {table.name} by `lab import` (not measured by "
        "this lab): one line per profile, condition and test; n and sd as the source gives them.",
        "study": "",
        "notes": [],
        "topology": {},
        "profiles": profiles,
        "impairments": points,
        "placement": None,
        "reps": None,
        "impaired_reps": None,
        "timeout_s": None,
        "error_bars": "sd",
        "tests": [{"label": lb, "test": t, "reps": None, "params": {}} for lb, t in labels],
        "imported": True,
    }
    manifest = {
        "schema": RESULT_SCHEMA,
        "kind": "imported",
        "run": out.name,
        "created_utc": created,
        "lab_version": __version__,
        "command_line": command_line,
        "table": {
            "path": str(table.resolve()),
            "sha256": hashlib.sha256(table.read_bytes()).hexdigest(),
            "figures": sum(len(c.figures) for c in cases),
            "cases": len(cases),
        },
        "sources": sources,
        "profiles": {
            p: {"driver": next(c.driver for c in cases if c.profile == p), "path": None}
            for p in profiles
        },  # fmt: skip
        "lab_warnings": [],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.import-", dir=out.parent))
    try:
        write_text_atomic(tmp / "plan.json", json.dumps(plan, indent=2) + "\n")
        write_text_atomic(tmp / "manifest.json", json.dumps(manifest, indent=2) + "\n")
        write_text_atomic(
            tmp / "results.jsonl", "".join(json.dumps(_result_line(c)) + "\n" for c in cases)
        )
        write_text_atomic(tmp / "timeline.jsonl", "")
        if out.is_dir():
            out.rmdir()  # checked empty above
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_tables(RunDir(out))
    return {
        "out": str(out),
        "cases": len(cases),
        "figures": manifest["table"]["figures"],
        "sources": len(sources),
    }
