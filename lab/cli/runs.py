"""`lab run`, `lab check`, `lab merge`, `lab report`, `lab compare`, `lab import`, `lab calibrate`: campaigns and what they leave (part of the CLI layer)."""

from __future__ import annotations

import json
import os
import sys

from rich.markup import escape as rich_escape
from rich.table import Table

from lab.cli.printing import err, out, print_notices, print_run_summary
from lab.core.errors import ConfigError, TeardownIncomplete
from lab.substrate.registry import check_resume, select
from lab.campaign.calibrate import RESIDUAL_GOAL, SECONDS_GOAL, calibrate
from pathlib import Path
from lab.campaign.load import load_plan
from lab.results.report import generate
from lab.results.rundir import RunDir
from lab.campaign.runner import Runner
from lab.campaign.setup import create_run_dir, resume_plan
from lab.campaign.setup import check_run_dir
from lab.cli.progress import RunProgress
from lab.campaign.shard import parse_shard, resume_shard
from lab.core.state import write_json_atomic
from lab.cli.jobs import cmd_run_jobs
from lab.campaign.jobs import parse_jobs
from lab.campaign.parallel import is_jobs_run
from lab.campaign.load import find_plan, plan_file
from lab.campaign.merge import merge
from lab.results.compare import compare
from lab.results.importer import import_table
from lab.campaign.check import (
    baseline_runs,
    judge_run,
    load_check,
    new_run_path,
    run_expectations,
    store_expectations,
    write_junit,
)
from lab.campaign.check import ci_edits, ci_init


def _print_dataplanes(r: dict) -> None:
    """The data planes' own shares (lab/campaign/calibdataplane.py): board figure, this host's
    rates (the primitive alone, the process as a whole), the share, the board rate predicted
    for the process, and what a group capped at a primitive-only share delivered."""
    rows = r.get("dataplanes") or []
    if not rows:
        return
    t = Table(
        title='data planes: a share per process and primitive (docs/cpu.md "Data planes")',
        title_justify="left",
    )
    left = ("data plane", "process", "board figure")
    for col in (
        *left,
        "board MB/s",
        "primitive here",
        "process here",
        "crypto %",
        "share (cores)",
        "vs core_share",
        "capped MB/s",
        "residual",
    ):
        t.add_column(col, justify="left" if col in left else "right")

    def num(v, f):
        return format(v, f) if isinstance(v, int | float) else "-"

    for d in rows:
        res = d.get("residual")
        t.add_row(
            d["dataplane"],
            f"{d.get('daemon', '')} {d['primitive']}",
            d["board_reference"],
            f"{d['board_mbps']:g}",
            num(d.get("host_mbps"), ".1f"),
            num(d.get("process_mbps"), ".1f"),
            num(100 * d["crypto_fraction"], ".0f") if d.get("crypto_fraction") else "-",
            num(d.get("share"), ".4f"),
            f"x{d['vs_core_share']:.2f}" if d.get("vs_core_share") else "-",
            num(d.get("capped_mbps"), ".1f"),
            (f"{res:+.1%}" + ("" if abs(res) <= DATAPLANE_GOAL else " (!)"))
            if res is not None
            else "",
        )
    out.print(t)


#: |residual| goal of a data plane's capped group against the board's figure (issue 30: 15 %)
DATAPLANE_GOAL = 0.15


def _print_per_packet(r: dict) -> None:
    """Per-packet kernel work under core_share (lab/campaign/calibpacket.py): not fitted."""
    pp = r.get("per_packet") or {}
    if pp.get("skipped"):
        out.print(f"skipped per-packet work: {pp['skipped']}", markup=False, highlight=False)
    if not pp.get("rows"):
        return
    t = Table(
        title='per-packet work under core_share, not fitted (docs/cpu.md "Per-packet work")',
        title_justify="left",
    )
    cols = ("loop", "unit", "board", "host per CPU s", "at core_share", "residual", "capped")
    for col in (*cols, "capped vs board"):
        t.add_column(col, justify="left" if col in ("loop", "unit") else "right")

    def pct(x):
        return f"{x:+.1%}" if x is not None else "n/a"

    for d in pp["rows"]:
        capped = ["", ""]
        if "capped" in d:
            note = " (contended)" if d.get("contended") else ""
            capped = [f"{d['capped']:.0f}{note}", pct(d.get("capped_vs_board"))]
        t.add_row(
            d["primitive"],
            d["unit"],
            f"{d['board']:g}" if d["board"] else "-",
            f"{d['host_per_cpu_s']:.0f}",
            f"{d['predicted_board']:.0f}",
            pct(d["residual"]),
            *capped,
        )
    out.print(t)


