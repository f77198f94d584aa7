"""The `lab` commands (`cmd_<name>(args) -> exit code`): part of the CLI layer, dispatched by
lab.cli.main.main, which maps errors to exit codes."""

from __future__ import annotations

import json
import os
import sys
import time

from rich.markup import escape as rich_escape
from rich.table import Table

from lab.cli.printing import _print_status, _print_substrate, err, out, print_run_summary
from lab.core.errors import ConfigError, TeardownIncomplete
from lab.core.state import check_id, lab_dir, list_lab_ids, state_root
from lab.model.topology import load_topology, parse_params
from lab.substrate.base import UpRequest
from lab.substrate.registry import (
    check_resume,
    clean_order,
    kept_by_clean,
    open_lab,
    remove,
    select,
)


def cmd_up(args) -> int:
    params = parse_params(args.param)
    spec = load_topology(args.topology, args.topo, params)
    guest = [a for p in args.param for a in ("-p", p)]
    for flag, value in (
        ("--topo", args.topo),
        ("--vpn", args.vpn),
        ("--impair", args.impair),
        ("--placement", args.placement),
        ("--impair-backend", args.impair_backend),
    ):
        if value is not None:
            guest += [flag, value]
    t0 = time.monotonic()
    substrate = select(vm=args.vm, boards=args.boards, mapping=args.map, vm_mem_mb=args.vm_mem)
    request = UpRequest(
        lab_id=args.lab_id,
        vpn=args.vpn,
        impair=args.impair,
        placement=args.placement,
        impair_backend=args.impair_backend,
        topology_file=args.topology,
        guest_args=guest,
    )
    lab, status, notes = substrate.bring_up(spec, request)
    dt = time.monotonic() - t0
    for line in notes:
        err.print(line, markup=False, highlight=False)
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    _print_status(status)
    _print_substrate(status)
    if "vpn" in status:
        v = status["vpn"]
        d = v["describe"]
        out.print(
            f"vpn {v['profile']}: {d.get('implementation')} {d.get('version') or ''} "
            f"({d.get('path')}), cipher {d.get('cipher')}, mtu {d.get('mtu')}; "
            f"traffic {v['traffic']['client']} -> {v['traffic']['v4']}",
            highlight=False,
        )
    out.print(
        f"lab {lab.id!r} up {lab.up_note(status, dt)}; `lab exec NODE -- CMD`, `lab down` when done"
    )
    return 0


def cmd_down(args) -> int:
    if args.lab_id:
        lab_id = check_id(args.lab_id)
    else:
        ids = list_lab_ids()
        if len(ids) > 1:
            raise ConfigError(
                f"several labs are up ({', '.join(ids)}); choose one with --id", source="--id"
            )
        lab_id = ids[0] if ids else None
    if lab_id is None or not (lab_dir(lab_id) / "ledger.jsonl").exists():
        out.print(f"lab {lab_id or ''} is not up; nothing to do".replace("  ", " "))
        return 0
    notes: list[str] = []
    left = open_lab(lab_id).down(notes)
    for n in notes:
        err.print(f"lab: note: {n}", markup=False, highlight=False)
    if left:
        raise TeardownIncomplete(left)
    out.print(f"lab {lab_id!r} down")
    return 0


def cmd_clean(args) -> int:
    ids = clean_order(list_lab_ids())
    if not args.farms:
        for lab_id, why in kept_by_clean().items():
            ids.remove(lab_id)
            out.print(why)
    left_all = []
    for lab_id in ids:
        notes: list[str] = []
        left = remove(lab_id, notes)
        for n in notes:
            err.print(f"lab: note: {n}", markup=False, highlight=False)
        left_all += [f"{lab_id}: {x}" for x in left]
        out.print(f"lab {lab_id!r}: {'removed' if not left else 'left over: ' + '; '.join(left)}")
    # a lab killed between creating its state directory and its first ledger line owns nothing else
    root = state_root()
    if root.is_dir():
        for p in root.iterdir():
            if p.is_dir() and not (p / "ledger.jsonl").exists() and not any(p.iterdir()):
                p.rmdir()
    if not ids:
        out.print("no labs recorded; nothing to do")
    if left_all:
        raise TeardownIncomplete(left_all)
    return 0


def _known_id(lab_id: str | None) -> None:
    """An --id that never was a lab here (no ledger) is "no lab ID": not 'broken', and not a case
    for `lab clean`, which would tear down every lab on the machine."""
    if lab_id and lab_id not in list_lab_ids():
        known = ", ".join(list_lab_ids()) or "none"
        raise ConfigError(f"no lab {lab_id!r} (labs here: {known})", source="--id")


def cmd_status(args) -> int:

    ids = [args.lab_id] if args.lab_id else list_lab_ids()
    _known_id(args.lab_id)
    statuses = [open_lab(lab_id).status() for lab_id in ids]
    if args.json:
        print(json.dumps(statuses, indent=2))
        return 0
    if not statuses:
        out.print("no labs are up")
    for s in statuses:
        _print_status(s)
        _print_substrate(s)
    return 0


def _command(args) -> list[str]:
    cmd = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise ConfigError(
            "no command given; usage: lab exec NODE -- CMD [ARGS...]", source="lab exec"
        )
    return cmd


def cmd_exec(args) -> int:

    command = _command(args)  # checked before the lab is looked for
    _known_id(args.lab_id)
    return open_lab(args.lab_id).exec(args.node, command)


def cmd_shell(args) -> int:

    _known_id(args.lab_id)
    return open_lab(args.lab_id).shell(args.node)


