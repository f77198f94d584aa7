"""lab.core.monitoring.MonitorBase: the lifecycle both monitors share (start, the sampling thread,
stop, the summary's shape) on a fake monitor; no root, no tools."""

from __future__ import annotations

import threading
import time

from lab.core.monitoring import MAX_ERRORS, MonitorBase


class Counting(MonitorBase):
    """Counts its samples; `fail_at` makes those samples raise."""

    def __init__(self, interval: float, fail_at=(), daemons=None):
        super().__init__(interval, daemons)
        self.fail_at = set(fail_at)
        self.calls: list[str] = []
        self.threads: set[str] = set()

    def _at_start(self) -> None:
        self.calls.append("at_start")

    def _at_stop(self) -> None:
        self.calls.append("at_stop")

    def sample(self) -> dict | None:
        n = len(self.calls)
        self.calls.append("sample")
        self.threads.add(threading.current_thread().name)
        if n in self.fail_at:
            raise OSError(f"sample {n} failed")
        rec = {"t": round(time.monotonic() - self._t0, 3), "nodes": {"a": {"total": float(n)}},
               "daemons": {"a/d": {"alive": True, "cpu_pct": 10.0 * n, "rss_bytes": 100 * n}}}  # fmt: skip
        self.samples.append(rec)
        return rec

    def summary(self) -> dict:
        out = self._summary_head()
        out["nodes"]["a"] = self._node_summary("a")
        out["daemons"] = self._daemon_summaries()
        return out


def test_start_samples_in_a_thread_and_stop_takes_the_tail():
    mon = Counting(0.02, daemons=[{"node": "a", "name": "d", "pid": "7"}])
    assert mon.start() is mon
    time.sleep(0.2)
    s = mon.stop()
    assert mon.calls[:2] == ["at_start", "sample"] and mon.calls[-2:] == ["sample", "at_stop"]
    assert {"MainThread", "lab-monitor"} <= mon.threads  # edges here, the ticks in the thread
    assert s["samples"] == len(mon.samples) >= 4
    assert set(s) == {"interval_s", "samples", "nodes", "host", "daemons", "unavailable"}
    assert set(s["nodes"]["a"]) == {"total", "user", "system", "memory_bytes"}
    assert s["nodes"]["a"]["total"]["max"] == float(len(mon.calls) - 2)
    assert s["nodes"]["a"]["user"] == {"mean": None, "max": None}
    d = s["daemons"]["a/d"]
    assert d["alive_throughout"] is True and d["rss_bytes_max"] == 100 * (len(mon.calls) - 2)
    n = len(mon.calls)
    time.sleep(0.1)
    assert len(mon.calls) == n  # the thread is gone


def test_a_failing_sample_is_noted_never_raised():
    mon = Counting(0.02, fail_at={1, 2, 3})
    with mon:
        time.sleep(0.15)
    s = mon.summary()
    # the first sample (at start) and the thread's next two fail; the test goes on
    assert s["errors"] == [f"OSError: sample {i} failed" for i in (1, 2, 3)]
    assert s["samples"] >= 1


def test_errors_are_kept_once_and_at_most_max():
    mon = Counting(1.0)
    for i in range(MAX_ERRORS + 5):
        mon._note(f"e{i % (MAX_ERRORS + 3)}")
    assert len(mon.errors) == MAX_ERRORS and len(set(mon.errors)) == MAX_ERRORS


def test_a_daemon_without_samples_was_not_alive_throughout():
    mon = Counting(1.0, daemons=[{"node": "a", "name": "d", "pid": 7, "start_time": 5}])
    s = mon.summary()
    assert s["daemons"]["a/d"]["alive_throughout"] is False and s["samples"] == 0
