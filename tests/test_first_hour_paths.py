"""Issue 32, item 10: one rule for the files a user names, whatever the current directory.

Paths are relative to the current directory (a plan's own paths to the plan's folder first),
then to the installation; a bare name is looked up in the installation's topologies/, plans/,
vpn_profiles/; nothing found lists the places tried and the shipped names. Results go under
./runs of the current directory, or $LAB_RUN_DIR. Every test runs from a fresh temporary folder
that is not the checkout. No root: nothing is built.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lab import REPO
from lab.campaign.check import new_run_path
from lab.campaign.load import find_plan, load_plan
from lab.campaign.setup import create_run_dir, resume_plan
from lab.cli.main import main
from lab.core.errors import ConfigError
from lab.core.paths import locate, results_root
from lab.results.rundir import RunDir
from lab.model.topology import find_topology, load_topology
from lab.vpn.profiles import find_profile, load_profile

PLAN = """
name = "mine"
profiles = ["baseline"]
[topology]
file = "{topology}"
[[tests]]
test = "ping"
count = 2
"""


@pytest.fixture
def elsewhere(tmp_path, monkeypatch) -> Path:
    """A current directory that is not the checkout, with no $LAB_RUN_DIR."""
    cwd = tmp_path / "work"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("LAB_RUN_DIR", raising=False)
    monkeypatch.delenv("LAB_VPN_PROFILES", raising=False)
    return cwd


# ------------------------------------------------------------------ installation paths


@pytest.mark.parametrize(
    "kind,text,shipped",
    [
        ("topology", "topologies/pi_pair_middlebox.py", "topologies/pi_pair_middlebox.py"),
        ("plan", "plans/quick.toml", "plans/quick.toml"),
        ("profile", "vpn_profiles/wireguard.toml", "vpn_profiles/wireguard.toml"),
    ],
)
def test_an_installation_path_typed_in_another_folder_finds_the_shipped_file(
    elsewhere, kind, text, shipped
):
    assert not (elsewhere / text).exists()
    assert locate(kind, text) == REPO / shipped


def test_each_kinds_finder_follows_the_rule(elsewhere):
    assert find_topology("topologies/pi_pair_middlebox.py") == (
        REPO / "topologies/pi_pair_middlebox.py"
    )
    assert find_plan("plans/quick.toml") == REPO / "plans/quick.toml"
    assert find_profile("vpn_profiles/wireguard.toml") == REPO / "vpn_profiles/wireguard.toml"
    # and by name, with or without the suffix
    assert find_topology("pi_pair") == REPO / "topologies/pi_pair.py"
    assert find_plan("quick") == find_plan("quick.toml") == REPO / "plans/quick.toml"
    assert find_profile("wireguard") == REPO / "vpn_profiles/wireguard.toml"
    assert load_plan("plans/quick.toml").name == "quick"
    assert load_profile("vpn_profiles/wireguard.toml").driver_name == "wireguard"
    assert load_topology("topologies/pi_pair.py").nodes


def test_a_bare_name_is_never_a_folder_of_the_current_directory(elsewhere):
    (elsewhere / "quick").mkdir()
    (elsewhere / "pi_pair").mkdir()
    assert find_plan("quick") == REPO / "plans/quick.toml"
    assert find_topology("pi_pair") == REPO / "topologies/pi_pair.py"


# ------------------------------------------------------------------ the user's own files


def test_own_files_relative_to_the_current_directory_win(elsewhere):
    own = elsewhere / "topologies" / "pi_pair.py"
    own.parent.mkdir()
    own.write_text((REPO / "topologies/pi_pair.py").read_text())
    assert find_topology("topologies/pi_pair.py") == Path("topologies/pi_pair.py")
    (elsewhere / "team").mkdir()
    (elsewhere / "team/wg.toml").write_text((REPO / "vpn_profiles/wireguard.toml").read_text())
    assert load_profile("team/wg.toml").path == Path("team/wg.toml")
    (elsewhere / "my.toml").write_text(PLAN.format(topology="topologies/pi_pair.py"))
    assert load_plan("my.toml").name == "mine"


def test_a_plans_topology_is_relative_to_the_plan_and_runs_from_any_folder(elsewhere, tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "t.py").write_text((REPO / "topologies/pi_pair.py").read_text())
    (proj / "p.toml").write_text(PLAN.format(topology="t.py"))
    plan = load_plan(str(proj / "p.toml"))
    # stored absolute: the lab is built from it (REPO / topology_file) wherever the run goes on
    assert Path(plan.topology_file) == proj / "t.py"
    assert (REPO / plan.topology_file).is_file()
    # a shipped topology keeps its installation path: plans' digests stay those of old runs
    (proj / "q.toml").write_text(PLAN.format(topology="topologies/pi_pair.py"))
    assert load_plan(str(proj / "q.toml")).topology_file == "topologies/pi_pair.py"


# ------------------------------------------------------------------ nothing found


@pytest.mark.parametrize(
    "kind,text,near,names",
    [
        ("topology", "topologies/pi_pair_midlebox.py", "pi_pair_middlebox", "site_to_site"),
        ("plan", "quik", "quick", "study_a"),
        ("profile", "wiregard", "wireguard", "ipsec-modern"),
    ],
)
def test_nothing_found_lists_places_tried_shipped_names_and_the_nearest(
    elsewhere, kind, text, near, names
):
    with pytest.raises(ConfigError) as e:
        locate(kind, text, field="F")
    msg = str(e.value)
    assert f"did you mean '{near}'" in msg
    assert names in msg  # the shipped names
    folder = {"topology": "topologies", "plan": "plans", "profile": "vpn_profiles"}[kind]
    assert str(REPO / folder) in msg
    if "/" in text:  # both places: here and the installation
        assert f"looked for {text}, {REPO / text}" in msg


def test_a_profile_typo_on_the_command_line_names_vpn(elsewhere):
    with pytest.raises(ConfigError) as e:
        load_profile("wiregard")
    assert str(e.value).startswith("--vpn: unknown VPN profile 'wiregard' (did you mean")


# ------------------------------------------------------------------ the commands


def test_render_and_up_take_an_installation_path_from_another_folder(
    elsewhere, monkeypatch, capsys
):
    assert main(["render", "topologies/pi_pair.py", "--vpn", "baseline"]) == 0
    import lab.cli.labs as labs

    seen = {}

    class Fake:  # the substrate: what it was asked to build, and nothing built
        def bring_up(self, spec, request):
            seen["file"] = request.topology_file
            seen["nodes"] = set(spec.nodes)
            raise ConfigError("stopped here by the test")

    monkeypatch.setattr(labs, "select", lambda **kw: Fake())
    assert main(["up", "topologies/pi_pair_middlebox.py", "--id", "h2paths"]) == 2
    assert "stopped here by the test" in capsys.readouterr().err
    # the VM substrate copies this file into its guest: the resolved one, not the text typed
    assert seen["file"] == str(REPO / "topologies/pi_pair_middlebox.py")
    assert "router" in seen["nodes"]
    assert main(["up", "topologies/nosuch.py", "--id", "h2paths"]) == 2
    err = capsys.readouterr().err
    assert "topology file not found: 'topologies/nosuch.py'" in err
    assert "pi_pair_middlebox" in err


# ------------------------------------------------------------------ results


def test_results_go_under_runs_of_the_current_directory(elsewhere):
    plan = load_plan("quick")
    assert results_root() == elsewhere / "runs"
    run = create_run_dir(plan)
    assert run.path.parent == elsewhere / "runs" and run.path.is_dir()
    assert new_run_path(plan).parent == elsewhere / "runs"


def test_lab_run_dir_moves_the_results(elsewhere, tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_RUN_DIR", "elsewhere-runs")  # relative: made absolute once
    root = results_root()
    assert root == elsewhere / "elsewhere-runs" and root.is_absolute()
    run = create_run_dir(load_plan("quick"))
    assert run.path.parent == root
    assert not (elsewhere / "runs").exists()


def test_a_run_of_a_plan_in_one_folder_resumes_from_another(elsewhere, tmp_path, monkeypatch):
    (elsewhere / "my.toml").write_text(PLAN.format(topology="topologies/pi_pair.py"))
    plan = load_plan("my.toml")  # typed relative to the folder the run starts in
    run = create_run_dir(plan)
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.chdir(other)
    assert resume_plan(RunDir(run.path), None, []).digest() == plan.digest()
