"""Resource monitors sampled in a background thread while a test runs.

Sources, each labelled with what it measures:
- per node: the node's cgroup CPU time (lab.core.cgroups.usage) -> % of one host core, user/system;
  everything the lab started in the node is in that cgroup (tools and userspace VPN daemons).
  Kernel work done in softirq (kernel WireGuard, XFRM, forwarding) is charged to whichever
  task was interrupted and mostly escapes it: the host-wide softirq share shows it.
- per node, the scheduler's view: CFS periods and time in which the node's groups (its own
  and its per-board-core groups) were throttled (cpu.stat; null for a node without a quota,
  whose counters stay 0; results.csv's `throttled` and `throttled_periods`), and how long its
  threads ran and waited on a run queue while runnable (/proc/TID/schedstat; a thread of a
  throttled group counts as waiting). Waiting far beyond the throttled time means this machine's other work
  held the node back, not its board's cores (docs/fidelity.md, "UDP at 400 Mbit/s and ping
  RTT"); a thread that exits loses its last interval.
- per node memory: the group's memory.current (v2) / memory.usage_in_bytes (v1) *only where
  that file exists*. lab.core.cgroups creates cpu, cpuacct and cpuset groups only (v2: it delegates
  just cpu and cpuset), so normally there is none: the monitor never creates memory cgroups,
  records null and says why once (summary "unavailable"). The VPN daemons' RSS is below.
- host-wide: per-core busy % and softirq % from /proc/stat (proc(5)); shared with everything
  else running on this machine.
- host clock: per core, cpufreq's scaling_cur_freq (else cpuinfo_cur_freq) from
  /sys/devices/system/cpu/cpuN/cpufreq, in MHz. Read per core from sysfs rather than with
  psutil.cpu_freq(percpu=True): psutil lists one entry per cpufreq *policy* (one for all four
  cores of a Pi 4) and, without cpufreq, falls back to /proc/cpuinfo's "cpu MHz", which in a VM
  is a static nominal figure, not a clock reading. On a Raspberry Pi the firmware can cap the
  ARM clock without cpufreq knowing (raspberrypi/linux#2986): the vcgencmd readings below are
  the authority there.
- host temperature: every sensor psutil.sensors_temperatures() reports (hwmon), else every
  /sys/class/thermal/thermal_zone*/temp, in deg C.
- host memory: psutil.virtual_memory() total/used/available (used as free(1) counts it).
- Raspberry Pi firmware, when `vcgencmd` is on PATH: `vcgencmd get_throttled` (flags) and
  `vcgencmd measure_clock arm` at the start and at the end of the test (not per sample: each is
  a process start on the board under test).
- per VPN daemon (PIDs from lab.info["vpn"]["daemons"]): CPU % of one core and resident memory,
  via psutil.
A sample's CPU figures are rates over the interval since the previous sample; clock,
temperature and memory are instantaneous readings at the sample.

A source this machine does not have (a VM has no cpufreq and no thermal sensors) is probed once
at start(): its values are null and the reason is recorded once in the summary's
"unavailable" (not an error per sample). Nothing here raises because a source is missing.

The readers and parsers of each source are lab.core.hostreadings; the lifecycle (start, the
sampling thread, stop) and the summary's shape are lab.core.monitoring.MonitorBase's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lab.core import cgroups, proc
from lab.core.errors import LabError
from lab.core.hostreadings import (
    SYS_CPU,
    SYS_THERMAL,
    core_rates,
    cpu_index,
    mean_max,
    min_mean_max,
    node_memory_bytes,
    node_thread_sched,
    node_throttling,
    node_uncapped,
    parse_measure_clock,
    parse_throttled,
    psutil_sensors,
    read_cpu_freq,
    read_host_memory,
    read_proc_stat,
    read_temperatures,
    throttled_during,
)
from lab.core.monitoring import MonitorBase
from lab.vpn.record import daemons_of

INTERVAL_S = 0.5


class Monitor(MonitorBase):
    """Sample CPU, clock, temperature and memory every `interval` s between start() and stop().

    sys_cpu, sys_thermal and temp_sensors (None: thermal zones only) are where the clock and
    temperature come from; vcgencmd=False skips the Raspberry Pi firmware readings; `proc` is
    where threads' schedstat is read. Tests point them at fake trees.
    """

    def __init__(
        self,
        layout: cgroups.CgroupLayout | None,
        node_groups: dict[str, str],  # node -> cgroup rel
        daemons: list[dict] | None = None,
        interval: float = INTERVAL_S,
        *,
        sys_cpu: Path = SYS_CPU,
        sys_thermal: Path = SYS_THERMAL,
        temp_sensors: Callable[[], dict] | None = psutil_sensors,
        vcgencmd: bool = True,
        proc: Path = Path("/proc"),
    ) -> None:
        super().__init__(interval, daemons)
        self.layout = layout
        self.node_groups = node_groups
        self.sys_cpu = sys_cpu
        self.sys_thermal = sys_thermal
        self.temp_sensors = temp_sensors
        self.vcgencmd = vcgencmd
        self.proc = proc
        self._prev_nodes: dict[str, dict[str, float]] = {}
        self._prev_sched: dict[str, tuple[tuple[int, int] | None, dict[int, tuple[int, int]]]] = {}
        self._prev_stat: dict[str, list[int]] = {}
        self._prev_t = 0.0
        self._probed = False
        self._have: set[str] = set()  # sources found by _probe
        self._vc_path: str | None = None
        self._vc: dict[str, dict | None] = {}  # "start"/"end" -> vcgencmd readings
        self._mem_total: int | None = None
        #: nodes whose groups have no CPU quota: no throttling to record (null, not 0)
        self._uncapped: set[str] = set()

    @classmethod
    def for_lab(cls, lab, *, interval: float = INTERVAL_S) -> Monitor:
        groups = {n: rt.cgroup for n, rt in lab.runtime.items() if rt.kind == "host"}
        daemons = [d.to_dict() for d in daemons_of(lab)]
        return cls(lab.cg, groups, daemons, interval)

    # ------------------------------------------------------------------ probing
    def _probe(self) -> None:
        """Find out once which optional sources this machine has; record why the others not."""
        self._probed = True
        if read_cpu_freq(self.sys_cpu):
            self._have.add("clock")
        else:
            self.unavailable["clock"] = (
                f"no cpufreq under {self.sys_cpu}/cpu*/cpufreq (a VM, or no cpufreq driver): "
                "the clock is not recorded"
            )
        temps, problem = read_temperatures(self.sys_thermal, self.temp_sensors)
        if temps:
            self._have.add("temperature")
        else:
            self.unavailable["temperature"] = (
                "no temperature sensor (psutil.sensors_temperatures() and "
                f"{self.sys_thermal}/thermal_zone*/temp report none)"
                + (f"; {problem}" if problem else "")
            )
        try:
            self._mem_total = read_host_memory()["total_bytes"]
            self._have.add("memory")
        except Exception as e:  # noqa: BLE001 -- never take the test down
            self.unavailable["memory"] = f"psutil.virtual_memory(): {type(e).__name__}: {e}"
        if self.layout is not None:
            self._uncapped = {
                n for n, rel in self.node_groups.items() if node_uncapped(self.layout, rel)
            }
        if self.node_groups:
            if self.layout is not None and any(
                node_memory_bytes(self.layout, rel) is not None for rel in self.node_groups.values()
            ):
                self._have.add("node_memory")
            else:
                self.unavailable["node_memory"] = (
                    "the nodes' cgroups have no memory controller (lab.core.cgroups makes cpu, "
                    "cpuacct and cpuset groups only): per-node memory is not recorded, the "
                    "VPN daemons' RSS is"
                )
        if self.vcgencmd:
            self._vc_path = proc.which("vcgencmd")
            if self._vc_path is None:
                self.unavailable["vcgencmd"] = (
                    "vcgencmd not on PATH (not a Raspberry Pi): no firmware throttling flags"
                )

    def _read_vcgencmd(self) -> dict | None:
        """get_throttled flags and the ARM clock from the Pi firmware; None when both fail."""
        if self._vc_path is None:
            return None
        out: dict[str, Any] = {}
        for args, parse in (
            (["get_throttled"], parse_throttled),
            (["measure_clock", "arm"], parse_measure_clock),
        ):
            try:
                cp = proc.run([self._vc_path, *args], timeout=10)
                value = parse(cp.stdout)
            except (LabError, OSError, ValueError) as e:
                self._note(f"vcgencmd {' '.join(args)}: {e}")
                continue
            if isinstance(value, dict):
                out.update(value)
            else:
                out["arm_clock_mhz"] = value
        return out or None

    # ------------------------------------------------------------------ sampling
    def _read_nodes(self) -> dict[str, dict[str, float]]:
        out = {}
        if self.layout is None:
            return out
        for node, rel in self.node_groups.items():
            try:
                out[node] = cgroups.usage(self.layout, rel)
            except (OSError, KeyError, ValueError) as e:
                self._note(f"cgroup {rel}: {e}")
        return out

    def _read_sched(self) -> dict[str, tuple[tuple[int, int] | None, dict[int, tuple[int, int]]]]:
        """Per node: ((throttled periods, ns) so far, {tid: (ns run, ns waited)})."""
        if self.layout is None:
            return {}
        return {
            n: (
                None if n in self._uncapped else node_throttling(self.layout, rel),
                node_thread_sched(self.layout, rel, self.proc),
            )
            for n, rel in self.node_groups.items()
        }

    def _read_daemons(self, dt: float) -> dict[str, dict]:
        import psutil  # ~60 ms: paid by a run that monitors, not by every lab command

        out = {}
        for d in self._daemons:
            label = d.label
            if not proc.is_same_process(d.pid, d.start_time):
                out[label] = {"alive": False}
                continue
            try:
                if d.handle is None:
                    d.handle = psutil.Process(d.pid)
                with d.handle.oneshot():
                    t = d.handle.cpu_times()
                    cpu = t.user + t.system
                    rss = d.handle.memory_info().rss
                pct = None
                if d.last_cpu is not None and dt > 0:
                    pct = 100.0 * (cpu - d.last_cpu) / dt
                d.last_cpu = cpu
                out[label] = {"alive": True, "cpu_pct": pct, "rss_bytes": rss}
            except (psutil.Error, OSError) as e:
                out[label] = {"alive": False}
                self._note(f"daemon {label}: {e}")
        return out

    def _read_host_extras(self) -> dict[str, Any]:
        """Clock, temperature and memory now; None for a source this machine does not have."""
        out: dict[str, Any] = {"clock_mhz": None, "temperature_c": None, "memory": None}
        if "clock" in self._have:
            out["clock_mhz"] = read_cpu_freq(self.sys_cpu) or None
        if "temperature" in self._have:
            temps, problem = read_temperatures(self.sys_thermal, self.temp_sensors)
            if problem:
                self._note(problem)
            out["temperature_c"] = temps or None
        if "memory" in self._have:
            try:
                out["memory"] = read_host_memory()
            except Exception as e:  # noqa: BLE001 -- as in _loop
                self._note(f"psutil.virtual_memory(): {type(e).__name__}: {e}")
        return out

    def _read_node_memory(self) -> dict[str, int | None]:
        if "node_memory" not in self._have or self.layout is None:
            return dict.fromkeys(self.node_groups)
        return {n: node_memory_bytes(self.layout, rel) for n, rel in self.node_groups.items()}

    def sample(self) -> dict | None:
        """Take one sample (rates since the previous one); the first call only primes."""
        if not self._probed:
            self._probe()
        now = time.monotonic()
        nodes = self._read_nodes()
        sched = self._read_sched()
        try:
            stat = read_proc_stat()
        except OSError as e:
            self._note(f"/proc/stat: {e}")
            stat = {}
        dt = now - self._prev_t if self._prev_t else 0.0
        daemons = self._read_daemons(dt)
        rec = None
        if self._prev_t and dt > 0.05:
            node_rates: dict[str, dict] = {}
            for n, u in nodes.items():
                p = self._prev_nodes.get(n)
                if p is None:
                    continue
                node_rates[n] = {k: 100.0 * (u[k] - p[k]) / dt for k in ("total", "user", "system")}
            for n, mem in self._read_node_memory().items():
                node_rates.setdefault(n, {})["memory_bytes"] = mem
            for n, (thr, threads) in sched.items():
                prev_thr, prev_threads = self._prev_sched.get(n, (None, {}))
                both = threads.keys() & prev_threads.keys()  # threads alive at both samples
                known = thr is not None and prev_thr is not None
                node_rates.setdefault(n, {}).update(
                    throttled_periods=thr[0] - prev_thr[0] if known else None,
                    throttled_s=(thr[1] - prev_thr[1]) / 1e9 if known else None,
                    run_s=sum(threads[t][0] - prev_threads[t][0] for t in both) / 1e9,
                    runq_wait_s=sum(threads[t][1] - prev_threads[t][1] for t in both) / 1e9,
                )
            cores = core_rates(self._prev_stat, stat)
            ncores = len(cores) or 1
            rec = {
                "t": round(now - self._t0, 3),
                "nodes": node_rates,
                "host": {
                    "busy_pct": sum(c["busy_pct"] for c in cores.values()) / ncores,
                    "softirq_pct": sum(c["softirq_pct"] for c in cores.values()) / ncores,
                    "cores": cores,
                    **self._read_host_extras(),
                },
                "daemons": daemons,
            }
            self.samples.append(rec)
        self._prev_nodes, self._prev_stat, self._prev_t = nodes, stat, now
        self._prev_sched = sched
        return rec

    def _at_start(self) -> None:
        self._probe()
        self._vc["start"] = self._read_vcgencmd()

    def _at_stop(self) -> None:
        if "start" in self._vc:
            self._vc["end"] = self._read_vcgencmd()

    # ------------------------------------------------------------------ summary
    def summary(self) -> dict:
        """Mean and max of every series (time-weighted by equal intervals).

        Clock: min/mean/max per core and over all cores; temperature: mean/max per sensor and
        the overall max; memory: host peak used / lowest available, per node peak. A source
        this machine lacks is null there and explained once in "unavailable".
        """
        s = self.samples
        out = self._summary_head()
        if self._vc_path is not None:
            start, end = self._vc.get("start"), self._vc.get("end")
            out["host"]["vcgencmd"] = {
                "start": start,
                "end": end,
                "throttled": throttled_during(start, end),
            }
        if not s:
            return out

        for n in self.node_groups:
            out["nodes"][n] = self._node_summary(n)
            out["nodes"][n].update(_sched_summary([x["nodes"].get(n, {}) for x in s]))
        out["host"].update(
            {
                "busy_pct": mean_max([x["host"]["busy_pct"] for x in s]),
                "softirq_pct": mean_max([x["host"]["softirq_pct"] for x in s]),
                "cores": {
                    c: {
                        k: mean_max([x["host"]["cores"].get(c, {}).get(k) for x in s])["mean"]
                        for k in ("busy_pct", "softirq_pct")
                    }
                    for c in sorted(s[-1]["host"]["cores"], key=lambda c: int(c[3:]))
                },
                "ncores": os.cpu_count(),
                "clock_mhz": _clock_summary(s),
                "temperature_c": _temperature_summary(s),
                "memory": _memory_summary(s, self._mem_total),
            }
        )
        out["daemons"] = self._daemon_summaries()
        return out


#: a node's threads held back by this machine: they waited on a run queue longer than they ran
#: (so ran at under half speed), throttling explains at most 1/HOST_HELD_THROTTLE_SHARE of that
#: wait, and they ran at least HOST_HELD_MIN_RUN_S (an idle node's few wake-ups say nothing)
HOST_HELD_THROTTLE_SHARE = 10
HOST_HELD_MIN_RUN_S = 0.05


def host_held_nodes(summary: dict) -> list[str]:
    """The nodes of one test's monitor summary that this machine's other work held back (see
    HOST_HELD_THROTTLE_SHARE); [] when none, or when the summary has no scheduler readings."""
    held = []
    for node, v in (summary.get("nodes") or {}).items():
        rq = v.get("run_queue") or {}
        run, wait = rq.get("run_s") or 0.0, rq.get("wait_s") or 0.0
        throttled = v.get("throttled_s") or 0.0
        if (
            run >= HOST_HELD_MIN_RUN_S
            and wait > run
            and throttled * HOST_HELD_THROTTLE_SHARE < wait
        ):
            held.append(node)
    return held


def host_contention_warning(results: list[dict]) -> str | None:
    """The report's warning when tests ran with nodes held back by this machine, else None."""
    hit = [r for r in results if host_held_nodes(r.get("monitor") or {})]
    if not hit:
        return None
    return (
        f"{len(hit)} of {len(results)} tests ran with node threads waiting for this machine's "
        "CPUs longer than they ran, their CPU caps barely throttled (monitor: nodes.<node>."
        "run_queue, throttled_s): those figures reflect this machine's load, not the board; "
        're-run on an idle machine (docs/fidelity.md, "UDP at 400 Mbit/s and ping RTT").'
    )


