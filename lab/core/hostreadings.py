"""One reading of each source lab.substrate.local.monitor samples (its docstring lists them and what each
measures): /proc/stat, cpufreq, thermal zones and psutil sensors, host and cgroup memory, and the
Raspberry Pi firmware's `vcgencmd` answers. Readers of given paths, parsers of given text; the
summary statistics and the watched-daemon record both monitors (lab.substrate.local.monitor on this machine,
lab.substrate.boards.monitor on boards) share.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.core import cgroups

SYS_CPU = Path("/sys/devices/system/cpu")
SYS_THERMAL = Path("/sys/class/thermal")


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


def cpu_index(name: str) -> int | None:
    """ "cpu3" -> 3; None for a name that is not a CPU's."""
    return int(name[3:]) if name.startswith("cpu") and name[3:].isdigit() else None


def read_cpu_freq(root: Path = SYS_CPU) -> dict[str, float]:
    """cpuN -> current clock in MHz (cpufreq, kHz in sysfs); {} without cpufreq.

    A core whose files cannot be read (offline, no cpufreq) is left out.
    """
    out: dict[str, float] = {}
    try:
        dirs = [d for d in root.iterdir() if cpu_index(d.name) is not None]
    except OSError:
        return out
    for d in sorted(dirs, key=lambda d: cpu_index(d.name) or 0):
        for name in ("scaling_cur_freq", "cpuinfo_cur_freq"):
            try:
                khz = int((d / "cpufreq" / name).read_text().strip())
            except (OSError, ValueError):
                continue
            if khz > 0:
                out[d.name] = khz / 1000.0
                break
    return out


def read_thermal_zones(root: Path = SYS_THERMAL) -> dict[str, float]:
    """Zone type (thermal_zoneN when it has none) -> deg C, from thermal_zone*/temp (milli-deg C).

    A zone that cannot be read (some return EINVAL/ENODATA while their sensor is off) is left
    out; a repeated type is told apart by its zone name ("acpitz/thermal_zone1").
    """
    out: dict[str, float] = {}
    try:
        zones = [z for z in root.iterdir() if z.name.startswith("thermal_zone")]
    except OSError:
        return out
    for z in sorted(zones, key=lambda z: int(z.name[12:]) if z.name[12:].isdigit() else 0):
        try:
            milli = int((z / "temp").read_text().strip())
        except (OSError, ValueError):
            continue
        try:
            kind = (z / "type").read_text().strip() or z.name
        except OSError:
            kind = z.name
        key = kind if kind not in out else f"{kind}/{z.name}"
        out[key] = milli / 1000.0
    return out


def flatten_sensors(sensors: dict[str, list]) -> dict[str, float]:
    """psutil.sensors_temperatures() -> "chip" or "chip/label" -> deg C (finite readings only)."""
    out: dict[str, float] = {}
    for chip, entries in sensors.items():
        for e in entries:
            cur = getattr(e, "current", None)
            if not isinstance(cur, int | float) or not math.isfinite(cur):
                continue
            label = (getattr(e, "label", "") or "").strip()
            key = f"{chip}/{label}" if label else chip
            base, n = key, 2
            while key in out:
                key, n = f"{base}#{n}", n + 1
            out[key] = float(cur)
    return out


def psutil_sensors() -> dict[str, list]:
    """psutil.sensors_temperatures() ({} where psutil has none): read_temperatures' default."""
    import psutil  # ~60 ms: only where a monitor reads, not on every import of this module

    fn = getattr(psutil, "sensors_temperatures", None)  # absent on some platforms
    return fn() if fn is not None else {}


def read_temperatures(
    thermal_root: Path = SYS_THERMAL, sensors: Callable[[], dict] | None = psutil_sensors
) -> tuple[dict[str, float], str | None]:
    """(sensor -> deg C, why psutil failed or None): psutil's sensors, else the thermal zones."""
    problem = None
    if sensors is not None:
        try:
            found = flatten_sensors(sensors() or {})
        except Exception as e:  # noqa: BLE001 -- psutil raises assorted errors on odd sysfs
            found, problem = {}, f"psutil.sensors_temperatures(): {type(e).__name__}: {e}"
        if found:
            return found, None
    return read_thermal_zones(thermal_root), problem


def read_host_memory() -> dict[str, int]:
    """Host memory in bytes: total, used (as free(1) counts it), available (psutil)."""
    import psutil  # ~60 ms: only where a monitor reads, not on every import of this module

    vm = psutil.virtual_memory()
    return {"total_bytes": vm.total, "used_bytes": vm.used, "available_bytes": vm.available}


def node_memory_bytes(layout: cgroups.CgroupLayout, rel: str) -> int | None:
    """Memory charged to the group, when it has the memory controller; None otherwise.

    v2: <root>/<rel>/memory.current (present only where memory is enabled for the group);
    v1: <root>/memory/<rel>/memory.usage_in_bytes (present only if the group exists in the
    memory hierarchy). Never creates anything.
    """
    if layout.version == 2:
        p = layout.root / rel / "memory.current"
    else:
        p = layout.root / "memory" / rel / "memory.usage_in_bytes"
    try:
        return int(p.read_text().strip())
    except (OSError, ValueError):
        return None


