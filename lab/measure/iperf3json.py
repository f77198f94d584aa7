"""The pure parsers of iperf3's JSON (tcp, udp, udp-sweep, rrul, handshake and the stand-in
calibration): per-second intervals, per-stream and per-direction figures, a --bidir document
split into its two directions. Nothing here runs a process (lab.measure.iperf3 does).
"""

from __future__ import annotations

import json
from typing import Any

from lab.measure.base import MeasurementFailed


def records_of(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """A parsed document's metrics as one dict per direction it measured (a --bidir
    document's `reverse` becomes the second)."""
    reverse = metrics.pop("reverse", None)
    return [metrics] if reverse is None else [metrics, reverse]


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
