"""lab.substrate.local.monitor: clock, temperature, memory and Pi firmware readings on fake sysfs trees and captured
vcgencmd output, their summaries, and one real run on this machine (no root needed)."""

from __future__ import annotations

import json
import os
import time
from collections import namedtuple
from pathlib import Path

import pytest

from lab.core import cgroups
from lab.substrate.local.monitor import Monitor
from lab.core.hostreadings import (
    flatten_sensors,
    node_memory_bytes,
    parse_measure_clock,
    parse_throttled,
    read_cpu_freq,
    read_temperatures,
    read_thermal_zones,
    throttled_during,
)

shwtemp = namedtuple("shwtemp", "label current high critical")  # psutil's shape


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fake_cpu(root: Path, khz: dict[str, int | None]) -> Path:
    """cpuN/cpufreq/scaling_cur_freq (None: the core has no cpufreq), plus the non-core dirs."""
    for cpu, v in khz.items():
        (root / cpu).mkdir(parents=True, exist_ok=True)
        if v is not None:
            _write(root / cpu / "cpufreq" / "scaling_cur_freq", f"{v}\n")
    _write(root / "cpufreq" / "policy0" / "scaling_cur_freq", "1\n")  # not a core
    (root / "cpuidle").mkdir(exist_ok=True)
    _write(root / "online", "0-3\n")
    return root


def fake_thermal(root: Path, zones: dict[int, tuple[str | None, str]]) -> Path:
    for i, (kind, temp) in zones.items():
        z = root / f"thermal_zone{i}"
        _write(z / "temp", temp)
        if kind is not None:
            _write(z / "type", f"{kind}\n")
    _write(root / "cooling_device0" / "type", "fan\n")  # not a zone
    return root


# ---------------------------------------------------------------------- parsers


def test_cpu_freq_per_core_from_sysfs(tmp_path):
    root = fake_cpu(tmp_path, {"cpu0": 1500000, "cpu1": 600000, "cpu2": None, "cpu10": 1800000})
    _write(root / "cpu3" / "cpufreq" / "cpuinfo_cur_freq", "1000000\n")  # no scaling_cur_freq
    _write(root / "cpu4" / "cpufreq" / "scaling_cur_freq", "garbage\n")
    got = read_cpu_freq(root)
    assert got == {"cpu0": 1500.0, "cpu1": 600.0, "cpu3": 1000.0, "cpu10": 1800.0}
    assert list(got) == ["cpu0", "cpu1", "cpu3", "cpu10"]  # numeric order
    assert read_cpu_freq(tmp_path / "absent") == {}
    assert read_cpu_freq(fake_cpu(tmp_path / "vm", {"cpu0": None, "cpu1": None})) == {}


def test_thermal_zones(tmp_path):
    root = fake_thermal(
        tmp_path,
        {
            0: ("cpu_thermal", "45277\n"),
            1: ("acpitz", "30000\n"),
            2: ("acpitz", "-5000\n"),
            3: ("iwlwifi_1", ""),  # unreadable while the sensor is off
            4: (None, "50000\n"),
        },
    )
    assert read_thermal_zones(root) == {
        "cpu_thermal": pytest.approx(45.277),
        "acpitz": 30.0,
        "acpitz/thermal_zone2": -5.0,
        "thermal_zone4": 50.0,
    }
    assert read_thermal_zones(tmp_path / "absent") == {}


def test_temperatures_prefer_psutil_then_thermal_zones(tmp_path):
    zones = fake_thermal(tmp_path, {0: ("cpu_thermal", "61000\n")})
    sensors = {
        "coretemp": [shwtemp("Package id 0", 55.0, 80.0, 100.0), shwtemp("Core 0", 53.0, 0, 0)],
        "acpitz": [shwtemp("", 27.8, None, None), shwtemp("", 29.8, None, None)],
        "nvme": [shwtemp("Composite", float("nan"), None, None)],
    }
    assert flatten_sensors(sensors) == {
        "coretemp/Package id 0": 55.0,
        "coretemp/Core 0": 53.0,
        "acpitz": 27.8,
        "acpitz#2": 29.8,
    }
    assert read_temperatures(zones, lambda: sensors)[0]["coretemp/Core 0"] == 53.0
    assert read_temperatures(zones, lambda: {}) == ({"cpu_thermal": 61.0}, None)
    assert read_temperatures(zones, None) == ({"cpu_thermal": 61.0}, None)

    def broken():
        raise OSError("hwmon went away")

    temps, problem = read_temperatures(zones, broken)
    assert temps == {"cpu_thermal": 61.0} and "hwmon went away" in problem


