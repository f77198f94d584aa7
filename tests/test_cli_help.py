"""`lab ... --help` (issue 21): every argument of every subcommand has help text, every
subcommand's help ends with two or three examples, and every example is a command line the real
parser takes (with the profiles and files it names), so an example cannot rot unnoticed."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import pytest

from lab.cli.parser import build_parser
from lab.cli.help import EXAMPLES, subparsers
from lab.vpn.profiles import load_profile

ROOT = Path(__file__).resolve().parent.parent
SKIP = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)


def commands() -> list[tuple[str, argparse.ArgumentParser]]:
    return subparsers(build_parser())


def test_every_argument_has_help():
    missing = [
        f"lab {path} {a.option_strings[0] if a.option_strings else a.dest}".replace("  ", " ")
        for path, p in commands()
        for a in p._actions
        if not isinstance(a, SKIP) and not (a.help or "").strip()
    ]
    assert missing == []


def test_every_command_ends_with_examples():
    """The help text itself, as a user sees it: the last block is `examples:` with 2-3 lines."""
    for path, p in commands():
        text = p.format_help().rstrip()
        head, sep, block = text.rpartition("\nexamples:\n")
        assert sep, f"lab {path} --help has no examples"
        starts = [ln for ln in block.splitlines() if ln.startswith("  ") and "lab " in ln[:12]]
        assert 2 <= len(starts) <= 3, f"lab {path}: {block}"
        assert p.format_usage() in p.format_help()  # the usage line is argparse's own


def test_no_examples_for_a_command_that_does_not_exist():
    assert set(EXAMPLES) <= {path for path, _ in commands()}


def _example_argv(line: str) -> list[str]:
    words = shlex.split(line)
    if words[0] == "sudo":
        words = words[1:]
    assert words[0] == "lab", line
    return words[1:]


@pytest.mark.parametrize("path", sorted(EXAMPLES))
def test_examples_parse(path):
    """Each example parses as the command it illustrates; the VPN profiles it names load and
    the repository files it names exist."""
    for line, what in EXAMPLES[path]:
        assert what.strip(), line
        argv = _example_argv(line)
        if argv == ["COMMAND", "--help"]:
            continue
        args = build_parser().parse_args([w.replace("*", "0") for w in argv])
        chain = " ".join([args.cmd, getattr(args, f"{args.cmd}_cmd", None) or ""]).strip()
        assert chain.startswith(path), line  # `lab impair`'s examples may show `impair set`
        for w in argv:
            if w.split("/")[0] in ("topologies", "plans", "docs") and "DIR" not in w:
                assert (ROOT / w).exists(), f"{line}: {w} is not in the repository"
        vpn = getattr(args, "vpn", None)
        if vpn:
            load_profile(vpn)
        for name in (getattr(args, "profiles", None) or "").split(","):
            if name:
                load_profile(name)
