"""The impairment spec language: parsing, canonical words, JSON, merging, presets, sweeps."""

from __future__ import annotations

import json

import pytest

from lab.core.errors import ConfigError
from lab.model.impairment.words import PRESETS
from lab.model.impairment.presets import parse_placement, preset, study_a_sweeps, sweep
from lab.model.impairment.directional import DirectionalImpairment, parse_directional
from lab.model.impairment.loss import GELoss, RandomLoss, StateLoss
from lab.model.impairment.model import Impairment, parse_spec
from lab.model.impairment.linkopts import from_link_options

# --------------------------------------------------------------------------------------------
# Accepted specs
# --------------------------------------------------------------------------------------------

GOOD = [
    (
        "delay 40ms 5ms 25% distribution normal loss 0.5%",
        {
            "delay_us": 40000,
            "jitter_us": 5000,
            "delay_corr_pct": 25.0,
            "distribution": "normal",
            "loss": {"model": "random", "p_pct": 0.5, "corr_pct": 0.0},
        },
    ),
    ("loss random 1% 25%", {"loss": {"model": "random", "p_pct": 1.0, "corr_pct": 25.0}}),
    ("loss 1", {"loss": {"model": "random", "p_pct": 1.0, "corr_pct": 0.0}}),
    ("drop 2%", {"loss": {"model": "random", "p_pct": 2.0, "corr_pct": 0.0}}),
    (
        "loss state 1%",
        {"loss": {"model": "state", "p13": 1.0, "p31": 99.0, "p32": 0.0, "p23": 100.0, "p14": 0.0}},
    ),
    (
        "loss state 1 30 5 90 0.1",
        {"loss": {"model": "state", "p13": 1.0, "p31": 30.0, "p32": 5.0, "p23": 90.0, "p14": 0.1}},
    ),
    (
        "loss gemodel 1%",
        {"loss": {"model": "gemodel", "p": 1.0, "r": 99.0, "one_h": 100.0, "one_k": 0.0}},
    ),
    (
        "loss gemodel 1% 10% 70% 0.1%",
        {"loss": {"model": "gemodel", "p": 1.0, "r": 10.0, "one_h": 70.0, "one_k": 0.1}},
    ),
    ("duplicate 1%", {"duplicate_pct": 1.0}),
    ("duplicate 1% 10%", {"duplicate_pct": 1.0, "duplicate_corr_pct": 10.0}),
    ("corrupt 0.1%", {"corrupt_pct": 0.1}),
    ("corrupt 0.1 5", {"corrupt_pct": 0.1, "corrupt_corr_pct": 5.0}),
    ("delay 10ms reorder 25%", {"delay_us": 10000, "reorder_pct": 25.0}),
    (
        "delay 10ms reorder 25% 50% gap 5",
        {"delay_us": 10000, "reorder_pct": 25.0, "reorder_corr_pct": 50.0, "reorder_gap": 5},
    ),
    ("delay 10ms reorder 25% gap 1", {"delay_us": 10000, "reorder_pct": 25.0}),
    ("gap 5 delay 10ms reorder 1%", {"delay_us": 10000, "reorder_pct": 1.0, "reorder_gap": 5}),
    ("rate 100mbit", {"rate_bps": 100_000_000}),
    ("rate 100mbit 14", {"rate_bps": 100_000_000, "rate_packet_overhead": 14}),
    ("rate 100Mbit packetoverhead -14", {"rate_bps": 100_000_000, "rate_packet_overhead": -14}),
    ("rate 1gbit", {"rate_bps": 1_000_000_000}),
    ("rate 12.5mbps", {"rate_bps": 100_000_000}),  # bps = bytes/s, as tc
    ("rate 1kibit", {"rate_bps": 1024}),
    ("rate 64000", {"rate_bps": 64000}),  # bare number = bit/s (tc(8))
    ("rate 250kbps", {"rate_bps": 2_000_000}),
    ("limit 50", {"limit": 50}),
    ("limit 1000", {"limit": 1000}),  # explicit: the lab's default differs (docs/impairment.md)
    ("seed 12345", {"seed": 12345}),
    ("delay 1s", {"delay_us": 1_000_000}),
    ("delay 1.5sec", {"delay_us": 1_500_000}),
    ("delay 250us", {"delay_us": 250}),
    ("delay 250usec", {"delay_us": 250}),
    ("delay 20msec", {"delay_us": 20000}),
    ("delay 20MS", {"delay_us": 20000}),  # units are case-insensitive in tc
    ("delay 2000ns", {"delay_us": 2}),
    ("latency 20ms", {"delay_us": 20000}),
    ("delay 0", {}),
    ("delay 0ms", {}),
    ("delay 10ms 20ms", {"delay_us": 10000, "jitter_us": 20000}),  # jitter > delay: allowed
    ("delay 20ms 5ms distribution uniform", {"delay_us": 20000, "jitter_us": 5000}),
    (
        "delay 20ms 5ms distribution paretonormal",
        {"delay_us": 20000, "jitter_us": 5000, "distribution": "paretonormal"},
    ),
    ("loss 0%", {}),
    ("", {}),
    ("none", {}),
    ("clear", {}),
    ("netem delay 5ms", {"delay_us": 5000}),
    (
        "  delay   5ms \n loss  1% ",
        {"delay_us": 5000, "loss": {"model": "random", "p_pct": 1.0, "corr_pct": 0.0}},
    ),
]


