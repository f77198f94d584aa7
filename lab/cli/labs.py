"""The `lab` commands (`cmd_<name>(args) -> exit code`): part of the CLI layer, dispatched by
lab.cli.main.main, which maps errors to exit codes."""

from __future__ import annotations

import json
import time


from lab.cli.printing import (
    err,
    impairment_words,
    out,
    print_status,
    warning_line,
    warnings_reminder,
)
from lab.core.errors import ConfigError, TeardownIncomplete
from lab.core.state import check_id, lab_dir, list_lab_ids, state_root
from lab.model.topology import find_topology, load_topology, parse_params
from lab.substrate.base import UpRequest
from lab.substrate.registry import (
    status_line,
    clean_order,
    kept_by_clean,
    open_lab,
    remove,
    select,
)
from lab.model.impairment.directional import check_words
from lab.model.impairment.vocab import KEYWORDS
from lab.model.impairment.words import PRESETS


#: how a substrate's bring_up notes start when they are the lab's warnings
WARNING = "lab: warning: "


def cmd_up(args) -> int:
    params = parse_params(args.param)
    topology = find_topology(args.topology)  # lab.core.paths: cwd, else the installation
    spec = load_topology(topology, args.topo, params)
    guest = [a for p in args.param for a in ("-p", p)]
    for flag, value in (
        ("--topo", args.topo),
        ("--vpn", args.vpn),
        ("--impair", args.impair),
        ("--placement", args.placement),
        ("--impair-backend", args.impair_backend),
    ):
        if value is not None:
            guest += [flag, value]
    t0 = time.monotonic()
    substrate = select(vm=args.vm, boards=args.boards, mapping=args.map, vm_mem_mb=args.vm_mem)
    request = UpRequest(
        lab_id=args.lab_id,
        vpn=args.vpn,
        impair=args.impair,
        placement=args.placement,
        impair_backend=args.impair_backend,
        topology_file=str(topology),
        guest_args=guest,
    )
    lab, status, notes = substrate.bring_up(spec, request)
    dt = time.monotonic() - t0
    for line in dict.fromkeys(notes):  # each warning once, on one line (docs/cpu.md)
        if line.startswith(WARNING):
            line = WARNING + warning_line(line.removeprefix(WARNING))
        err.print(line, markup=False, highlight=False, soft_wrap=True)
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    _print_lab(status)
    if "vpn" in status:
        v = status["vpn"]
        d = v["describe"]
        out.print(
            f"vpn {v['profile']}: {d.get('implementation')} {d.get('version') or ''} "
            f"({d.get('path')}), cipher {d.get('cipher')}, mtu {d.get('mtu')}; "
            f"traffic {v['traffic']['client']} -> {v['traffic']['v4']}",
            highlight=False,
        )
    out.print(
        f"lab {lab.id!r} up {lab.up_note(status, dt)}; `lab exec NODE -- CMD`, `lab down` when done"
    )
    return 0


def cmd_down(args) -> int:
    if args.lab_id:
        lab_id = check_id(args.lab_id)
    else:
        ids = list_lab_ids()
        if len(ids) > 1:
            raise ConfigError(
                f"several labs are up ({', '.join(ids)}); choose one with --id", source="--id"
            )
        lab_id = ids[0] if ids else None
    if lab_id is None or not (lab_dir(lab_id) / "ledger.jsonl").exists():
        out.print(f"lab '{lab_id}' is not up; nothing to do" if lab_id else "no lab is up")
        return 0
    notes: list[str] = []
    left = open_lab(lab_id).down(notes)
    for n in notes:
        err.print(f"lab: note: {n}", markup=False, highlight=False)
    if left:
        raise TeardownIncomplete(left)
    out.print(f"lab {lab_id!r} down")
    return 0


def cmd_clean(args) -> int:
    ids = clean_order(list_lab_ids())
    if not args.farms:
        for lab_id, why in kept_by_clean().items():
            ids.remove(lab_id)
            out.print(why)
    left_all = []
    for lab_id in ids:
        notes: list[str] = []
        left = remove(lab_id, notes)
        for n in notes:
            err.print(f"lab: note: {n}", markup=False, highlight=False)
        left_all += [f"{lab_id}: {x}" for x in left]
        out.print(f"lab {lab_id!r}: {'removed' if not left else 'left over: ' + '; '.join(left)}")
    # a lab killed between creating its state directory and its first ledger line owns nothing else
    root = state_root()
    if root.is_dir():
        for p in root.iterdir():
            if p.is_dir() and not (p / "ledger.jsonl").exists() and not any(p.iterdir()):
                p.rmdir()
    if not ids:
        out.print("no labs recorded; nothing to do")
    if left_all:
        raise TeardownIncomplete(left_all)
    return 0


def _known_id(lab_id: str | None) -> None:
    """An --id that never was a lab here (no ledger) is "no lab ID": not 'broken', and not a case
    for `lab clean`, which would tear down every lab on the machine."""
    if lab_id and lab_id not in list_lab_ids():
        known = ", ".join(list_lab_ids()) or "none"
        raise ConfigError(f"no lab {lab_id!r} (labs here: {known})", source="--id")


