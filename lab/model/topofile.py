"""Import a Mininet-style topology file and build the Topo it names.

The file is user data run as Python, and it runs in a child process (a fork of this one): what
comes back is the built graph, as data, so nothing the file does ends or replaces the lab's own
process. Everything it raises, or a sys.exit() in it, becomes a ConfigError naming the file (and
the line of the file the error came through); an os._exit(), an exec or a signal that ends the
child before its graph is back does too, rather than passing for success (issue 32 item 17).
While its Topo builds, a node added twice or a link to an undefined node is refused (Mininet would
silently keep the last definition or create the node).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pickle
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mininet.topo import Topo

from lab.core.errors import ConfigError


def build_topo(path: str | Path, topo: str | None, params: dict[str, Any]) -> tuple[Topo, str]:
    """(the built Topo, its name in the file's `topos` dict). The Topo is a plain mininet Topo
    holding the graph the file's class built (its nodes, links, options and ports): the class
    itself ran in a child process (module doc)."""
    path = Path(path)
    src = str(path)
    if path.is_dir():
        raise ConfigError("is a directory, not a topology file (a .py file)", source=src)
    if not path.is_file():
        raise ConfigError("topology file not found", source=src)
    kind, value = _in_child(lambda: _build_graph(path, topo, params), src)
    if kind == "config":
        message, source, field = value
        raise ConfigError(message, source=source, field=field)
    if kind == "bug":  # the lab's own code failed in the child: not the user's input
        raise RuntimeError(f"loading {src}: {value}")
    graph, ports, name = value
    built = Topo()
    built.g, built.ports = graph, ports
    return built, name


def _build_graph(path: Path, topo: str | None, params: dict[str, Any]) -> tuple[str, Any]:
    """In the child: ("ok", (graph, ports, name)), ("config", (message, source, field)) or
    ("bug", text); the graph is pickled on its way back, so an option that is no plain data
    (an object of a class the file defines) is refused here."""
    try:
        obj, name = _build(path, topo, params)
    except ConfigError as e:
        return "config", (e.message, e.source, e.field)
    except Exception as e:
        return "bug", f"{type(e).__name__}: {e}"
    result = ("ok", (obj.g, obj.ports, name))
    try:
        pickle.dumps(result)
    except Exception as e:  # e.g. an instance of a class defined in the file
        message = f"a node or link option is not plain data (text, numbers): {e}"
        return "config", (message, str(path), None)
    return result


def _in_child(work: Callable[[], tuple[str, Any]], src: str) -> tuple[str, Any]:
    """Run `work` in a forked child and return what it returned (pickled through a pipe). A
    child that ends before it has sent an answer (os._exit, exec, a signal) is a ConfigError
    naming `src`, whatever its exit status."""
    sys.stdout.flush()  # what this process has buffered is printed once, by it
    sys.stderr.flush()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer, then end without running this process's exit handlers
        try:
            os.close(r)
            data = pickle.dumps(work())
            with os.fdopen(w, "wb") as f:
                f.write(data)
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(0)
    os.close(w)
    reaped = False
    try:
        with os.fdopen(r, "rb") as f:
            data = f.read()
        _, status = os.waitpid(pid, 0)
        reaped = True
    finally:
        if not reaped:  # interrupted while the file loads: end our child, by its PID
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    try:
        answer = pickle.loads(data) if data else None
    except Exception:  # cut short: the child ended while writing
        answer = None
    if answer is None or code != 0:
        how = (
            f"exit status {code}" if code >= 0 else f"killed by signal {signal.Signals(-code).name}"
        )
        raise ConfigError(
            f"the process loading it ended ({how}) before the topology was built: an "
            "os._exit(), exec or kill in the file? A topology file describes nodes and links "
            "and must not exit",
            source=src,
        )
    return answer


def _build(path: Path, topo: str | None, params: dict[str, Any]) -> tuple[Any, str]:
    """Import the file and build its Topo, in this process (the child of build_topo)."""
    src = str(path)
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
