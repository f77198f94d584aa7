"""Which binary runs a node's command: the board's own (emulated) or this machine's.

In a node with `arch="arm64"` the board software under test (the tools declared with
`Tool.board`: the VPN daemons and their control tools, iperf3, ping, openssl, ssh; the caller
passes their names, lab.substrate.tools.board_tools()) runs from the node's root through
qemu-aarch64-static called explicitly: `qemu-aarch64-static -L ROOT -0 /usr/bin/TOOL
ROOT/usr/bin/TOOL ARGS`. nsenter execs that (lab.substrate.local.node), so the emulated process keeps
the PID the lab recorded and stays in the node's namespaces and cgroup; no binfmt_misc entry
is needed and none is registered.

Everything else the lab runs there is this machine's binary: the node's plumbing (ip, tc, wg,
ss, sh, cat, ...) is not the software under test, and much of it could not run emulated:
QEMU 7.2's linux-user passes only the NETLINK_ROUTE, NETLINK_KOBJECT_UEVENT and NETLINK_AUDIT
families (linux-user/syscall.c, do_socket), so `wg` (generic netlink to kernel WireGuard),
`ip xfrm` (NETLINK_XFRM), `ip macsec` (generic netlink) and `ss` (NETLINK_SOCK_DIAG) fail
there with "Protocol not supported" (checked: docs/arch.md). A shell from the root could not
exec an ARM binary either without binfmt_misc. Each started process is recorded with the
architecture that ran it (ran_by).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Collection, Sequence
from pathlib import Path

from lab.core import proc
from lab.core.errors import PreconditionError
from lab.core.arch import MANIFEST, Arch, get, root_dir

SEARCH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


class ArchRoot:
    """An unpacked root of `arch`, the qemu-user binary that runs it, and the names of the
    board tools: in a node of this architecture they run from the root or not at all (charon
    with kernel-libipsec only, since kernel-netlink's XFRM half cannot; swanctl talks to it
    over its VICI socket)."""

    def __init__(self, arch: Arch, root: Path, qemu: str, board_tools: Collection[str]):
        self.arch = arch
        self.root = root
        self.qemu = qemu
        self.board_tools = frozenset(board_tools)

    def __repr__(self) -> str:
        return f"ArchRoot({self.arch.name}, {self.root})"

    @classmethod
    def open(cls, name: str, board_tools: Collection[str]) -> ArchRoot:
        """The fetched root of `name` running `board_tools` (names), or a PreconditionError
        naming what is missing and the command that fixes it."""
        arch = get(name)
        root = root_dir(arch)
        if not (root / MANIFEST).is_file():
            raise PreconditionError(
                f"no {arch.name} root at {root} (nothing fetched); run `lab arch fetch "
                f"{arch.name}` (or ./setup.sh --arch {arch.name})"
            )
        qemu = proc.which(arch.qemu)
        if not qemu:
            raise PreconditionError(
                f"{arch.qemu} not found: install qemu-user-static (./setup.sh) to run "
                f"{arch.name} nodes"
            )
        return cls(arch, root, qemu, board_tools)

    def find(self, tool: str) -> str | None:
        """The path inside the root (as the board sees it, e.g. /usr/bin/iperf3) of `tool`,
        symlinks followed within the root; None when the root lacks it."""
        candidates = [tool] if "/" in tool else [f"{d}/{tool}" for d in SEARCH]
        for c in candidates:
            real = self._resolve(c)
            if real is not None:
                return real
        return None

    def _resolve(self, path: str, hops: int = 16) -> str | None:
        # the root's symlinks are absolute for the board (/usr/sbin/x -> /usr/lib/...): resolve
        # them inside the root, never on this machine
        for _ in range(hops):
            host = self.root / path.lstrip("/")
            if host.is_symlink():
                target = os.readlink(host)
                path = (
                    target
                    if target.startswith("/")
                    else os.path.join(os.path.dirname(path), target)
                )
                path = os.path.normpath(path)
                continue
            return path if host.is_file() and os.access(host, os.X_OK) else None
        return None

    def emulates(self, tool: str) -> bool:
        return os.path.basename(tool) in self.board_tools and self.find(tool) is not None

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """argv as run in the node: a board tool under qemu from the root, anything else
        unchanged (this machine's binary)."""
        argv = [str(a) for a in argv]
        if not argv or os.path.basename(argv[0]) not in self.board_tools:
            return argv
        inside = self.find(argv[0])
        if inside is None:
            raise PreconditionError(
                f"the {self.arch.name} root {self.root} has no {argv[0]}; run `lab arch "
                f"fetch {self.arch.name}` again"
            )
        host_path = str(self.root / inside.lstrip("/"))
        return [self.qemu, "-L", str(self.root), "-0", inside, host_path, *argv[1:]]

    def run(self, argv: Sequence[str], *, timeout: float = 60):
        """Run argv here, in this machine's namespaces, as wrap() decides (a board tool from
        the root under qemu, with the architecture's masks); output captured, never raises on
        the exit code: for checks that want the tool's own verdict (lab render --check)."""
        env = {**os.environ, **self.arch.env}
        return proc.run(
            self.wrap(argv), check=False, timeout=timeout, env=env, where=f"{self.arch.name} root"
        )

    def ran_by(self, argv: Sequence[str]) -> str:
        """Which architecture runs argv in this node: 'arm64 (qemu-aarch64-static)' or this
        machine's, e.g. 'x86_64 (host)'."""
        if argv and self.emulates(str(argv[0])):
            return f"{self.arch.name} ({self.arch.qemu})"
        return f"{platform.machine()} (host)"

    def missing(self, tools: Sequence[str]) -> list[str]:
        """Of `tools`, the board tools the root lacks: a node of this
        architecture must not quietly run this machine's build of them. The other tools are
        this machine's to answer for."""
        return [
            t for t in tools if os.path.basename(t) in self.board_tools and self.find(t) is None
        ]
