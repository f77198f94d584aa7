"""iperf3 plumbing shared by the tcp, udp, udp-sweep, rrul and handshake tests: one server per
test run, the moment its flows are established, client invocations with their JSON streamed to
raw files, and the pure parsers of that JSON.

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


def records_of(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """A parsed document's metrics as one dict per direction it measured (a --bidir
    document's `reverse` becomes the second)."""
    reverse = metrics.pop("reverse", None)
    return [metrics] if reverse is None else [metrics, reverse]


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


def _load(json_text: str) -> dict[str, Any]:
    try:
        doc = json.loads(json_text)
    except ValueError as e:
        raise MeasurementFailed(f"iperf3 output is not JSON: {e}") from None
    if doc.get("error"):
        raise MeasurementFailed(f"iperf3: {doc['error']}")
    if not doc.get("end"):
        raise MeasurementFailed("iperf3 output has no 'end' section (run did not finish)")
    return doc


def _intervals(doc: dict[str, Any], *, udp: bool, key: str = "sum") -> list[dict[str, Any]]:
    """Per-second figures of one direction: `sum` (the only one, or --bidir's client-to-server),
    `sum_bidir_reverse` (--bidir's server-to-client)."""
    out = []
    for iv in doc.get("intervals", []):
        s = iv.get(key)
        if s is None:
            continue
        row = {
            "start": s["start"],
            "end": s["end"],
            "bps": s["bits_per_second"],
            "omitted": bool(s.get("omitted", False)),
        }
        if "retransmits" in s:
            row["retransmits"] = s["retransmits"]
        if udp and "packets" in s:
            row["packets"] = s["packets"]
        out.append(row)
    return out


def common_fields(doc: dict[str, Any]) -> dict[str, Any]:
    """The figures every direction of a document shares: direction, streams, version, CPU."""
    ts = doc["start"].get("test_start", {})
    cpu = doc["end"].get("cpu_utilization_percent", {})
    server = doc.get("server_output_json")
    extra = {"server_intervals": _intervals(server, udp=False)} if server else {}
    return {
        **extra,
        "direction": "server-to-client" if ts.get("reverse") else "client-to-server",
        "streams": ts.get("num_streams"),
        "duration_s": ts.get("duration"),
        "omit_s": ts.get("omit"),
        "iperf3_version": doc["start"].get("version"),
        "cpu_client_pct": cpu.get("host_total"),
        "cpu_server_pct": cpu.get("remote_total"),
    }


def is_bidir(doc: dict[str, Any]) -> bool:
    """An ``iperf3 --bidir`` document: its `end` has the server-to-client sums as well."""
    return "sum_sent_bidir_reverse" in doc.get("end", {})


def _client_sends(stream: dict[str, Any]) -> bool | None:
    """Whether the client sent this `end.streams` entry: iperf3's `sender` flag is the client's
    role in the stream (also with -R, where it is false), whatever the document's direction."""
    part = stream.get("udp") or stream.get("sender") or {}
    return part.get("sender")


def _per_stream(doc: dict[str, Any], *, udp: bool, client_sends: bool) -> list[dict[str, Any]]:
    """`end.streams` of one direction, one entry per stream (socket), in iperf3's order.

    tcp: the sender's and receiver's rate and bytes and the sender's retransmits. udp: iperf3
    merges a stream's two ends into one `udp` object: the sender's rate and bytes, the
    receiver's jitter and losses (`packets` = datagrams the sender numbered).
    """
    out = []
    for s in doc["end"].get("streams", []):
        flag = _client_sends(s)
        if flag is not None and flag is not client_sends:  # no flag (iperf3 < 3.10): one way
            continue
        if udp:
            u = s.get("udp", {})
            packets, lost = u.get("packets"), u.get("lost_packets")
            out.append(
                {
                    "socket": u.get("socket"),
                    "sender_bps": u.get("bits_per_second"),
                    "sender_bytes": u.get("bytes"),
                    "jitter_ms": u.get("jitter_ms"),
                    "packets_sent": packets,
                    "packets_lost": lost,
                    "loss_pct": 100.0 * lost / packets if packets and lost is not None else None,
                    "out_of_order": u.get("out_of_order"),
                }
            )
        else:
            snd, rcv = s.get("sender", {}), s.get("receiver", {})
            out.append(
                {
                    "socket": snd.get("socket"),
                    "sender_bps": snd.get("bits_per_second"),
                    "receiver_bps": rcv.get("bits_per_second"),
                    "sender_bytes": snd.get("bytes"),
                    "receiver_bytes": rcv.get("bytes"),
                    "retransmits": snd.get("retransmits"),
                }
            )
    return out