def node_throttling(layout: cgroups.CgroupLayout, rel: str) -> tuple[int, int] | None:
    """(periods, ns) the node's CPU groups spent throttled so far: `nr_throttled` and
    `throttled_time` of the node's group plus its per-board-core groups (v1: <root>/cpu/<rel>/
    core*, lab.substrate.local.coreslots) and its data plane's (dp*); v2 reports
    `throttled_usec`; None when the group has no cpu.stat
    (uncapped test trees, a group already gone)."""
    d = layout.root / rel if layout.version == 2 else layout.root / "cpu" / rel
    periods = ns = 0
    found = False
    # the board cores and the data plane's groups (lab.substrate.local.dataplane: dp*)
    for f in [d / "cpu.stat", *sorted(d.glob("core*/cpu.stat")), *sorted(d.glob("dp*/cpu.stat"))]:
        try:
            stat = dict(line.split() for line in f.read_text().splitlines() if line)
            periods += int(stat.get("nr_throttled", 0))
            ns += int(stat.get("throttled_time", 0)) + 1000 * int(stat.get("throttled_usec", 0))
            found = True
        except (OSError, ValueError):
            continue
    return (periods, ns) if found else None


def node_uncapped(layout: cgroups.CgroupLayout, rel: str) -> bool:
    """True when the node's CPU groups are known to have no quota: every quota file found (v1
    `cpu.cfs_quota_us` of the group and its per-board-core groups, v2 `cpu.max`) says unlimited.
    False when any is capped or none is found (a group gone, a test tree without them): the
    throttling counters are then read as they are."""
    d = layout.root / rel if layout.version == 2 else layout.root / "cpu" / rel
    name = "cpu.max" if layout.version == 2 else "cpu.cfs_quota_us"
    found = False
    for f in [d / name, *sorted(d.glob(f"core*/{name}")), *sorted(d.glob(f"dp*/{name}"))]:
        try:
            quota = f.read_text().split()[0]
        except (OSError, IndexError):
            continue
        if quota not in ("max", "-1"):
            return False
        found = True
    return found


def node_thread_sched(
    layout: cgroups.CgroupLayout, rel: str, proc: Path = Path("/proc")
) -> dict[int, tuple[int, int]]:
    """{tid: (ns run, ns waited on a run queue)} for every thread in the node's group now, from
    /proc/TID/schedstat (its first two fields: time on the CPU, time runnable but not running;
    Documentation/scheduler/sched-stats.rst). The threads: cgroups.node_threads (v2: the
    group's and its threaded per-core groups'); {} when the group is gone, a thread that exits
    is skipped."""
    try:
        tids = cgroups.node_threads(layout, rel)
    except (OSError, ValueError):
        return {}
    out = {}
    for tid in tids:
        try:
            run, wait = (int(x) for x in (proc / str(tid) / "schedstat").read_text().split()[:2])
        except (OSError, ValueError):
            continue
        out[tid] = (run, wait)
    return out


#: `vcgencmd get_throttled` bits (Raspberry Pi documentation, "vcgencmd"): 0-3 now, 16-19 since boot
THROTTLED_BITS = {
    0: "under_voltage",
    1: "arm_freq_capped",
    2: "throttled",
    3: "soft_temp_limit",
    16: "under_voltage_occurred",
    17: "arm_freq_capped_occurred",
    18: "throttled_occurred",
    19: "soft_temp_limit_occurred",
}
_NOW_MASK = 0xF
_OCCURRED_MASK = 0xF0000


def parse_throttled(text: str) -> dict:
    """`throttled=0x50005` -> {"raw": "0x50005", "value": 327685, "under_voltage": True, ...}."""
    m = re.search(r"throttled=(0x[0-9a-fA-F]+|\d+)", text)
    if not m:
        raise ValueError(f"unexpected vcgencmd get_throttled output: {text.strip()[:80]!r}")
    value = int(m.group(1), 0)
    out: dict[str, Any] = {"raw": m.group(1), "value": value}
    out.update({name: bool(value >> bit & 1) for bit, name in THROTTLED_BITS.items()})
    return out


def parse_measure_clock(text: str) -> float:
    """`frequency(48)=1500398464` (Hz) -> MHz."""
    m = re.search(r"frequency\(\d+\)=(\d+)", text)
    if not m:
        raise ValueError(f"unexpected vcgencmd measure_clock output: {text.strip()[:80]!r}")
    return int(m.group(1)) / 1e6


def throttled_during(start: dict | None, end: dict | None) -> bool | None:
    """Did the firmware throttle, cap the clock or see under-voltage during the test?

    True when a "now" flag is set at the start or at the end, or a "has occurred" flag is set
    at the end that was not at the start. The "occurred" flags are sticky since boot: once set
    (before the test), a new event between the two readings that is over by the end is not
    visible. None without any reading.
    """
    vs = [r.get("value") for r in (start, end) if r and r.get("value") is not None]
    if not vs:
        return None
    if any(v & _NOW_MASK for v in vs):
        return True
    before = (start or {}).get("value")
    after = (end or {}).get("value")
    if before is not None and after is not None:
        return bool(after & _OCCURRED_MASK & ~before)
    return False


def mean_max(values: list) -> dict:
    """{"mean", "max"} of the readings that are not None (both None without any)."""
    values = [v for v in values if v is not None]
    if not values:
        return {"mean": None, "max": None}
    return {"mean": sum(values) / len(values), "max": max(values)}


def min_mean_max(values: list) -> dict:
    """{"min", "mean", "max"} of the readings that are not None (all None without any)."""
    values = [v for v in values if v is not None]
    if not values:
        return {"min": None, "mean": None, "max": None}
    return {"min": min(values), "mean": sum(values) / len(values), "max": max(values)}


@dataclass
class Daemon:
    """A daemon a monitor watches, as in lab.info["vpn"]["daemons"]."""

    node: str
    name: str
    pid: int
    start_time: int | None
    handle: Any = None  # psutil.Process (lab.substrate.local.monitor, this machine)
    last_cpu: float | None = None

    @property
    def key(self) -> str:  # lab.substrate.boards.monitor's READER argument and answer key
        return f"{self.pid}:{self.start_time or ''}"

    @property
    def label(self) -> str:
        return f"{self.node}/{self.name}"
