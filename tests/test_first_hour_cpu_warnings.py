"""Issue 32, items 8 and 9 (the CLI half): the run report's CPU table and `lab status` in one
vocabulary (board cores and host cores, docs/cpu.md "Board cores and host cores"), a node with
two roles shown once, host busy and the VPN daemons in the same unit; the warnings of `lab up`
said once each, on one short line with the docs section that explains them, and `lab status`
reminding of them in one line. No root: the report is built from a synthetic run directory,
`lab up`/`lab status` run against a stand-in substrate, the warnings are the lab's own."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

import lab.cli.labs as labs
import lab.cli.printing as cliprint
from lab.cli.main import main
from lab.model.cpuprofile import load_cpu_profile
from lab.model.topology import load_topology
import lab.results.report as report_module
from lab.results.report import NODE_ROLES, cpu_columns, generate
from lab.substrate.local import cpuplan

from .test_results import make_run

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGY = str(ROOT / "topologies" / "pi_pair.py")
#: what the issue's user saw: a 32-core host 1.0 % busy beside daemons at 34.6 % of one core
NCORES, BUSY_PCT, DAEMON_PCT = 32, 1.0, 34.6
#: a terminal line; `lab up`'s warnings must fit in one
LINE = 160


def _pi4_nodes() -> dict[str, dict]:
    """Two 4-core pi4 nodes fitted onto a 2-core machine (scaled), as cpu_plan leaves them."""
    prof = load_cpu_profile("pi4", merge_calibration=False)
    prof.core_share, prof.emulated_cores = 0.26, 4
    plan = {n: cpuplan.plan_entry(prof) for n in ("client", "server")}
    assert cpuplan.scale_to_host(plan, 2)  # 2 x 4 x 0.26 > 0.9 x 2: scaled, and said so
    return plan


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> str:
    """report.md of make_run's synthetic run (client is VPN and traffic client, server both
    servers) with pi4 caps on both nodes and the issue's host figures; without its plots
    (tests/test_report_plots.py has them), which take most of a report's time."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(report_module, "make_plots", lambda run, table, plan: [])
        return _report(tmp_path_factory)


def _report(tmp_path_factory) -> str:
    run = make_run(tmp_path_factory.mktemp("cpu") / "run")
    lines = [json.loads(x) for x in run.results.read_text().splitlines()]
    for e in lines:
        host = e["monitor"]["host"]
        host.update(ncores=NCORES, busy_pct={"mean": BUSY_PCT})
        e["monitor"]["daemons"] = {"client/wg": {"cpu_pct": {"mean": DAEMON_PCT}}}
    run.results.write_text("".join(json.dumps(e) + "\n" for e in lines))
    m = run.manifest()
    m["cpu"] = _pi4_nodes()
    run.file("manifest.json").write_text(json.dumps(m))
    generate(run.path)
    return run.file("report.md").read_text()


def _cpu_table(md: str) -> tuple[str, list[str], list[list[str]]]:
    """(caption, header, rows) of the report's CPU table."""
    lines = md.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith("**CPU during"))
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[i + 2 :]]
    rows = []
    for c in cells[2:]:
        if len(c) != len(cells[0]):
            break
        rows.append(c)
    return lines[i], cells[0], rows


# ------------------------------------------------------------------ item 8: the CPU table


def test_a_node_with_two_roles_is_one_column(report):
    _caption, header, rows = _cpu_table(report)
    assert header == [
        "test",
        "profile",
        "client (VPN client, traffic client)",
        "server (VPN server, traffic server)",
        "VPN daemons",
        "host busy",
        "host softirq",
    ]
    assert rows and all(len(r) == len(header) for r in rows)


def test_nodes_with_one_role_each_keep_a_column_each():
    roles = {"vpn_client": "gw1", "vpn_server": "gw2", "traffic_client": "a", "traffic_server": "b"}
    assert cpu_columns(roles) == [
        ("gw1", ["vpn_client"]),
        ("gw2", ["vpn_server"]),
        ("a", ["traffic_client"]),
        ("b", ["traffic_server"]),
    ]
    # a run without roles: one column per role, none merged
    assert cpu_columns({}) == [(None, [r]) for r in NODE_ROLES]