def _directions(doc: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(direction, suffix of its `end.sum_*` keys, its key in `intervals[]`) of each direction
    the document measured: one, or with --bidir client-to-server then server-to-client."""
    if is_bidir(doc):
        return [
            ("client-to-server", "", "sum"),
            ("server-to-client", "_bidir_reverse", "sum_bidir_reverse"),
        ]
    return [(common_fields(doc)["direction"], "", "sum")]


def _split(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The first direction's metrics; with --bidir the second's under `reverse` (complete, the
    common figures included), so a caller makes one record of each."""
    out = parts[0]
    if len(parts) > 1:
        out["bidir"] = True
        out["reverse"] = {**parts[1], "bidir": True}
    return out


def parse_iperf3_tcp(json_text: str) -> dict[str, Any]:
    """Metrics of an ``iperf3 -J`` TCP run. Raises MeasurementFailed on an error document.

    sender/receiver are the TCP roles, whichever node they ran on (with -R the server sends).
    A --bidir document gives client-to-server here and server-to-client under `reverse`
    (`end.sum_*_bidir_reverse`, `intervals[].sum_bidir_reverse`), each with its own streams.
    """
    doc = _load(json_text)
    end = doc["end"]
    start = doc["start"]
    mss_set = "tcp_mss" in start and bool(start["tcp_mss"])
    parts = []
    for direction, suffix, iv_key in _directions(doc):
        sent, recv = end.get("sum_sent" + suffix, {}), end.get("sum_received" + suffix, {})
        client_sends = direction == "client-to-server"
        streams = _per_stream(doc, udp=False, client_sends=client_sends)
        # --bidir's reverse direction is sent by the other end: its algorithm is the one
        # iperf3 reports as the receiver's (the same name on both ends unless set per host)
        cc_key = "receiver_tcp_congestion" if suffix else "sender_tcp_congestion"
        parts.append(
            {
                **common_fields(doc),
                "direction": direction,
                "streams": len(streams) or start.get("test_start", {}).get("num_streams"),
                "per_stream": streams,
                "sender_bps": sent.get("bits_per_second"),
                "receiver_bps": recv.get("bits_per_second"),
                "sender_bytes": sent.get("bytes"),
                "receiver_bytes": recv.get("bytes"),
                "retransmits": sent.get("retransmits"),
                "tcp_mss": start.get("tcp_mss") if mss_set else start.get("tcp_mss_default"),
                "tcp_mss_set": mss_set,
                "congestion": end.get(cc_key),
                "intervals": _intervals(doc, udp=False, key=iv_key),
            }
        )
    return _split(parts)


def parse_iperf3_udp(json_text: str) -> dict[str, Any]:
    """Metrics of an ``iperf3 -u -J`` run: achieved rate, jitter, lost/sent, packets/s.

    iperf3 >= 3.10 reports sum_sent (sender) and sum_received (receiver: its `packets` counts
    every datagram the sender numbered, `lost_packets` those that never came). Older versions
    (Debian 11 on the boards ships 3.9) have only `sum`, from the receiver's report. A --bidir
    document gives client-to-server here and server-to-client under `reverse`
    (`end.sum_sent_bidir_reverse` / `sum_received_bidir_reverse`).
    """
    doc = _load(json_text)
    end = doc["end"]
    ts = doc["start"].get("test_start", {})
    parts = []
    for direction, suffix, iv_key in _directions(doc):
        total = end.get("sum" + suffix, {})
        sent = end.get("sum_sent" + suffix, total)
        recv = end.get("sum_received" + suffix, total)
        packets = recv.get("packets") or sent.get("packets") or 0
        lost = recv.get("lost_packets", 0)
        sent_s = sent.get("seconds") or 0
        recv_s = recv.get("seconds") or 0
        received = packets - lost
        streams = _per_stream(doc, udp=True, client_sends=direction == "client-to-server")
        parts.append(
            {
                **common_fields(doc),
                "direction": direction,
                "streams": len(streams) or ts.get("num_streams"),
                "per_stream": streams,
                "target_bps": ts.get("target_bitrate"),
                "datagram_bytes": ts.get("blksize"),
                "sender_bps": sent.get("bits_per_second"),
                "receiver_bps": recv.get("bits_per_second"),
                "jitter_ms": recv.get("jitter_ms"),
                "packets_sent": packets,
                "packets_lost": lost,
                "packets_received": received,
                "loss_pct": (100.0 * lost / packets) if packets else None,
                "out_of_order": sum(s.get("out_of_order") or 0 for s in streams),
                "sent_pps": packets / sent_s if sent_s else None,
                "received_pps": received / recv_s if recv_s else None,
                "intervals": _intervals(doc, udp=True, key=iv_key),
            }
        )
    return _split(parts)
