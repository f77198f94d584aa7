"""results.csv's columns: their order, dtype and meaning (docs/results.md), and which of them
summary.csv summarises. The common columns are declared here; the tests' metric columns come
from the `metrics` the tests declare (lab.measure.base.Metric), in the places named here."""

from __future__ import annotations

from lab.measure import TESTS, metric_columns

#: results.csv's column order: the common columns as (name, dtype, meaning) and, by name only,
#: the places of the tests' metric columns (their dtype and meaning come from the `metrics` the
#: tests declare, lab.measure.base.Metric). dtype is the pandas dtype after read_csv: "string"
#: (object), "int64" (never empty), "float64" (empty = not measured), "bool".
#: Frozen: a column keeps its place, so older readers and runs already written stay valid. A
#: metric column a test declares that is not named here is appended after the last entry, in
#: registry order; before adding a common column, name those appended columns here first.
#: docs/results.md documents the same list; tests/test_results.py checks they agree.
LAYOUT: list[tuple[str, str, str] | str] = [
    ("run", "string", "run directory name"),
    ("case", "string", "profile|impairment|test label|rep: the key --resume matches on"),
    ("profile", "string", "VPN profile spec"),
    ("driver", "string", "VPN driver of the profile"),
    ("datapath", "string", "data-plane path the driver chose (describe()['path'])"),
    ("impairment", "string", "impairment point name ('none', a preset, 'delay-40ms', ...)"),
    ("impairment_spec", "string", "tc-netem words requested (empty: none)"),
    ("sweep_parameter", "string", "swept parameter (delay, jitter, loss, ...), empty otherwise"),
    ("sweep_value", "float64", "its value at this point (ms, %, Mbit/s)"),
    ("test", "string", f"registered test ({', '.join(sorted(TESTS))})"),
    ("test_label", "string", "the plan's label for the test entry"),
    ("ip", "int64", "IP version of the traffic address the test targeted (4 or 6)"),
    ("rep", "int64", "repetition, from 0"),
    ("point", "int64", "index of the record in the case (udp-sweep step, mtu family, direction)"),
    ("ok", "bool", "the measurement succeeded"),
    ("error", "string", "why not (tool error, tunnel failure), empty when ok"),
    ("started_utc", "string", "start of the case, ISO 8601 UTC"),
    ("case_seconds", "float64", "wall time of the test run (servers and tools included)"),
    # the tests' metric columns of schema 1 in their places (dtype, meaning: the tests' Metric)
    "direction",
    "throughput_bps",
    "sender_bps",
    "receiver_bps",
    "retransmits",
    "tcp_mss",
    "packets_per_s",
    "rate_mbit",
    "size",
    "target_pps",
    "sent_pps",
    "received_pps",
    "jitter_ms",
    "loss_pct",
    "packets_sent",
    "packets_lost",
    "rtt_min_ms",
    "rtt_avg_ms",
    "rtt_max_ms",
    "rtt_mdev_ms",
    "iface_mtu",
    "path_mtu",
    "transactions_per_s",
    "latency_p50_us",
    "latency_p99_us",
    "seconds",
    ("cpu_vpn_client_pct", "float64", "mean CPU of the VPN client node's cgroup, % of one core"),
    ("cpu_vpn_server_pct", "float64", "mean CPU of the VPN server node's cgroup, % of one core"),
    ("cpu_traffic_client_pct", "float64", "same for the traffic client node"),
    ("cpu_traffic_server_pct", "float64", "same for the traffic server node"),
    ("host_busy_pct", "float64", "mean busy share of all host cores (host-wide, /proc/stat)"),
    ("host_softirq_pct", "float64", "mean softirq share of all host cores (host-wide)"),
    ("daemon_cpu_pct", "float64", "sum of the VPN daemons' mean CPU, % of one core"),
    ("daemon_rss_mb", "float64", "sum of the VPN daemons' peak resident memory, MiB"),
    ("raw_files", "string", "raw tool output of the case, ';'-separated, relative to the run"),
    ("host_clock_min_mhz", "float64", "lowest clock of any host core during the test (cpufreq)"),
    ("host_clock_mean_mhz", "float64", "mean clock over the host's cores and samples (cpufreq)"),
    ("host_temp_max_c", "float64", "highest temperature any host sensor reported, deg C"),
    ("host_mem_used_max_mb", "float64", "peak host memory in use (psutil 'used'), MiB"),
    ("host_mem_available_min_mb", "float64", "lowest host memory available (psutil), MiB"),
    (
        "throttled",
        "float64",
        "seconds the CPU-capped nodes' groups were throttled during the test (CFS), summed",
    ),
    # metric columns appended later, frozen in their places
    "echo_requests",
    "echo_replies",
    "flood_time_ms",
    ("throttled_periods", "float64", "CFS periods in which a capped node's group was throttled"),
    (
        "firmware_throttled",
        "float64",
        "1: the Pi firmware throttled/capped/under-volted (vcgencmd), else 0",
    ),
    # frozen where they were before test kinds registered ahead of them (handshake)
    "stop_reason",
    "measured_s",
    "ci_rel_pct",
    "stopped_after_s",
    "partial_bytes",
    "partial_rate_bps",
    "projected_s",
    "streams",
    # the handshake test's, frozen where they were written before the next common column
    "handshake_ms",
    "handshake_completed",
    "handshake_status",
    "rekey_before_bps",
    "rekey_min_bps",
    "rekey_dip_pct",
    "rekey_noise_pct",
    "rekey_recovery_s",
    "rekey_status",
    "rekey_retransmits",
    "rekey_keys_s",
    "rekey_evidence",
    (
        "not_applicable",
        "string",
        "why the row does not apply to the lab (IPv6 over an IPv4-only tunnel): ok, no metric; "
        "empty otherwise",
    ),
    # the rrul test's (issue 33), after the last common column
    "rrul_c2s_bps",
    "rrul_s2c_bps",
    "rrul_total_bps",
    "rtt_idle_p50_ms",
    "rtt_idle_p90_ms",
    "rtt_idle_p99_ms",
    "rtt_loaded_p50_ms",
    "rtt_loaded_p90_ms",
    "rtt_loaded_p99_ms",
    "rtt_loaded_loss_pct",
    "latency_inflation_ms",
    "responsiveness_rpm",
    # added later, frozen here (what each holds, which test fills it: docs/results.md): handshake
    # (quiet_*, key_exchange_*), rrul (link_*, vpn_inflation_ms), scp, udp and udp-sweep
    *"quiet_wait_s quiet_status key_exchange_ms key_exchange_bytes key_exchange_packets".split(),
    *"link_rtt_idle_p50_ms link_rtt_loaded_p50_ms link_inflation_ms vpn_inflation_ms".split(),
    *"copied_bytes setup_retries".split(),
    ("nic_latency_applied", "float64", "1: the boards' NIC latency was in force, 0: not"),
]


