"""What `lab run` prints (issue 21): a line per finished case without a terminal, and the headline
table with both report paths at the end (no root)."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

from rich.console import Console

from lab.results.report import generate
from lab.cli.progress import RunProgress

from .test_results import make_run


def _case(key):
    return SimpleNamespace(key=key)


def test_without_a_terminal_every_finished_case_is_a_line():
    buf = io.StringIO()
    progress = RunProgress(Console(file=buf, force_terminal=False, width=200))
    with progress:
        progress.start(total=2, skipped=0, estimate_s=20, run=None)
        ok = {"ok": True, "test": "tcp", "records": [{"receiver_bps": 957e6}]}
        progress.case_done(_case("wireguard|none|tcp|0"), ok, 10)
        bad = {"ok": False, "test": "ping", "error": "ping exited 1: unreachable", "records": []}
        progress.case_done(_case("wireguard|none|ping|0"), bad, 10)
    lines = [ln for ln in buf.getvalue().splitlines() if "|0 " in ln]
    assert len(lines) == 2
    # time, position, case, verdict, headline figure, ETA
    assert re.match(
        r"\d\d:\d\d:\d\d \[1/2\] wireguard\|none\|tcp\|0 ok 957 Mbit/s ETA \d", lines[0]
    )
    assert "[2/2] wireguard|none|ping|0 FAILED ping exited 1: unreachable ETA 0:00:00" in lines[1]


def test_on_a_terminal_there_is_a_bar_and_no_case_lines():
    buf = io.StringIO()
    progress = RunProgress(Console(file=buf, force_terminal=True, width=120))
    with progress:
        progress.start(total=1, skipped=0, estimate_s=10, run=None)
        ok = {"ok": True, "test": "tcp", "records": [{"receiver_bps": 957e6}]}
        progress.case_done(_case("wireguard|none|tcp|0"), ok, 10)
    text = buf.getvalue()
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    # the bar is drawn (redrawn in place: carriage returns, the cursor hidden then restored)
    frames = [f for f in re.split(r"[\r\n]", plain) if "━" in f]
    assert frames and "\x1b[?25l" in text and "\x1b[?25h" in text, repr(text)
    assert "0/1 cases" in frames[0] and "1/1 cases" in frames[-1], frames
    # and no case line: the bar's count moved instead
    assert "957 Mbit/s" not in plain and "wireguard|none|tcp|0 ok" not in plain


def test_run_ends_with_the_headline_and_both_report_paths(tmp_path, monkeypatch):
    import lab.cli.printing as cliprint

    run = make_run(tmp_path / "run")
    s = generate(run.path)
    buf = io.StringIO()
    monkeypatch.setattr(cliprint, "out", Console(file=buf, width=250))
    cliprint.print_run_summary(s)
    text = buf.getvalue()
    assert str(run.file("report.md")) in text and str(run.file("report.html")) in text
    assert "tcp throughput (Mbit/s)" in text and "ping mean RTT (ms)" in text
    # make_run: baseline tcp at 900 Mbit/s x (1, 1.01, 1.02) without impairment
    row = next(ln for ln in text.splitlines() if "baseline" in ln and " none " in ln)
    assert "909 ± 9.0 (n=3)" in row
    # the failed udp repetition of wireguard is counted where it belongs
    row = next(ln for ln in text.splitlines() if "wireguard" in ln and " none " in ln)
    assert "[1 failed]" in row
