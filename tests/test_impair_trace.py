"""Trace-driven links (`trace FILE`, issue 33 item 4): Mahimahi's trace format read and refused
with the file and line, the word in the spec language and its JSON, where it cannot go (kernel
netem, time dilation), the shipped traces against their generator, and (root) real packets
through a lab's engine bounded by the trace's delivery opportunities."""

from __future__ import annotations

import importlib.util
import json
import struct
import subprocess
import time
from pathlib import Path

import pytest

from lab.core.errors import ConfigError
from lab.impair import kernel
from lab.model import dilation
from lab.model.impairment.directional import check_words, parse_directional
from lab.model.impairment.model import Impairment, parse_spec
from lab.model.impairment.trace import (
    BYTES_PER_OPPORTUNITY,
    load_trace,
    parse_trace_text,
    shipped,
    Trace,
    TRACES_DIR,
)

from .conftest import REPO, TOPOS, run_lab


def write(tmp_path: Path, text: str, name: str = "t.trace") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# -- the file format ---------------------------------------------------------------------------


def test_format_lines_and_repeats():
    assert parse_trace_text("1\n1\n5\n", "x") == (1, 1, 5)
    assert parse_trace_text("0\n3", "x") == (0, 3)  # no final newline; 0 is a time like others
    assert parse_trace_text(" 2 \n4\n\n\n", "x") == (2, 4)  # blank lines at the end only
    t = Trace("x", (1, 1, 5))
    assert t.period_ms == 5
    assert t.mean_bps == 3 * 1500 * 8 * 1000 / 5
    # opportunities in (start, end], the trace repeating every 5 ms: 1,1,5, 6,6,10, 11,11,15
    assert t.opportunities(0, 5) == 3
    assert t.opportunities(0, 15) == 9
    assert t.opportunities(5, 6) == 2
    assert t.opportunities(1, 4) == 0


@pytest.mark.parametrize(
    "text, where, says",
    [
        ("", "", "empty"),
        ("\n\n", "", "empty"),
        ("1\nx\n3\n", "line 2", "got 'x'"),
        ("1\n2.5\n", "line 2", "got '2.5'"),
        ("1\n-2\n", "line 2", "got '-2'"),
        ("1\n\n3\n", "line 2", "got ''"),
        ("5\n3\n", "line 2", "3 is before line 1's 5"),
        ("0\n0\n", "line 2", "last timestamp is 0"),
        ("1 2\n", "line 1", "got '1 2'"),
        ("١\n", "line 1", "whole number"),  # an Arabic-Indic digit is no ASCII number
    ],
)
def test_malformed_file_names_file_and_line(tmp_path, text, where, says):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_trace(str(p))
    msg = str(e.value)
    assert str(p) in msg and where in msg and says in msg, msg
    assert "Mahimahi's format" in msg or "before" in msg or "last timestamp" in msg


def test_missing_file_lists_the_shipped_traces(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_trace(str(tmp_path / "nope.trace"))
    msg = str(e.value)
    assert "nope.trace: no such file" in msg
    assert all(name in msg for name in shipped()) and "const-12mbit.trace" in msg
    with pytest.raises(ConfigError, match="not a file"):
        load_trace(str(tmp_path))


def test_shipped_name_and_user_file(tmp_path, monkeypatch):
    t = load_trace("const-12mbit.trace")
    assert t.path == str(TRACES_DIR / "const-12mbit.trace") and t.ms == (1,)
    assert t.mean_bps == 12e6
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "2\n4\n", "mine.trace")
    assert load_trace("mine.trace").path == str(tmp_path / "mine.trace")  # cwd first
    # a changed file is read again (the cache keys on mtime and size)
    write(tmp_path, "2\n4\n9\n", "mine.trace")
    assert load_trace("mine.trace").ms == (2, 4, 9)


def test_trace_json_is_checked_like_the_file():
    assert Trace.from_json({"path": "p", "ms": [1, 3]}) == Trace("p", (1, 3))
    for bad in ({"ms": [1]}, {"path": "p", "ms": "1"}, {"path": "p", "ms": []},
                {"path": "p", "ms": [3, 1]}, {"path": "p", "ms": [0]},
                {"path": "p", "ms": [1.5]}, {"path": "p", "ms": [True]}):  # fmt: skip
        with pytest.raises(ConfigError):
            Trace.from_json(bad)


# -- the word in the spec language ---------------------------------------------------------


