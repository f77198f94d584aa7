"""`lab run PLAN --jobs N|auto` and `lab run --resume RUN` of such a run: the checks before
anything is created, and the lines printed while lab.campaign.parallel runs the labs side by side."""

from __future__ import annotations

import time
from pathlib import Path

from lab.core.paths import results_root
from lab.cli.printing import err, out, print_notices, print_run_summary
from lab.core.errors import ConfigError
from lab.campaign.parallel import is_jobs_run, resume_jobs, run_jobs
from lab.campaign.load import load_plan
from lab.campaign.setup import check_run_dir
from lab.substrate.registry import select
from lab.campaign.parallel import precheck


class JobsPrinter:
    """lab.campaign.parallel.JobEvents on the terminal: notes, and a line when the count of finished
    cases changes."""

    def __init__(self):
        self.done = -1

    def note(self, text: str) -> None:
        out.print(text, markup=False, highlight=False)

    def progress(self, done: int, total: int) -> None:
        if done != self.done:
            self.done = done
            stamp = time.strftime("%H:%M:%S")
            out.print(f"{stamp} {done}/{total} cases finished", markup=False, highlight=False)


def refuse_with(args, what: str) -> None:
    raise ConfigError(f"--jobs runs on this machine's kernel only; {what} is not supported "
                      "with it (docs/scale.md \"Parallel labs\")", source="lab run",
                      field="--jobs")  # fmt: skip


def cmd_run_jobs(args, jobs) -> int:
    """`jobs`: lab.campaign.jobs.parse_jobs of --jobs ("auto" or N >= 2), or None for a resume."""

    if args.shard is not None:
        refuse_with(args, "--shard (--jobs cuts the plan into shards itself)")
    for flag, given in (("--boards", args.boards), ("--vm", args.vm)):
        if given:
            refuse_with(args, flag)
    argv = ["lab", *args.argv]
    if args.resume:
        run = Path(args.resume)
        if jobs is not None:
            raise ConfigError(
                "a --jobs run resumes with the number of labs it was started with; leave "
                "--jobs out",
                source=str(run),
                field="--jobs",
            )
        if args.plan or args.override:
            raise ConfigError(
                "a --jobs run resumes its own plan; leave PLAN and -o out",
                source=str(run),
                field="--resume",
            )
        assert is_jobs_run(run)
        out.print(f"run directory: {run}", markup=False, highlight=False)
        return _finish(lambda ev: resume_jobs(run, ev, argv), run)
    if not args.plan:
        raise ConfigError("give a PLAN (or --resume RUN_DIR)", source="lab run", field="PLAN")
    plan = load_plan(args.plan, list(args.override))
    print_notices(plan)
    substrate = select(plan=plan)
    if not substrate.supports_jobs:
        refuse_with(args, "a plan with vm = true")
    if args.out:
        run = Path(args.out)
    else:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        run = results_root() / f"{stamp}_{plan.name}"
    check_run_dir(run)
    spec = substrate.preflight(plan)

    precheck(plan, spec, jobs, args.force)  # an N that cannot fit: refused before anything
    out.print(f"run directory: {run}", markup=False, highlight=False)
    return _finish(lambda ev: run_jobs(plan, spec, run, jobs, args.force, ev, argv), run)


def _finish(job, run: Path) -> int:
    t0 = time.monotonic()
    try:
        s = job(JobsPrinter())
    except KeyboardInterrupt:
        err.print(f"lab: interrupted; every worker's lab is down. Continue: lab run --resume {run}")
        return 130
    print_run_summary(s)
    out.print(
        f"wall time {time.monotonic() - t0:.0f} s (the report's time budget sums the labs' "
        "sessions, which ran side by side)",
        markup=False,
        highlight=False,
    )
    return 1 if s["failed"] else 0
