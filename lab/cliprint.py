"""The CLI's consoles and the lab status printouts: part of the CLI layer (lab.cli and the
modules it uses to print; nothing below it prints)."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def _print_status(s: dict) -> None:
    if not s.get("nodes"):  # a broken lab, or the VM of a `lab run --vm` (no lab of its own)
        out.print(f"lab {s['id']}: {s.get('state')}", markup=False, highlight=False)
        return
    t = Table(
        title=f"lab {s['id']} ({s.get('state')}) — {s.get('topology', '')}", title_justify="left"
    )
    for col in ("node", "where", "cpu", "interface", "IPv4", "IPv6", "peer"):
        t.add_column(col)
    for name, n in s.get("nodes", {}).items():
        cpu = n.get("cpu") or {}
        cpu_s = cpu.get("profile") or (f"{cpu['cores']:.2f} cores" if cpu.get("cores") else "-")
        if cpu.get("profile") and cpu.get("cores"):
            cpu_s += (
                f" ({cpu['cores']:.2f} cores{'' if cpu.get('calibrated') else ', uncalibrated'})"
            )
        kind = n["kind"] + (" router" if n.get("router") else "")
        first = True
        for i in n["interfaces"] or [{}]:
            t.add_row(
                f"{name} ({kind})" if first else "",
                (n.get("netns") or f"{n.get('board')} ({n.get('host')})") if first else "",
                cpu_s if first else "",
                i.get("name", ""),
                i.get("ip") or "",
                i.get("ip6") or "",
                i.get("peer", ""),
            )
            first = False
    out.print(t)


def _print_substrate(s: dict) -> None:
    from .substrates import substrate_line

    if line := substrate_line(s):
        out.print(line, markup=False, highlight=False)


def print_run_summary(s: dict) -> None:
    """What `lab run` ends with: the headline figures, the counts, and both report paths."""
    head = s.get("headline") or {}
    if head.get("rows"):
        t = Table(title="headline (mean ± sd, n repetitions)", title_justify="left")
        for i, col in enumerate(head["header"]):
            t.add_column(col, justify="left" if i < 2 else "right")
        for row in head["rows"]:
            t.add_row(*row)
        out.print(t)
    b = s["budget"]
    out.print(
        f"{s['cases']} case repetitions, {s['failed']} failed; outside measurement "
        f"{100 * (b['outside_share'] or 0):.1f} % of {b['wall_s']:.0f} s",
        markup=False,
        highlight=False,
    )
    out.print(f"report: {s['report']}", markup=False, highlight=False)
    if s.get("html"):
        out.print(f"report: {s['html']}", markup=False, highlight=False)
