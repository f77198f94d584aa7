"""The report document and the numbers in it: `Doc` (blocks rendered to Markdown and to HTML),
each test's primary metric and what the report draws of it (both declared by the test), and
the statistics and formatting the report, plots and comparisons share."""

from __future__ import annotations

import base64
import html
import math
import re
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, NamedTuple
from collections.abc import Iterator

from lab.measure import TESTS, Primary

#: the primary metric of a test that declares none (or is not registered any more)
DEFAULT_PRIMARY = Primary("throughput_bps", "Mbit/s", 1e-6, True)


def primary(test: str) -> Primary:
    """(metric column, label, scale, higher is better) the report ranks `test` by: its own."""
    t = TESTS.get(test)
    return (t.primary if t is not None else None) or DEFAULT_PRIMARY


def entry_primary(entry: dict) -> Primary:
    """The metric a plan entry ({"test", "params"}, as plan.json has it) is reported by: its
    test's primary, or the one the test names for these parameters (Test.primary_for: a
    handshake entry with cold = false times no establishment, its rekey's recovery instead)."""
    t = TESTS.get(entry.get("test", ""))
    if t is None or not entry.get("params"):
        return primary(entry.get("test", ""))
    return t.primary_for(entry["params"]) or primary(entry["test"])


def label_primaries(plan: dict) -> dict[str, Primary]:
    """{test label: the metric its entry is reported by (entry_primary)} of a plan.json; a row
    of a label not in it goes by its test's primary (`primaries.get(label) or primary(test)`)."""
    return {t["label"]: entry_primary(t) for t in plan.get("tests", [])}


def draws(test: str, kind: str) -> bool:
    """Does the report draw `kind` (lab.measure.base.PLOTS) of tests called `test`? It is
    what the test declares (Test.plots); a test no longer registered draws nothing."""
    t = TESTS.get(test)
    return t is not None and kind in t.plots


def ranks(test: str) -> str | None:
    """What the Recommendation ranks profiles by with `test` (Test.ranks), or None."""
    t = TESTS.get(test)
    return t.ranks if t is not None else None


# ---------------------------------------------------------------------- document blocks


