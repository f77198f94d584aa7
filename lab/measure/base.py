"""What every measurement test shares: the context it runs in, its records, running a tool with
its raw output streamed to a file, and waiting for a server to listen (its parameter schema is
lab.model.params, re-exported here as Param).

A test never prints, never exits and never raises on a *measurement* failure (the tool ran but
reported an error, nothing came back): it returns a record with ``ok=False`` and ``error`` set, so
the runner decides what a failed point means for the campaign. A point that cannot apply to the
lab (IPv6 over an IPv4-only tunnel) is neither a failure nor left out: ``Test.not_applicable``
returns a record that says why, with no metric. Bad parameters raise ConfigError in
``validate`` before anything runs; a missing tool raises PreconditionError.
"""

from __future__ import annotations

import threading
import ipaddress
import signal
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from lab.core.errors import ConfigError, StartupError, did_you_mean
from lab.core.node import Daemon, Node
from lab.core.tools import Tool
from lab.model.params import Param, validate


class MeasurementFailed(Exception):
    """A tool ran but gave no usable measurement. Internal: tests turn it into ok=False."""


Record = dict[str, Any]
"""One measured point: metrics plus ``test``, ``ok``, ``error`` and ``raw_files`` (and
``not_applicable``, the reason, on a point that does not apply)."""


#: next_raw's numbering across the threads of one test
_RAW_LOCK = threading.Lock()


@dataclass
class Context:
    """Where a test runs. The same object drives an emulated lab and real boards."""

    client: Node
    server: Node
    #: address the client targets on the server (IPv4 or IPv6 literal, or a name)
    server_addr: str
    #: every tool invocation's raw output goes here, one file per invocation, as it arrives
    raw_dir: Path
    #: tunnel interface on the client (read by the mtu test)
    iface: str | None = None
    #: the server's IPv6 address on the same path as server_addr (the tunnel's for a VPN, the
    #: underlay's without one), when there is one: the mtu test's `ipv6 = true` probes it
    server_addr6: str | None = None
    #: grace, in seconds, beyond an invocation's planned duration before it is killed
    timeout_s: float = 30.0
    #: private per-lab scratch (ssh keys, scp payload); never part of results.
    #: None: a directory named ``measure-state`` beside raw_dir.
    state_dir: Path | None = None
    #: the lab's tunnel, for a test that stops, starts or rekeys it (handshake): an object with
    #: the methods of lab.measure.handshake.Tunnel (lab.vpn.control.TunnelControl); None where
    #: the runner gives none
    tunnel: Any = None
    #: the server's underlay address, outside the tunnel, when the traffic runs between the
    #: tunnel's own ends (IPv4); None without a tunnel or when the traffic nodes are others.
    #: rrul pings it beside the tunnel to tell the link's queueing from the VPN's own
    link_addr: str | None = None
    _seq: int = field(default=0, repr=False)

    def state_path(self) -> Path:
        return (
            self.state_dir if self.state_dir is not None else self.raw_dir.parent / "measure-state"
        )

    def next_raw(self, label: str, suffix: str = ".txt") -> Path:
        """A fresh raw-output path: ``NNN-label.suffix`` (never overwrites an earlier one; safe
        from a test's threads: rrul's two pings)."""
        self.raw_dir.mkdir(parents=True, exist_ok=True)
        with _RAW_LOCK:
            while True:
                self._seq += 1
                p = self.raw_dir / f"{self._seq:03d}-{label}{suffix}"
                if not p.exists():
                    return p


def family_of(addr: str) -> int | None:
    """4 or 6 for an IP literal (brackets allowed), None for a name."""
    try:
        return ipaddress.ip_address(addr.strip("[]")).version
    except ValueError:
        return None


# --- the interface ---------------------------------------------------------------------------

#: results.csv dtypes a metric column may have: empty cells must be possible ("not measured")
METRIC_DTYPES = ("float64", "string")


@dataclass(frozen=True)
class Metric:
    """A results.csv column a test's records fill (docs/results.md lists every column).

    Tests that declare the same column share it and must agree on dtype, unit and `summarised`.
    """

    name: str
    #: "float64" (a number; empty = not measured) or "string"
    dtype: str = "float64"
    unit: str = ""
    description: str = ""
    #: record key the value is read from (default: the column's own name)
    source: str | None = None
    #: an outcome with n/mean/sd/min/max in summary.csv; False for a parameter echoed back
    #: (udp's rate_mbit and size), so it is a column but not summarised
    summarised: bool = True

    @property
    def key(self) -> str:
        return self.source or self.name


