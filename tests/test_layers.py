"""The module structure of lab/: no import cycle, and no module imports a layer above its own.

The import graph is read from the source with ast: every `import` / `from ... import` anywhere in
a module (function-level imports too), plus the imports a package makes by discovery
(lab.vpn imports its driver modules, lab.measure all of its modules). LAYERS is the chart of
docs/design.md ("Layers"), top first; a module may import its own layer or any layer below.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path

from lab.cli.main import COMMANDS
from lab.substrate.registry import SUBSTRATES

LAB = Path(__file__).resolve().parent.parent / "lab"

#: docs/design.md "Layers", top first: (layer, module names). One folder of lab/ is one layer
#: (the plug-ins vpn/, impair/ and measure/ share one and never import each other). A name ending
#: in ".*" covers a package and everything in it; the most specific entry wins.
LAYERS: list[tuple[str, list[str]]] = [
    ("cli", ["lab.cli.*"]),
    ("campaign", ["lab.campaign.*"]),
    ("results", ["lab.results.*"]),
    ("substrate", ["lab.substrate.*"]),
    ("vpn", ["lab.vpn.*"]),
    ("impair", ["lab.impair.*"]),
    ("measure", ["lab.measure.*"]),
    ("model", ["lab.model.*"]),
    ("core", ["lab.core.*", "lab"]),
]
#: layers of the same height: an import between them counts as running back up
SAME_FLOOR = {"vpn", "impair", "measure"}


def _submodules(package: str, root: Path = LAB) -> list[str]:
    d = root.parent.joinpath(*package.split("."))
    return [f"{package}.{p.stem}" for p in sorted(d.glob("*.py")) if not p.stem.startswith("_")]


#: package -> the modules it imports by discovery (importlib.import_module over its files)
DISCOVERS: dict[str, Callable[[], list[str]]] = {
    "lab.vpn": lambda: _submodules("lab.vpn.drivers"),
    "lab.measure": lambda: _submodules("lab.measure"),
    # the registry imports a substrate's module when a lab of it is asked for
    "lab.substrate.registry": lambda: sorted(
        {e.path.partition(":")[0] for e in SUBSTRATES.values()}
    ),
    # the CLI imports a command's module when that command runs (lab.cli.main.COMMANDS)
    "lab.cli.main": lambda: sorted({v.partition(":")[0] for v in COMMANDS.values()}),
}


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """{module: modules of `root` it imports}, every import statement anywhere in the file."""
    files = {module_name(root, p): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = pkg.split(".")
                    parts = parts[: len(parts) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    targets.append(sub if sub in files else base)
            for t in targets:
                while t and t not in files:  # `import lab.x.y` names lab.x.y; stdlib: dropped
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    graph[mod].add(t)
    return graph


def find_cycles(graph: dict[str, Iterable[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def layer_of(module: str, layers: list[tuple[str, list[str]]] = LAYERS) -> int | None:
    """Index into `layers` (0 = top) of the most specific entry naming `module`."""
    best: tuple[int, int] | None = None  # (specificity, layer)
    for i, (_name, mods) in enumerate(layers):
        for m in mods:
            if m == module:
                spec = 10_000
            elif m.endswith(".*") and (module == m[:-2] or module.startswith(m[:-1])):
                spec = len(m)
            else:
                continue
            if best is None or spec > best[0]:
                best = (spec, i)
    return None if best is None else best[1]


def upward_imports(graph: dict[str, set[str]], layers=LAYERS) -> list[str]:
    out = []
    for mod in sorted(graph):
        for dep in sorted(graph[mod]):
            a, b = layer_of(mod, layers), layer_of(dep, layers)
            same_floor = a != b and {layers[a][0], layers[b][0]} <= SAME_FLOOR
            if a is not None and b is not None and (b < a or same_floor):
                out.append(f"{mod} ({layers[a][0]}) imports {dep} ({layers[b][0]})")
    return out


def lab_graph() -> dict[str, set[str]]:
    graph = import_graph(LAB)
    for pkg, found in DISCOVERS.items():
        graph[pkg] |= set(found())
    return graph


# ------------------------------------------------------------------------------------- lab/


def test_no_import_cycle_in_lab():
    assert find_cycles(lab_graph()) == []


def test_every_lab_module_has_a_layer():
    missing = [m for m in sorted(import_graph(LAB)) if layer_of(m) is None]
    assert not missing, f"add these to LAYERS here and to docs/design.md's chart: {missing}"


def test_no_module_imports_a_layer_above_it():
    assert upward_imports(lab_graph()) == []


def test_discovering_packages_are_declared():
    """Every package that imports its modules by discovery is in DISCOVERS (else the graph
    would miss those edges)."""
    discovering = {
        module_name(LAB, p)
        for p in LAB.rglob("*.py")
        if "importlib.import_module(" in p.read_text()
    }
    assert discovering == set(DISCOVERS)


def test_design_doc_chart_names_every_layer():
    chart = (LAB.parent / "docs" / "design.md").read_text().split("## Layers", 1)[1]
    chart = chart.split("```")[1]
    for name, _mods in LAYERS:
        assert f"lab/{name}/" in chart, name


def test_the_top_of_lab_is_its_folders():
    """lab/ holds its layers' folders and the package face, at most 12 entries."""
    entries = sorted(p.name for p in LAB.iterdir() if p.name != "__pycache__")
    assert len(entries) <= 12, entries
    assert [e for e in entries if e.endswith(".py")] == ["__init__.py"]
    assert {name for name, _ in LAYERS} <= set(entries)


