"""results.csv / summary.csv / time budget from a synthetic run (no root): the CSV loads in pandas
with exactly the column schema documented in docs/results.md."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest

from lab.results.rundir import (
    COLUMN_NAMES,
    CSV_COLUMNS,
    SUMMARY_METRICS,
    RunDir,
    read_results_csv,
    rows,
    summarize,
    write_tables,
)
from lab.measure import metric_columns
from lab.results.timebudget import time_budget
from lab.core.state import read_jsonl

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "results.md"


def documented_columns(*, meaning: bool = False) -> list[tuple[str, ...]]:
    """docs/results.md's column table: (name, dtype), with `meaning` (name, dtype, meaning)."""
    text = DOC.read_text()
    block = text.split("<!-- columns: name | dtype | meaning -->", 1)[1]
    out = []
    for line in block.splitlines()[3:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        out.append((cells[0], cells[1], cells[2]) if meaning else (cells[0], cells[1]))
    return out


def make_run(path: Path, *, profiles=("baseline", "wireguard"), scale=1.0) -> RunDir:
    """A run directory as the runner leaves it: plan.json, results.jsonl, timeline.jsonl."""
    path.mkdir(parents=True)
    plan = {
        "name": "synthetic",
        "profiles": list(profiles),
        "impairments": [
            {"name": "none", "spec": "", "group": "none", "parameter": None, "value": None},
            {"name": "delay-10ms", "spec": "delay 10ms", "group": "delay", "parameter": "delay",
             "value": 10.0},
            {"name": "delay-20ms", "spec": "delay 20ms", "group": "delay", "parameter": "delay",
             "value": 20.0},
        ],
        "tests": [{"label": "tcp", "test": "tcp"}, {"label": "udp", "test": "udp"},
                  {"label": "ping", "test": "ping"}, {"label": "sweep", "test": "udp-sweep"}],
        "reps": 3, "impaired_reps": 1, "error_bars": "sd",
        "topology": {"file": "topologies/pi_pair.py", "params": {}},
    }  # fmt: skip
    (path / "plan.json").write_text(json.dumps(plan))
    (path / "manifest.json").write_text(json.dumps({
        "profiles": {"baseline": {"driver": "none", "path": "none"},
                     "wireguard": {"driver": "wireguard", "path": "wireguard-go"}},
        "cpu": {"client": {"profile": "pi4", "calibrated": False}},
    }))  # fmt: skip
    run = RunDir(path)
    t = 1000.0
    run.event({"t": t, "session": "s1", "event": "session-start"})
    run.event({"t": t + 1, "session": "s1", "event": "up", "seconds": 1.0, "lab_id": "rabcde"})
    base = {"baseline": 900e6, "wireguard": 60e6}
    for prof in profiles:
        for pt in plan["impairments"]:
            nreps = 3 if pt["name"] == "none" else 1
            for rep in range(nreps):
                for label, test in (("tcp", "tcp"), ("udp", "udp"), ("ping", "ping"),
                                    ("sweep", "udp-sweep")):  # fmt: skip
                    bps = base[prof] * scale / (1 + (pt["value"] or 0) / 10) * (1 + 0.01 * rep)
                    if test == "tcp":
                        recs = [
                            {
                                "test": "tcp",
                                "ok": True,
                                "receiver_bps": bps,
                                "sender_bps": bps * 1.01,
                                "retransmits": 3,
                                "tcp_mss": 1448,
                                "direction": "client-to-server",
                                "raw_files": ["raw/x.json"],
                            }
                        ]
                    elif test == "udp":
                        recs = [
                            {
                                "test": "udp",
                                "ok": True,
                                "receiver_bps": bps / 10,
                                "rate_mbit": 100,
                                "size": 1300,
                                "sent_pps": 9000,
                                "received_pps": 8000,
                                "target_pps": 9615,
                                "loss_pct": 1.0,
                                "jitter_ms": 0.1,
                            }
                        ]
                    elif test == "ping":
                        recs = [
                            {
                                "test": "ping",
                                "ok": True,
                                "rtt_avg_ms": 0.2 + rep,
                                "rtt_min_ms": 0.1,
                                "rtt_max_ms": 3.0,
                                "rtt_mdev_ms": 0.05,
                                "loss_pct": 0.0,
                                "rtts": [{"seq": 1, "rtt_ms": 0.2}],
                            }
                        ]
                    else:
                        recs = [
                            {
                                "test": "udp-sweep",
                                "ok": True,
                                "rate_mbit": r,
                                "step": i,
                                "receiver_bps": min(r * 1e6, bps),
                                "sent_pps": r * 96,
                                "received_pps": min(r * 1e6, bps) / 10400,
                                "target_pps": r * 96.15,
                            }
                            for i, r in enumerate((25, 50))
                        ]
                    ok = not (prof == "wireguard" and label == "udp" and rep == 1)
                    if not ok:
                        recs = [
                            {
                                "test": "udp",
                                "ok": False,
                                "error": "iperf3 exited 1: boom",
                                "raw_files": ["raw/y.json"],
                            }
                        ]
                    t += 2
                    mon = {"nodes": {"client": {"total": {"mean": 20.0}},
                                     "server": {"total": {"mean": 25.0}}},
                           "host": {"busy_pct": {"mean": 50.0},
                                    "softirq_pct": {"mean": 5.0}, "ncores": 2},
                           "daemons": {"client/wg": {"cpu_pct": {"mean": 10.0},
                                                     "rss_bytes_max": 2**21}}}  # fmt: skip
                    if prof == "wireguard":  # as on a Pi: clock, sensors, vcgencmd
                        mon["host"].update({
                            "clock_mhz": {"cores": {}, "min": 600.0, "mean": 1200.0,
                                          "max": 1500.0},
                            "temperature_c": {"sensors": {"cpu_thermal": {"mean": 70.0,
                                                                          "max": 81.5}},
                                              "max": 81.5},
                            "memory": {"total_bytes": 4 * 2**30,
                                       "used_bytes": {"mean": 2**28, "max": 2**29},
                                       "available_bytes_min": 3 * 2**30},
                            "vcgencmd": {"start": None, "end": None,
                                         "throttled": label == "tcp" and rep == 2},
                        })  # fmt: skip
                    run.add_result({
                        "case": f"{prof}|{pt['name']}|{label}|{rep}", "session": "s1",
                        "profile": prof, "vpn": {"driver": "x", "path": "y"}, "impairment": pt,
                        "test": test, "label": label, "rep": rep, "ok": ok,
                        "error": None if ok else "iperf3 exited 1: boom",
                        "started_utc": "2025-01-01T00:00:00Z", "seconds": 1.8, "ended_t": t,
                        "records": recs,
                        "roles": {"vpn_client": "client", "vpn_server": "server",
                                  "traffic_client": "client", "traffic_server": "server"},
                        "monitor": mon,
                        "raw_tail": {} if ok else {"raw/y.json": "partial\nboom"},
                    })  # fmt: skip
    run.event({"t": t + 1, "session": "s1", "event": "down", "seconds": 0.5})
    run.event({"t": t + 2, "session": "s1", "event": "session-end"})
    return run


def test_documented_schema_matches_code():
    assert documented_columns() == [(n, t) for n, t, _ in CSV_COLUMNS]


#: metric columns lab.results.columns.LAYOUT names without a word of their own (added after the rrul test's
#: columns): docs/results.md is where each is explained
LATER_COLUMNS = (
    "quiet_wait_s quiet_status key_exchange_ms key_exchange_bytes key_exchange_packets "
    "link_rtt_idle_p50_ms link_rtt_loaded_p50_ms link_inflation_ms vpn_inflation_ms "
    "copied_bytes setup_retries"
).split()


def test_the_later_columns_are_explained_naming_the_tests_that_fill_them():
    meanings = {n: m for n, _, m in documented_columns(meaning=True)}
    declared = metric_columns()
    for name in LATER_COLUMNS:
        assert name in COLUMN_NAMES and name in declared, name
        assert len(meanings[name].split()) >= 4, (name, meanings[name])
        for test in declared[name].tests:
            assert re.search(rf"\b{re.escape(test)}\b", meanings[name]), (name, test)


#: results.csv's columns as runs have been written so far: they keep these places whatever test
#: kinds are added (a new test's metric columns come after them)
WRITTEN_LAYOUT = [
    "run", "case", "profile", "driver", "datapath", "impairment", "impairment_spec",
    "sweep_parameter", "sweep_value", "test", "test_label", "ip", "rep", "point", "ok", "error",
    "started_utc", "case_seconds", "direction", "throughput_bps", "sender_bps", "receiver_bps",
    "retransmits", "tcp_mss", "packets_per_s", "rate_mbit", "size", "target_pps", "sent_pps",
    "received_pps", "jitter_ms", "loss_pct", "packets_sent", "packets_lost", "rtt_min_ms",
    "rtt_avg_ms", "rtt_max_ms", "rtt_mdev_ms", "iface_mtu", "path_mtu", "transactions_per_s",
    "latency_p50_us", "latency_p99_us", "seconds", "cpu_vpn_client_pct", "cpu_vpn_server_pct",
    "cpu_traffic_client_pct", "cpu_traffic_server_pct", "host_busy_pct", "host_softirq_pct",
    "daemon_cpu_pct", "daemon_rss_mb", "raw_files", "host_clock_min_mhz", "host_clock_mean_mhz",
    "host_temp_max_c", "host_mem_used_max_mb", "host_mem_available_min_mb", "throttled",
]  # fmt: skip


def test_written_columns_keep_their_places():
    assert COLUMN_NAMES[: len(WRITTEN_LAYOUT)] == WRITTEN_LAYOUT
    dtypes = dict((n, t) for n, t, _ in CSV_COLUMNS)
    assert dtypes["direction"] == "string" and dtypes["throughput_bps"] == "float64"
    # parameters echoed by udp are columns but not outcomes: summary.csv leaves them out
    assert {"rate_mbit", "size", "sweep_value"}.isdisjoint(SUMMARY_METRICS)
    assert {"throughput_bps", "loss_pct", "rtt_avg_ms", "seconds"} <= set(SUMMARY_METRICS)


def test_a_column_is_read_from_the_key_its_test_declares():
    """throughput_bps is iperf3's receiver rate for tcp/udp and the file rate for scp; a test
    that does not declare a column still fills it from a record key of the same name."""
    recs = {"tcp": {"receiver_bps": 5.0, "rate_bps": 7.0}, "scp": {"receiver_bps": 5.0,
            "rate_bps": 7.0}, "ping": {"receiver_bps": 5.0, "throughput_bps": 9.0}}  # fmt: skip
    lines = [
        {"case": f"p|none|{t}|0", "profile": "p", "test": t, "label": t, "rep": 0, "ok": True,
         "records": [{"test": t, "ok": True, **rec}]}
        for t, rec in recs.items()
    ]  # fmt: skip
    # contention's records are the wrapped test's: its declarations apply
    lines.append({"case": "p|none|c|0", "profile": "p", "test": "contention", "label": "c",
                  "rep": 0, "ok": True, "records": [{"test": "scp", "ok": True, "rate_bps": 3.0,
                                                     "receiver_bps": 1.0}]})  # fmt: skip
    got = {r["test_label"]: r["throughput_bps"] for r in rows("R", lines)}
    assert got == {"tcp": 5.0, "scp": 7.0, "ping": 9.0, "c": 3.0}


def test_results_csv_loads_in_pandas_with_the_documented_schema(tmp_path):
    run = make_run(tmp_path / "run")
    write_tables(run)
    df = pd.read_csv(run.file("results.csv"))
    assert list(df.columns) == [n for n, _ in documented_columns()]
    for name, dtype in documented_columns():
        if dtype in ("int64", "float64", "bool"):
            assert str(df[name].dtype) == dtype, name
        else:  # text: str (pandas >= 3) or object; an all-empty column reads as float NaN
            assert pd.api.types.is_string_dtype(df[name]) or df[name].isna().all(), name
    # one row per case x rep x point; the failed case kept with its error
    lines = read_jsonl(run.results)
    sweeps = sum(1 for r in lines if r["test"] == "udp-sweep")
    assert len(df) == len(lines) + sweeps  # every sweep case has a 2nd point
    failed = df[~df["ok"]]
    assert len(failed) == 1 and "boom" in failed.iloc[0]["error"]
    tcp = df[(df.test == "tcp") & (df.profile == "baseline") & (df.impairment == "none")]
    assert len(tcp) == 3 and tcp.throughput_bps.mean() == pytest.approx(909e6)
    assert set(df.cpu_vpn_client_pct.dropna()) == {20.0}
    assert df.daemon_rss_mb.dropna().iloc[0] == 2.0
    # monitor: clock, temperature, memory, throttling; empty where the source was missing
    wg, bl = df[df.profile == "wireguard"], df[df.profile == "baseline"]
    assert set(wg.host_clock_min_mhz) == {600.0} and set(wg.host_clock_mean_mhz) == {1200.0}
    assert set(wg.host_temp_max_c) == {81.5}
    assert set(wg.host_mem_used_max_mb) == {512.0}
    assert set(wg.host_mem_available_min_mb) == {3072.0}
    thr = wg[wg.firmware_throttled == 1.0]
    assert list(thr.case) == ["wireguard|none|tcp|2"] and (wg.firmware_throttled.notna()).all()
    new = ["host_clock_min_mhz", "host_clock_mean_mhz", "host_temp_max_c",
           "host_mem_used_max_mb", "host_mem_available_min_mb", "throttled"]  # fmt: skip
    assert bl[[*new, "firmware_throttled"]].isna().all().all()  # lines without these fields
    assert df.throttled.isna().all()  # no node of these lines had a CFS reading (issue 30)
    # appended after every column of the first layout (raw_files was its last); columns a new
    # test kind declares may follow them
    first = COLUMN_NAMES.index("raw_files") + 1
    assert COLUMN_NAMES[first : first + len(new)] == new
    # the typed loader gives the same columns with text as pandas strings
    typed = read_results_csv(run.file("results.csv"))
    assert str(typed["profile"].dtype) == "string"
    assert list(typed.columns) == COLUMN_NAMES


def test_summary(tmp_path):
    run = make_run(tmp_path / "run")
    table = rows(run.name, run.load_results())
    summ = summarize(table)
    row = next(s for s in summ if s["profile"] == "baseline" and s["impairment"] == "none"
               and s["test_label"] == "tcp" and s["metric"] == "throughput_bps")  # fmt: skip
    vals = [900e6, 909e6, 918e6]
    assert row["n"] == 3 and row["mean"] == pytest.approx(sum(vals) / 3)
    assert row["sd"] == pytest.approx(9e6)
    assert (row["min"], row["max"]) == (900e6, 918e6)
    udp = [s for s in summ if s["profile"] == "wireguard" and s["test_label"] == "udp"
           and s["impairment"] == "none" and s["metric"] == "throughput_bps"]  # fmt: skip
    assert udp[0]["n"] == 2 and udp[0]["failed"] == 1
    write_tables(run)
    df = pd.read_csv(run.file("summary.csv"))
    assert {"mean", "sd", "min", "max", "n"} <= set(df.columns)


def test_time_budget_counts_sessions_and_parts():
    tl = [
        {"t": 0.0, "session": "a", "event": "session-start"},
        {"t": 1.0, "session": "a", "event": "up", "seconds": 1.0},
        {"t": 12.0, "session": "a", "event": "down", "seconds": 0.5},
        {"t": 13.0, "session": "a", "event": "session-end"},
        # a session killed without its end event: ends at its last result
        {"t": 100.0, "session": "b", "event": "session-start"},
        {"t": 101.0, "session": "b", "event": "up", "seconds": 1.0},
    ]
    res = [{"session": "a", "seconds": 10.0, "ended_t": 11.5},
           {"session": "b", "seconds": 5.0, "ended_t": 107.0}]  # fmt: skip
    b = time_budget(res, tl)
    assert b["wall_s"] == pytest.approx(20.0)
    assert b["measurement_s"] == 15.0
    assert b["setup_s"] == 2.0 and b["teardown_s"] == 0.5
    assert b["outside_share"] == pytest.approx(0.25)
    assert b["sessions"] == 2


def test_a_cut_last_line_is_ignored(tmp_path):
    run = make_run(tmp_path / "run")
    n = len(run.load_results())
    with open(run.results, "a") as f:
        f.write('{"case": "baseline|none|tcp|9", "ok": tr')  # SIGKILL mid-write
    assert len(run.load_results()) == n
    assert "baseline|none|tcp|9" not in run.finished_keys()


def test_nan_and_bool_cells():
    table = rows("r", [{"case": "p|none|t|0", "profile": "p", "test": "tcp", "label": "t",
                        "rep": 0, "ok": True, "records": [{"ok": True,
                                                           "receiver_bps": float("nan")}]}])  # fmt: skip
    assert table[0]["throughput_bps"] is None and table[0]["ok"] is True
    assert not math.isnan(table[0]["rep"])
