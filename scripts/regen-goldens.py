#!/usr/bin/env python3
"""Regenerate every golden rendered config the tests compare against (tests/goldens.py lists
them: tests/data/vpn/<profile>/ and tests/data/strongswan/<profile>/), with the tests' own
rendering and normalising functions. Run by hand after an intended change to a driver's
templates, then review `git diff tests/data` before committing: the tests never write these files.

    .venv/bin/python scripts/regen-goldens.py            # rewrite, report what changed
    .venv/bin/python scripts/regen-goldens.py --check    # write nothing; exit 1 if any differs

Files of a profile's golden directory that the profile no longer renders are deleted.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests import goldens  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if any differs")
    args = ap.parse_args()
    changed = []
    for name, fam in goldens.FAMILIES.items():
        missing = [t for t in fam.needs if not shutil.which(t)]
        if missing:
            sys.exit(f"family {name!r} renders with {', '.join(missing)}: install it (setup.sh)")
        for profile in fam.profiles:
            got = goldens.rendered(name, profile)
            have = goldens.stored(name, profile)
            if got == have:
                continue
            gold = fam.directory / profile
            for rel in sorted(set(got) | set(have)):
                if got.get(rel) != have.get(rel):
                    changed.append(gold / rel)
                    if args.check:
                        continue
                    if rel in got:
                        (gold / rel).parent.mkdir(parents=True, exist_ok=True)
                        (gold / rel).write_text(got[rel])
                    else:
                        (gold / rel).unlink()
    for path in changed:
        verb = "differs" if args.check else ("rewrote" if path.exists() else "removed")
        print(f"{verb}: {path.relative_to(REPO)}")
    if not changed:
        print("every golden matches its rendering")
    return 1 if (changed and args.check) else 0


if __name__ == "__main__":
    sys.exit(main())