def test_trace_word_round_trips(tmp_path):
    p = write(tmp_path, "1\n1\n5\n")
    imp = parse_spec(f"delay 10ms trace {p} limit 50")
    assert imp.trace == Trace(str(p), (1, 1, 5))
    assert str(imp) == f"delay 10ms limit 50 trace {p}"
    assert parse_spec(str(imp)) == imp  # the canonical words read back as the same object
    j = imp.to_json()
    assert j["trace"] == {"path": str(p), "ms": [1, 1, 5]}  # what the engine gets
    assert Impairment.from_json(json.loads(json.dumps(j))) == imp
    # setting one parameter keeps the trace; a new trace replaces it
    assert parse_spec("loss 1%", base=imp).trace == imp.trace
    q = write(tmp_path, "2\n", "q.trace")
    assert parse_spec(f"trace {q}", base=imp).trace.ms == (2,)


def test_uplink_and_downlink_traces_per_direction():
    d = parse_directional(
        "client->server: trace cellular-walk.up; server->client: trace cellular-walk.down",
        a="client",
        b="server",
    )
    assert d.a2b.trace.path.endswith("cellular-walk.up")
    assert d.b2a.trace.path.endswith("cellular-walk.down")
    assert d.a2b.trace.mean_bps < d.b2a.trace.mean_bps


@pytest.mark.parametrize(
    "words, says",
    [
        ("trace", "trace needs a FILE"),
        ("trace const-12mbit.trace rate 10mbit", "trace and rate both set the link's capacity"),
        ("delay 5ms reorder 5% trace const-12mbit.trace", "reorder with trace"),
        ("trace const-12mbit.trace trace const-12mbit.trace", "trace given twice"),
    ],
)
def test_trace_refused_with(words, says):
    with pytest.raises(ConfigError, match=says):
        parse_spec(words)


def test_bad_trace_refused_before_a_lab_is_looked_for(tmp_path):
    """Must show 5: `lab impair set` checks the words (and so reads the file) first."""
    bad = write(tmp_path, "3\n1\n")
    with pytest.raises(ConfigError, match=rf"{bad} line 2"):
        check_words(f"client->server: trace {bad}", source="lab impair set")


def test_kernel_netem_and_dilation_refuse_a_trace():
    imp = parse_spec("delay 5ms trace const-12mbit.trace")
    with pytest.raises(ConfigError, match="kernel netem has no trace-driven link"):
        kernel.netem_argv("eth0", imp)
    with pytest.raises(ConfigError, match="time-dilated"):
        dilation.impairment(imp, 2.0)
    assert dilation.impairment(imp, 1.0) == imp


def test_show_lines_count_opportunities():
    from lab.cli.labs import impairment_lines

    res = {
        "backend": "userspace",
        "placement": "middlebox",
        "applied": {"imp1": {"a2b": "trace /t/x.trace"}},
        "engines": {
            "imp1": {
                "a2b": {
                    "counters": {"forwarded": 7},
                    "trace": {
                        "opportunities": 10,
                        "used": 7,
                        "wasted": 3,
                        "bytes_per_opportunity": 1500,
                        "lines": 1,
                        "period_ms": 1,
                    },
                }  # fmt: skip
            }
        },
    }
    text = "\n".join(impairment_lines(res))
    assert "trace: 10 delivery opportunities, 7 used, 3 wasted" in text


