"""Issue 32, item 14: one key vocabulary in plans, every problem of a file reported at once,
the nearest accepted name suggested, and a profile typo named by the plan field it came from.

The vocabulary: names carry their unit, as every test parameter does (`duration_s`,
`rate_mbit`, `interval_s`) and as the plan's `timeout_s` did; the plan's `duration` became
`duration_s` and is still read under its old name, with a one-line note. No root: nothing runs.
"""

from __future__ import annotations

import textwrap

import pytest

from lab.campaign.load import load_plan
from lab.cli.main import main
from lab.core.errors import ConfigError, ConfigErrors

BASE = """
name = "keys"
profiles = ["baseline"]
{top}
[topology]
file = "topologies/pi_pair.py"
[[tests]]
test = "tcp"
{tcp}
[[tests]]
test = "udp"
{udp}
"""


def plan(tmp_path, top="", tcp="", udp="", name="p.toml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(BASE.format(top=top, tcp=tcp, udp=udp)))
    return p


def problems(path, overrides=None) -> tuple[str, list[ConfigError]]:
    with pytest.raises(ConfigError) as e:
        load_plan(str(path), overrides)
    errs = e.value.errors if isinstance(e.value, ConfigErrors) else [e.value]
    return str(e.value), errs


# ------------------------------------------------------------------ one vocabulary


def test_duration_s_at_plan_level_reaches_every_test(tmp_path):
    p = load_plan(str(plan(tmp_path, top="duration_s = 3")))
    assert [t.params["duration_s"] for t in p.tests] == [3.0, 3.0]
    assert p.notices == []


def test_the_old_duration_is_read_with_a_one_line_note(tmp_path):
    new = load_plan(str(plan(tmp_path, top="duration_s = 3", name="new.toml")))
    old = load_plan(str(plan(tmp_path, top="duration = 3", name="old.toml")))
    assert old.digest() == new.digest()  # the same plan
    assert len(old.notices) == 1 and "'duration' is now 'duration_s'" in old.notices[0]
    assert "\n" not in old.notices[0]


def test_both_names_at_once_is_an_error(tmp_path):
    msg, errs = problems(plan(tmp_path, top="duration = 3\nduration_s = 4"))
    assert errs[0].field == "duration" and "give duration_s only" in msg


def test_override_takes_the_same_name_and_the_old_one(tmp_path):
    p = plan(tmp_path, top="duration_s = 9", tcp="duration_s = 8")
    new = load_plan(str(p), ["duration_s=2"])
    assert [t.params["duration_s"] for t in new.tests] == [2.0, 2.0] and not new.notices
    old = load_plan(str(p), ["duration=2"])
    assert old.digest() == new.digest() and "-o duration_s" in old.notices[0]
    with pytest.raises(ConfigError, match=r"did you mean 'duration_s'"):
        load_plan(str(p), ["durration_s=2"])


def test_lab_run_prints_the_note_on_stderr(tmp_path, monkeypatch, capsys):
    import lab.cli.runs as runs

    def stop(**kw):  # where the lab would be chosen: after the plan loaded, before anything
        raise ConfigError("stopped here by the test")

    monkeypatch.setattr(runs, "select", stop)
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(plan(tmp_path, top="duration = 3"))]) == 2
    err = capsys.readouterr().err
    assert "lab: note:" in err and "'duration' is now 'duration_s'" in err
    assert "stopped here by the test" in err


# ------------------------------------------------------------------ every error at once


def test_three_errors_in_one_file_are_reported_together(tmp_path, monkeypatch, capsys):
    p = plan(tmp_path, top='reps = 0\nplacement = "middelbox"', tcp="duration = 5")
    msg, errs = problems(p)
    fields = [e.field for e in errs]
    assert fields == ["placement", "reps", "duration"], msg
    assert msg.startswith(f"{p}: 3 problems:")
    assert "accepted: an integer 1..10000" in msg  # each with its accepted values
    assert "did you mean 'middlebox'?" in msg
    # through the command: exit 2, all three on stderr, nothing created
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LAB_RUN_DIR", raising=False)
    assert main(["run", str(p)]) == 2
    err = capsys.readouterr().err
    assert "3 problems" in err and "placement" in err and "reps" in err and "duration" in err
    assert not (tmp_path / "runs").exists()


def test_errors_in_several_tests_and_profiles_each_name_their_field(tmp_path):
    p = tmp_path / "many.toml"
    p.write_text(
        textwrap.dedent(
            """
            profiles = ["wireguardd", "wireguard:mtuu=1400"]
            [topology]
            file = "topologies/pi_pair.py"
            [[tests]]
            test = "tpc"
            [[tests]]
            test = "udp"
            rate = 10
            duration = 3
            """
        )
    )
    msg, errs = problems(p)
    assert len(errs) == 5, msg
    by_field = {(e.source, e.field): str(e) for e in errs}
    assert "did you mean 'wireguard'" in by_field[(f"{p}: profiles[0]", None)]
    assert "did you mean 'mtu'" in by_field[(f"{p}: profiles[1]", "params.mtuu")]
    assert "did you mean 'tcp'" in by_field[(str(p), "tests[0].test")]
    assert "did you mean 'rate_mbit'" in by_field[(f"{p}: tests[1] (udp)", "rate")]
    assert "did you mean 'duration_s'" in by_field[(f"{p}: tests[1] (udp)", "duration")]


# ------------------------------------------------------------------ a profile typo in a plan


def test_a_profile_typo_in_a_plan_is_the_plans_field_not_vpn(tmp_path):
    p = tmp_path / "typo.toml"
    p.write_text(BASE.format(top="", tcp="", udp="").replace('"baseline"', '"wiregard"'))
    msg, errs = problems(p)
    assert len(errs) == 1
    assert msg.startswith(f"{p}: profiles[0]: unknown VPN profile 'wiregard'"), msg
    assert "--vpn" not in msg
    assert "did you mean 'wireguard'?" in msg


# ------------------------------------------------------------------ near misses


@pytest.mark.parametrize(
    "top,tcp,field,near",
    [
        ("durration = 3", "", "durration", "duration_s"),  # a top-level key
        ("", 'test = "tpc"', None, "tcp"),  # a test kind (replaces test = "tcp")
        ("", "streamz = 2", "streamz", "streams"),  # a test parameter
        ("[defaults]\nduration = 2", "", "defaults.duration", "duration_s"),  # a default
    ],
)
def test_near_misses_get_a_suggestion(tmp_path, top, tcp, field, near):
    text = BASE.format(top="", tcp="", udp="")
    if tcp.startswith("test ="):
        text = text.replace('test = "tcp"', tcp, 1)
    elif tcp:
        text = text.replace('test = "tcp"', f'test = "tcp"\n{tcp}', 1)
    if top.startswith("[defaults]"):
        text += "\n" + top
    elif top:
        text = top + "\n" + text
    p = tmp_path / "near.toml"
    p.write_text(text)
    msg, errs = problems(p)
    assert f"did you mean '{near}'" in msg, msg
    if field:
        assert field in [e.field for e in errs]


def test_a_far_miss_gets_no_suggestion(tmp_path):
    msg, _ = problems(plan(tmp_path, tcp="xyzzy = 1"))
    assert "did you mean" not in msg and "accepted: " in msg
