"""A run directory and what is stored in it: the results, the timeline, and the tables made of them.

    runs/<UTC time>_<plan>/
      plan.json        the validated plan (what --resume runs again)
      manifest.json    versions, kernel, topology, CPU profile, data-plane paths, configs, impairment
      results.jsonl    one line per finished case x repetition (appended, fsynced)
      timeline.jsonl   sessions, bring-ups, teardowns, impairment changes (for the time budget)
      raw/             tool output as it arrives, per case
      monitor/         monitor samples per case
      results.csv      one row per case x repetition x measured point (docs/results.md)
      summary.csv      n, mean, sd, min, max per case and metric

A line reaches results.jsonl only when its case is finished, and is fsynced before the next case
starts, so a run killed at any moment loses at most the case in flight.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.core.errors import ConfigError
from lab.measure import TESTS
from lab.results.columns import COLUMN_NAMES, CSV_COLUMNS, METRIC_COLUMNS, SUMMARY_METRICS
from lab.core.state import read_jsonl, write_text_atomic

RESULT_SCHEMA = 1


@dataclass
class RunDir:
    path: Path

    @property
    def name(self) -> str:
        return self.path.name

    def file(self, name: str) -> Path:
        return self.path / name

    @property
    def results(self) -> Path:
        return self.path / "results.jsonl"

    @property
    def timeline(self) -> Path:
        return self.path / "timeline.jsonl"

    @property
    def raw(self) -> Path:
        return self.path / "raw"

    def check(self) -> RunDir:
        if not (self.path / "plan.json").is_file():
            raise ConfigError("not a run directory (no plan.json)", source=str(self.path))
        return self

    def append(self, path: Path, entry: dict) -> None:
        """One JSON line, written with a single write(2) on O_APPEND and fsynced."""
        line = json.dumps(entry, default=_json_default) + "\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def add_result(self, entry: dict) -> None:
        self.append(self.results, entry)

    def event(self, entry: dict) -> None:
        self.append(self.timeline, entry)

    def load_results(self) -> list[dict]:
        return read_jsonl(self.results)

    def load_timeline(self) -> list[dict]:
        return read_jsonl(self.timeline)

    def finished_keys(self) -> set[str]:
        return {r["case"] for r in self.load_results()}

    def plan_json(self) -> dict:
        return json.loads((self.path / "plan.json").read_text())

    def manifest(self) -> dict:
        p = self.path / "manifest.json"
        return json.loads(p.read_text()) if p.is_file() else {}

    def rel(self, p: str | Path) -> str:
        try:
            return str(Path(p).resolve().relative_to(self.path.resolve()))
        except ValueError:
            return str(p)


def _json_default(o: Any) -> Any:
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, set | tuple):
        return list(o)
    return str(o)


# ---------------------------------------------------------------------- rows


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int | float):
        return float(v) if math.isfinite(v) else None
    return None


def _sources(test: str | None) -> dict[str, str]:
    """Metric column -> record key, as the registered test `test` declares them."""
    t = TESTS.get(test) if isinstance(test, str) else None
    return {m.name: m.key for m in t.metrics} if t is not None else {}


def cfs_throttling(monitor: dict) -> tuple[float | None, float | None]:
    """(seconds, periods) the test's CPU-capped nodes were throttled, summed over the nodes of
    the monitor summary that have a quota (each summed over its own and its per-board-core
    groups, lab.substrate.local.monitor); (None, None) when no node was capped or the summary
    has no such reading (boards, uncapped labs, lines from before it)."""
    nodes = [v for v in (monitor.get("nodes") or {}).values() if isinstance(v, dict)]
    secs = [_num(v.get("throttled_s")) for v in nodes]
    periods = [_num(v.get("throttled_periods")) for v in nodes]
    secs, periods = [x for x in secs if x is not None], [x for x in periods if x is not None]
    return (sum(secs) if secs else None), (sum(periods) if periods else None)


def rows(run_name: str, results: list[dict]) -> list[dict]:
    """results.jsonl lines -> results.csv rows (one per record; a failed case keeps one row)."""
    out = []
    for r in results:
        pt = r.get("impairment") or {}
        mon = r.get("monitor") or {}
        roles = r.get("roles") or {}
        nodes = mon.get("nodes") or {}
        daemons = (mon.get("daemons") or {}).values()

        node_cpu = {
            role: _num((((nodes.get(roles.get(role)) or {}).get("total")) or {}).get("mean"))
            for role in ("vpn_client", "vpn_server", "traffic_client", "traffic_server")
        }

        dcpu = [_num((d.get("cpu_pct") or {}).get("mean")) for d in daemons]
        drss = [d.get("rss_bytes_max") for d in daemons if d.get("rss_bytes_max")]
        host = mon.get("host") or {}
        clock = host.get("clock_mhz") or {}
        mem = host.get("memory") or {}
        used = _num((mem.get("used_bytes") or {}).get("max"))
        avail = _num(mem.get("available_bytes_min"))
        firmware = (host.get("vcgencmd") or {}).get("throttled")
        cfs_s, cfs_periods = cfs_throttling(mon)
        nic = r.get("nic_latency_applied")  # docs/cpu.md "The side path"
        common = {
            "run": run_name,
            "case": r["case"],
            "profile": r["profile"],
            "driver": (r.get("vpn") or {}).get("driver"),
            "datapath": (r.get("vpn") or {}).get("path"),
            "impairment": pt.get("name"),
            "impairment_spec": pt.get("spec") or "",
            "sweep_parameter": pt.get("parameter") or "",
            "sweep_value": pt.get("value"),
            "test": r["test"],
            "test_label": r["label"],
            "ip": r.get("ip", 4),
            "rep": r["rep"],
            "started_utc": r.get("started_utc"),
            "case_seconds": r.get("seconds"),
            "cpu_vpn_client_pct": node_cpu["vpn_client"],
            "cpu_vpn_server_pct": node_cpu["vpn_server"],
            "cpu_traffic_client_pct": node_cpu["traffic_client"],
            "cpu_traffic_server_pct": node_cpu["traffic_server"],
            "host_busy_pct": _num((host.get("busy_pct") or {}).get("mean")),
            "host_softirq_pct": _num((host.get("softirq_pct") or {}).get("mean")),
            "daemon_cpu_pct": sum(x for x in dcpu if x is not None)
            if any(x is not None for x in dcpu)
            else None,
            "daemon_rss_mb": sum(drss) / 2**20 if drss else None,
            "host_clock_min_mhz": _num(clock.get("min")),
            "host_clock_mean_mhz": _num(clock.get("mean")),
            "host_temp_max_c": _num((host.get("temperature_c") or {}).get("max")),
            "host_mem_used_max_mb": used / 2**20 if used is not None else None,
            "host_mem_available_min_mb": avail / 2**20 if avail is not None else None,
            "throttled": cfs_s,
            "throttled_periods": cfs_periods,
            "firmware_throttled": None if firmware is None else float(bool(firmware)),
            "nic_latency_applied": None if nic is None else float(bool(nic)),
        }
        records = r.get("records") or [{}]
        for i, rec in enumerate(records):
            row = dict(common)
            row["point"] = i
            # the family a record probed (mtu's IPv6 row of an IPv4 case) over the case's
            row["ip"] = rec.get("family") or row["ip"]
            row["not_applicable"] = rec.get("not_applicable") or ""
            row["ok"] = bool(r.get("ok")) and bool(rec.get("ok", False))
            row["error"] = rec.get("error") or (r.get("error") if not r.get("ok") else None) or ""
            # a column the record's test declares is read from its source key; any other metric
            # column from the record key of the same name
            src = _sources(rec.get("test") or r["test"])
            for k, dtype in METRIC_COLUMNS:
                v = rec.get(src.get(k, k))
                row[k] = (v or "") if dtype == "string" else _num(v)
            files = rec.get("raw_files") or r.get("raw_files") or []
            row["raw_files"] = ";".join(files)
            if r.get("imported"):
                # lab import: a published figure's n and sd (not a CSV column; summarize reads it)
                row["imported"] = r["imported"]
            out.append(row)
    return out


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def to_csv(table: list[dict], columns: list[str]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for row in table:
        w.writerow([_cell(row.get(c)) for c in columns])
    return buf.getvalue()


def summarize(table: list[dict]) -> list[dict]:
    """n, mean, sd (sample), min, max per case (profile, impairment, test label, point) and metric.

    Only successful rows count; `failed` says how many repetitions of the case failed.
    """
    groups: dict[tuple, list[dict]] = {}
    for row in table:
        key = (row["profile"], row["impairment"], row["test_label"], row["point"])
        groups.setdefault(key, []).append(row)
    out = []
    for (profile, imp, label, point), rs in groups.items():
        good = [r for r in rs if r["ok"]]
        failed = len({r["rep"] for r in rs if not r["ok"]})
        first = rs[0]
        for m in SUMMARY_METRICS:
            vals = [r[m] for r in good if r.get(m) is not None]
            if not vals:
                continue
            n = len(vals)
            mean = sum(vals) / n
            sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else 0.0
            fig = imported_figure(good, m)
            if fig is not None:
                n, sd = fig["n"], fig["sd"]
            out.append(
                {
                    "profile": profile,
                    "impairment": imp,
                    "sweep_parameter": first["sweep_parameter"],
                    "sweep_value": first["sweep_value"],
                    "test": first["test"],
                    "test_label": label,
                    "point": point,
                    "rate_mbit": first.get("rate_mbit"),
                    "metric": m,
                    "n": n,
                    "failed": failed,
                    "mean": mean,
                    "sd": sd,
                    "min": min(vals) if fig is None or n == 1 else None,
                    "max": max(vals) if fig is None or n == 1 else None,
                }
            )
    return out


def imported_figure(rows_: list[dict], metric: str) -> dict | None:
    """{n, sd, source} of a figure `lab import` wrote (one row standing for n repetitions whose
    sd the source gives, None when it gives none), or None for measured rows."""
    if len(rows_) != 1:
        return None
    return (rows_[0].get("imported") or {}).get(metric)


SUMMARY_COLUMNS = [
    "profile",
    "impairment",
    "sweep_parameter",
    "sweep_value",
    "test",
    "test_label",
    "point",
    "rate_mbit",
    "metric",
    "n",
    "failed",
    "mean",
    "sd",
    "min",
    "max",
]


def write_tables(run: RunDir) -> tuple[list[dict], list[dict]]:
    """(Re)write results.csv and summary.csv from results.jsonl; returns (rows, summary)."""
    table = rows(run.name, run.load_results())
    summary = summarize(table)
    write_text_atomic(run.file("results.csv"), to_csv(table, COLUMN_NAMES))
    write_text_atomic(run.file("summary.csv"), to_csv(summary, SUMMARY_COLUMNS))
    return table, summary


def read_results_csv(path: Path):
    """results.csv as a pandas DataFrame with the documented dtypes."""
    import pandas as pd  # ~0.25 s: paid by readers of results.csv, not by every lab command

    dtypes = {n: ("string" if t == "string" else t) for n, t, _ in CSV_COLUMNS if t != "bool"}
    df = pd.read_csv(
        path, dtype={k: v for k, v in dtypes.items() if v != "int64"}, keep_default_na=True
    )
    for n, t, _ in CSV_COLUMNS:
        if t == "string":
            df[n] = df[n].fillna("").astype("string")
    return df
