"""docs/tutorial.md, run command by command (issue 32's "Must show").

Every ```console block of the page is read; each `$ ` line is a command (a heredoc's lines
belong to it; the other lines are sample output). The comments before a block say how to run it:

    <!-- not run: REASON -->        skipped (set-up that installs packages)
    <!-- needs: TOOL -->            run only where TOOL is on PATH, else a warning names it
    <!-- exit: 0 1 -->              the exit codes accepted (default 0)
    <!-- expect: TEXT -->           TEXT appears in what the block's commands print
    <!-- expect-min-rtt-ms: N -->   every ping summary of the block has min RTT >= N ms

The commands run in order, as root, in one scratch folder that has the checkout's topologies/,
plans/, vpn_profiles/ and docs/ linked in (the relative paths of the page then mean what they
mean in the checkout, and nothing is written into it), under the suite's own LAB_STATE_DIR and
LAB_RUN_DIR. `sudo` only passes its VAR=value words on (the test is root), `lab` is this
checkout's code, and `lab up` gets a unique `--id`. Afterwards no trace of any lab the walk
created is left.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import warnings
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .conftest import REPO, lab_traces
from .test_byoc import need

DOC = REPO / "docs" / "tutorial.md"
LINKED = ("topologies", "plans", "vpn_profiles", "docs")
_MARK = re.compile(r"<!--\s*([a-z][a-z -]*[a-z])\s*:\s*(.*?)\s*-->")
_HEREDOC = re.compile(r"<<-?\s*'?\"?(\w+)'?\"?")


@dataclass
class Block:
    line: int
    commands: list[str]
    marks: list[tuple[str, str]] = field(default_factory=list)

    def values(self, key: str) -> list[str]:
        return [v for k, v in self.marks if k == key]


def parse(text: str) -> list[Block]:
    """The console blocks of a page with the marks written right before each."""
    blocks: list[Block] = []
    marks: list[tuple[str, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```console"):
            start, cmds, i = i + 1, [], i + 1
            while not lines[i].startswith("```"):
                if lines[i].startswith("$ "):
                    cmd = lines[i][2:]
                    end = _HEREDOC.search(cmd)
                    if end:  # the heredoc's body, through its terminator, is the command's
                        while True:
                            i += 1
                            cmd += "\n" + lines[i]
                            if lines[i] == end.group(1):
                                break
                    cmds.append(cmd)
                i += 1
            blocks.append(Block(start, cmds, marks))
            marks = []
        elif m := _MARK.fullmatch(line.strip()):
            marks.append((m.group(1), m.group(2)))
        elif line.strip():
            marks = []  # marks belong to the block right after them
        i += 1
    return blocks


def test_the_page_parses_into_the_walk():
    """The parser reads the page as written (no root needed): every section's commands, the
    heredoc as one command, the marks where they were put."""
    blocks = parse(DOC.read_text())
    cmds = [c for b in blocks for c in b.commands]
    assert cmds[0] == "sudo ./setup.sh" and blocks[0].values("not run")
    assert any(c.startswith("cat > wg0.conf <<'EOF'\n[Interface]") and c.endswith("\nEOF")
               for c in cmds)  # fmt: skip
    for needed in ("lab up ", "lab exec client -- ping", "lab impair set", "lab run quick",
                   "lab profiles import wg0.conf", "moon.swanctl.conf", "lab ci init",
                   "lab check", "chromium-headless-shell"):  # fmt: skip
        assert any(needed in c for c in cmds), needed
    check = next(b for b in blocks if any("lab check" in c for c in b.commands))
    assert check.values("exit") == ["0 1"]
    assert not [c for c in cmds if c.startswith("$")]  # no prompt left inside a command


def _shims(bin_dir: Path, py: str, lab_id: str) -> str:
    """`lab` on PATH is this checkout's code (`lab up` with the walk's own id); `sudo`, a shell
    function, runs its command with its VAR=value words as `env` does (the test is root)."""
    bin_dir.mkdir()
    lab = bin_dir / "lab"
    lab.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = up ]; then exec {py} -m lab.cli.main "$@" --id {lab_id}; fi\n'
        f'exec {py} -m lab.cli.main "$@"\n'
    )
    lab.chmod(0o755)
    return 'set -e\nsudo() { env "$@"; }\n'


def _min_rtts(out: str) -> list[float]:
    return [float(m) for m in re.findall(r"rtt min/avg/max/mdev = ([\d.]+)/", out)]


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.timeout(600)  # the whole walk: ~60-100 s; one command may take up to 180 s
def test_tutorial_runs_command_by_command(tmp_path):
    for case in ("wireguard", "strongswan"):  # the page's tunnels: skip naming a missing tool
        need(case)
    blocks = parse(DOC.read_text())
    work = tmp_path / "walk"
    work.mkdir()
    for name in LINKED:
        (work / name).symlink_to(REPO / name)
    lab_id = "tut" + secrets.token_hex(3)
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    prelude = _shims(tmp_path / "bin", sys.executable, lab_id)
    env["PATH"] = f"{tmp_path / 'bin'}:{env['PATH']}"
    skipped, ran, seconds = [], 0, {}
    try:
        for b in blocks:
            if b.values("not run"):
                continue
            missing = [t for t in b.values("needs") if not shutil.which(t)]
            if missing:
                skipped.append(f"docs/tutorial.md:{b.line}: needs {', '.join(missing)}")
                continue
            codes = {int(c) for v in b.values("exit") for c in v.split()} or {0}
            out = ""
            for cmd in b.commands:
                t0 = time.monotonic()
                cp = subprocess.run(
                    ["bash", "-c", prelude + cmd],
                    cwd=work,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=180,
                )
                seconds[cmd.split("\n")[0][:60]] = round(time.monotonic() - t0, 1)
                ran += 1
                assert cp.returncode in codes, (
                    f"docs/tutorial.md:{b.line}: `{cmd}` exited {cp.returncode} "
                    f"(accepted {sorted(codes)})\n{cp.stdout[-3000:]}\n{cp.stderr[-3000:]}"
                )
                out += cp.stdout + cp.stderr
            flat = " ".join(out.split())  # the console wraps long lines
            for text in b.values("expect"):
                assert " ".join(text.split()) in flat, (
                    f"docs/tutorial.md:{b.line}: the page promises {text!r}; the block printed:\n"
                    f"{out[-4000:]}"
                )
            for bound in b.values("expect-min-rtt-ms"):
                rtts = _min_rtts(out)
                assert rtts and min(rtts) >= float(bound), (b.line, rtts, out[-2000:])
    finally:
        subprocess.run([sys.executable, "-m", "lab.cli.main", "down", "--id", lab_id],
                       env=env, cwd=work, capture_output=True, timeout=120)  # fmt: skip
    print(f"ran {ran} commands; seconds per command: {seconds}")
    assert ran >= 20

    # what the prose says the walk leaves behind, read from the files themselves
    run = work / "runs" / "first"
    csv = (run / "results.csv").read_text()
    assert "team/wg.toml" in csv and "team/ipsec.toml" in csv
    report = (run / "report.md").read_text()
    summary = report.split("## Summary")[1].split("\n## ")[0]
    ahead = re.search(r"\| none \| tcp \(Mbit/s\) \| (\S+) [\d.]+ vs (\S+) ", summary)
    assert ahead, summary  # the profile ahead on TCP, named, against the runner-up
    assert {ahead.group(1), ahead.group(2)} <= {"wireguard", "team/wg.toml", "team/ipsec.toml"}
    v6 = report.split("(mtu (IPv6))")[1].split("\n**")[0]
    assert "| wireguard | 1420" in v6  # the shipped profile carries IPv6: measured
    assert "| team/wg.toml | n/a |" in v6 and "| team/ipsec.toml | n/a |" in v6
    assert (work / "team" / "wg.toml").is_file() and (work / "team" / "ipsec.toml").is_file()
    assert (work / "my-configs" / ".github" / "workflows" / "lab-check.yml").is_file()
    ci = json.loads((work / "runs" / "ci" / "plan.json").read_text())
    assert ci["profiles"] == ["wg"]  # the check ran the user's profile, not the example's
    junit = ET.parse(work / "runs" / "ci" / "verdicts.xml").getroot()
    assert list(junit.iter("testcase")) and (work / "runs" / "ci" / "check.md").is_file()
    if shutil.which("chromium-headless-shell"):
        assert (run / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # nothing of any lab the walk made is left: its `lab up`s and the runs' own labs
    made = {
        e["lab_id"]
        for tl in (work / "runs").glob("*/timeline.jsonl")
        for e in map(json.loads, tl.read_text().splitlines())
        if e.get("lab_id")
    }
    assert len(made) == 2  # the lab id of the campaign and of the check
    for lid in {lab_id, *made}:
        assert lab_traces(lid) == [], lid
    for s in skipped:
        warnings.warn(f"tutorial step not run: {s}", stacklevel=1)
