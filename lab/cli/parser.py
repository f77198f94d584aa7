"""The `lab` parser: every command's arguments (argparse), the checks every argument gets before a command runs (paths, ids, the words of `lab impair set` and `lab exec`), and the messages that name an argument by its flag."""

from __future__ import annotations

import argparse

from lab import __version__
from lab.cli.help import LabParser, add_examples
from lab.model.topology import NAME_MAX as NODE_NAME_MAX
from lab.model.topology import NAME_RE
from lab.core.errors import ConfigError
from lab.core.state import check_id

#: VM memory a `--vm-mem` may ask for, in MB (a guest below this does not boot its kernel)
VM_MEM_MB = (256, 262144)


#: an argument's name in messages, by its argparse dest (positionals: upper case)
FLAGS = {
    "lab_id": "--id",
    "vpn": "--vpn",
    "impair": "--impair",
    "param": "-p",
    "override": "-o",
    "map": "--map",
    "out": "--out",
    "topo": "--topo",
    "boards": "--boards",
    "resume": "--resume",
    "run": "--run",
    "baseline": "--baseline",
    "junit": "--junit",
    "profiles": "--profiles",
    "placement": "--placement",
    "shard": "--shard",
    "jobs": "--jobs",
    "shards": "SHARD_DIR",
}


#: arguments that name a file or directory (checked against the file system's name limits)
PATH_ARGS = {"topology", "plan", "inventory", "run_dir", "run_a", "run_b", "table", "out"}
PATH_ARGS |= {"resume", "boards", "run", "baseline", "junit", "dir", "shards"}
NAME_MAX, PATH_MAX = 255, 4096  # bytes (linux/limits.h)


#: arguments passed on as they are: a command's own words may be empty strings
VERBATIM = {"command", "argv", "cmd", "impair_cmd", "boards_cmd"}


def _mem_mb(text: str) -> int:
    lo, hi = VM_MEM_MB
    try:
        mb = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of MB") from None
    if not lo <= mb <= hi:
        raise argparse.ArgumentTypeError(f"{mb} MB; accepted: {lo}..{hi}")
    return mb


def check_args(args: argparse.Namespace) -> None:
    """What argparse cannot say: an empty or blank value is bad input, never "not given"
    (`--id ""` must not build the default lab, `--impair ""` must not build impairment points
    with nothing to do); a lab id is checked once, for every command that takes one."""

    for dest, value in vars(args).items():
        if dest in VERBATIM:
            continue
        flag = FLAGS.get(dest, dest.upper())
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, str) and not v.strip():
                raise ConfigError(
                    f"empty value {v!r}; give a value or leave {flag} out", source=flag
                )
    for dest in PATH_ARGS:
        value = getattr(args, dest, None)
        for v in value if isinstance(value, list) else [value]:  # --baseline repeats
            if isinstance(v, str):
                check_path(v, FLAGS.get(dest, dest.upper()))
    if getattr(args, "lab_id", None) is not None:
        check_id(args.lab_id)
    if getattr(args, "node", None) is not None:
        if not NAME_RE.match(args.node) or len(args.node) > NODE_NAME_MAX:
            shown = args.node if len(args.node) <= 60 else args.node[:60] + "..."
            raise ConfigError(
                f"{shown!r} is not a node name (a letter, then letters, digits, '_'; at most "
                f"{NODE_NAME_MAX}); `lab status` lists the nodes",
                source="NODE",
            )


def check_path(text: str, flag: str) -> None:
    """A path no file system takes (ENAMETOOLONG) is bad input, said before any lookup."""
    part = max(text.split("/"), key=lambda p: len(p.encode()))
    if len(part.encode()) > NAME_MAX or len(text.encode()) > PATH_MAX:
        raise ConfigError(
            f"path too long: the name {part[:60]!r}... has {len(part.encode())} bytes, a file "
            f"system takes {NAME_MAX} (and {PATH_MAX} for a whole path)",
            source=flag,
        )


def impair_set_words(args: argparse.Namespace) -> None:
    """`lab impair set TARGET SPEC...` takes its SPEC words verbatim (argparse.REMAINDER), so
    `delay -5ms` reaches the spec's own check instead of being read as an option; the options
    of `impair set` written after the words are picked out again here."""
    words, i = [], 0
    spec = list(args.spec)
    while i < len(spec):
        w = spec[i]
        if w == "--json":
            args.json = True
        elif w == "--id" and i + 1 < len(spec):
            args.lab_id = spec[i + 1]
            i += 1
        elif w.startswith("--id="):
            args.lab_id = w.split("=", 1)[1]
        else:
            words.append(w)
        i += 1
    if not words:
        raise ConfigError(
            "no SPEC given; usage: lab impair set TARGET SPEC... (tc-netem words, a preset or "
            "'none')",
            source="lab impair set",
            field="SPEC",
        )
    args.spec = words


