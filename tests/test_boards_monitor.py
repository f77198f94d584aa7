"""BoardMonitor (lab/substrate/boards/monitor.py): the parsers of the board-side reader's output,
and, on an emulated board farm, a real monitor over the boards' SSH sessions: a spinning
process's CPU is seen and a sleeping one's is not, the node's total holds the spinner's share,
the summary has lab.substrate.local.monitor.Monitor's keys, readings the farm lacks are
explained, and one sample costs milliseconds.

The emulated boards are namespaces of this machine, so their /proc/stat is this machine's: how
much CPU the spinner gets moves with whatever else this machine is doing, so the test asserts
the mechanism (some vs none, contained in the total), never an amount, and never skips for load.
"""

from __future__ import annotations

import os
import statistics
import time

import pytest

from lab.substrate.boards.readings import (
    READER,
    parse_answer,
    parse_measure_temp,
    parse_reader,
    parse_vcgencmd,
)

from .conftest import board_farm

# ----------------------------------------------------------------------------- parsers

READER_OUT = """\
==> /proc/uptime <==
100.50 300.00

==> /proc/stat <==
cpu  10 0 10 100 0 0 0 0 0 0
cpu0 5 0 5 50 0 0 0 0 0 0
cpu1 5 0 5 50 0 0 0 0 0 0
intr 1

==> /proc/meminfo <==
MemTotal:        3884096 kB
MemFree:         3000000 kB
MemAvailable:    3500000 kB

==> /proc/4242/stat <==
4242 (wireguard go) S 1 4242 4242 0 -1 4194560 0 0 0 0 120 30 0 0 20 0 8 0 5000 0 512 0

==> /sys/class/thermal/thermal_zone0/type <==
cpu-thermal

==> /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor <==
ondemand

==> /sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq <==
1500000

==> /sys/class/thermal/thermal_zone0/temp <==
48312

==> probe <==
100
4096
vcgencmd=/usr/bin/vcgencmd

==> vcgencmd get_throttled <==
throttled=0x50005

==> vcgencmd measure_temp <==
temp=48.3'C

==> vcgencmd measure_clock arm <==
frequency(48)=1500398464
"""


def test_reader_output_parses_into_numbers():
    a = parse_answer(parse_reader(READER_OUT), ["4242:5000", "999:"])
    assert a["t"] == 100.5
    assert a["stat"] == {"cpu0": [5, 0, 5, 50, 0, 0, 0, 0], "cpu1": [5, 0, 5, 50, 0, 0, 0, 0]}
    assert a["mem"] == {"MemTotal": 3884096 * 1024, "MemAvailable": 3500000 * 1024}
    assert a["freq"] == {"cpu0": 1500.0}
    assert a["temp"] == {"thermal_zone0": 48.312}
    assert a["zone_types"] == {"thermal_zone0": "cpu-thermal"}
    # utime + stime; rss pages; a process name with a space; a PID that printed nothing is gone
    assert a["pids"] == {"4242:5000": [150, 512], "999:": None}
    assert (a["tck"], a["page"], a["vcgencmd"], a["gov"]) == (100, 4096, "/usr/bin/vcgencmd",
                                                              "ondemand")  # fmt: skip
    # another process under a reused PID (start time differs) counts as gone
    assert parse_answer(parse_reader(READER_OUT), ["4242:4999"])["pids"] == {"4242:4999": None}


def test_vcgencmd_answers_decoded_into_words():
    a = parse_answer(parse_reader(READER_OUT), [])
    got, problems = parse_vcgencmd(a["vc"])
    assert problems == []
    assert got["temperature_c"] == 48.3
    assert round(got["arm_clock_mhz"]) == 1500
    # 0x50005: bits 0, 2, 16, 18
    assert got["throttled"]["words"] == [
        "under_voltage", "throttled", "under_voltage_occurred", "throttled_occurred"
    ]  # fmt: skip
    got, problems = parse_vcgencmd({"get_throttled": "error: VCHI initialization failed"})
    assert got == {} and "VCHI initialization failed" in problems[0]
    with pytest.raises(ValueError):
        parse_measure_temp("nonsense")


# ----------------------------------------------------------------------------- on a farm


@pytest.fixture(scope="module")
def farm(tmp_path_factory):
    """An emulated farm of pi_pair_middlebox and open nodes on its boards, with a state root of
    this module's own; the farm is removed after."""
    with board_farm(tmp_path_factory) as (inv, _):
        yield from _nodes(inv, tmp_path_factory.mktemp("ssh"))


def _nodes(inv, logs):
    from lab.substrate.boards.inventory import load_inventory
    from lab.substrate.boards.connection import BoardConnection
    from lab.substrate.boards.node import BoardNode

    conns = []
    try:
        for name, b in load_inventory(inv).boards.items():
            conns.append(BoardConnection.open(b, log_path=logs / f"ssh-{name}.log"))
        yield {c.board.name: BoardNode(c.board.name, c) for c in conns}
    finally:
        for c in conns:
            c.close()


def _mean_total(samples, node, t0, t1):
    return statistics.mean(
        x["nodes"][node]["total"] for x in samples if t0 <= x["t"] <= t1 and node in x["nodes"]
    )


