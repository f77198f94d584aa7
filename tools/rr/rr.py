#!/usr/bin/env python3
"""rr: request/response transactions per second over TCP or UDP (netperf TCP_RR/UDP_RR-like).

Why our own: sockperf's ping-pong mode echoes the request back (same size both ways, at least
14 bytes of its own header), so it cannot do study C's 1/1 and 516/4 byte exchanges.

    rr.py server --proto tcp --bind ADDR --port P --request N --response M
    rr.py client --proto tcp --host ADDR --port P --request N --response M --duration S

The client sends N bytes, waits for all M bytes of the answer, and repeats for S seconds; it
prints one JSON object: transactions, transactions/s and latency percentiles in microseconds.
UDP has no retransmission: an answer not back within --udp-timeout-ms (or refused by ICMP) counts
as a timeout and the client moves on (netperf's UDP_RR would stall forever); a late answer may
then be taken for the next one's, so under loss UDP latencies are approximate. Standard library only, so it runs on any
node with python3 >= 3.9; it stops by itself after --duration (client) and on SIGTERM (server).
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import threading
import time
from array import array


def percentile(sorted_values, q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of an already sorted sequence."""
    if not sorted_values:
        return float("nan")
    rank = max(1, -(-len(sorted_values) * q // 100))  # ceil without floats
    return float(sorted_values[int(rank) - 1])


def summarize(latencies_ns, elapsed_s: float, timeouts: int = 0) -> dict:
    lat = sorted(latencies_ns)
    n = len(lat)
    us = 1000.0
    out = {
        "transactions": n,
        "elapsed_s": elapsed_s,
        "tps": n / elapsed_s if elapsed_s > 0 else 0.0,
        "timeouts": timeouts,
        "latency_us": None,
    }
    if n:
        out["latency_us"] = {
            "min": lat[0] / us,
            "mean": sum(lat) / n / us,
            "p50": percentile(lat, 50) / us,
            "p90": percentile(lat, 90) / us,
            "p99": percentile(lat, 99) / us,
            "max": lat[-1] / us,
        }
    return out


def _recv_exact(sock, buf: memoryview, n: int) -> bool:
    got = 0
    while got < n:
        k = sock.recv_into(buf[got:n])
        if k == 0:
            return False
        got += k
    return True


def _family(host: str) -> int:
    return socket.getaddrinfo(host, None)[0][0]


def serve(proto: str, bind: str, port: int, request: int, response: int) -> None:
    reply = b"r" * response
    fam = _family(bind)
    if proto == "udp":
        s = socket.socket(fam, socket.SOCK_DGRAM)
        s.bind((bind, port))
        while True:
            _, peer = s.recvfrom(65535)
            s.sendto(reply, peer)
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((bind, port))
    s.listen(16)

    def handle(conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = memoryview(bytearray(max(request, 1)))
        with conn:
            while _recv_exact(conn, buf, request):
                conn.sendall(reply)

    while True:
        conn, _ = s.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def client(
    proto: str,
    host: str,
    port: int,
    request: int,
    response: int,
    duration: float,
    udp_timeout_ms: float,
) -> dict:
    payload = b"q" * request
    lat = array("q")
    timeouts = 0
    fam = _family(host)
    now = time.perf_counter_ns
    if proto == "tcp":
        s = socket.create_connection((host, port), timeout=10)
        s.settimeout(None)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = memoryview(bytearray(max(response, 1)))
        start = now()
        end = start + int(duration * 1e9)
        t = start
        while t < end:
            s.sendall(payload)
            if not _recv_exact(s, buf, response):
                raise SystemExit("rr: server closed the connection")
            t2 = now()
            lat.append(t2 - t)
            t = t2
    else:
        s = socket.socket(fam, socket.SOCK_DGRAM)
        s.connect((host, port))
        s.settimeout(udp_timeout_ms / 1000.0)
        start = now()
        end = start + int(duration * 1e9)
        t = start
        while t < end:
            s.send(payload)
            try:
                s.recv(65535)
            except TimeoutError:
                timeouts += 1
                t = now()
                continue
            except ConnectionRefusedError:
                # ICMP port unreachable: no server (yet). Count it as lost; do not spin.
                timeouts += 1
                time.sleep(udp_timeout_ms / 1000.0)
                t = now()
                continue
            t2 = now()
            lat.append(t2 - t)
            t = t2
    s.close()
    out = summarize(lat, (t - start) / 1e9, timeouts)
    out.update(tool="lab-rr", proto=proto, request_bytes=request, response_bytes=response)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("role", choices=("server", "client"))
    ap.add_argument("--proto", choices=("tcp", "udp"), default="tcp")
    ap.add_argument("--bind", default="0.0.0.0")
    ap.add_argument("--host")
    ap.add_argument("--port", type=int, default=7100)
    ap.add_argument("--request", type=int, default=1)
    ap.add_argument("--response", type=int, default=1)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--udp-timeout-ms", type=float, default=200.0)
    a = ap.parse_args(argv)
    if a.request < 1 or a.response < 1:
        ap.error("--request and --response must be >= 1")
    if a.role == "server":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        serve(a.proto, a.bind, a.port, a.request, a.response)
        return 0
    if not a.host:
        ap.error("client needs --host")
    print(
        json.dumps(
            client(a.proto, a.host, a.port, a.request, a.response, a.duration, a.udp_timeout_ms)
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
