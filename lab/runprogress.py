"""The `lab run` progress display: part of the CLI layer (lab.cli owns the console it draws on).

The bar counts expected seconds, not cases, so its ETA weighs a 5-minute TCP test and a 1-second
MTU probe correctly; the text shows the case in flight and every failure as it happens.
"""

from __future__ import annotations

from typing import Self

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from .runner import RunEvents


class RunProgress(RunEvents):
    def __init__(self, console: Console):
        self.console = console
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[cases]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self.task = None
        self.done = 0
        self.total = 0
        self.failed = 0

    def __enter__(self) -> Self:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def _cases(self) -> str:
        f = f", {self.failed} failed" if self.failed else ""
        return f"{self.done}/{self.total} cases{f}"

    def start(self, *, total, skipped, estimate_s, run) -> None:
        self.total = total
        if skipped:
            self.console.print(f"resuming: {skipped} finished case repetitions skipped")
        self.task = self.progress.add_task(
            "starting", total=max(estimate_s, 1), cases=self._cases()
        )

    def phase(self, text: str) -> None:
        if self.task is not None:
            self.progress.update(self.task, description=text)

    def case_start(self, case, estimate_s) -> None:
        self.phase(f"{case.profile} {case.point.name} {case.test.label} #{case.rep}")

    def case_done(self, case, entry, estimate_s) -> None:
        self.done += 1
        if not entry["ok"]:
            self.failed += 1
            self.console.print(f"[red]failed[/] {case.key}: {entry.get('error')}", highlight=False)
        if self.task is not None:
            self.progress.update(self.task, advance=estimate_s, cases=self._cases())

    def note(self, text: str) -> None:
        self.console.print(f"lab: note: {text}", markup=False, highlight=False)
