"""Around a run: the run directory, the plan a resumed run continues, and the host facts every
manifest records (tool versions, git revision, kernel). Whether a plan can run where its labs
are built is the substrate's question (Substrate.preflight)."""

from __future__ import annotations

import itertools
import os
import platform
import shlex
import socket
import time
from pathlib import Path

from lab.core.paths import results_root
from lab.core import proc
from lab.core.errors import ConfigError, LabError
from lab import REPO
from lab.campaign.load import plan_file
from lab.campaign.plan import Plan
from lab.results.rundir import RunDir
from lab.core.state import write_json_atomic
from lab.substrate.tools import board_tools, version_commands
from lab.campaign.load import load_plan

#: tools whose version every manifest records: name -> argv
TOOL_VERSIONS: dict[str, list[str]] = version_commands()


# ---------------------------------------------------------------------- run directory


def check_run_dir(path: Path, *, resumable: bool = True) -> None:
    """`--out RUN_DIR`: a directory that does not exist yet or is empty, else a ConfigError.
    `resumable`: the command can continue a directory with --resume (lab run), so say so."""
    if path.exists() and not path.is_dir():
        raise ConfigError(
            "exists and is not a directory; choose a new directory", source=str(path), field="--out"
        )
    if path.is_dir() and any(path.iterdir()):
        raise ConfigError(
            "exists and is not empty; choose a new directory"
            + (" or resume it with --resume" if resumable else ""),
            source=str(path),
            field="--out",
        )


def create_run_dir(plan: Plan, path: Path | None = None, *, root: Path | None = None) -> RunDir:
    """A new run directory: `path` (must not exist or be empty) or root/<UTC time>_<plan>."""
    if path is not None:
        path = Path(path)
        check_run_dir(path)
        path.mkdir(parents=True, exist_ok=True)
    else:
        root = root if root is not None else results_root()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        for i in itertools.count():
            path = root / (f"{stamp}_{plan.name}" + (f"-{i}" if i else ""))
            try:
                path.mkdir(parents=True)
                break
            except FileExistsError:
                continue
    for sub in ("raw", "monitor"):
        (path / sub).mkdir()
    # "file": the plan file wherever `lab run --resume` is typed (the source is as typed)
    extra = {"file": plan.file} if plan.file else {}
    write_json_atomic(path / "plan.json", {**plan.to_json(), **extra, "digest": plan.digest()})
    return RunDir(path)


def resume_plan(run: RunDir, plan_path: str | None, overrides: list[str]) -> Plan:
    """The plan a resumed run continues: the one it stored (PLAN, if given, must match it)."""

    stored = run.check().plan_json()
    base = plan_path or stored.get("file") or plan_file(stored.get("source", ""))
    plan = load_plan(base, list(stored.get("overrides") or []) + list(overrides))
    if plan.digest() != stored.get("digest"):
        raise ConfigError(
            "the plan differs from the one this run was started with (cases, parameters or "
            "profiles changed); resume with the same plan and -o options, or start a new run",
            source=str(run.path),
            field="plan",
        )
    return plan


# ---------------------------------------------------------------------- host facts


def tool_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name, argv in TOOL_VERSIONS.items():
        if not proc.which(argv[0]):
            out[name] = None
            continue
        try:
            cp = proc.run(argv, check=False, timeout=5)
        except LabError:
            out[name] = None
            continue
        out[name] = _first_line(cp)
    return out


def node_tool_versions(node) -> dict[str, str | None]:
    """tool_versions() asked on `node` (lab.core.node.Node) rather than this machine: what a board
    over SSH or a node of another architecture (its own binaries under qemu-user) runs. One
    shell round trip per node; a tool the node lacks, or whose version command prints nothing,
    is None."""
    names = list(TOOL_VERSIONS)
    lines = []
    for i, name in enumerate(names):
        argv = TOOL_VERSIONS[name]
        cmd = " ".join(shlex.quote(a) for a in argv)
        # each tool's first output line behind a marker; nothing when the tool is not on PATH
        lines.append(
            f"command -v {shlex.quote(argv[0])} >/dev/null 2>&1 && "
            f"v=$( ({cmd}) 2>/dev/null </dev/null | grep -m 1 . || ({cmd}) 2>&1 </dev/null | "
            f"grep -m 1 .) && printf '@@%d %s\\n' {i} \"$v\""
        )
    out: dict[str, str | None] = dict.fromkeys(names)
    try:
        cp = node.run(["sh", "-c", "; ".join(lines) + "; true"], check=False, timeout=60)
    except LabError:
        return out
    for line in (cp.stdout or "").splitlines():
        if line.startswith("@@"):
            idx, _, text = line[2:].partition(" ")
            if idx.isdigit() and int(idx) < len(names) and text.strip():
                out[names[int(idx)]] = text.strip()
    return out


def _first_line(cp) -> str | None:
    for text in (cp.stdout or "", cp.stderr or ""):
        for line in text.splitlines():
            if line.strip():
                return line.strip()
    return None


def arch_tool_versions(node) -> dict[str, str | None]:
    """The versions of the board tools (lab.substrate.tools.board_tools()) that a node of
    another architecture runs from its root under qemu-user, each asked through the node's own
    wrapper; the rest run this machine's binaries, whose versions are in tool_versions()."""
    board = board_tools()
    out: dict[str, str | None] = {}
    for name, argv in TOOL_VERSIONS.items():
        if os.path.basename(argv[0]) not in board:
            continue
        try:
            out[name] = _first_line(node.run(argv, check=False, timeout=60))
        except LabError:
            out[name] = None
    return out


def git_revision() -> str | None:
    try:
        cp = proc.run(
            ["git", "-C", str(REPO), "describe", "--always", "--dirty"], check=False, timeout=10
        )
    except LabError:
        return None
    return cp.stdout.strip() or None


def kernel_info() -> dict:
    u = platform.uname()
    return {
        "system": u.system,
        "release": u.release,
        "version": u.version,
        "machine": u.machine,
        "hostname": socket.gethostname(),
        "cpus": os.cpu_count(),
    }
