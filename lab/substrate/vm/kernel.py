"""Find the guest kernel that scripts/fetch-kernel.sh unpacked, and resolve its module order."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from lab.core.errors import PreconditionError

FETCH_HINT = "run scripts/fetch-kernel.sh (or ./setup.sh)"


def cache_dir() -> Path:
    """`${LAB_CACHE:-/var/cache/lab}/kernel`, where fetch-kernel.sh unpacks kernels."""
    return Path(os.environ.get("LAB_CACHE", "/var/cache/lab")) / "kernel"


@dataclass(frozen=True)
class Kernel:
    """An unpacked linux-image package: never installed, only booted by QEMU."""

    release: str  # e.g. 6.12.117+deb12-amd64
    root: Path  # dpkg-deb -x destination
    busybox: Path  # static busybox for the initramfs

    @property
    def image(self) -> Path:
        return self.root / "boot" / f"vmlinuz-{self.release}"

    @property
    def modules_dir(self) -> Path:
        return self.root / "lib" / "modules" / self.release


def find_kernel(cache: Path | None = None) -> Kernel:
    """The kernel `current` points at in the cache. PreconditionError naming what is missing."""
    cache = cache or cache_dir()
    current = cache / "current"
    if not current.is_symlink() and not current.is_dir():
        raise PreconditionError(f"no VM kernel in {cache} ({current} missing); {FETCH_HINT}")
    root = current.resolve()
    kernel = Kernel(release=root.name, root=root, busybox=cache / "busybox")
    for what, path in (
        ("kernel image", kernel.image),
        ("module index", kernel.modules_dir / "modules.dep"),
        ("static busybox", kernel.busybox),
    ):
        if not path.exists():
            raise PreconditionError(f"VM {what} missing: {path}; {FETCH_HINT}")
    return kernel


def _modname(relpath: str) -> str:
    name = relpath.rsplit("/", 1)[-1]
    name = name.split(".ko", 1)[0]
    return name.replace("-", "_")


def module_load_order(kernel: Kernel, names: list[str]) -> list[Path]:
    """Module files to insmod, dependencies first, for `names`; built-in modules are skipped.

    Raises PreconditionError for a name that is neither a module nor built in.
    """
    deps: dict[str, tuple[str, list[str]]] = {}
    for line in (kernel.modules_dir / "modules.dep").read_text().splitlines():
        target, _, rest = line.partition(":")
        deps[_modname(target)] = (target, rest.split())
    builtin_file = kernel.modules_dir / "modules.builtin"
    builtin = set()
    if builtin_file.exists():
        builtin = {_modname(x) for x in builtin_file.read_text().split()}

    order: list[Path] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        if name not in deps:
            if name in builtin:
                return
            raise PreconditionError(f"kernel {kernel.release} has no module {name!r}")
        target, needs = deps[name]
        for dep in needs:
            visit(_modname(dep))
        order.append(kernel.modules_dir / target)

    for n in names:
        visit(n.replace("-", "_"))
    return order