def _sched_summary(xs: list[dict]) -> dict:
    """A node's throttling and its threads' run and run-queue wait over the test."""
    thr = [x["throttled_periods"] for x in xs if x.get("throttled_periods") is not None]
    thr_s = [x["throttled_s"] for x in xs if x.get("throttled_s") is not None]
    run = sum(x.get("run_s") or 0.0 for x in xs)
    wait = sum(x.get("runq_wait_s") or 0.0 for x in xs)
    return {
        "throttled_periods": sum(thr) if thr else None,
        "throttled_s": round(sum(thr_s), 6) if thr_s else None,
        "run_queue": {
            "run_s": round(run, 6),
            "wait_s": round(wait, 6),
            "wait_per_run": round(wait / run, 4) if run > 0 else None,
        },
    }


def _clock_summary(samples: list[dict]) -> dict | None:
    """{"cores": {cpuN: {min, mean, max}}, "min", "mean", "max"} in MHz; None without readings."""
    per: dict[str, list[float]] = {}
    for x in samples:
        for c, mhz in (x["host"].get("clock_mhz") or {}).items():
            per.setdefault(c, []).append(mhz)
    if not per:
        return None
    cores = {c: min_mean_max(per[c]) for c in sorted(per, key=lambda c: cpu_index(c) or 0)}
    return {"cores": cores, **min_mean_max([v for vs in per.values() for v in vs])}


def _temperature_summary(samples: list[dict]) -> dict | None:
    """{"sensors": {name: {mean, max}}, "max"} in deg C; None without readings."""
    per: dict[str, list[float]] = {}
    for x in samples:
        for name, c in (x["host"].get("temperature_c") or {}).items():
            per.setdefault(name, []).append(c)
    if not per:
        return None
    sensors = {k: {"mean": sum(v) / len(v), "max": max(v)} for k, v in per.items()}
    return {"sensors": sensors, "max": max(v["max"] for v in sensors.values())}


def _memory_summary(samples: list[dict], total: int | None) -> dict | None:
    """Host memory over the test in bytes: total, used {mean, max}, available_min."""
    mem = [x["host"].get("memory") for x in samples]
    mem = [m for m in mem if m]
    if not mem:
        return None
    used = [m["used_bytes"] for m in mem]
    return {
        "total_bytes": mem[-1].get("total_bytes") or total,
        "used_bytes": {"mean": sum(used) / len(used), "max": max(used)},
        "available_bytes_min": min(m["available_bytes"] for m in mem),
    }