@pytest.mark.parametrize(("text", "expected"), GOOD, ids=[g[0] or "empty" for g in GOOD])
def test_parse_to_json(text, expected):
    imp = parse_spec(text)
    assert imp.to_json() == expected
    # canonical words parse back to the same object, and JSON round-trips
    assert parse_spec(str(imp)) == imp
    assert parse_spec(" ".join(imp.to_netem_words())) == imp
    assert Impairment.from_json(json.loads(json.dumps(imp.to_json()))) == imp


def test_canonical_words():
    imp = parse_spec("loss 0.5% delay 40ms 5ms 25% distribution normal rate 12.5mbps limit 500")
    assert imp.to_netem_words() == [
        "delay", "40ms", "5ms", "25%", "distribution", "normal",
        "loss", "0.5%", "rate", "100mbit", "limit", "500",
    ]  # fmt: skip
    assert str(parse_spec("delay 1500us")) == "delay 1.5ms"
    assert str(parse_spec("delay 1us")) == "delay 0.001ms"
    assert str(parse_spec("rate 1500kbit 14")) == "rate 1500kbit 14"
    assert str(parse_spec("rate 1001bit")) == "rate 1001bit"
    assert str(Impairment()) == "none"
    assert Impairment().to_netem_words() == []
    assert str(parse_spec("loss gemodel 1")) == "loss gemodel 1% 99% 100% 0%"


def test_jitter_without_delay_keeps_delay_word():
    imp = parse_spec("delay 0ms 5ms")
    assert imp.delay_us is None and imp.jitter_us == 5000
    assert imp.to_netem_words() == ["delay", "0ms", "5ms"]
    assert parse_spec(str(imp)) == imp


def test_warnings():
    assert "exceeds delay" in parse_spec("delay 10ms 20ms").warnings()[0]
    assert parse_spec("network1").warnings() == []
    assert any("rate" in w for w in parse_spec("delay 10ms 2ms rate 1mbit").warnings())


def test_is_empty():
    assert parse_spec("none").is_empty()
    assert parse_spec("delay 0ms loss 0%").is_empty()
    assert not parse_spec("limit 10").is_empty()


def test_loss_objects():
    assert parse_spec("loss 1% 2%").loss == RandomLoss(1.0, 2.0)
    assert parse_spec("loss state 5").loss == StateLoss(5.0, 95.0)
    assert parse_spec("loss gemodel 5 20").loss == GELoss(5.0, 20.0)


# --------------------------------------------------------------------------------------------
# Rejected specs: message names the field and the accepted range/values
# --------------------------------------------------------------------------------------------

