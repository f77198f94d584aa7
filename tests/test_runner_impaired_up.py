"""`lab run` brings a tunnel up and checks it is ready before a plan point's impairment is put in
place (issue 21): a `loss 100%` point used to fail the bring-up itself (the readiness ping could
not pass), so the case read "lab up ... failed" instead of what it measured, 100 % loss."""

from __future__ import annotations

import pytest

from lab.core.state import read_jsonl

from .conftest import run_lab

pytestmark = pytest.mark.root

PLAN = """
name = "blackhole"
profiles = ["wireguard"]
impairments = ["loss 100%"]
reps = 1
[topology]
file = "topologies/pi_pair.py"
cpu = "host"
[[tests]]
test = "ping"
count = 3
interval_s = 0.2
reply_timeout_s = 1
"""


def test_a_blackhole_point_measures_its_loss_instead_of_failing_bring_up(tmp_path):
    path = tmp_path / "plan.toml"
    path.write_text(PLAN)
    out = tmp_path / "run"
    cp = run_lab("run", path, "--out", out, timeout=180)
    entries = [e for e in read_jsonl(out / "results.jsonl") if e.get("test") == "ping"]
    assert len(entries) == 1, cp.stdout + cp.stderr
    e = entries[0]
    # the tunnel came up, then the point dropped every echo: a measured 100 % loss
    assert "lab up" not in (e.get("error") or ""), e.get("error")
    rec = e["records"][0]
    assert rec["transmitted"] == 3 and rec["received"] == 0 and rec["loss_pct"] == 100.0, rec
    assert e["error"] == "no echo reply (3 sent)"
    applied = e["impairment_applied"]["applied"]
    assert applied and all("loss 100%" in str(v) for v in applied.values()), applied