def _sleeper_and_burner(farm) -> tuple[dict, dict, float, dict]:
    """Monitor the router board for 2 s while a shell spins and a `sleep` sleeps there, both
    watched as daemons (by PID, on the board): (the spinner's and the sleeper's daemon
    summaries, the router node's mean CPU over the spin, the whole summary)."""
    from lab.substrate.boards.monitor import BoardMonitor

    router = farm["router"]
    sleeper = router.popen(["sleep", "30"])
    burn = router.popen(["sh", "-c", "while :; do :; done"])
    daemons = [
        {"node": "router", "name": "burn", "pid": burn.pid, "start_time": None},
        {"node": "router", "name": "sleeper", "pid": sleeper.pid, "start_time": None},
    ]
    try:
        time.sleep(0.5)  # both past their exec: what the monitor sees is spinning and sleeping
        mon = BoardMonitor(farm, daemons, interval=0.25).start()
        t0 = time.monotonic()
        time.sleep(2.0)
        end = time.monotonic() - t0
        summary = mon.stop()
    finally:
        for p in (burn, sleeper):
            p.kill()
            p.wait(10)
    node = _mean_total(mon.samples, "router", 0.3, end)
    d = summary["daemons"]
    return d["router/burn"], d["router/sleeper"], node, summary


@pytest.mark.root
def test_cpu_of_a_spinning_process_is_seen_and_a_sleeping_ones_is_not(farm):
    # The board's /proc/stat is this machine's, shared with whatever else runs here, so how much
    # CPU the spinner gets moves with the machine's load; THAT it gets some while the sleeper
    # gets none, and that the node's total holds the spinner's share, do not (a loaded machine
    # still gives a runnable process its fair share of 2 s; how much a spin adds on an idle
    # machine is not asserted).
    burn, sleeper, node, summary = _sleeper_and_burner(farm)
    assert summary["samples"] >= 5 and not summary.get("errors"), summary
    assert burn["alive_throughout"] is True and sleeper["alive_throughout"] is True
    assert burn["rss_bytes_max"] > 0 and sleeper["rss_bytes_max"] > 0
    assert burn["cpu_pct"]["mean"] > 0 and burn["cpu_pct"]["max"] > 0, burn
    # a sleeping process accrues no CPU time: at most one 10 ms tick in a 0.25 s sample (4 %)
    assert sleeper["cpu_pct"]["max"] <= 4.0 + 0.5, sleeper
    assert burn["cpu_pct"]["mean"] > sleeper["cpu_pct"]["mean"], (burn, sleeper)
    # the node's total (this machine's, % of one core) contains the spinner's share; the two
    # are sampled at slightly different instants, hence the factor 2 of tolerance
    assert node >= burn["cpu_pct"]["mean"] / 2, (node, burn["cpu_pct"])
    assert node <= 100.0 * os.cpu_count() + 5, node


@pytest.mark.root
def test_summary_has_the_local_monitors_keys_and_explains_what_is_missing(farm):
    from lab.substrate.boards.monitor import BoardMonitor
    from lab.substrate.local.monitor import Monitor

    mon = BoardMonitor(farm, [{"node": "client", "name": "gone", "pid": 2**22 + 7}], interval=0.2)
    mon.start()
    time.sleep(1.0)
    s = mon.stop()
    local = Monitor(None, {"n": "x"}, []).summary()
    assert set(local) - {"errors"} <= set(s)
    assert set(s["nodes"]) == {"client", "server", "router"}
    for n in s["nodes"].values():
        assert set(n) == {"total", "user", "system", "memory_bytes"}
        assert n["total"]["mean"] is not None and n["memory_bytes"]["max"] > 0
    for key in ("busy_pct", "softirq_pct", "cores", "ncores", "clock_mhz", "temperature_c"):
        assert key in s["host"], key
    assert s["host"]["ncores"] == 3 * os.cpu_count()
    assert s["daemons"]["client/gone"]["alive_throughout"] is False
    # the emulated boards have no vcgencmd (and this machine may lack cpufreq and thermal zones)
    for board in ("client", "server", "router"):
        assert "vcgencmd not on PATH" in s["unavailable"][f"{board}/vcgencmd"]
        assert "vcgencmd" not in s["boards"][board]
        if s["boards"][board]["clock_mhz"] is None:
            assert "cpufreq" in s["unavailable"][f"{board}/clock"]
        if s["boards"][board]["temperature_c"] is None:
            assert "thermal" in s["unavailable"][f"{board}/temperature"]
    # what a sample costs: one round trip per board, timed (how long is a bench figure:
    # bench/board_ssh.py; how many fit in the second moves with the machine's load)
    assert set(s["agent_rtt_ms"]) == {"client", "server", "router"}
    for board, rtt in s["agent_rtt_ms"].items():
        assert rtt["n"] >= 1 and rtt["median"] > 0, (board, rtt)


def test_reader_is_one_shell_script():
    # ONE process besides the shell reads the files (head -v), so a sample costs ~ms on a board
    assert READER.count("head -v") == 1 and "python" not in READER