BAD = [
    # (spec, field, fragments that must appear in the message)
    ("loss 120%", "loss", ["loss must be 0..100 %, got 120"]),
    ("loss -1%", "loss", ["loss must be 0..100 %", "-1"]),
    ("loss 1% 101%", "loss correlation", ["loss correlation", "0..100 %", "101"]),
    ("loss abc", "loss", ["loss model must be one of random, state, gemodel", "'abc'"]),
    ("loss random x", "loss", ["loss must be a percentage 0..100 %", "'x'"]),
    ("loss", "loss", ["loss needs", "loss {[random] PERCENT"]),
    ("loss gemodel", "loss gemodel p", ["loss gemodel needs P", "0..100"]),
    ("loss gemodel x", "loss gemodel p", ["loss gemodel needs P", "0..100"]),
    ("loss gemodel 1% 200%", "loss gemodel r", ["loss gemodel r must be 0..100 %", "200"]),
    ("loss gemodel 1 2 3 150", "loss gemodel 1-k", ["loss gemodel 1-k", "0..100 %", "150"]),
    ("loss state", "loss state p13", ["loss state needs P13", "0..100"]),
    ("loss state 1 2 3 4 500", "loss state p14", ["loss state p14", "0..100 %", "500"]),
    ("loss 1% loss 2%", "loss", ["loss given twice"]),
    ("delay -5ms", "delay", ["delay must be 0..60 s", "-5ms"]),
    ("delay 10ms -5ms", "jitter", ["jitter must be 0..60 s", "-5ms"]),
    ("delay 40", "delay", ["delay needs a unit", "ms", "usec", "got 40"]),
    ("delay 40xs", "delay", ["unknown time unit 'xs'", "valid units: s, sec, secs, ms"]),
    ("delay fast", "delay", ["delay must be a time 0..60 s", "units:"]),
    ("delay 61s", "delay", ["delay must be 0..60 s", "61s"]),
    ("delay 0.5us", "delay", ["whole number of microseconds", "0.5us"]),
    ("delay", "delay", ["delay needs a TIME", "delay TIME [JITTER [CORRELATION]]"]),
    ("delay 10ms 5ms 150%", "delay correlation", ["delay correlation must be 0..100 %", "150"]),
    ("delay 10ms delay 20ms", "delay", ["delay given twice"]),
    ("delay 10ms latency 20ms", "delay", ["delay given twice"]),
    ("delay 10ms 5ms 25% 7", "delay", ["unexpected value '7'", "delay TIME [JITTER"]),
    ("loss 1% 2% 3%", "loss", ["unexpected value '3%'", "loss {"]),
    ("delay 10ms 5ms distribution gauss", "distribution",
     ["distribution must be one of uniform, normal, pareto, paretonormal", "'gauss'"]),
    ("delay 10ms distribution normal", "distribution", ["distribution needs a jitter"]),
    ("distribution normal", "distribution", ["distribution needs a jitter"]),
    ("reorder 25%", "reorder", ["reorder needs a delay", "delay 10ms"]),
    ("delay 10ms reorder 25% 120", "reorder correlation", ["reorder correlation", "0..100 %"]),
    ("delay 10ms gap 5", "gap", ["gap needs reorder"]),
    ("delay 10ms reorder 5% gap 0", "gap", ["gap must be 1..4294967295 packets", "got 0"]),
    ("delay 10ms reorder 5% gap x", "gap", ["gap must be a whole number 1..4294967295"]),
    ("duplicate 101", "duplicate", ["duplicate must be 0..100 %, got 101"]),
    ("duplicate 1% 200%", "duplicate correlation", ["duplicate correlation", "0..100 %"]),
    ("duplicate", "duplicate", ["duplicate needs a PERCENT", "duplicate PERCENT [CORRELATION]"]),
    ("corrupt 1%%", "corrupt", ["corrupt must be a percentage 0..100 %", "'1%%'"]),
    ("corrupt 0.1% 300", "corrupt correlation", ["corrupt correlation", "0..100 %"]),
    ("rate 0", "rate", ["rate must be > 0", "100mbit"]),
    ("rate 0mbit", "rate", ["rate must be > 0"]),
    ("rate 100mbits", "rate", ["unknown rate unit 'mbits'", "valid units: bit, kibit, kbit"]),
    ("rate fast", "rate", ["rate must be a rate > 0", "units:"]),
    ("rate 10%", "rate", ["percentage of the device speed is not supported", "100mbit"]),
    ("rate 1mbit 14 53", "rate", ["cell size is not supported"]),
    ("rate 1mbit 99999", "rate packetoverhead", ["-65535..65535 bytes", "99999"]),
    ("packetoverhead 14", "packetoverhead", ["must follow a rate"]),
    ("limit 0", "limit", ["limit must be 1..4294967295 packets, got 0"]),
    ("limit 1k", "limit", ["limit must be a whole number 1..4294967295 packets", "'1k'"]),
    ("limit -5", "limit", ["limit must be 1..4294967295 packets", "-5"]),
    ("seed -1", "seed", ["seed must be 0..18446744073709551615", "-1"]),
    ("slot 10ms", "slot", ["slot is not supported", "supported keywords: delay"]),
    ("loss 1% ecn", "ecn", ["ecn is not supported", "supported keywords"]),
    ("jitter 5ms", "jitter", ["second value of delay", "supported keywords"]),
    ("bogus 5", "keyword", ["unknown keyword 'bogus'", "valid keywords: delay, distribution",
                            "presets: network1"]),
    ("delay 5ms network1", "preset", ["preset 'network1' must come first"]),
    ("network1 network2", "preset", ["must come first", "only one preset"]),
    ("Delay 5ms", "keyword", ["unknown keyword 'Delay'", "valid keywords"]),
]  # fmt: skip


