"""Parsers of the measurement tools, on golden outputs captured from the real tools."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.measure.base import MeasurementFailed
from lab.measure.iperf3json import parse_iperf3_tcp, parse_iperf3_udp
from lab.measure.mtu import parse_ip_link_mtu
from lab.measure.ping import parse_ping
from lab.measure.rr import parse_rr
from lab.measure.tcp import packet_rate

DATA = Path(__file__).parent / "data"


def golden(name: str) -> str:
    return (DATA / name).read_text()


# --- iperf3 TCP ---------------------------------------------------------------------------


def test_tcp_client_to_server_with_omit():
    m = parse_iperf3_tcp(golden("iperf3_tcp_c2s.json"))
    assert m["direction"] == "client-to-server"
    assert m["sender_bps"] == pytest.approx(17711729927.092445)
    assert m["receiver_bps"] == pytest.approx(17700742901.269733)
    assert m["retransmits"] == 47005
    assert m["tcp_mss"] == 1448 and m["tcp_mss_set"] is False
    assert (m["duration_s"], m["omit_s"], m["streams"]) == (3, 1, 1)
    assert m["iperf3_version"] == "iperf 3.12"
    # the warm-up interval is kept but flagged, so a consumer can drop it
    assert m["intervals"][0]["omitted"] is True
    assert [iv["omitted"] for iv in m["intervals"][1:]] == [False] * (len(m["intervals"]) - 1)
    assert all("retransmits" in iv for iv in m["intervals"])


def test_tcp_server_to_client_parallel_streams():
    m = parse_iperf3_tcp(golden("iperf3_tcp_s2c_p2.json"))
    assert m["direction"] == "server-to-client"
    assert m["streams"] == 2
    # with -R the server is the TCP sender; its retransmits come back in the results exchange
    assert m["retransmits"] == 43146
    assert m["receiver_bps"] == pytest.approx(20462234230.68481)
    assert m["cpu_server_pct"] == pytest.approx(97.3020708372534)


def test_tcp_small_mss():
    m = parse_iperf3_tcp(golden("iperf3_tcp_mss88.json"))
    assert m["tcp_mss"] == 88 and m["tcp_mss_set"] is True
    assert m["congestion"] == "bbr"


def test_tcp_ipv6_mss_reflects_mtu():
    m = parse_iperf3_tcp(golden("iperf3_tcp_ipv6.json"))
    assert m["tcp_mss"] == 1428  # 1500 - 40 - 20 - 12


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("iperf3_server_busy.json", "the server is busy"),
        ("iperf3_connection_refused.json", "Connection refused"),
    ],
)
def test_iperf3_error_documents(name, needle):
    with pytest.raises(MeasurementFailed, match=needle):
        parse_iperf3_tcp(golden(name))
    with pytest.raises(MeasurementFailed, match=needle):
        parse_iperf3_udp(golden(name))


def test_iperf3_not_json_or_unfinished():
    with pytest.raises(MeasurementFailed, match="not JSON"):
        parse_iperf3_tcp("iperf3: error - unable to connect")
    text = golden("iperf3_tcp_c2s.json")
    with pytest.raises(MeasurementFailed, match="not JSON"):
        parse_iperf3_tcp(text[: len(text) // 2])  # killed mid-run
    with pytest.raises(MeasurementFailed, match="no 'end'"):
        parse_iperf3_tcp('{"start": {}, "intervals": [], "end": {}}')


# --- packets/s ------------------------------------------------------------------------------


def test_packet_rate_default_mss_ipv4():
    r = packet_rate(1448 * 8 * 1000.0, 1448, mss_set=False, family=4)
    assert r["payload_bytes_per_packet"] == 1448
    assert r["packets_per_s"] == pytest.approx(1000.0)
    assert r["header_bytes_per_packet"] == 66
    assert r["wire_bps"] == pytest.approx(1000 * (1448 + 66) * 8)
    assert "Ethernet 14 + IPv4 20 + TCP 20 + timestamps 12" in r["pps_assumption"]


def test_packet_rate_set_mss_subtracts_timestamps_and_ipv6_headers():
    r = packet_rate(76 * 8 * 500.0, 88, mss_set=True, family=6)
    assert r["payload_bytes_per_packet"] == 76
    assert r["packets_per_s"] == pytest.approx(500.0)
    assert r["header_bytes_per_packet"] == 86


def test_packet_rate_without_data():
    assert packet_rate(None, 1448, mss_set=False, family=4) == {"packets_per_s": None}


# --- iperf3 UDP ---------------------------------------------------------------------------


def test_udp_400m():
    m = parse_iperf3_udp(golden("iperf3_udp_400m_1300.json"))
    assert m["target_bps"] == 400_000_000 and m["datagram_bytes"] == 1300
    assert m["sender_bps"] == pytest.approx(399724568.0135118)
    assert m["receiver_bps"] == pytest.approx(394546174.98229915)
    assert m["jitter_ms"] == pytest.approx(0.010915398441984744)
    assert (m["packets_sent"], m["packets_lost"], m["packets_received"]) == (76917, 993, 75924)
    assert m["loss_pct"] == pytest.approx(100 * 993 / 76917)
    assert m["sent_pps"] == pytest.approx(76917 / 2.00122)
    assert m["received_pps"] == pytest.approx(75924 / 2.001311)
    assert all("packets" in iv for iv in m["intervals"])


def test_udp_1m_small_datagrams():
    m = parse_iperf3_udp(golden("iperf3_udp_1m_256.json"))
    assert m["datagram_bytes"] == 256
    assert m["loss_pct"] == 0
    assert m["sent_pps"] == pytest.approx(1_000_000 / 8 / 256, rel=0.05)


def test_udp_old_iperf3_without_sum_sent():
    """iperf3 3.9 (Debian 11 on the boards) has only end.sum; sender == receiver numbers."""
    import json

    doc = json.loads(golden("iperf3_udp_400m_1300.json"))
    del doc["end"]["sum_sent"], doc["end"]["sum_received"]
    m = parse_iperf3_udp(json.dumps(doc))
    assert m["packets_sent"] == 76917 and m["packets_lost"] == 993
    assert m["jitter_ms"] == pytest.approx(0.010915398441984744)


# --- ping -------------------------------------------------------------------------------------


def test_ping_ipv4_ok():
    m = parse_ping(golden("ping_ipv4_ok.txt"))
    assert (m["transmitted"], m["received"], m["loss_pct"]) == (10, 10, 0.0)
    assert (m["rtt_min_ms"], m["rtt_avg_ms"], m["rtt_max_ms"], m["rtt_mdev_ms"]) == (
        0.016,
        0.027,
        0.036,
        0.006,
    )
    assert [r["seq"] for r in m["rtts"]] == list(range(1, 11))
    assert m["rtts"][0]["rtt_ms"] == 0.036
    assert min(r["rtt_ms"] for r in m["rtts"]) == m["rtt_min_ms"]


def test_ping_ipv6_ok():
    m = parse_ping(golden("ping_ipv6_ok.txt"))
    assert (m["transmitted"], m["received"]) == (5, 5)
    assert m["rtt_max_ms"] == 0.038 and len(m["rtts"]) == 5


def test_ping_partial_loss_series_has_gaps():
    m = parse_ping(golden("ping_ipv4_partial_loss.txt"))
    assert (m["transmitted"], m["received"]) == (12, 8)
    assert m["loss_pct"] == pytest.approx(33.3333)
    assert [r["seq"] for r in m["rtts"]] == [1, 2, 3, 4, 9, 10, 11, 12]


@pytest.mark.parametrize(
    "name",
    ["ping_ipv4_total_loss.txt", "ping_ipv4_unreachable.txt", "ping_ipv4_host_unreachable.txt"],
)
def test_ping_total_loss(name):
    m = parse_ping(golden(name))
    assert m["received"] == 0 and m["loss_pct"] == 100.0
    assert m["rtts"] == [] and m["rtt_avg_ms"] is None


def test_ping_df_too_big_gives_mtu_hint():
    m = parse_ping(golden("ping_ipv4_df_too_big.txt"))
    assert m["received"] == 0 and m["errors"] == 1
    assert m["mtu_hint"] == 1420
    assert m["local_error"] == "message too long, mtu=1420"
    m6 = parse_ping(golden("ping_ipv6_df_too_big.txt"))
    assert m6["mtu_hint"] == 1420 and m6["errors"] == 1


def test_ping_df_ok():
    m = parse_ping(golden("ping_ipv4_df_ok.txt"))
    assert m["received"] == 1 and m["mtu_hint"] is None


def test_ping_duplicates_and_hop_frag_needed():
    text = (
        "PING 198.18.0.2 (198.18.0.2) 1400(1428) bytes of data.\n"
        "From 198.18.0.254 icmp_seq=1 Frag needed and DF set (mtu = 1400)\n"
        "64 bytes from 198.18.0.2: icmp_seq=2 ttl=64 time=1.50 ms\n"
        "64 bytes from 198.18.0.2: icmp_seq=2 ttl=64 time=1.70 ms (DUP!)\n"
        "\n--- 198.18.0.2 ping statistics ---\n"
        "2 packets transmitted, 1 received, +1 duplicates, +1 errors, 50% packet loss, time 1001ms\n"
        "rtt min/avg/max/mdev = 1.500/1.600/1.700/0.100 ms\n"
    )
    m = parse_ping(text)
    assert m["mtu_hint"] == 1400
    assert (m["duplicates"], m["errors"]) == (1, 1)
    assert m["rtts"] == [{"seq": 2, "rtt_ms": 1.5}]


def test_ping_busybox_summary():
    text = (
        "PING 198.18.0.2 (198.18.0.2): 56 data bytes\n"
        "64 bytes from 198.18.0.2: seq=0 ttl=64 time=0.101 ms\n"
        "\n--- 198.18.0.2 ping statistics ---\n"
        "1 packets transmitted, 1 packets received, 0% packet loss\n"
        "round-trip min/avg/max = 0.101/0.101/0.101 ms\n"
    )
    m = parse_ping(text)
    assert (m["received"], m["rtt_avg_ms"], m["rtt_mdev_ms"]) == (1, 0.101, None)


def test_ping_without_summary_fails():
    with pytest.raises(MeasurementFailed):
        parse_ping("ping: unknown host nowhere\n")


# --- ip link, rr ------------------------------------------------------------------------------


def test_ip_link_mtu():
    assert parse_ip_link_mtu(golden("ip_link_show_veth_mtu1420.json")) == 1420
    with pytest.raises(MeasurementFailed):
        parse_ip_link_mtu("[]")


def test_rr_tcp_and_udp_outputs():
    t = parse_rr(golden("rr_tcp_1_1.json"))
    assert (t["proto"], t["request_bytes"], t["response_bytes"]) == ("tcp", 1, 1)
    assert t["transactions_per_s"] > 10_000
    assert t["latency_min_us"] <= t["latency_p50_us"] <= t["latency_p99_us"] <= t["latency_max_us"]
    u = parse_rr(golden("rr_udp_516_4.json"))
    assert (u["proto"], u["request_bytes"], u["response_bytes"]) == ("udp", 516, 4)
    assert u["timeouts"] == 0


def test_rr_rejects_foreign_output():
    with pytest.raises(MeasurementFailed):
        parse_rr('{"tps": 1}')
    with pytest.raises(MeasurementFailed):
        parse_rr("Traceback (most recent call last):")
