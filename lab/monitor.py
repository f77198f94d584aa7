"""Resource monitors sampled in a background thread while a test runs.

Three sources, each labelled with what it measures:
- per node: the node's cgroup CPU time (lab.cgroups.usage) -> % of one host core, user/system;
  everything the lab started in the node is in that cgroup (tools and userspace VPN daemons).
  Kernel work done in softirq (kernel WireGuard, XFRM, forwarding) is charged to whichever
  task was interrupted and mostly escapes it: the host-wide softirq share shows it.
- host-wide: per-core busy % and softirq % from /proc/stat (proc(5)); shared with everything
  else running on this machine.
- per VPN daemon (PIDs from lab.info["vpn"]["daemons"]): CPU % of one core and resident memory,
  via psutil.
A sample's CPU figures are rates over the interval since the previous sample.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Self

from . import cgroups, proc

INTERVAL_S = 0.5


def read_proc_stat(path: str = "/proc/stat") -> dict[str, list[int]]:
    """cpuN -> [user, nice, system, idle, iowait, irq, softirq, steal] in clock ticks."""
    out = {}
    with open(path) as f:
        for line in f:
            if line.startswith("cpu") and line[3:4].isdigit():
                parts = line.split()
                out[parts[0]] = [int(x) for x in parts[1:9]]
    return out


def core_rates(prev: dict[str, list[int]], cur: dict[str, list[int]]) -> dict[str, dict]:
    """Per core: busy % and softirq % of the interval between two /proc/stat readings."""
    rates = {}
    for cpu, now in cur.items():
        before = prev.get(cpu)
        if before is None:
            continue
        d = [a - b for a, b in zip(now, before, strict=True)]
        total = sum(d)
        if total <= 0:
            continue
        idle = d[3] + d[4]
        rates[cpu] = {
            "busy_pct": 100.0 * (total - idle) / total,
            "softirq_pct": 100.0 * d[6] / total,
            "system_pct": 100.0 * d[2] / total,
            "user_pct": 100.0 * (d[0] + d[1]) / total,
        }
    return rates


@dataclass
class _Daemon:
    node: str
    name: str
    pid: int
    start_time: int | None
    handle: Any = None  # psutil.Process
    last_cpu: float | None = None


@dataclass
class Monitor:
    """Sample CPU and memory every `interval` seconds between start() and stop()."""

    layout: cgroups.CgroupLayout | None
    node_groups: dict[str, str]  # node -> cgroup rel
    daemons: list[dict] = field(default_factory=list)
    interval: float = INTERVAL_S
    samples: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._prev_nodes: dict[str, dict[str, float]] = {}
        self._prev_stat: dict[str, list[int]] = {}
        self._prev_t = 0.0
        self._t0 = 0.0
        self._daemons = [
            _Daemon(d["node"], d["name"], d["pid"], d.get("start_time")) for d in self.daemons
        ]

    @classmethod
    def for_lab(cls, lab, *, interval: float = INTERVAL_S) -> Monitor:
        groups = {n: rt.cgroup for n, rt in lab.runtime.items() if rt.kind == "host"}
        daemons = (lab.info.get("vpn") or {}).get("daemons") or []
        return cls(lab.cg, groups, daemons, interval)

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

    def _note(self, msg: str) -> None:
        if msg not in self.errors and len(self.errors) < 20:
            self.errors.append(msg)

    def _read_daemons(self, dt: float) -> dict[str, dict]:
        import psutil

        out = {}
        for d in self._daemons:
            label = f"{d.node}/{d.name}"
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

    def sample(self) -> dict | None:
        """Take one sample (rates since the previous one); the first call only primes."""
        now = time.monotonic()
        nodes = self._read_nodes()
        try:
            stat = read_proc_stat()
        except OSError as e:
            self._note(f"/proc/stat: {e}")
            stat = {}
        dt = now - self._prev_t if self._prev_t else 0.0
        daemons = self._read_daemons(dt)
        rec = None
        if self._prev_t and dt > 0.05:
            node_rates = {}
            for n, u in nodes.items():
                p = self._prev_nodes.get(n)
                if p is None:
                    continue
                node_rates[n] = {k: 100.0 * (u[k] - p[k]) / dt for k in ("total", "user", "system")}
            cores = core_rates(self._prev_stat, stat)
            ncores = len(cores) or 1
            rec = {
                "t": round(now - self._t0, 3),
                "nodes": node_rates,
                "host": {
                    "busy_pct": sum(c["busy_pct"] for c in cores.values()) / ncores,
                    "softirq_pct": sum(c["softirq_pct"] for c in cores.values()) / ncores,
                    "cores": cores,
                },
                "daemons": daemons,
            }
            self.samples.append(rec)
        self._prev_nodes, self._prev_stat, self._prev_t = nodes, stat, now
        return rec

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except Exception as e:  # noqa: BLE001 -- a monitor must never take the test down
                self._note(f"{type(e).__name__}: {e}")

    def start(self) -> Monitor:
        self._t0 = time.monotonic()
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="lab-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict:
        """Stop sampling (at once: the thread waits on an Event) and return the summary."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.sample()  # the tail since the last tick
        except Exception as e:  # noqa: BLE001 -- as in _loop
            self._note(f"{type(e).__name__}: {e}")
        return self.summary()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        if not self._stop.is_set():
            self.stop()

    # ------------------------------------------------------------------ summary
    def summary(self) -> dict:
        """Mean and max of every series (time-weighted by equal intervals)."""
        s = self.samples
        out: dict[str, Any] = {
            "interval_s": self.interval,
            "samples": len(s),
            "nodes": {},
            "host": {},
            "daemons": {},
        }
        if self.errors:
            out["errors"] = list(self.errors)
        if not s:
            return out

        def stats(values: list[float]) -> dict:
            values = [v for v in values if v is not None]
            if not values:
                return {"mean": None, "max": None}
            return {"mean": sum(values) / len(values), "max": max(values)}

        for n in self.node_groups:
            out["nodes"][n] = {
                k: stats([x["nodes"].get(n, {}).get(k) for x in s])
                for k in ("total", "user", "system")
            }
        out["host"] = {
            "busy_pct": stats([x["host"]["busy_pct"] for x in s]),
            "softirq_pct": stats([x["host"]["softirq_pct"] for x in s]),
            "cores": {
                c: {
                    k: stats([x["host"]["cores"].get(c, {}).get(k) for x in s])["mean"]
                    for k in ("busy_pct", "softirq_pct")
                }
                for c in sorted(s[-1]["host"]["cores"], key=lambda c: int(c[3:]))
            },
            "ncores": os.cpu_count(),
        }
        for d in self._daemons:
            label = f"{d.node}/{d.name}"
            xs = [x["daemons"].get(label, {}) for x in s]
            out["daemons"][label] = {
                "cpu_pct": stats([x.get("cpu_pct") for x in xs]),
                "rss_bytes_max": max((x.get("rss_bytes") or 0 for x in xs), default=0) or None,
                "alive_throughout": all(x.get("alive", False) for x in xs),
            }
        return out