def _add_id(p: argparse.ArgumentParser) -> None:
    p.add_argument("--id", dest="lab_id", help="lab id (default: the only lab that is up)")


def _actions(sub: argparse._SubParsersAction, name: str, help: str) -> argparse._SubParsersAction:
    """A command made of actions (lab impair set, lab boards check, ...): its ACTION is
    required and lands in args.<name>_cmd."""
    p = sub.add_parser(name, help=help)
    return p.add_subparsers(dest=f"{name}_cmd", required=True, metavar="ACTION")


def _add_topology(p: argparse.ArgumentParser, **topology: str) -> None:
    """TOPOLOGY, --topo and -p KEY=VALUE (lab up, lab render, lab boards emulate)."""
    topology.setdefault("help", "topology file (Python module with topos = {...})")
    p.add_argument("topology", **topology)
    p.add_argument("--topo", help="which entry of the file's topos dict")
    p.add_argument(
        "-p",
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="parameter passed to the Topo constructor (repeatable)",
    )


def _add_inventory(p: argparse.ArgumentParser, profiles_help: str) -> None:
    """INVENTORY and --profiles P1,P2 (lab boards check, lab boards prepare)."""
    p.add_argument("inventory", help="boards.toml or an Ansible inventory")
    p.add_argument("--profiles", metavar="P1,P2", help=profiles_help)


def _add_plan_out(p: argparse.ArgumentParser, override_help: str) -> None:
    """-o KEY=VALUE and --out RUN_DIR (lab run, lab check)."""
    p.add_argument(
        "-o", dest="override", action="append", default=[], metavar="KEY=VALUE", help=override_help
    )
    p.add_argument("--out", metavar="RUN_DIR", help="run directory (default ./runs/<UTC>_<plan>)")


def _add_vm_boards(p: argparse.ArgumentParser, vm_help: str, boards_help: str) -> None:
    """--vm, --vm-mem MB, --boards INVENTORY and --map NODE=BOARD (lab up, lab run, lab check)."""
    p.add_argument("--vm", action="store_true", help=vm_help)
    p.add_argument(
        "--vm-mem", type=_mem_mb, default=2048, metavar="MB", help="VM memory (with --vm)"
    )
    p.add_argument("--boards", metavar="INVENTORY", help=boards_help)
    p.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="NODE=BOARD",
        help="run topology node NODE on board BOARD (default: the board of the same name)",
    )