@dataclass
class Doc:
    """A report as blocks rendered both to Markdown and to HTML: warnings first, a table of
    contents, links to the run's files, then the sections."""

    title: str
    blocks: list[tuple[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: the heading of the section with a warning's details, by text (none: the Warnings section)
    warning_where: dict[str, str] = field(default_factory=dict)
    #: details of a warning shown in the Warnings section after its text, by text
    warning_details: dict[str, str] = field(default_factory=dict)
    links: list[tuple[str, str]] = field(default_factory=list)

    def h(self, text: str) -> None:
        self.blocks.append(("h", text))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def warn(self, text: str, where: str | None = None, details: str | None = None) -> None:
        """A warning the reader must see before any figure: said once, shortened at the top
        (its first clause), with a link to the section `where` (a heading) that has the details,
        else to the Warnings section, which then holds its whole text and `details`."""
        if text not in self.warnings:
            self.warnings.append(text)
            if where:
                self.warning_where[text] = where
            if details:
                self.warning_details[text] = details

    def warnings_here(self) -> None:
        """The place of the Warnings section: the whole text of each warning whose details have
        no section of their own (nothing when there is none)."""
        self.blocks.append(("warnings", None))

    def _blocks(self) -> list[tuple[str, Any]]:
        out = []
        for kind, v in self.blocks:
            if kind != "warnings":
                out.append((kind, v))
                continue
            own = [w for w in self.warnings if w not in self.warning_where]
            if own:
                out.append(("h", WARNINGS))
                for w in own:
                    out.append(("p", w + (f" {self.warning_details[w]}" if w in
                                          self.warning_details else "")))  # fmt: skip
        return out

    def _top(self) -> list[tuple[str, str]]:
        """The warnings at the top: (short text, heading of the section with the details)."""
        return [(short_warning(w), self.warning_where.get(w, WARNINGS)) for w in self.warnings]

    def link(self, path: str, what: str) -> None:
        self.links.append((path, what))

    def table(self, header: list[str], rows: list[list[Any]]) -> None:
        self.blocks.append(("table", (header, rows)))

    def img(self, path: str, alt: str) -> None:
        self.blocks.append(("img", (path, alt)))

    def pre(self, summary: str, text: str) -> None:
        self.blocks.append(("pre", (summary, text)))

    def headings(self) -> list[str]:
        return [v for k, v in self._blocks() if k == "h"]

    def markdown(self) -> str:
        out = [f"# {self.title}", ""]
        out += [f"> **Warning:** {w} ([{h}](#{_anchor(h)}))" + "\n>" for w, h in self._top()]
        if self.warnings:
            out.append("")
        if self.links:
            out += ["Files: " + ", ".join(f"[{p}]({p}) ({w})" for p, w in self.links), ""]
        out += [f"- [{h}](#{_anchor(h)})" for h in self.headings()] + [""]
        for kind, v in self._blocks():
            if kind == "h":
                out += [f"## {v}", ""]
            elif kind == "p":
                out += [v, ""]
            elif kind == "table":
                header, rows = v
                out.append("| " + " | ".join(header) + " |")
                out.append("|" + "---|" * len(header))
                out += ["| " + " | ".join(_md(c) for c in r) + " |" for r in rows]
                out.append("")
            elif kind == "img":
                out += [f"![{v[1]}]({v[0]})", ""]
            elif kind == "pre":
                out += [f"**{v[0]}**", "", "```", v[1].rstrip(), "```", ""]
        return "\n".join(out)

    def html(self, base: Path | None = None) -> str:
        """The HTML document; with `base` (the run directory) images are embedded as data URIs,
        so the file is self-contained."""
        e = html.escape
        out = [
            "<!doctype html><html><head><meta charset='utf-8'>",
            f"<title>{e(self.title)}</title><style>",
            "body{font-family:sans-serif;max-width:1200px;margin:auto;padding:1em}",
            "table{border-collapse:collapse;margin:0.5em 0}td,th{border:1px solid #ccc;",
            "padding:2px 8px;text-align:left;vertical-align:top}th{background:#eee}",
            "td.num{text-align:right;white-space:nowrap}",
            "img{width:100%;height:auto}pre{background:#f6f6f6;padding:0.5em;overflow:auto}",
            ".warn{background:#fff3cd;border:1px solid #e0b000;padding:0.5em 1em;margin:0.5em 0}",
            "nav ul{columns:2}",
            f"</style></head><body><h1>{e(self.title)}</h1>",
        ]
        for w, h in self._top():
            more = f" (<a href='#{_anchor(h)}'>{e(h)}</a>)"
            out.append(f"<div class='warn'><b>Warning:</b> {_inline_html(w)}{more}</div>")
        if self.links:
            out.append(
                "<p>Files: "
                + ", ".join(f"<a href='{e(p)}'>{e(p)}</a> ({e(w)})" for p, w in self.links)
                + "</p>"
            )
        out.append(
            "<nav><b>Contents</b><ul>"
            + "".join(f"<li><a href='#{_anchor(h)}'>{e(h)}</a></li>" for h in self.headings())
            + "</ul></nav>"
        )
        for kind, v in self._blocks():
            if kind == "h":
                out.append(f"<h2 id='{_anchor(v)}'>{e(v)}</h2>")
            elif kind == "p":
                out.append(f"<p>{_inline_html(v)}</p>")
            elif kind == "table":
                header, rows = v
                out.append("<table>")
                if any(str(h).strip() for h in header):
                    out.append("<tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>")
                for r in rows:
                    out.append("<tr>" + "".join(_td(c) for c in r) + "</tr>")
                out.append("</table>")
            elif kind == "img":
                out.append(f"<p><img src='{e(_img_src(v[0], base))}' alt='{e(v[1])}'></p>")
            elif kind == "pre":
                out.append(f"<details><summary>{e(v[0])}</summary><pre>{e(v[1])}</pre></details>")
        out.append("</body></html>")
        return "\n".join(out)


#: the heading of the section with the warnings' whole texts
WARNINGS = "Warnings"

#: a warning at the top longer than this is cut to its first clause, and to this length
SHORT_WARNING = 120


def short_warning(text: str, limit: int = SHORT_WARNING) -> str:
    """A warning as it is, if it is short; else its first clause (up to the first '. ', ': ',
    '; ' or ' (' after 20 characters), at most `limit` characters, cut at a word."""
    if len(text) <= limit:
        return text
    cuts = [i for sep in (". ", ": ", "; ", " (") if (i := text.find(sep, 20)) > 0]
    short = text[: min(cuts)] if cuts else text.rstrip(".")
    if len(short) > limit:
        short = short[:limit].rsplit(" ", 1)[0] + " ..."
    if short.count("`") % 2:  # never cut inside `code`
        short = short[: short.rindex("`")].rstrip() + " ..."
    return short


_NUMERIC = re.compile(
    r"^[-+]?\d+(\.\d+)?( ?%)?( ± [\d.]+)?( \(n=\d+\))?( \(within 1 sd\))?( \[\d+ failed\])?$"
)


def _td(c: Any) -> str:
    text = str(c)
    cls = " class='num'" if _NUMERIC.match(text) or text == "-" else ""
    return f"<td{cls}>{html.escape(text)}</td>"


def _anchor(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"


def _img_src(path: str, base: Path | None) -> str:
    if base is None or not (base / path).is_file():
        return path
    return "data:image/png;base64," + base64.b64encode((base / path).read_bytes()).decode()


def _md(c: Any) -> str:
    return str(c).replace("|", "\\|").replace("\n", " ")


def _inline_html(text: str) -> str:
    # the report's paragraphs use `code` and **bold** only
    t = html.escape(text)
    t = re.sub(r"`([^`]+)`", r"<code>\1</code>", t)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", t)


# ---------------------------------------------------------------------- statistics


def stats_of(vals: list[float]) -> dict | None:
    vals = [v for v in vals if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return None
    n = len(vals)
    mean = sum(vals) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else 0.0
    return {"n": n, "mean": mean, "sd": sd, "min": min(vals), "max": max(vals)}


def fmt_value(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    dec = max(0, digits - 1 - mag)
    return f"{x:.{dec}f}"


def stat_cell(s: dict | None, scale: float) -> str:
    if s is None:
        return "-"
    out = f"{fmt_value(s['mean'] * scale)}"
    if s["n"] > 1:
        sd = s["sd"] * scale
        # a spread below the mean's last digits is float noise: 0
        out += f" ± {fmt_value(sd if abs(sd) > 1e-9 * abs(s['mean'] * scale) else 0.0, 2)}"
    return out + f" (n={s['n']})"


def in_order(values: list, ref: list) -> list:
    return sorted(set(values), key=lambda v: (ref.index(v) if v in ref else len(ref), str(v)))


def rows_where(table: list[dict], **match) -> list[dict]:
    return [r for r in table if all(r.get(k) == v for k, v in match.items())]


class Cell(NamedTuple):
    """The rows of one cell of a results table: a profile's under one network condition (and
    one point of the records, where the table splits them)."""

    profile: str
    point: str  # the network condition (impairment point)
    ok: list[dict]  # the rows that succeeded
    failed: int  # how many did not
    index: int | None = None  # the record's point (a bidir test's direction), when split


def cells(rows_l: list[dict], profiles, points, indexes=(None,)) -> Iterator[Cell]:
    """Per profile, network condition and (where `indexes` names them) record point, in that
    order, the rows of `rows_l` there, skipping a cell without any: the ok ones and how many
    failed, as every results table shows them."""
    for prof in profiles:
        for pt in points:
            for i in indexes:
                match = {} if i is None else {"point": i}
                all_rs = rows_where(rows_l, profile=prof, impairment=pt, **match)
                if all_rs:
                    rs = [r for r in all_rs if r["ok"]]
                    yield Cell(prof, pt, rs, len(all_rs) - len(rs), i)


def failed_mark(failed: int) -> str:
    """What a table's cell says after its figures of how many of its rows failed."""
    return f" [{failed} failed]" if failed else ""


def mean_of(vals) -> float | None:
    s = stats_of(vals)
    return s["mean"] if s else None


# ---------------------------------------------------------------------- CPU units

#: readable names of results.csv's metric columns where the column name is not one
METRIC_NAMES = {
    "throughput_bps": "throughput",
    "receiver_bps": "received rate",
    "rtt_avg_ms": "mean RTT",
    "path_mtu": "path MTU",
    "transactions_per_s": "transactions",
    "latency_p50_us": "median latency",
    "seconds": "transfer time",
    "loss_pct": "loss",
    "jitter_ms": "jitter",
    "echo_replies": "echo replies",
    "handshake_ms": "handshake time",
    "key_exchange_ms": "key exchange time",
    "key_exchange_bytes": "key exchange traffic",
    "key_exchange_packets": "key exchange frames",
    "rekey_keys_s": "new keys after",
    "rekey_dip_pct": "dip",
    "rekey_noise_pct": "noise",
    "rekey_recovery_s": "rekey recovery",
    "rekey_retransmits": "retransmits during the rekey",
}

#: unit endings of metric columns that their readable name leaves out: the report prints the
#: unit beside the name ("responsiveness (RPM)", not "responsiveness rpm (RPM)")
UNIT_SUFFIXES = ("_bps", "_ms", "_us", "_s", "_pct", "_rpm")


def metric_name(col: str) -> str:
    """A metric column's readable name, without its unit (METRIC_NAMES, else the column's words
    less a unit ending)."""
    if col in METRIC_NAMES:
        return METRIC_NAMES[col]
    suffix = next((s for s in UNIT_SUFFIXES if col.endswith(s) and len(col) > len(s)), "")
    return col.removesuffix(suffix).replace("_", " ")


def labelled(label: str, name: str) -> str:
    """'<label> <name>', or `name` alone where it starts with the label's words already (a
    test labelled by its kind: "handshake time", not "handshake handshake time")."""
    if name == label or name.startswith(label + " "):
        return name
    return f"{label} {name}"


def host_ncores(results) -> int | None:
    """How many cores the run's host has, as its monitor recorded (None if it did not)."""
    return next(
        (n for r in results if (n := ((r.get("monitor") or {}).get("host") or {}).get("ncores"))),
        None,
    )


#: a column of these names, or ending in a time, a percentage or a count of losses, is better
#: smaller (times, losses, retransmissions, CPU); every other one larger (rates, packets/s)
_LOWER_NAMES = frozenset(
    {"packets_lost", "retransmits", "seconds", "key_exchange_bytes", "key_exchange_packets"}
)
_LOWER_ENDINGS = ("_ms", "_us", "_s", "_pct", "_retransmits", "_lost")


def lower_is_better(metric: str) -> bool:
    """Is a smaller value of results column `metric` the better one? (`lab check` for a column
    named explicitly, `lab compare`'s fidelity rankings for a column other than the main one.)"""
    if metric.endswith("_per_s"):  # a rate (packets_per_s, transactions_per_s)
        return False
    return metric in _LOWER_NAMES or metric.endswith(_LOWER_ENDINGS)