def cmd_impair(args) -> int:

    if args.impair_cmd == "set":
        from lab.model.impairment.directional import check_words

        # the words first: bad words are bad input whether or not a lab is up
        check_words(" ".join(args.spec), source="lab impair set")
    _known_id(args.lab_id)
    lab = open_lab(args.lab_id)
    if args.impair_cmd == "set":
        target = None if args.target in ("all", "default") else args.target
        res = lab.impair("set", " ".join(args.spec), target)
    else:
        res = lab.impair(args.impair_cmd)
    if getattr(args, "json", False):
        print(json.dumps(res, indent=2, default=str))
        return 0
    out.print(
        f"backend {res.get('backend')} ({res.get('why', '')}), placement {res.get('placement')}",
        markup=False,
        highlight=False,
    )
    for where, base in (res.get("base") or {}).items():  # kept under every spec
        out.print(f"  base {where}: {base}", markup=False, highlight=False)
    for where, req in (res.get("requested") or {}).items():
        out.print(f"  requested {where}: {req}", markup=False, highlight=False)
    for where, applied in (res.get("applied") or {}).items():
        out.print(f"  applied {where}: {applied}", markup=False, highlight=False)
    for name, e in (res.get("engines") or {}).items():
        for d in ("a2b", "b2a"):
            c = (e.get(d) or {}).get("counters") if isinstance(e, dict) else None
            if c:
                out.print(
                    f"  {name} {d}: " + ", ".join(f"{k}={v}" for k, v in c.items()),
                    markup=False,
                    highlight=False,
                )
    return 0


def cmd_calibrate(args) -> int:
    from lab.campaign.calibrate import RESIDUAL_GOAL, SECONDS_GOAL, calibrate

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
    from pathlib import Path

    from lab.campaign.load import find_plan, plan_file
    from lab.results.report import generate

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
    from pathlib import Path

    from lab.campaign.merge import merge

    s = merge([Path(d) for d in args.shards], Path(args.out))
    out.print(f"merged {len(args.shards)} shards into {args.out}", markup=False, highlight=False)
    print_run_summary(s)
    return 1 if s["failed"] else 0


def cmd_report(args) -> int:
    from lab.results.report import generate

    s = generate(args.run_dir)
    out.print(
        f"{s['report']} ({s['cases']} case repetitions, {s['failed']} failed, "
        f"{len(s['plots'])} plots)"
    )
    return 0


def cmd_compare(args) -> int:
    from lab.results.compare import compare

    s = compare(args.run_a, args.run_b, args.out)
    out.print(
        f"{s['out']}/compare.md: {s['matched']} case metrics in both runs, "
        f"{s['only_a']} only in A, {s['only_b']} only in B; {s['differs']} set-up difference(s) "
        "between the runs (listed first in compare.md)"
    )
    return 0


def cmd_boards(args) -> int:
    from pathlib import Path

    from lab.substrate.boards import farm

    if args.boards_cmd == "emulate":
        if args.down:
            lab_id = farm.farm_id(args.lab_id)
            left = farm.remove(lab_id)
            if left:
                raise TeardownIncomplete([f"{lab_id}: {x}" for x in left])
            out.print(f"board farm {lab_id!r} removed")
            return 0
        if not args.topology or not args.out:
            raise ConfigError(
                "lab boards emulate TOPOLOGY --out INVENTORY (or --down to remove a farm)",
                source="lab boards emulate",
            )
        from lab.model.topology import load_topology, parse_params

        spec = load_topology(args.topology, args.topo, parse_params(args.param))
        t0 = time.monotonic()
        sudo = tuple(b for b in (args.sudo or "").split(",") if b)
        rec = farm.emulate(spec, Path(args.out), args.lab_id, sudo=sudo)
        if args.json:
            print(json.dumps(rec, indent=2))
            return 0
        for name, b in rec["boards"].items():
            out.print(
                f"board {name}: ssh {b['user']}@{b['host']}"
                + (" (root with sudo)" if b["user"] != "root" else "")
                + f", data ports {', '.join(b['data'])}"
            )
        out.print(
            f"board farm {rec['id']!r} up in {time.monotonic() - t0:.2f} s "
            f"(management {rec['subnet']}); inventory {rec['inventory']}; "
            f"`lab boards emulate --down --id {rec['id']}` removes it"
        )
        return 0
    elif args.boards_cmd == "check":
        from lab.cli.boards import cmd_boards_check

        return cmd_boards_check(args)
    elif args.boards_cmd == "prepare":
        from lab.cli.boards import cmd_boards_prepare

        return cmd_boards_prepare(args)
    raise ConfigError(f"unknown action {args.boards_cmd!r}", source="lab boards")


def cmd_import(args) -> int:
    from lab.results.importer import import_table
    from lab.results.report import generate

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
    from pathlib import Path

    from lab.campaign.check import (
        baseline_runs,
        judge_run,
        load_check,
        new_run_path,
        run_expectations,
        store_expectations,
        write_junit,
    )
    from lab.results.rundir import RunDir

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
    res = judge_run(run.path, expectations, baselines)
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
    from lab.campaign.check import ci_init

    if args.ci_cmd != "init":
        raise ConfigError(f"unknown action {args.ci_cmd!r}; accepted: init", source="lab ci")
    for p in ci_init(args.dir, force=args.force):
        out.print(f"wrote {p}", markup=False, highlight=False)
    out.print("commit them; the workflow runs `lab check lab-check.toml` on every change")
    return 0
