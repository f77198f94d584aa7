"""iperf3 plumbing shared by the tcp, udp, udp-sweep, rrul and handshake tests: one server per
test run, the moment its flows are established, client invocations with their JSON streamed to
raw files (the parsers of that JSON: lab.measure.iperf3json).

iperf3 3.12 exits 0 even when ``-J`` output carries ``"error"`` (seen for "server is busy" and
"connection refused"), so success is decided on the JSON, never on the exit code alone. A UDP
run whose stream set-up was lost is run again, and a client whose receiver still receives past
its time-out is waited for (lab.measure.iperf3loss).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.core.errors import ConfigError
from lab.core.tools import Tool
from lab.model.params import Param
from lab.measure.iperf3loss import (
    DRAIN_FACTOR,
    UDP_SETUP_ATTEMPTS,
    UDP_SETUP_WAIT_S,
    SetupWatch,
    UdpReceiving,
    lost_in_all,
    setup_lost,
)
from lab.measure.base import (
    Context,
    MeasurementFailed,
    Metric,
    describe_failure,
    family_of,
    invoke,
    wait_listening,
)

DEFAULT_PORT = 5201
#: the board's iperf3 in an arch node: its CPU cost is part of what a board measures
IPERF3 = Tool("iperf3", "iperf3", ("iperf3", "--version"), board=True)
BUSY = "the server is busy"

#: results.csv columns every iperf3 test (tcp, udp, udp-sweep) fills
IPERF3_METRICS = (
    Metric(
        "direction",
        "string",
        description="client-to-server or server-to-client (a bidir test: one record of each)",
    ),
    Metric(
        "throughput_bps",
        unit="bit/s",
        description="receiver_bps, the iperf3 receiver rate",
        source="receiver_bps",
    ),
    Metric("sender_bps", unit="bit/s", description="iperf3 sender rate"),
    Metric("receiver_bps", unit="bit/s", description="iperf3 receiver rate"),
    Metric(
        "streams",
        description="parallel streams in the record's direction (iperf3 -P, counted in "
        "end.streams; per-stream figures in results.jsonl)",
        summarised=False,
    ),
)

#: a test's `bidir` parameter (tcp, udp)
BIDIR_PARAM = Param(
    bool,
    False,
    doc="iperf3 --bidir: both directions at once, `streams` each way; one record per direction",
)


def check_bidir(params: dict[str, Any], *, source: str) -> dict[str, Any]:
    """ConfigError when validated tcp/udp params ask --bidir with what cannot go with it."""
    if not params.get("bidir"):
        return params
    if params["direction"] != "client-to-server":
        raise ConfigError(
            f"direction {params['direction']!r} with bidir = true (iperf3 refuses -R with "
            "--bidir); accepted: bidir = false, or direction unset (bidir measures both)",
            source=source,
            field="direction",
        )
    if params.get("adaptive"):
        raise ConfigError(
            "adaptive = true with bidir = true: adaptive length reads one receiver's "
            "per-second series (lab/measure/adaptive.py); accepted: adaptive = false on this "
            "test (a plan's adaptive = true or -o adaptive=true sets it), or bidir = false",
            source=source,
            field="adaptive",
        )
    return params


@contextmanager
def iperf3_server(
    ctx: Context, port: int, *, json: bool = False, interval_s: float | None = None
) -> Iterator[Path]:
    """iperf3 -s on the server node, bound to the target address, stopped in finally.

    Yields the server's log (its text report, kept with the raw output; with json=True its -J
    documents, which a client's --get-server-output then carries as server_output_json).
    `interval_s`: the server's report interval (-i), the receiver's intervals in those documents.
    """
    argv = ["iperf3", "-s", "-p", str(port)] + (["-J"] if json else [])
    if interval_s is not None:
        argv += ["-i", f"{interval_s:g}"]
    if family_of(ctx.server_addr):
        argv += ["-B", ctx.server_addr.strip("[]")]
    log = ctx.next_raw("iperf3-server", ".log")
    daemon = ctx.server.spawn(f"iperf3-server-{port}", argv, log=log)
    try:
        wait_listening(ctx.server, daemon, proto="tcp", port=port)
        yield log
    finally:
        ctx.server.stop(daemon)


def flow_start(
    ctx: Context,
    port: int,
    *,
    until: float,
    connections: int = 2,
    running: Callable[[], bool] | None = None,
) -> float:
    """time.monotonic() when the server first holds `connections` established connections on
    `port` (iperf3's control connection and its data streams; default one stream): where the
    receiver's interval clock starts (iperf3 starts its stream timers as it accepts the
    streams). Past `until`, or as soon as `running()` says the client is gone, now: the flow
    never started, which the client's own error then says."""
    while time.monotonic() < until and (running is None or running()):
        cp = ctx.server.run(
            ["ss", "-Htn", "state", "established", f"( sport = :{port} )"], check=False
        )
        if cp.returncode == 0 and len(cp.stdout.strip().splitlines()) >= connections:
            return time.monotonic()
        time.sleep(0.005)
    return time.monotonic()


