"""`lab merge SHARD_DIR... --out RUN_DIR`: the run directories of `lab run --shard i/N` -> one
run directory, as one machine's `lab run` of the whole plan would have written it.

Everything is checked before anything is written: every shard is a run directory of the same
plan (digest) made by the same code (lab version and source hash), cut into the same number of
shards, each shard given once; together they hold every case of the plan exactly once (a
duplicate, a missing or a foreign case is named, with the shard it is in or should be in). Then
the directory is built under a temporary name beside RUN_DIR and renamed into place:
results.jsonl and timeline.jsonl are the shards' lines (results in the plan's case order),
raw/ and monitor/ their files, manifest.json the first shard's with every shard's sessions,
profiles and impairment readings, and `merged_from` (each shard's machine, calibration and code
version). The tables and the report are then generated from the merged results by lab.results.report,
exactly as for a run.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from lab.core.errors import ConfigError
from lab.results.report import generate
from lab.results.rundir import RunDir
from lab.campaign.setup import check_run_dir
from lab.campaign.shard import Shard, cells, plan_from_json, shard_of
from lab.core.state import write_json_atomic, write_text_atomic

#: how many names an error lists before "and N more"
SHOW = 5

#: what two shards must agree on, beyond the plan digest
CODE_KEYS = ("lab_version", "source_sha256")


def _named(items: list[str]) -> str:
    more = f" and {len(items) - SHOW} more" if len(items) > SHOW else ""
    return ", ".join(items[:SHOW]) + more


def load_shards(dirs: list[Path]) -> list[tuple[RunDir, dict, dict]]:
    """(run, plan.json, manifest) per shard, each checked on its own."""
    if not dirs:
        raise ConfigError("give the shards' run directories", source="lab merge", field="SHARD_DIR")
    out = []
    for d in dirs:
        run = RunDir(Path(d))
        if not run.path.is_dir() or not run.file("plan.json").is_file():
            raise ConfigError(
                "not a run directory (no plan.json); give the directories `lab run --shard` wrote",
                source=str(d),
            )
        m = run.manifest()
        if not m.get("code_version"):
            raise ConfigError(
                "its manifest.json records no code_version (no session started, or a lab "
                "version before `lab merge`); run the shard again with this version",
                source=str(d),
                field="code_version",
            )
        out.append((run, run.plan_json(), m))
    return out


def check_shards(shards: list[tuple[RunDir, dict, dict]]):
    """The plan all shards ran and each one's Shard; ConfigError naming the first shard that
    disagrees with the first one, and the value that differs."""
    run0, plan0, m0 = shards[0]
    plan = plan_from_json(plan0, source=str(run0.path / "plan.json"))
    parts: list[Shard] = []
    for run, p, m in shards:
        src = str(run.path)
        for d in (p.get("digest"), m.get("plan_digest")):
            if d != plan0.get("digest"):
                raise ConfigError(
                    f"plan digest {d} differs from {plan0.get('digest')} of {run0.path}: a "
                    "shard of another plan (or other -o values); merge shards of one plan",
                    source=src,
                    field="plan digest",
                )
        for k in CODE_KEYS:
            v, v0 = m["code_version"].get(k), m0["code_version"].get(k)
            if v != v0:
                raise ConfigError(
                    f"code version {k} {v} differs from {v0} of {run0.path} (git "
                    f"{m['code_version'].get('git')} vs {m0['code_version'].get('git')}); "
                    "run every shard with the same lab code",
                    source=src,
                    field=f"code_version.{k}",
                )
        want = m0["code_version"].get("source_sha256")
        for sess in m.get("sessions", []):
            v = sess.get("source_sha256", want)
            if v != want:
                raise ConfigError(
                    f"its session {sess.get('session')} (resumed) ran code version "
                    f"source_sha256 {v}, not {want} of {run0.path}; run every shard with the "
                    "same lab code",
                    source=src,
                    field="code_version.source_sha256",
                )
        sh = m.get("shard") or p.get("shard")
        parts.append(Shard.from_json(sh) if sh else Shard(0, 1))
    for (run, _, _), sh in zip(shards, parts, strict=True):
        if sh.count != parts[0].count:
            raise ConfigError(
                f"shard {sh} is one of {sh.count}, {run0.path} is shard {parts[0]} of "
                f"{parts[0].count}; merge the shards of one cut",
                source=str(run.path),
                field="shard",
            )
    seen: dict[int, Path] = {}
    for (run, _, _), sh in zip(shards, parts, strict=True):
        if sh.index in seen:
            raise ConfigError(
                f"shard {sh} given twice (also {seen[sh.index]}); give each shard once",
                source=str(run.path),
                field="shard",
            )
        seen[sh.index] = run.path
    return plan, parts


def collect(plan, shards, parts) -> list[dict]:
    """Every shard's result lines, in the plan's case order; ConfigError on a duplicate, a
    foreign or a missing case (each named, with its shard)."""
    where: dict[str, list[str]] = {}
    lines: dict[str, dict] = {}
    for (run, _, _), sh in zip(shards, parts, strict=True):
        for r in run.load_results():
            where.setdefault(r["case"], []).append(f"{run.path} (shard {sh})")
            lines[r["case"]] = r
    dup = [f"{k} in {' and '.join(w)}" for k, w in where.items() if len(w) > 1]
    if dup:
        raise ConfigError(
            f"duplicate cases: {_named(dup)}; a case must come from one shard only",
            source="lab merge",
            field="cases",
        )
    expected = {c.key for c in plan.cases()}
    foreign = [f"{k} in {where[k][0]}" for k in where if k not in expected]
    if foreign:
        raise ConfigError(
            f"cases not in the plan: {_named(foreign)}", source="lab merge", field="cases"
        )
    count = parts[0].count
    given = {sh.index: run.path for (run, _, _), sh in zip(shards, parts, strict=True)}
    missing = []
    for n, (_, _, reps, cs) in enumerate(cells(plan)):
        for c in cs:
            if c.key not in lines:
                i = shard_of(c.rep, reps, n, count)
                src = given.get(i)
                missing.append(
                    f"{c.key} (shard {i}/{count}: "
                    + (f"lab run --resume {src})" if src else "not given)")
                )
    if missing:
        raise ConfigError(
            f"{len(missing)} missing cases: {_named(missing)}", source="lab merge", field="cases"
        )
    return [lines[c.key] for c in plan.cases()]


def merged_manifest(shards, parts, name: str) -> dict:
    m = json.loads(json.dumps(shards[0][2]))
    m["run"] = name
    m["shard"] = None
    m["sessions"] = []
    m["merged_from"] = []
    for (run, _, sm), sh in zip(shards, parts, strict=True):
        m["sessions"] += sm.get("sessions", [])
        for prof, entry in (sm.get("profiles") or {}).items():
            m["profiles"].setdefault(prof, {}).update(entry)
        for pt, per in (sm.get("impairment") or {}).items():
            m["impairment"].setdefault(pt, {}).update(per)
        m["merged_from"].append(
            {
                "dir": str(run.path),
                "run": run.name,
                "shard": sh.to_json(),
                "hostname": (sm.get("kernel") or {}).get("hostname"),
                "kernel": sm.get("kernel"),
                "code_version": sm.get("code_version"),
                "calibration": sm.get("calibration"),
                "cpu": sm.get("cpu"),
                "substrate": sm.get("substrate"),
            }
        )
    return m


def merge(dirs: list[Path], out: Path) -> dict:
    """Check the shards, write the merged run directory at `out`, and its report (the
    summary lab.results.report.generate returns)."""
    out = Path(out)
    check_run_dir(out, resumable=False)  # a merge is written whole: nothing to resume
    shards = load_shards(dirs)
    order = sorted(range(len(shards)), key=lambda i: _shard_index(shards[i]))
    shards = [shards[i] for i in order]
    plan, parts = check_shards(shards)
    results = collect(plan, shards, parts)
    timeline = sorted(
        (e for run, _, _ in shards for e in run.load_timeline()), key=lambda e: e.get("t") or 0
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.merging-", dir=out.parent))
    try:
        for sub in ("raw", "monitor"):
            (tmp / sub).mkdir()
            for run, _, _ in shards:  # case paths do not overlap: one case, one shard
                if (run.path / sub).is_dir():
                    shutil.copytree(run.path / sub, tmp / sub, dirs_exist_ok=True)
        plan_json = {k: v for k, v in shards[0][1].items() if k != "shard"}
        write_json_atomic(tmp / "plan.json", plan_json)
        write_json_atomic(tmp / "manifest.json", merged_manifest(shards, parts, out.name))
        write_text_atomic(tmp / "results.jsonl", "".join(_line(r) for r in results))
        write_text_atomic(tmp / "timeline.jsonl", "".join(_line(e) for e in timeline))
        os.chmod(tmp, 0o755)
        if out.is_dir():
            out.rmdir()  # empty (check_run_dir): rename needs the name free
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return generate(out)


def _shard_index(shard: tuple[RunDir, dict, dict]) -> int:
    sh = shard[2].get("shard") or shard[1].get("shard") or {"index": 0}
    return int(sh.get("index", 0))


def _line(entry: dict) -> str:
    return json.dumps(entry, default=str) + "\n"
