"""The CLI's consoles and the lab status printouts: part of the CLI layer (lab.cli.main and the
modules it uses to print; nothing below it prints)."""

from __future__ import annotations

import re
import sys

from rich.console import Console
from rich.table import Table

from lab.model.cpuwords import capacity_words
from lab.model.impairment.model import Impairment
from lab.results.doc import short_warning

out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


#: a warning's closing pointer to the docs section that explains it: "(docs/cpu.md#warning-x)"
DOC_REF = re.compile(r"\s*\((?:details: )?(docs/[\w-]+\.md(?:#[\w-]+)?)\)$")
#: the longest warning text `lab up` prints before its docs pointer (one line on a terminal)
WARNING_CHARS = 90
#: the docs section that lists every warning of `lab up`, for `lab status`'s reminder
WARNINGS_DOC = "docs/cpu.md#warnings-at-lab-up"


def warning_line(text: str) -> str:
    """A warning of `lab up` on one short line: its first clause and where the docs explain
    it ("... (details: docs/cpu.md#warning-scaled-to-fit)"); the whole text stays in lab.json
    (`lab status --json`). Applied twice it gives the same line (a VM's guest printed it)."""
    m = DOC_REF.search(text)
    body = text[: m.start()] if m else text
    short = short_warning(body, WARNING_CHARS)
    if m:
        return f"{short} (details: {m.group(1)})"
    return short if short == body else f"{short} (whole: `lab status --json`)"


def warnings_reminder(s: dict) -> str | None:
    """`lab status`'s one line on the warnings `lab up` printed (None if there were none)."""
    n = len(dict.fromkeys(s.get("warnings") or []))
    if not n:
        return None
    return (
        f"{n} warning{'s' if n > 1 else ''} when this lab came up: `lab status --json` has "
        f"{'them' if n > 1 else 'it'}, {WARNINGS_DOC} explains each"
    )


def impairment_words(applied) -> str:
    """An impairment point's applied setting (engine JSON, or the kernel's text) in tc-netem words."""

    if isinstance(applied, dict):
        try:
            return str(Impairment.from_json(applied)) or "none"
        except Exception:  # a shape this version does not know: show it as it is
            return ", ".join(f"{k}={v}" for k, v in applied.items())
    return str(applied) if applied else "none"


def queue_words(queues: dict) -> str:
    """lab.json's vpn.queues in words: per node the stand-in's socket and TUN queues."""
    parts = []
    for node, q in queues.items():
        bits = []
        if q.get("sockets"):
            bits.append(
                f"UDP receive {q.get('rx_packets')} datagrams ({q['sockets'][0]['rcvbuf']} B)"
            )
        bits += [f"{dev} txqueuelen {t['txqueuelen']}" for dev, t in (q.get("tun") or {}).items()]
        if li := q.get("libipsec"):
            bits.append(
                f"libipsec queues in {li.get('limit_in')} / out {li.get('limit_out')}"
                f" (full: {li.get('full', 'drop')})"
                if li.get("bounded")
                else f"libipsec unbounded ({li.get('why')})"
            )
        if bits:
            parts.append(f"{node} {q.get('daemon')}: {', '.join(bits)}")
    return "; ".join(parts)


def status_lines(s: dict) -> list[str]:
    """The VPN and the impairment of a lab in words, printed under its table."""
    lines = []
    vpn = s.get("vpn") or {}
    if vpn:
        d = vpn.get("describe") or {}
        tun = vpn.get("tunnel") or {}
        ends = " <-> ".join(
            f"{t.get('node')} {' '.join(a for a in (t.get('v4'), t.get('v6')) if a)}"
            for t in (tun.get("client") or {}, tun.get("server") or {})
            if t
        )
        lines.append(
            f"VPN {vpn.get('profile')} ({vpn.get('driver')}, data plane "
            f"{vpn.get('path') or d.get('path')}) {vpn.get('state', '')}: interface "
            f"{d.get('interface', '-')}, MTU {d.get('mtu', '-')}, cipher {d.get('cipher', '-')}"
            + (f"; tunnel {ends}" if ends else "")
        )
        if held := queue_words(vpn.get("queues") or {}):
            lines.append(f"data plane queues, the board kernel's (docs/cpu.md): {held}")
    else:
        lines.append("VPN: none (no tunnel in this lab)")
    imp = s.get("impair")
    if not imp:
        lines.append("impairment: none yet (the first `lab impair set` adds it)")
    else:
        lines.append(
            f"impairment: backend {imp.get('backend')}, placement {imp.get('placement')}; "
            "a symmetric spec applies to each direction (each point is one egress)"
        )
    nic = s.get("nic_latency") or {}
    # the boards' NICs (lab.substrate.local.cpuplan.nic_decision); not applied with a warning,
    # `lab up` said it and `lab status` reminds of the warnings once
    if nic.get("directions") and (nic.get("applied") or not nic.get("warned")):
        each = ", ".join(f"{k} {v['us']:g} us" for k, v in nic["directions"].items())
        lines.append(
            f"boards' NIC latency ({each}): "
            + (
                f"applied ({nic.get('backend')})"
                if nic.get("applied") is True
                else f"applied to latency tests ({', '.join(nic.get('tests') or [])}; "
                + "".join(f"{t}'s ICMP; " for t in nic.get("icmp_tests") or [])
                + f"{nic.get('backend')})"
                if nic.get("applied")
                else "not applied"
            )
            + f", {short_warning(str(nic.get('why')), WARNING_CHARS)}"
        )
    if w := s.get("cpu_weight"):
        # lab.core.cgroups.weigh_lab: a capped lab's weight against the host's other work
        lines.append(
            f"CPU weight against the host's other work: x{w['lab']:g} (its parent x{w['parent']:g}"
            + (f", held at x1 by {', '.join(w['held_back_by'])}" if w.get("held_back_by") else "")
            + '; docs/cpu.md "The lab\'s CPU weight")'
        )
    return lines


