"""The GitHub workflow and .ci/run set the machine up the same way and lint the same way, so a
test that runs under one does not skip under the other (the ARM tests need `--arch arm64`)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def _commands(text: str) -> list[list[str]]:
    """Shell command lines as argv, `sudo` dropped, comments and `set`/`cd` lines skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or re.match(r"(set|cd) ", line):
            continue
        argv = shlex.split(line, comments=True)
        out.append(argv[1:] if argv[:1] == ["sudo"] else argv)
    return out


def _workflow_commands() -> list[list[str]]:
    wf = yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())
    (job,) = wf["jobs"].values()
    return [argv for step in job["steps"] if "run" in step for argv in _commands(step["run"])]


def test_workflow_and_ci_run_set_up_lint_and_test_alike():
    local = _commands((REPO / ".ci" / "run").read_text())
    remote = _workflow_commands()

    def setup(cmds):
        return [c for c in cmds if c[0] == "./setup.sh"]

    assert (
        setup(local)
        == setup(remote)
        == [["./setup.sh", "--arch", "arm64", "--with", "boringtun", "--with", "rosenpass"]]
    ), (local, remote)
    lint = [c for c in local if c[0].endswith("ruff")]
    assert lint and lint == [c for c in remote if c[0].endswith("ruff")]
    tests = [c for c in local if c[0].endswith("pytest")]
    assert tests and tests == [c for c in remote if c[0].endswith("pytest")]
