"""Parameter validation and the test registry: bad input is rejected with source, field and
accepted values, before anything runs."""

from __future__ import annotations

import pytest

from lab.core.errors import ConfigError
from lab.measure import TESTS, get_test
from lab.measure.udp import UdpSweepTest

SRC = "plans/study-a.toml: tests[2]"


def test_unknown_test_lists_valid_names():
    with pytest.raises(ConfigError) as e:
        get_test("iperf", source="plans/x.toml")
    msg = str(e.value)
    assert msg.startswith("plans/x.toml: test: unknown test 'iperf'")
    for name in TESTS:
        assert name in msg


@pytest.mark.parametrize("name", sorted(set(TESTS) - {"contention"}))
def test_defaults_validate(name):
    params = TESTS[name].validate({}, source=SRC)
    assert set(params) == set(TESTS[name].schema)


def test_defaults_match_the_studies():
    assert TESTS["ping"].validate({}, source=SRC)["count"] == 500
    assert TESTS["scp"].validate({}, source=SRC)["size_mb"] == 256
    sweep = TESTS["udp-sweep"].validate({}, source=SRC)
    rates = UdpSweepTest.rates(sweep)
    assert rates[0] == 25 and rates[-1] == 400 and len(rates) == 16
    assert sweep["size"] == 1300


def test_unknown_key_names_source_field_and_accepted():
    with pytest.raises(ConfigError) as e:
        TESTS["tcp"].validate({"duraton_s": 5}, source=SRC)
    assert e.value.source == SRC and e.value.field == "duraton_s"
    assert (
        "accepted: adaptive, adaptive_min_s, adaptive_rel_pct, bidir, direction, duration_s, "
        "mss, omit_s, port, streams" in str(e.value)
    )


@pytest.mark.parametrize(
    ("test", "params", "field", "accepted"),
    [
        ("tcp", {"direction": "in"}, "direction", "'client-to-server', 'server-to-client'"),
        ("tcp", {"streams": 0}, "streams", "int >= 1 and <= 128"),
        ("tcp", {"mss": 40}, "mss", ">= 88"),
        ("tcp", {"duration_s": "60"}, "duration_s", "float"),
        ("tcp", {"streams": True}, "streams", "int"),
        ("udp", {"rate_mbit": -1}, "rate_mbit", ">= 0.001"),
        ("udp", {"size": 70000}, "size", "<= 65507"),
        ("tcp", {"bidir": "yes"}, "bidir", "bool"),
        ("udp", {"bidir": 1}, "bidir", "bool"),
        ("udp", {"streams": 0}, "streams", "int >= 1 and <= 128"),
        # iperf3 refuses -R with --bidir; adaptive length reads one receiver's series
        ("tcp", {"bidir": True, "direction": "server-to-client"}, "direction", "bidir = false"),
        ("udp", {"bidir": True, "direction": "server-to-client"}, "direction", "direction unset"),
        ("tcp", {"bidir": True, "adaptive": True}, "adaptive", "adaptive = false on this test"),
        ("udp", {"bidir": True, "adaptive": True}, "adaptive", "adaptive = false on this test"),
        ("ping", {"interval_s": 0.0001}, "interval_s", ">= 0.002"),
        ("ping", {"family": 5}, "family", "4, 6"),
        ("mtu", {"addr6": "198.18.0.2"}, "addr6", "not an IPv6 address literal"),
        ("rr", {"proto": "sctp"}, "proto", "'tcp', 'udp'"),
        ("rr", {"request": 0}, "request", ">= 1"),
        ("scp", {"protocol": "rsync"}, "protocol", "'default', 'scp', 'sftp'"),
        ("udp-sweep", {"rates_mbit": []}, "rates_mbit", "empty list"),
        ("udp-sweep", {"rates_mbit": [10, "x"]}, "rates_mbit", "number > 0"),
        ("contention", {"test": "tcp", "node": "router"}, "node", "'client', 'server'"),
    ],
)
def test_impossible_values(test, params, field, accepted):
    with pytest.raises(ConfigError) as e:
        TESTS[test].validate(params, source=SRC)
    assert e.value.field == field
    assert e.value.source == SRC
    assert accepted in str(e.value)


def test_int_accepted_for_float_and_none_for_optional():
    p = TESTS["tcp"].validate({"duration_s": 60, "mss": None}, source=SRC)
    assert p["duration_s"] == 60.0 and isinstance(p["duration_s"], float)
    assert p["mss"] is None


def test_sweep_stop_below_start():
    with pytest.raises(ConfigError) as e:
        TESTS["udp-sweep"].validate({"start_mbit": 100, "stop_mbit": 50}, source=SRC)
    assert e.value.field == "stop_mbit"


def test_sweep_rates_range_and_explicit():
    t = TESTS["udp-sweep"]
    assert UdpSweepTest.rates(
        t.validate({"start_mbit": 1, "stop_mbit": 2, "step_mbit": 0.25}, source=SRC)
    ) == [1, 1.25, 1.5, 1.75, 2]
    assert UdpSweepTest.rates(t.validate({"rates_mbit": [5, 50]}, source=SRC)) == [5.0, 50.0]


def test_contention_validates_the_wrapped_test():
    c = TESTS["contention"]
    p = c.validate({"test": "rr", "params": {"proto": "udp"}, "workers": 2}, source=SRC)
    assert p["params"]["proto"] == "udp" and p["params"]["request"] == 1
    with pytest.raises(ConfigError) as e:
        c.validate({"test": "rr", "params": {"proto": "x"}}, source=SRC)
    assert e.value.source == f"{SRC}: params" and e.value.field == "proto"
    with pytest.raises(ConfigError, match="unknown test 'nope'"):
        c.validate({"test": "nope"}, source=SRC)
    with pytest.raises(ConfigError, match="cannot wrap itself"):
        c.validate({"test": "contention"}, source=SRC)
    with pytest.raises(ConfigError) as e:
        c.validate({}, source=SRC)
    assert e.value.field == "test"


def test_params_must_be_a_mapping():
    with pytest.raises(ConfigError, match="must be a table/mapping, got list"):
        TESTS["ping"].validate([500], source=SRC)
