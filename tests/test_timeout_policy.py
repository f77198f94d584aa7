"""One timeout policy: a test's pytest-timeout (its own `@pytest.mark.timeout(N)`, else its
module's `pytestmark`, else pyproject's `timeout`) is above every inner budget it gives what it
runs: a constant `timeout=` argument or a `deadline = time.monotonic() + N`. Otherwise
pytest-timeout kills the test before its own budget can say what hung. Budgets in a fixture or
helper count against the module's timeout (the tests using them may have larger marks, never
smaller). Read with ast from the source, so a new test cannot regress."""

from __future__ import annotations

import ast
import tomllib
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


def default_timeout() -> float:
    conf = tomllib.loads((REPO / "pyproject.toml").read_text())
    return float(conf["tool"]["pytest"]["ini_options"]["timeout"])


def _timeout_mark(node: ast.expr) -> float | None:
    """N of a `pytest.mark.timeout(N)` expression (or of one in a list), else None."""
    for n in ast.walk(node):
        if (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr == "timeout"
            and isinstance(n.func.value, ast.Attribute)
            and n.func.value.attr == "mark"
        ):
            args = [*n.args, *(k.value for k in n.keywords if k.arg == "timeout")]
            if args and isinstance(args[0], ast.Constant):
                return float(args[0].value)
    return None


def _number(node: ast.expr) -> float | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return None if isinstance(node.value, bool) else float(node.value)
    return None


def _budgets(fn: ast.AST) -> list[tuple[int, float]]:
    """(line, seconds) of every constant inner budget inside `fn`."""
    out = []
    for n in ast.walk(fn):
        if isinstance(n, ast.Call):
            for k in n.keywords:
                if k.arg == "timeout" and (v := _number(k.value)) is not None:
                    out.append((n.lineno, v))
        # deadline = time.monotonic() + N
        if (
            isinstance(n, ast.BinOp)
            and isinstance(n.op, ast.Add)
            and isinstance(n.left, ast.Call)
            and isinstance(n.left.func, ast.Attribute)
            and n.left.func.attr in ("monotonic", "time")
            and (v := _number(n.right)) is not None
        ):
            out.append((n.lineno, v))
    return out


@dataclass
class Breach:
    where: str
    budget: float
    limit: float

    def __str__(self) -> str:
        return f"{self.where}: inner budget {self.budget:g} s, pytest timeout {self.limit:g} s"


def breaches(path: Path, default: float, root: Path = REPO) -> list[Breach]:
    tree = ast.parse(path.read_text(), str(path))
    module = default
    for st in tree.body:
        if isinstance(st, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in st.targets
        ):
            module = _timeout_mark(st.value) or module
    out = []
    for st in tree.body:
        if not isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        limit = module
        if st.name.startswith("test_"):
            for d in st.decorator_list:
                limit = _timeout_mark(d) or limit
        for line, budget in _budgets(st):
            if budget >= limit:
                out.append(Breach(f"{path.relative_to(root)}:{line} ({st.name})", budget, limit))
    return out


def test_no_inner_budget_reaches_its_tests_pytest_timeout():
    default = default_timeout()
    found = [str(b) for p in sorted(TESTS.glob("test_*.py")) for b in breaches(p, default)]
    found += [str(b) for b in breaches(TESTS / "conftest.py", default)]
    assert not found, "raise the test's @pytest.mark.timeout above its budget:\n" + "\n".join(found)


def test_the_scan_sees_marks_and_budgets(tmp_path):
    """The checker itself: a budget at or above the limit is caught, under a mark it is not."""
    src = tmp_path / "test_x.py"
    src.write_text(
        "import pytest, time\n"
        "pytestmark = [pytest.mark.root, pytest.mark.timeout(500)]\n"
        "def helper():\n    run(timeout=600)\n"
        "def test_a():\n    run(x, timeout=400)\n    deadline = time.monotonic() + 499\n"
        "@pytest.mark.timeout(1000)\ndef test_b():\n    run(timeout=900)\n"
        "def test_c():\n    deadline = time.monotonic() + 500\n    run(timeout=False)\n"
    )
    got = {(b.where.split("(")[1].rstrip(")"), b.budget, b.limit) for b in breaches_at(src)}
    assert got == {("helper", 600, 500), ("test_c", 500, 500)}
    src.write_text("def test_d():\n    run(timeout=300)\n")
    assert [b.budget for b in breaches_at(src)] == [300]  # the pyproject default, 300 s
    assert default_timeout() == 300


def breaches_at(path: Path) -> list[Breach]:
    return breaches(path, default_timeout(), root=path.parent)
