"""Import a Mininet-style topology file and build the Topo it names.

The file is user data run as Python: everything it raises, or a sys.exit() in it, becomes a
ConfigError naming the file (and the line of the file the error came through). While its Topo
builds, a node added twice or a link to an undefined node is refused (Mininet would silently keep
the last definition or create the node).
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import traceback
from pathlib import Path
from typing import Any

from mininet.topo import Topo

from lab.core.errors import ConfigError


def build_topo(path: str | Path, topo: str | None, params: dict[str, Any]) -> tuple[Any, str]:
    """(the built Topo object, its name in the file's `topos` dict)."""
    path = Path(path)
    src = str(path)
    if path.is_dir():
        raise ConfigError("is a directory, not a topology file (a .py file)", source=src)
    if not path.is_file():
        raise ConfigError("topology file not found", source=src)
    module = _import_file(path)
    topos = getattr(module, "topos", None)
    if not isinstance(topos, dict) or not topos:
        raise ConfigError(
            "defines no `topos = {'name': TopoClass}` dict (Mininet convention)", source=src
        )
    if topo is None:
        if len(topos) != 1:
            raise ConfigError(
                f"defines several topologies; choose one with --topo: {', '.join(sorted(topos))}",
                source=src,
            )
        topo = next(iter(topos))
    if topo not in topos:
        raise ConfigError(
            f"unknown topology {topo!r}; valid: {', '.join(sorted(topos))}",
            source=src,
            field="--topo",
        )
    if not callable(topos[topo]):
        raise ConfigError(
            f"topos[{topo!r}] is {topos[topo]!r}, not a Topo class", source=src, field="topos"
        )
    try:
        with _refuse_duplicate_nodes(src):
            obj = topos[topo](**params)
    except ConfigError:
        raise
    except SystemExit as e:  # sys.exit() in build(): not a topology, and not a success
        raise ConfigError(
            f"building topology {topo!r} called sys.exit({e.code!r}); a topology file "
            "describes nodes and links and must not exit",
            source=src,
        )
    except TypeError as e:
        raise ConfigError(
            f"cannot build topology {topo!r} with parameters {params}: {e}", source=src
        )
    except Exception as e:  # the user's build() raised: report it as bad input
        raise ConfigError(f"building topology {topo!r} raised {_short_exc(e, src)}", source=src)
    return obj, topo


@contextlib.contextmanager
def _refuse_duplicate_nodes(source: str):
    """While a Topo builds: a node name added twice is an error (Mininet's Topo silently keeps
    the last definition)."""
    original, original_link = Topo.addNode, Topo.addLink

    def add_link(self, node1, node2, *args, **opts):
        for end in (node1, node2):
            if end not in getattr(self.g, "node", {}):
                raise ConfigError(
                    f"link to undefined node {end!r}; add it first (addHost/addSwitch); nodes: "
                    + (", ".join(map(str, self.g.node)) or "none"),
                    source=source,
                    field=f"link {node1}-{node2}",
                )
        return original_link(self, node1, node2, *args, **opts)

    def add_node(self, name, **opts):
        if name in getattr(self.g, "node", {}):
            kind = "switch" if opts.get("isSwitch") else "host"
            raise ConfigError(
                f"node {name!r} is defined twice; every node needs its own name",
                source=source,
                field=f"{kind} {name!r}",
            )
        return original(self, name, **opts)

    Topo.addNode, Topo.addLink = add_node, add_link
    try:
        yield
    finally:
        Topo.addNode, Topo.addLink = original, original_link


def _short_exc(e: BaseException, path: str | None = None) -> str:
    """`KeyError: 'x' at line 12`: the line of the user's file (`path`) the error came
    through, not a line of the lab's or Mininet's code."""
    tb = traceback.extract_tb(e.__traceback__)
    if path is not None:
        mine = [f for f in tb if Path(f.filename).resolve() == Path(path).resolve()]
        tb = mine or []
    where = f" at line {tb[-1].lineno}" if tb else ""
    return f"{type(e).__name__}: {e}{where}"


def _import_file(path: Path):
    name = f"lab_topology_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError("not a Python file", source=str(path))
    module = importlib.util.module_from_spec(spec)
    try:
        sys.modules[name] = module
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise ConfigError(f"syntax error at line {e.lineno}: {e.msg}", source=str(path))
    except SystemExit as e:  # a data file that exits is not a success (issue 22)
        raise ConfigError(
            f"called sys.exit({e.code!r}) while loading; a topology file describes nodes and "
            "links and must not exit",
            source=str(path),
        )
    except Exception as e:
        raise ConfigError(f"importing raised {_short_exc(e, str(path))}", source=str(path))
    finally:
        sys.modules.pop(name, None)
    return module