@pytest.mark.parametrize(("text", "field", "fragments"), BAD, ids=[b[0] for b in BAD])
def test_rejected(text, field, fragments):
    with pytest.raises(ConfigError) as ei:
        parse_spec(text, source="plan.toml")
    err = ei.value
    assert err.field == field
    assert err.source == "plan.toml"
    msg = str(err)
    assert msg.startswith(f"plan.toml: {field}: ")
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"


def test_at_least_thirty_malformed_specs():
    assert len(BAD) >= 30


# --------------------------------------------------------------------------------------------
# JSON form
# --------------------------------------------------------------------------------------------


def test_json_matches_spec_doc_fields():
    imp = parse_spec(
        "delay 40ms 5ms 25% distribution normal loss 0.5% duplicate 1% 2% corrupt 0.1% 3% "
        "reorder 4% 5% gap 6 rate 100mbit 14 limit 500 seed 12345"
    )
    assert imp.to_json() == {
        "delay_us": 40000,
        "jitter_us": 5000,
        "delay_corr_pct": 25.0,
        "distribution": "normal",
        "loss": {"model": "random", "p_pct": 0.5, "corr_pct": 0.0},
        "duplicate_pct": 1.0,
        "duplicate_corr_pct": 2.0,
        "corrupt_pct": 0.1,
        "corrupt_corr_pct": 3.0,
        "reorder_pct": 4.0,
        "reorder_corr_pct": 5.0,
        "reorder_gap": 6,
        "rate_bps": 100_000_000,
        "rate_packet_overhead": 14,
        "limit": 500,
        "seed": 12345,
    }
    assert Impairment.from_json(imp.to_json()) == imp


def test_from_json_fills_netem_defaults():
    imp = Impairment.from_json({"loss": {"model": "gemodel", "p": 2}})
    assert imp.loss == GELoss(2.0, 98.0, 100.0, 0.0)
    imp = Impairment.from_json({"loss": {"model": "state", "p13": 2}})
    assert imp.loss == StateLoss(2.0, 98.0, 0.0, 100.0, 0.0)


