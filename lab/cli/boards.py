"""`lab boards check` and `lab boards prepare`: part of the CLI layer (they print and ask);
the work is lab.substrate.boards.check's."""

from __future__ import annotations

import time

import json
import shlex
import sys
import tempfile
from pathlib import Path

from rich.table import Table

from lab.substrate.boards import check as bc
from lab.substrate.boards.inventory import load_inventory
from lab.cli.printing import out
from lab.core.errors import TeardownIncomplete, ConfigError, PreconditionError
from lab.vpn.profiles import known_profiles, load_profile
from lab.substrate.boards import farm
from lab.model.topology import load_topology, parse_params


def _profiles(option: str | None) -> list:
    """--profiles P1,P2 (default: every profile), each loaded and validated."""
    names = [n.strip() for n in option.split(",")] if option else known_profiles()
    profiles = []
    for n in names:
        try:
            profiles.append(load_profile(n))
        except ConfigError as e:  # the profile came from --profiles, not --vpn
            msg = str(e).removeprefix("--vpn: ")
            raise ConfigError(f"{n!r}: {msg}", source="--profiles") from None
    return profiles


def _yes_no(value) -> str:
    return "-" if value is None else ("yes" if value else "NO")


def _check_table(r: dict) -> Table:
    title = f"board {r['board']} ({r['host']}{'' if r['port'] is None else ':' + str(r['port'])})"
    t = Table(title=title, title_justify="left", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value", overflow="fold")
    reach = "yes" if r["reachable"] else "NO"
    if r["connect_s"] is not None:
        reach += f" (connected in {r['connect_s']:.2f} s)"
    t.add_row("reachable", reach)
    if r.get("error"):
        t.add_row("error", r["error"])
    if not r["reachable"]:
        return t
    root = _yes_no(r.get("root")) + (
        f" (uid {r.get('uid')}, become={r['become']})" if r.get("uid") is not None else ""
    )
    t.add_row("root", root)
    t.add_row("model", r.get("model") or "unknown (no /proc/device-tree/model, no DMI name)")
    for key in ("serial", "arch", "os", "kernel"):
        t.add_row(key, r.get(key) or "unknown")
    t.add_row("CPU governor", r.get("governor") or "none (no cpufreq)")
    temp = r.get("temperature_c")
    t.add_row(
        "temperature",
        "no sensor" if temp is None else f"{temp:.1f} °C ({r.get('temperature_source')})",
    )
    thr = r.get("throttled")
    t.add_row(
        "throttled",
        f"unknown: {r.get('throttled_why')}"
        if thr is None
        else f"{thr['raw']}: {', '.join(thr['words']) or 'never'}",
    )
    t.add_row("clock sync", f"{r.get('clock_sync')} ({r.get('clock_sync_source')})")
    for name, a in (r.get("profiles") or {}).items():
        t.add_row(
            f"profile {name}",
            f"ok ({a['path']})" if a["ok"] else f"NO ({a['path'] or '-'}): {a['why']}",
        )
    imp = r.get("impairment")
    if imp:
        t.add_row(
            "impairment",
            f"{imp['path']} ({imp['why']})" if imp["ok"] else f"NO: {imp['why']}",
        )
    tools = []
    for key, tool in (r.get("tools") or {}).items():
        if not tool["present"]:
            tools.append(f"{key}: MISSING (package {tool['package']})")
        else:
            tools.append(f"{key}: {tool['version'] or 'present'}")
    if tools:
        t.add_row("tools", "\n".join(tools))
    return t


def cmd_boards_check(args) -> int:
    inv = load_inventory(Path(args.inventory))
    profiles = _profiles(args.profiles)
    with tempfile.TemporaryDirectory(prefix="lab-boards-check-") as d:
        records = bc.check(inv, profiles, Path(d))
    if args.json:
        print(json.dumps(records, indent=2))
    else:
        for r in records:
            out.print(_check_table(r))
    bad = [r["board"] for r in records if not (r["reachable"] and r.get("root"))]
    if bad:
        raise PreconditionError(
            f"{len(bad)} of {len(records)} boards not reachable with root: {', '.join(bad)}"
        )
    failed = [r["board"] for r in records if r.get("error")]
    if failed:
        raise PreconditionError(f"check failed on {', '.join(failed)} (see 'error')")
    return 0


def cmd_boards_prepare(args) -> int:
    inv = load_inventory(Path(args.inventory))
    profiles = _profiles(args.profiles)
    with tempfile.TemporaryDirectory(prefix="lab-boards-prepare-") as d:
        sessions = bc.prepare_plan(inv, profiles, Path(d))
        try:
            return _prepare(args, sessions)
        finally:
            bc.close_all(sessions)


def _prepare(args, sessions: dict[str, bc.Session]) -> int:
    records = [bc.prepare_record(s) for s in sessions.values()]
    if args.json:
        print(json.dumps(records, indent=2))
    else:
        for r in records:
            if not r["reachable"] or r.get("error"):
                out.print(f"board {r['board']}: NOT CHECKED: {r['error']}")
            elif not r["packages"]:
                out.print(f"board {r['board']}: nothing to install")
            else:
                pkgs = ", ".join(f"{p} ({', '.join(ts)})" for p, ts in r["packages"].items())
                out.print(f"board {r['board']}: missing {pkgs}")
                out.print(f"  would run: DEBIAN_FRONTEND=noninteractive {shlex.join(r['argv'])}")
    unchecked = [r["board"] for r in records if not r["reachable"] or r.get("error")]
    not_root = [r["board"] for r in records if r.get("argv") and not r.get("root")]
    if unchecked or not_root:
        raise PreconditionError(
            "nothing installed: "
            + "; ".join(
                x
                for x in (
                    unchecked and f"not checked: {', '.join(unchecked)}",
                    not_root and f"no root to run apt-get: {', '.join(not_root)}",
                )
                if x
            )
        )
    todo = [r["board"] for r in records if r.get("argv")]
    if not todo:
        return 0
    if args.dry_run:
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            raise PreconditionError(
                "nothing installed: stdin is not a terminal to ask on; pass --yes to install"
            )
        answer = input(f"install on {', '.join(todo)}? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            out.print("nothing installed")
            return 1
    failed = {n: e for n, e in bc.install_all(sessions).items() if e}
    for name in todo:
        out.print(f"board {name}: {'FAILED: ' + failed[name] if name in failed else 'installed'}")
    if failed:
        raise PreconditionError(f"apt-get failed on {', '.join(failed)}")
    return 0


def cmd_boards(args) -> int:

    if args.boards_cmd == "emulate":
        if args.down:
            lab_id = farm.farm_id(args.lab_id)
            left = farm.remove(lab_id)
            if left:
                raise TeardownIncomplete([f"{lab_id}: {x}" for x in left])
            out.print(f"board farm {lab_id!r} removed")
            return 0
        if not args.topology or not args.out:
            raise ConfigError(
                "lab boards emulate TOPOLOGY --out INVENTORY (or --down to remove a farm)",
                source="lab boards emulate",
            )

        spec = load_topology(args.topology, args.topo, parse_params(args.param))
        t0 = time.monotonic()
        sudo = tuple(b for b in (args.sudo or "").split(",") if b)
        rec = farm.emulate(spec, Path(args.out), args.lab_id, sudo=sudo)
        if args.json:
            print(json.dumps(rec, indent=2))
            return 0
        for name, b in rec["boards"].items():
            out.print(
                f"board {name}: ssh {b['user']}@{b['host']}"
                + (" (root with sudo)" if b["user"] != "root" else "")
                + f", data ports {', '.join(b['data'])}"
            )
        out.print(
            f"board farm {rec['id']!r} up in {time.monotonic() - t0:.2f} s "
            f"(management {rec['subnet']}); inventory {rec['inventory']}; "
            f"`lab boards emulate --down --id {rec['id']}` removes it"
        )
        return 0
    elif args.boards_cmd == "check":
        return cmd_boards_check(args)
    elif args.boards_cmd == "prepare":
        return cmd_boards_prepare(args)
    raise ConfigError(f"unknown action {args.boards_cmd!r}", source="lab boards")
