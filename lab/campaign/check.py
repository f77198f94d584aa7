"""`lab check`: a finished run judged against the plan's expectations (and baseline runs), the
verdicts written as check.json, check.md (the job summary) and JUnit XML; `lab ci init`'s files.

Running the plan is `lab run`'s business (lab.cli.labs.cmd_check calls it); this module loads
and validates what a check needs before anything runs, and judges a run directory afterwards.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from lab.core.paths import results_root
from lab.core.errors import ConfigError
from lab.results.doc import label_primaries
from lab.results.expect import Expectation, parse_expectations, plan_expectations
from lab.results.verdicts import Verdict, judge, summary
from lab.results.junit import junit_xml
from lab.campaign.load import REPO, load_plan, plan_file
from lab.campaign.plan import Plan
from lab.results.report import headline
from lab.results.rundir import RunDir, rows
from lab.core.state import write_text_atomic
import tomllib

#: what `lab ci init` writes into a user's repository: destination -> template in this repository
CI_FILES = {
    ".github/workflows/lab-check.yml": REPO / "docs/examples/ci/config-regression.yml",
    "lab-check.toml": REPO / "docs/examples/ci/check.toml",
}
#: a line of those files that needs the user's value carries this comment; `lab ci init` lists them
EDIT_RE = re.compile(r"#\s*EDIT:\s*(?P<what>.+?)\s*$")


@dataclass
class CheckResult:
    run: RunDir
    verdicts: list[Verdict]
    manifest: dict
    baselines: list[str]
    counts: dict[str, int] = field(default_factory=dict)
    seconds: dict[tuple, float] = field(default_factory=dict)
    headline: dict = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.counts.get("fail", 0) > 0


def load_check(
    plan_name: str, overrides: list[str] | None = None
) -> tuple[Plan, list[Expectation]]:
    """The plan and its expectations, both validated (ConfigError before anything runs)."""
    plan = load_plan(plan_name, overrides)
    return plan, plan_expectations(plan)


def new_run_path(plan: Plan, root: Path | None = None) -> Path:
    """<results root>/<UTC time>_<plan>[-N] (lab.core.paths.results_root: ./runs or $LAB_RUN_DIR): a
    path that does not exist yet (lab run creates it)."""
    root = root if root is not None else results_root()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for i in range(1000):
        p = root / (f"{stamp}_{plan.name}" + (f"-{i}" if i else ""))
        if not p.exists():
            return p
    raise ConfigError("no free run directory name", source=str(root))


def baseline_runs(paths: list[str] | None) -> list[RunDir]:
    """The --baseline run directories (checked before anything runs)."""
    out = []
    for path in paths or []:
        run = RunDir(Path(path))
        if not run.path.is_dir() or not (run.path / "plan.json").is_file():
            raise ConfigError(
                "not a run directory (no plan.json)", source=str(path), field="--baseline"
            )
        if not run.results.is_file():
            raise ConfigError("the run has no results.jsonl", source=str(path), field="--baseline")
        out.append(run)
    return out


def run_expectations(run: RunDir, plan_name: str | None, overrides: list[str]) -> list[Expectation]:
    """Expectations for `lab check --run`: PLAN's when given, else the ones `lab check` stored
    in the run (expectations.json), else those of the plan file the run was made from."""
    if plan_name:
        return load_check(plan_name, overrides)[1]
    stored = run.file("expectations.json")
    pj = run.plan_json()
    ctx = dict(
        profiles=list(pj.get("profiles", [])),
        points=[p["name"] for p in pj.get("impairments", [])],
        tests={t["label"]: t["test"] for t in pj.get("tests", [])},
    )
    if stored.is_file():
        return parse_expectations(json.loads(stored.read_text()), source=str(stored), **ctx)
    src = Path(plan_file(pj.get("source", "")))
    if src.is_file():
        raw = tomllib.loads(src.read_text()).get("expect")
        if raw is not None:
            return parse_expectations(raw, source=str(src), **ctx)
    raise ConfigError(
        "no expectations: give PLAN (with [[expect]] tables), or judge a run `lab check` made",
        source=str(run.path),
        field="--run",
    )


def store_expectations(run: RunDir, plan: Plan) -> None:
    """The plan's [[expect]] tables as written, so `lab check --run RUN_DIR` finds them later."""
    write_text_atomic(
        run.file("expectations.json"), json.dumps(plan.raw.get("expect") or [], indent=1) + "\n"
    )


