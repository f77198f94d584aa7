"""The kernel netem backend: exact tc argument lists and reading `tc -j qdisc show` back.

This host has no sch_netem, so these are unit tests; the full-kernel VM runs them for real.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from lab.core.errors import PreconditionError
from lab.impair.kernel import (
    Probe,
    apply_argvs,
    clear_argv,
    differences,
    ifb_create_argvs,
    ifb_ingress_argvs,
    ifb_remove_argvs,
    netem_argv,
    parse_tc_qdisc_show,
    parse_tc_qdisc_show_json,
    parse_tc_version,
    probe_netem,
    show_argv,
)
from lab.model.impairment.presets import preset
from lab.model.impairment.loss import GELoss, StateLoss
from lab.model.impairment.model import Impairment, parse_spec

DATA = Path(__file__).parent / "data"


def golden(name: str) -> str:
    return (DATA / name).read_text()


# --------------------------------------------------------------------------------------------
# argv
# --------------------------------------------------------------------------------------------


def test_netem_argv_network1():
    assert netem_argv("lab1-h1-eth0", preset("network1")) == [
        "tc", "qdisc", "replace", "dev", "lab1-h1-eth0", "root", "netem",
        "delay", "40ms", "5ms", "distribution", "normal", "loss", "0.5%",
    ]  # fmt: skip


def test_netem_argv_everything():
    imp = parse_spec(
        "delay 1.5ms 0.5ms 10% loss gemodel 1% 10% 70% 0.1% duplicate 1% 25% corrupt 0.1% "
        "reorder 25% 50% gap 5 rate 12.5mbps 14 limit 500 seed 7"
    )
    assert netem_argv("eth0", imp, handle="1:", parent="root") == [
        "tc", "qdisc", "replace", "dev", "eth0", "root", "handle", "1:", "netem",
        "delay", "1.5ms", "0.5ms", "10%",
        "loss", "gemodel", "1%", "10%", "70%", "0.1%",
        "duplicate", "1%", "25%", "corrupt", "0.1%", "reorder", "25%", "50%", "gap", "5",
        "rate", "100mbit", "14", "limit", "500", "seed", "7",
    ]  # fmt: skip


def test_netem_argv_parent_and_verb():
    imp = parse_spec("loss 1%")
    assert netem_argv("eth0", imp, parent="1:1", handle="10:", verb="add") == [
        "tc", "qdisc", "add", "dev", "eth0", "parent", "1:1", "handle", "10:", "netem",
        "loss", "1%",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="verb"):
        netem_argv("eth0", imp, verb="delete")


def test_netem_argv_empty_is_passthrough():
    assert netem_argv("eth0", Impairment()) == ["tc", "qdisc", "replace", "dev", "eth0", "root",
                                               "netem"]  # fmt: skip


def test_netem_argv_words_always_carry_units():
    # a bare number means microseconds to iproute2 < 6.9 and nanoseconds to >= 6.9
    argv = netem_argv("eth0", parse_spec("delay 250us 1us"))
    assert argv[-3:] == ["delay", "0.25ms", "0.001ms"]


def test_netem_argv_no_distribution_without_jitter():
    # tc refuses 'distribution' without jitter (the jitter-0 point of study A's jitter sweep)
    argv = netem_argv("eth0", Impairment(delay_us=20000, distribution="normal"))
    assert "distribution" not in argv


def test_seed_needs_new_tc():
    imp = parse_spec("loss 1% seed 5")
    with pytest.raises(PreconditionError, match=r"iproute2 >= 6\.6\.0.*6\.1\.0"):
        netem_argv("eth0", imp, tc_version=(6, 1, 0))
    assert netem_argv("eth0", imp, tc_version=(6, 6, 0))[-2:] == ["seed", "5"]
    assert netem_argv("eth0", parse_spec("loss 1%"), tc_version=(5, 10, 0))[-2:] == ["loss", "1%"]


def test_clear_and_show_argv():
    assert clear_argv("eth0") == ["tc", "qdisc", "del", "dev", "eth0", "root"]
    assert clear_argv("eth0", parent="1:1") == ["tc", "qdisc", "del", "dev", "eth0", "parent",
                                                "1:1"]  # fmt: skip
    assert show_argv("eth0") == ["tc", "-j", "qdisc", "show", "dev", "eth0"]
    assert show_argv() == ["tc", "-j", "qdisc", "show"]


def test_ifb_argvs():
    assert ifb_create_argvs("lab1-ifb0") == [
        ["ip", "link", "add", "lab1-ifb0", "type", "ifb"],
        ["ip", "link", "set", "lab1-ifb0", "up"],
    ]
    assert ifb_ingress_argvs("eth0", "lab1-ifb0") == [
        ["tc", "qdisc", "add", "dev", "eth0", "handle", "ffff:", "ingress"],
        ["tc", "filter", "add", "dev", "eth0", "parent", "ffff:", "protocol", "all", "prio", "1",
         "u32", "match", "u32", "0", "0",
         "action", "mirred", "egress", "redirect", "dev", "lab1-ifb0"],
    ]  # fmt: skip
    assert "matchall" in ifb_ingress_argvs("eth0", "ifb0", classifier="matchall")[1]
    with pytest.raises(ValueError, match="classifier must be one of u32, matchall"):
        ifb_ingress_argvs("eth0", "ifb0", classifier="flower")
    assert ifb_remove_argvs("eth0", "ifb0") == [
        ["tc", "qdisc", "del", "dev", "eth0", "handle", "ffff:", "ingress"],
        ["ip", "link", "del", "ifb0"],
    ]


def test_apply_argvs():
    imp = parse_spec("delay 10ms")
    assert apply_argvs("eth0", imp) == [netem_argv("eth0", imp)]
    ingress = apply_argvs("eth0", imp, placement="ingress", ifb="ifb0")
    assert ingress == [
        *ifb_create_argvs("ifb0"),
        *ifb_ingress_argvs("eth0", "ifb0"),
        netem_argv("ifb0", imp),
    ]
    with pytest.raises(ValueError, match="ifb"):
        apply_argvs("eth0", imp, placement="ingress")
    with pytest.raises(ValueError, match="placement"):
        apply_argvs("eth0", imp, placement="middlebox")


# --------------------------------------------------------------------------------------------
# Reading back `tc -j qdisc show`
# --------------------------------------------------------------------------------------------


def test_parse_network1_golden():
    imp = parse_tc_qdisc_show_json(golden("tc_netem_network1.json"))
    # the kernel does not report the delay distribution
    assert str(imp) == "delay 40ms 5ms loss 0.5% limit 1000"  # the limit in force is reported
    assert differences(preset("network1"), imp) == []


def test_parse_all_devs_golden():
    text = golden("tc_netem_all_devs.json")
    qs = parse_tc_qdisc_show(text)
    assert [(q.dev, q.handle, q.parent) for q in qs] == [
        ("lab1-h1-eth0", "8002:", "root"),
        ("lab1-ifb0", "8003:", "root"),
    ]
    eth = parse_tc_qdisc_show_json(text, dev="lab1-h1-eth0")
    assert eth == parse_spec(
        "delay 1.5ms duplicate 1% 25% corrupt 0.1% reorder 25% 50% gap 5 rate 100mbit 14 "
        "limit 500 seed 12345"
    )
    ifb = parse_tc_qdisc_show_json(text, dev="lab1-ifb0")
    assert ifb.loss == GELoss(1.0, 10.0, 100.0, 0.0)
    assert (ifb.delay_us, ifb.jitter_us, ifb.delay_corr_pct) == (100000, 10000, 25.0)
    assert ifb.seed == 9876543210  # the kernel reports the seed it picked
    assert qs[1].extra == {}
    with pytest.raises(ValueError, match="pass dev="):
        parse_tc_qdisc_show_json(text)


def test_parse_state_golden():
    imp = parse_tc_qdisc_show_json(golden("tc_netem_state.json"))
    assert imp.loss == StateLoss(1.0, 30.0, 5.0, 90.0, 0.1)
    assert imp == parse_spec("loss state 1% 30% 5% 90% 0.1% limit 1000")


def test_parse_slot_ecn_golden_reports_extras():
    (q,) = parse_tc_qdisc_show(golden("tc_netem_slot_ecn.json"))
    assert str(q.impairment) == "loss 2% limit 1000"
    assert q.extra["ecn"] is True
    assert q.extra["slot"]["min-delay"] == 0.001


def test_parse_no_netem():
    assert parse_tc_qdisc_show_json(golden("tc_netem_none.json")) is None
    assert parse_tc_qdisc_show_json("") is None
    assert parse_tc_qdisc_show_json("[]") is None
    with pytest.raises(TypeError):
        parse_tc_qdisc_show("{}")


def test_parse_real_output_of_this_host():
    # captured here: `tc -j qdisc show dev lo` on a kernel without netem
    text = '[{"kind":"noqueue","handle":"0:","root":true,"refcnt":2,"options":{}}]'
    assert parse_tc_qdisc_show_json(text) is None


def test_differences():
    want = parse_spec("delay 40ms 5ms distribution normal loss 0.5%")
    assert differences(want, None) == ["no netem qdisc is applied"]
    assert differences(Impairment(), None) == []
    got = parse_spec("delay 40ms 5ms loss 1% seed 99 limit 1000")
    loss = "loss: requested {'model': 'random', 'p_pct': 0.5, 'corr_pct': 0.0}, applied "
    loss += "{'model': 'random', 'p_pct': 1.0, 'corr_pct': 0.0}"
    assert differences(want, got) == [loss]
    assert differences(parse_spec("loss 1% seed 5"), got)[-1].startswith("seed: requested 5")
    # no limit requested means netem's default 1000; any other limit in force is a difference
    assert "limit: requested 1000, applied 50" in differences(want, got.merge(Impairment(limit=50)))


@pytest.mark.parametrize(
    "spec",
    [
        "delay 40ms 5ms 25% loss 0.5% 10%",
        "loss gemodel 1% 10% 70% 0.1%",
        "loss state 1% 30% 5% 90% 0.1%",
        "delay 10ms duplicate 1% 25% corrupt 0.1% 5% reorder 25% 50% gap 5",
        "rate 100mbit 14 limit 500",
        "delay 1234.567ms 0.333ms",
    ],
)
def test_readback_round_trip(spec):
    """Fake what tc prints for a spec (units per q_netem.c) and read it back."""
    imp = parse_spec(spec)
    opts: dict = {"limit": imp.limit or 1000}
    if imp.delay_us:
        opts["delay"] = {
            "delay": float(f"{imp.delay_us / 1e6:g}"),
            "jitter": float(f"{(imp.jitter_us or 0) / 1e6:g}"),
            "correlation": (imp.delay_corr_pct or 0) / 100,
        }
    loss = imp.loss.to_json() if imp.loss else None
    if loss and loss["model"] == "random":
        opts["loss-random"] = {"loss": loss["p_pct"] / 100, "correlation": loss["corr_pct"] / 100}
    elif loss and loss["model"] == "state":
        opts["loss-state"] = {k: loss[k] / 100 for k in StateLoss.PARAMS}
    elif loss:
        opts["loss-gemodel"] = {"p": loss["p"] / 100, "r": loss["r"] / 100,
                                "1-h": loss["one_h"] / 100, "1-k": loss["one_k"] / 100}  # fmt: skip
    for kw in ("duplicate", "reorder", "corrupt"):
        if getattr(imp, f"{kw}_pct"):
            opts[kw] = {kw: getattr(imp, f"{kw}_pct") / 100,
                        "correlation": (getattr(imp, f"{kw}_corr_pct") or 0) / 100}  # fmt: skip
    if imp.rate_bps:
        opts["rate"] = {"rate": imp.rate_bps // 8, "packetoverhead": imp.rate_packet_overhead or 0,
                        "cellsize": 0, "celloverhead": 0}  # fmt: skip
    opts["ecn"] = False
    opts["gap"] = imp.reorder_gap or (1 if imp.reorder_pct else 0)
    text = json.dumps([{"kind": "netem", "handle": "8001:", "root": True, "options": opts}])
    back = parse_tc_qdisc_show_json(text)
    # %g keeps 6 significant digits of a time in seconds
    if spec.startswith("delay 1234"):
        assert abs(back.delay_us - imp.delay_us) <= 10
        assert differences(imp, back) == []
        return
    assert back == imp.merge(Impairment(limit=imp.limit or 1000))
    assert differences(imp, back) == []


# --------------------------------------------------------------------------------------------
# Probing, with a fake node (no root, no netem needed)
# --------------------------------------------------------------------------------------------


class FakeNode:
    name = "h1"

    def __init__(self, responses):
        self.env: dict = {}
        self.responses = responses  # argv prefix tuple -> (rc, stdout, stderr)
        self.calls = []

    def run(self, argv, *, check=True, timeout=60, input=None, env=None):
        self.calls.append(list(argv))
        for prefix, (rc, out, err) in self.responses.items():
            if tuple(argv[: len(prefix)]) == prefix:
                return subprocess.CompletedProcess(argv, rc, out, err)
        raise AssertionError(f"unexpected command {argv}")


LO_NOQUEUE = '[{"kind":"noqueue","handle":"0:","root":true,"refcnt":2,"options":{}}]'


def test_probe_netem_missing():
    node = FakeNode(
        {
            ("tc", "-j"): (0, LO_NOQUEUE, ""),
            ("tc", "qdisc", "add"): (2, "", "Error: Specified qdisc kind is unknown.\n"),
        }
    )
    res = probe_netem(node)
    assert res == Probe(False, res.reason) and not res.ok
    assert "Specified qdisc kind is unknown" in res.reason
    assert node.calls == [
        ["tc", "-j", "qdisc", "show", "dev", "lo"],
        ["tc", "qdisc", "add", "dev", "lo", "root", "netem"],
    ]


def test_probe_netem_present_removes_its_qdisc():
    node = FakeNode(
        {
            ("tc", "-j"): (0, LO_NOQUEUE, ""),
            ("tc", "qdisc", "add"): (0, "", ""),
            ("tc", "qdisc", "del"): (0, "", ""),
        }
    )
    ok, reason = probe_netem(node)
    assert ok and "added to and removed from lo" in reason
    assert node.calls[-1] == ["tc", "qdisc", "del", "dev", "lo", "root"]


def test_probe_netem_never_replaces_a_foreign_qdisc():
    tbf = '[{"kind":"tbf","handle":"1:","root":true,"refcnt":2,"options":{}}]'
    node = FakeNode({("tc", "-j"): (0, tbf, "")})
    ok, reason = probe_netem(node)
    assert not ok and "tbf" in reason
    assert len(node.calls) == 1


def test_probe_netem_already_there():
    node = FakeNode({("tc", "-j"): (0, golden("tc_netem_network1.json"), "")})
    assert probe_netem(node).ok


def test_parse_tc_version():
    assert parse_tc_version("tc utility, iproute2-6.1.0, libbpf 1.1.2") == (6, 1, 0)
    assert parse_tc_version("tc utility, iproute2-v6.9.0-12-gabc") == (6, 9, 0)
    assert parse_tc_version("tc utility, iproute2-ss190107") is None
