"""What a board reports to lab.substrate.boards.monitor.BoardMonitor in one round trip: READER (the
shell script its agent runs: every file in one `head -v`, the firmware's vcgencmd answers) and
the parsers of its answer, pure. lab.substrate.boards.check reads vcgencmd's answers with the
same parsers.
"""

from __future__ import annotations

import re
from typing import Any

from lab.core.hostreadings import parse_measure_clock, parse_throttled

#: runs on the board as `sh -c READER sh VC PROBE PID...` (VC, PROBE: "1" or "0"): ONE process
#: besides the shell reads every file, printing `==> PATH <==` before each (head -v); a glob
#: that matches nothing (no cpufreq, no thermal zone) or a PID that is gone prints nothing.
#: PROBE adds what does not change (clock tick, page size, sensor names, governor, vcgencmd's
#: path), VC the firmware's answers under `==> vcgencmd ARGS <==`.
READER = r"""
vc=$1 probe=$2; shift 2
f="/proc/uptime /proc/stat /proc/meminfo"
for p; do f="$f /proc/$p/stat"; done
if [ "$probe" = 1 ]; then
  f="$f /sys/class/thermal/thermal_zone*/type /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"
fi
head -v -n 100000 $f /sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_cur_freq \
  /sys/class/thermal/thermal_zone*/temp 2>/dev/null
PATH="$PATH:/usr/bin:/opt/vc/bin"
if [ "$probe" = 1 ]; then
  echo; echo "==> probe <=="; getconf CLK_TCK; getconf PAGESIZE
  echo "vcgencmd=$(command -v vcgencmd)"
fi
if [ "$vc" = 1 ] && command -v vcgencmd >/dev/null; then
  for a in get_throttled measure_temp "measure_clock arm"; do
    echo; echo "==> vcgencmd $a <=="; vcgencmd $a 2>&1 || echo "error: exit $?"
  done
fi
exit 0
"""
_SECTION = re.compile(r"^==> (.*) <==$", re.M)


def parse_reader(text: str) -> dict[str, str]:
    """READER's output -> {path or "vcgencmd ARGS" or "probe": content}."""
    parts = _SECTION.split(text)
    return {parts[i]: parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)}


def parse_answer(sections: dict[str, str], pids: list[str]) -> dict:
    """One READER answer as numbers: {"t" (board uptime, s), "stat", "freq", "temp" (by zone
    directory; names come from the probe), "mem", "pids" {PID:START: [cpu ticks, rss pages,
    start time] or None}, "vc" (raw answers), and with a probe "tck", "page", "zone_types",
    "gov", "vcgencmd"}."""
    out: dict[str, Any] = {"stat": {}, "freq": {}, "temp": {}, "mem": {}, "pids": {}}
    out["t"] = float((sections.get("/proc/uptime") or "0").split()[0])
    for line in (sections.get("/proc/stat") or "").splitlines():
        if line.startswith("cpu") and line[3:4].isdigit():
            p = line.split()
            out["stat"][p[0]] = [int(x) for x in p[1:9]]
    for line in (sections.get("/proc/meminfo") or "").splitlines():
        k, _, v = line.partition(":")
        if k in ("MemTotal", "MemAvailable"):
            out["mem"][k] = int(v.split()[0]) * 1024
    for path, value in sections.items():
        m = re.fullmatch(r"/sys/devices/system/cpu/(cpu\d+)/cpufreq/scaling_cur_freq", path)
        if m and value.isdigit() and int(value) > 0:
            out["freq"][m.group(1)] = int(value) / 1000.0
        m = re.fullmatch(r"/sys/class/thermal/(thermal_zone\d+)/temp", path)
        if m and re.fullmatch(r"-?\d+", value):
            out["temp"][m.group(1)] = int(value) / 1000.0
    for key in pids:
        pid, _, start = key.partition(":")
        d = sections.get(f"/proc/{pid}/stat")
        if not d or ")" not in d:
            out["pids"][key] = None
            continue
        rest = d[d.rindex(")") + 2 :].split()
        if rest[0] == "Z" or (start and int(rest[19]) != int(start)):
            out["pids"][key] = None
            continue
        out["pids"][key] = [int(rest[11]) + int(rest[12]), int(rest[21])]
    vc = {k[9:]: v for k, v in sections.items() if k.startswith("vcgencmd ")}
    if vc:
        out["vc"] = vc
    if "probe" in sections:
        lines = sections["probe"].splitlines()
        out["tck"], out["page"] = int(lines[0]), int(lines[1])
        out["vcgencmd"] = lines[2].partition("=")[2] or None if len(lines) > 2 else None
        out["gov"] = sections.get("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
        out["zone_types"] = {
            m.group(1): v
            for k, v in sections.items()
            if (m := re.fullmatch(r"/sys/class/thermal/(thermal_zone\d+)/type", k))
        }
    return out


def parse_measure_temp(text: str) -> float:
    """`temp=48.3'C` -> 48.3."""
    m = re.search(r"temp=(-?[0-9.]+)", text)
    if not m:
        raise ValueError(f"unexpected vcgencmd measure_temp output: {text.strip()[:80]!r}")
    return float(m.group(1))


def throttled_words(reading: dict | None) -> list[str]:
    """The names of the flags set in a parse_throttled() reading ([] when none, or no reading)."""
    if not reading:
        return []
    return [k for k, v in reading.items() if v is True]


def parse_vcgencmd(raw: dict[str, str]) -> tuple[dict[str, Any], list[str]]:
    """The READER's vcgencmd answers -> ({"throttled", "temperature_c", "arm_clock_mhz"},
    problems). A failed or unparsable answer leaves its key out and adds a problem."""
    out: dict[str, Any] = {}
    problems = []
    for key, cmd, parse in (
        ("throttled", "get_throttled", parse_throttled),
        ("temperature_c", "measure_temp", parse_measure_temp),
        ("arm_clock_mhz", "measure_clock arm", parse_measure_clock),
    ):
        text = raw.get(cmd)
        if text is None:
            continue
        try:
            if text.startswith("error: "):
                raise ValueError(text[7:])
            out[key] = parse(text)
        except ValueError as e:
            problems.append(f"vcgencmd {cmd}: {e}")
    if "throttled" in out:
        out["throttled"]["words"] = throttled_words(out["throttled"])
    return out, problems


def zone_names(types: dict[str, str]) -> dict[str, str]:
    """thermal_zoneN -> its type ("cpu-thermal"), or "TYPE/thermal_zoneN" for a repeated type
    (as lab.core.hostreadings.read_thermal_zones names them)."""
    out: dict[str, str] = {}
    seen: set[str] = set()
    for z in sorted(types, key=lambda z: int(z[12:])):
        kind = types[z] or z
        out[z] = kind if kind not in seen else f"{kind}/{z}"
        seen.add(kind)
    return out