def judge_run(
    run_dir: str | Path,
    expectations: list[Expectation],
    baselines: list[RunDir] | None = None,
    *,
    allow_missing_baseline: bool = False,
) -> CheckResult:
    run = RunDir(Path(run_dir)).check()
    results = run.load_results()
    if not results:
        raise ConfigError(
            "the run has no results (results.jsonl empty or missing)", source=str(run.path)
        )
    table = rows(run.name, results)
    base_tables = [rows(b.name, b.load_results()) for b in baselines or []]
    pj = run.plan_json()
    verdicts = judge(
        expectations,
        table,
        base_tables,
        allow_missing=allow_missing_baseline,
        primaries=label_primaries(pj),
    )
    seconds: dict[tuple, float] = {}
    for r in results:
        k = (r["profile"], (r.get("impairment") or {}).get("name"), r["label"])
        seconds[k] = seconds.get(k, 0.0) + float(r.get("seconds") or 0.0)
    head = headline(
        table,
        pj.get("profiles", []),
        [p["name"] for p in pj.get("impairments", [])],
        [t["label"] for t in pj.get("tests", [])],
        pj,
    )
    res = CheckResult(
        run,
        verdicts,
        run.manifest(),
        [str(b.path) for b in baselines or []],
        summary(verdicts),
        seconds,
        head,
    )
    write_text_atomic(run.file("check.json"), json.dumps(check_json(res), indent=1) + "\n")
    write_text_atomic(run.file("check.md"), check_markdown(res))
    return res


def check_json(res: CheckResult) -> dict:
    return {
        "schema": 1,
        "run": res.run.name,
        "baselines": res.baselines,
        "counts": res.counts,
        "verdicts": [v.__dict__ for v in res.verdicts],
    }


def _md(cell: str) -> str:
    return str(cell).replace("|", "\\|").replace("\n", " ")


def _statistic(v: Verdict) -> str:
    """A verdict's last cell: its statistic (or why there is none), and the baseline case it was
    compared with when that is another spec of the profile (lab.results.verdicts.match_baseline)."""
    text = v.statistic or v.message
    compared = v.details.get("compared_with")
    return f"{text}; {compared}" if compared and v.statistic else text


def check_markdown(res: CheckResult) -> str:
    """The job summary: the verdicts, then the report's headline table."""
    c = res.counts
    icon = {"pass": "✅", "fail": "❌", "skip": "⏭️"}
    lines = [
        f"## lab check: {res.run.name}",
        "",
        f"**{'FAILED' if res.failed else 'PASSED'}**: {c['pass']} passed, {c['fail']} failed, "
        f"{c['skip']} skipped"
        + (
            f"; baseline {', '.join(f'`{Path(b).name}`' for b in res.baselines)}"
            if res.baselines
            else ""
        ),
        "",
    ]
    unjudged = [v for v in res.verdicts if v.kind == "regression" and v.status == "skip"]
    if unjudged and res.baselines:  # a gate that did not close says so before the table
        lines += [f"**{len(unjudged)} regression(s) not judged against the baseline:**", ""]
        lines += [f"- {_md(v.profile)} {_md(v.case)}: {_md(v.message)}" for v in unjudged]
        lines.append("")
    lines += [
        "| | profile | case | check | measured | bound | statistic |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in res.verdicts:
        measured = v.measured_text or ("-" if v.measured is None else f"{v.measured:.4g}")
        lines.append(
            f"| {icon[v.status]} | {_md(v.profile)} | {_md(v.case)} | {_md(v.check)} | "
            f"{measured} | {_md(v.bound)} | {_md(_statistic(v))} |"
        )
    h = res.headline
    if h.get("rows"):
        lines += [
            "",
            "### headline (mean ± sd, n repetitions)",
            "",
            "| " + " | ".join(_md(x) for x in h["header"]) + " |",
            "|" + "---|" * len(h["header"]),
        ]
        lines += ["| " + " | ".join(_md(x) for x in r) + " |" for r in h["rows"]]
    return "\n".join(lines) + "\n"


def write_junit(res: CheckResult, path: str | Path) -> Path:
    p = Path(path)
    if p.parent and not p.parent.is_dir():
        p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_bytes(junit_xml(res.verdicts, res.manifest, seconds=res.seconds))
    tmp.replace(p)
    return p


def ci_init(dest: str | Path, *, force: bool = False) -> list[Path]:
    """Write the config-regression workflow and an example plan into a repository."""
    root = Path(dest)
    if not root.is_dir():
        raise ConfigError("not a directory", source=str(dest), field="DIR")
    targets = {root / rel: src for rel, src in CI_FILES.items()}
    there = [str(t) for t in targets if t.exists()]
    if there and not force:
        raise ConfigError(
            f"already there: {', '.join(there)}; --force overwrites", source="lab ci init"
        )
    for t, src in targets.items():
        t.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, t)
    return list(targets)


def ci_edits(paths: list[Path]) -> list[tuple[Path, int, str, str]]:
    """What the files `lab ci init` wrote still need: (file, line number, the line's setting,
    what to put there) for every line marked `# EDIT: ...`."""
    out = []
    for path in paths:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            m = EDIT_RE.search(line)
            if m:
                setting = line[: m.start()].strip()
                out.append((path, n, setting, m["what"]))
    return out