def client_argv(
    addr: str,
    port: int,
    *,
    duration: float,
    omit: float = 0,
    streams: int = 1,
    reverse: bool = False,
    udp: bool = False,
    rate_bps: float | None = None,
    length: int | None = None,
    mss: int | None = None,
    server_output: bool = False,
    bidir: bool = False,
) -> list[str]:
    argv = [
        "iperf3",
        "-c",
        addr.strip("[]"),
        "-p",
        str(port),
        "-J",
        "-i",
        "1",
        "-t",
        _num(duration),
    ]
    if omit:
        argv += ["-O", _num(omit)]
    if streams != 1:
        argv += ["-P", str(streams)]
    if reverse:
        argv.append("-R")
    if bidir:  # both directions at once, -P streams each (iperf3 >= 3.7; refuses it with -R)
        argv.append("--bidir")
    if udp:
        argv.append("-u")
    if rate_bps is not None:
        argv += ["-b", str(int(rate_bps))]
    if length is not None:
        argv += ["-l", str(length)]
    if mss is not None:
        argv += ["-M", str(mss)]
    if server_output:  # the receiver's per-second view when the client sends (adaptive tests)
        argv.append("--get-server-output")
    return argv


@dataclass(frozen=True)
class ClientCall:
    """One iperf3 client invocation: its argv and what running it needs to know of it (kept
    beside the argv, never read back from it)."""

    argv: list[str]
    #: the server's port the client connects to, where a UDP run's set-up watch looks
    port: int
    udp: bool = False
    #: -R: the server sends, the client's node receives
    reverse: bool = False


def client_call(addr: str, port: int, **kw: Any) -> ClientCall:
    """client_argv's invocation with what run_client needs (same keywords)."""
    return ClientCall(
        client_argv(addr, port, **kw),
        port,
        udp=bool(kw.get("udp")),
        reverse=bool(kw.get("reverse")),
    )


def run_client(
    ctx: Context,
    call: ClientCall,
    *,
    expected_s: float,
    label: str,
    files: list[Path],
    busy_retries: int = 5,
    lost_setups: list[Path] | None = None,
) -> str:
    """Run the client and return its JSON text; retry while the server is still busy, and a
    UDP run whose stream set-up was lost (setup_lost) up to UDP_SETUP_ATTEMPTS times.

    `call` (client_call()): the argv, and its port, protocol and direction: a UDP run's set-up
    watch (iperf3loss.SetupWatch) looks for the client's stream sockets at the port and for
    datagrams at the receiving node.

    Appends every attempt's raw files to `files`, and the JSON file of every lost set-up that
    was tried again to `lost_setups` (its length is the record's `setup_retries`). Raises
    MeasurementFailed on a time-out or when there is no JSON; an iperf3 error document is left
    to the parser to report (a set-up lost in every attempt says so).
    """
    argv, udp = call.argv, call.udp
    receiver = ctx.client if call.reverse else ctx.server
    # a lost set-up ends the client UDP_SETUP_WAIT_S after it starts, whatever -t is: that
    # error must come before the lab's time-out, or it is not told from a hang
    base_s = max(expected_s, UDP_SETUP_WAIT_S) if udp else expected_s
    busy = lost = 0
    while True:
        inv = invoke(
            ctx,
            ctx.client,
            argv,
            label=label,
            suffix=".json",
            timeout=base_s + ctx.timeout_s,
            progress=UdpReceiving(receiver) if udp else None,
            max_timeout=base_s + expected_s * DRAIN_FACTOR + ctx.timeout_s,
            stall=SetupWatch(ctx.client, receiver, call.port) if udp else None,
        )
        files += inv.raw_files
        if inv.timed_out:
            msg = describe_failure(inv, "iperf3")
            if udp and UdpReceiving(receiver).still(step_s=1.0):
                msg += (
                    f" while {receiver.name} still received datagrams, {inv.seconds - expected_s:.0f}"
                    " s after its -t: the data path holds a backlog that the end-of-test "
                    "message waits behind (kernel-libipsec queues without bound; "
                    "docs/measurements.md 'iperf3 UDP under loss')"
                )
            raise MeasurementFailed(msg)
        doc: dict[str, Any] = {}
        if not inv.stalled:
            try:
                doc = json.loads(inv.stdout)
            except ValueError:
                msg = describe_failure(inv, "iperf3") + " (no JSON output)"
                raise MeasurementFailed(msg) from None
        if BUSY in str(doc.get("error", "")) and busy < busy_retries:
            busy += 1
            time.sleep(0.5 * busy)
            continue
        # a lost set-up: told early (iperf3loss.SetupWatch) or by iperf3 after its 30 s
        if inv.stalled or setup_lost(udp, doc):
            lost += 1
            if lost < UDP_SETUP_ATTEMPTS:
                if lost_setups is not None:
                    lost_setups.append(inv.raw_files[0])
                continue
            raise MeasurementFailed(lost_in_all(doc.get("error"), receiver.name))
        if inv.returncode != 0 and not doc.get("error"):
            raise MeasurementFailed(describe_failure(inv, "iperf3"))
        return inv.stdout


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)