@pytest.mark.parametrize(
    ("data", "fragments"),
    [
        ({"delay": 5}, ["unknown field(s) delay", "valid fields: delay_us"]),
        ({"delay_us": -1}, ["delay must be 0..60000000", "-1"]),
        ({"delay_us": "5ms"}, ["delay must be a whole number"]),
        ({"loss": {"model": "bursty"}}, ["loss model must be one of random, state, gemodel"]),
        ({"loss": {"model": "random"}}, ["random loss needs p_pct"]),
        ({"loss": {"model": "random", "p_pct": 150}}, ["loss.p_pct must be 0..100 %"]),
        ({"loss": {"model": "random", "p_pct": 1, "x": 1}}, ["unknown random loss field(s) x"]),
        ({"distribution": "gauss", "jitter_us": 1}, ["distribution must be one of uniform"]),
        ({"rate_bps": 0}, ["rate must be 1..18446744073709551615 bit/s"]),
        ({"reorder_pct": 5}, ["reorder needs a delay"]),
        ({"reorder_gap": 5}, ["gap needs reorder"]),
        ({"rate_packet_overhead": 5}, ["packetoverhead needs a rate"]),
        ({"duplicate_pct": True}, ["duplicate must be a number 0..100 %"]),
    ],
)
def test_from_json_rejects(data, fragments):
    with pytest.raises(ConfigError) as ei:
        Impairment.from_json(data, source="spec.json")
    for frag in fragments:
        assert frag in str(ei.value)


def test_frozen_and_hashable():
    imp = parse_spec("network1")
    with pytest.raises(AttributeError):
        imp.delay_us = 5  # type: ignore[misc]
    assert len({imp, parse_spec(str(imp))}) == 1


# --------------------------------------------------------------------------------------------
# Merging: setting one parameter keeps the others
# --------------------------------------------------------------------------------------------


def test_merge_changes_only_what_is_written():
    base = parse_spec("delay 40ms 5ms 25% distribution normal loss 0.5% rate 10mbit 14")
    assert str(parse_spec("delay 50ms", base=base)) == (
        "delay 50ms 5ms 25% distribution normal loss 0.5% rate 10mbit 14"
    )
    assert str(parse_spec("delay 50ms 0ms", base=base)) == "delay 50ms loss 0.5% rate 10mbit 14"
    assert str(parse_spec("loss 2%", base=base)) == (
        "delay 40ms 5ms 25% distribution normal loss 2% rate 10mbit 14"
    )
    assert str(parse_spec("rate 20mbit", base=base)) == (
        "delay 40ms 5ms 25% distribution normal loss 0.5% rate 20mbit 14"
    )
    assert str(parse_spec("distribution pareto", base=base)).startswith(
        "delay 40ms 5ms 25% distribution pareto"
    )
    assert parse_spec("loss 0%", base=base).loss is None
    assert parse_spec("clear", base=base).is_empty()
    assert parse_spec("network2", base=base) == preset("network2")
    assert (
        str(parse_spec("network2 loss 3%", base=base))
        == "delay 80ms 10ms distribution normal loss 3%"
    )


def test_merge_loss_model_replaced_as_a_whole():
    base = parse_spec("loss 1% 25%")
    assert parse_spec("loss 2%", base=base).loss == RandomLoss(2.0, 0.0)
    assert parse_spec("loss gemodel 1", base=base).loss == GELoss(1.0, 99.0)


def test_merge_with_impairment_object():
    base = parse_spec("network1")
    other = parse_spec("loss 2% duplicate 1%")
    merged = base.merge(other)
    assert str(merged) == "delay 40ms 5ms distribution normal loss 2% duplicate 1%"


def test_merge_reorder_keeps_gap_and_zero_drops_it():
    base = parse_spec("delay 10ms reorder 25% gap 5")
    assert parse_spec("reorder 30%", base=base).reorder_gap == 5
    dropped = parse_spec("reorder 0%", base=base)
    assert dropped.reorder_pct is None and dropped.reorder_gap is None


def test_merge_validates_result():
    with pytest.raises(ConfigError, match="reorder needs a delay"):
        parse_spec("delay 0ms", base=parse_spec("delay 10ms reorder 5%"))


def test_parse_spec_base_keyword():
    base = parse_spec("delay 20ms 2ms")
    assert parse_spec("distribution normal", base=base).distribution == "normal"


