"""Is a kernel feature there? Read-only probes shared by the drivers, run ON the node they are about.

Every probe is a command the node runs (Node.run); nothing here reads a file of the machine the
controller runs on, so one code path answers for this machine (lab.substrate.local.node.this_machine(),
before any lab exists), a lab node, a VM guest or a board over SSH. What a node prints is parsed
by pure functions (parse_*), tested without any node.

A feature is (label, CONFIG_* symbols, module names): present when any symbol is =y/=m in the
node's kernel config (`gzip -dc /proc/config.gz`), or, on kernels that do not expose their config
(Debian's, the lab VM's), when any of the modules is loaded (`ls /sys/module`) or listed in
modules.dep/modules.builtin (`uname -r`, `cat /lib/modules/<release>/modules.dep`). Link types
are probed by creating them in a throwaway network namespace on the node (`unshare --net ...`),
which dies with everything in it. Nothing is loaded or changed.

Answers are cached per node object for the life of the process (a kernel's config does not
change under it; `lab profiles` asks the same node about many profiles).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from lab.core.errors import LabError
from lab.core.node import Node

#: (label, CONFIG_* symbols -- any will do, module names -- any will do)
Feature = tuple[str, tuple[str, ...], tuple[str, ...]]

_caches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _cache(node: Node) -> dict:
    try:
        return _caches.setdefault(node, {})
    except TypeError:  # a node that cannot be weakly referenced or hashed: no cache
        return {}


def _run(node: Node, argv: list[str], *, input: str | None = None, timeout: float = 15):
    """(exit code, stdout, stderr) of argv on the node; a command the node lacks is exit 127."""
    try:
        cp = node.run(argv, check=False, timeout=timeout, input=input)
    except LabError as e:  # e.g. the tool is missing on this machine (PreconditionError)
        return 127, "", str(e)
    return cp.returncode, cp.stdout or "", cp.stderr or ""


# ------------------------------------------------------------------------ pure parsing


def parse_kernel_config(text: str) -> dict[str, str]:
    """CONFIG_* symbols of a kernel config text (as /proc/config.gz holds it)."""
    out = {}
    for line in text.splitlines():
        if line.startswith("CONFIG_") and "=" in line:
            k, _, v = line.partition("=")
            out[k] = v
    return out


def parse_module_list(text: str) -> set[str]:
    """Module names of a modules.dep or modules.builtin text ("kernel/net/x/ip_gre.ko: ...")."""
    names = set()
    for line in text.splitlines():
        path = line.split(":", 1)[0].strip()
        if path:
            names.add(PurePosixPath(path).name.split(".ko")[0].replace("-", "_"))
    return names


@dataclass
class KernelFacts:
    """What a node's kernel has: its config, or (when not exposed) its module names."""

    config: dict[str, str] | None  # None: /proc/config.gz not readable there
    loaded: frozenset[str] = frozenset()  # /sys/module (only read when config is None)
    available: frozenset[str] | None = None  # modules.dep + modules.builtin; None: neither

    def has_module(self, module: str) -> bool:
        return module in self.loaded or (self.available is not None and module in self.available)

    def has(self, symbols: Sequence[str], modules: Sequence[str]) -> bool:
        if self.config is not None:
            return any(self.config.get(s) in ("y", "m") for s in symbols)
        return any(self.has_module(m) for m in modules)


def missing_in(facts: KernelFacts, features: list[Feature]) -> list[Feature]:
    """The features of `features` a kernel with `facts` lacks (in their order). Pure."""
    return [f for f in features if not facts.has(f[1], f[2])]


# ------------------------------------------------------------------------ probes on a node


def kernel_facts(node: Node) -> KernelFacts:
    """Ask the node about its kernel (read-only; cached per node)."""
    cache = _cache(node)
    if "facts" in cache:
        return cache["facts"]
    rc, out, _ = _run(node, ["gzip", "-dc", "/proc/config.gz"])
    if rc == 0 and out:
        facts = KernelFacts(parse_kernel_config(out))
    else:
        rc, out, _ = _run(node, ["ls", "-1", "/sys/module"])
        loaded = frozenset(out.split()) if rc == 0 else frozenset()
        available: set[str] | None = None
        rc, release, _ = _run(node, ["uname", "-r"])
        if rc == 0 and release.strip():
            base = f"/lib/modules/{release.strip()}"
            for f in ("modules.dep", "modules.builtin"):
                rc, out, _ = _run(node, ["cat", f"{base}/{f}"])
                if rc == 0:
                    available = (available or set()) | parse_module_list(out)
        facts = KernelFacts(None, loaded, frozenset(available) if available is not None else None)
    cache["facts"] = facts
    return facts


def missing_features(node: Node, features: list[Feature]) -> list[Feature]:
    """The features of `features` the node's kernel lacks (in their order)."""
    return missing_in(kernel_facts(node), features)


def runs_as_root(node: Node) -> bool:
    """Do commands on the node run as root? (`id -u`; cached per node)"""
    cache = _cache(node)
    if "root" not in cache:
        rc, out, _ = _run(node, ["id", "-u"])
        cache["root"] = rc == 0 and out.strip() == "0"
    return cache["root"]


def probe_netns(node: Node, argv: Sequence[str], *, input: str | None = None) -> tuple[bool, str]:
    """Run argv in a throwaway network namespace on the node (`unshare --net`; without root
    `unshare --map-root-user --net`): (worked, its last error line). Whatever it creates dies
    with that namespace. Cached per node and argv."""
    cache = _cache(node).setdefault("netns", {})
    key = (tuple(argv), input)
    if key in cache:
        return cache[key]
    pre = ["unshare", "--net"] if runs_as_root(node) else ["unshare", "--map-root-user", "--net"]
    rc, _, err = _run(node, [*pre, *argv], input=input)
    if rc == 0:
        result = (True, "")
    elif rc in (126, 127):
        result = (False, "cannot probe (unshare/ip missing)")
    else:
        result = (False, (err.strip().splitlines() or ["refused"])[-1])
    cache[key] = result
    return result


def probe_links(node: Node, lines: Sequence[str]) -> tuple[bool, str]:
    """`ip -batch` lines in a throwaway network namespace on the node: (worked, last error)."""
    return probe_netns(node, ["ip", "-batch", "-"], input="\n".join(lines) + "\n")


def has_char_device(node: Node, path: str) -> bool:
    """Is `path` a character device on the node (e.g. /dev/net/tun)?"""
    return _run(node, ["test", "-c", path])[0] == 0
