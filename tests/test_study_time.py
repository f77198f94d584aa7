"""bench/study_time.py: re-measured runs replace what they re-measured; a lab's once-written
scp payload is counted once per lab, not in every case."""

from __future__ import annotations

from pathlib import Path

from bench.study_time import extrapolate, prepared_s
from lab.campaign.load import load_plan

REPO = Path(__file__).resolve().parent.parent
PLAN = """
name = "t"
profiles = ["baseline", "wireguard"]
impairments = ["none", {sweep = "loss", from = 1, to = 2, step = 1}]
reps = 1
[topology]
file = "topologies/pi_pair.py"
[[tests]]
test = "ping"
count = 10
interval_s = 0.2
[[tests]]
test = "scp"
size_mb = 8
"""


class Run:
    def __init__(self, lines: list[dict]):
        self.lines = lines

    def load_results(self) -> list[dict]:
        return self.lines

    def load_timeline(self) -> list[dict]:
        return []


def line(label: str, point: str, seconds: float, prepare: float | None = None) -> dict:
    imp = {"name": point, "group": "none" if point == "none" else "loss"}
    if point != "none":
        imp["spec"] = point
    rec = {"payload": {"reused": prepare is None, "prepare_s": prepare}} if label == "scp" else {}
    return {"label": label, "impairment": imp, "seconds": seconds, "records": [rec]}


def test_replacing_runs_take_over_what_they_remeasured_and_payloads_count_once(tmp_path):
    (tmp_path / "t.toml").write_text(PLAN.replace("topologies/", f"{REPO}/topologies/"))
    plan = load_plan(tmp_path / "t.toml")
    old = Run([line("scp", "loss 1%", 100.0), line("ping", "loss 1%", 12.0),
               line("scp", "none", 30.0), line("ping", "none", 10.0)])  # fmt: skip
    new = Run([line("scp", "loss 2%", 54.0, prepare=14.0), line("scp", "loss 1%", 30.0)])
    assert prepared_s(new.lines[0]) == 14.0 and prepared_s(old.lines[0]) == 0.0

    rows = {(r["label"], r["group"]): r for r in extrapolate([old], plan)["rows"]}
    assert rows[("scp", "loss")]["mean_s"] == 100.0

    x = extrapolate([old], plan, replace=[new])
    rows = {(r["label"], r["group"]): r for r in x["rows"]}
    # the loss group's scp cases are the new run's, the payload's 14 s taken out of the case
    assert rows[("scp", "loss")]["mean_s"] == 35.0 and rows[("scp", "loss")]["sampled"] == 2
    # what the new run did not re-measure stays the old run's
    assert rows[("ping", "loss")]["mean_s"] == 12.0 and rows[("scp", "none")]["mean_s"] == 30.0
    # the payload once per lab: 2 profiles x 2 labs (clean, impaired), one scp size
    assert x["labs"] == 4 and x["parts"]["payloads"] == 14.0 * 4
