"""BoardMonitor: lab.substrate.local.monitor.Monitor's readings, taken on boards over their SSH agent sessions.

The interface and summary are those of lab.substrate.local.monitor.Monitor (start() -> self, stop() -> summary,
.samples), so a run on boards stores the same monitor files as a run here. What differs is where
the numbers come from: each board is a machine of its own, so

- a node's CPU ("nodes" in samples and summary) is its board's busy time from the board's
  /proc/stat, summed over all cores, in % of one core (a whole 4-core Pi 4 busy is 400 %), with
  user and system shares; the local Monitor's cgroup of the node is, on a board, the board;
- a node's memory is its board's MemTotal - MemAvailable from /proc/meminfo;
- per VPN daemon: CPU % of one core from /proc/PID/stat (utime + stime), RSS from the same line;
  a PID whose start time changed is a different process and counts as gone;
- per board ("boards"), what the local Monitor reports for its host: busy and softirq % per core,
  clock (cpufreq scaling_cur_freq, MHz), temperature (/sys/class/thermal zones, deg C), memory,
  and the Raspberry Pi firmware's `vcgencmd measure_temp`, `measure_clock arm` and
  `get_throttled` (decoded into words, lab.core.hostreadings.THROTTLED_BITS);
- "host" merges the boards for readers of a local summary (report, plots, results.csv): cores
  named BOARD/cpuN, the hottest sensor of any board, throttled if any board was.

One sampling thread (lab.core.monitoring.MonitorBase's lifecycle). Each sample is ONE round trip
per board: the agent runs `sh -c READER` (lab.substrate.boards.readings; nothing installed on the
board), which reads every file in one process; `vcgencmd` (three process starts on the board) runs in that same round
trip only at start, at stop and every `vcgencmd_every` s. Rates use the board's own monotonic
clock, so SSH latency does not skew them. A reading a board does not have is null and explained
once per board in "unavailable" (e.g. "client: vcgencmd not on PATH"); nothing here raises
because a reading is missing or a board went away mid-test (that goes to "errors").
"""

from __future__ import annotations

import threading
import time
from typing import Any

from lab.core.errors import LabError
from lab.core.hostreadings import Daemon, core_rates, mean_max, min_mean_max, throttled_during
from lab.core.monitoring import MonitorBase
from lab.substrate.boards.node import BoardNode
from lab.substrate.boards.readings import (
    READER,
    parse_answer,
    parse_reader,
    parse_vcgencmd,
    throttled_words,
    zone_names,
)

INTERVAL_S = 1.0
#: seconds between vcgencmd readings within a test (plus one at start and one at stop)
VCGENCMD_EVERY_S = 10.0


