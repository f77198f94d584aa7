"""Is a kernel feature there? Read-only probes shared by the kernel-path drivers.

A feature is (label, CONFIG_* symbols, module names): present when any symbol is =y/=m in
/proc/config.gz, or, on kernels that do not expose their config (Debian's, the lab VM's), when
any of the modules is loaded (/sys/module) or listed in modules.dep/modules.builtin of
/lib/modules/<release>. Nothing is loaded or changed.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

#: (label, CONFIG_* symbols -- any will do, module names -- any will do)
Feature = tuple[str, tuple[str, ...], tuple[str, ...]]


def read_kernel_config() -> dict[str, str] | None:
    """CONFIG_* symbols of the running kernel from /proc/config.gz, None when not exposed."""
    try:
        with gzip.open("/proc/config.gz", "rt") as f:
            text = f.read()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        if line.startswith("CONFIG_") and "=" in line:
            k, _, v = line.partition("=")
            out[k] = v
    return out


def kernel_modules() -> set[str] | None:
    """Names of the modules this kernel has, loadable or built in (modules.dep +
    modules.builtin of /lib/modules/<release>), None when neither file exists."""
    base = Path("/lib/modules") / os.uname().release
    names: set[str] = set()
    found = False
    for f in ("modules.dep", "modules.builtin"):
        try:
            text = (base / f).read_text()
        except OSError:
            continue
        found = True
        for line in text.splitlines():
            names.add(Path(line.split(":", 1)[0]).name.split(".ko")[0].replace("-", "_"))
    return names if found else None


def missing_features(features: list[Feature]) -> list[Feature]:
    """The features of `features` this kernel lacks (in their order)."""
    config = read_kernel_config()
    mods = kernel_modules() if config is None else None

    def present(symbols: tuple[str, ...], modules: tuple[str, ...]) -> bool:
        if config is not None:
            return any(config.get(s) in ("y", "m") for s in symbols)
        return any(os.path.isdir(f"/sys/module/{m}") for m in modules) or (
            mods is not None and any(m in mods for m in modules)
        )

    return [f for f in features if not present(f[1], f[2])]