class Primary(NamedTuple):
    """The one metric a report ranks and plots a test by (a results.csv column)."""

    column: str
    #: label of the scaled value, e.g. "Mbit/s"
    unit: str
    #: multiply the column by this for display (bit/s -> Mbit/s: 1e-6)
    scale: float = 1.0
    higher_is_better: bool = True


#: what a report draws of a test, by the kinds a test declares in `Test.plots` (lab.results reads
#: these, never a test's name)
PLOTS: dict[str, str] = {
    "throughput": "throughput per profile without impairment and per network condition (bars), "
    "the nodes' CPU meanwhile (plot and table), throughput against a swept impairment",
    "throughput-time": "throughput over time per case (iperf3's intervals)",
    "rtt": "mean RTT per profile and network condition, against a swept impairment, and the "
    "CDF of the RTT samples",
    "rate-target": "target against achieved rate and packets/s per profile",
    "rate-sweep": "received rate per target rate: a table and a plot of its own instead of a "
    "column of the headline",
    "load-latency": "each flow's throughput over time per case, and the CDF of the RTT samples idle "
    "against loaded per profile and condition",
    "establishment": "a table per profile and condition of the cold establishment time, how many "
    "completed, and a profile's own key exchange (time, bytes, packets) where it has one",
    "rekey": "a table per profile and condition of a forced rekey's cost: new keys after, the dip "
    "against the flow's own noise, recovery, retransmits and each repetition's status",
}
#: what the report's Recommendation ranks the VPN profiles by, with the first test of the plan
#: that declares it in `Test.ranks`
RANKS: dict[str, str] = {
    "throughput": "the highest mean throughput_bps",
    "rtt": "the lowest mean rtt_avg_ms",
}

#: Every concrete Test subclass defined in a module of this package, by name, filled by
#: Test.__init_subclass__ as lab.measure imports its modules (classes defined elsewhere, such as
#: tests' fakes, are not registered). lab.measure.TESTS holds one instance of each.
REGISTRY: dict[str, type[Test]] = {}
#: One instance of each registered test, by name; lab.measure fills it when it has imported its
#: modules (here, not there, so a test that wraps others, such as contention, needs no import of
#: the package that imports it).
TESTS: dict[str, Test] = {}
_PACKAGE = __name__.rpartition(".")[0]