class BoardMonitor(MonitorBase):
    """Sample every board of `nodes` ({node name: BoardNode}) every `interval` s between start()
    and stop(); `daemons` as in lab.info["vpn"]["daemons"] ({"node", "name", "pid",
    "start_time"}), each read on its node's board."""

    thread_name = "lab-board-monitor"
    join_timeout_s = 35.0  # a sample in flight waits for up to 30 s per board's answer

    def __init__(
        self,
        nodes: dict[str, BoardNode],
        daemons: list[dict] | None = None,
        interval: float = INTERVAL_S,
        *,
        vcgencmd_every: float = VCGENCMD_EVERY_S,
    ):
        super().__init__(interval, daemons)
        self.nodes = dict(nodes)
        self.vcgencmd_every = vcgencmd_every
        for d in self._daemons:
            if d.node not in self.nodes:
                self._note(f"daemon {d.label}: node {d.node!r} is not one of the monitored boards")
        self._lock = threading.Lock()  # one sample at a time (the thread, then stop())
        self._prev: dict[str, dict] = {}  # node -> its previous READER answer
        self._last_vc = 0.0
        self._vc: dict[str, dict[str, dict | None]] = {}  # node -> "start"/"end" -> readings
        self._rtt_ms: dict[str, list[float]] = {n: [] for n in self.nodes}
        #: node -> what its board's first answer said that does not change (clock tick, page
        #: size, governor, vcgencmd's path, cores, thermal zone -> sensor name)
        self._static: dict[str, dict] = {}

    # ------------------------------------------------------------------ reading
    def _read(self, node: str, vc: bool) -> dict | None:
        """One round trip: the READER's answer from `node`'s board, or None (error noted)."""
        keys = [d.key for d in self._daemons if d.node == node]
        probe = node not in self._static
        argv = ["sh", "-c", READER, "sh", "1" if vc else "0", "1" if probe else "0"]
        argv += [k.partition(":")[0] for k in keys]
        t = time.monotonic()
        try:
            cp = self.nodes[node].run(argv, timeout=30)
            raw = parse_answer(parse_reader(cp.stdout), keys)
        except (LabError, ValueError, IndexError) as e:
            self._note(f"{node}: {type(e).__name__}: {str(e)[:300]}")
            return None
        self._rtt_ms[node].append(1000.0 * (time.monotonic() - t))
        if probe:
            self._static[node] = {k: raw.get(k) for k in ("tck", "page", "gov", "vcgencmd")}
            self._static[node]["ncores"] = len(raw["stat"]) or None
            self._static[node]["zones"] = zone_names(raw.get("zone_types") or {})
            self._probe(node, raw)
        zones = self._static[node]["zones"]
        raw["temp"] = {zones.get(z, z): c for z, c in raw["temp"].items()}
        return raw

    def _probe(self, node: str, raw: dict) -> None:
        """Record once why a board lacks a reading (its first answer tells)."""
        board = self.nodes[node].conn.board.name
        why = {
            "clock": not raw["freq"]
            and "no cpufreq under /sys/devices/system/cpu/cpu*/cpufreq (no cpufreq driver, or "
            "a VM): the clock is read from vcgencmd only, if at all",
            "temperature": not raw["temp"]
            and "no /sys/class/thermal/thermal_zone*/temp: temperature from vcgencmd only, if at "
            "all",
            "memory": not raw["mem"].keys() >= {"MemTotal", "MemAvailable"}
            and "no MemTotal/MemAvailable in /proc/meminfo",
            "vcgencmd": not raw.get("vcgencmd")
            and "vcgencmd not on PATH (not a Raspberry Pi, or Raspberry Pi OS's raspi-utils "
            "missing): no firmware temperature, ARM clock or throttling flags",
        }
        for what, reason in why.items():
            if reason:
                self.unavailable[f"{node}/{what}"] = f"board {board}: {reason}"

    def _board_record(self, node: str, prev: dict, raw: dict) -> tuple[dict, dict]:
        """(the node's CPU and memory, the board's host-like readings) between two answers."""
        cores = core_rates(prev.get("stat") or {}, raw.get("stat") or {})
        n = len(cores) or 1
        mem = raw.get("mem") or {}
        memory = None
        if mem.keys() >= {"MemTotal", "MemAvailable"}:
            memory = {
                "total_bytes": mem["MemTotal"],
                "used_bytes": mem["MemTotal"] - mem["MemAvailable"],
                "available_bytes": mem["MemAvailable"],
            }
        node_rec = {
            "total": sum(c["busy_pct"] for c in cores.values()),
            "user": sum(c["user_pct"] for c in cores.values()),
            "system": sum(c["system_pct"] for c in cores.values()),
            "memory_bytes": memory["used_bytes"] if memory else None,
        }
        board = {
            "busy_pct": sum(c["busy_pct"] for c in cores.values()) / n,
            "softirq_pct": sum(c["softirq_pct"] for c in cores.values()) / n,
            "cores": cores,
            "clock_mhz": raw.get("freq") or None,
            "temperature_c": raw.get("temp") or None,
            "memory": memory,
        }
        return node_rec, board

    def _daemon_record(self, d: Daemon, prev: dict, raw: dict) -> dict:
        now = (raw.get("pids") or {}).get(d.key)
        if now is None:
            return {"alive": False}
        before = (prev.get("pids") or {}).get(d.key)
        dt = raw["t"] - prev.get("t", raw["t"])
        static = self._static[d.node]
        pct = None
        if before is not None and dt > 0:
            pct = 100.0 * (now[0] - before[0]) / static["tck"] / dt
        return {"alive": True, "cpu_pct": pct, "rss_bytes": now[1] * static["page"]}

    def sample(self, *, vcgencmd: bool = False) -> dict | None:
        """Read every board once (rates since the previous reading); the first call only
        primes. `vcgencmd`: also ask the firmware (else only every vcgencmd_every s)."""
        with self._lock:
            now = time.monotonic()
            if not self._t0:
                self._t0 = now
            vc = vcgencmd or (
                self.vcgencmd_every > 0 and now - self._last_vc >= self.vcgencmd_every
            )
            if vc:
                self._last_vc = now
            rec: dict[str, Any] = {"t": round(now - self._t0, 3), "nodes": {}, "boards": {},
                                   "daemons": {}}  # fmt: skip
            for node in self.nodes:
                raw = self._read(node, vc)
                prev = self._prev.get(node)
                if raw is None:
                    continue
                if prev is None:
                    self._probe(node, raw)
                if "vc" in raw:
                    readings, problems = parse_vcgencmd(raw["vc"])
                    for p in problems:
                        self._note(f"{node}: {p}")
                    first = self._vc.setdefault(node, {})
                    first.setdefault("start", readings or None)
                    first["last"] = readings or None
                self._prev[node] = raw
                if prev is None:
                    continue
                rec["nodes"][node], rec["boards"][node] = self._board_record(node, prev, raw)
                if "vc" in raw:
                    rec["boards"][node]["vcgencmd"] = self._vc[node]["last"]
                for d in self._daemons:
                    if d.node == node:
                        rec["daemons"][d.label] = self._daemon_record(d, prev, raw)
            if not rec["nodes"]:
                return None
            self.samples.append(rec)
            return rec

    # ------------------------------------------------------------------ lifecycle
    def _edge_sample(self) -> dict | None:
        """At start and at stop the firmware is asked too."""
        return self.sample(vcgencmd=True)

    def _at_stop(self) -> None:
        for readings in self._vc.values():
            readings["end"] = readings.get("last")

    # ------------------------------------------------------------------ summary
    def summary(self) -> dict:
        """lab.substrate.local.monitor.Monitor.summary()'s shape: "nodes", "host", "daemons", "unavailable",
        plus "boards" (per board what "host" is for a local run) and "agent_rtt_ms" (what one
        sample cost per board: median and max round trip)."""
        out = self._summary_head()
        out["boards"] = {}
        out["agent_rtt_ms"] = {n: _rtt(v) for n, v in self._rtt_ms.items()}
        for n in self.nodes:
            out["nodes"][n] = self._node_summary(n)
            out["boards"][n] = self._board_summary(n)
        out["host"] = _merge_boards(out["boards"])
        out["daemons"] = self._daemon_summaries()
        return out

    def _board_summary(self, node: str) -> dict:
        xs = [x["boards"][node] for x in self.samples if node in x["boards"]]
        static = self._static.get(node) or {}
        out: dict[str, Any] = {
            "board": self.nodes[node].conn.board.name,
            "ncores": static.get("ncores"),
            "governor": static.get("gov") or None,
            "busy_pct": mean_max([x["busy_pct"] for x in xs]),
            "softirq_pct": mean_max([x["softirq_pct"] for x in xs]),
            "cores": {},
            "clock_mhz": None,
            "temperature_c": None,
            "memory": None,
        }
        if xs:
            names = sorted(xs[-1]["cores"], key=lambda c: int(c[3:]))
            out["cores"] = {
                c: {
                    k: mean_max([x["cores"].get(c, {}).get(k) for x in xs])["mean"]
                    for k in ("busy_pct", "softirq_pct")
                }
                for c in names
            }
        clocks: dict[str, list[float]] = {}
        temps: dict[str, list[float]] = {}
        for x in xs:
            for c, mhz in (x.get("clock_mhz") or {}).items():
                clocks.setdefault(c, []).append(mhz)
            for k, v in (x.get("temperature_c") or {}).items():
                temps.setdefault(k, []).append(v)
            vc = x.get("vcgencmd") or {}
            if vc.get("temperature_c") is not None:
                temps.setdefault("vcgencmd", []).append(vc["temperature_c"])
            if vc.get("arm_clock_mhz") is not None:
                clocks.setdefault("arm (vcgencmd)", []).append(vc["arm_clock_mhz"])
        if clocks:
            cpufreq = [v for c, vs in clocks.items() if c.startswith("cpu") for v in vs]
            out["clock_mhz"] = {"cores": {c: min_mean_max(v) for c, v in clocks.items()},
                                **min_mean_max(cpufreq or [v for vs in clocks.values() for v in vs])}  # fmt: skip
        if temps:
            sensors = {k: mean_max(v) for k, v in temps.items()}
            out["temperature_c"] = {"sensors": sensors,
                                    "max": max(v["max"] for v in sensors.values())}  # fmt: skip
        mems = [x["memory"] for x in xs if x.get("memory")]
        if mems:
            used = [m["used_bytes"] for m in mems]
            out["memory"] = {
                "total_bytes": mems[-1]["total_bytes"],
                "used_bytes": {"mean": sum(used) / len(used), "max": max(used)},
                "available_bytes_min": min(m["available_bytes"] for m in mems),
            }
        if node in self._vc:
            start, end = self._vc[node].get("start"), self._vc[node].get("end")
            t_start, t_end = (start or {}).get("throttled"), (end or {}).get("throttled")
            out["vcgencmd"] = {
                "start": start,
                "end": end,
                "throttled": throttled_during(t_start, t_end),
                "words": sorted(set(throttled_words(t_start)) | set(throttled_words(t_end))),
            }
        return out