def test_no_re_export_shims():
    """A module imports a name to use it: no `noqa: F401` re-exports outside package faces."""
    shims = [
        f"{p.relative_to(LAB)}:{i}"
        for p in sorted(LAB.rglob("*.py"))
        if p.name != "__init__.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "noqa: F401" in line
    ]
    assert shims == []


# ------------------------------------------------------------------------- the checker itself


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text))
    return root


def test_checker_finds_a_cycle_through_a_function_level_import(tmp_path):
    root = _package(
        tmp_path,
        {
            "a.py": "from .b import f\n",
            "b.py": "def f():\n    from . import a\n    return a\n",
            "c.py": "import pkg.a\nimport os\n",
        },
    )
    graph = import_graph(root)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.a"}
    assert graph["pkg.c"] == {"pkg.a"}
    assert find_cycles(graph) == [["pkg.a", "pkg.b"]]
    assert find_cycles({"x": {"y"}, "y": {"z"}, "z": set()}) == []


def test_checker_finds_an_upward_import(tmp_path):
    root = _package(tmp_path, {"top.py": "", "low.py": "from . import top\n"})
    layers = [("top", ["pkg.top"]), ("low", ["pkg.low", "pkg"])]
    assert upward_imports(import_graph(root), layers) == ["pkg.low (low) imports pkg.top (top)"]
    # the most specific entry wins; the impairment language sits below its runtime
    assert layer_of("lab.model.impairment.spec") > layer_of("lab.impair.runtime")
    assert layer_of("lab.impair.runtime") > layer_of("lab.substrate.local.lab")
    layers2 = [("a", ["pkg.*"]), ("b", ["pkg.low"])]
    assert layer_of("pkg.low", layers2) == 1 and layer_of("pkg.top", layers2) == 0


def test_no_module_over_500_lines():
    big = {
        str(p.relative_to(LAB)): n
        for p in LAB.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 500
    }
    assert big == {}


def _function_level_imports(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every import inside a function of `path`."""
    text = path.read_text()
    lines = text.splitlines()
    found = []
    for fn in ast.walk(ast.parse(text)):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    found.append((node.lineno, lines[node.lineno - 1]))
    return sorted(set(found))


def test_function_level_imports_are_few_and_say_why():
    """An import inside a function is the exception (a heavy library paid only by its users, a
    back end chosen before pyplot loads): at most 40 in lab/, each with its reason on its line
    or the comment line above it."""
    found = {}
    for p in sorted(LAB.rglob("*.py")):
        lines = p.read_text().splitlines()
        for lineno, line in _function_level_imports(p):
            above = lines[lineno - 2].strip() if lineno >= 2 else ""
            found[f"{p.relative_to(LAB)}:{lineno}"] = "#" in line or above.startswith("#")
    assert len(found) <= 40, sorted(found)
    assert [k for k, has_reason in found.items() if not has_reason] == []


def test_no_module_imports_another_modules_private_names():
    offenders = []
    for p in sorted(LAB.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lab"):
                offenders += [
                    f"{p.relative_to(LAB)}:{node.lineno} {a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    assert offenders == []


def test_the_structure_checks_can_fail(tmp_path):
    root = _package(
        tmp_path,
        {
            "a.py": "def f():\n    import os\n    from .b import _private\n    return os\n",
            "b.py": "_private = 1\n",
        },
    )
    assert [n for n, _ in _function_level_imports(root / "a.py")] == [2, 3]