def test_parse_throttled_captured_outputs():
    flags = [
        "under_voltage",
        "arm_freq_capped",
        "throttled",
        "soft_temp_limit",
        "under_voltage_occurred",
        "arm_freq_capped_occurred",
        "throttled_occurred",
        "soft_temp_limit_occurred",
    ]
    ok = parse_throttled("throttled=0x0\n")
    assert ok["raw"] == "0x0" and ok["value"] == 0 and not any(ok[f] for f in flags)
    # under-voltage now and throttled now, both also "has occurred"
    bad = parse_throttled("throttled=0x50005\n")
    assert bad["value"] == 0x50005
    assert {f for f in flags if bad[f]} == {
        "under_voltage",
        "throttled",
        "under_voltage_occurred",
        "throttled_occurred",
    }
    # all clear now, but capping, throttling and the soft limit happened since boot
    past = parse_throttled("throttled=0xE0000")
    assert {f for f in flags if past[f]} == {
        "arm_freq_capped_occurred",
        "throttled_occurred",
        "soft_temp_limit_occurred",
    }
    assert {f for f in flags if parse_throttled("throttled=0xa")[f]} == {
        "arm_freq_capped",
        "soft_temp_limit",
    }
    for junk in ("", 'error=1 error_msg="Command not registered"', "throttled="):
        with pytest.raises(ValueError, match="get_throttled"):
            parse_throttled(junk)


def test_parse_measure_clock():
    assert parse_measure_clock("frequency(48)=1500398464\n") == pytest.approx(1500.398464)
    assert parse_measure_clock("frequency(48)=600169920") == pytest.approx(600.16992)
    with pytest.raises(ValueError, match="measure_clock"):
        parse_measure_clock('error=2 error_msg="Invalid arguments"')


def test_throttled_during():
    def r(v):
        return {"value": v}

    assert throttled_during(r(0x0), r(0x0)) is False
    assert throttled_during(r(0x0), r(0x50005)) is True  # throttled now at the end
    assert throttled_during(r(0x4), r(0x40000)) is True  # throttled at the start
    assert throttled_during(r(0x0), r(0x40000)) is True  # happened in between, over by the end
    assert throttled_during(r(0x50000), r(0x50000)) is False  # sticky from before the test
    for now in (0x1, 0x2, 0x4, 0x8):  # any "now" flag, though its sticky bit was set before
        assert throttled_during(r(0xF0000 | now), r(0xF0000 | now)) is True, hex(now)
    assert throttled_during(r(0x50000), r(0xD0000)) is True  # a new kind of event since start
    assert throttled_during(None, r(0x2)) is True
    assert throttled_during(None, r(0x50000)) is False  # cannot tell new from old
    assert throttled_during(None, None) is None


def test_node_memory_only_where_the_group_has_the_controller(tmp_path):
    v1 = cgroups.CgroupLayout(1, tmp_path / "v1")
    _write(v1.root / "memory" / "lab" / "x" / "a" / "memory.usage_in_bytes", "1048576\n")
    (v1.root / "cpuacct" / "lab" / "x" / "b").mkdir(parents=True)  # b: cpu groups only
    assert node_memory_bytes(v1, "lab/x/a") == 2**20
    assert node_memory_bytes(v1, "lab/x/b") is None
    v2 = cgroups.CgroupLayout(2, tmp_path / "v2")
    _write(v2.root / "lab" / "x" / "a" / "memory.current", "4096\n")
    (v2.root / "lab" / "x" / "b").mkdir(parents=True)  # memory not enabled for it
    assert node_memory_bytes(v2, "lab/x/a") == 4096
    assert node_memory_bytes(v2, "lab/x/b") is None
    # nothing was created
    assert not (v1.root / "memory" / "lab" / "x" / "b").exists()
    assert not any((v2.root / "lab" / "x" / "b").iterdir())


# ---------------------------------------------------------------------- Monitor on fake trees


def v1_layout(root: Path, nodes: list[str], *, memory: bool) -> cgroups.CgroupLayout:
    """A v1 layout as the lab makes it (cpu, cpuacct, cpuset), optionally with memory groups."""
    for n in nodes:
        d = root / "cpuacct" / "lab" / "x" / n
        _write(d / "cpuacct.usage", "1000000000\n")
        if memory:
            _write(root / "memory" / "lab" / "x" / n / "memory.usage_in_bytes", f"{2**20}\n")
    return cgroups.CgroupLayout(1, root)