# --------------------------------------------------------------------------------------------
# Presets
# --------------------------------------------------------------------------------------------


def test_presets():
    assert str(preset("network1")) == "delay 40ms 5ms distribution normal loss 0.5%"
    assert str(preset("network2")) == "delay 80ms 10ms distribution normal loss 1%"
    assert str(preset("network3")) == "delay 120ms 15ms distribution normal loss 1.5%"
    assert str(preset("voip-delay")) == "delay 400ms"
    assert str(preset("lossy")) == "loss 1%"
    assert preset("none").is_empty() and preset("clear").is_empty()
    for name in PRESETS:
        assert parse_spec(name) == preset(name)
    assert str(parse_spec("network1 loss 2%")) == "delay 40ms 5ms distribution normal loss 2%"
    assert str(parse_spec("none delay 5ms")) == "delay 5ms"
    with pytest.raises(ConfigError, match="unknown preset 'network9'; presets: network1"):
        preset("network9")


def test_placements():
    assert parse_placement("ingress") == "ingress"
    with pytest.raises(ConfigError, match="placement must be one of egress, ingress, middlebox"):
        parse_placement("sideways")


# --------------------------------------------------------------------------------------------
# Mininet TCLink options
# --------------------------------------------------------------------------------------------


def test_from_link_options():
    imp = from_link_options({"delay": "40ms", "jitter": "5ms", "loss": 0.5, "bw": 10})
    assert str(imp) == "delay 40ms 5ms loss 0.5%"
    assert str(from_link_options({"loss": 1})) == "loss 1%"
    assert str(from_link_options({"loss": "2%"})) == "loss 2%"
    assert from_link_options({}).is_empty()
    imp = from_link_options({"delay": "10ms", "impair": "reorder 5% duplicate 1%"})
    assert str(imp) == "delay 10ms duplicate 1% reorder 5%"


@pytest.mark.parametrize(
    ("opts", "field", "fragment"),
    [
        ({"loss": 120}, "loss", "loss must be 0..100 %, got 120"),
        ({"loss": "much"}, "loss", "loss must be a percentage 0..100 %"),
        ({"loss": True}, "loss", "loss must be a percentage 0..100 %"),
        ({"delay": 40}, "delay", "delay needs a unit"),
        ({"delay": ["40ms"]}, "delay", "delay must be a time such as '40ms'"),
        ({"jitter": "5ms"}, "jitter", "jitter needs delay"),
        ({"delay": "10ms", "jitter": "-1ms"}, "jitter", "jitter must be 0..60 s"),
        ({"impair": 5}, "impair", "impair must be a string"),
        ({"delay": "5ms", "impair": "delay 6ms"}, "delay", "delay given twice"),
    ],
)
def test_from_link_options_rejects(opts, field, fragment):
    with pytest.raises(ConfigError) as ei:
        from_link_options(opts, source="topologies/x.py: link h1-r1")
    assert ei.value.field == field
    assert fragment in str(ei.value)


# --------------------------------------------------------------------------------------------
# Directional specs
# --------------------------------------------------------------------------------------------


def test_directional_symmetric_by_default():
    d = parse_directional("delay 10ms loss 1%")
    assert d.is_symmetric()
    assert d.a2b == d.b2a == parse_spec("delay 10ms loss 1%")
    assert str(d) == "delay 10ms loss 1%"


def test_directional_asymmetric():
    d = parse_directional("a2b: delay 10ms; b2a: delay 30ms loss 1%")
    assert str(d.a2b) == "delay 10ms"
    assert str(d.b2a) == "delay 30ms loss 1%"
    assert not d.is_symmetric()
    assert str(d) == "a2b: delay 10ms; b2a: delay 30ms loss 1%"
    assert parse_directional(str(d)) == d
    assert DirectionalImpairment.from_json(d.to_json()) == d