class Test(ABC):
    """One measurement. A subclass in a module of lab/measure declares, at class level:

    `name` (registers it), `schema` (its parameters), `requires` (the tools it runs, with their
    Debian packages), `metrics` (the results.csv columns its records fill), `primary` (the
    metric a report ranks it by), `plot` (how the report draws it), and implements `estimate_s`
    (expected wall time, for the progress bar) and `run`. No other code needs editing
    (docs/measurements.md, "Adding a test kind").
    """

    name: ClassVar[str]
    schema: Mapping[str, Param]
    #: external tools needed on the client / server nodes (checked by the runner), by name
    client_tools: tuple[str, ...] = ()
    server_tools: tuple[str, ...] = ()
    #: every tool in client_tools and server_tools, declared once: its Debian package, version
    #: command and whether an arch node runs the board's build (lab.substrate.tools gathers
    #: these into setup.sh's package list, `lab arch fetch` and the manifest's tool versions)
    requires: ClassVar[tuple[Tool, ...]] = ()
    #: results.csv columns this test's records fill
    metrics: ClassVar[tuple[Metric, ...]] = ()
    #: the metric reports and comparisons rank this test by (required of a registered test;
    #: the report falls back to throughput_bps for a test it does not know)
    primary: ClassVar[Primary | None] = None
    #: what the report draws of this test: kinds of PLOTS
    plots: ClassVar[tuple[str, ...]] = ()
    #: what the report's Recommendation ranks profiles by with this test: a key of RANKS, or
    #: None (not ranked)
    ranks: ClassVar[str | None] = None
    #: parameters added after plans were written, with the value that means "as before": a plan
    #: entry at that value leaves them out of its digest (digest_params), so runs recorded
    #: before them can still be resumed and merged
    since_plans: ClassVar[Mapping[str, Any]] = {}
    #: what of the test's traffic a local lab's side path for the boards' NIC latency is steered
    #: onto while it runs (lab.substrate.local.nicside, docs/cpu.md "The side path"): "all"
    #: (an RTT-bound test: ping, rr, handshake), "icmp" (only its ICMP/ICMPv6, the pings of a
    #: test that also carries bulk flows: rrul) or None (nothing: the throughput tests)
    nic_side_path: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name")
        if name is None or not cls.__module__.startswith(_PACKAGE + "."):
            return
        other = REGISTRY.get(name)
        if other is not None and (other.__module__, other.__qualname__) != (
            cls.__module__,
            cls.__qualname__,
        ):
            raise TypeError(
                f"test name {name!r} of {cls.__module__}.{cls.__qualname__} is already taken by "
                f"{other.__module__}.{other.__qualname__}"
            )
        REGISTRY[name] = cls

    @classmethod
    def check_declarations(cls) -> None:
        """TypeError naming the class when its class-level declarations are malformed."""
        where = f"{cls.__module__}.{cls.__qualname__}"
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name:
            raise TypeError(f"{where}: name must be a non-empty string")
        if not isinstance(getattr(cls, "schema", None), Mapping):
            raise TypeError(f"{where}: schema must be a mapping of parameter name -> Param")
        seen = set()
        for m in cls.metrics:
            if not isinstance(m, Metric):
                raise TypeError(f"{where}: metrics must be Metric(...) entries, got {m!r}")
            if m.dtype not in METRIC_DTYPES:
                raise TypeError(
                    f"{where}: metric {m.name!r} has dtype {m.dtype!r}; accepted: "
                    + ", ".join(METRIC_DTYPES)
                )
            if m.name in seen:
                raise TypeError(f"{where}: metric {m.name!r} declared twice")
            seen.add(m.name)
        declared = set()
        for t in cls.requires:
            if not isinstance(t, Tool):
                raise TypeError(f"{where}: requires must be Tool(...) entries, got {t!r}")
            declared.add(t.name)
        undeclared = sorted({*cls.client_tools, *cls.server_tools} - declared)
        if undeclared:
            raise TypeError(f"{where}: tools {undeclared} are not declared in requires")
        unknown = [p for p in cls.plots if p not in PLOTS]
        if isinstance(cls.plots, str) or unknown:
            raise TypeError(
                f"{where}: plots must be a tuple of {', '.join(PLOTS)}; got {cls.plots!r}"
            )
        if cls.ranks is not None and cls.ranks not in RANKS:
            raise TypeError(f"{where}: ranks must be None or one of {', '.join(RANKS)}")
        if cls.nic_side_path not in (None, "all", "icmp"):
            raise TypeError(f"{where}: nic_side_path must be None, 'all' or 'icmp'")
        if not isinstance(cls.primary, Primary):
            raise TypeError(f"{where}: primary must be a Primary(column, unit, scale, higher)")

    def validate(self, params: Mapping[str, Any] | None, *, source: str) -> dict[str, Any]:
        """Reject unknown keys and impossible values (ConfigError naming source and field)."""
        return validate(self.schema, params, source=source, owner=f"test '{self.name}'")

    def digest_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Validated `params` as a plan's digest records them: `since_plans` at their old value
        left out (lab.campaign.plan.TestEntry.to_json)."""
        later = self.since_plans
        return {k: v for k, v in params.items() if k not in later or v != later[k]}

    def primary_for(self, params: Mapping[str, Any]) -> Primary | None:
        """The metric an entry with `params` (validated, as plan.json keeps them) is reported by:
        `primary`, or another where these parameters leave it unmeasured."""
        return self.primary

    def estimate_s(self, params: Mapping[str, Any]) -> float:
        """Expected wall time of one run with validated `params` (the progress bar's ETA)."""
        return 5.0

    def needs(self, params: Mapping[str, Any]) -> tuple[str, ...]:
        """What this test with validated `params` asks of every VPN profile of a plan beyond a
        tunnel, checked when the plan loads (lab.campaign.load), before anything is built:
        "rekey" (Driver.rekey_support). Default: nothing."""
        return ()

    @abstractmethod
    def run(self, ctx: Context, params: Mapping[str, Any]) -> list[Record]:
        """Run with validated params; one record per measured point."""

    def record(
        self,
        *,
        ok: bool = True,
        error: str | None = None,
        raw_files: Sequence[Path] = (),
        **metrics: Any,
    ) -> Record:
        return {
            "test": self.name,
            "ok": ok,
            "error": error,
            "raw_files": [str(p) for p in raw_files],
            **metrics,
        }

    def not_applicable(self, reason: str, **fields: Any) -> Record:
        """The record of a point that does not apply to this lab (e.g. IPv6 over an IPv4-only
        tunnel): nothing failed and nothing was measured; `reason` says why (results.csv's
        not_applicable column, the report's "n/a")."""
        return {**self.record(**fields), "not_applicable": reason}


# --- running tools --------------------------------------------------------------------------


@dataclass
class Invocation:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    raw_files: list[Path]
    timed_out: bool
    seconds: float
    #: ended by invoke because `stall` said it would not move on (not a time-out)
    stalled: bool = False


#: how often invoke asks `stall`, and how long a process ended for it gets after SIGINT
STALL_STEP_S = 0.5
STALL_GRACE_S = 3.0


def invoke(
    ctx: Context,
    node: Node,
    argv: Sequence[str],
    *,
    label: str,
    timeout: float,
    suffix: str = ".txt",
    progress: Callable[[], bool] | None = None,
    max_timeout: float | None = None,
    step_s: float = 2.0,
    stall: Callable[[], bool] | None = None,
) -> Invocation:
    """Run argv on `node`, streaming stdout into a fresh raw file as it arrives.

    stderr goes to ``<same name>.stderr``, kept only when non-empty. Never raises on a non-zero
    exit or a time-out (the caller turns them into a failed record); the process is killed and
    reaped on time-out so nothing outlives the test.

    `progress`: asked when `timeout` has passed, then every `step_s`; while it answers True
    (the run still moves, e.g. its receiver still receives) the wait goes on, up to
    `max_timeout` seconds in all.

    `stall`: asked every STALL_STEP_S from the start; when it answers True (the process waits
    for something that will not come, e.g. a lost UDP set-up reply) the process gets SIGINT,
    then SIGKILL after STALL_GRACE_S, and the Invocation says `stalled`.
    """
    argv = [str(a) for a in argv]
    out_path = ctx.next_raw(label, suffix)
    err_path = out_path.with_suffix(out_path.suffix + ".stderr")
    timed_out = stalled = False
    t0 = time.monotonic()
    deadline, last = t0 + timeout, t0 + max(timeout, max_timeout or 0.0)
    with open(out_path, "w") as out, open(err_path, "w") as err:
        out.write("")  # the file exists even if the tool never writes
        p = node.popen(argv, stdout=out, stderr=err)
        while True:
            until = deadline if stall is None else min(deadline, time.monotonic() + STALL_STEP_S)
            try:
                p.wait(timeout=max(0.0, until - time.monotonic()))
                break
            except subprocess.TimeoutExpired:
                now = time.monotonic()
                if now < deadline:  # only the stall check's step has passed
                    if stall is not None and stall():
                        stalled = True
                        _interrupt(p)
                        break
                    continue
                if progress is not None and now < last and progress():
                    deadline = min(now + step_s, last)
                    continue
                timed_out = True
                p.kill()
                p.wait()
                break
    inv = collected(argv, p.returncode, out_path, err_path, timed_out, time.monotonic() - t0)
    inv.stalled = stalled
    return inv


def _interrupt(p: subprocess.Popen) -> None:
    """SIGINT (a tool ends its session and prints what it has), SIGKILL if it lingers."""
    p.send_signal(signal.SIGINT)
    try:
        p.wait(timeout=STALL_GRACE_S)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def collected(
    argv: list[str], rc: int, out_path: Path, err_path: Path, timed_out: bool, seconds: float
) -> Invocation:
    """The Invocation of a finished process from its raw files; its stderr file is kept only
    when non-empty (invoke, and adaptive.watch)."""
    stdout = out_path.read_text(errors="replace")
    stderr = err_path.read_text(errors="replace")
    files = [out_path]
    if stderr:
        files.append(err_path)
    else:
        err_path.unlink()
    return Invocation(argv, rc, stdout, stderr, files, timed_out, seconds)


def describe_failure(inv: Invocation, tool: str) -> str:
    if inv.timed_out:
        return f"{tool} timed out after {inv.seconds:.1f}s and was killed"
    tail = " | ".join((inv.stderr or inv.stdout).strip().splitlines()[-3:])
    return f"{tool} exited {inv.returncode}" + (f": {tail}" if tail else "")


def wait_listening(
    node: Node, daemon: Daemon, *, proto: str, port: int, timeout: float = 10.0
) -> None:
    """Poll `ss` in `node` until something listens on `port`; StartupError if the daemon dies."""
    flag = "-Hltn" if proto == "tcp" else "-Hlun"
    deadline = time.monotonic() + timeout
    while True:
        cp = node.run(["ss", flag, f"sport = :{port}"], check=False, timeout=10)
        if cp.returncode == 0 and cp.stdout.strip():
            return
        if not daemon.alive():
            raise StartupError(
                f"{daemon.name} exited before listening on {proto}/{port}:\n{daemon.log_tail()}"
            )
        if time.monotonic() > deadline:
            raise StartupError(
                f"{daemon.name} not listening on {proto}/{port} after "
                f"{timeout:.0f}s:\n{daemon.log_tail()}"
            )
        time.sleep(0.05)


def get_test(name: str, *, source: str | None = None, field: str | None = "test") -> Test:
    """The registered test called `name`; ConfigError listing the valid names otherwise."""
    try:
        return TESTS[name]
    except (KeyError, TypeError):
        raise ConfigError(
            f"unknown test {name!r}{did_you_mean(name, TESTS)}; accepted: "
            f"{', '.join(sorted(TESTS))}",
            source=source,
            field=field,
        ) from None
