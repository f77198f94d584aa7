"""`lab arch ...`: foreign-architecture roots (lab.core.arch). Prints; the work is in lab.core.arch."""

from __future__ import annotations

import tempfile
from pathlib import Path

from rich.table import Table

from lab.core.arch import get
from lab.core.arch.emulate import ArchRoot
from lab.core.arch.fetch import fetch, plan
from lab.substrate.tools import board_packages, board_tools
from lab.cli.printing import out
from lab.core.errors import ConfigError
from lab.vpn.configcheck import check_rendered
from lab.vpn.tunnel import render, write_rendered


def cmd_arch(args) -> int:
    if args.arch_cmd != "fetch":
        raise ConfigError(f"unknown action {args.arch_cmd!r}; accepted: fetch", source="lab arch")
    p = plan(get(args.arch, source="lab arch fetch", field="ARCH"), board_packages())
    m = fetch(p, force=args.force)
    mb = m["size_bytes"] / 1e6
    if m.get("already_present"):
        out.print(
            f"{p.arch.name} root {p.root} already holds {len(m['packages'])} packages "
            f"({mb:.0f} MB, fetched {m['fetched']}); --force fetches again",
            markup=False,
            highlight=False,
        )
        return 0
    fa = m["host_foreign_architectures"]
    out.print(
        f"{p.arch.name}: {len(m['packages'])} packages unpacked into {p.root} ({mb:.0f} MB) in "
        f"{m['total_seconds']} s (download {m['download_seconds']} s); host foreign "
        f"architectures before {fa['before']} after {fa['after']}",
        markup=False,
        highlight=False,
    )
    return 0


def render_check(spec, vpn: str, arch: str | None) -> int:
    """`lab render --check [--arch ARCH]`: the table of verdicts; a file refused is a
    ConfigError naming it (exit 2), a file nothing can check is listed as such. The files
    checked are a rendering of their own with real throwaway keys (the written ones are
    redacted), in a private temporary directory removed afterwards."""
    root = (
        ArchRoot.open(get(arch, source="lab render", field="--arch").name, board_tools())
        if arch
        else None
    )
    with tempfile.TemporaryDirectory(prefix="lab-render-check-") as tmp:
        out_dir = Path(tmp)
        result = render(spec, vpn, show_secrets=True)
        write_rendered(result, out_dir)
        rows = check_rendered(result, out_dir, root)
    t = Table(title=f"{result['profile']['name']}: rendered files checked", title_justify="left")
    for col in ("node", "file", "checked by", "verdict"):
        t.add_column(col)
    verdict = {True: "ok", False: "REFUSED", None: "not checked"}
    for r in rows:
        t.add_row(r.node, r.file, r.checked_by, f"{verdict[r.ok]}: {r.detail}")
    out.print(t)
    bad = [r for r in rows if r.ok is False]
    if bad:
        raise ConfigError(
            "; ".join(f"{r.node}/{r.file}: {r.detail}" for r in bad),
            source=result["profile"]["file"],
        )
    return 0