def test_shipped_traces_are_what_the_generator_makes(tmp_path):
    """traces/README.md's claim: each file is tools/make_traces.py's model with its seed."""
    spec = importlib.util.spec_from_file_location("make_traces", REPO / "tools/make_traces.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    made = gen.traces()
    assert sorted(made) == shipped()
    for name, ms in made.items():
        assert (TRACES_DIR / name).read_text() == "".join(f"{x}\n" for x in ms), name
        load_trace(name)  # and each is a valid trace


# -- root: real packets through a lab's engine ------------------------------------------------


def udp_datagrams(pcap: Path, dport: int) -> list[tuple[float, int]]:
    """(time, IP total length) of every IPv4 UDP datagram to `dport` in an Ethernet pcap."""
    data = pcap.read_bytes()
    magic = struct.unpack("<I", data[:4])[0]
    end = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    scale = 1e-9 if magic in (0xA1B23C4D, 0x4D3CB2A1) else 1e-6
    out, i = [], 24
    while i + 16 <= len(data):
        sec, frac, incl, _orig = struct.unpack(end + "IIII", data[i : i + 16])
        pkt = data[i + 16 : i + 16 + incl]
        i += 16 + incl
        if len(pkt) < 38 or pkt[12:14] != b"\x08\x00" or pkt[23] != 17:
            continue
        ihl = (pkt[14] & 0x0F) * 4
        if struct.unpack("!H", pkt[14 + ihl + 2 : 14 + ihl + 4])[0] == dport:
            out.append((sec + frac * scale, struct.unpack("!H", pkt[16:18])[0]))
    return out


SENDER = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
n, payload = int(sys.argv[3]), b"x" * int(sys.argv[4])
for i in range(n):
    s.sendto(payload, (sys.argv[1], int(sys.argv[2])))
print(n)
"""


@pytest.mark.root
def test_packets_leave_only_at_the_trace_opportunities(lab_id, tmp_path):
    """A user's trace (two opportunities at 1 ms, one at 5 ms, repeating: 7.2 Mbit/s) on the
    client->server direction of pi_pair_middlebox's engine, set just before a burst of 1500-byte
    IP packets that no host sends slowly enough to fit it. Exact, from the trace: the bytes the
    server captured fit in the opportunities the engine counted (delivered <= opportunities x
    1500), each packet took an opportunity of its own (used >= delivered), and every datagram
    sent was delivered or dropped by the queue in front of the link."""
    trace = write(tmp_path, "1\n1\n5\n", "mine.trace")
    r = run_lab("up", TOPOS / "pi_pair_middlebox.py", "--id", lab_id, "--impair",
                "server->client: delay 1ms", "--impair-backend", "userspace")  # fmt: skip
    assert r.returncode == 0, r.stderr
    from lab.substrate.local.lab import Lab
    from lab.substrate.registry import open_lab

    lab = Lab.open(lab_id)
    client, server = lab.node("client"), lab.node("server")
    dst, port, n = "10.0.2.2", 9911, 1500
    client.run(["ping", "-c", "2", "-i", "0.1", "-W", "1", dst])  # ARP resolved before the burst
    pcap = tmp_path / "server.pcap"
    tcpdump = server.popen(
        ["tcpdump", "-i", "server-eth0", "-n", "-U", "--immediate-mode", "-Z", "root",
         "-w", str(pcap), "udp", "dst", "port", str(port)],
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert b"listening on" in tcpdump.stderr.readline()
        # as `lab impair set router-server WORDS` does (tests/test_impair_runtime.py: the CLI)
        open_lab(lab_id).impair("set", f"client->server: trace {trace} limit 100", "router-server")
        eng = engine_dir(lab)
        deadline = time.monotonic() + 5
        while "trace" not in eng() and time.monotonic() < deadline:  # its thread took the spec
            time.sleep(0.01)
        before = eng()
        assert "trace" in before, before
        sent = int(client.run(["python3", "-c", SENDER, dst, str(port), str(n), "1472"]).stdout)
        deadline = time.monotonic() + 10
        while eng()["counters"]["queue_depth"] and time.monotonic() < deadline:
            time.sleep(0.01)
        after = eng()  # every datagram has left the engine
        time.sleep(0.3)  # ... and reached the capture
    finally:
        tcpdump.terminate()
        tcpdump.wait(timeout=5)
    got = udp_datagrams(pcap, port)
    delta = {k: after["counters"][k] - before["counters"][k] for k in after["counters"]}
    tr = after["trace"]
    print(f"sent {sent}, delivered {len(got)}, engine {delta}, trace {tr}")
    assert got and all(length == 1500 for _, length in got)
    # the bound from the trace itself: the trace restarted at `impair set`, before any datagram
    assert sum(length for _, length in got) <= tr["opportunities"] * BYTES_PER_OPPORTUNITY
    assert tr["used"] >= len(got) and tr["used"] + tr["wasted"] == tr["opportunities"]
    # nothing is lost but what the 100-packet queue refused (and the engine's receive drops)
    assert len(got) + delta["dropped_limit"] + delta["dropped_rx"] >= sent
    assert len(got) <= delta["forwarded"]
    # the trace, not the host, paced them: n 1500-byte packets need n opportunities, and the
    # trace has 3 per 5 ms, so the last left at least (n - 1) // 3 * 5 ms after the first
    # (a slow host only spreads them more; one period, 5 ms, is left for the first to be late)
    span_ms = (got[-1][0] - got[0][0]) * 1000
    assert span_ms >= (len(got) - 1) // 3 * 5 - 5, (span_ms, len(got))
    shown = run_lab("impair", "show", "--id", lab_id)
    assert shown.returncode == 0 and "delivery opportunities" in shown.stdout, shown.stdout
    assert run_lab("down", "--id", lab_id).returncode == 0


def engine_dir(lab):
    """A reader of the engine's client->server direction (its control socket: fast, so the
    opportunities counted after the burst are not many more than the burst needed)."""
    from lab.impair.runtime import engine_client
    from lab.impair.where import directions

    st = lab.info["impair"]
    (rec,) = st["engines"]
    ((key, _),) = [(k, w) for k, w in directions(lab.spec, st).items()
                   if k.startswith(rec["name"] + ":") and w["way"] == "client->server"]  # fmt: skip
    client = engine_client(lab, rec)
    return lambda: client.show()[key.split(":")[1]]
