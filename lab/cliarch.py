"""`lab arch ...`: foreign-architecture roots (lab.arch). Prints; the work is in lab.arch."""

from __future__ import annotations

from .arch import get
from .arch.fetch import fetch, plan
from .cliprint import out
from .errors import ConfigError


def cmd_arch(args) -> int:
    if args.arch_cmd != "fetch":
        raise ConfigError(f"unknown action {args.arch_cmd!r}; accepted: fetch", source="lab arch")
    p = plan(get(args.arch, source="lab arch fetch", field="ARCH"))
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