def _status_cpu_cell(monkeypatch, cpu: dict) -> str:
    status = {
        "id": "h1t",
        "state": "up",
        "topology": "topologies/pi_pair.py",
        "nodes": {
            "client": {"kind": "local", "netns": "h1t-client", "cpu": cpu, "interfaces": [{}]}
        },
    }
    buf = io.StringIO()
    monkeypatch.setattr(cliprint, "out", Console(file=buf, width=400))
    cliprint.print_status(status)
    row = next(ln for ln in buf.getvalue().splitlines() if "h1t-client" in ln)
    return row.split("│")[3].strip()


def test_board_capacity_in_one_vocabulary_in_status_and_report(report, monkeypatch):
    cpu = _pi4_nodes()["client"]
    cell = _status_cpu_cell(monkeypatch, cpu)
    # "pi4: 3.46 of 4 board cores = 0.90 host cores (uncalibrated)"
    capacity = cell.split(" (uncalibrated)")[0]
    assert re.fullmatch(r"pi4: \d\.\d+ of 4 board cores = 0\.90 host cores", capacity), cell
    caption, _header, rows = _cpu_table(report)
    assert f"client, server: {capacity}" in caption  # the same words, the same figures
    for text in [cell, caption, *(c for r in rows for c in r)]:
        # a bare "cores" (whose?) and the old "4 pi4 cores" / "% host core" are gone
        assert not re.search(r"\d (?!board |host )cores?\b", text), text
        assert "pi4 core" not in text and "% host core" not in text, text
    used = rows[0][2]  # client during the first throughput test, of the cores it has
    have = re.match(r"pi4: ([\d.]+) of", capacity).group(1)
    assert re.fullmatch(rf"\d\.\d\d of {have} board cores = \d\.\d\d host cores", used), used


def test_host_busy_and_vpn_daemons_in_the_same_unit(report):
    _caption, header, rows = _cpu_table(report)
    row = next(r for r in rows if r[1] == "wireguard")
    daemons, busy = row[header.index("VPN daemons")], row[header.index("host busy")]
    # the "1.0 %" beside "34.6 % host core": both now in host cores
    assert daemons == f"{DAEMON_PCT / 100:.2f} host cores"
    assert busy == f"{BUSY_PCT / 100 * NCORES:.2f} of {NCORES} host cores"
    assert "%" not in daemons + busy
    softirq = row[header.index("host softirq")]
    assert softirq.endswith(f"of {NCORES} host cores")


# ------------------------------------------------------------------ item 9: warnings


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(doc: str) -> set[str]:
    return {_slug(ln) for ln in (ROOT / doc).read_text().splitlines() if ln.startswith("#")}


def _lab_warnings() -> list[str]:
    """Warnings the lab really produces: profiles scaled onto 2 host cores, the boards' NIC
    latency without netem, nodes under qemu-user, and one with no docs pointer (boards)."""
    prof = load_cpu_profile("pi4", merge_calibration=False)
    prof.core_share, prof.emulated_cores = 0.26, 4
    plan = {n: cpuplan.plan_entry(prof) for n in ("client", "server")}
    scaled = cpuplan.scale_to_host(plan, 2)
    spec = load_topology(TOPOLOGY, None, {"cpu": "pi4"})
    path = cpuplan.nic_path(spec, plan)
    _rec, nic = cpuplan.nic_decision("auto", path, lambda: (False, "no sch_netem (test)"))
    arch = (
        "client (arm64): the board's own binaries under qemu-user, no CPU cap: functional "
        "evidence, not performance (docs/arch.md)"
    )
    boards = (
        "client: default route 'via 10.0.1.1' not installed on board pi-a (its default route "
        "stays on the management network; routes to every lab subnet are installed instead)"
    )
    assert len(scaled) == len(nic) == 1 and all(len(w) > LINE for w in scaled + nic)  # paragraphs
    return scaled + nic + [arch, boards]


class _StandIn:
    """A substrate and its lab: bring_up returns the status and the warnings given."""

    def __init__(self, status: dict, warnings: list[str]):
        self._status, self._warnings, self.id = status, warnings, status["id"]

    def bring_up(self, spec, request):
        # as the local substrate does, the same warning twice (two nodes, one cause)
        notes = [f"lab: warning: {w}" for w in self._warnings + self._warnings[:1]]
        return self, self._status, notes

    def up_note(self, status, seconds):
        return "in 0.01 s"

    def status(self):
        return self._status