def take(mon: Monitor, n: int, between=None) -> None:
    mon.sample()  # primes
    for i in range(n):
        if between:
            between(i)
        time.sleep(0.06)
        assert mon.sample() is not None


def test_monitor_records_clock_temperature_and_memory(tmp_path):
    cpu = fake_cpu(tmp_path / "cpu", {"cpu0": 1500000, "cpu1": 1500000})
    th = fake_thermal(tmp_path / "thermal", {0: ("cpu_thermal", "60000\n")})
    layout = v1_layout(tmp_path / "cg", ["a", "b"], memory=True)
    mon = Monitor(
        layout,
        {"a": "lab/x/a", "b": "lab/x/b"},
        sys_cpu=cpu,
        sys_thermal=th,
        temp_sensors=None,
        vcgencmd=False,
    )

    def throttle(i):  # the board heats up and cpu0 drops to 600 MHz
        if i == 1:
            _write(cpu / "cpu0" / "cpufreq" / "scaling_cur_freq", "600000\n")
            _write(th / "thermal_zone0" / "temp", "82500\n")
            _write(layout.root / "memory" / "lab" / "x" / "a" / "memory.usage_in_bytes", "3145728")

    take(mon, 3, throttle)
    assert mon.samples[0]["host"]["clock_mhz"] == {"cpu0": 1500.0, "cpu1": 1500.0}
    assert mon.samples[-1]["host"]["temperature_c"] == {"cpu_thermal": 82.5}
    s = mon.summary()
    host = s["host"]
    assert host["clock_mhz"]["cores"]["cpu0"] == {"min": 600.0, "mean": 900.0, "max": 1500.0}
    assert host["clock_mhz"]["cores"]["cpu1"] == {"min": 1500.0, "mean": 1500.0, "max": 1500.0}
    assert (host["clock_mhz"]["min"], host["clock_mhz"]["max"]) == (600.0, 1500.0)
    assert host["clock_mhz"]["mean"] == pytest.approx(1200.0)
    assert host["temperature_c"]["sensors"]["cpu_thermal"]["max"] == 82.5
    assert host["temperature_c"]["max"] == 82.5
    mem = host["memory"]
    assert 0 < mem["used_bytes"]["max"] < mem["total_bytes"] and mem["available_bytes_min"] > 0
    assert s["nodes"]["a"]["memory_bytes"]["max"] == 3 * 2**20
    assert s["nodes"]["b"]["memory_bytes"]["max"] == 2**20
    assert s["unavailable"] == {} and "errors" not in s
    assert "vcgencmd" not in host  # not looked for
    json.dumps(s)


def test_missing_sources_give_nulls_and_one_reason(tmp_path):
    cpu = fake_cpu(tmp_path / "cpu", {"cpu0": None, "cpu1": None})  # a VM: no cpufreq
    th = tmp_path / "thermal"
    th.mkdir()  # no zones
    layout = v1_layout(tmp_path / "cg", ["a"], memory=False)  # the lab makes no memory cgroups
    mon = Monitor(layout, {"a": "lab/x/a"}, sys_cpu=cpu, sys_thermal=th, temp_sensors=lambda: {})
    mon.vcgencmd = False
    take(mon, 4)
    for x in mon.samples:
        assert x["host"]["clock_mhz"] is None and x["host"]["temperature_c"] is None
        assert x["host"]["memory"]["used_bytes"] > 0
        assert x["nodes"]["a"]["memory_bytes"] is None
    s = mon.summary()
    assert s["host"]["clock_mhz"] is None and s["host"]["temperature_c"] is None
    assert s["nodes"]["a"]["memory_bytes"] == {"mean": None, "max": None}
    assert set(s["unavailable"]) == {"clock", "temperature", "node_memory"}
    assert "cpufreq" in s["unavailable"]["clock"]
    assert "memory controller" in s["unavailable"]["node_memory"]
    assert "errors" not in s  # a missing source is not an error, let alone one per sample


def _fake_vcgencmd(bin_dir: Path, state: Path, *, clock="frequency(48)=600000000") -> None:
    script = bin_dir / "vcgencmd"
    _write(
        script,
        "#!/bin/sh\n"
        f'case "$1" in\n  get_throttled) cat "{state}" ;;\n  measure_clock) echo "{clock}" ;;\n'
        '  *) echo "error=1" >&2; exit 1 ;;\nesac\n',
    )
    script.chmod(0o755)


