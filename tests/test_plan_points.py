"""A test entry's `points`: the impairment points it runs at (study A's UDP rate sweep runs
without impairment only). Cases, digests, shards' plan.json and bad input; no root, < 1 s."""

from __future__ import annotations

import json
import textwrap

import pytest

from lab.core.errors import ConfigError
from lab.campaign.load import load_plan
from lab.campaign.shard import plan_from_json

PLAN = """
name = "pts"
profiles = ["baseline", "wireguard"]
impairments = ["none", "network1", {{sweep = "delay", from = 0, to = 20, step = 10}}]
reps = 3
impaired_reps = 1
[topology]
file = "topologies/pi_pair.py"
cpu = "pi4"
[[tests]]
test = "ping"
count = 5
[[tests]]
test = "udp-sweep"
start_mbit = 1
stop_mbit = 2
step_mbit = 1
reps = 1
{points}
"""


def plan_at(tmp_path, points: str, overrides=()):
    p = tmp_path / "plan.toml"
    p.write_text(textwrap.dedent(PLAN.format(points=points)))
    return load_plan(p, list(overrides))


def test_points_restrict_the_test_to_those_points(tmp_path):
    plan = plan_at(tmp_path, 'points = ["none"]')
    sweeps = [c for c in plan.cases() if c.test.label == "udp-sweep"]
    # one repetition (reps = 1) at 'none' per profile, nowhere else
    assert [(c.profile, c.point.name, c.rep) for c in sweeps] == [
        ("baseline", "none", 0),
        ("wireguard", "none", 0),
    ]
    # the other test keeps every point: 2 profiles x (3 reps at none + 1 at each of 4 points)
    assert sum(c.test.label == "ping" for c in plan.cases()) == 2 * (3 + 4)
    assert plan.to_json()["tests"][1]["points"] == ["none"]


def test_points_change_the_digest_and_absent_points_do_not_appear(tmp_path):
    with_pts = plan_at(tmp_path, 'points = ["none", "network1"]')
    without = plan_at(tmp_path, "")
    assert "points" not in without.to_json()["tests"][1]  # older plans keep their digest
    assert with_pts.digest() != without.digest()
    assert len(without.cases()) - len(with_pts.cases()) == 2 * 3  # delay-0/10/20ms per profile


def test_a_shards_plan_json_keeps_points(tmp_path):
    plan = plan_at(tmp_path, 'points = ["network1"]')
    stored = json.loads(json.dumps({**plan.to_json(), "digest": plan.digest()}))
    back = plan_from_json(stored, source="plan.json")
    assert back.tests[1].points == ("network1",)
    assert back.digest() == plan.digest()
    assert [c.key for c in back.cases()] == [c.key for c in plan.cases()]


@pytest.mark.parametrize(
    "points, says",
    [
        ('points = "none"', "got 'none'"),
        ("points = []", "got []"),
        ('points = ["none", "network9"]', "no impairment point 'network9'"),
    ],
)
def test_bad_points_name_file_field_and_accepted(tmp_path, points, says):
    with pytest.raises(ConfigError) as e:
        plan_at(tmp_path, points)
    msg = str(e.value)
    assert "plan.toml" in msg and "tests[1].points" in msg and says in msg
    assert "delay-0ms, delay-10ms, delay-20ms, network1, none" in msg


def test_override_of_impairments_keeps_the_points_that_remain(tmp_path):
    plan = plan_at(tmp_path, 'points = ["none"]', ["impairments=network1"])
    assert {c.test.label for c in plan.cases()} == {"ping"}  # the sweep's point is gone
    plan = plan_at(tmp_path, 'points = ["none"]', ["impairments=none,network2"])
    assert sum(c.test.label == "udp-sweep" for c in plan.cases()) == 2
    with pytest.raises(ConfigError, match="no impairment point 'nope'"):
        plan_at(tmp_path, 'points = ["nope"]', ["impairments=none"])