def _status(warnings: list[str]) -> dict:
    nic, _ = cpuplan.nic_decision("auto", {"client->server": {"us": 80.0, "hops": []},
                                           "server->client": {"us": 80.0, "hops": []}},
                                  lambda: (False, "no sch_netem (test)"))  # fmt: skip
    return {
        "id": "h1t",
        "state": "up",
        "topology": "topologies/pi_pair.py",
        "nodes": {
            n: {"kind": "local", "netns": f"h1t-{n}", "cpu": c, "interfaces": [{}]}
            for n, c in _pi4_nodes().items()
        },
        "nic_latency": nic,
        "warnings": warnings,
    }


def _consoles(monkeypatch) -> tuple[io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    for mod in (labs, cliprint):
        monkeypatch.setattr(mod, "out", Console(file=out, width=100))
        monkeypatch.setattr(mod, "err", Console(file=err, width=100))
    return out, err


def test_lab_up_says_each_warning_once_on_one_short_line_with_its_docs(monkeypatch):
    warnings = _lab_warnings()
    stand_in = _StandIn(_status(warnings), warnings)
    monkeypatch.setattr(labs, "select", lambda **kw: stand_in)
    out, err = _consoles(monkeypatch)
    assert main(["up", TOPOLOGY, "--id", "h1t"]) == 0
    said = err.getvalue().splitlines()
    # one line per distinct warning (the repeated one once), no continuation lines
    assert len(said) == len(warnings), said
    for line, w in zip(said, warnings, strict=True):
        assert line.startswith("lab: warning: ") and len(line) <= LINE, line
        first = re.split(r": | \(", w, maxsplit=1)[0]
        assert first in line  # what it is about, in its own words
    for line in said[:2]:  # the CPU model's and the NICs': a docs section holds the paragraph
        doc, anchor = re.search(r"\(details: (docs/[\w-]+\.md)#([\w-]+)\)$", line).groups()
        assert anchor in _anchors(doc), line
    assert said[2].endswith("(details: docs/arch.md)")
    assert said[3].endswith("(whole: `lab status --json`)")
    # the table's lines say no warning again (the NICs' was printed in full before)
    assert "NIC latency" not in out.getvalue() and "sch_netem" not in out.getvalue()


def test_lab_status_reminds_of_the_warnings_in_one_line(monkeypatch):
    warnings = _lab_warnings()
    stand_in = _StandIn(_status(warnings), warnings)
    monkeypatch.setattr(labs, "list_lab_ids", lambda: ["h1t"])
    monkeypatch.setattr(labs, "open_lab", lambda lab_id: stand_in)
    out, err = _consoles(monkeypatch)
    assert main(["status"]) == 0
    text = out.getvalue() + err.getvalue()
    for w in warnings:
        assert w[:40] not in text  # no warning said again, not even its start
    assert "sch_netem" not in text  # nor the NICs' in the status lines
    (reminder,) = [ln for ln in text.splitlines() if "warning" in ln]
    assert reminder.startswith(f"{len(warnings)} warnings when this lab came up")
    doc, anchor = re.search(r"(docs/[\w-]+\.md)#([\w-]+)", reminder).groups()
    assert anchor in _anchors(doc) and len(reminder) <= LINE
    # and a lab without warnings gets no reminder
    monkeypatch.setattr(labs, "open_lab", lambda lab_id: _StandIn(_status([]), []))
    out.truncate(0)
    assert main(["status"]) == 0 and "warning" not in out.getvalue()


def test_warning_line_is_the_same_when_shortened_twice():
    # a VM lab's guest prints the short line, the host prints what the guest said
    for w in _lab_warnings():
        once = cliprint.warning_line(w)
        assert cliprint.warning_line(once) == once


def test_every_docs_pointer_of_a_lab_up_warning_exists():
    """doc_ref("x") in the source -> docs/cpu.md#warning-x, a heading of docs/cpu.md's
    "Warnings at `lab up`"."""
    names = {
        m.group(1)
        for p in (ROOT / "lab").rglob("*.py")
        for m in re.finditer(r"doc_ref\(['\"]([\w-]+)['\"]\)", p.read_text())
    }
    assert len(names) >= 10
    missing = {n for n in names if f"warning-{n}" not in _anchors("docs/cpu.md")}
    assert missing == set()
    assert "warnings-at-lab-up" in _anchors("docs/cpu.md")
