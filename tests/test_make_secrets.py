"""lab.vpn.base.make_secrets: the key files a tool writes (nebula-cert, openssl) kept 0600 in the
lab's secrets directory under the driver's prefix, nothing else of the scratch directory kept.
No root, no tool: `make` writes the files itself."""

from __future__ import annotations

import os
import stat

import pytest

from lab.vpn.base import make_secrets


def test_named_files_kept_0600_under_the_prefix_the_rest_dropped(tmp_path):
    d = tmp_path / "secrets"
    seen = {}

    def make(t):
        seen["umask"] = os.umask(0o022)
        os.umask(seen["umask"])
        (t / "ca.key").write_text("KEY\n")
        (t / "ca.crt").write_text("CRT\n")
        (t / "tool.cnf").write_text("not a secret\n")

    before = os.umask(0o022)
    os.umask(before)
    made = make_secrets(d, "x-", ["ca.key", "ca.crt"], make)
    assert seen["umask"] == 0o077 and os.umask(before) == before  # restored after
    assert made == {"ca.key": "KEY\n", "ca.crt": "CRT\n"}
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert sorted(f.name for f in d.iterdir()) == ["x-ca.crt", "x-ca.key"]
    for f in d.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f


def test_a_failing_tool_leaves_no_file_and_the_umask_as_it_was(tmp_path):
    d = tmp_path / "secrets"

    def make(t):
        (t / "ca.key").write_text("half\n")
        raise RuntimeError("tool failed")

    before = os.umask(0o022)
    os.umask(before)
    with pytest.raises(RuntimeError):
        make_secrets(d, "x-", ["ca.key"], make)
    assert os.umask(before) == before
    assert list(d.iterdir()) == []
