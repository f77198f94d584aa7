"""The report's tables of a tunnel's set-up and rekey (docs/measurements.md "Handshake and
rekey"): the cold establishment per profile and condition, with a profile's own key exchange
beside it (Rosenpass's), and what a forced rekey cost a running TCP flow. lab.results.report
shows them for a test that declares it draws them (Test.plots "establishment", "rekey") and
whose rows measured them; the rows are results.csv's, the key exchange's name results.jsonl's.
"""

from __future__ import annotations

from collections import Counter

from lab.results.doc import Doc, cells, failed_mark, metric_name, stat_cell, stats_of

#: the status columns: a row measured the establishment, the rekey, when it has one
ESTABLISHMENT_STATUS = "handshake_status"
REKEY_STATUS = "rekey_status"
#: a key exchange of the profile's own, beside the handshake: (results.csv column, unit)
KEY_EXCHANGE_COLUMNS = (
    ("key_exchange_ms", "ms"),
    ("key_exchange_bytes", "bytes"),
    ("key_exchange_packets", "packets"),
)
#: the rekey table's figures: (results.csv column, unit)
REKEY_COLUMNS = (
    ("rekey_keys_s", "s"),
    ("rekey_dip_pct", "%"),
    ("rekey_noise_pct", "%"),
    ("rekey_recovery_s", "s"),
    ("rekey_retransmits", "segments"),
)


def measured(rows_l: list[dict], status: str) -> bool:
    """Did any row of a test entry measure what `status` (a status column) reports?"""
    return any(r.get(status) for r in rows_l)


def statuses(rs: list[dict], col: str) -> str:
    """How many repetitions ended in each status of `col`, in the order they first came:
    "1 recovered, 1 failed after 30.0 s"."""
    return ", ".join(f"{n} {s}" for s, n in Counter(r[col] for r in rs if r.get(col)).items())


def _figures(rs: list[dict], cols) -> list[str]:
    return [stat_cell(stats_of([r.get(c) for r in rs]), 1.0) for c, _ in cols]


def establishment_table(doc: Doc, label, test, rows_l, profiles, points, results) -> None:
    """Per profile and condition: the cold establishment's time over the repetitions that got a
    reply, how many did (the others' statuses), and where a profile has a key exchange of its
    own, its time, traffic and frames."""
    kx = any(r.get("key_exchange_ms") is not None for r in rows_l)
    out = []
    for prof, pt, rs, failed, _ in cells(rows_l, profiles, points):
        tried = [r for r in rs if r.get(ESTABLISHMENT_STATUS)]
        done = sum(1 for r in tried if r[ESTABLISHMENT_STATUS] == "established")
        est = f"{done} of {len(tried)}" if tried else "-"
        if others := statuses(
            [r for r in tried if r[ESTABLISHMENT_STATUS] != "established"],
            ESTABLISHMENT_STATUS,
        ):
            est += f" ({others})"
        row = [prof, pt, stat_cell(stats_of([r.get("handshake_ms") for r in rs]), 1.0)]
        row.append(est + failed_mark(failed))
        out.append(row + (_figures(rs, KEY_EXCHANGE_COLUMNS) if kx else []))
    text = (
        f"**{label}** ({test}): cold establishment; {metric_name('handshake_ms')} = the driver's "
        "start (configs written, daemons launched) to the first ping reply through the tunnel, "
        "over the repetitions that got one; established = those of the repetitions, the others "
        "with their status (no reply within `timeout_s`)"
    )
    if kx:
        whats = _key_exchanges(results, label)
        text += (
            "; key exchange = the profile's own beside the tunnel's handshake"
            + (f" ({'; '.join(f'{p}: {w}' for p, w in whats.items())})" if whats else "")
            + ", its daemons launched to its key installed on both ends (within the handshake "
            "time), with the traffic and frames both ends' underlay interfaces sent meanwhile "
            "(headers and retransmissions included); - for a profile without one"
        )
    doc.p(text)
    doc.table(
        ["profile", "condition", f"{metric_name('handshake_ms')} (ms)", "established"]
        + ([f"{metric_name(c)} ({u})" for c, u in KEY_EXCHANGE_COLUMNS] if kx else []),
        out,
    )
    _status_notes(doc, rows_l, ESTABLISHMENT_STATUS, "established")


def rekey_table(doc: Doc, label, test, rows_l, profiles, points) -> None:
    """Per profile and condition, what a rekey forced in the middle of a TCP flow cost it: the
    new keys' delay, the dip against the flow's own noise, the recovery and the retransmits,
    mean ± sd over the repetitions that measured each, and each repetition's status."""
    out = []
    for prof, pt, rs, failed, _ in cells(rows_l, profiles, points):
        if rs and all(r.get("not_applicable") for r in rs):
            figures = ["n/a"] * len(REKEY_COLUMNS) + ["n/a" + failed_mark(failed)]
        else:
            applies = [r for r in rs if not r.get("not_applicable")]
            status = statuses(applies, REKEY_STATUS) or "-"
            figures = _figures(applies, REKEY_COLUMNS) + [status + failed_mark(failed)]
        out.append([prof, pt] + figures)
    doc.p(
        f"**{label}** ({test}): a rekey forced in the middle of a TCP flow; new keys after = "
        "the rekey command to the daemon showing its new keys; dip = the lowest interval right "
        "after the rekey against the median before it, noise = the same measure over the "
        "intervals before the rekey (how deep the flow dips with no rekey: a dip within it is "
        "not the rekey's); rekey recovery = the rekey to the first interval back within 10 % of "
        "that median (none when the flow ended first: not recovered); retransmits = the "
        "sender's meanwhile; status per repetition (failed after N s: no new keys within "
        "`timeout_s`, a result)"
    )
    doc.table(
        ["profile", "condition"]
        + [f"{metric_name(c)} ({u})" for c, u in REKEY_COLUMNS]
        + ["status"],
        out,
    )
    _status_notes(doc, rows_l, REKEY_STATUS, "recovered", "not recovered", "not applicable")


def _status_notes(doc: Doc, rows_l: list[dict], col: str, *fine: str) -> None:
    """Why the repetitions whose `col` is none of `fine` (a 'failed after N s' that is a result,
    not a failed case) ended so, one line each: their case and the reason their record gives."""
    hit = [r for r in rows_l if r["ok"] and r.get(col) and r[col] not in fine]
    if hit:
        doc.p(
            f"**Why not {fine[0]}:** "
            + "; ".join(f"`{r['case']}`: {(r.get('error') or r[col])[:300]}" for r in hit)
        )


def _key_exchanges(results: list[dict], label: str) -> dict[str, str]:
    """What each profile's own key exchange is, as its records name it (`key_exchange`)."""
    out: dict[str, str] = {}
    for e in results:
        if e.get("label") != label:
            continue
        for rec in e.get("records") or []:
            if rec.get("key_exchange"):
                out.setdefault(e["profile"], rec["key_exchange"])
    return out
