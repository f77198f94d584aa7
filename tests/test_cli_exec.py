"""`lab exec NODE --id ID -- CMD` (issue 21): lab exec's --id works before or after NODE, the
words after `--` are the command's own, and an id that is no lab here says so. A real lab."""

from __future__ import annotations

import pytest

from .conftest import TOPOS, run_lab

pytestmark = pytest.mark.root


def _cgroups(stdout: str) -> set[str]:
    """The cgroup paths of the process that printed /proc/self/cgroup."""
    return {line.split(":", 2)[2] for line in stdout.splitlines() if line.count(":") >= 2}


def test_exec_option_order(lab_id):
    r = run_lab("up", TOPOS / "pi_pair.py", "--id", lab_id)
    assert r.returncode == 0, r.stderr
    mine = f"/lab/{lab_id}/client"
    for argv in (
        ("exec", "client", "--id", lab_id, "--", "cat", "/proc/self/cgroup"),
        ("exec", "--id", lab_id, "client", "--", "cat", "/proc/self/cgroup"),
        ("exec", "client", f"--id={lab_id}", "cat", "/proc/self/cgroup"),
    ):
        r = run_lab(*argv)
        assert r.returncode == 0, (argv, r.stderr)
        # the command ran in the node's cgroup of this lab: lab exec's own --id was used
        assert any(p.endswith(mine) for p in _cgroups(r.stdout)), (argv, r.stdout)
    # after `--` every word is the command's: `--id` is a program name here, not an option
    r = run_lab("exec", "client", "--id", lab_id, "--", "--id", "x")
    assert r.returncode != 0 and "--id" in r.stderr, r.stderr
    assert "no lab" not in r.stderr and "not an option" not in r.stderr
    # an id that is not a lab here, while a lab is up: named, not "no lab is up"
    for argv in (
        ("exec", "client", "--id", "ghost", "--", "true"),
        ("shell", "client", "--id", "ghost"),
        ("impair", "show", "--id", "ghost"),
    ):
        r = run_lab(*argv)
        assert r.returncode == 2, (argv, r.stderr)
        assert "no lab 'ghost'" in r.stderr and lab_id in r.stderr, (argv, r.stderr)
    # lab exec's options are --id only; anything else between NODE and `--` is a usage error
    r = run_lab("exec", "client", "-n", "--", "true")
    assert r.returncode == 2 and "'-n' is not an option of lab exec" in r.stderr, r.stderr
    assert "usage: lab exec" in r.stderr
    r = run_lab("exec", "--id", lab_id, "client", "--id", "other", "--", "true")
    assert r.returncode == 2 and "given twice" in r.stderr, r.stderr
    assert run_lab("down", "--id", lab_id).returncode == 0
