"""What the `lab` parser needs beyond argparse: the examples that end each command's --help
(lab.cli.main builds the parser, then `add_examples` puts them under every subcommand;
tests/test_cli_help.py parses every example with the real parser, so an example that stops being
valid fails a test), and lab exec's options read back from the words argparse.REMAINDER took.
Part of the CLI layer."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

from lab import REPO
from lab.core.errors import ConfigError

#: command path ("" for `lab` itself, "impair set") -> (command line, what it does); 2 or 3 each
EXAMPLES: dict[str, list[tuple[str, str]]] = {
    "": [
        ("sudo lab up topologies/pi_pair.py --vpn wireguard", "a lab with a tunnel"),
        ("sudo lab run plans/quick.toml", "a short campaign and its report"),
        ("lab COMMAND --help", "a command's options and examples"),
    ],
    "up": [
        ("sudo lab up topologies/pi_pair.py", "two nodes, one link, lab id 'lab'"),
        (
            "sudo lab up topologies/pi_pair_middlebox.py --id t1 --vpn wireguard:mtu=1380 "
            "--impair 'delay 40ms loss 0.5%'",
            "a tunnel across an impaired router",
        ),
        (
            "sudo lab up topologies/pi_pair.py --vm --vpn macsec-gcm-aes-128",
            "in the full-kernel VM",
        ),
    ],
    "render": [
        ("lab render topologies/pi_pair.py --vpn wireguard", "to stdout, secrets redacted"),
        (
            "lab render topologies/pi_pair.py --vpn openvpn-tls --out /tmp/cfg --show-secrets",
            "files for the boards, keys in (0600)",
        ),
        (
            "lab render topologies/pi_pair.py --vpn openvpn-tls --out /tmp/cfg --check",
            "and have openvpn read each file",
        ),
    ],
    "profiles": [
        ("lab profiles", "every profile: runs here? data plane, why not"),
        ("lab profiles ipsec-modern", "one profile's parameters: type, default, accepted"),
        (
            "lab profiles import wg0.conf --out team/wg.toml",
            "your own config files as a profile (docs/byoc.md)",
        ),
    ],
    "down": [
        ("sudo lab down", "the only lab that is up"),
        ("sudo lab down --id t1", "lab t1"),
    ],
    "clean": [
        ("sudo lab clean", "every lab on this machine; emulated board farms kept"),
        ("sudo lab clean --farms", "emulated board farms too"),
    ],
    "status": [
        ("sudo lab status", "every lab: nodes, addresses, CPU caps, VPN, impairment"),
        ("sudo lab status --id t1 --json", "one lab, as JSON"),
    ],
    "exec": [
        ("sudo lab exec client -- ping -c3 10.99.0.2", "node client pings through the tunnel"),
        ("sudo lab exec client --id t1 -- ip -br addr", "in lab t1 (options before '--')"),
        ("sudo lab exec --id t1 server -- ss -tln", "options before NODE work too"),
    ],
    "impair": [
        ("sudo lab impair set all delay 40ms 5ms loss 0.5%", "every impairment point"),
        ("sudo lab impair show", "what is really applied"),
        ("sudo lab impair clear --id t1", "undisturbed forwarding again"),
    ],
    "impair set": [
        ("sudo lab impair set all delay 40ms 5ms loss 0.5%", "every point, each direction"),
        ("sudo lab impair set router:router-eth0 rate 10mbit", "one egress interface"),
        ("sudo lab impair set client-router network2 --id t1", "one link, a preset"),
    ],
    "impair show": [
        ("sudo lab impair show", "backend, placement, applied spec, engine counters"),
        ("sudo lab impair show --id t1 --json", "as JSON"),
    ],
    "impair clear": [
        ("sudo lab impair clear", "remove all impairment"),
        ("sudo lab impair clear --id t1 --json", "lab t1; the result as JSON"),
    ],
    "shell": [
        ("sudo lab shell router", "an interactive shell in node router"),
        ("sudo lab shell server --id t1", "in lab t1"),
    ],
    "calibrate": [
        ("sudo lab calibrate pi4", "fit and verify (about a minute)"),
        ("sudo lab calibrate pi4 --quick", "2 short rounds (~10 s)"),
        ("sudo lab calibrate pi4 --json", "the record as JSON"),
    ],
    "run": [
        ("sudo lab run plans/quick.toml", "a few minutes; report in runs/<time>_quick/"),
        ("sudo lab run plans/study_a.toml -o reps=1 -o duration=3", "a trimmed study A"),
        ("sudo lab run --resume runs/DIR", "continue an interrupted run"),
    ],
    "boards": [
        ("sudo lab boards emulate topologies/pi_pair.py --out farm.toml", "an emulated farm"),
        ("sudo lab boards check farm.toml", "what each board is, has and lacks"),
        ("sudo lab boards prepare boards.toml --dry-run", "packages each board needs"),
    ],
    "boards emulate": [
        ("sudo lab boards emulate topologies/pi_pair.py --out farm.toml", "one board per host"),
        ("sudo lab boards emulate --down --id farm1", "remove farm farm1"),
    ],
    "boards check": [
        ("sudo lab boards check boards.toml", "every board, every profile"),
        ("sudo lab boards check boards.toml --profiles wireguard,ipsec-modern --json", "as JSON"),
    ],
    "boards prepare": [
        ("sudo lab boards prepare boards.toml --dry-run", "list the packages only"),
        ("sudo lab boards prepare boards.toml --profiles wireguard --yes", "install, no question"),
    ],
    "merge": [
        ("lab merge shards/shard-0 shards/shard-1 --out runs/joined", "two shards into one run"),
        ("lab merge shards/shard-* --out runs/joined", "every shard (the shell expands *)"),
    ],
    "report": [
        ("lab report runs/DIR", "regenerate tables, plots, report.md and report.html"),
        ("lab report runs/imported", "the report of a run made by lab import"),
    ],
    "compare": [
        ("lab compare runs/A runs/B", "B against A; written to runs/B/compare-A/"),
        ("lab compare runs/dryrun runs/boards --out /tmp/cmp", "to a directory of your choice"),
    ],
    "import": [
        ("lab import published.csv --out runs/published", "a table as a run directory"),
        ("lab import team/pi4.csv --out /tmp/pi4", "then: lab compare runs/DIR /tmp/pi4"),
    ],
    "check": [
        ("sudo lab check plans/quick.toml", "run the plan, judge its [[expect]] tables"),
        ("lab check plans/quick.toml --run runs/DIR --junit verdicts.xml", "judge a finished run"),
        ("sudo lab check plans/quick.toml --baseline runs/BASE", "regressions against a run"),
    ],
    "arch": [
        ("sudo lab arch fetch arm64", "a Pi 4's Debian binaries for arch='arm64' nodes"),
        ("sudo lab arch fetch armhf --force", "fetch again"),
    ],
    "arch fetch": [
        ("sudo lab arch fetch arm64", "into /var/cache/lab/arch/arm64"),
        ("sudo lab arch fetch arm64 --force", "fetch again even if present"),
    ],
    "ci": [
        ("lab ci init", "a lab check workflow in this repository"),
        ("lab ci init ../myrepo --force", "in another one, overwriting"),
    ],
    "ci init": [
        (
            "lab ci init",
            ".github/workflows/lab-check.yml and lab-check.toml here, then the lines to edit",
        ),
        ("lab ci init ../myrepo --force", "in another repository, overwriting"),
    ],
}


def epilog(path: str) -> str:
    """`examples:` and the aligned command lines of EXAMPLES[path]."""
    rows = EXAMPLES[path]
    width = max(len(cmd) for cmd, _ in rows)
    lines = []
    for cmd, what in rows:
        if width > 60:  # a long line: its comment goes under it
            lines += [f"  {cmd}", f"      # {what}"]
        else:
            lines.append(f"  {cmd.ljust(width)}  # {what}")
    return "examples:\n" + "\n".join(lines)


class LabParser(argparse.ArgumentParser):
    """The `lab` parser (and, as argparse makes them of the same class, every subcommand's): its
    help ends with what this installation ships (SHIPPED), read from the files when help is
    printed, never when a command runs."""

    def format_help(self) -> str:
        more = [part(REPO) for part in SHIPPED.get(self.prog, ())]
        return super().format_help() + "".join(f"\n{m}\n" for m in more if m)


def _first_sentence(text: str, limit: int = 110) -> str:
    text = " ".join(text.split())
    m = re.match(r"(.+?[.!?])(\s|$)", text)
    text = m.group(1) if m else text
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def _build_keys(tree: ast.Module) -> list[str]:
    """`-p` keys of a topology file: the parameters of its Topo classes' build(), read from the
    source (the file is not run: help stays fast and runs nothing of the user's)."""
    keys: list[str] = []
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for fn in cls.body:
            if not (isinstance(fn, ast.FunctionDef) and fn.name == "build"):
                continue
            args = fn.args.args[1:] + fn.args.kwonlyargs
            defaults = [None] * (len(fn.args.args) - 1 - len(fn.args.defaults))
            defaults += list(fn.args.defaults) + list(fn.args.kw_defaults)
            for a, d in zip(args, defaults, strict=True):
                shown = "" if d is None or ast.unparse(d) == "None" else ast.unparse(d).strip("'\"")
                word = f"{a.arg}={shown}" if shown else a.arg
                if word not in keys:
                    keys.append(word)
    return keys


def shipped_topologies(root: Path) -> str:
    """The topologies of `root`/topologies, each with its `-p` keys (default after `=`) and the
    first sentence of its docstring."""
    rows = []
    for f in sorted((root / "topologies").glob("*.py")):
        try:
            tree = ast.parse(f.read_text(), str(f))
        except (OSError, SyntaxError, ValueError):
            continue  # lab up names the problem when the file is used
        keys = " ".join(_build_keys(tree)) or "(none)"
        rows.append(f"  {f.name:<27} -p {keys}")
        if doc := ast.get_docstring(tree):
            rows.append(f"  {'':<27} {_first_sentence(doc)}")
    if not rows:
        return ""
    head = [
        "shipped topologies (topologies/NAME.py): -p KEY=VALUE sets a parameter of the file's",
        "build(), default after '='; -p dilation=X and -p nic_latency=auto|on|off work with any",
    ]
    return "\n".join([*head, *rows])


def shipped_plans(root: Path) -> str:
    """The plans of `root`/plans with the first sentence of each one's opening comment."""
    rows = []
    for f in sorted((root / "plans").glob("*.toml")):
        try:
            lines = f.read_text().splitlines()
        except OSError:
            continue
        comment = []
        for line in lines:
            if not line.startswith("#"):
                break
            comment.append(line.lstrip("#").strip())
        rows.append(f"  {f.name:<27} {_first_sentence(' '.join(comment))}".rstrip())
    if not rows:
        return ""
    return "\n".join(["shipped plans (plans/NAME.toml; `lab run NAME` or its path):", *rows])


#: a parser's prog -> what its help ends with (LabParser)
SHIPPED = {
    "lab": (shipped_topologies, shipped_plans),
    "lab up": (shipped_topologies,),
    "lab render": (shipped_topologies,),
    "lab run": (shipped_plans,),
    "lab check": (shipped_plans,),
}


def subparsers(
    parser: argparse.ArgumentParser, path: str = ""
) -> list[tuple[str, argparse.ArgumentParser]]:
    """(command path, parser) for `parser` and every subcommand below it."""
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += subparsers(sub, f"{path} {name}".strip())
    return found


def add_examples(parser: argparse.ArgumentParser) -> None:
    """Every (sub)command's help ends with its examples; descriptions and epilogs are shown as
    written (RawDescriptionHelpFormatter; usage lines unchanged). A command without examples
    still works; tests/test_cli_help.py fails on it."""
    for path, p in subparsers(parser):
        if path in EXAMPLES:
            p.epilog = epilog(path)
        p.formatter_class = argparse.RawDescriptionHelpFormatter


def exec_words(args: argparse.Namespace) -> None:
    """`lab exec NODE --id ID -- CMD`: the command is argparse.REMAINDER, which takes every word
    after NODE (and drops a `--` right after NODE, so `--id X` and `-- --id X` look alike), so
    the words after `exec` are read again here: --id before or after NODE is lab exec's; from
    `--` (or the first word after NODE that is not an option) on, every word is the command's."""
    raw = args.argv[args.argv.index("exec") + 1 :]
    usage = "usage: lab exec [--id ID] NODE [--id ID] -- CMD [ARGS...]"
    ids, node, i = [], None, 0
    while i < len(raw):
        w = raw[i]
        if w == "--":
            i += 1
            break
        if w == "--id" and i + 1 < len(raw) and raw[i + 1] != "--":
            ids.append(raw[i + 1])
            i += 2
        elif w.startswith("--id="):
            ids.append(w.split("=", 1)[1])
            i += 1
        elif w == "--id":
            raise ConfigError(f"--id needs a value; {usage}", source="lab exec", field="--id")
        elif w.startswith("-"):
            raise ConfigError(
                f"{w!r} is not an option of lab exec (only --id); the command's own options go "
                f"after '--': {usage}",
                source="lab exec",
            )
        elif node is None:
            node = w
            i += 1
        else:
            break  # the command's first word
    if len(set(ids)) > 1:
        raise ConfigError(
            f"given twice ({', '.join(map(repr, ids))}); give it once",
            source="lab exec",
            field="--id",
        )
    args.lab_id = ids[0] if ids else None
    args.command = raw[i:]