def build_parser() -> argparse.ArgumentParser:
    ap = LabParser(prog="lab", description="Network-namespace lab for benchmarking VPNs.")
    ap.add_argument("--version", action="version", version=f"lab {__version__}")
    ap.add_argument(
        "--debug",
        action="store_true",
        help="show the Python traceback of an error (else one line naming the input)",
    )
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    p = sub.add_parser("up", help="build a topology (and optionally a VPN) as namespaces")
    _add_topology(p)
    p.add_argument("--id", dest="lab_id", default=None, help="lab id (default: lab)")
    p.add_argument("--json", action="store_true", help="print the lab's status as JSON")
    p.add_argument(
        "--vpn",
        metavar="PROFILE[:K=V,...]",
        help="start this VPN profile (vpn_profiles/, `lab profiles`) with overrides",
    )
    p.add_argument(
        "--impair",
        metavar="SPEC",
        help="build impairment points and apply SPEC (tc-netem words, a preset, or 'none')",
    )
    p.add_argument(
        "--placement",
        choices=["middlebox", "egress", "ingress"],
        help="where impairment goes (default: middlebox when a router sits between the "
        "VPN endpoints, else egress)",
    )
    p.add_argument(
        "--impair-backend",
        default="auto",
        choices=["auto", "kernel-netem", "userspace"],
        help="impairment back end: kernel netem, the lab's own engine (userspace), or auto "
        "(netem when the kernel has it; default)",
    )
    _add_vm_boards(
        p,
        "run the lab inside the full-kernel VM (netem, WireGuard, ESP, MACsec, GRE, "
        "L2TP when this kernel lacks them); exec/impair/status/down reach into it",
        "build it on real boards over SSH (boards.toml or an Ansible inventory; "
        "docs/boards.md); everything changed on a board is restored at `lab down`",
    )

    p = sub.add_parser("render", help="write a VPN profile's config files for a topology")
    _add_topology(p)
    p.add_argument(
        "--vpn",
        required=True,
        metavar="PROFILE[:K=V,...]",
        help="the VPN profile to render (vpn_profiles/, `lab profiles`) with overrides",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        help="write DIR/<node>/<file> (default: print each file to stdout under a line "
        "'==> NODE/FILE <==', secrets redacted)",
    )
    p.add_argument(
        "--show-secrets",
        action="store_true",
        help="keep keys in (files mode 0600); only with --out: keys never go to a terminal",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="have the real binary read each file, without a tunnel (a table of verdicts)",
    )
    p.add_argument(
        "--arch", metavar="ARCH", help="--check with that architecture's build (lab arch fetch)"
    )

    p = sub.add_parser("profiles", help="list VPN profiles and whether they can run here")
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.add_argument(
        "action",
        nargs="?",
        metavar="NAME|import",
        help="NAME[:K=V,...]: one profile's parameters (type, value, default, accepted values); "
        "import FILE... --out PROFILE.toml: your wg-quick/swanctl/OpenVPN files as a profile "
        "(docs/byoc.md)",
    )
    p.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="import: wg-quick .conf, swanctl.conf or OpenVPN files of one tunnel",
    )
    p.add_argument("--out", metavar="PROFILE.toml", help="import: the profile file to write")

    p = sub.add_parser("down", help="tear a lab down (exactly what it created)")
    _add_id(p)

    p = sub.add_parser(
        "clean",
        help="tear down every lab recorded on this machine, even half-built ones, and restore "
        "every board a lab changed",
    )
    p.add_argument(
        "--farms", action="store_true", help="remove emulated board farms too (kept otherwise)"
    )

    p = sub.add_parser("status", help="list labs, nodes and addresses")
    _add_id(p)
    p.add_argument("--json", action="store_true", help="print the labs' status as JSON")

    p = sub.add_parser("exec", help="run a command in a node (its namespaces, cgroup and env)")
    _add_id(p)
    p.add_argument("node", help="node name (`lab status` lists them)")
    p.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        help="-- CMD ARGS...: after '--' every word is the command's; --id may come before it",
    )

    isub = _actions(sub, "impair", help="show or change impairment at run time")
    q = isub.add_parser(
        "set", help="lab impair set TARGET SPEC...  (TARGET: LINK, NODE, NODE:IFACE or all)"
    )
    _add_id(q)
    q.add_argument(
        "target",
        help="where: 'all', a link (client-router), a node (router) or one egress "
        "(router:router-eth0); `lab impair show` lists the points",
    )
    q.add_argument(
        "spec",
        nargs=argparse.REMAINDER,
        help="tc-netem words (negative values included); parameters not given keep their values",
    )
    q.add_argument("--json", action="store_true", help="print the result as JSON")
    for name, what in (
        ("show", "what is really applied, plus the engine's counters"),
        ("clear", "remove all impairment (undisturbed forwarding)"),
    ):
        q = isub.add_parser(name, help=what)
        _add_id(q)
        q.add_argument("--json", action="store_true", help="print the result as JSON")

    p = sub.add_parser("shell", help="open a shell in a node")
    _add_id(p)
    p.add_argument("node", help="node name (`lab status` lists them)")

    p = sub.add_parser(
        "calibrate", help="fit a CPU profile (e.g. pi4) to this machine and verify it"
    )
    p.add_argument("profile", help="CPU profile name (cpu_profiles/NAME.toml)")
    p.add_argument(
        "--quick", action="store_true", help="2 short rounds, verify two primitives (~10 s)"
    )
    p.add_argument("--no-verify", action="store_true", help="skip the check inside a capped cgroup")
    p.add_argument("--json", action="store_true", help="print the calibration record as JSON")

    p = sub.add_parser("run", help="run a plan (profiles x impairments x tests x repetitions)")
    p.add_argument("plan", nargs="?", help="plan file or name in plans/ (optional with --resume)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run, skipping finished cases")
    _add_plan_out(p, "override a plan value: reps=1, duration=3, profiles=a,b, ...")
    p.add_argument(
        "--shard",
        metavar="I/N",
        help="run only shard I (from 0) of N: a block of every profile's repetitions; "
        "lab merge joins the shards (docs/scale.md)",
    )
    p.add_argument(
        "--jobs",
        metavar="N|auto",
        help="run N labs of the plan at once on this machine (auto: as many as its CPU holds "
        "without changing a probe case's results); docs/scale.md 'Parallel labs'",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="with --jobs N: run N labs even when they exceed the CPU budget or the probe",
    )
    _add_vm_boards(
        p,
        "run the whole plan in a throwaway full-kernel VM (same as -o vm=true)",
        "run every case on real boards over SSH (boards.toml or an Ansible inventory)",
    )

    bsub = _actions(sub, "boards", help="real boards over SSH: an emulated board farm for tests")
    q = bsub.add_parser(
        "emulate",
        help="build an emulated board farm for a topology (real sshd per board) and write its "
        "inventory; --down removes it",
    )
    _add_topology(q, nargs="?", help="topology file whose hosts become boards")
    q.add_argument("--out", metavar="INVENTORY", help="where to write the farm's boards.toml")
    q.add_argument(
        "--sudo",
        metavar="BOARD[,BOARD]",
        help="these boards log in as a user that is not root and get root with sudo",
    )
    q.add_argument("--down", action="store_true", help="remove the farm (--id, or the only one)")
    q.add_argument("--id", dest="lab_id", help="farm id")
    q.add_argument("--json", action="store_true", help="print the farm's record as JSON")
    q = bsub.add_parser(
        "check",
        help="what each board is and whether the lab and the profiles can run on it "
        "(exit 3 when a board is unreachable or has no root)",
    )
    _add_inventory(q, "profiles to check (default: all)")
    q.add_argument("--json", action="store_true", help="print each board's findings as JSON")
    q = bsub.add_parser(
        "prepare",
        help="install the Debian packages the lab and the profiles need on each board "
        "(lists them and asks; --yes for scripts)",
    )
    _add_inventory(q, "profiles to prepare for (default: all)")
    q.add_argument("--yes", action="store_true", help="install without asking")
    q.add_argument("--dry-run", action="store_true", help="list only, install nothing")
    q.add_argument("--json", action="store_true", help="print the packages per board as JSON")

    p = sub.add_parser(
        "merge",
        help="the run directories of lab run --shard I/N -> one run directory and its report "
        "(same plan and code, every case once; docs/scale.md)",
    )
    p.add_argument("shards", nargs="+", metavar="SHARD_DIR", help="a shard's run directory")
    p.add_argument("--out", required=True, metavar="RUN_DIR", help="run directory to create")

    p = sub.add_parser("report", help="regenerate a run's tables, plots and report")
    p.add_argument("run_dir", help="a run directory (lab run, lab merge or lab import)")

    p = sub.add_parser("compare", help="two runs side by side per case, with ratios and plots")
    p.add_argument("run_a", help="run directory A, the reference (ratios are B/A)")
    p.add_argument("run_b", help="run directory B, put next to A")
    p.add_argument("--out", help="output directory (default RUN_B/compare-<A>)")

    p = sub.add_parser(
        "import",
        help="published or hand-collected figures (CSV, docs/results.md 'Fidelity') -> a run "
        "directory that lab compare and lab report read",
    )
    p.add_argument("table", help="CSV: profile,condition,test,metric,value,n,sd,source[,label]")
    p.add_argument("--out", required=True, metavar="RUN_DIR", help="run directory to create")

    p = sub.add_parser(
        "check",
        help="run a plan (or judge --run RUN_DIR) against its [[expect]] tables and a baseline "
        "run; exit 0 all hold, 1 one fails, 2 bad input (docs/ci.md)",
    )
    p.add_argument("plan", nargs="?", help="plan file or name in plans/ (optional with --run)")
    p.add_argument("--run", metavar="RUN_DIR", help="judge this finished run instead of running")
    p.add_argument(
        "--baseline",
        action="append",
        metavar="RUN_DIR",
        help="run the regressions are judged against; repeat it to judge at the run level",
    )
    p.add_argument(
        "--allow-missing-baseline",
        action="store_true",
        help="skip (instead of fail) a regression whose case the baseline did not measure (a "
        "profile or test it did not run, or whose repetitions all failed there)",
    )
    p.add_argument("--junit", metavar="FILE", help="write the verdicts as JUnit XML")
    _add_plan_out(p, "override a plan value, as lab run -o")
    _add_vm_boards(
        p,
        "run the plan in the full-kernel VM",
        "run the plan on real boards over SSH, as lab run --boards (boards.toml or an Ansible "
        "inventory; docs/boards.md)",
    )

    asub = _actions(sub, "arch", help="another architecture's binaries (a board's own) in nodes")
    q = asub.add_parser(
        "fetch",
        help="download that architecture's Debian 12 packages of the lab's tools into "
        "/var/cache/lab/arch/ARCH (nothing installed, host package config untouched)",
    )
    q.add_argument("arch", metavar="ARCH", help="arm64 or armhf")
    q.add_argument("--force", action="store_true", help="fetch again even if present")

    csub = _actions(sub, "ci", help="continuous integration: lab ci init writes a workflow")
    q = csub.add_parser(
        "init",
        help="write .github/workflows/lab-check.yml and lab-check.toml (lab check on every "
        "change) into a repository",
    )
    q.add_argument("dir", nargs="?", default=".", help="the repository (default: here)")
    q.add_argument("--force", action="store_true", help="overwrite files already there")
    add_examples(ap)
    return ap