def _point_specs(s: dict) -> dict[tuple[str, str], str]:
    """(node, interface) -> the impairment applied at its egress, in words."""
    imp = s.get("impair") or {}
    applied = imp.get("applied") or {}
    out = {}
    for p in imp.get("points") or []:
        key = f"{p.get('node')}:{p.get('ifname')}"
        way = "client->server" if p.get("way") == "fwd" else "server->client"
        out[(p.get("node"), p.get("ifname"))] = f"{impairment_words(applied.get(key))} ({way})"
    return out


def print_status(s: dict) -> None:
    if not s.get("nodes"):  # a broken lab, or the VM of a `lab run --vm` (no lab of its own)
        out.print(f"lab '{s['id']}': {s.get('state')}", markup=False, highlight=False)
        return
    # the id quoted: the default id is "lab", and "lab lab (up)" reads as a stutter
    t = Table(
        title=f"lab '{s['id']}' ({s.get('state')}) — {s.get('topology', '')}", title_justify="left"
    )
    for col in ("node", "where", "cpu", "interface", "IPv4", "IPv6", "peer", "impairment (egress)"):
        t.add_column(col)
    tunnel = {
        (e or {}).get("node"): e
        for e in ((s.get("vpn") or {}).get("tunnel") or {}).values()
        if isinstance(e, dict)
    }
    vpn_if = ((s.get("vpn") or {}).get("describe") or {}).get("interface") or "tunnel"
    specs = _point_specs(s)
    for name, n in s.get("nodes", {}).items():
        cpu = n.get("cpu") or {}
        # "pi4: 4 board cores = 0.90 host cores", the report's words (lab.model.cpuwords)
        cpu_s = capacity_words(cpu)
        if cpu.get("profile") and cpu.get("cores") and not cpu.get("calibrated"):
            cpu_s += " (uncalibrated)"
        if cpu.get("cgroup") and (cpu.get("profile") or cpu.get("cores")):
            # the mechanism of its cores here: v1, v2-threaded, v2-one-core (docs/cpu.md)
            cpu_s += f", cgroup {cpu['cgroup']}"
        if (cpu.get("dilation") or 1.0) != 1.0:  # lab.model.dilation: quotas / the factor
            cpu_s += f", time-dilated x{cpu['dilation']:g}"
        dp = cpu.get("dataplane") or {}
        if dp.get("groups"):  # lab/substrate/local/dataplane.py: the board's data plane model
            cpu_s += (
                f"; {dp['daemon']}: {dp['groups']} x {dp.get('group_cores', dp['share']):.3f} "
                f"host cores ({dp['threading']}, {dp.get('board_reference') or 'core_share'})"
            )
        if n.get("arch"):  # the board's binaries under qemu-user, uncapped (docs/arch.md)
            cpu_s += f", {n['arch']} (qemu-user)"
        kind = n["kind"] + (" router" if n.get("router") else "")
        rows = [dict(i) for i in (n["interfaces"] or [{}])]
        if name in tunnel:
            rows.append(
                {
                    "name": f"{vpn_if} (VPN)",
                    "ip": tunnel[name].get("v4"),
                    "ip6": tunnel[name].get("v6"),
                }
            )
        first = True
        for i in rows:
            t.add_row(
                f"{name} ({kind})" if first else "",
                (n.get("netns") or f"{n.get('board')} ({n.get('host')})") if first else "",
                cpu_s if first else "",
                i.get("name", ""),
                i.get("ip") or "",
                i.get("ip6") or "",
                i.get("peer", ""),
                specs.get((name, i.get("name")), ""),
            )
            first = False
    out.print(t)
    for line in status_lines(s):
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


def print_notices(plan) -> None:
    """A plan's one-line notes (an old key name it used), on stderr."""
    for n in plan.notices:
        err.print(f"lab: note: {n}", markup=False, highlight=False, soft_wrap=True)
