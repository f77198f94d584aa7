"""The lab's CPU weight (lab.core.cgroups.weigh_lab, docs/cpu.md "The lab's CPU weight"): a lab
whose hosts are all capped gets WEIGHT_FACTOR times the default weight, the shared parent only
while every lab under it has it, on both hierarchies' files (fake trees), and a real lab's groups
carry it in the host's own hierarchy (root)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.core import cgroups

from tests.conftest import TOPOS, run_lab


def _tree(tmp_path: Path, version: int, labs: dict[str, str]) -> cgroups.CgroupLayout:
    """A parent `lab` with one child group per entry of `labs` (name -> weight file text), as
    the kernel leaves them: each with the hierarchy's default weight unless given."""
    root = tmp_path / f"cg{version}"
    base = root if version == 2 else root / "cpu"
    name = "cpu.weight" if version == 2 else "cpu.shares"
    default = "100\n" if version == 2 else "1024\n"
    (base / "lab").mkdir(parents=True)
    (base / "lab" / name).write_text(default)
    for lab, text in labs.items():
        (base / "lab" / lab).mkdir()
        (base / "lab" / lab / name).write_text(text or default)
    return cgroups.CgroupLayout(version, root)


@pytest.mark.parametrize(
    "version,file,high", [(1, "cpu.shares", "102400"), (2, "cpu.weight", "10000")]
)
def test_a_capped_lab_alone_weighs_itself_and_the_parent(tmp_path, version, file, high):
    layout = _tree(tmp_path, version, {"l1": ""})
    rec = cgroups.weigh_lab(layout, "lab", "lab/l1", capped=True)
    base = cgroups.cpu_dir(layout, "lab")
    assert (base / "l1" / file).read_text() == high
    assert (base / file).read_text() == high
    assert rec == {"file": file, "lab": 100, "parent": 100, "held_back_by": []}
    assert cgroups.weight(layout, "lab/l1") == 100


@pytest.mark.parametrize("version", [1, 2])
def test_an_uncapped_lab_keeps_the_default_and_holds_the_parent_back(tmp_path, version):
    layout = _tree(tmp_path, version, {"l1": "", "l2": ""})
    cgroups.weigh_lab(layout, "lab", "lab/l1", capped=True)
    rec = cgroups.weigh_lab(layout, "lab", "lab/l2", capped=False)
    assert cgroups.weight(layout, "lab/l2") == 1
    assert cgroups.weight(layout, "lab") == 1
    assert rec["held_back_by"] == ["l2"]
    # a capped lab built beside it does not lift the parent while the uncapped one is there
    (cgroups.cpu_dir(layout, "lab") / "l3").mkdir()
    cgroups.set_weight(layout, "lab/l3", 1)  # as the kernel makes it: the default
    rec = cgroups.weigh_lab(layout, "lab", "lab/l3", capped=True)
    assert cgroups.weight(layout, "lab/l3") == 100
    assert (rec["parent"], rec["held_back_by"]) == (1, ["l2"])


def test_a_group_made_elsewhere_without_the_weight_holds_the_parent_back(tmp_path):
    """Any group under the parent at the default (an older lab, a calibration of an older
    version) counts as unweighted: the parent is raised only when all are weighted."""
    layout = _tree(tmp_path, 1, {"old": "", "l1": ""})
    assert cgroups.weigh_lab(layout, "lab", "lab/l1", capped=True)["parent"] == 1
    cgroups.set_weight(layout, "lab/old", cgroups.WEIGHT_FACTOR)
    assert cgroups.weigh_lab(layout, "lab", "lab/l1", capped=True)["parent"] == 100


@pytest.mark.root
def test_a_pi4_lab_is_weighted_and_a_host_speed_lab_holds_the_parent(lab_id):
    """Two real labs in the host's own hierarchy: the capped one (pi4 hosts) gets the factor and
    lab.json says so; while a host-speed lab (cpu=host) exists beside it, the parent is back at
    the default and that lab names itself as what holds it back."""
    from lab.core.teardown import teardown
    from lab.substrate.local.lab import Lab

    other = lab_id[:-1] + "w"
    try:
        up = run_lab("up", TOPOS / "pi_pair.py", "-p", "cpu=pi4", "--id", lab_id)
        assert up.returncode == 0, up.stderr
        rec = Lab.open(lab_id).info["cpu_weight"]
        layout = cgroups.probe()
        assert rec["lab"] == cgroups.WEIGHT_FACTOR
        assert cgroups.weight(layout, f"lab/{lab_id}") == cgroups.WEIGHT_FACTOR
        assert cgroups.weight(layout, "lab") == rec["parent"]
        up = run_lab("up", TOPOS / "pi_pair.py", "-p", "cpu=host", "--id", other)
        assert up.returncode == 0, up.stderr
        prec = Lab.open(other).info["cpu_weight"]
        assert prec["lab"] == 1 and other in prec["held_back_by"]
        assert cgroups.weight(layout, f"lab/{other}") == 1
        assert cgroups.weight(layout, "lab") == 1
        st = run_lab("status", "--id", lab_id)  # the parent as it is now, lowered by `other`
        assert "CPU weight against the host's other work: x100 (its parent x1" in st.stdout
        assert f"held at x1 by {other}" in run_lab("status", "--id", other).stdout
    finally:
        assert teardown(other) == []