def cmd_status(args) -> int:

    ids = [args.lab_id] if args.lab_id else list_lab_ids()
    _known_id(args.lab_id)
    statuses = [open_lab(lab_id).status() for lab_id in ids]
    if args.json:
        print(json.dumps(statuses, indent=2))
        return 0
    if not statuses:
        out.print("no labs are up")
    for s in statuses:
        _print_lab(s)
        if line := warnings_reminder(s):
            out.print(line, markup=False, highlight=False, soft_wrap=True)
    return 0


def _command(args) -> list[str]:
    cmd = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise ConfigError(
            "no command given; usage: lab exec NODE -- CMD [ARGS...]", source="lab exec"
        )
    return cmd


def cmd_exec(args) -> int:

    command = _command(args)  # checked before the lab is looked for
    _known_id(args.lab_id)
    return open_lab(args.lab_id).exec(args.node, command)


def cmd_shell(args) -> int:

    _known_id(args.lab_id)
    return open_lab(args.lab_id).shell(args.node)


def cmd_impair(args) -> int:

    if args.impair_cmd == "set":
        if args.target in KEYWORDS or args.target in PRESETS:  # `impair set delay 40ms`
            raise ConfigError(
                f"missing: the TARGET ({args.target!r} is an impairment word); usage: lab "
                "impair set TARGET SPEC..., TARGET one of: a link name, a node, NODE:IFACE or "
                f"all (e.g. lab impair set all {' '.join([args.target, *args.spec])})",
                source="lab impair set",
                field="TARGET",
            )
        # the words first: bad words are bad input whether or not a lab is up
        check_words(" ".join(args.spec), source="lab impair set")
    _known_id(args.lab_id)
    lab = open_lab(args.lab_id)
    if args.impair_cmd == "set":
        target = None if args.target in ("all", "default") else args.target
        res = lab.impair("set", " ".join(args.spec), target)
    else:
        res = lab.impair(args.impair_cmd)
    if getattr(args, "json", False):
        print(json.dumps(res, indent=2, default=str))
        return 0
    for line in impairment_lines(res):
        out.print(line, markup=False, highlight=False)
    return 0


def impairment_lines(res: dict) -> list[str]:
    """`lab impair show/set/clear` in words: the backend, then each point and engine direction
    named as the `lab status` table names them (NODE:IFACE, the link's nodes `router->server`,
    the tunnel direction `client->server`), never a Python repr."""
    if not res.get("backend"):
        return [
            "impairment: none (no impairment points yet; `lab impair set TARGET SPEC` adds them)"
        ] + ([res["note"]] if res.get("note") and res["note"] != "no impairment points" else [])
    why = f" ({res['why']})" if res.get("why") else ""
    lines = [f"impairment: backend {res['backend']}{why}, placement {res.get('placement')}"]
    if res.get("note"):
        lines.append(f"  note: {res['note']}")
    where = res.get("where") or {}

    def way(w: dict) -> str:  # "router->client (server->client)"; "client->server" once
        hop = f"{w['from']}->{w['to']}"
        return hop if hop == w["way"] else f"{hop} ({w['way']})"

    def at(key: str) -> str:
        return f"{key} {way(where[key])}" if key in where else key

    for label, rows in (("base", res.get("base")), ("requested", res.get("requested"))):
        for key, text in (rows or {}).items():
            lines.append(f"  {label} at {at(key)}: {text or 'none'}")
    engines = res.get("engines") or {}
    for key, text in (res.get("applied") or {}).items():
        if not isinstance(text, dict):  # a kernel qdisc: NODE:DEV -> words
            lines.append(f"  in force at {at(key)}: {text or 'none'}")
            continue
        eng = engines.get(key) or {}
        link = next((w["link"] for k, w in where.items() if k.startswith(f"{key}:")), None)
        lines.append(f"  in force in engine {key}" + (f" on link {link}:" if link else ":"))
        if eng.get("error"):
            lines.append(f"    not answering: {eng['error']}")
        for d in ("a2b", "b2a"):
            if d not in text:
                continue
            w = where.get(f"{key}:{d}")
            lines.append(f"    {way(w) if w else d}: {impairment_words(text[d])}")
            counters = (eng.get(d) or {}).get("counters") if isinstance(eng.get(d), dict) else None
            if counters:
                moved = ", ".join(f"{k} {v}" for k, v in counters.items() if v)
                lines.append(f"      counters: {moved or 'all 0'}")
            tr = (eng.get(d) or {}).get("trace") if isinstance(eng.get(d), dict) else None
            if tr:  # a trace-driven link: its delivery opportunities so far (engine/src/trace.rs)
                lines.append(
                    f"      trace: {tr['opportunities']} delivery opportunities, {tr['used']} "
                    f"used, {tr['wasted']} wasted (up to {tr['bytes_per_opportunity']} bytes "
                    f"each; {tr['lines']} lines, period {tr['period_ms']} ms)"
                )
    for w in res.get("warnings") or []:
        lines.append(f"  warning: {w}")
    return lines


def _print_lab(status: dict) -> None:
    """A lab's status table, and a line on what it runs on when the user should know it."""
    print_status(status)
    if line := status_line(status):
        out.print(line, markup=False, highlight=False)
