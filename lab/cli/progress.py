"""The `lab run` progress display: part of the CLI layer (lab.cli.main owns the console it draws on).

The bar counts expected seconds, not cases, so its ETA weighs a 5-minute TCP test and a 1-second
MTU probe correctly; the text shows the case in flight and every failure as it happens. Without a terminal (CI, nohup,
`| tee`) a bar is drawn only at the end, so each finished case is printed as one line instead:
time, case, verdict, headline figure, ETA.
"""

from __future__ import annotations

import time
from typing import Self

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from lab.results.doc import entry_primary, fmt_value
from lab.campaign.runner import RunEvents


def case_line(case_key: str, entry: dict, *, done: int, total: int, eta_s: float | None) -> str:
    """One finished case as a line for a log: 'HH:MM:SS [3/64] KEY ok 957 Mbit/s ETA 0:01:40'."""
    verdict = "ok" if entry.get("ok") else "FAILED"
    figure = ""
    recs = entry.get("records") or []
    if entry.get("ok") and recs:
        # the entry's own (a handshake entry with only its rekey part: the rekey's recovery)
        col, unit, scale, _ = entry_primary(entry)
        rec = recs[0]
        # results.csv's throughput_bps is the receiver's rate (tcp, udp) or scp's rate_bps
        v = rec.get(col)
        if v is None and col == "throughput_bps":
            v = rec.get("receiver_bps", rec.get("rate_bps"))
        if isinstance(v, int | float):
            figure = f" {fmt_value(v * scale)} {unit}"
    else:
        figure = f" {str(entry.get('error') or '')[:120]}"
    eta = ""
    if eta_s is not None:
        m, sec = divmod(int(eta_s), 60)
        eta = f" ETA {m // 60}:{m % 60:02d}:{sec:02d}"
    return f"{time.strftime('%H:%M:%S')} [{done}/{total}] {case_key} {verdict}{figure}{eta}"


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
        self.lines = not console.is_terminal  # no live bar: a line per case instead
        self.started = time.monotonic()
        self.estimate_total = 0.0
        self.estimate_done = 0.0
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
        self.estimate_total = max(estimate_s, 1)
        self.started = time.monotonic()
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
        self.estimate_done += estimate_s
        if self.lines:
            if not entry["ok"]:
                self.failed += 1
            elapsed = time.monotonic() - self.started
            left = max(0.0, self.estimate_total - self.estimate_done)
            eta = left * elapsed / self.estimate_done if self.estimate_done else None
            self.console.print(
                case_line(case.key, entry, done=self.done, total=self.total, eta_s=eta),
                markup=False,
                highlight=False,
            )
        elif not entry["ok"]:
            self.failed += 1
            self.console.print(f"[red]failed[/] {case.key}: {entry.get('error')}", highlight=False)
        if self.task is not None:
            self.progress.update(self.task, advance=estimate_s, cases=self._cases())

    def note(self, text: str) -> None:
        self.console.print(f"lab: note: {text}", markup=False, highlight=False)
