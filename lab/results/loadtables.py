"""The report's tables of latency under load (rrul) and of where a datagram or echo test's loss
came from. Split out of lab.results.report (its 500-line limit); called from its results
section."""

from __future__ import annotations

import re

from lab.results.doc import cells, failed_mark, mean_of, rows_where, stat_cell, stats_of

#: the rrul table's columns: (results.csv column, header, scale)
RRUL_COLUMNS = (
    ("rrul_c2s_bps", "up Mbit/s", 1e-6),
    ("rrul_s2c_bps", "down Mbit/s", 1e-6),
    ("rrul_total_bps", "total Mbit/s", 1e-6),
    ("rtt_idle_p50_ms", "idle p50 ms", 1.0),
    ("rtt_loaded_p50_ms", "loaded p50 ms", 1.0),
    ("rtt_loaded_p90_ms", "loaded p90 ms", 1.0),
    ("rtt_loaded_p99_ms", "loaded p99 ms", 1.0),
    ("latency_inflation_ms", "inflation ms", 1.0),
    ("link_inflation_ms", "of it the link's ms", 1.0),
    ("vpn_inflation_ms", "the VPN's own ms", 1.0),
    ("responsiveness_rpm", "RPM", 1.0),
)
#: columns shown only when some row has them (runs before the underlay probe have none)
OPTIONAL = {"link_inflation_ms", "vpn_inflation_ms"}


def rrul_table(doc, label, test, rows_l, profiles, points) -> None:
    """Latency under load per profile and condition: each direction's throughput, the RTT idle
    and loaded, the inflation (the link's and the VPN's own where the underlay was probed) and
    the responsiveness (docs/measurements.md "Latency under load")."""
    cols = [
        c
        for c in RRUL_COLUMNS
        if c[0] not in OPTIONAL or any(r.get(c[0]) is not None for r in rows_l if r["ok"])
    ]
    out = []
    for prof, pt, rs, failed, _ in cells(rows_l, profiles, points):
        figures = [stat_cell(stats_of([r.get(c) for r in rs]), k) for c, _, k in cols]
        out.append([prof + failed_mark(failed), pt] + figures)
    split = len(cols) < len(RRUL_COLUMNS)
    doc.p(
        f"**{label}** ({test}): latency under load, up = client to server, down = server to "
        "client (receiver rates, all flows); RTT = ping idle, then under the flows; inflation = "
        "loaded p50 - idle p50"
        + (
            ""
            if split
            else "; of it the link's = the same for a ping to the server's underlay address "
            "beside the tunnel's, the VPN's own = the rest (no tunnel: all the link's)"
        )
        + "; RPM = 60000 / loaded p50 (round trips a minute)"
    )
    doc.table(["profile", "condition"] + [h for _, h, _ in cols], out)


_SPEC_LOSS = re.compile(r"\bloss\s+(?:random\s+)?([\d.]+)%")
#: a test's loss (%) above which the report says where it came from
LOSS_WORTH_EXPLAINING = 1.0
#: tests whose every datagram crosses the impaired path twice (request and reply)
ROUND_TRIP = {"ping", "ping-flood"}


def condition_loss(spec: str, test: str) -> tuple[float, str]:
    """The loss (%) the network condition alone gives a test, and how it was worked out: the
    spec's `loss P%` for a one-way datagram, 1 - (1 - P)^2 for an echo and its reply (every
    placement impairs both directions)."""
    m = _SPEC_LOSS.search(spec or "")
    p = float(m.group(1)) if m else 0.0
    if test in ROUND_TRIP and p:
        both = 100.0 * (1 - (1 - p / 100.0) ** 2)
        return both, f"{both:.3g} % ({p:g} % each way)"
    return p, f"{p:g} %"


def loss_notes(doc, label, test, rows_l, results, profiles, points) -> None:
    """Where the loss of a datagram test came from, as far as its records say: what the sender
    could not send of the target, what the network condition drops by itself, what is left for
    the path (tunnel daemons, their replay windows, queues), and reordering where counted."""
    by_case = {r["case"]: r for r in results}
    out = []
    for prof in profiles:
        for pt in points:
            rs = rows_where(rows_l, profile=prof, impairment=pt, point=0, ok=True)
            loss = mean_of([r["loss_pct"] for r in rs])
            if not rs or loss is None or loss <= LOSS_WORTH_EXPLAINING:
                continue
            spec = rs[0]["impairment_spec"] or ""
            cond, cond_words = condition_loss(spec, test)
            sent = mean_of([r.get("sent_pps") for r in rs])
            target = mean_of([r.get("target_pps") for r in rs])
            ooo = mean_of(
                [((by_case.get(r["case"]) or {}).get("records") or [{}])[0].get("out_of_order")
                 for r in rs]
            )  # fmt: skip
            out.append(
                [
                    prof,
                    pt,
                    f"{loss:.1f} %",
                    cond_words + (f" (`{spec}`)" if spec else ""),
                    f"{max(0.0, loss - cond):.1f} %",
                    f"{100 * sent / target:.0f} %" if sent and target else "-",
                    f"{ooo:.0f}" if ooo is not None else "not recorded",
                ]
            )
    if not out:
        return
    doc.p(
        f"**Where {label}'s loss comes from.** Of the datagrams sent, the network condition "
        "drops its own share (an echo and its reply both cross it); the rest was lost on the way "
        "through the tunnel: its daemons (a replay window drops datagrams that jitter reordered "
        "too far), their sockets, or the queues. The records hold no daemon counters, so that "
        "rest is not split further; datagrams out of order point at reordering, a sender below "
        "its target at the sender."
    )
    doc.table(
        ["profile", "condition", "lost", "the condition's own loss", "lost on the way",
         "sent of the target", "out of order per test"],
        out,
    )  # fmt: skip