def test_vcgencmd_read_at_start_and_end(tmp_path, monkeypatch):
    state = tmp_path / "throttled"
    state.write_text("throttled=0x0\n")
    _fake_vcgencmd(tmp_path / "bin", state)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    mon = Monitor(None, {}, interval=0.05, sys_cpu=tmp_path, sys_thermal=tmp_path)
    mon.start()
    time.sleep(0.2)
    state.write_text("throttled=0x50005\n")  # under-voltage and throttling during the test
    s = mon.stop()
    vc = s["host"]["vcgencmd"]
    assert vc["start"]["raw"] == "0x0" and not vc["start"]["throttled"]
    assert vc["end"]["raw"] == "0x50005" and vc["end"]["under_voltage"] and vc["end"]["throttled"]
    assert vc["end"]["arm_clock_mhz"] == 600.0
    assert vc["throttled"] is True
    assert "vcgencmd" not in s["unavailable"] and "errors" not in s


def test_a_failing_vcgencmd_is_noted_not_fatal(tmp_path, monkeypatch):
    state = tmp_path / "throttled"
    state.write_text('error=1 error_msg="Command not registered"\n')
    _fake_vcgencmd(tmp_path / "bin", state, clock="nonsense")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    mon = Monitor(None, {}, interval=0.05, sys_cpu=tmp_path, sys_thermal=tmp_path)
    mon.start()
    time.sleep(0.12)
    s = mon.stop()
    assert s["host"]["vcgencmd"] == {"start": None, "end": None, "throttled": None}
    assert len(s["errors"]) == 2  # one per command, not one per reading
    assert any("get_throttled" in e for e in s["errors"])


def test_summary_of_handmade_samples():
    def sample(clock, temp, used, avail):
        return {
            "t": 0.0,
            "nodes": {},
            "host": {
                "busy_pct": 10.0,
                "softirq_pct": 1.0,
                "cores": {"cpu0": {"busy_pct": 10.0, "softirq_pct": 1.0}},
                "clock_mhz": clock,
                "temperature_c": temp,
                "memory": {"total_bytes": 1000, "used_bytes": used, "available_bytes": avail},
            },
            "daemons": {},
        }

    mon = Monitor(None, {}, vcgencmd=False)
    mon.samples = [
        sample({"cpu0": 1500.0, "cpu1": 1500.0}, {"a": 50.0, "b": 40.0}, 100, 900),
        sample({"cpu0": 600.0, "cpu1": 1500.0}, {"a": 70.0}, 300, 700),
        sample(None, None, 200, 800),  # a reading that failed: skipped, not zero
    ]
    h = mon.summary()["host"]
    assert h["clock_mhz"] == {
        "cores": {
            "cpu0": {"min": 600.0, "mean": 1050.0, "max": 1500.0},
            "cpu1": {"min": 1500.0, "mean": 1500.0, "max": 1500.0},
        },
        "min": 600.0,
        "mean": 1275.0,
        "max": 1500.0,
    }
    assert h["temperature_c"] == {
        "sensors": {"a": {"mean": 60.0, "max": 70.0}, "b": {"mean": 40.0, "max": 40.0}},
        "max": 70.0,
    }
    assert h["memory"] == {
        "total_bytes": 1000,
        "used_bytes": {"mean": 200.0, "max": 300},
        "available_bytes_min": 700,
    }


# ---------------------------------------------------------------------- a real run here


def test_real_monitor_run_on_this_machine():
    mon = Monitor(None, {}).start()
    # the sampling thread's first tick, however slow the host: then stop() adds the tail
    deadline = time.monotonic() + 60
    while not mon.samples:
        assert time.monotonic() < deadline, "the monitor thread never sampled"
        time.sleep(0.1)
    time.sleep(0.1)  # the tail must span more than the monitor's 50 ms minimum interval
    s = mon.stop()
    assert s["samples"] >= 2
    mem = s["host"]["memory"]
    assert 0 < mem["used_bytes"]["max"] < mem["total_bytes"]
    assert 0 < mem["available_bytes_min"] < mem["total_bytes"]
    assert "memory" not in s["unavailable"]
    has_clock = bool(read_cpu_freq())
    has_temp = bool(read_temperatures()[0])
    for key, have in (("clock_mhz", has_clock), ("temperature_c", has_temp)):
        if have:
            assert s["host"][key]["max"] > 0, key
        else:  # a VM: null in every sample and in the summary, the reason stated once
            assert s["host"][key] is None
            assert all(x["host"][key] is None for x in mon.samples)
    assert ("clock" in s["unavailable"]) == (not has_clock)
    assert ("temperature" in s["unavailable"]) == (not has_temp)
    assert not any("cpufreq" in e or "thermal" in e for e in s.get("errors", []))
    json.dumps(s)
