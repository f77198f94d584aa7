"""`lab run` with `adaptive = true` for real (root): repetitions stop once they agree (issue 17).

A test that measures the same figure every time (a real command on the client) converges
after the minimum of two repetitions; the later ones get their results lines, not a run.
"""

from __future__ import annotations

from typing import ClassVar

import pandas as pd
import pytest

from lab import measure
from lab.model.params import Param
from lab.measure.base import Primary, Test, invoke
from lab.measure.adaptive import ADAPTIVE_SCHEMA
from lab.campaign.load import load_plan
from lab.core.state import read_jsonl
from lab.campaign.runner import Runner
from lab.campaign.setup import create_run_dir

from .conftest import lab_traces

pytestmark = pytest.mark.root

PLAN = """
name = "adaptreps"
profiles = ["baseline"]
impairments = ["none"]
reps = 5
adaptive = true
[topology]
file = "topologies/pi_pair.py"
cpu = 0.5
[[tests]]
test = "steady"
"""


class SteadyTest(Test):
    """Echoes a constant through a real command on the client: every repetition agrees."""

    name = "steady"
    schema: ClassVar[dict[str, Param]] = {**ADAPTIVE_SCHEMA}
    primary = Primary("value", "units")

    def __init__(self):
        self.calls = 0

    def run(self, ctx, params):
        self.calls += 1
        inv = invoke(ctx, ctx.client, ["echo", "42"], label="steady", timeout=10)
        return [self.record(raw_files=inv.raw_files, value=float(inv.stdout))]


def test_repetitions_stop_when_they_agree(tmp_path, monkeypatch):
    steady = SteadyTest()
    monkeypatch.setitem(measure.TESTS, "steady", steady)
    path = tmp_path / "adaptreps.toml"
    path.write_text(PLAN)
    plan = load_plan(path)
    assert plan.tests[0].params["adaptive"] is True
    run = create_run_dir(plan, tmp_path / "run")
    counts = Runner(plan, run).execute()
    assert steady.calls == 2  # the two repetitions the rule needs, no more
    assert counts == {"ok": 2, "failed": 0, "skipped": 3}
    lines = {r["rep"]: r for r in read_jsonl(run.results)}
    assert sorted(lines) == [0, 1, 2, 3, 4]
    for rep in (2, 3, 4):
        info = lines[rep]["repetitions"]
        assert lines[rep]["ok"] and info["reason"] == "ci" and info["values"] == [42.0, 42.0]
        assert lines[rep]["records"][0]["stop_reason"] == "reps"
    from lab.results.rundir import write_tables

    table, summary = write_tables(run)
    df = pd.read_csv(run.file("results.csv"))
    assert list(df.stop_reason.fillna("")) == ["", "", "reps", "reps", "reps"]
    for lab_id in {e["lab_id"] for e in run.load_timeline() if e.get("lab_id")}:
        assert not lab_traces(lab_id), lab_traces(lab_id)
