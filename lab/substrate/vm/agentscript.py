"""The lab agent as it ships: one standard-library-only script, assembled from its two files.

lab.substrate.vm.agent (transport and dispatch) imports lab.substrate.vm.agentcommands (running
commands); both import only the standard library. Where the agent runs (the VM's initramfs, a
board's ssh session, the system python3 with -I -S) there is no lab package, so the script that
ships is agent.py with that one import replaced by agentcommands.py's text (without its docstring
and `from __future__` line, which agent.py's already has). The result is checked: it compiles, and
imports nothing of lab.
"""

from __future__ import annotations

import ast
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: the file that runs (its __main__) and the one its import names
AGENT, COMMANDS = HERE / "agent.py", HERE / "agentcommands.py"
COMMANDS_MODULE = "lab.substrate.vm.agentcommands"


def _lines_of(nodes) -> set[int]:
    return {i for n in nodes for i in range(n.lineno, n.end_lineno + 1)}


def _without(text: str, drop: set[int]) -> str:
    return "".join(x for i, x in enumerate(text.splitlines(keepends=True), 1) if i not in drop)


def _lab_imports(tree: ast.Module) -> list[ast.stmt]:
    out = []
    for n in ast.walk(tree):
        names = [a.name for a in n.names] if isinstance(n, ast.Import) else []
        if isinstance(n, ast.ImportFrom):
            names = [n.module or ""]
        if any(x == "lab" or x.startswith("lab.") for x in names):
            out.append(n)
    return out


#: one assembly at a time, kept: CPython 3.11 before 3.11.8 keeps ast's recursion depth in
#: state that threads share, and ast.parse in two threads at once can fail with "AST
#: constructor recursion depth mismatch" (python/cpython#106905; seen here connecting to an
#: emulated farm's boards in parallel)
_LOCK = threading.Lock()
_BUILT: dict[tuple[str, str], bytes] = {}


def agent_source() -> bytes:
    """The agent script that runs in the VM and on boards (python3 -I -S SCRIPT, or its text
    exec'd as __main__)."""
    with _LOCK:
        key = (COMMANDS.read_text(), AGENT.read_text())
        if key not in _BUILT:
            _BUILT.clear()
            _BUILT[key] = _assemble(*key)
        return _BUILT[key]


def _assemble(commands: str, agent: str) -> bytes:
    ctree = ast.parse(commands, str(COMMANDS))
    head = [n for n in ctree.body[:1] if isinstance(n, ast.Expr)]  # the docstring
    future = [n for n in ctree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    if _lab_imports(ctree):
        raise RuntimeError(f"{COMMANDS} imports lab; it ships without the lab package")
    body = _without(commands, _lines_of(head + future)).strip("\n") + "\n"

    imports = _lab_imports(ast.parse(agent, str(AGENT)))
    if len(imports) != 1 or getattr(imports[0], "module", None) != COMMANDS_MODULE:
        raise RuntimeError(f"{AGENT} must import lab only once, from {COMMANDS_MODULE}")
    (imp,) = imports
    lines = agent.splitlines(keepends=True)
    script = "".join(lines[: imp.lineno - 1]) + body + "".join(lines[imp.end_lineno :])
    compile(script, "lab-agent", "exec")
    return script.encode()
