"""lab.model.params: the one parameter schema of VPN profiles, tests and topology options.

The callers' own tests pin their messages (test_measure_validate, test_vpn_profiles,
test_topology); these pin the rules every caller shares.
"""

from __future__ import annotations

import pytest

from lab.core.errors import ConfigError
from lab.model.params import Param, validate

SCHEMA = {
    "rate": Param(float, 1.0, "Mbit/s", min=0.001),
    "port": Param(int, 5201, min=1, max=65535),
    "mode": Param(str, "a", choices=("a", "b")),
    "cpu": Param(int, None, optional=True),
    "name": Param(str, "x", check=lambda v: None if v.isidentifier() else "not a name"),
    "on": Param(bool, False),
}


def _err(given: dict) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        validate(SCHEMA, given, source="f.toml", owner="test 't'", field_prefix="p.")
    return e.value


def test_defaults_filled_and_an_int_for_a_float_becomes_a_float():
    out = validate(SCHEMA, {"rate": 5}, source="f.toml")
    assert out == {"rate": 5.0, "port": 5201, "mode": "a", "cpu": None, "name": "x", "on": False}
    assert isinstance(out["rate"], float)


@pytest.mark.parametrize(
    ("given", "field", "text"),
    [
        ({"rate": float("nan")}, "p.rate", "got nan (test 't'); accepted: float >= 0.001"),
        ({"rate": 10**400}, "p.rate", "accepted: float >= 0.001"),  # no float holds it
        ({"rate": True}, "p.rate", "got True (test 't')"),  # a bool is not a number
        ({"port": 0}, "p.port", "got 0 (test 't'); accepted: int >= 1 and <= 65535"),
        ({"port": 80.0}, "p.port", "got float 80.0"),  # no silent float -> int
        ({"mode": "c"}, "p.mode", "accepted: one of 'a', 'b'"),
        ({"name": "a b"}, "p.name", "not a name (test 't')"),
        ({"on": 1}, "p.on", "got int 1 (test 't'); accepted: bool"),
        ({"port": None}, "p.port", "missing value"),
        ({"zz": 1, "aa": 2}, "p.aa", "unknown parameter for test 't'; accepted: cpu, mode, name"),
    ],
)
def test_bad_values_name_field_and_accepted(given, field, text):
    e = _err(given)
    assert e.source == "f.toml" and e.field == field
    assert text in str(e)


def test_not_a_mapping():
    with pytest.raises(ConfigError, match="parameters for x must be a table/mapping, got list"):
        validate(SCHEMA, [1], source="f", owner="x")


def test_from_text():
    assert SCHEMA["port"].from_text("80") == 80
    assert SCHEMA["rate"].from_text("2.5") == 2.5
    assert SCHEMA["on"].from_text("yes") is True and SCHEMA["on"].from_text("0") is False
    for p, raw in ((SCHEMA["port"], "1.5"), (SCHEMA["on"], "maybe"), (SCHEMA["port"], "x")):
        with pytest.raises(ValueError):
            p.from_text(raw)


def test_accepted_words():
    assert SCHEMA["cpu"].accepted() == "int or null"
    assert Param(float, None, min=0, max=100, unit="%").accepted() == "float >= 0 and <= 100 %"
    assert Param(dict, None, accepts="a dict with keys ip, ip6").accepted().startswith("a dict")
