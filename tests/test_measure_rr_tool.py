"""tools/rr/rr.py: its statistics, and a real exchange on loopback (no root needed)."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import threading
import time

import pytest

from lab.measure.rr import RR_PROGRAM, parse_rr

spec = importlib.util.spec_from_file_location("rr_tool", RR_PROGRAM)
rr_tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rr_tool)

#: seconds after which a call that should take well under one is taken to hang (not a speed)
HANG_S = 60


def test_percentile_nearest_rank():
    values = list(range(1, 101))
    assert rr_tool.percentile(values, 50) == 50
    assert rr_tool.percentile(values, 99) == 99
    assert rr_tool.percentile(values, 100) == 100
    assert rr_tool.percentile([7], 90) == 7


def test_summarize():
    s = rr_tool.summarize([1000, 2000, 3000, 4000], 2.0, timeouts=1)
    assert s["transactions"] == 4 and s["tps"] == 2.0 and s["timeouts"] == 1
    assert s["latency_us"] == {"min": 1.0, "mean": 2.5, "p50": 2.0, "p90": 4.0, "p99": 4.0,
                               "max": 4.0}  # fmt: skip
    assert rr_tool.summarize([], 1.0)["latency_us"] is None


def _free_port(kind) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_tcp(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("rr server did not listen")


@pytest.mark.parametrize(("proto", "req", "resp"), [("tcp", 1, 1), ("udp", 516, 4)])
def test_loopback_exchange(proto, req, resp):
    kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
    port = _free_port(kind)
    common = ["--proto", proto, "--port", str(port), "--request", str(req),
              "--response", str(resp)]  # fmt: skip
    server = subprocess.Popen(
        [sys.executable, str(RR_PROGRAM), "server", "--bind", "127.0.0.1", *common]
    )
    try:
        if proto == "tcp":
            _wait_tcp(port)
        else:
            time.sleep(0.5)  # UDP has no handshake to poll; the client's timeouts cover a miss
        out = subprocess.run(
            [sys.executable, str(RR_PROGRAM), "client", "--host", "127.0.0.1", *common,
             "--duration", "0.5"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=5)
    m = parse_rr(out)
    assert (m["proto"], m["request_bytes"], m["response_bytes"]) == (proto, req, resp)
    assert m["transactions"] > 0 and json.loads(out)["latency_us"]["p50"] > 0


def test_udp_timeouts_counted_not_hung():
    port = _free_port(socket.SOCK_DGRAM)  # nobody answers there
    got: dict = {}
    t = threading.Thread(
        target=lambda: got.update(
            out=rr_tool.client("udp", "127.0.0.1", port, 1, 1, 0.3, udp_timeout_ms=50)
        ),
        daemon=True,
    )
    t.start()
    t.join(HANG_S)  # the client runs 0.3 s: only a hang (a lost reply waited for) lasts this long
    assert not t.is_alive(), "the client hung on a reply that never came"
    out = got["out"]
    assert out["transactions"] == 0 and out["latency_us"] is None and out["timeouts"] > 0


def test_rejects_empty_messages():
    with pytest.raises(SystemExit):
        rr_tool.main(["client", "--host", "127.0.0.1", "--request", "0"])
