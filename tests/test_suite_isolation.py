"""The suite never touches the labs a user has up: every test runs under the session's own
LAB_STATE_DIR and LAB_RUN_DIR (conftest.suite_state_roots), and `lab clean` run by the suite
leaves a lab recorded under another root alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from lab.core.state import run_root, state_root

from .conftest import DEFAULT_ROOTS, REPO, run_lab

ROOTS_OF_A_FRESH_PROCESS = (
    "from lab.core.state import run_root, state_root; print(state_root()); print(run_root())"
)


def _roots_seen_by_lab(env: dict) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", ROOTS_OF_A_FRESH_PROCESS],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        check=True,
    ).stdout
    return out.split()


def test_the_suite_runs_under_roots_of_its_own(suite_state_roots):
    # without the variables, lab's roots are the user's defaults ...
    bare = {k: v for k, v in os.environ.items() if k not in DEFAULT_ROOTS}
    assert _roots_seen_by_lab(bare) == [
        DEFAULT_ROOTS["LAB_STATE_DIR"],
        DEFAULT_ROOTS["LAB_RUN_DIR"],
    ]
    # ... and every process the suite starts sees the session's own instead, away from them
    seen = _roots_seen_by_lab(dict(os.environ))
    assert seen == [str(suite_state_roots["LAB_STATE_DIR"]), str(suite_state_roots["LAB_RUN_DIR"])]
    assert [str(state_root()), str(run_root())] == seen
    for path, default in zip(seen, DEFAULT_ROOTS.values(), strict=True):
        resolved, home = Path(path).resolve(), Path(default).resolve()
        assert resolved != home and home not in resolved.parents and resolved not in home.parents


def test_lab_clean_run_by_the_suite_leaves_a_users_lab(tmp_path):
    # "the user's" state root, standing for /var/lib/lab: one lab recorded there
    users = tmp_path / "users-state"
    lab = users / "uzzz1"
    lab.mkdir(parents=True)
    (lab / "ledger.jsonl").write_text("")
    (lab / "lab.json").write_text(json.dumps({"id": "uzzz1"}))
    # never run `lab clean` below on the user's real roots, whatever broke
    assert os.environ.get("LAB_STATE_DIR") not in (None, DEFAULT_ROOTS["LAB_STATE_DIR"])
    r = run_lab("clean")  # as test_lab_core and others run it: the suite's environment
    assert r.returncode == 0, r.stdout + r.stderr
    assert "uzzz1" not in r.stdout
    assert (lab / "ledger.jsonl").exists() and json.loads((lab / "lab.json").read_text())
    # the control: pointed at that root, `lab clean` does remove it (so the check above can fail)
    r = run_lab(
        "clean", env={"LAB_STATE_DIR": str(users), "LAB_RUN_DIR": str(tmp_path / "users-run")}
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "lab 'uzzz1': removed" in r.stdout
    assert not lab.exists()