def test_directional_common_part_then_overrides():
    d = parse_directional("delay 20ms 2ms; b2a: loss 1%")
    assert str(d.a2b) == "delay 20ms 2ms"
    assert str(d.b2a) == "delay 20ms 2ms loss 1%"
    d2 = parse_directional("b2a: delay 5ms; both: network1")
    assert str(d2.a2b) == "delay 40ms 5ms distribution normal loss 0.5%"
    assert str(d2.b2a) == "delay 5ms 5ms distribution normal loss 0.5%"


def test_directional_node_names_and_merge():
    d = parse_directional("client->server: delay 10ms", a="client", b="server")
    assert str(d.a2b) == "delay 10ms" and d.b2a.is_empty()
    d = parse_directional("b2a: loss 1%", base=d)
    assert str(d.b2a) == "loss 1%" and str(d.a2b) == "delay 10ms"
    assert parse_directional("clear", base=d).is_empty()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("up: delay 5ms", "unknown direction 'up'; valid: both, a2b, b2a"),
        ("a2b: delay 5ms; a2b: loss 1%", "direction a2b given twice"),
        ("delay 5ms; loss 1%", "direction both given twice"),
        ("a2b: loss 200%", "loss must be 0..100 %, got 200"),
    ],
)
def test_directional_rejects(text, fragment):
    with pytest.raises(ConfigError) as ei:
        parse_directional(text)
    assert fragment in str(ei.value)


# --------------------------------------------------------------------------------------------
# Sweeps
# --------------------------------------------------------------------------------------------


def test_study_a_sweeps():
    s = study_a_sweeps()
    assert list(s) == ["delay", "jitter", "loss", "network"]
    delay = s["delay"]
    assert [p.value for p in delay] == [float(v) for v in range(0, 101, 10)]
    assert [p.impairment.delay_us for p in delay] == [None] + [v * 1000 for v in range(10, 101, 10)]
    assert delay[0].impairment.is_empty() and delay[4].name == "delay-40ms"
    jitter = s["jitter"]
    assert len(jitter) == 11
    assert all(p.impairment.delay_us == 20000 for p in jitter)
    assert str(jitter[0].impairment) == "delay 20ms"
    assert str(jitter[5].impairment) == "delay 20ms 5ms distribution normal"
    assert jitter[10].impairment.jitter_us == 10000
    loss = s["loss"]
    assert [p.value for p in loss] == [i / 2 for i in range(11)]
    assert loss[1].name == "loss-0.5pct" and str(loss[1].impairment) == "loss 0.5%"
    assert str(loss[10].impairment) == "loss 5%"
    assert [p.name for p in s["network"]] == ["network1", "network2", "network3"]
    assert s["network"][2].impairment == preset("network3")


def test_sweep_helper():
    pts = sweep("delay", 0, 100, 10, base=parse_spec("loss 1%"))
    assert len(pts) == 11
    assert str(pts[3].impairment) == "delay 30ms loss 1%"
    pts = sweep("loss", 0, 1, 0.1)
    assert len(pts) == 11 and pts[3].impairment.loss == RandomLoss(0.3)  # no float drift
    pts = sweep("rate", 0, 20, 10, base="delay 5ms")
    assert [str(p.impairment) for p in pts] == [
        "delay 5ms",
        "delay 5ms rate 10mbit",
        "delay 5ms rate 20mbit",
    ]
    pts = sweep("reorder", 0, 50, 25, base="delay 10ms reorder 1% gap 3")
    assert [p.impairment.reorder_gap for p in pts] == [None, 3, 3]


@pytest.mark.parametrize(
    ("args", "kwargs", "fragment"),
    [
        (("speed", 0, 1, 1), {}, "sweep parameter must be one of delay, jitter, loss"),
        (("delay", 0, 10, 0), {}, "step > 0"),
        (("delay", 10, 0, 1), {}, "stop >= start"),
        (("jitter", 0, 10, 1), {}, "jitter sweep needs a base with a delay"),
        (("loss", 0, 200, 50), {}, "loss must be 0..100 %"),
    ],
)
def test_sweep_rejects(args, kwargs, fragment):
    with pytest.raises(ConfigError) as ei:
        sweep(*args, **kwargs)
    assert fragment in str(ei.value)
