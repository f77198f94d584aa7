"""A real `--bidir` TCP test through a lab (root): both directions carry traffic at once, each
with the streams it was asked for, and become one row each in results.csv.
No figure of the host's speed is asserted: only that each direction moved bytes."""

from __future__ import annotations

import shutil
import textwrap

import pytest

from lab.campaign.load import load_plan
from lab.campaign.runner import Runner
from lab.campaign.setup import create_run_dir
from lab.core.state import read_jsonl
from lab.results.rundir import read_results_csv, write_tables

from .conftest import lab_traces

pytestmark = pytest.mark.root

PLAN = """
name = "bidir"
profiles = ["baseline"]
impairments = ["none"]
reps = 1
[topology]
file = "topologies/pi_pair.py"
cpu = 0.5
[[tests]]
test = "tcp"
name = "tcp-bidir"
bidir = true
streams = 2
duration_s = 2
"""


def test_tcp_bidir_two_streams_each_way(tmp_path):
    if shutil.which("iperf3") is None:
        pytest.skip("iperf3 is not installed")
    path = tmp_path / "bidir.toml"
    path.write_text(textwrap.dedent(PLAN))
    plan = load_plan(path)
    run = create_run_dir(plan, tmp_path / "run")
    counts = Runner(plan, run).execute()
    [line] = read_jsonl(run.results)
    assert counts == {"ok": 1, "failed": 0, "skipped": 0}, line.get("error")
    fwd, rev = line["records"]
    assert (fwd["direction"], rev["direction"]) == ("client-to-server", "server-to-client")
    for rec in (fwd, rev):
        assert rec["ok"] and rec["bidir"] is True
        assert rec["receiver_bps"] > 0 and rec["receiver_bytes"] > 0
        assert rec["streams"] == 2 and len(rec["per_stream"]) == 2
        assert all(s["receiver_bytes"] > 0 for s in rec["per_stream"])
    # four distinct connections: two each way, none counted in both directions
    sockets = [s["socket"] for r in (fwd, rev) for s in r["per_stream"]]
    assert len(set(sockets)) == 4

    # results.csv as `lab run` writes it (the report's tables: tests/test_measure_bidir.py;
    # drawing the plots would triple this test's time)
    write_tables(run)
    df = read_results_csv(run.file("results.csv"))
    assert list(df.direction) == ["client-to-server", "server-to-client"]
    assert list(df.point) == [0, 1] and list(df.streams) == [2, 2]
    assert (df.throughput_bps > 0).all()
    for lab_id in {e["lab_id"] for e in run.load_timeline() if e.get("lab_id")}:
        assert not lab_traces(lab_id), lab_traces(lab_id)