def cmd_calibrate(args) -> int:
    progress = None if args.json else (lambda s: err.print(f"  {s}", markup=False, highlight=False))
    r = calibrate(args.profile, quick=args.quick, verify=not args.no_verify, progress=progress)
    fit = r.get("fit") or {}
    if args.json:
        print(json.dumps(r, indent=2))
        for w in fit.get("warnings") or []:  # stdout stays JSON; the human still hears it
            err.print(f"lab: warning: {w}", markup=False, highlight=False)
        return 0
    ver = (r.get("verification") or {}).get("results", {})
    t = Table(
        title=f"lab calibrate {r['profile']} ({r['mode']}) on {r['host']['cpu_model']}",
        title_justify="left",
    )
    for col in (
        "primitive",
        "reference MB/s",
        "host masked MB/s",
        "fitted board MB/s",
        "residual",
        "capped MB/s",
        "capped vs ref",
    ):
        t.add_column(col, justify="left" if col == "primitive" else "right")
    for p, m in r["measured"].items():
        host = m["best"]["cpu_mbps"]
        ref = r["references"].get(p, {}).get("mbps")
        res = r["residuals"].get(p)
        v = ver.get(p)
        t.add_row(
            p,
            f"{ref:g}" if ref else "-",
            f"{host:.1f}",
            f"{host * r['core_share']:.1f}",
            (f"{res:+.1%}" + ("" if abs(res) <= RESIDUAL_GOAL else " (!)"))
            if res is not None
            else "n/a",
            f"{v['elapsed_mbps']:.1f}" if v else "",
            f"{v['error']:+.1%}" if v else "",
        )
    out.print(t)
    _print_dataplanes(r)
    _print_per_packet(r)
    share = r["core_share"]
    out.print(
        f"core_share = {share:.4f} host cores per board core: a node gets a CFS quota of "
        f"{share * 100_000:.0f} us per 100000 us period per emulated board core"
    )
    out.print(
        f"max |residual| {r['max_abs_residual']:.1%} (goal <= {RESIDUAL_GOAL:.0%}); "
        f"took {r['duration_s']:.1f} s (goal < {SECONDS_GOAL:.0f} s)"
    )
    if fit.get("above_threshold"):
        out.print(
            f"POOR FIT on this machine: one core_share cannot make every primitive run at the "
            f"{r['profile']} figures here (|residual| > {fit['threshold']:.0%}):",
            markup=False,
            highlight=False,
        )
        for w in fit["warnings"]:
            out.print(f"  - {w}", markup=False, highlight=False)
        out.print(
            "  Every run's manifest and report carry this warning. Re-run `lab calibrate` on an "
            "idle machine (without --quick) to tell host noise from a real mismatch of this CPU; "
            "see docs/cpu.md (Fit quality).",
            markup=False,
            highlight=False,
        )
    if r.get("unmasked_cpu_mbps"):
        out.print(
            "masks bite: "
            + ", ".join(
                f"{p} {v:.0f} -> {r['measured'][p]['best']['cpu_mbps']:.0f} MB/s"
                for p, v in r["unmasked_cpu_mbps"].items()
            )
        )
    for p, why in r.get("skipped", {}).items():
        out.print(f"skipped {p}: {why}")
    if r.get("verification"):
        v = r["verification"]
        out.print(
            f"verified in cgroup v{v['cgroup_version']} {v['cgroup']} at {v['quota_cores']} cores "
            "with openssl speed -elapsed; group removed"
            + (f" except: {'; '.join(v['left_over'])}" if v["left_over"] else "")
        )
        if v.get("contended"):
            out.print(
                f"note: the host was busy; {', '.join(v['contended'])} got less CPU than the "
                "quota while verifying, so those capped figures read low"
            )
    out.print(f"stored in {r.get('stored', '(not stored)')}")
    return 0


