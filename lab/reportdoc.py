"""The report document and the numbers in it: `Doc` (blocks rendered to Markdown and to HTML),
each test's primary metric, and the statistics and formatting the report, plots and comparisons
share."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any

from .measure import TESTS, Primary

#: the primary metric of a test that declares none (or is not registered any more)
DEFAULT_PRIMARY = Primary("throughput_bps", "Mbit/s", 1e-6, True)


def primary(test: str) -> Primary:
    """(metric column, label, scale, higher is better) the report ranks `test` by: its own."""
    t = TESTS.get(test)
    return (t.primary if t is not None else None) or DEFAULT_PRIMARY


# ---------------------------------------------------------------------- document blocks


@dataclass
class Doc:
    """A report as blocks rendered both to Markdown and to HTML."""

    title: str
    blocks: list[tuple[str, Any]] = field(default_factory=list)

    def h(self, text: str) -> None:
        self.blocks.append(("h", text))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def table(self, header: list[str], rows: list[list[Any]]) -> None:
        self.blocks.append(("table", (header, rows)))

    def img(self, path: str, alt: str) -> None:
        self.blocks.append(("img", (path, alt)))

    def pre(self, summary: str, text: str) -> None:
        self.blocks.append(("pre", (summary, text)))

    def markdown(self) -> str:
        out = [f"# {self.title}", ""]
        for kind, v in self.blocks:
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

    def html(self) -> str:
        e = html.escape
        out = [
            "<!doctype html><html><head><meta charset='utf-8'>",
            f"<title>{e(self.title)}</title><style>",
            "body{font-family:sans-serif;max-width:1100px;margin:auto;padding:1em}",
            "table{border-collapse:collapse;margin:0.5em 0}td,th{border:1px solid #ccc;",
            "padding:2px 8px;text-align:right}th{background:#eee}td:first-child{text-align:left}",
            "img{max-width:100%}pre{background:#f6f6f6;padding:0.5em;overflow:auto}",
            f"</style></head><body><h1>{e(self.title)}</h1>",
        ]
        for kind, v in self.blocks:
            if kind == "h":
                out.append(f"<h2>{e(v)}</h2>")
            elif kind == "p":
                out.append(f"<p>{_inline_html(v)}</p>")
            elif kind == "table":
                header, rows = v
                out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>")
                for r in rows:
                    out.append("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>")
                out.append("</table>")
            elif kind == "img":
                out.append(f"<p><img src='{e(v[0])}' alt='{e(v[1])}'></p>")
            elif kind == "pre":
                out.append(f"<details><summary>{e(v[0])}</summary><pre>{e(v[1])}</pre></details>")
        out.append("</body></html>")
        return "\n".join(out)


def _md(c: Any) -> str:
    return str(c).replace("|", "\\|").replace("\n", " ")


def _inline_html(text: str) -> str:
    # the report's paragraphs use `code` and **bold** only
    import re

    t = html.escape(text)
    t = re.sub(r"`([^`]+)`", r"<code>\1</code>", t)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", t)


# ---------------------------------------------------------------------- statistics


def _stats(vals: list[float]) -> dict | None:
    vals = [v for v in vals if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return None
    n = len(vals)
    mean = sum(vals) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else 0.0
    return {"n": n, "mean": mean, "sd": sd, "min": min(vals), "max": max(vals)}


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    dec = max(0, digits - 1 - mag)
    return f"{x:.{dec}f}"


def _cell(s: dict | None, scale: float) -> str:
    if s is None:
        return "-"
    out = f"{_fmt(s['mean'] * scale)}"
    if s["n"] > 1:
        out += f" ± {_fmt(s['sd'] * scale, 2)}"
    return out + f" (n={s['n']})"


def _order(values: list, ref: list) -> list:
    return sorted(set(values), key=lambda v: (ref.index(v) if v in ref else len(ref), str(v)))


def _group(table: list[dict], **match) -> list[dict]:
    return [r for r in table if all(r.get(k) == v for k, v in match.items())]


def _mean(vals) -> float | None:
    s = _stats(vals)
    return s["mean"] if s else None