def _columns() -> tuple[list[tuple[str, str, str]], set[str]]:
    """(CSV_COLUMNS, the float columns summary.csv leaves out)."""
    metrics = metric_columns()
    common = {e[0] for e in LAYOUT if isinstance(e, tuple)}
    clash = sorted(common & set(metrics))
    if clash:
        raise TypeError(f"tests declare metric columns that are common columns: {clash}")
    out: list[tuple[str, str, str]] = []
    for entry in LAYOUT:
        if isinstance(entry, tuple):
            out.append(entry)
            continue
        col = metrics.get(entry)
        if col is None:
            raise TypeError(f"results.csv column {entry!r} is declared by no test in lab.measure")
        out.append((col.name, col.dtype, col.meaning))
    placed = {c[0] for c in out}
    out += [(c.name, c.dtype, c.meaning) for c in metrics.values() if c.name not in placed]
    unsummarised = {"sweep_value"} | {c.name for c in metrics.values() if not c.summarised}
    return out, unsummarised


CSV_COLUMNS, NOT_SUMMARISED = _columns()
COLUMN_NAMES = [c[0] for c in CSV_COLUMNS]
COMMON_COLUMNS = {e[0] for e in LAYOUT if isinstance(e, tuple)}
#: the tests' metric columns in CSV order, with their dtype
METRIC_COLUMNS = [(n, t) for n, t, _ in CSV_COLUMNS if n not in COMMON_COLUMNS]
#: numeric columns summarised per case in summary.csv
SUMMARY_METRICS = [n for n, t, _ in CSV_COLUMNS if t == "float64" and n not in NOT_SUMMARISED]