def cmd_run(args) -> int:

    jobs = parse_jobs(args.jobs) if args.jobs is not None else None
    if jobs not in (None, 1) or (args.resume and is_jobs_run(Path(args.resume))):
        return cmd_run_jobs(args, jobs)
    if args.force:
        raise ConfigError("--force goes with --jobs N", source="lab run", field="--force")
    overrides = list(args.override) + (["vm=true"] if args.vm else [])
    shard = parse_shard(args.shard) if args.shard is not None else None
    if args.resume:
        run = RunDir(Path(args.resume)).check()
        plan = resume_plan(run, args.plan, overrides)
        substrate = _run_substrate(args, plan)
        check_resume(run, substrate)
        shard = resume_shard(run, shard)
    elif args.plan:
        plan = load_plan(args.plan, overrides)
        print_notices(plan)
        substrate = _run_substrate(args, plan)
        if args.out:
            check_run_dir(Path(args.out))
        substrate.preflight(plan)  # before the run directory exists
        if shard is not None and not substrate.supports_shards:
            raise ConfigError(
                f"a shard runs on this machine's kernel or --boards; {substrate.flag} is not "
                "supported",
                source="lab run",
                field="--shard",
            )
        run = create_run_dir(plan, Path(args.out) if args.out else None)
        if shard is not None:  # in plan.json, so that --resume runs the same shard
            write_json_atomic(run.file("plan.json"), {**run.plan_json(), "shard": shard.to_json()})
    else:
        raise ConfigError("give a PLAN (or --resume RUN_DIR)", source="lab run", field="PLAN")
    if substrate.runs_whole_plan:
        return _run_whole(args, plan, run, substrate)
    out.print(f"run directory: {run.path}")
    interrupted = False
    try:
        with RunProgress(out) as progress:
            argv = json.loads(os.environ.get("LAB_RUN_ARGV") or "null") or ["lab", *sys.argv[1:]]
            Runner(plan, run, progress, argv=argv, target=substrate, shard=shard).execute()
    except KeyboardInterrupt:
        interrupted = True
    # in a `lab run --vm` guest the host writes the report once the VM is off (_run_vm): its
    # plots take over a minute of emulated CPU under TCG, a second or two on the host
    report_here = os.environ.get("LAB_RUN_REPORT") != "host"
    if report_here:
        s = generate(run.path)
        print_run_summary(s)  # headline table, counts, report.md and report.html
    if interrupted:
        err.print(f"lab: interrupted; the lab is down. Continue: lab run --resume {run.path}")
        return 130
    return 1 if report_here and s["failed"] else 0


def _run_substrate(args, plan):
    """Where `lab run` builds its labs: --boards INVENTORY, --vm (or the plan's `vm = true`),
    else this machine's namespaces."""
    return select(
        vm=args.vm, boards=args.boards, mapping=args.map, vm_mem_mb=args.vm_mem, plan=plan
    )


def _run_whole(args, plan, run, substrate) -> int:
    """`lab run --vm` (or a plan with vm = true): the same run, inside a throwaway VM."""

    plan_path = find_plan(args.plan) if args.plan else Path(plan_file(plan.source))
    out.print(f"run directory: {run.path}")
    out.print("booting the full-kernel VM ...")

    def booted(lab_id: str, info: dict) -> None:
        sub = info["substrate"]
        out.print(
            f"VM {lab_id}: kernel {sub['kernel']}, accelerator {sub['accelerator'].upper()}, "
            f"booted in {sub['boot_s']:.1f} s"
            + (f"; {sub['note']}" if sub["evidence"] == "functional" else ""),
            markup=False,
            highlight=False,
        )

    rc, left, notes = substrate.run_plan(
        plan,
        run,
        plan_path,
        overrides=args.override if args.resume else [],
        argv=["lab", *sys.argv[1:]],
        on_boot=booted,
    )
    if rc in (0, 130):  # the guest's runner finished or was interrupted: its report, here
        s = generate(run.path)
        print_run_summary(s)
        rc = 1 if rc == 0 and s["failed"] else rc
    for n in notes:
        err.print(f"lab: note: {n}", markup=False, highlight=False)
    if left:
        raise TeardownIncomplete(left)
    out.print("VM powered off; nothing of it is left on this host", highlight=False)
    return rc


def cmd_merge(args) -> int:

    s = merge([Path(d) for d in args.shards], Path(args.out))
    out.print(f"merged {len(args.shards)} shards into {args.out}", markup=False, highlight=False)
    print_run_summary(s)
    return 1 if s["failed"] else 0


