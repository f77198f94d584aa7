"""Build the VM's initramfs: a newc cpio holding the project's init, busybox, a few modules.

Written here rather than with cpio(1) because the archive is tiny, fully determined by its
inputs (so it is reproducible: mtime 0, fixed inode numbers), and needs a /dev/console node,
which an unprivileged cpio run could not create from a directory tree.
"""

from __future__ import annotations

import lzma
import os
import shlex
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from lab.substrate.vm.agentscript import agent_source
from lab.substrate.vm.kernel import Kernel, module_load_order

HERE = Path(__file__).resolve().parent
INIT_SCRIPT = HERE / "init.sh"

#: what stage 1 needs before it can see the host root: 9p over virtio, and overlayfs.
INITRAMFS_MODULES = ["9pnet_virtio", "9p", "overlay"]


@dataclass(frozen=True)
class Entry:
    name: str  # path inside the archive, no leading slash
    mode: int  # including the file type bits
    data: bytes = b""
    rdev: tuple[int, int] = (0, 0)


def newc(entries: Iterable[Entry]) -> bytes:
    """Serialise entries as a "new ASCII" (070701) cpio archive, the format the kernel unpacks."""
    out = bytearray()

    def pad4() -> None:
        out.extend(b"\0" * (-len(out) % 4))

    def header(ino: int, e: Entry) -> None:
        name = e.name.encode() + b"\0"
        fields = (
            ino, e.mode, 0, 0, 2 if stat.S_ISDIR(e.mode) else 1, 0, len(e.data),
            0, 0, e.rdev[0], e.rdev[1], len(name), 0,
        )  # fmt: skip
        out.extend(b"070701" + b"".join(b"%08X" % f for f in fields))
        out.extend(name)
        pad4()
        out.extend(e.data)
        pad4()

    ino = 1
    for e in entries:
        header(ino, e)
        ino += 1
    header(0, Entry("TRAILER!!!", 0))
    out.extend(b"\0" * (-len(out) % 512))
    return bytes(out)


def _read_module(path: Path) -> bytes:
    # Decompressed on the host: busybox insmod hands the bytes to init_module(2), which wants a
    # plain ELF object.
    data = path.read_bytes()
    if path.name.endswith(".xz"):
        return lzma.decompress(data)
    if path.name.endswith(".zst"):
        raise ValueError(f"{path}: zstd modules are not supported; unpack a kernel with xz modules")
    return data


def render_config(values: Mapping[str, str]) -> bytes:
    """The /lab/config the init sources: one `KEY='value'` per line, shell-quoted."""
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items()).encode()


def build_initramfs(
    dest: Path,
    kernel: Kernel,
    config: Mapping[str, str],
    *,
    init_script: Path = INIT_SCRIPT,
    modules: list[str] = INITRAMFS_MODULES,
) -> Path:
    """Write the initramfs for `kernel` to `dest` (atomically). LAB_MODULES is filled in here."""
    files = module_load_order(kernel, modules)
    names = [p.name.split(".ko", 1)[0] for p in files]
    cfg = dict(config)
    cfg["LAB_MODULES"] = " ".join(names)
    dirs = ["bin", "dev", "lab", "lab/modules", "mnt", "newroot", "proc", "sys"]
    entries = [Entry(d, stat.S_IFDIR | 0o755) for d in dirs]
    entries += [
        Entry("dev/console", stat.S_IFCHR | 0o600, rdev=(5, 1)),
        Entry("init", stat.S_IFREG | 0o755, init_script.read_bytes()),
        Entry("bin/busybox", stat.S_IFREG | 0o755, kernel.busybox.read_bytes()),
        Entry("lab/agent.py", stat.S_IFREG | 0o644, agent_source()),
        Entry("lab/config", stat.S_IFREG | 0o644, render_config(cfg)),
    ]
    entries += [
        Entry(f"lab/modules/{n}.ko", stat.S_IFREG | 0o644, _read_module(p))
        for n, p in zip(names, files, strict=True)
    ]
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.write_bytes(newc(entries))
    os.replace(tmp, dest)
    return dest
