"""Every shipped plan names the machine it models (issue 20): a `Machine:` note and a CPU
profile for the topology; the studies that ran on PCs (C, D) use the x86 `host` profile."""

from __future__ import annotations

import pytest

from lab.model.cpuprofile import known_profiles
from lab.campaign.load import load_plan

from .conftest import REPO

PLANS = sorted((REPO / "plans").glob("*.toml"))


@pytest.mark.parametrize("path", PLANS, ids=[p.stem for p in PLANS])
def test_plan_states_its_machine(path):
    plan = load_plan(path)
    machine = [n for n in plan.notes if n.startswith("Machine: ")]
    assert len(machine) == 1, f"{path.name}: one note starting 'Machine: '"
    cpu = plan.topology_params.get("cpu")
    assert cpu in known_profiles(), f"{path.name}: topology.cpu names a CPU profile"


@pytest.mark.parametrize("name", ["study_c", "study_d"])
def test_pc_studies_use_the_x86_host_profile(name):
    plan = load_plan(REPO / "plans" / f"{name}.toml")
    assert plan.topology_params["cpu"] == "host"
    assert "No documented 'pc' profile" in " ".join(plan.notes)
