"""What every monitor shares: sampling in a background thread while a test runs, and the shape of
its result. A monitor reads at start(), every `interval` seconds in its thread and once more at
stop(), which returns the summary; the runner stores `samples` and that summary per case
(monitor/CASE.json). A reading that fails goes to "errors" (at most MAX_ERRORS, each once), a
source that is missing goes to "unavailable" once: a monitor never takes the test down.

The summary's keys: "interval_s", "samples", "nodes" ({node: {"total", "user", "system",
"memory_bytes": {"mean", "max"}, ...}}), "host", "daemons" ({NODE/NAME: {"cpu_pct",
"rss_bytes_max", "alive_throughout"}}), "unavailable", and "errors" when there were any.

Subclasses say what they read: lab.substrate.local.monitor.Monitor (this machine's cgroups,
/proc and /sys) and lab.substrate.boards.monitor.BoardMonitor (each board over its SSH agent).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Self

from lab.core.hostreadings import Daemon, mean_max

#: at most this many distinct error messages are kept
MAX_ERRORS = 20
#: the per-node series every monitor's summary holds ({"mean", "max"} each)
NODE_KEYS = ("total", "user", "system", "memory_bytes")


class MonitorBase:
    """The lifecycle: start() -> self, a sampling thread, stop() -> summary(); also a context
    manager. A subclass implements sample() (one reading, appended to `samples`, or None while
    priming) and summary(), and may hook _at_start() (before the first sample), _edge_sample()
    (the samples at start and stop) and _at_stop() (after the last)."""

    #: the sampling thread's name
    thread_name = "lab-monitor"
    #: how long stop() waits for a sample in flight (a board's read can take a round trip)
    join_timeout_s = 5.0

    def __init__(self, interval: float, daemons: list[dict] | None = None) -> None:
        self.interval = interval
        self.samples: list[dict] = []
        self.errors: list[str] = []
        #: source -> why it is not recorded here
        self.unavailable: dict[str, str] = {}
        self._daemons = [
            Daemon(d["node"], d["name"], int(d["pid"]), d.get("start_time")) for d in daemons or ()
        ]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    # ------------------------------------------------------------------ what a subclass says
    def sample(self) -> dict | None:
        """Take one reading: the record appended to `samples`, or None (priming, no data)."""
        raise NotImplementedError

    def summary(self) -> dict:
        raise NotImplementedError

    def _at_start(self) -> None:
        """Before the first sample (probing, readings taken only at the edges)."""

    def _edge_sample(self) -> dict | None:
        """The sample taken at start() and at stop()."""
        return self.sample()

    def _at_stop(self) -> None:
        """After the last sample."""

    # ------------------------------------------------------------------ the lifecycle
    def _note(self, msg: str) -> None:
        if msg not in self.errors and len(self.errors) < MAX_ERRORS:
            self.errors.append(msg)

    def _guarded(self, step) -> None:
        try:
            step()
        except Exception as e:  # noqa: BLE001 -- a monitor must never take the test down
            self._note(f"{type(e).__name__}: {e}")

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._guarded(self.sample)

    def start(self) -> Self:
        self._t0 = time.monotonic()
        self._guarded(self._at_start)
        self._guarded(self._edge_sample)
        self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict:
        """Stop sampling (at once: the thread waits on an Event), take the tail since the last
        tick and return the summary."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.join_timeout_s)
        self._guarded(self._edge_sample)
        self._guarded(self._at_stop)
        return self.summary()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        if not self._stop.is_set():
            self.stop()

    # ------------------------------------------------------------------ the result's shape
    def _summary_head(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "interval_s": self.interval,
            "samples": len(self.samples),
            "nodes": {},
            "host": {},
            "daemons": {},
            "unavailable": dict(self.unavailable),
        }
        if self.errors:
            out["errors"] = list(self.errors)
        return out

    def _node_summary(self, node: str) -> dict[str, dict]:
        """{series: {"mean", "max"}} of NODE_KEYS for `node` over the samples."""
        return {
            k: mean_max([x["nodes"].get(node, {}).get(k) for x in self.samples]) for k in NODE_KEYS
        }

    def _daemon_summaries(self) -> dict[str, dict]:
        """Per watched daemon: CPU % mean/max, peak RSS, and whether it was alive in every
        sample (False without samples)."""
        out = {}
        for d in self._daemons:
            xs = [x["daemons"].get(d.label, {}) for x in self.samples]
            out[d.label] = {
                "cpu_pct": mean_max([x.get("cpu_pct") for x in xs]),
                "rss_bytes_max": max((x.get("rss_bytes") or 0 for x in xs), default=0) or None,
                "alive_throughout": bool(xs) and all(x.get("alive", False) for x in xs),
            }
        return out