def cmd_report(args) -> int:
    s = generate(args.run_dir)
    out.print(
        f"{s['report']} ({s['cases']} case repetitions, {s['failed']} failed, "
        f"{len(s['plots'])} plots)"
    )
    return 0


def cmd_compare(args) -> int:
    s = compare(args.run_a, args.run_b, args.out)
    out.print(
        f"{s['out']}/compare.md: {s['matched']} case metrics in both runs, "
        f"{s['only_a']} only in A, {s['only_b']} only in B; {s['differs']} set-up difference(s) "
        "between the runs (listed first in compare.md)"
    )
    return 0


def cmd_import(args) -> int:
    s = import_table(args.table, args.out, command_line=["lab", *args.argv])
    out.print(
        f"{s['out']}: {s['figures']} figures in {s['cases']} cases from {s['sources']} "
        "source(s), imported"
    )
    r = generate(s["out"])
    out.print(f"{r['report']} (`lab compare EMULATED_RUN {s['out']}` for the fidelity section)")
    return 0


def cmd_check(args) -> int:
    """`lab check`: run the plan (or take --run RUN_DIR), judge it, print one line per verdict."""

    baselines = baseline_runs(args.baseline)  # bad input before anything runs
    if args.run:
        if args.out or args.vm or args.boards or args.map:
            raise ConfigError(
                "--out, --vm, --boards and --map run a plan; --run judges one", source="lab check"
            )
        run = RunDir(Path(args.run)).check()
        expectations = run_expectations(run, args.plan, args.override)
    elif args.plan:
        plan, expectations = load_check(args.plan, args.override)
        print_notices(plan)
        args.out = args.out or str(new_run_path(plan))
        # lab check runs the whole plan, one lab at a time
        args.resume, args.shard, args.jobs, args.force = None, None, None, False
        rc = cmd_run(args)
        if rc == 130:
            return rc
        run = RunDir(Path(args.out))
        store_expectations(run, plan)
    else:
        raise ConfigError("give a PLAN (or --run RUN_DIR)", source="lab check", field="PLAN")
    res = judge_run(
        run.path, expectations, baselines, allow_missing_baseline=args.allow_missing_baseline
    )
    style = {"pass": "green", "fail": "red", "skip": "yellow"}
    for v in res.verdicts:
        out.print(
            f"[{style[v.status]}]{v.status.upper():4}[/] {v.profile} {v.case} {v.check}: "
            f"{rich_escape(v.message)}",
            highlight=False,
        )
    c = res.counts
    out.print(
        f"lab check: {c['pass']} passed, {c['fail']} failed, {c['skip']} skipped "
        f"({res.run.path}/check.md)",
        markup=False,
        highlight=False,
    )
    if args.junit:
        out.print(f"junit: {write_junit(res, args.junit)}", markup=False, highlight=False)
    return 1 if res.failed else 0


def cmd_ci(args) -> int:
    if args.ci_cmd != "init":
        raise ConfigError(f"unknown action {args.ci_cmd!r}; accepted: init", source="lab ci")
    paths = ci_init(args.dir, force=args.force)
    for p in paths:
        out.print(f"wrote {p}", markup=False, highlight=False)
    edits = ci_edits(paths)
    out.print(f"\nbefore the first commit, edit ({len(edits)} lines marked EDIT):")
    for i, (path, n, setting, what) in enumerate(edits, 1):
        line = f"  {i}. {path}:{n}: " + (f"{setting}  <- " if setting else "") + what
        out.print(line, markup=False, highlight=False)
    out.print(
        f"  {len(edits) + 1}. your own profiles go in vpn_profiles/ beside lab-check.toml (the "
        "workflow sets LAB_VPN_PROFILES to it; `lab profiles import FILE --out "
        "vpn_profiles/NAME.toml` makes one from a wg-quick, swanctl or OpenVPN file)",
        markup=False,
        highlight=False,
    )
    out.print(
        f"  {len(edits) + 2}. no baseline to commit: on a pull request the workflow measures the "
        "target branch's configuration first, on the same runner; commit these files to the "
        "default branch first (until it has lab-check.toml, pull requests get no baseline and "
        "regressions are skipped, saying so)",
        markup=False,
        highlight=False,
    )
    out.print("the workflow then runs `lab check lab-check.toml` on every change", markup=False)
    return 0
