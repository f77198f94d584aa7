"""`lab profiles [NAME]`, `lab profiles import` and `lab render`: part of the CLI layer
(dispatched by lab.cli.main.main, which maps errors to exit codes)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from rich.table import Table
from rich.text import Text

from lab.cli.arch import render_check
from lab.cli.printing import out
from lab.core.errors import ConfigError, LabError
from lab.model.topology import load_topology, parse_params
from lab.vpn.tunnel import render, write_rendered
from lab.vpn.byocimport import import_profile
from lab.vpn.profiles import known_profiles, load_profile
from lab.vpn.tunnel import availability


def cmd_render(args) -> int:
    """To DIR/<node>/<file> with --out; else to stdout, each file under a header line naming its
    node and file, secrets redacted: --show-secrets needs --out, so keys never reach a terminal
    (or a terminal's scrollback, a CI log) by accident."""

    if args.show_secrets and not args.out:
        raise ConfigError(
            "keys go only to files (mode 0600): give --out DIR with --show-secrets, or leave "
            "--show-secrets out to print the files with secrets redacted",
            source="lab render",
            field="--show-secrets",
        )
    params = parse_params(args.param)
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise ConfigError(
            "exists and is not a directory; render writes DIR/<node>/<file>",
            source=args.out,
            field="--out",
        )
    spec = load_topology(args.topology, args.topo, params)
    result = render(spec, args.vpn, show_secrets=args.show_secrets)
    if args.out:
        for path in write_rendered(result, Path(args.out)):
            out.print(str(path), highlight=False)
    else:
        print_rendered(result)
    if args.check or args.arch:
        return render_check(spec, args.vpn, args.arch)
    if not result["files"]:
        out.print(f"profile {result['profile']['name']!r} has no config files", highlight=False)
    return 0


def print_rendered(result: dict) -> None:
    """Each file as `==> NODE/FILE <==` (head(1)'s header; the path it gets under --out DIR)
    and its text verbatim, a blank line between files."""
    first = True
    for node, files in result["files"].items():
        for rel, text in files.items():
            print(("" if first else "\n") + f"==> {node}/{rel} <==", flush=True)
            print(text, end="" if text.endswith("\n") else "\n", flush=True)
            first = False


def cmd_profiles_import(args) -> int:
    """`lab profiles import FILE... --out PROFILE.toml` (docs/byoc.md)."""

    written, imported = import_profile(args.files, args.out)
    for path in written:
        out.print(f"wrote {path}", highlight=False)
    for n in imported.notes:
        out.print(f"{n.kind}: {n.file}:{n.line}: {n.text}  ({n.why})", markup=False)
    if imported.tunnel:
        fams = {a.version for addrs in imported.tunnel.values() for a in addrs}
        out.print(
            "tunnel addresses: "
            + ", ".join(f"{r} {' '.join(map(str, a))}" for r, a in imported.tunnel.items())
            + ("" if 6 in fams else " (IPv4 only: tests that need IPv6 do not apply)"),
            markup=False,
            highlight=False,
        )
    return 0


def cmd_profiles(args) -> int:
    """`lab profiles` (every profile), `lab profiles NAME[:k=v,...]` (one profile's parameters),
    `lab profiles import FILE... --out PROFILE.toml`."""
    if args.action == "import":
        return cmd_profiles_import(args)
    if args.files or args.out:
        raise ConfigError(
            "FILE and --out belong to `lab profiles import FILE... --out PROFILE.toml`",
            source="lab profiles",
        )
    if args.action is not None:
        return profile_detail(args.action, as_json=args.json)
    return profile_list(as_json=args.json)


def profile_list(*, as_json: bool) -> int:
    rows = []
    for name in known_profiles():
        try:
            prof = load_profile(name)
            rows.append(
                {
                    "profile": name,
                    "driver": prof.driver_name,
                    "study": prof.study,
                    "description": prof.description,
                    **availability(prof),
                    # can the handshake test force a rekey (Driver.trigger_rekey), and how
                    "rekey": asdict(prof.driver.rekey_support(prof.params)),
                }
            )
        except LabError as e:  # one broken file must not hide the others
            rows.append({"profile": name, "driver": None, "ok": False, "path": None, "why": str(e),
                         "rekey": None})  # fmt: skip
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    t = Table(title="VPN profiles", title_justify="left")
    for col in (
        "profile",
        "driver",
        "study",
        "runs here",
        "data plane",
        "rekey on demand",
        "why not",
    ):
        t.add_column(col)
    for r in rows:
        t.add_row(
            r["profile"],
            r["driver"] or "-",
            r.get("study") or "",
            "yes" if r["ok"] else "no",
            r["path"] or "-",
            "-" if r["rekey"] is None else "yes" if r["rekey"]["ok"] else "no",
            r["why"] or "",
        )
    out.print(t)
    out.print(
        "`lab profiles NAME` shows one profile's parameters and how (or why not) it rekeys",
        highlight=False,
    )
    return 0


def word(value) -> str:
    """A value as it is written after `--vpn NAME:key=` (TOML's true/false, nothing for None)."""
    if value is None:
        return "(not set)"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def param_rows(profile) -> list[dict]:
    """One row per parameter of the profile's driver: type, the profile's value, the driver's
    default, the accepted values and the one-line meaning (lab.model.params.Param)."""
    rows = []
    for name, p in profile.driver.params.items():
        types = " or ".join(t.__name__ for t in p.types) + (" or null" if p.optional else "")
        accepted = p.accepted()
        if accepted == types:  # the type says it all: say it in words
            accepted = "true or false" if p.types == (bool,) else f"any {types}"
        rows.append(
            {
                "param": name,
                "type": types,
                "value": profile.params.get(name),
                "default": p.default,
                "accepted": accepted,
                "meaning": p.doc,
            }
        )
    return rows


def profile_detail(spec: str, *, as_json: bool) -> int:
    """`lab profiles NAME[:k=v,...]`: the profile's parameters (with the overrides applied)."""

    prof = load_profile(spec, where="lab profiles NAME")
    rows = param_rows(prof)
    avail = availability(prof)
    rekey = prof.driver.rekey_support(prof.params)
    if as_json:
        rec = {**prof.to_json(), "availability": avail, "rekey": asdict(rekey), "parameters": rows}
        print(json.dumps(rec, indent=2))
        return 0
    out.print(
        f"{prof.name} ({prof.path}): driver {prof.driver_name}"
        + (f", study {prof.study}" if prof.study else "")
        + (f"\n{prof.description}" if prof.description else ""),
        markup=False,
        highlight=False,
    )
    here = f"yes, data plane {avail['path']}" if avail["ok"] else f"no: {avail['why']}"
    out.print(f"runs here: {here}", markup=False, highlight=False)
    out.print(
        f"rekey on demand: {'yes' if rekey.ok else 'no'}: {rekey.how}",
        markup=False,
        highlight=False,
    )
    t = Table(title=f"parameters (override: --vpn {prof.name}:key=value,...)", title_justify="left")
    for col in ("param", "type", "value", "default", "accepted", "meaning"):
        t.add_column(col, overflow="fold")
    for r in rows:
        changed = r["value"] != r["default"]
        cells = (
            r["param"],
            r["type"],
            word(r["value"]) + (" *" if changed else ""),
            word(r["default"]),
            r["accepted"],
            r["meaning"],
        )
        t.add_row(*(Text(c) for c in cells))  # text as it is: '[...]' is not markup
    out.print(t)
    if not rows:
        out.print(f"driver {prof.driver_name!r} takes no parameters", highlight=False)
    elif any(r["value"] != r["default"] for r in rows):
        out.print("* set by the profile file or an override", highlight=False)
    return 0