def _rtt(values: list[float]) -> dict:
    if not values:
        return {"median": None, "max": None, "n": 0}
    v = sorted(values)
    return {"median": v[len(v) // 2], "max": v[-1], "n": len(v)}


def _merge_boards(boards: dict[str, dict]) -> dict:
    """The boards as one "host" for readers of a local summary: every board's cores (named
    BOARD/cpuN), the hottest sensor anywhere, throttled when any board was."""
    cores = {f"{n}/{c}": v for n, b in boards.items() for c, v in (b.get("cores") or {}).items()}
    total = sum(b.get("ncores") or 0 for b in boards.values()) or None

    def weighted(key: str) -> dict:
        parts = [
            (b[key], b.get("ncores") or 1) for b in boards.values() if b[key]["mean"] is not None
        ]
        if not parts:
            return {"mean": None, "max": None}
        w = sum(c for _, c in parts)
        return {"mean": sum(p["mean"] * c for p, c in parts) / w,
                "max": max(p["max"] for p, _ in parts)}  # fmt: skip

    sensors = {
        f"{n}/{k}": v
        for n, b in boards.items()
        for k, v in ((b.get("temperature_c") or {}).get("sensors") or {}).items()
    }
    clock_cores = {
        f"{n}/{c}": v
        for n, b in boards.items()
        for c, v in ((b.get("clock_mhz") or {}).get("cores") or {}).items()
    }
    out: dict[str, Any] = {
        "busy_pct": weighted("busy_pct"),
        "softirq_pct": weighted("softirq_pct"),
        "cores": cores,
        "ncores": total,
        "clock_mhz": {
            "cores": clock_cores,
            **min_mean_max([v["mean"] for c, v in clock_cores.items() if "/cpu" in c]),
        }
        if clock_cores
        else None,  # fmt: skip
        "temperature_c": {"sensors": sensors, "max": max(v["max"] for v in sensors.values())}
        if sensors
        else None,
        "memory": None,  # per board, in "boards"
    }
    vcs = [b["vcgencmd"] for b in boards.values() if "vcgencmd" in b]
    if vcs:
        flags = [v["throttled"] for v in vcs if v["throttled"] is not None]
        out["vcgencmd"] = {
            "throttled": any(flags) if flags else None,
            "boards": {n: b["vcgencmd"] for n, b in boards.items() if "vcgencmd" in b},
        }
    return out
